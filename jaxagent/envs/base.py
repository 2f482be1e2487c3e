"""The simulator protocol every environment implements (host code, asyncio).

An episode: ``reset(task_id, seed)`` returns the opening messages (system prompt, the user's
first request) and the tools the agent may call (OpenAI function schemas). Then, until
``done``, the agent's message goes to ``step`` (text to the user and/or tool calls) and the
environment answers with the next messages: a tool result per call and/or a user message that
carries its private reaction label (never shown to the agent), a per-step reward, the done flag
and an info dict. Several agent messages and tool calls may come between two user messages
(a U2U segment).

Malformed or unknown tool calls never raise: the environment answers them with a tool message
that says what was wrong, and counts them in ``info["tool_errors"]``.

A `Demo` is one demonstration episode as chat messages (what SFT trains on): an environment
family offers them through its `jaxagent.envs.registry.EnvSpec`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxagent.text.toolcalls import ToolCall


@dataclasses.dataclass(frozen=True)
class EnvMessage:
    """A message from the environment: ``role`` is ``system``, ``user`` or ``tool``.

    ``reaction`` is the simulated user's private strategy label (user messages only; kept off
    the agent's tokens). ``tool_call_id`` names the call a tool message answers.
    """

    role: str
    content: str
    reaction: str | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self):
        if self.role not in ("system", "user", "tool"):
            raise ValueError(f"EnvMessage.role={self.role!r}: expected 'system', 'user' or 'tool'")
        if self.reaction is not None and self.role != "user":
            raise ValueError(f"EnvMessage.reaction={self.reaction!r} on a {self.role!r} message: only user "
                             "messages carry a reaction")

    def to_chat(self) -> dict[str, Any]:
        """The message as the agent's chat template sees it (no reaction label)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclasses.dataclass(frozen=True)
class AgentMessage:
    """What the agent produced in one turn: its text and the tool calls parsed from it
    (``call_errors`` holds the reasons of calls that could not be parsed)."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    call_errors: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Reset:
    messages: tuple[EnvMessage, ...]
    tools: tuple[dict[str, Any], ...] = ()
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Step:
    messages: tuple[EnvMessage, ...]
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


class Environment(abc.ABC):
    """One episode's environment. Implementations are cheap to construct: the rollout loop makes
    one per episode (G per task), so they hold no shared mutable state."""

    @abc.abstractmethod
    async def reset(self, task_id: str, seed: int) -> Reset:
        """Starts the episode for ``task_id`` (deterministic given ``seed``)."""

    @abc.abstractmethod
    async def step(self, message: AgentMessage) -> Step:
        """Answers the agent's message; ``done`` ends the episode."""

    def outcome_reward(self) -> float:
        """The episode's final reward once done (default: the sum of step rewards is used)."""
        return float("nan")

    async def aclose(self) -> None:
        """Releases resources (HTTP clients); the loop calls it when the episode ends."""


class EnvFactory(abc.ABC):
    """An environment family as jobs and the rollout loop use it: called once per episode for a
    fresh `Environment` (so it is also the loop's ``make_env``). What a job needs beyond that is
    explicit here, with defaults for families that have none of it:

    - **Recording** (`record`, `drain`): a family with per-episode reports (tau2 retail's score
      components and transcripts) keeps the episodes made while recording is on; `drain` returns
      their reports in creation order and forgets them. `summarize` / `per_task` turn reports
      into the figures an evaluation logs (keys as logged) and one row per task.
    - **Closing** (`aclose`): resources shared by the family's environments (HTTP clients).
    """

    @abc.abstractmethod
    def __call__(self) -> Environment:
        """A fresh environment for one episode."""

    def record(self, on: bool) -> None:
        """Keeps (``True``) or stops keeping the episodes made from now on for `drain`."""

    def drain(self) -> list[dict[str, Any]]:
        """The reports of the episodes recorded since the last drain (none by default)."""
        return []

    def summarize(self, reports: Sequence[Mapping[str, Any]], *, k: int) -> dict[str, Any]:
        """Figures over drained reports, logged beside the rollout's (none by default)."""
        return {}

    def per_task(self, reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """One row per task over drained reports (none by default)."""
        return []

    async def aclose(self) -> None:
        """Releases what the family's environments share (HTTP clients); idempotent."""


@dataclasses.dataclass(frozen=True)
class Demo:
    """One demonstration episode.

    Attributes:
      task_id: the task.
      messages: OpenAI-style chat dicts, system prompt first: ``{"role", "content"}``; assistant
        turns carry ``tool_calls`` (``[{"type": "function", "function": {"name", "arguments"}}]``,
        arguments as a dict); tool messages carry ``name``. Ends with the last assistant turn (the
        final step's answers are not part of the agent's context, as in the rollout loop).
      train: per message, True for the assistant turns an SFT loss trains on; False for every
        other message (and for turns not to imitate, e.g. a gym's noisy random-policy turns).
      reward: the episode's outcome reward.
      tools: the tool schemas of the reset (what the system turn lists).
    """

    task_id: str
    messages: tuple[dict, ...]
    train: tuple[bool, ...]
    reward: float
    tools: tuple[dict, ...] = ()

    def __post_init__(self):
        if len(self.train) != len(self.messages):
            raise ValueError(f"train: length {len(self.train)}, expected one flag per message "
                             f"({len(self.messages)})")
        bad = [i for i, (m, t) in enumerate(zip(self.messages, self.train)) if t and m.get("role") != "assistant"]
        if bad:
            raise ValueError(f"train: messages {bad} are not assistant messages; only assistant turns train")


def agent_message_to_chat(message: AgentMessage) -> dict[str, Any]:
    """An agent turn as an OpenAI-style assistant message (tool calls with dict arguments)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [call.to_dict() for call in message.tool_calls]
    return out


def transcript_to_chat(transcript: Sequence[EnvMessage | AgentMessage]) -> list[dict[str, Any]]:
    """An episode's transcript (environment and agent messages, in order) as chat dicts (reaction
    labels dropped)."""
    return [agent_message_to_chat(m) if isinstance(m, AgentMessage) else m.to_chat() for m in transcript]


class CallableEnvFactory(EnvFactory):
    """A family of environments that share nothing: ``make()`` per episode, nothing to record or close."""

    def __init__(self, make: Callable[[], Environment]):
        self._make = make

    def __call__(self) -> Environment:
        return self._make()

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

A message may say what kind of feedback it is (``kind``: ``information``, an answer to what the
agent asked; ``correction``, a tool error or a request to ask differently) and, where the
environment can enumerate them, the replies it could have been given what the agent knew
(``alternatives``, with their probabilities, the actual one among them): InfoPO's marginal prior
and its ``exclude_corrections`` option read them (`jaxagent.credit.infopo`).

An `Agent` is the other side: it acts on what the environment says (the episode runner,
`jaxagent.rollout.runner`, drives both; environments drive nothing). A `Demo` is one demonstration
episode as chat messages (what SFT trains on): an environment family offers them through its
`jaxagent.envs.registry.EnvSpec`.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from jaxagent.text.toolcalls import ToolCall


#: What a feedback message is (``EnvMessage.kind``); their codes in the credit batch are 1 and 2 (0: unmarked).
FEEDBACK_KINDS = ("information", "correction")


@dataclasses.dataclass(frozen=True)
class EnvMessage:
    """A message from the environment: ``role`` is ``system``, ``user`` or ``tool``.

    ``reaction`` is the simulated user's private strategy label (user messages only; kept off
    the agent's tokens). ``tool_call_id`` names the call a tool message answers. ``kind``: one of
    `FEEDBACK_KINDS` or None (unmarked). ``alternatives``: ``((text, probability), ...)``, the
    contents this message could have had given what the agent knew (probabilities > 0, summing
    to 1; ``content`` among the texts), or None (not enumerated). Neither reaches the agent.
    """

    role: str
    content: str
    reaction: str | None = None
    tool_call_id: str | None = None
    name: str | None = None
    kind: str | None = None
    alternatives: tuple[tuple[str, float], ...] | None = None

    def __post_init__(self):
        if self.role not in ("system", "user", "tool"):
            raise ValueError(f"EnvMessage.role={self.role!r}: expected 'system', 'user' or 'tool'")
        if self.reaction is not None and self.role != "user":
            raise ValueError(f"EnvMessage.reaction={self.reaction!r} on a {self.role!r} message: only user "
                             "messages carry a reaction")
        if self.kind is not None and self.kind not in FEEDBACK_KINDS:
            raise ValueError(f"EnvMessage.kind={self.kind!r}: expected one of {FEEDBACK_KINDS} or None")
        if self.alternatives is not None:
            alts = self.alternatives
            if not alts or any(not isinstance(t, str) or isinstance(p, bool) or not 0 < p <= 1 for t, p in alts):
                raise ValueError(f"EnvMessage.alternatives={alts!r}: expected a non-empty tuple of (text, "
                                 "probability in (0, 1]) pairs")
            total = sum(p for _, p in alts)
            if abs(total - 1.0) > 1e-6:
                raise ValueError(f"EnvMessage.alternatives: probabilities sum to {total}, expected 1")
            if self.content not in {t for t, _ in alts}:
                raise ValueError(f"EnvMessage.alternatives: the content {self.content!r} is not among them")

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

    def report(self) -> dict[str, Any]:
        """The episode's report for an evaluation's files (task, score components, transcript...),
        readable after `aclose` (none by default)."""
        return {}


class Agent(abc.ABC):
    """The other side of an episode: what answers the environment (the policy through the
    generation engine, a scripted expert, tau2's oracle, an OpenAI-compatible endpoint...). The one
    episode runner, `jaxagent.rollout.runner.run_episode`, calls `start` after the reset, then
    `act` and, with the environment's answer, `observe`, until the episode ends; `aclose` always."""

    #: Why `act` returned None (the episode's termination then).
    stop_reason: str = "stopped"

    def start(self, task_id: str, reset: Reset, env: Environment) -> None:
        """A new episode: the reset's messages and tools (``env``: for agents that may read the
        environment itself, a gym expert or tau2's oracle)."""

    @abc.abstractmethod
    async def act(self, turn: int) -> AgentMessage | None:
        """The agent's message of turn ``turn`` (0-based), or None to stop (`stop_reason` says why)."""

    def observe(self, messages: Sequence[EnvMessage], info: Mapping[str, Any]) -> bool:
        """The environment's answer to the last message (the step's ``info`` beside it); False
        when the agent cannot take it in (its context is full: the episode ends as ``max_tokens``).
        Default: taken."""
        return True

    async def aclose(self) -> None:
        """Releases what the agent holds for the episode (an engine session)."""


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


# ----------------------------------------------------------------------------- simulator call accounting
#: Causes of a failed HTTP attempt of a simulator client, as counted in `CallStats.failures`.
FAILURE_KINDS = ("timeout", "connection", "429", "5xx", "bad_json", "empty_choices", "401", "403", "other_status")


class CallStats:
    """Counters of simulator calls: ``calls`` (chat-completions calls started), ``attempts`` (HTTP
    attempts), ``failed_calls`` (calls that raised `SimulatorError`), ``failures`` (failed
    attempts by cause, keys from `FAILURE_KINDS`). ``retries`` is ``attempts - calls``."""

    __slots__ = ("attempts", "calls", "failed_calls", "failures")

    def __init__(self):
        self.calls = self.attempts = self.failed_calls = 0
        self.failures: dict[str, int] = {}

    @property
    def retries(self) -> int:
        return self.attempts - self.calls

    def fail(self, kind: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "attempts": self.attempts, "retries": self.retries,
                "failed_calls": self.failed_calls, "failures": dict(self.failures)}

    def __repr__(self) -> str:
        return f"CallStats({self.as_dict()})"


_COLLECTORS: contextvars.ContextVar[tuple[CallStats, ...]] = contextvars.ContextVar("jaxagent_sim_call_stats",
                                                                                     default=())


def active_call_stats() -> tuple[CallStats, ...]:
    """The `CallStats` collecting the current task's simulator calls (`collect_call_stats`, innermost
    last): a simulator client counts each call into every one of them."""
    return _COLLECTORS.get()


@contextlib.contextmanager
def collect_call_stats(stats: CallStats | None = None) -> Iterator[CallStats]:
    """Counts, into ``stats`` (a new `CallStats` by default), the simulator calls made by the
    current task and the tasks it starts from here on (context variables are copied into new
    tasks: ``asyncio.wait_for``, ``gather``), through any simulator client that counts into
    `active_call_stats` (`jaxagent.envs.llm_user.LLMUserClient` does). Nests."""
    stats = CallStats() if stats is None else stats
    token = _COLLECTORS.set((*_COLLECTORS.get(), stats))
    try:
        yield stats
    finally:
        _COLLECTORS.reset(token)



class CallableEnvFactory(EnvFactory):
    """A family of environments that share nothing: ``make()`` per episode, nothing to record or close."""

    def __init__(self, make: Callable[[], Environment]):
        self._make = make

    def __call__(self) -> Environment:
        return self._make()

"""Shared machinery of the scripted user gyms (host code, no LLM, no jax).

Every gym is an :class:`~jaxagent.envs.base.Environment` with one tool, ``interact_with_env(choice,
content)`` (UserGym's): ``choice="action"`` talks to the user (answered by a short tool
acknowledgement and then the user's reply, a user message with a reaction label), ``"search"``
queries the environment (answered by a tool message), ``"answer"`` gives the final answer (answered
by a tool acknowledgement and the user's verdict; it ends the episode). A message with text and no
tool calls goes to the user as if it were an ``action``.

Task ids are ``"<gym>:<split>:<seed>:<index>"`` (``make_task_ids``). A task is generated from its id
alone; the split of a generated task is a hash of its content (1 in 5 tasks is ``test``), and the
generator redraws until the content falls in the requested split, so train and test tasks never
share content. ``reset``'s ``seed`` only picks among the user's paraphrases.

Feedback kinds (`EnvMessage.kind`): a user reply that answers what the agent asked is
``information``; a tool error, and a user reply asking the agent to ask differently (one thing at
a time, a detail the gym knows) or telling it that it asked already, is a ``correction``; the
acknowledgements (``sent .``, ``answer received .``) and the verdict are unmarked. Each gym's
docstring lists its replies by kind. Gyms with ``enumerates_replies`` give each user reply's
``alternatives``: the replies they could have given to that question with their probabilities
under what the agent knows (InfoPO's marginal prior); any other message is determined by the
agent's message and the history.

Rewards: 0 on every step but the last; the last step's reward is the episode's outcome (the
maximum is ``MAX_REWARD`` = 1.0 in every gym; ``outcome="binary"`` keeps only full answers' reward).
The last step's ``info["partial"]`` is the graded score in [0, 1] whatever the outcome mode (the
gym's partial credit; telepathy: the share of attributes the answer names right), so diagnostics
can tell episodes apart inside a group of binary failures. Malformed, unknown or ill-typed tool calls never
raise: each one is answered by a tool message that says what was wrong (in the gym's closed
vocabulary) and counted in ``info["tool_errors"]`` (cumulative over the episode).
"""

from __future__ import annotations

import abc
import hashlib
import random
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from jaxagent.envs.base import AgentMessage, EnvMessage, Environment, Reset, Step
from jaxagent.text.toolcalls import ToolCall

__all__ = ["CHOICES", "COMMON_WORDS", "LABELS", "MAX_REWARD", "OUTCOMES", "SPLITS", "TOOL_NAME", "TOOL_SCHEMA",
           "Policy", "ScriptedGym", "act", "answer", "make_task_ids", "parse_task_id",
           "search", "split_of", "tokenize"]

LABELS = ("provide_info", "confirm", "approve", "accept",
          "be_vague", "challenge", "clarify_request", "correct", "reject", "complain")
"""The reaction labels a scripted user may emit (the keys of Faca's default polarity map)."""

MAX_REWARD = 1.0
OUTCOMES = ("graded", "binary")
"""Outcome modes: ``graded`` (the gym's partial credit), ``binary`` (MAX_REWARD for a full answer, else
0: partly right episodes score like wrong ones, so more groups have equal outcomes)."""
SPLITS = ("train", "test")
TOOL_NAME = "interact_with_env"
CHOICES = ("action", "search", "answer")

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Interact with the environment: 'action' sends content to the user, 'search' "
                       "searches the environment, 'answer' gives the final answer and ends the task.",
        "parameters": {
            "type": "object",
            "properties": {
                "choice": {"type": "string", "enum": list(CHOICES),
                           "description": "action (talk to the user), search, or answer"},
                "content": {"type": "string", "description": "the message, query or final answer"},
            },
            "required": ["choice", "content"],
            "additionalProperties": False,
        },
    },
}

# Every text the shared machinery emits, written in these words only.
ERR_UNREADABLE = "error : the tool call could not be read . write one json object with name and arguments ."
ERR_UNKNOWN_TOOL = "error : unknown tool . the only tool is interact_with_env ."
ERR_ARGUMENTS = "error : the arguments must be choice and content ."
ERR_CHOICE = "error : choice must be action , search or answer ."
ERR_CONTENT = "error : content must be text ."
ERR_OVER = "error : the task is over ."
ACK_SENT = "sent ."
ACK_ANSWER = "answer received ."
USER_TIMEOUT = "we are out of time . goodbye ."

_TOKEN_RE = re.compile(r"[a-z0-9_]+|[^\sa-z0-9_]")


def tokenize(text: str) -> list[str]:
    """Lower-cased words (runs of ``[a-z0-9_]``) and single punctuation marks."""
    return _TOKEN_RE.findall(text.lower())


def _words(*texts: str) -> frozenset[str]:
    return frozenset(t for text in texts for t in tokenize(text))


COMMON_WORDS = _words(ERR_UNREADABLE, ERR_UNKNOWN_TOOL, ERR_ARGUMENTS, ERR_CHOICE, ERR_CONTENT, ERR_OVER,
                      ACK_SENT, ACK_ANSWER, USER_TIMEOUT, ". , ? ! : ( ) ' -",
                      "yes no i you it is the a that this what which do does please ask one thing at time")


def split_of(signature: str) -> str:
    """The split a task's content belongs to: ``test`` for 1 in 5 signatures, else ``train``."""
    h = int.from_bytes(hashlib.sha256(signature.encode()).digest()[:8], "big")
    return "test" if h % 5 == 0 else "train"


def make_task_ids(gym: str, split: str, n: int, seed: int = 0) -> list[str]:
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    return [f"{gym}:{split}:{int(seed)}:{i}" for i in range(int(n))]


def parse_task_id(task_id: str) -> tuple[str, str, int, int]:
    parts = str(task_id).split(":")
    if len(parts) != 4 or parts[1] not in SPLITS:
        raise ValueError(f"task_id={task_id!r}: expected '<gym>:<train|test>:<seed>:<index>'")
    try:
        return parts[0], parts[1], int(parts[2]), int(parts[3])
    except ValueError:
        raise ValueError(f"task_id={task_id!r}: seed and index must be integers") from None


def act(content: str) -> AgentMessage:
    """An agent message calling ``interact_with_env(choice="action", content=...)``."""
    return AgentMessage("", (ToolCall(TOOL_NAME, {"choice": "action", "content": content}),))


def search(content: str) -> AgentMessage:
    return AgentMessage("", (ToolCall(TOOL_NAME, {"choice": "search", "content": content}),))


def answer(content: str) -> AgentMessage:
    return AgentMessage("", (ToolCall(TOOL_NAME, {"choice": "answer", "content": content}),))


Policy = Callable[["ScriptedGym"], AgentMessage]
"""A policy maps the (running) gym to the agent's next message. Expert policies read the gym's
hidden ``task`` and ``state``; random policies only use the gym's public repertoire."""


class ScriptedGym(Environment):
    """Base of the scripted gyms. Subclasses define ``name``, ``generate`` (task content from a
    ``random.Random``), ``signature``, ``system_prompt``, ``opening``, ``init_state`` and the
    handlers ``on_action`` / ``on_search`` / ``on_answer``; plus ``vocabulary``."""

    name: ClassVar[str]
    default_max_steps: ClassVar[int] = 16
    extra_words: ClassVar[frozenset[str]] = frozenset()
    #: every user reply carries its alternatives (`say`'s ``outcomes``): InfoPO's marginal prior works here
    enumerates_replies: ClassVar[bool] = False

    def __init__(self, max_steps: int | None = None, outcome: str = "graded"):
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome={outcome!r}: expected one of {', '.join(OUTCOMES)}")
        self.max_steps = int(max_steps or self.default_max_steps)
        self.outcome_mode = outcome
        self.task: Any = None
        self.state: dict[str, Any] = {}
        self.done = False

    # --- tasks -----------------------------------------------------------------------------------
    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int = 0) -> list[str]:
        return make_task_ids(cls.name, split, n, seed)

    @classmethod
    def task_for(cls, task_id: str) -> Any:
        gym, split, seed, index = parse_task_id(task_id)
        if gym != cls.name:
            raise ValueError(f"task_id={task_id!r}: belongs to gym {gym!r}, not {cls.name!r}")
        for attempt in range(10_000):
            task = cls.generate(random.Random(f"{gym}:{split}:{seed}:{index}:{attempt}"))
            if split_of(f"{gym}|{cls.signature(task)}") == split:
                return task
        raise RuntimeError(f"no {split} task found for {task_id!r}")  # pragma: no cover

    @classmethod
    def split_of_task(cls, task: Any) -> str:
        return split_of(f"{cls.name}|{cls.signature(task)}")

    @classmethod
    def vocabulary(cls) -> list[str]:
        """The closed word list: every token of every text this gym emits (and its expert writes)."""
        return sorted(COMMON_WORDS | cls.extra_words)

    @staticmethod
    @abc.abstractmethod
    def generate(rng: random.Random) -> Any: ...

    @staticmethod
    @abc.abstractmethod
    def signature(task: Any) -> str: ...

    @abc.abstractmethod
    def system_prompt(self) -> str: ...

    @abc.abstractmethod
    def opening(self) -> str: ...

    def init_state(self) -> dict[str, Any]:
        return {}

    @abc.abstractmethod
    def on_action(self, content: str) -> EnvMessage: ...

    def on_search(self, content: str) -> str:
        return "there is nothing to search ."

    @abc.abstractmethod
    def on_answer(self, content: str) -> tuple[float, EnvMessage]: ...

    # --- helpers ---------------------------------------------------------------------------------
    def say(self, reaction: str, *variants: str, kind: str | None = None,
            outcomes: Sequence[tuple[float, Sequence[str]]] | None = None) -> EnvMessage:
        """A user message with ``reaction`` and feedback ``kind``, one of the paraphrase ``variants``
        (seeded). Its alternatives: ``outcomes`` = ((probability, paraphrases), ...), every reply the
        user could have given here under what the agent knows (the actual one's included), each
        paraphrase of an outcome equally likely; None: the reply was determined, up to its
        ``variants``."""
        assert reaction in LABELS, reaction
        text = self.rng.choice(variants) if len(variants) > 1 else variants[0]
        alts: dict[str, float] = {}
        for p, texts in (outcomes if outcomes is not None else ((1.0, variants),)):
            for t in texts:
                if p > 0:
                    alts[t] = alts.get(t, 0.0) + p / len(texts)
        return EnvMessage("user", text, reaction=reaction, kind=kind, alternatives=tuple(alts.items()))

    def _info(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "split": self.split, "steps": self.steps,
                "tool_errors": self.tool_errors, "max_reward": MAX_REWARD, "gym": self.name}

    # --- protocol --------------------------------------------------------------------------------
    async def reset(self, task_id: str, seed: int) -> Reset:
        self.task = self.task_for(task_id)
        self.task_id, self.split = task_id, parse_task_id(task_id)[1]
        self.rng = random.Random(f"{task_id}|{int(seed)}")
        self.done, self.steps, self.tool_errors, self.outcome, self.partial = False, 0, 0, 0.0, 0.0
        self.state = self.init_state()
        messages = (EnvMessage("system", self.system_prompt()), EnvMessage("user", self.opening()))
        return Reset(messages, (TOOL_SCHEMA,), self._info())

    def _call_error(self, call: ToolCall) -> str | None:
        if call.name != TOOL_NAME:
            return ERR_UNKNOWN_TOOL
        args = call.arguments
        if not isinstance(args, dict) or set(args) != {"choice", "content"}:
            return ERR_ARGUMENTS
        if args["choice"] not in CHOICES:
            return ERR_CHOICE
        if not isinstance(args["content"], str):
            return ERR_CONTENT
        return None

    def _error(self, out: list[EnvMessage], text: str) -> None:
        self.tool_errors += 1
        out.append(EnvMessage("tool", text, name=TOOL_NAME, kind="correction"))

    async def step(self, message: AgentMessage) -> Step:
        out: list[EnvMessage] = []
        if self.done:
            self._error(out, ERR_OVER)
            return Step(tuple(out), 0.0, True, self._info())
        self.steps += 1
        reward = 0.0
        for _ in message.call_errors:
            self._error(out, ERR_UNREADABLE)
        if not message.tool_calls and not message.call_errors:
            out.append(self.on_action(message.content or ""))
        for call in message.tool_calls:
            if self.done:
                self._error(out, ERR_OVER)
                continue
            err = self._call_error(call)
            if err is not None:
                self._error(out, err)
                continue
            choice, content = call.arguments["choice"], call.arguments["content"]
            if choice == "action":
                out.append(EnvMessage("tool", ACK_SENT, name=TOOL_NAME))
                out.append(self.on_action(content))
            elif choice == "search":
                out.append(EnvMessage("tool", self.on_search(content), name=TOOL_NAME))
            else:
                out.append(EnvMessage("tool", ACK_ANSWER, name=TOOL_NAME))
                reward, verdict = self.on_answer(content)
                self.partial = float(self.state.get("partial", reward))  # graded, whatever the outcome mode
                if self.outcome_mode == "binary":  # all or nothing: a partly right answer scores 0
                    reward = MAX_REWARD if reward >= MAX_REWARD - 1e-9 else 0.0
                out.append(verdict)
                self.done, self.outcome = True, float(reward)
        if not self.done and self.steps >= self.max_steps:
            out.append(EnvMessage("user", USER_TIMEOUT, reaction="complain"))
            self.done, reward, self.outcome = True, 0.0, 0.0
        info = self._info()
        if self.done:
            info["outcome"] = self.outcome
            info["partial"] = self.partial
        return Step(tuple(out), float(reward), self.done, info)

    def outcome_reward(self) -> float:
        return self.outcome if self.done else float("nan")


def pick(rng: random.Random, seq: Sequence):
    return seq[rng.randrange(len(seq))]

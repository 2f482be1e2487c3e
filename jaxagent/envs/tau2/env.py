"""The tau2 episode as a jaxagent `Environment` (episode rules of tau2-bench at commit a2c0247), for
every domain (`jaxagent.envs.tau2.domain.Domain`: its database, tools and customer).

    env = Tau2Env(tasks, customer=scripted_customers())        # or llm_customers(client)
    reset = await env.reset("0", seed=0)          # system prompt (policy) + the customer's opening; the tools
    step = await env.step(AgentMessage("", (ToolCall("find_user_id_by_email", {"email": ...}),)))

- **State.** A fresh, isolated database per episode (`scoring.initial_db`: ``db.json`` plus the
  task's ``initial_state``); tools mutate it (`tools.execute`), never anything shared.
- **Dual control** (telecom): the state holds the provider's database and the customer's phone;
  the customer acts on its phone with its own tools (`user_tools`) while it prepares a reply. Its
  calls run against the live state (synced after each success), are recorded in ``calls`` with
  ``requestor: "user"`` and enter the transcript (a user message with ``tool_calls``, then its
  tool messages) before the customer's text; the agent never sees them, so nothing of them enters
  the agent's token stream or its training. They count as steps (two per batch) and their errors
  towards ``max_errors``; both limits are checked once the customer's turn is complete.
- **Agent turns.** A message with tool calls runs them in order against the live database and
  answers with one tool message per call (``Error: ...`` texts for failures, and for calls the
  parser could not read); the customer sees nothing, so several tool calls between two customer
  messages form one U2U segment. A message with text and no calls goes to the customer, whose
  reply carries its private reaction label. A message with both is routed as tool calls (its text
  stays in the transcript and counts for the communicate check, the customer never sees it). A
  message with neither ends the episode as an agent error (tau2 aborts the run): reward 0.
- **Endings** (``info["termination"]``): ``user_stop`` (the customer's ``###STOP###``,
  ``###TRANSFER###`` or ``###OUT-OF-SCOPE###``), ``max_steps`` (each agent message, customer
  message and batch of tool results is a step; checked after a step whose next recipient is not
  the environment), ``too_many_errors`` (``max_errors`` tool messages with error=true),
  ``agent_error``. Only ``user_stop`` is scored (`scoring.score`); the reward comes with the
  final step and from `outcome_reward`, the whole report from `report`.
- **Retries**: `step` commits nothing before the customer's reply arrives, and an ending whose
  scoring failed (the judge's HTTP call) resumes on the next call, so the rollout loop may retry a
  failed or timed-out step with the same message; a failure after the retries is the loop's
  ``simulator_failure``.
- **Not modelled**: tau2's fixed assistant greeting opens the customer's side of the conversation
  (the customer answers it) but is not put in the agent's token stream (environments here speak
  as system, user or tool).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxagent.envs.base import AgentMessage, Environment, EnvMessage, Reset, Step
from jaxagent.envs.tau2 import DEFAULT_DOMAIN, get_domain, scoring
from jaxagent.envs.tau2.customer import GREETING, Customer, CustomerTurn, LLMCustomer
from jaxagent.envs.tau2.tasks import Task
from jaxagent.envs.tau2.tools import ToolResult

AGENT_INSTRUCTION = """\
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."""


def system_prompt(policy: str) -> str:
    """The agent's system prompt: the generic instruction block, then the policy text."""
    return f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{policy}\n</policy>"


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    max_steps: int = 200
    max_errors: int = 10

    def __post_init__(self):
        if self.max_steps < 1 or self.max_errors < 1:
            raise ValueError(f"max_steps={self.max_steps}, max_errors={self.max_errors}: expected integers >= 1")


def scripted_customers(**kwargs) -> Callable[[Task, Any], Customer]:
    """A customer factory for `Tau2Env`: the task's domain's scripted customer per episode
    (`Domain.scripted_customer`)."""
    return lambda task, view: get_domain(task.domain).scripted_customer(task, view, **kwargs)


def llm_customers(client) -> Callable[[Task, Any], Customer]:
    """A customer factory for `Tau2Env`: an `LLMCustomer` per episode over one shared client (with
    the episode as its view: a dual-control customer acts on its phone through it)."""
    return lambda task, view: LLMCustomer(client, task, view=view)


class Tau2Env(Environment):
    """One tau2 episode of ``domain`` (see the module docstring); ``tasks`` are that domain's.
    ``judge``: an `LLMUserClient` for the NL assertions (required by ``scoring="tau2"`` for tasks
    that have assertions)."""

    def __init__(self, tasks: Mapping[str, Task], *, customer: Callable[[Task, Any], Customer],
                 data_dir: str | Path | None = None, scoring_mode: str = "offline", limits: EpisodeLimits = EpisodeLimits(),
                 judge=None, policy: str | None = None, domain: str = DEFAULT_DOMAIN):
        if scoring_mode not in scoring.SCORING_MODES:
            raise ValueError(f"scoring_mode={scoring_mode!r}: expected one of {', '.join(scoring.SCORING_MODES)}")
        self.domain = get_domain(domain)
        self.tasks, self.make_customer, self.data_dir = tasks, customer, data_dir
        self.scoring_mode, self.limits, self.judge = scoring_mode, limits, judge
        self.policy = policy if policy is not None else self.domain.load_policy(data_dir)
        self.task: Task | None = None
        self.db: dict = {}
        self.messages: list[dict[str, Any]] = []
        # every executed call: requestor, name, arguments, error, content
        self.calls: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []  # the customer's tool exchanges of the turn in progress
        self.customer: Customer | None = None
        self.steps = self.errors = 0
        self.termination: str | None = None
        self.result: scoring.Score | None = None
        self.seed = 0
        self._hash: tuple[int, str] | None = None
        self._ending: tuple | None = None  # an ending whose scoring has not completed

    # -- the customer's view (EpisodeView)
    def _hashes(self) -> tuple[str, str | None] | None:
        """The live state's hashes (database, user database), recomputed only after a successful
        write of either side (reads and failed writes change nothing)."""
        # every call to a mutating tool (a failed one may still have changed the state: a failing sync)
        writes = sum(self.domain.writes(c.get("requestor", "assistant"), c["name"]) for c in self.calls)
        if (self._hash is None or self._hash[0] != writes) and self.db:
            self._hash = (writes, (self.domain.db_hash(self.db), self.domain.user_db_hash(self.db)))
        return self._hash[1] if self._hash is not None else None

    def db_hash(self) -> str | None:
        """The live (agent-side) database's hash."""
        hashes = self._hashes()
        return hashes[0] if hashes else None

    def user_db_hash(self) -> str | None:
        """The live user database's hash (None for a domain without one)."""
        hashes = self._hashes()
        return hashes[1] if hashes else None

    def goal_db_reached(self) -> bool:
        hashes = self._hashes()
        state = None if hashes is None else hashes[0] if hashes[1] is None else f"{hashes[0]}|{hashes[1]}"
        return state == scoring.target_hash(self.task, self.data_dir)

    def assertions_hold(self) -> bool:
        """Whether every env assertion of the task holds on the live state now (run on a copy)."""
        if not self.db:
            return False
        return scoring.env_assertion_reward(self.task, copy.deepcopy(self.db))[0] == 1.0

    def successful_calls(self) -> list[tuple[str, Mapping[str, Any]]]:
        """The agent's successful tool calls (name, arguments), in order."""
        return [(c["name"], c["arguments"]) for c in self.calls
                if not c["error"] and c.get("requestor", "assistant") == "assistant"]

    def successful_writes(self) -> list[tuple[str, Mapping[str, Any]]]:
        """Successful calls to mutating tools, either side's, in order."""
        return [(c["name"], c["arguments"]) for c in self.calls
                if not c["error"] and self.domain.writes(c.get("requestor", "assistant"), c["name"])]

    def unexpected_writes(self) -> list[tuple[str, Mapping[str, Any]]]:
        gold = [(a.name, dict(a.arguments)) for a in self.task.write_actions]
        return [(n, a) for n, a in self.successful_writes() if (n, a) not in gold]

    def pending_writes(self) -> list[Any]:
        done = self.successful_writes()
        return [a for a in self.task.write_actions if (a.name, dict(a.arguments)) not in done]

    def assistant_texts(self) -> list[str]:
        return [m["content"] for m in self.messages if m["role"] == "assistant" and m.get("content")]

    def read(self, name: str, arguments: Mapping[str, Any]):
        """A read-only tool run against the live database outside the conversation (the Q&D
        agent's retriever: `jaxagent.qd.tau2`): no message enters the transcript and no step is
        counted, so the customer and the judge never see it; the call is kept among the episode's
        calls (marked ``"via": "read"``), so the scripted customer counts an identity lookup made
        this way as the agent's, and scoring (which replays writes only) ignores it. A write,
        generic or unknown tool executes nothing: None."""
        if self.task is None or not self.db:
            raise RuntimeError("Tau2Env.read: no episode in progress; expected reset() first")
        if name not in self.domain.read_tools:
            return None
        res = self.domain.call(self.db, "assistant", name, dict(arguments))
        self.calls.append({"requestor": "assistant", "name": name, "arguments": dict(arguments), "error": res.error,
                           "content": res.content, "via": "read"})
        return res

    def user_tools(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> list[ToolResult]:
        """The customer's own tool calls (dual control), one message of them: each run in order on
        the live state as tau2 runs a user call (`Domain.call`, synced after a success), recorded in
        ``calls`` with ``requestor: "user"``, its results returned to the customer only. They join
        the transcript, with the customer's reply, once its turn is complete (see the module
        docstring). A domain without user tools answers each with tau2's error."""
        if self.task is None or not self.db:
            raise RuntimeError("Tau2Env.user_tools: no episode in progress; expected reset() first")
        results, wire = [], []
        for name, arguments in calls:
            args = dict(arguments) if isinstance(arguments, Mapping) else arguments
            res = self.domain.call(self.db, "user", name, args)
            self.calls.append({"requestor": "user", "name": name, "arguments": args, "error": res.error,
                               "content": res.content})
            results.append(res)
            wire.append({"name": name, "arguments": args})
        self._pending.append({"role": "user", "content": None, "tool_calls": wire})
        self._pending += [{"role": "tool", "content": r.content, "name": n, "requestor": "user", "error": r.error}
                          for (n, _), r in zip(calls, results, strict=True)]
        return results

    # -- Environment
    async def reset(self, task_id: str, seed: int) -> Reset:
        if task_id not in self.tasks:
            raise KeyError(f"task_id={task_id!r}: not among the {len(self.tasks)} tau2 {self.domain.name} tasks of "
                           "this environment")
        self.task, self.seed = self.tasks[task_id], seed
        self.db = await asyncio.to_thread(scoring.initial_db, self.task, self.data_dir)
        self.messages, self.calls, self._pending = [], [], []
        self.steps = self.errors = 0
        self.termination, self.result, self._hash, self._ending = None, None, None, None
        self.customer = self.make_customer(self.task, self)
        first = await self.customer.opening()
        self.steps += 1
        self._commit_customer_tools()
        self._record_customer(first)
        return Reset((EnvMessage("system", system_prompt(self.policy)), EnvMessage("user", first.text, reaction=first.label)),
                     tools=self.domain.tool_schemas(), info={"task_id": task_id})

    def _record_customer(self, turn: CustomerTurn) -> None:
        self.messages.append({"role": "user", "content": turn.text, "reaction": turn.label})

    def _commit_customer_tools(self) -> None:
        """The customer's tool exchanges of the finished turn join the transcript: two steps per
        batch, their errors counted."""
        for m in self._pending:
            self.messages.append(m)
            if m["role"] == "tool":
                self.errors += bool(m["error"])
            elif m.get("tool_calls"):
                self.steps += 2
        self._pending = []

    async def step(self, message: AgentMessage) -> Step:
        """Answers one agent message (see the module docstring). Safe to call again with the same
        message after it raised or was cancelled (the rollout loop retries a failed simulator call):
        nothing is committed before the customer's reply arrives, and an ending whose scoring failed
        (the judge's HTTP call) resumes where it stopped."""
        if self._ending is not None:
            return await self._finish(*self._ending)
        if self.task is None or self.termination is not None:
            raise RuntimeError("Tau2Env.step: no episode in progress; expected reset() first")
        calls = [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls]
        agent = {"role": "assistant", "content": message.content or None, "tool_calls": calls}
        if message.tool_calls or message.call_errors:  # no await before the commit: never half done
            self.steps += 1
            self.messages.append(agent)
            out = []
            for call in message.tool_calls:
                res = self.domain.call(self.db, "assistant", call.name, call.arguments)
                self.calls.append({"requestor": "assistant", "name": call.name, "arguments": call.arguments,
                                   "error": res.error, "content": res.content})
                out.append(EnvMessage("tool", res.content, tool_call_id=f"call_{len(self.calls) - 1}", name=call.name))
            for reason in message.call_errors:
                out.append(EnvMessage("tool", f"Error: the tool call could not be parsed ({reason}); expected "
                                              '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'))
            for m in out:
                self.messages.append({"role": "tool", "content": m.content, "name": m.name})
            self.errors += sum(m.content.startswith("Error: ") for m in out)
            self.steps += 1
            if self.errors >= self.limits.max_errors:
                return await self._end("too_many_errors", out)
            if self.steps >= self.limits.max_steps:
                return await self._end("max_steps", out)
            return Step(tuple(out), info=self._info())
        if not message.content.strip():
            self.steps += 1
            self.messages.append(agent)
            return await self._end("agent_error", ())
        if self.steps + 1 >= self.limits.max_steps:  # the limit is checked after the agent's message too (tau2)
            self.steps += 1
            self.messages.append(agent)
            return await self._end("max_steps", ())
        before = getattr(self.customer, "retries", 0)
        # May raise: nothing of this step is committed yet, except the customer's own device actions
        # (dual control), which stay pending and done; a retry continues the same customer turn.
        turn = await self.customer.respond(message.content)
        retries = getattr(self.customer, "retries", 0) - before
        self.steps += 2
        self.messages.append(agent)
        self._commit_customer_tools()
        self._record_customer(turn)
        reply = EnvMessage("user", turn.text, reaction=turn.label)
        if self.errors >= self.limits.max_errors:
            return await self._end("too_many_errors", (reply,), stop=turn.stop, retries=retries)
        if self.steps >= self.limits.max_steps:  # tau2: the limit overrides a stop in the same step
            return await self._end("max_steps", (reply,), stop=turn.stop, retries=retries)
        if turn.stop is not None:
            return await self._end("user_stop", (reply,), stop=turn.stop, retries=retries)
        return Step((reply,), info=self._info(retries))

    def _info(self, retries: int = 0) -> dict[str, Any]:
        return {"tool_errors": self.errors, "steps": self.steps, "simulator_retries": retries}

    async def _end(self, termination: str, messages: Sequence[EnvMessage], stop: str | None = None,
                   retries: int = 0) -> Step:
        self._ending = (termination, tuple(messages), stop, retries)
        return await self._finish(*self._ending)

    async def _finish(self, termination: str, messages: tuple[EnvMessage, ...], stop: str | None,
                      retries: int) -> Step:
        nl, details = None, {"stop_token": stop, "steps": self.steps, "tool_errors": self.errors}
        if self.scoring_mode == "tau2" and "NL_ASSERTION" in self.task.reward_basis and self.task.nl_assertions:
            if self.judge is None:
                raise ValueError("scoring_mode='tau2' with NL assertions: expected a judge client (env.tau2.judge)")
            greeting = {"role": "assistant", "content": GREETING}  # tau2's transcript opens with it
            nl, judged = await scoring.judge_nl(self.judge, self.task, [greeting, *self.messages])
            details["judge"] = judged
        # tau2 scores the database rebuilt by re-executing the episode's writes (strict: each output
        # must equal the recorded one); with deterministic tools it is the live one. Off the event
        # loop's thread: the engine keeps decoding meanwhile.
        final = await asyncio.to_thread(scoring.replay_db, self.task, self.calls, self.data_dir)
        self.result = scoring.score(self.task, final_db=final, messages=self.messages, termination=termination,
                                    mode=self.scoring_mode, nl=nl, data_dir=self.data_dir, details=details)
        self.termination, self._ending = termination, None
        return Step(messages, reward=self.result.reward, done=True,
                    info=dict(self._info(retries), termination=termination))

    def outcome_reward(self) -> float:
        return self.result.reward if self.result is not None else 0.0

    def report(self) -> dict[str, Any]:
        """The episode's record for the harness: task, seed, termination, score and transcript."""
        return {"task_id": self.task.id if self.task else None, "seed": self.seed,
                "termination": self.termination or "unfinished",
                "score": self.result.to_dict() if self.result else None,
                "db_hash": self.db_hash() if self.task else None,
                **({"user_db_hash": self.user_db_hash()} if self.task and self.domain.has_user_tools else {}),
                "messages": self.messages}

    async def aclose(self) -> None:
        """Ends the episode's resources: the customer, and the database copy (~6 MB; an evaluation
        keeps its environments for their reports), whose hash stays in `db_hash` and `report`."""
        if self.customer is not None:
            await self.customer.aclose()
        if self.db:
            self._hashes()
            self.db = {}


__all__ = ["AGENT_INSTRUCTION", "EpisodeLimits", "Tau2Env", "llm_customers", "scripted_customers",
           "system_prompt"]

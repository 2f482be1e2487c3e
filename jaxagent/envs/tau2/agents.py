"""Host-side tau2 agents: the oracle, its broken variants, and an OpenAI-compatible endpoint.

Each is a `jaxagent.envs.base.Agent`: the episode runner (`jaxagent.rollout.runner.play`) plays it
against a `Tau2Env` and returns the environment's report. The local model plays the same way,
token-in/token-out (`jaxagent.rollout.loop.PolicyAgent`).

- `OracleAgent` performs the task's gold actions in order, one tool call per turn, each write
  preceded by a message that names every argument and asks the customer to confirm, a transfer
  followed by a message saying so, each of the customer's own device actions (telecom) asked for
  in one message (`Domain.ask_user_action`), and ends with a message holding every
  ``communicate_info`` string. Against the scripted customer it reaches the gold end state on
  every train task.
- `broken_plans` derives, per task, the variants that must score 0: ``wrong_argument`` (one gold
  write with one argument changed so that the call still succeeds and the end state differs),
  ``missing_write`` (one gold write left out) and ``extra_write`` (an extra successful write: the
  customer's profile address changed, or else one of their pending orders the task leaves alone
  cancelled; made right after the last gold write). The wrong and the extra write are made
  without asking the customer (who would refuse them, or stop first when the goal was met). Each
  is checked by replay on a fresh database; a variant that cannot be built for a task (no write to
  change or leave out) is absent from the result. The candidates are the domain's
  (`Domain.broken_plans`: retail's and airline's in `jaxagent.envs.tau2.domains.*.broken`, each
  its own candidates for the shared search `derive_broken_plans`).
- `oracle_plan`: the oracle's episodes as SFT demonstrations (``job=sft env=tau2``, any domain), played
  through the runner (`jaxagent.rollout.demos.play_demos`).
- `EndpointAgent` asks an OpenAI-compatible chat-completions server (OpenAI, vLLM, SGLang...) with
  the tools in the request, so an API model or a served checkpoint is scored by the same harness.
  Its settings (``eval.endpoint``) are an `EndpointConfig`: the server and its HTTP policy only.
  The agent's system prompt is the environment's (the instruction block and ``policy.md``, as
  tau2 gives its agent) and its temperature is ``eval.temperature``, so neither is a key there (the
  user simulator's `LLMUserConfig` would bring its role-play prompt as a default).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxagent.envs.base import Agent, AgentMessage, Environment, EnvMessage, Reset
from jaxagent.envs.llm_user import LLMUserConfig
from jaxagent.envs.registry import DemoPlan
from jaxagent.envs.tau2 import get_domain
from jaxagent.envs.tau2.tasks import Action, Task
from jaxagent.text.toolcalls import ToolCall

BROKEN_VARIANTS = ("wrong_argument", "missing_write", "extra_write")


def _call(name: str, args: Mapping[str, Any]) -> AgentMessage:
    return AgentMessage("", (ToolCall(name, dict(args)),))


def proposal(name: str, args: Mapping[str, Any]) -> AgentMessage:
    return AgentMessage(f"I am about to call {name} with {json.dumps(dict(args))}. Do you confirm (yes) that I "
                        "should proceed?")


def plan_for(task: Task, actions: Sequence[Action], unconfirmed: Sequence[Action] = ()) -> list[AgentMessage]:
    """The oracle's turns for ``actions``, ending with the communicate message. Writes are proposed
    to the customer first, except those in ``unconfirmed`` (by identity), which a broken agent
    performs without asking. On a task whose gold actions change nothing, transfer no one and
    communicate nothing (a request the policy refuses: 16 of airline's 30 train tasks), the closing
    message declines, so that the demonstration reads as the refusal it is."""
    turns: list[AgentMessage] = []
    silent = list(map(id, unconfirmed))
    domain = get_domain(task.domain)
    writes = domain.write_tools
    for a in actions:
        if a.requestor == "user":   # the customer's own device action (dual control): ask for it
            if domain.ask_user_action is None:
                raise ValueError(f"task {task.id!r}: a user action ({a.name}) in domain {domain.name!r}, which "
                                 "defines no ask_user_action")
            turns.append(AgentMessage(domain.ask_user_action(a.name, a.arguments)))
            continue
        if a.name in writes and id(a) not in silent:
            turns.append(proposal(a.name, a.arguments))
        turns.append(_call(a.name, a.arguments))
        if a.name == "transfer_to_human_agents":
            turns.append(AgentMessage("I have transferred you to a human agent; they will take it from here."))
    said = ", ".join(task.communicate_info)
    refusal = not said and not any(domain.writes(a.requestor, a.name) or a.name == "transfer_to_human_agents"
                                   for a in task.actions)
    closing = ("I am sorry, but I cannot do that under our policy." if refusal else "Your request is handled.")
    turns.append(AgentMessage((f"Here is what you asked about: {said}. " if said else "")
                              + closing + " Is there anything else I can help with?"))
    return turns


class ScriptedAgent(Agent):
    """Plays a fixed list of turns; when they run out it repeats the last one."""

    def __init__(self, turns: Sequence[AgentMessage]):
        if not turns:
            raise ValueError("turns: empty; expected at least one agent message")
        self.turns, self.i = list(turns), 0

    def start(self, task_id: str, reset: Reset, env: Environment) -> None:
        self.i = 0

    async def act(self, turn: int) -> AgentMessage:
        message = self.turns[min(self.i, len(self.turns) - 1)]
        self.i += 1
        return message


class OracleAgent(ScriptedAgent):
    """Performs the task's gold actions (see the module docstring); built per task at `start` from
    the environment's task (``env.task``, a `Tau2Env`'s)."""

    def __init__(self):
        super().__init__([AgentMessage("(no task)")])

    def start(self, task_id: str, reset: Reset, env: Environment) -> None:
        task = env.task
        self.turns, self.i = plan_for(task, task.actions), 0


# ----------------------------------------------------------------------------- broken variants
def broken_plans(task: Task, data_dir: str | Path | None = None) -> dict[str, list[AgentMessage]]:
    """``{variant: turns}`` for the variants of `BROKEN_VARIANTS` this task admits, each verified
    by replay to end in a database other than the gold target (see the module docstring); the
    candidates are the task's domain's (`Domain.broken_plans`)."""
    domain = get_domain(task.domain)
    if domain.broken_plans is None:
        raise ValueError(f"domain {domain.name!r}: defines no broken plans")
    return domain.broken_plans(task, data_dir)


def _replay_hash(task: Task, actions: Sequence[Action], data_dir: str | Path | None) -> tuple[str, list[bool]]:
    """The database hash after ``actions`` on the task's initial state, and which of them succeeded."""
    from jaxagent.envs.tau2.db import db_hash
    from jaxagent.envs.tau2.scoring import initial_db

    execute = get_domain(task.domain).execute
    db = initial_db(task, data_dir)
    ok = [not execute(db, a.name, dict(a.arguments)).error for a in actions]
    return db_hash(db), ok


def derive_broken_plans(task: Task, data_dir: str | Path | None, *,
                        candidates: Callable[[Action, Mapping[str, Any]], Iterable[Mapping[str, Any]]],
                        extras: Callable[[Mapping[str, Any]], Iterable[Action]]) -> dict[str, list[AgentMessage]]:
    """The search every domain's ``broken_plans`` shares, over the domain's own proposals:

    - ``wrong_argument``: the first gold write (in order) with the first of ``candidates(action,
      initial db)`` (full argument dicts, most natural first) under which that call still succeeds and
      the end state differs from the target; made without asking the customer;
    - ``missing_write``: the first successful gold write whose omission changes the end state;
    - ``extra_write``: the first of ``extras(initial db)`` that succeeds and changes the end state,
      made without asking right after the last gold write (the customer is not consulted between a
      tool call and the next message), or first when the gold writes change nothing (the customer's
      goal would hold from the start).

    Each is checked by replay; a variant with no such proposal is absent from the result."""
    from jaxagent.envs.tau2.db import db_hash
    from jaxagent.envs.tau2.scoring import initial_db, target_hash

    target = target_hash(task, data_dir)
    acts = list(task.actions)
    writes = [i for i, a in enumerate(acts) if a.name in get_domain(task.domain).write_tools]
    _, gold_ok = _replay_hash(task, acts, data_dir)
    db0 = initial_db(task, data_dir)
    out: dict[str, list[AgentMessage]] = {}

    def first_breaking(i: int, proposals: Iterable[Action], changed_at) -> list[AgentMessage] | None:
        for a in proposals:
            changed = changed_at(a)
            h, ok = _replay_hash(task, changed, data_dir)
            if ok[i] and h != target:
                return plan_for(task, changed, unconfirmed=[a])
        return None

    for i in writes:
        wrong = (dataclasses.replace(acts[i], arguments=dict(args)) for args in candidates(acts[i], db0))
        plan = first_breaking(i, wrong, lambda a, i=i: acts[:i] + [a] + acts[i + 1:])
        if plan is not None:
            out["wrong_argument"] = plan
            break
    for i in writes:
        kept = acts[:i] + acts[i + 1:]
        if gold_ok[i] and _replay_hash(task, kept, data_dir)[0] != target:
            out["missing_write"] = plan_for(task, kept)
            break
    at = 0 if target == db_hash(db0) else max(writes, default=-1) + 1
    plan = first_breaking(at, extras(db0), lambda a: acts[:at] + [a] + acts[at:])
    if plan is not None:
        out["extra_write"] = plan
    return out


# ----------------------------------------------------------------------------- an HTTP agent
@dataclasses.dataclass(frozen=True)
class EndpointConfig:
    """The OpenAI-compatible server an `EndpointAgent` plays through (``eval.endpoint``): where it
    is and the HTTP client's policy (fields as in `LLMUserConfig`, validated the same way).

    There is no ``system_prompt``: the agent is given the environment's system message (the
    instruction block and ``policy.md``), never a user simulator's role-play prompt. There is no
    ``temperature`` either: the agent samples at ``eval.temperature``, as a local policy does
    (`client_config`).
    """

    base_url: str
    model: str
    api_key_env: str | None = None
    max_concurrency: int = 16
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    max_retries: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 120.0
    max_tokens: int | None = 512
    trust_env: bool = True  # honour HTTP(S)_PROXY / NO_PROXY from the environment
    seed: int | None = None  # the backoff jitter's RNG

    def __post_init__(self):
        try:
            normalized = self.client_config(0.0)
        except ValueError as e:   # the same checks, named after this class
            raise ValueError(str(e).replace("LLMUserConfig.", "EndpointConfig.")) from None
        object.__setattr__(self, "base_url", normalized.base_url)

    def client_config(self, temperature: float) -> LLMUserConfig:
        """The `LLMUserClient` settings for the agent at ``temperature``. Only its HTTP fields
        matter: `EndpointAgent` sends the environment's messages itself (`LLMUserClient.chat`), so
        the user-simulator fields (``system_prompt``, ``opening_message``, ``stop_markers``) keep
        their defaults and are never used."""
        return LLMUserConfig(temperature=temperature,
                             **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


def wire_call(call: Mapping[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(name, arguments) of one OpenAI ``tool_calls`` entry: the name ("unknown" when it is not a
    string) and the arguments parsed from their JSON string (None when they are not a JSON object)."""
    fn = call.get("function") or {}
    raw = fn.get("arguments", "{}")
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        args = None
    name = fn.get("name") if isinstance(fn.get("name"), str) else "unknown"
    return name, args if isinstance(args, dict) else None


class EndpointAgent(Agent):
    """An agent served over an OpenAI-compatible chat-completions API (`LLMUserClient.chat`, with
    its retry policy): the system prompt, the conversation and the tool schemas go in the request;
    the reply's ``tool_calls`` (or its text) come back as the agent's message. Arguments that are
    not a JSON object become ``call_errors`` (the environment answers them with an error). The
    client is built from an `EndpointConfig` (`EndpointConfig.client_config`); the system prompt is
    the environment's, never the client config's."""

    def __init__(self, client):
        self.client = client
        self.history: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.n_calls = 0

    def start(self, task_id: str, reset: Reset, env: Environment) -> None:
        self.history = []
        self.tools = list(reset.tools)
        self.observe(reset.messages, {})

    def observe(self, messages: Sequence[EnvMessage], info: Mapping[str, Any]) -> bool:
        """The environment's messages join the conversation; a tool message gets the id of the call
        it answers (the last assistant message's calls, in order)."""
        pending = [m for m in self.history if m.get("role") == "assistant" and m.get("tool_calls")]
        ids = [c["id"] for m in pending[-1:] for c in m["tool_calls"]]
        for m in messages:
            chat = m.to_chat()
            if m.role == "tool" and ids:
                chat["tool_call_id"] = ids.pop(0)
            self.history.append(chat)
        return True

    async def act(self, turn: int) -> AgentMessage:
        reply, _, _ = await self.client.chat(self.history, extra={"tools": self.tools}, require_content=False)
        calls, errors, wire, bad_wire = [], [], [], []
        for c in reply.get("tool_calls") or ():
            name, args = wire_call(c)
            self.n_calls += 1
            if name == "unknown" or args is None:
                # The environment answers it with an error tool message after the good calls' results;
                # it goes back to the server as a call (arguments "{}": servers parse them) with its id.
                errors.append("bad_arguments")
                bad_wire.append({"id": c.get("id") or f"call_{self.n_calls}", "type": "function",
                                 "function": {"name": name, "arguments": "{}"}})
                continue
            calls.append(ToolCall(name, args))
            wire.append({"id": c.get("id") or f"call_{self.n_calls}", "type": "function",
                         "function": {"name": name, "arguments": json.dumps(args)}})
        wire += bad_wire
        content = reply.get("content") or ""
        self.history.append({"role": "assistant", "content": content or None, **({"tool_calls": wire} if wire else {})})
        return AgentMessage(content, tuple(calls), tuple(errors))

    async def aclose(self) -> None:
        return None


def oracle_plan(make_env, tasks: Mapping[str, Task], task_ids: Sequence[str]) -> DemoPlan:
    """The oracle's episode on each of ``task_ids`` (seed 0; it is deterministic) as demonstrations,
    every oracle turn trained on, at most its plan's length + 1 turns (`play_demos` plays it)."""
    return DemoPlan(make_env=make_env, episodes=[(t, 0) for t in task_ids], agent=lambda task_id, seed: OracleAgent(),
                    max_turns=lambda task_id: len(plan_for(tasks[task_id], tasks[task_id].actions)) + 1)


__all__ = [
    "BROKEN_VARIANTS",
    "EndpointAgent",
    "EndpointConfig",
    "OracleAgent",
    "ScriptedAgent",
    "broken_plans",
    "derive_broken_plans",
    "oracle_plan",
    "plan_for",
    "proposal",
    "wire_call",
]

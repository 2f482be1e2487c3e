"""Host-side tau2 retail agents: the oracle, its broken variants, and an OpenAI-compatible endpoint.

An agent here is anything with ``start(task, reset)`` and ``async act(messages) -> AgentMessage``
(``messages``: the environment's answer to its previous turn); `play` runs one episode of one
against a `Tau2RetailEnv` and returns the environment's report. The local model does not go
through here: it plays through the rollout loop (`jaxagent.rollout.loop`), token-in/token-out.

- `OracleAgent` performs the task's gold actions in order, one tool call per turn, each write
  preceded by a message that names every argument and asks the customer to confirm, a transfer
  followed by a message saying so, and ends with a message holding every ``communicate_info``
  string. Against the scripted customer it reaches the gold database on every train task.
- `broken_plans` derives, per task, the variants that must score 0: ``wrong_argument`` (one gold
  write with one argument changed so that the call still succeeds and the end state differs),
  ``missing_write`` (one gold write left out) and ``extra_write`` (an extra successful write: the
  customer's profile address changed, or else one of their pending orders the task leaves alone
  cancelled; made right after the last gold write). The wrong and the extra write are made
  without asking the customer (who would refuse them, or stop first when the goal was met). Each is checked by replay on a fresh database; a variant
  that cannot be built for a task (no write to change or leave out) is absent from the result.
- `oracle_demos` turns the oracle's episodes into SFT demonstrations (``job=sft env=tau2_retail``).
- `EndpointAgent` asks an OpenAI-compatible chat-completions server (OpenAI, vLLM, SGLang...) with
  the tools in the request, so an API model or a served checkpoint is scored by the same harness.
  Its settings (``eval.endpoint``) are an `EndpointConfig`: the server and its HTTP policy only.
  The agent's system prompt is the environment's (the instruction block and ``policy.md``, as
  tau2 gives its agent) and its temperature is ``eval.temperature``, so neither is a key there (the
  user simulator's `LLMUserConfig` would bring its role-play prompt as a default).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxagent.envs.base import AgentMessage, EnvMessage, Reset
from jaxagent.envs.llm_user import LLMUserConfig
from jaxagent.envs.tau2_retail.customer import identity_of
from jaxagent.envs.tau2_retail.db import db_hash
from jaxagent.envs.tau2_retail.scoring import initial_db, target_hash
from jaxagent.envs.tau2_retail.tasks import Action, Task
from jaxagent.envs.tau2_retail.tools import WRITE_TOOLS, execute
from jaxagent.text.toolcalls import ToolCall

CANCEL_REASONS = ("no longer needed", "ordered by mistake")
BROKEN_VARIANTS = ("wrong_argument", "missing_write", "extra_write")


def _call(name: str, args: Mapping[str, Any]) -> AgentMessage:
    return AgentMessage("", (ToolCall(name, dict(args)),))


def proposal(name: str, args: Mapping[str, Any]) -> AgentMessage:
    return AgentMessage(f"I am about to call {name} with {json.dumps(dict(args))}. Do you confirm (yes) that I "
                        "should proceed?")


def plan_for(task: Task, actions: Sequence[Action], unconfirmed: Sequence[Action] = ()) -> list[AgentMessage]:
    """The oracle's turns for ``actions``, ending with the communicate message. Writes are proposed
    to the customer first, except those in ``unconfirmed`` (by identity), which a broken agent
    performs without asking."""
    turns: list[AgentMessage] = []
    silent = list(map(id, unconfirmed))
    for a in actions:
        if a.name in WRITE_TOOLS and id(a) not in silent:
            turns.append(proposal(a.name, a.arguments))
        turns.append(_call(a.name, a.arguments))
        if a.name == "transfer_to_human_agents":
            turns.append(AgentMessage("I have transferred you to a human agent; they will take it from here."))
    said = ", ".join(task.communicate_info)
    turns.append(AgentMessage((f"Here is what you asked about: {said}. " if said else "")
                              + "Your request is handled. Is there anything else I can help with?"))
    return turns


class ScriptedAgent:
    """Plays a fixed list of turns; when they run out it repeats the last one."""

    def __init__(self, turns: Sequence[AgentMessage]):
        if not turns:
            raise ValueError("turns: empty; expected at least one agent message")
        self.turns, self.i = list(turns), 0

    def start(self, task: Task, reset: Reset) -> None:
        self.i = 0

    async def act(self, messages: Sequence[EnvMessage]) -> AgentMessage:
        turn = self.turns[min(self.i, len(self.turns) - 1)]
        self.i += 1
        return turn

    async def aclose(self) -> None:
        return None


class OracleAgent(ScriptedAgent):
    """Performs the task's gold actions (see the module docstring); built per task at `start`."""

    def __init__(self):
        super().__init__([AgentMessage("(no task)")])

    def start(self, task: Task, reset: Reset) -> None:
        self.turns, self.i = plan_for(task, task.actions), 0


# ----------------------------------------------------------------------------- broken variants
def _replay_hash(task: Task, actions: Sequence[Action], data_dir) -> tuple[str, list[bool]]:
    db = initial_db(task, data_dir)
    ok = [not execute(db, a.name, dict(a.arguments)).error for a in actions]
    return db_hash(db), ok


def _candidates(a: Action, db: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Argument changes to try for ``a`` (each a full argument dict), most natural first."""
    args, out = dict(a.arguments), []
    if "reason" in args:
        out += [dict(args, reason=r) for r in CANCEL_REASONS if r != args["reason"]]
    if "zip" in args:
        out.append(dict(args, zip="99999" if args["zip"] != "99999" else "11111"))
    order = db["orders"].get(args.get("order_id")) if isinstance(args.get("order_id"), str) else None
    owner = order["user_id"] if order else args.get("user_id")
    user = db["users"].get(owner) if isinstance(owner, str) else None
    if "payment_method_id" in args and user:
        out += [dict(args, payment_method_id=p) for p in user["payment_methods"] if p != args["payment_method_id"]]
    if args.get("new_item_ids") and order:
        old = args["item_ids"][0]
        pid = next((it["product_id"] for it in order["items"] if it["item_id"] == old), None)
        if pid:
            for vid, v in db["products"][pid]["variants"].items():
                if v["available"] and vid not in (old, args["new_item_ids"][0]):
                    out.append(dict(args, new_item_ids=[vid, *args["new_item_ids"][1:]]))
    if a.name == "return_delivered_order_items" and order:
        if len(args["item_ids"]) > 1:
            out.append(dict(args, item_ids=args["item_ids"][:-1]))
        out += [dict(args, item_ids=[it["item_id"]]) for it in order["items"] if it["item_id"] not in args["item_ids"]]
        out.append(dict(args, item_ids=[]))
    return out


def broken_plans(task: Task, data_dir: str | Path | None = None) -> dict[str, list[AgentMessage]]:
    """``{variant: turns}`` for the variants of `BROKEN_VARIANTS` this task admits, each verified
    by replay to end in a database other than the gold target (see the module docstring)."""
    target = target_hash(task, data_dir)
    acts = list(task.actions)
    writes = [i for i, a in enumerate(acts) if a.name in WRITE_TOOLS]
    _, gold_ok = _replay_hash(task, acts, data_dir)
    out: dict[str, list[AgentMessage]] = {}
    db0 = initial_db(task, data_dir)
    for i in writes:
        if "wrong_argument" in out:
            break
        for args in _candidates(acts[i], db0):
            wrong = dataclasses.replace(acts[i], arguments=args)
            changed = acts[:i] + [wrong] + acts[i + 1:]
            h, ok = _replay_hash(task, changed, data_dir)
            if ok[i] and h != target:
                out["wrong_argument"] = plan_for(task, changed, unconfirmed=[wrong])
                break
    for i in writes:
        if not gold_ok[i]:
            continue
        kept = acts[:i] + acts[i + 1:]
        if _replay_hash(task, kept, data_dir)[0] != target:
            out["missing_write"] = plan_for(task, kept)
            break
    me = identity_of(task)
    user_id = me.user_id
    if user_id is None:
        probe = initial_db(task, data_dir)
        for name, args in (("find_user_id_by_email", {"email": me.email}),
                           ("find_user_id_by_name_zip", {"first_name": me.first_name, "last_name": me.last_name,
                                                         "zip": me.zip})):
            res = execute(probe, name, args)
            if not res.error:
                user_id = res.content
                break
    if user_id is not None and user_id in db0["users"]:
        touched = {a.arguments.get("order_id") for a in acts}
        extras = [Action("extra", "modify_user_address", {"user_id": user_id, "address1": "1 Nowhere Lane",
                                                            "address2": "", "city": "Springfield", "state": "IL",
                                                            "country": "USA", "zip": "62701"})]
        extras += [Action("extra", "cancel_pending_order", {"order_id": o, "reason": "ordered by mistake"})
                   for o in db0["users"][user_id]["orders"]
                   if o not in touched and db0["orders"][o]["status"] == "pending"]
        # The extra write goes right after the last gold write (the customer is not consulted between
        # a tool call and the next message), or first when the goal holds from the start (the
        # customer would end the episode at the agent's first message).
        at = 0 if target == db_hash(db0) else max(writes, default=-1) + 1
        for extra in extras:
            changed = acts[:at] + [extra] + acts[at:]
            h, ok = _replay_hash(task, changed, data_dir)
            if ok[at] and h != target:
                out["extra_write"] = plan_for(task, changed, unconfirmed=[extra])
                break
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


class EndpointAgent:
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

    def start(self, task: Task, reset: Reset) -> None:
        # The reset messages reach the history through the first `act` (`play` passes them as the
        # environment's first answer); copying them here too would send them twice.
        self.history = []
        self.tools = list(reset.tools)

    async def act(self, messages: Sequence[EnvMessage]) -> AgentMessage:
        pending = [m for m in self.history if m.get("role") == "assistant" and m.get("tool_calls")]
        ids = [c["id"] for m in pending[-1:] for c in m["tool_calls"]]
        for m in messages:
            chat = m.to_chat()
            if m.role == "tool" and ids:
                chat["tool_call_id"] = ids.pop(0)
            self.history.append(chat)
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


async def play(env, agent, task_id: str, seed: int = 0, *, max_turns: int = 200) -> dict[str, Any]:
    """One episode of a host agent against ``env``; returns ``env.report()`` (plus ``agent_turns``)."""
    turns = 0
    try:
        reset = await env.reset(task_id, seed)
        agent.start(env.task, reset)
        messages: Sequence[EnvMessage] = reset.messages
        for turns in range(1, max_turns + 1):
            step = await env.step(await agent.act(messages))
            if step.done:
                break
            messages = step.messages
    finally:
        await env.aclose()
    return dict(env.report(), agent_turns=turns)


async def oracle_demo(env, task_id: str):
    """The oracle's episode on ``task_id`` as an SFT demonstration (`jaxagent.envs.base.Demo`):
    the reset's messages, each oracle turn (trained on) and the environment's answers, without the
    final step's answers, exactly as the rollout loop renders an episode."""
    from jaxagent.envs.base import Demo, agent_message_to_chat

    agent = OracleAgent()
    try:
        reset = await env.reset(task_id, 0)
        agent.start(env.task, reset)
        messages = [m.to_chat() for m in reset.messages]
        train = [False] * len(messages)
        env_messages: Sequence[EnvMessage] = reset.messages
        for _ in range(len(agent.turns) + 1):
            msg = await agent.act(env_messages)
            messages.append(agent_message_to_chat(msg))
            train.append(True)
            step = await env.step(msg)
            if step.done:
                break
            env_messages = step.messages
            messages.extend(m.to_chat() for m in step.messages)
            train.extend([False] * len(step.messages))
        reward = env.outcome_reward()
    finally:
        await env.aclose()
    return Demo(task_id, tuple(messages), tuple(train), reward, tuple(reset.tools))


def oracle_demos(make_env, task_ids: Sequence[str]) -> list:
    """`oracle_demo` of every task (one per task: the oracle is deterministic). Synchronous."""

    async def _all():
        return [await oracle_demo(make_env(), t) for t in task_ids]

    return asyncio.run(_all())


__all__ = [
    "BROKEN_VARIANTS",
    "CANCEL_REASONS",
    "EndpointAgent",
    "EndpointConfig",
    "OracleAgent",
    "ScriptedAgent",
    "broken_plans",
    "oracle_demo",
    "oracle_demos",
    "plan_for",
    "play",
    "proposal",
    "wire_call",
]

"""The Q&D loop inside a tau2 retail agent (host code): the Q&D spec's §5.4 transfer, no further training.

`Tau2QDAgent` is a tau2 retail agent (`start(task, reset)`, `async act(messages)`, as
`jaxagent.envs.tau2.agents`). On each customer message it runs the whole questioner-drafter
loop inside **one** assistant turn:

- the **task text** the questioner sees is what the customer has said so far (their messages only,
  never the scenario); the user channel is closed: questions go to the retriever only;
- the **retriever** is the store's read-only tools: a selector maps each question to one read-only
  call with arguments (`RuleSelector` offline, `EndpointSelector` a model with the seven read tool
  schemas); a write, generic or unknown tool executes nothing; the call runs against the live
  database (`Tau2Env.read`: outside the conversation, never scored);
- **evidence units** are the database records the call's arguments name (``user:<id>``,
  ``order:<id>``, ``product:<id>``, ``item:<id>``), else one unit identified by the request
  (``find_user_id_by_email:<email>``, ``list_all_product_types``), never by the result; the
  questioner sees each unit's first 1,200 characters, drafter and answerer up to 32,000;
- after the loop the **draft** may end with a tool plan (``TOOL PLAN:`` and a JSON list of calls):
  those calls are the assistant message's tool calls, which the environment executes and scores;
  then the **answerer** writes the customer-facing text (seeing the calls' results);
- **budgets per dialogue**: ``questions`` executed questions, and ``tool_calls`` planned calls
  (``calculate`` and ``transfer_to_human_agents`` exempt); a question past the budget ends the
  turn's loop unexecuted, planned calls past it are dropped and counted.

Every turn is logged (`Tau2QDAgent.log`: questions, the calls they selected, new evidence, the
draft, the planned and dropped calls, the answer), so a report gives questions per dialogue.

Offline stand-ins (no model; every report names them): `ScriptedTau2Questioner` asks about the
identifiers the conversation and the evidence name (the customer's email, name and zip, user ids,
order ids, the products of the orders the customer named) and stops when none is left;
`RuleSelector` reads the identifier in the question; `LookupDrafter` resolves a question with the
record it retrieved and drafts a list of what is held, **with no tool plan** (it cannot decide a
database change), and `LookupAnswerer` asks for the customer's identity until a user is found, then
reports what was found. Together they exercise the whole loop against the real environment; their
success rate says nothing about Q&D. `EndpointDrafter` / `EndpointAnswerer` / `EndpointSelector`
call an OpenAI-compatible model with the environment's policy in their prompts.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import jax

from jaxagent.envs.base import Agent, AgentMessage, EnvMessage, Environment, Reset
from jaxagent.envs.llm_user import LLMUserClient
from jaxagent.envs.retrieval_qa.tasks import QATask, Unit
from jaxagent.envs.tau2.agents import wire_call
from jaxagent.envs.tau2.domains.retail.tools import READ_TOOLS, WRITE_TOOLS, tool_schemas
from jaxagent.qd.agents import QDState, Questioner, Reply, describe
from jaxagent.qd.loop import RoleFailed, call_role
from jaxagent.qd.prompts import STOP_JSON, EvidenceView, ask_json, first_json_object, parse_action, render_state
from jaxagent.text.toolcalls import ToolCall

BENCHMARK = "tau2_retail"
QUESTIONER_CHARS, DRAFTER_CHARS = 1200, 32_000
EXEMPT_TOOLS = frozenset({"calculate", "transfer_to_human_agents"})
PLAN_MARKER = "TOOL PLAN:"

ROUTING = ("You are helping a retail customer-service agent decide what to look up before it replies. Your "
           "questions are answered only by read-only lookups in the store's database, one lookup per question: "
           "a user id by email, or by first name, last name and zip code; a user's details (their orders and "
           "payment methods); an order's details (its items, status and payment); a product's details (its "
           "variants); an item's details; the list of product types. Name the identifier you want looked up "
           "(an email, a user id, an order id such as #W1234567, a product or item id). The customer cannot "
           "see your questions.")
STOPPING = ("Stop as soon as the evidence held is enough for the agent's next reply to the customer (for example "
            "when the next step is to ask the customer for something the database cannot tell), or when no "
            "lookup would add to it; never ask for a record already held.")
PROMPTS = {"routing": ROUTING, "routing_stop": f"{ROUTING} {STOPPING}"}


# ----------------------------------------------------------------------------- evidence
def evidence_key(name: str, arguments: Mapping[str, Any]) -> str:
    """The evidence identity of a read call: the record its argument names (``user:<id>``,
    ``order:<id>``, ``product:<id>``, ``item:<id>``), else the request itself."""
    for arg, kind in (("user_id", "user"), ("order_id", "order"), ("product_id", "product"), ("item_id", "item")):
        if arg in arguments:
            return f"{kind}:{arguments[arg]}"
    if not arguments:
        return name
    return f"{name}:" + ",".join(f"{k}={arguments[k]}" for k in sorted(arguments))


@dataclasses.dataclass(frozen=True)
class Tau2Context:
    """What the drafter and the answerer see besides the evidence: the policy and the conversation
    (the customer's messages and the agent's customer-facing ones, in order)."""

    policy: str
    conversation: tuple[tuple[str, str], ...]  # (role, text), role "customer" | "agent"

    @property
    def customer_text(self) -> str:
        return "\n".join(t for r, t in self.conversation if r == "customer")


# ----------------------------------------------------------------------------- selectors
class Selector(Protocol):
    name: str

    async def select(self, question: str, context: Tau2Context) -> ToolCall | None: ...


_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_ORDER = re.compile(r"#W\d{7}")
_USER = re.compile(r"\b[a-z]+_[a-z]+_\d{4}\b")
_TEN = re.compile(r"\b\d{10}\b")
_NAME_ZIP = re.compile(r"\b([A-Z][a-z]+) ([A-Z][a-z]+)\b[^.?!]*?\bzip(?: code)?(?: is)? (\d{5})\b")


class RuleSelector:
    """Offline stand-in: the read call named by the first identifier in the question (an order
    id, a user id, an email, a product / item id with the word product / item before it, a name
    with a zip code, "product types"); None when it names none."""

    name = "rules (offline stand-in, no model)"

    async def select(self, question: str, context: Tau2Context) -> ToolCall | None:
        if m := _ORDER.search(question):
            return ToolCall("get_order_details", {"order_id": m.group(0)})
        if m := _USER.search(question):
            return ToolCall("get_user_details", {"user_id": m.group(0)})
        if m := _EMAIL.search(question):
            return ToolCall("find_user_id_by_email", {"email": m.group(0).rstrip(".")})
        if m := _TEN.search(question):
            kind = "get_item_details" if re.search(r"\bitem\b", question[: m.start()], re.I) else "get_product_details"
            return ToolCall(kind, {("item_id" if kind == "get_item_details" else "product_id"): m.group(0)})
        if m := _NAME_ZIP.search(question):
            return ToolCall("find_user_id_by_name_zip", {"first_name": m.group(1), "last_name": m.group(2),
                                                         "zip": m.group(3)})
        if re.search(r"product types", question, re.I):
            return ToolCall("list_all_product_types", {})
        return None


def read_tool_schemas() -> list[dict[str, Any]]:
    return [s for s in tool_schemas() if s["function"]["name"] in READ_TOOLS]


class EndpointSelector:
    """A model (the drafter's, as the spec has it) picks one read call for the question, with the
    seven read tool schemas and ``tool_choice="required"``; its first call is taken (None when it
    made none)."""

    def __init__(self, client: LLMUserClient):
        self.client, self.name = client, f"endpoint:{client.config.model}"
        self.tools = read_tool_schemas()

    async def select(self, question: str, context: Tau2Context) -> ToolCall | None:
        msg = [{"role": "system", "content": "Choose the one database lookup that answers the question. The "
                                             "customer has said:\n" + context.customer_text},
               {"role": "user", "content": question}]
        reply, _, _ = await self.client.chat(msg, extra={"tools": self.tools, "tool_choice": "required"},
                                             require_content=False)
        for c in reply.get("tool_calls") or ():
            name, args = wire_call(c)
            return ToolCall(name, args) if name != "unknown" and args is not None else None
        return None


# ----------------------------------------------------------------------------- questioners
class ScriptedTau2Questioner:
    """Offline stand-in (no model, ``key`` unused): asks, in order, for the first lookup not done
    yet among the customer's email, their name and zip code, each user id found, each order id the
    customer or a user record names, and the products of the orders the customer named; STOP when
    none is left."""

    name = "scripted-tau2"

    async def act(self, state: QDState, key: jax.Array) -> Reply:
        said = state.task.question
        held = {u.source_id for u in state.task.pool}
        asked = {q for q, _ in state.history}
        evidence = " ".join(u.text for u in state.task.pool)
        named_orders = list(dict.fromkeys(_ORDER.findall(said)))
        wanted = [f"Find the user id of the customer with email {e}." for e in dict.fromkeys(_EMAIL.findall(said))]
        wanted += [f"Find the user id of {m.group(1)} {m.group(2)} with zip code {m.group(3)}."
                   for m in _NAME_ZIP.finditer(said)]
        for u in dict.fromkeys(_USER.findall(said + " " + evidence)):
            wanted.append(f"What are the details of user {u}?")
        for o in dict.fromkeys(named_orders + _ORDER.findall(evidence)):
            wanted.append(f"What are the details of order {o}?")
        for u in state.task.pool:  # the products of the orders the customer named
            if u.source_id in {f"order:{o}" for o in named_orders}:
                for p in dict.fromkeys(re.findall(r'"product_id": "(\d{10})"', u.text)):
                    wanted.append(f"What are the details of product {p}?")
        for q in wanted:
            call = await RuleSelector().select(q, Tau2Context("", ()))
            if q not in asked and call is not None and evidence_key(call.name, call.arguments) not in held:
                return Reply(ask_json(q, "a record the request depends on"))
        return Reply(STOP_JSON)


# ----------------------------------------------------------------------------- drafters, answerers
class Tau2Drafter(Protocol):
    name: str

    async def resolve(self, context: Tau2Context, held: Sequence[Unit], question: str, found: Unit | None) -> Reply: ...

    async def draft(self, context: Tau2Context, held: Sequence[Unit]) -> Reply: ...


class Tau2Answerer(Protocol):
    name: str

    async def answer(self, context: Tau2Context, held: Sequence[Unit], draft: str,
                     results: Sequence[tuple[ToolCall, str]]) -> Reply: ...


class LookupDrafter:
    """Offline stand-in: a question's reply is the record it retrieved (its first 300 words) or
    "no lookup answers this"; the draft lists the records held, with no tool plan."""

    name = "lookup (offline stand-in, no model)"

    async def resolve(self, context: Tau2Context, held: Sequence[Unit], question: str, found: Unit | None) -> Reply:
        if found is None:
            return Reply("No read-only lookup answers this question.")
        return Reply(" ".join(found.text.split()[:300]))

    async def draft(self, context: Tau2Context, held: Sequence[Unit]) -> Reply:
        return Reply("Records held: " + (", ".join(u.source_id for u in held) or "none") + ".")


class LookupAnswerer:
    """Offline stand-in: without a user record held, asks for the email (or name and zip code);
    with one, says what was found (the user id and their order ids and statuses)."""

    name = "lookup (offline stand-in, no model)"

    async def answer(self, context: Tau2Context, held: Sequence[Unit], draft: str,
                     results: Sequence[tuple[ToolCall, str]]) -> Reply:
        users = [u for u in held if u.source_id.startswith("user:")]
        if not users:
            return Reply("To help you, I need to find your account: could you give me your email address, or "
                         "your first name, last name and zip code?")
        orders = []
        for u in held:
            if u.source_id.startswith("order:"):
                m = re.search(r'"status": "([^"]+)"', u.text)
                orders.append(f"{u.source_id[6:]} ({m.group(1) if m else 'status unknown'})")
        return Reply(f"I found your account ({users[0].source_id[5:]})" + (
            ": orders " + ", ".join(orders) if orders else "") + ". What would you like me to do?")


def _evidence(held: Sequence[Unit], chars: int) -> str:
    return "\n".join(f"[{u.source_id}] {u.text[:chars]}" for u in held) or "(nothing looked up)"


def _conversation(context: Tau2Context) -> str:
    return "\n".join(f"{r.capitalize()}: {t}" for r, t in context.conversation)


class _EndpointRole:
    def __init__(self, client: LLMUserClient):
        self.client, self.name = client, f"endpoint:{client.config.model}"

    async def _ask(self, context: Tau2Context, held: Sequence[Unit], instruction: str) -> Reply:
        text, usage = await self.client.complete_usage([
            {"role": "system", "content": f"You work for a retail customer-service agent.\n<policy>\n{context.policy}\n"
                                          "</policy>"},
            {"role": "user", "content": f"Conversation so far:\n{_conversation(context)}\n\nDatabase records looked "
                                        f"up:\n{_evidence(held, DRAFTER_CHARS)}\n\n{instruction}"}])
        return Reply(text or "", usage["prompt_tokens"], usage["completion_tokens"])


class EndpointDrafter(_EndpointRole):
    async def resolve(self, context: Tau2Context, held: Sequence[Unit], question: str, found: Unit | None) -> Reply:
        r = await self._ask(context, held, f"Answer this question from the records only, briefly: {question}")
        return Reply(" ".join(r.text.split()[:300]), r.prompt_tokens, r.completion_tokens)

    async def draft(self, context: Tau2Context, held: Sequence[Unit]) -> Reply:
        schemas = json.dumps([s for s in tool_schemas() if s["function"]["name"] in WRITE_TOOLS | EXEMPT_TOOLS])
        r = await self._ask(context, held, (
            "Write the agent's current draft: what is established, what is still missing, and what the agent "
            "does next. Follow the policy: a database change needs the customer's explicit confirmation of its "
            f"details first. Only when the policy allows calls now, end the draft with a line '{PLAN_MARKER}' and a "
            f"JSON list of calls [{{\"name\": ..., \"arguments\": {{...}}}}] using these tools: {schemas}"))
        return Reply(" ".join(r.text.split()[:700]) if PLAN_MARKER not in r.text else r.text, r.prompt_tokens,
                     r.completion_tokens)


class EndpointAnswerer(_EndpointRole):
    async def answer(self, context: Tau2Context, held: Sequence[Unit], draft: str,
                     results: Sequence[tuple[ToolCall, str]]) -> Reply:
        done = "\n".join(f"{c.name}({json.dumps(c.arguments)}) -> {out}" for c, out in results) or "(none)"
        return await self._ask(context, held, f"Draft:\n{strip_plan(draft)}\n\nCalls just made and their results:\n"
                                              f"{done}\n\nWrite the agent's next message to the customer, and nothing "
                                              "else.")


def split_plan(draft: str) -> tuple[str, list[ToolCall], int]:
    """(the draft without its plan, the plan's well-formed calls, how many entries were malformed)."""
    at = draft.rfind(PLAN_MARKER)
    if at < 0:
        return draft, [], 0
    body = draft[at + len(PLAN_MARKER):]
    start = body.find("[")
    try:
        items, _ = json.JSONDecoder().raw_decode(body[start:]) if start >= 0 else (None, 0)
    except ValueError:
        items = None
    if not isinstance(items, list):  # one call written as an object, or nothing readable (one malformed entry)
        obj = first_json_object(body)
        try:
            items = [json.loads(obj)] if obj else []
        except ValueError:
            return draft[:at].rstrip(), [], 1
        if not items:
            return draft[:at].rstrip(), [], int(bool(body.strip()))
    calls, bad = [], 0
    for it in items:
        if isinstance(it, dict) and isinstance(it.get("name"), str) and isinstance(it.get("arguments", {}), dict):
            calls.append(ToolCall(it["name"], dict(it.get("arguments", {}))))
        else:
            bad += 1
    return draft[:at].rstrip(), calls, bad


def strip_plan(draft: str) -> str:
    return split_plan(draft)[0]


# ----------------------------------------------------------------------------- the agent
@dataclasses.dataclass(frozen=True)
class Tau2QDConfig:
    questions: int = 16  # executed questions per dialogue
    tool_calls: int = 16  # planned calls per dialogue (calculate and transfer_to_human_agents exempt)
    max_decisions: int = 16  # questioner decisions per assistant turn
    prompt: Literal["routing", "routing_stop"] = "routing"
    retries: int = 2

    def __post_init__(self) -> None:
        for f in ("questions", "tool_calls", "max_decisions", "retries"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"qd.tau2.{f}={v!r}: expected an integer >= 0")
        if self.prompt not in PROMPTS:
            raise ValueError(f"qd.tau2.prompt={self.prompt!r}: expected one of {sorted(PROMPTS)}")


Reader = Callable[[str, Mapping[str, Any]], Any]  # (name, arguments) -> ToolResult | None


class Tau2QDAgent(Agent):
    """The agent of the module docstring. ``reader``: the episode's read-only tool runner
    (`Tau2Env.read`); ``key``, ``seed``: the questioner's sampling (decision i of the
    dialogue samples with ``fold_in(fold_in(key, seed), i)``)."""

    def __init__(self, questioner: Questioner, selector: Selector, drafter: Tau2Drafter, answerer: Tau2Answerer, *,
                 reader: Reader, key: jax.Array, seed: int = 0, config: Tau2QDConfig = Tau2QDConfig()):
        self.questioner, self.selector, self.drafter, self.answerer = questioner, selector, drafter, answerer
        self.reader, self.config = reader, config
        self.key = jax.random.fold_in(key, seed)
        self.log: list[dict[str, Any]] = []
        self.policy, self.task_id = "", ""
        self.conversation: list[tuple[str, str]] = []
        self.units: dict[str, Unit] = {}
        self.history: list[tuple[str, str]] = []
        self.draft = ""
        self.questions = self.planned = self.decisions = 0
        self._owed: dict[str, Any] | None = None  # the turn whose plan ran: the answer is still owed

    def start(self, task_id: str, reset: Reset, env: Environment) -> None:
        self.task_id = str(task_id)
        self.policy = next((m.content for m in reset.messages if m.role == "system"), "")
        self.conversation, self.units, self.history, self.log = [], {}, [], []
        self.draft, self.questions, self.planned, self.decisions, self._owed = "", 0, 0, 0, None
        self.inbox: list[EnvMessage] = list(reset.messages)

    def observe(self, messages: Sequence[EnvMessage], info: Mapping[str, Any]) -> bool:
        """The environment's answer (tool results of the planned calls, or the customer's reply) is
        read by the next `act`."""
        self.inbox = list(messages)
        return True

    @property
    def held(self) -> list[Unit]:
        return list(self.units.values())

    def context(self) -> Tau2Context:
        return Tau2Context(self.policy, tuple(self.conversation))

    def _state(self, t: int) -> QDState:
        held = self.held
        task = QATask(BENCHMARK, self.task_id, self.context().customer_text, "", (), tuple(held), 1)
        views = [EvidenceView(u.source_id, u.title, u.text[:QUESTIONER_CHARS]) for u in held]
        prompt = render_state(question=task.question, benchmark=BENCHMARK, evidence=views, draft=strip_plan(self.draft),
                              history=self.history, instructions=PROMPTS[self.config.prompt])
        return QDState(task, tuple(range(len(held))), (), self.draft, tuple(self.history), prompt, t)

    async def act(self, turn: int) -> AgentMessage:
        r, messages = self.config.retries, self.inbox
        if self._owed is not None:  # the plan's calls ran: their results, then the customer-facing text
            turn, self._owed = self._owed, None
            results = [(c, m.content) for c, m in zip(turn["calls"], [m for m in messages if m.role == "tool"])]
            turn["results"] = [m.content[:500] for m in messages if m.role == "tool"]
            return await self._answer(turn, results)
        for m in messages:
            if m.role == "user":
                self.conversation.append(("customer", m.content))
        turn: dict[str, Any] = {"questions": [], "stop": "max_decisions", "calls": [], "dropped_calls": 0,
                                "malformed_plan": 0}
        self.log.append(turn)
        for t in range(self.config.max_decisions):
            state = self._state(len(turn["questions"]))
            reply = await call_role("questioner.act", r, self.questioner.act, state, jax.random.fold_in(self.key,
                                                                                                   self.decisions))
            self.decisions += 1
            action = parse_action(reply.text)
            if action.kind == "stop":
                turn["stop"] = "malformed" if action.malformed else "policy_stop"
                break
            if self.questions + 1 > self.config.questions:
                turn["stop"] = "budget"
                break
            self.questions += 1
            call = await call_role("selector.select", r, self.selector.select, action.question, self.context())
            found, new, rec = None, False, {"question": action.question, "call": None, "evidence": None, "new": False}
            if call is not None and call.name in READ_TOOLS:
                res = self.reader(call.name, call.arguments)
                key = evidence_key(call.name, call.arguments)
                rec["call"] = {"name": call.name, "arguments": dict(call.arguments)}
                if res is not None and not res.error:
                    new = key not in self.units
                    found = Unit(len(self.units) if new else self.units[key].index, key, key, res.content)
                    self.units[key] = found
                    rec.update(evidence=key, new=new)
                else:
                    rec["error"] = (res.content if res is not None else "not a read-only tool")[:200]
            elif call is not None:
                rec["call"] = {"name": call.name, "arguments": dict(call.arguments)}
                rec["error"] = "not a read-only tool: nothing executed"
            answer = await call_role("drafter.resolve", r, self.drafter.resolve, self.context(), self.held, action.question,
                                 found)
            self.draft = (await call_role("drafter.draft", r, self.drafter.draft, self.context(), self.held)).text
            self.history.append((action.question, answer.text))
            turn["questions"].append(rec)
        if not turn["questions"]:  # no question this turn: the draft still follows the conversation
            self.draft = (await call_role("drafter.draft", r, self.drafter.draft, self.context(), self.held)).text
        turn["draft"] = self.draft
        _, plan, bad = split_plan(self.draft)
        turn["malformed_plan"] = bad
        calls = []
        for c in plan:
            if c.name in EXEMPT_TOOLS:
                calls.append(c)
            elif self.planned < self.config.tool_calls:
                self.planned += 1
                calls.append(c)
            else:
                turn["dropped_calls"] += 1
        turn["calls"] = calls
        if calls:
            self._owed = turn
            return AgentMessage("", tuple(calls))
        return await self._answer(turn, [])

    async def _answer(self, turn: dict[str, Any], results: list[tuple[ToolCall, str]]) -> AgentMessage:
        text = (await call_role("answerer.answer", self.config.retries, self.answerer.answer, self.context(), self.held,
                            self.draft, results)).text.strip() or "Could you tell me more about your request?"
        turn["answer"] = text
        turn["calls"] = [{"name": c.name, "arguments": dict(c.arguments)} for c in turn["calls"]]
        self.conversation.append(("agent", text))
        return AgentMessage(text)

    def record(self) -> dict[str, Any]:
        """The agent's side of the episode: per-turn log, questions asked, planned calls."""
        return {"questioner": describe(self.questioner), "selector": describe(self.selector),
                "drafter": describe(self.drafter), "answerer": describe(self.answerer),
                "questions": self.questions, "planned_calls": self.planned, "decisions": self.decisions,
                "evidence": list(self.units), "turns": self.log}

    async def aclose(self) -> None:
        return None


def follow_up_turns(report: Mapping[str, Any]) -> int:
    """Customer messages after the opening one in an episode report's transcript."""
    return max(0, sum(m.get("role") == "user" for m in report.get("messages") or ()) - 1)


__all__ = ["BENCHMARK", "EXEMPT_TOOLS", "PLAN_MARKER", "PROMPTS", "EndpointAnswerer", "EndpointDrafter",
           "EndpointSelector", "LookupAnswerer", "LookupDrafter", "RoleFailed", "RuleSelector", "ScriptedTau2Questioner",
           "Selector", "Tau2Answerer", "Tau2Context", "Tau2Drafter", "Tau2QDAgent", "Tau2QDConfig", "evidence_key",
           "follow_up_turns", "read_tool_schemas", "split_plan", "strip_plan"]

"""The Q&D loop inside a tau2 agent (host code): the Q&D spec's §5.4 transfer, no further training,
on any tau2 domain with a Q&D plug-in (`QD_DOMAINS`: retail, airline).

`Tau2QDAgent` is a tau2 agent (`start(task, reset)`, `async act(messages)`, as
`jaxagent.envs.tau2.agents`). On each customer message it runs the whole questioner-drafter
loop inside **one** assistant turn:

- the **task text** the questioner sees is what the customer has said so far (their messages only,
  never the scenario); the user channel is closed: questions go to the retriever only;
- the **retriever** is the domain's read-only tools (`Domain.read_tools`): a selector maps each
  question to one read-only call with arguments (`RuleSelector` offline, `EndpointSelector` a model
  with the read tool schemas); a write, generic or unknown tool executes nothing; the call runs
  against the live database (`Tau2Env.read`: outside the conversation, never scored);
- **evidence units** are the database records the call's arguments name (retail: ``user:<id>``,
  ``order:<id>``, ``product:<id>``, ``item:<id>``; airline: ``user:<id>``, ``reservation:<id>``,
  ``flight:<number>:<date>``), else one unit identified by the request
  (``find_user_id_by_email:email=...``, ``list_all_airports``), never by the result; the
  questioner sees each unit's first 1,200 characters, drafter and answerer up to 32,000;
- after the loop the **draft** may end with a tool plan (``TOOL PLAN:`` and a JSON list of calls):
  those calls are the assistant message's tool calls, which the environment executes and scores;
  then the **answerer** writes the customer-facing text (seeing the calls' results);
- **budgets per dialogue**: ``questions`` executed questions, and ``tool_calls`` planned calls
  (``calculate`` and ``transfer_to_human_agents`` exempt); a question past the budget ends the
  turn's loop unexecuted, planned calls past it are dropped and counted.

What is a domain's own (`QDDomain`, one entry per domain in `QD_DOMAINS`, the one place to add a
domain): the questioner's routing paragraph and whom the drafter and the answerer work for, which
arguments name an evidence record, the offline selector's rules (the identifiers a question can
name), the offline questioner's lookups, and the offline answerer's identity request and report.
The tools, their schemas and the policy come from the domain itself (`jaxagent.envs.tau2.get_domain`).

Every turn is logged (`Tau2QDAgent.log`: questions, the calls they selected, new evidence, the
draft, the planned and dropped calls, the answer), so a report gives questions per dialogue.

Offline stand-ins (no model; every report names them): `ScriptedTau2Questioner` asks about the
identifiers the conversation and the evidence name (retail: the customer's email, name and zip,
user ids, order ids, the products of the orders the customer named; airline: user ids, reservation
ids, the status of the flights of the reservations, or the flight numbers, the customer named) and
stops when none is left; `RuleSelector` reads the identifier in the question; `LookupDrafter`
resolves a question with the record it retrieved and drafts a list of what is held, **with no
tool plan** (it cannot decide a database change), and `LookupAnswerer` asks for the customer's
identity until a user is found, then reports what was found. Together they exercise the whole loop
against the real environment; their success rate says nothing about Q&D. `EndpointDrafter` /
`EndpointAnswerer` / `EndpointSelector` call an OpenAI-compatible model with the environment's
policy in their prompts.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import jax

from jaxagent.envs.base import Agent, AgentMessage, Environment, EnvMessage, Reset
from jaxagent.envs.llm_user import LLMUserClient
from jaxagent.envs.retrieval_qa.tasks import QATask, Unit
from jaxagent.envs.tau2 import DEFAULT_DOMAIN, Domain, get_domain
from jaxagent.envs.tau2.agents import wire_call
from jaxagent.qd.agents import QDState, Questioner, Reply, describe
from jaxagent.qd.loop import RoleFailed, call_role
from jaxagent.qd.prompts import STOP_JSON, EvidenceView, ask_json, first_json_object, parse_action, render_state
from jaxagent.text.toolcalls import ToolCall

QUESTIONER_CHARS, DRAFTER_CHARS = 1200, 32_000
EXEMPT_TOOLS = frozenset({"calculate", "transfer_to_human_agents"})
PLAN_MARKER = "TOOL PLAN:"
STOPPING = ("Stop as soon as the evidence held is enough for the agent's next reply to the customer (for example "
            "when the next step is to ask the customer for something the database cannot tell), or when no "
            "lookup would add to it; never ask for a record already held.")
PROMPT_NAMES = ("routing", "routing_stop")


# ----------------------------------------------------------------------------- domains
@dataclasses.dataclass(frozen=True)
class QDDomain:
    """What the Q&D loop needs to know about one tau2 domain besides the `Domain` itself (tools,
    schemas, policy: `tau2`):

    - ``agent``: whom the endpoint drafter and answerer work for ("a retail customer-service agent");
    - ``routing``: the questioner's instructions (what the read-only lookups answer);
    - ``records``: ``(arguments, kind)`` in order: the first whose arguments a read call all has
      names its evidence record, ``kind:<value>[:<value>...]`` (`evidence_key`);
    - ``rules(question)``: the offline selector (`RuleSelector`): the read call named by the first
      identifier in the question, None when it names none;
    - ``wanted(said, held)``: the offline questioner's candidate questions in order (`ScriptedTau2Questioner`
      asks the first whose call is not held yet), from what the customer said and the evidence held;
    - ``ask_identity``: the offline answerer's text while no ``user:`` record is held (`LookupAnswerer`);
    - ``report(held)``: its text once one is (what was found).
    """

    name: str
    agent: str
    routing: str
    records: tuple[tuple[tuple[str, ...], str], ...]
    rules: Callable[[str], ToolCall | None]
    wanted: Callable[[str, Sequence[Unit]], list[str]]
    ask_identity: str
    report: Callable[[Sequence[Unit]], str]

    @property
    def benchmark(self) -> str:
        return f"tau2_{self.name}"

    @property
    def prompts(self) -> dict[str, str]:
        return {"routing": self.routing, "routing_stop": f"{self.routing} {STOPPING}"}

    @property
    def tau2(self) -> Domain:
        return get_domain(self.name)

    def evidence_key(self, name: str, arguments: Mapping[str, Any]) -> str:
        for args, kind in self.records:
            if all(a in arguments for a in args):
                return f"{kind}:" + ":".join(str(arguments[a]) for a in args)
        if not arguments:
            return name
        return f"{name}:" + ",".join(f"{k}={arguments[k]}" for k in sorted(arguments))


def _record(unit: Unit) -> dict[str, Any]:
    """A unit's record as JSON (tool results render records as one-line JSON), {} when it is not one."""
    try:
        rec = json.loads(unit.text)
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


# -- retail
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_ORDER = re.compile(r"#W\d{7}")
_USER = re.compile(r"\b[a-z]+_[a-z]+_\d{4}\b")
_TEN = re.compile(r"\b\d{10}\b")
_NAME_ZIP = re.compile(r"\b([A-Z][a-z]+) ([A-Z][a-z]+)\b[^.?!]*?\bzip(?: code)?(?: is)? (\d{5})\b")

RETAIL_ROUTING = (
    "You are helping a retail customer-service agent decide what to look up before it replies. Your "
    "questions are answered only by read-only lookups in the store's database, one lookup per question: "
    "a user id by email, or by first name, last name and zip code; a user's details (their orders and "
    "payment methods); an order's details (its items, status and payment); a product's details (its "
    "variants); an item's details; the list of product types. Name the identifier you want looked up "
    "(an email, a user id, an order id such as #W1234567, a product or item id). The customer cannot "
    "see your questions.")


def _retail_rules(question: str) -> ToolCall | None:
    """An order id, a user id, an email, a product / item id (ten digits, with the word item before
    it for an item), a name with a zip code, "product types"."""
    if m := _ORDER.search(question):
        return ToolCall("get_order_details", {"order_id": m.group(0)})
    if m := _USER.search(question):
        return ToolCall("get_user_details", {"user_id": m.group(0)})
    if m := _EMAIL.search(question):
        return ToolCall("find_user_id_by_email", {"email": m.group(0).rstrip(".")})
    if m := _TEN.search(question):
        kind = "get_item_details" if re.search(r"\bitem\b", question[: m.start()], re.IGNORECASE) else "get_product_details"
        return ToolCall(kind, {("item_id" if kind == "get_item_details" else "product_id"): m.group(0)})
    if m := _NAME_ZIP.search(question):
        return ToolCall("find_user_id_by_name_zip", {"first_name": m.group(1), "last_name": m.group(2),
                                                     "zip": m.group(3)})
    if re.search(r"product types", question, re.IGNORECASE):
        return ToolCall("list_all_product_types", {})
    return None


def _retail_wanted(said: str, held: Sequence[Unit]) -> list[str]:
    """The customer's email, their name and zip code, each user id found, each order id the customer
    or a user record names, the products of the orders the customer named."""
    evidence = " ".join(u.text for u in held)
    named_orders = list(dict.fromkeys(_ORDER.findall(said)))
    wanted = [f"Find the user id of the customer with email {e}." for e in dict.fromkeys(_EMAIL.findall(said))]
    wanted += [f"Find the user id of {m.group(1)} {m.group(2)} with zip code {m.group(3)}."
               for m in _NAME_ZIP.finditer(said)]
    for u in dict.fromkeys(_USER.findall(said + " " + evidence)):
        wanted.append(f"What are the details of user {u}?")
    for o in dict.fromkeys(named_orders + _ORDER.findall(evidence)):
        wanted.append(f"What are the details of order {o}?")
    for u in held:  # the products of the orders the customer named
        if u.source_id in {f"order:{o}" for o in named_orders}:
            for p in dict.fromkeys(re.findall(r'"product_id": "(\d{10})"', u.text)):
                wanted.append(f"What are the details of product {p}?")
    return wanted


def _retail_report(held: Sequence[Unit]) -> str:
    users = [u for u in held if u.source_id.startswith("user:")]
    orders = []
    for u in held:
        if u.source_id.startswith("order:"):
            m = re.search(r'"status": "([^"]+)"', u.text)
            orders.append(f"{u.source_id[6:]} ({m.group(1) if m else 'status unknown'})")
    return f"I found your account ({users[0].source_id[5:]})" + (
        ": orders " + ", ".join(orders) if orders else "") + ". What would you like me to do?"


RETAIL = QDDomain(
    name="retail", agent="a retail customer-service agent", routing=RETAIL_ROUTING,
    records=((("user_id",), "user"), (("order_id",), "order"), (("product_id",), "product"), (("item_id",), "item")),
    rules=_retail_rules, wanted=_retail_wanted,
    ask_identity=("To help you, I need to find your account: could you give me your email address, or your first "
                  "name, last name and zip code?"),
    report=_retail_report)

# -- airline
_AIR_USER = re.compile(r"\b[a-z]+_[a-z]+_\d{3,4}\b")  # emma_kim_9957 (the schemas' example: sara_doe_496)
_FLIGHT = re.compile(r"\bHAT\d{3}\b")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_ROUTE = re.compile(r"\bfrom ([A-Z]{3}) to ([A-Z]{3})\b")
_ONE_STOP = re.compile(r"\b(?:one[- ]?stop|connecting|connections?|layovers?|stopovers?)\b", re.IGNORECASE)
_SIX = re.compile(r"\b[A-Z0-9]{6}\b")
_RESERVATION_WORD = re.compile(r"\b(?:reservations?|bookings?|confirmation)\b", re.IGNORECASE)

AIRLINE_ROUTING = (
    "You are helping an airline customer-service agent decide what to look up before it replies. Your "
    "questions are answered only by read-only lookups in the airline's database, one lookup per question: "
    "a user's details (their reservations, payment methods, membership and saved passengers); a "
    "reservation's details (its flights, passengers, cabin, baggage, insurance and payments); a flight's "
    "status on a date; the direct or the one-stop flights from one airport to another on a date; the list "
    "of airports. Name the identifier you want looked up (a user id such as sara_doe_496, a reservation id "
    "such as 4WQ150, a flight number such as HAT001 with its date as 2024-05-16, or from JFK to SFO with a "
    "date). The customer cannot see your questions.")


def reservation_ids(text: str) -> list[str]:
    """Airline reservation ids in ``text`` in order: six capitals or digits (``4WQ150``, ``EHGLP3``),
    not a flight number (``HAT001``) nor a number; one without a digit only after the word
    reservation, booking or confirmation in its sentence (so ``PLEASE`` is not one)."""
    out = []
    for m in _SIX.finditer(text):
        tok = m.group(0)
        if _FLIGHT.fullmatch(tok) or tok.isdigit():
            continue
        sentence = re.split(r"[.!?\n]", text[: m.start()])[-1]
        if any(c.isdigit() for c in tok) or _RESERVATION_WORD.search(sentence):
            out.append(tok)
    return out


def _airline_rules(question: str) -> ToolCall | None:
    """A reservation id, a user id, a flight number with a date (its status), from one airport to
    another with a date (direct flights, or one-stop ones when the question says one-stop,
    connecting, layover or stopover), "airports"."""
    if ids := reservation_ids(question):
        return ToolCall("get_reservation_details", {"reservation_id": ids[0]})
    if m := _AIR_USER.search(question):
        return ToolCall("get_user_details", {"user_id": m.group(0)})
    date = _DATE.search(question)
    if date and (m := _FLIGHT.search(question)):
        return ToolCall("get_flight_status", {"flight_number": m.group(0), "date": date.group(0)})
    if date and (m := _ROUTE.search(question)):
        name = "search_onestop_flight" if _ONE_STOP.search(question) else "search_direct_flight"
        return ToolCall(name, {"origin": m.group(1), "destination": m.group(2), "date": date.group(0)})
    if re.search(r"\bairports\b", question, re.IGNORECASE):
        return ToolCall("list_all_airports", {})
    return None


def _airline_wanted(said: str, held: Sequence[Unit]) -> list[str]:
    """Each user id the customer or a record names, each reservation id the customer or a user
    record names, the status of each flight of the reservations the customer named (or on the
    flight numbers the customer named)."""
    evidence = " ".join(u.text for u in held)
    named = list(dict.fromkeys(reservation_ids(said)))
    wanted = [f"What are the details of user {u}?" for u in dict.fromkeys(_AIR_USER.findall(said + " " + evidence))]
    listed = [r for u in held if u.source_id.startswith("user:") for r in _record(u).get("reservations") or ()
              if isinstance(r, str)]
    wanted += [f"What are the details of reservation {r}?" for r in dict.fromkeys(named + listed)]
    named_flights = set(_FLIGHT.findall(said))
    for u in held:
        if u.source_id.startswith("reservation:"):
            for f in _record(u).get("flights") or ():
                if isinstance(f, dict) and (u.source_id[12:] in named or f.get("flight_number") in named_flights):
                    wanted.append(f"What is the status of flight {f.get('flight_number')} on {f.get('date')}?")
    return wanted


def _airline_report(held: Sequence[Unit]) -> str:
    users = [u for u in held if u.source_id.startswith("user:")]
    found = []
    for u in held:
        if u.source_id.startswith("reservation:"):
            r = _record(u)
            found.append(f"{u.source_id[12:]} ({r.get('origin', '?')} to {r.get('destination', '?')}, "
                         f"{r.get('cabin', '?')}{', cancelled' if r.get('status') == 'cancelled' else ''})")
    return f"I found your account ({users[0].source_id[5:]})" + (
        ": reservations " + ", ".join(found) if found else "") + ". What would you like me to do?"


AIRLINE = QDDomain(
    name="airline", agent="an airline customer-service agent", routing=AIRLINE_ROUTING,
    records=((("user_id",), "user"), (("reservation_id",), "reservation"), (("flight_number", "date"), "flight")),
    rules=_airline_rules, wanted=_airline_wanted,
    ask_identity="To help you, I need to find your account: could you give me your user id?",
    report=_airline_report)

#: The domains the Q&D loop plays, by tau2 domain name (`jaxagent.envs.tau2.DOMAINS`): add one here.
QD_DOMAINS: dict[str, QDDomain] = {d.name: d for d in (RETAIL, AIRLINE)}


def qd_domain(name: str) -> QDDomain:
    """The Q&D plug-in of tau2 domain ``name``; ValueError naming the value and the choices."""
    if name not in QD_DOMAINS:
        raise ValueError(f"domain={name!r}: the Q&D loop inside a tau2 agent (jaxagent.qd.tau2.QD_DOMAINS) plays "
                         f"{', '.join(map(repr, QD_DOMAINS))}; expected one of them")
    return QD_DOMAINS[name]


# ----------------------------------------------------------------------------- evidence
def evidence_key(name: str, arguments: Mapping[str, Any], domain: str = DEFAULT_DOMAIN) -> str:
    """The evidence identity of a read call in ``domain``: the record its arguments name
    (``user:<id>``, ``order:<id>``, ``reservation:<id>``, ``flight:<number>:<date>``, ...), else the
    request itself."""
    return qd_domain(domain).evidence_key(name, arguments)


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


class RuleSelector:
    """Offline stand-in: the read call named by the first identifier in the question, by the
    domain's rules (`QDDomain.rules`: retail an order id, a user id, an email, a product / item id,
    a name with a zip code, "product types"; airline a reservation id, a user id, a flight number
    with a date, a route with a date, "airports"); None when it names none."""

    name = "rules (offline stand-in, no model)"

    def __init__(self, domain: str = DEFAULT_DOMAIN):
        self.domain, self._rules = domain, qd_domain(domain).rules

    async def select(self, question: str, context: Tau2Context) -> ToolCall | None:
        return self._rules(question)


def read_tool_schemas(domain: str = DEFAULT_DOMAIN) -> list[dict[str, Any]]:
    """The domain's read-only tools' schemas, as served, in tau2's order."""
    d = qd_domain(domain).tau2
    return [s for s in d.tool_schemas() if s["function"]["name"] in d.read_tools]


class EndpointSelector:
    """A model (the drafter's, as the spec has it) picks one read call for the question, with the
    domain's read tool schemas and ``tool_choice="required"``; its first call is taken (None when it
    made none)."""

    def __init__(self, client: LLMUserClient, domain: str = DEFAULT_DOMAIN):
        self.client, self.name, self.domain = client, f"endpoint:{client.config.model}", domain
        self.tools = read_tool_schemas(domain)

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
    yet among the domain's candidates (`QDDomain.wanted`: retail the customer's email, their name
    and zip code, each user id found, each order id the customer or a user record names, and the
    products of the orders the customer named; airline each user id, each reservation id the
    customer or a user record names, the flights of the reservations the customer named); STOP when
    none is left."""

    name = "scripted-tau2"

    def __init__(self, domain: str = DEFAULT_DOMAIN):
        self.domain, self._qd = domain, qd_domain(domain)

    async def act(self, state: QDState, key: jax.Array) -> Reply:
        held = {u.source_id for u in state.task.pool}
        asked = {q for q, _ in state.history}
        for q in self._qd.wanted(state.task.question, state.task.pool):
            call = self._qd.rules(q)
            if q not in asked and call is not None and self._qd.evidence_key(call.name, call.arguments) not in held:
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
    """Offline stand-in: without a user record held, asks for the customer's identity
    (`QDDomain.ask_identity`: retail the email, or name and zip code; airline the user id); with one,
    says what was found (`QDDomain.report`: the user id and their order ids and statuses, or their
    reservations' routes and cabins)."""

    name = "lookup (offline stand-in, no model)"

    def __init__(self, domain: str = DEFAULT_DOMAIN):
        self.domain, self._qd = domain, qd_domain(domain)

    async def answer(self, context: Tau2Context, held: Sequence[Unit], draft: str,
                     results: Sequence[tuple[ToolCall, str]]) -> Reply:
        if not any(u.source_id.startswith("user:") for u in held):
            return Reply(self._qd.ask_identity)
        return Reply(self._qd.report(held))


def _evidence(held: Sequence[Unit], chars: int) -> str:
    return "\n".join(f"[{u.source_id}] {u.text[:chars]}" for u in held) or "(nothing looked up)"


def _conversation(context: Tau2Context) -> str:
    return "\n".join(f"{r.capitalize()}: {t}" for r, t in context.conversation)


class _EndpointRole:
    """A role played by a model: the domain's agent (`QDDomain.agent`) with the policy in its system turn."""

    def __init__(self, client: LLMUserClient, domain: str = DEFAULT_DOMAIN):
        self.client, self.name, self.domain = client, f"endpoint:{client.config.model}", domain
        self._qd = qd_domain(domain)

    async def _ask(self, context: Tau2Context, held: Sequence[Unit], instruction: str) -> Reply:
        text, usage = await self.client.complete_usage([
            {"role": "system", "content": f"You work for {self._qd.agent}.\n<policy>\n{context.policy}\n</policy>"},
            {"role": "user", "content": f"Conversation so far:\n{_conversation(context)}\n\nDatabase records looked "
                                        f"up:\n{_evidence(held, DRAFTER_CHARS)}\n\n{instruction}"}])
        return Reply(text or "", usage["prompt_tokens"], usage["completion_tokens"])


class EndpointDrafter(_EndpointRole):
    async def resolve(self, context: Tau2Context, held: Sequence[Unit], question: str, found: Unit | None) -> Reply:
        r = await self._ask(context, held, f"Answer this question from the records only, briefly: {question}")
        return Reply(" ".join(r.text.split()[:300]), r.prompt_tokens, r.completion_tokens)

    async def draft(self, context: Tau2Context, held: Sequence[Unit]) -> Reply:
        d = self._qd.tau2
        schemas = json.dumps([s for s in d.tool_schemas() if s["function"]["name"] in d.write_tools | EXEMPT_TOOLS])
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
        if self.prompt not in PROMPT_NAMES:
            raise ValueError(f"qd.tau2.prompt={self.prompt!r}: expected one of {sorted(PROMPT_NAMES)}")


Reader = Callable[[str, Mapping[str, Any]], Any]  # (name, arguments) -> ToolResult | None


class Tau2QDAgent(Agent):
    """The agent of the module docstring. ``reader``: the episode's read-only tool runner
    (`Tau2Env.read`); ``key``, ``seed``: the questioner's sampling (decision i of the
    dialogue samples with ``fold_in(fold_in(key, seed), i)``); ``domain``: the tau2 domain it
    plays (a `QD_DOMAINS` name): every role that names a domain (``role.domain``) and the
    environment it starts on must be that one (ValueError otherwise)."""

    def __init__(self, questioner: Questioner, selector: Selector, drafter: Tau2Drafter, answerer: Tau2Answerer, *,
                 reader: Reader, key: jax.Array, seed: int = 0, config: Tau2QDConfig = Tau2QDConfig(),
                 domain: str = DEFAULT_DOMAIN):
        self.questioner, self.selector, self.drafter, self.answerer = questioner, selector, drafter, answerer
        self.domain, self.qd = domain, qd_domain(domain)
        self.read_tools = self.qd.tau2.read_tools
        for role, obj in (("questioner", questioner), ("selector", selector), ("drafter", drafter),
                          ("answerer", answerer)):
            d = getattr(obj, "domain", domain)
            if d != domain:
                raise ValueError(f"{role}.domain={d!r}: the agent plays tau2 domain {domain!r}; expected every role "
                                 "built for the same domain")
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
        d = getattr(getattr(env, "domain", None), "name", self.domain)
        if d != self.domain:
            raise ValueError(f"the environment plays tau2 domain {d!r}; this Q&D agent was built for {self.domain!r}")
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
        task = QATask(self.qd.benchmark, self.task_id, self.context().customer_text, "", (), tuple(held), 1)
        views = [EvidenceView(u.source_id, u.title, u.text[:QUESTIONER_CHARS]) for u in held]
        prompt = render_state(question=task.question, benchmark=self.qd.benchmark, evidence=views,
                              draft=strip_plan(self.draft), history=self.history,
                              instructions=self.qd.prompts[self.config.prompt])
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
            if call is not None and call.name in self.read_tools:
                res = self.reader(call.name, call.arguments)
                key = self.qd.evidence_key(call.name, call.arguments)
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


__all__ = ["AIRLINE", "EXEMPT_TOOLS", "PLAN_MARKER", "PROMPT_NAMES", "QD_DOMAINS", "RETAIL", "EndpointAnswerer",
           "EndpointDrafter", "EndpointSelector", "LookupAnswerer", "LookupDrafter", "QDDomain", "RoleFailed",
           "RuleSelector", "ScriptedTau2Questioner", "Selector", "Tau2Answerer", "Tau2Context", "Tau2Drafter",
           "Tau2QDAgent", "Tau2QDConfig", "evidence_key", "follow_up_turns", "qd_domain", "read_tool_schemas",
           "reservation_ids", "split_plan", "strip_plan"]

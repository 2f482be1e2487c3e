"""The scripted customer of tau2 telecom.

**ScriptedCustomer** is driven by the task data alone, for offline training and tests. It is a
deterministic stand-in, not a claim of realism. Telecom is tau2's dual-control domain: the customer
has 30 tools on its own phone (`USER_TOOL_NAMES`, tau2's order) and the agent can only ask it to use
them. This customer uses them when asked, through the episode (`TelecomView.user_tools`). What it does:

- opens with its reason for call, turned into the first person (``provide_info``);
- **performs the device actions the agent asks for**: every user tool name that appears in the
  agent's text as a whole word (``toggle_data``, not inside ``toggle_data_saver_mode``) is run, in
  order of first appearance, all in ONE `TelecomView.user_tools` call (one tau2 user message with
  these tool calls). The arguments are the JSON object written right after the name
  (``set_network_mode_preference {"mode": "4g_5g_preferred"}``, ``name({...})``, ``name with {...}``,
  ``name: {...}``; ``name()`` is ``{}``) when present and parseable; else those of the first gold
  user action of that name still pending (a gold user action is done once the customer performed
  it, without error, with equal values on its compared arguments); else ``{}``. A name written
  twice with the same arguments (or bare twice) runs once; a bare name also written with arguments
  runs only with them. It performs whatever is asked, gold or not, so a wrong instruction has its
  real consequence. The reply reports each result verbatim: ``I did toggle_airplane_mode. It says:
  Airplane Mode is now OFF.`` + the status bar line (``I tried ..., but it failed: ...`` for an
  error) (``provide_info``). `REQUEST_FORMAT` says this in one line; `device_request` writes such a
  request and `parse_device_requests` reads it back;
- **confirms** (``Yes, please go ahead.``, ``confirm``) a proposal: a message asking to confirm or
  proceed (confirm, proceed, go ahead, (yes), yes/no, shall I, should I, may I, can I, would you
  like me to, do you want me to, is that ok...) about an account action (refuel, top up, roaming,
  payment, bill, resume, reactivate, suspend, or an agent write tool's name) whose text names every
  argument value of a gold AGENT write action (`AGENT_WRITE_TOOLS`) not yet made by the agent,
  and names that action (its tool name, or e.g. refuel / top up / GB for ``refuel_data``, enable or
  turn on ... roaming for ``enable_roaming``, resume / reactivate for ``resume_line``, payment /
  pay / bill for ``send_payment_request``).
  Values are matched literally, ignoring case; a number matches a number written in the text with
  the same value (``2`` and ``2.0`` match the gold ``2.0``; the digits inside ``L1002`` are not a
  number). A proposal that names a data amount (``<x> GB``) other than the gold refuel amount is
  not confirmed. Any other proposal is refused (``reject``), restating the problem and, for a
  refuel, the amount the task's instructions accept (``I am only willing to refuel 2.0 GB.``);
- answers questions about itself (a message with a ``?`` or a request word: please, could you, tell
  me, provide...) from its known info: its name, its phone number (also for "which line"), its
  customer id (it does not know it, and gives its name and number instead), and whether it is
  abroad or travelling (``I am currently abroad in France.``; ``No, I am not abroad.`` when its
  known info says nothing) (``provide_info``);
- ends the episode: ``###TRANSFER###`` right after a successful ``transfer_to_human_agents`` of the
  agent that is new since its last reply (``accept`` if a transfer is among the gold actions, else
  ``complain``), whatever else the message says; ``###STOP###`` with thanks (``accept``) when the
  task's env assertions hold (`TelecomView.assertions_hold`), checked AFTER the device actions of
  the reply, so the reply to the request that fixes the phone reports the result and stops; a task
  whose gold actions include a transfer ends only by the transfer (its assertions, e.g.
  ``no_service``, may hold from the start); ``###STOP###`` giving up (``complain``) after
  ``patience`` replies in a row that moved nothing (no device action performed, nothing confirmed,
  no question answered) or at its ``max_replies``-th reply (the device results of that reply are
  still reported);
- otherwise restates its problem: ``clarify_request`` when the message asks a question it cannot
  answer, else ``be_vague``.

A reply that does several of these joins their sentences; its label is ``confirm`` or ``reject``
when it answers a proposal, else ``provide_info``. Its reaction labels are Faca's
(`jaxagent.credit.reaction.DEFAULT_POLARITY`): ``provide_info``, ``confirm``, ``accept``,
``be_vague``, ``clarify_request``, ``reject``, ``complain`` (``correct`` and ``challenge`` are not
used).

What it cannot do: understand paraphrase or negation (it acts on tool names, so "turn off airplane
mode" does nothing and "do not run reboot_device" reboots; it matches keywords and literal values),
look at its phone on its own (asked "what does the status bar show?" without the tool's name, it
does not know), run the same tool twice in one reply, follow the scenario's conditional
instructions ("express mild frustration", "if unsure, ask for clarification", "accept to pay a
bill" for a bill that is not the gold one) or play the persona; it never agrees to an account
action that is not a gold action (even a refuel its instructions would accept when the task has no
gold refuel); it knows the gold actions, which no real customer does. Scores against it measure
tool use and protocol, not dialogue skill.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from jaxagent.envs.tau2.customer import STOP, TRANSFER, CustomerTurn
from jaxagent.envs.tau2.domains.retail.customer import first_person
from jaxagent.envs.tau2.tasks import Task
from jaxagent.envs.tau2.tools import ToolResult

USER_TOOL_SCHEMAS_FILE: Path = Path(__file__).resolve().parents[4] / "data" / "tau2_telecom" / "user_tool_schemas.json"

_FALLBACK_USER_TOOL_NAMES = (
    "check_status_bar", "check_network_status", "check_network_mode_preference", "set_network_mode_preference",
    "run_speed_test", "toggle_airplane_mode", "check_sim_status", "reseat_sim_card", "toggle_data", "toggle_roaming",
    "check_data_restriction_status", "toggle_data_saver_mode", "check_apn_settings", "set_apn_settings",
    "reset_apn_settings", "check_wifi_status", "toggle_wifi", "check_wifi_calling_status", "toggle_wifi_calling",
    "check_vpn_status", "connect_vpn", "disconnect_vpn", "check_installed_apps", "check_app_status",
    "check_app_permissions", "grant_app_permission", "can_send_mms", "reboot_device", "check_payment_request",
    "make_payment")


def _user_tool_names() -> tuple[str, ...]:
    """The 30 user tool names in tau2's order, read from the served schemas (the literal list if the
    file is missing)."""
    try:
        raw = json.loads(USER_TOOL_SCHEMAS_FILE.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return _FALLBACK_USER_TOOL_NAMES
    return tuple(t.get("function", t)["name"] for t in raw["tools"])


USER_TOOL_NAMES: tuple[str, ...] = _user_tool_names()
"""The customer's 30 phone tools, in tau2's order (`USER_TOOL_SCHEMAS_FILE`)."""

AGENT_WRITE_TOOLS = ("suspend_line", "resume_line", "send_payment_request", "enable_roaming", "disable_roaming",
                     "refuel_data")
"""The agent's write tools: the gold actions the customer is asked to agree to."""

TRANSFER_TOOL = "transfer_to_human_agents"

REQUEST_FORMAT = ('To have me do something on my phone, name the tool and its JSON arguments, e.g. '
                  '`set_network_mode_preference {"mode": "4g_5g_preferred"}` or `toggle_data {}`.')
"""How an agent asks this customer for a device action so that it understands it (one line)."""


def device_request(name: str, arguments: Mapping[str, Any] | None = None) -> str:
    """The agent message asking the customer for one device action (the oracle agent's wording);
    `parse_device_requests` reads it back as ``[(name, arguments)]``."""
    return f"Please do this on your phone: {name} {json.dumps(dict(arguments or {}))}. Tell me what it shows."


_NAME_RE = re.compile(r"(?<!\w)(" + "|".join(sorted(map(re.escape, USER_TOOL_NAMES), key=len, reverse=True))
                      + r")(?!\w)")
_EMPTY_CALL = re.compile(r"`?\(\s*\)")
_BEFORE_ARGS = re.compile(r"`?\s*(?:\(\s*|with\s+|:\s*)?`?(?=\{)", re.IGNORECASE)
_DECODER = json.JSONDecoder()


def parse_device_requests(text: str) -> list[tuple[str, dict[str, Any] | None]]:
    """The user tools ``text`` names, as ``(name, arguments)`` in order of first appearance;
    ``arguments`` is the JSON object written right after the name, or None when there is none (or
    it does not parse). Same name and arguments twice: once; a bare name also written with
    arguments: only with them (see the module docstring)."""
    found: list[tuple[str, dict[str, Any] | None]] = []
    for m in _NAME_RE.finditer(text):
        name, args = m.group(1), None
        if _EMPTY_CALL.match(text, m.end()):
            args = {}
        elif (b := _BEFORE_ARGS.match(text, m.end())) is not None:
            try:
                value, _ = _DECODER.raw_decode(text, b.end())
            except ValueError:
                value = None
            args = value if isinstance(value, dict) else None
        if (name, args) not in found:
            found.append((name, args))
    with_args = {n for n, a in found if a is not None}
    return [(n, a) for n, a in found if a is not None or n not in with_args]


# ----------------------------------------------------------------------------- matching values
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
_GB_AMOUNT = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*gb\b", re.IGNORECASE)


def _numbers(text: str) -> list[float]:
    return [float(t) for t in _NUMBER.findall(text)]


def _names_value(text: str, value: Any) -> bool:
    if isinstance(value, bool):
        return str(value).lower() in text.lower()
    if isinstance(value, (int, float)):
        return any(n == float(value) for n in _numbers(text))
    if isinstance(value, str):
        return value.lower() in text.lower()
    if isinstance(value, Mapping):
        return all(_names_value(text, v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_names_value(text, v) for v in value)
    return value is None or str(value).lower() in text.lower()


def names_every_value(text: str, arguments: Mapping[str, Any]) -> bool:
    """Whether ``text`` names every argument value: strings as substrings ignoring case, numbers as
    numbers written in the text with the same value (``2`` names ``2.0``), lists and objects value
    by value."""
    return all(_names_value(text, v) for v in arguments.values())


def _args_equal(gold: Any, arguments: Mapping[str, Any]) -> bool:
    keys = gold.arguments.keys() if gold.compare_args is None else gold.compare_args
    return all(k in arguments and arguments[k] == gold.arguments.get(k) for k in keys)


def requestor(action: Any) -> str:
    """A gold action's requestor (``"assistant"`` for an `Action` without the field)."""
    return getattr(action, "requestor", "assistant")


# ----------------------------------------------------------------------------- the customer's words
_SWAPS = [(r"\bYou mobile\b", "My mobile"), (r"\byou mobile\b", "my mobile")]  # tau2's typo "You mobile data"


def to_first_person(text: str) -> str:
    """The scenario's second person in the customer's first person (retail's `first_person`, with
    the telecom scenarios' typo "You mobile data" as "My mobile data")."""
    for pat, rep in _SWAPS:
        text = re.sub(pat, rep, text)
    return first_person(text)


_KNOWN_NAME = re.compile(r"\bYou are ([A-Z][\w'-]*(?: [A-Z][\w'-]*)+)")
_KNOWN_PHONE = re.compile(r"\b\d{3}-\d{3}-\d{4}\b")
_KNOWN_PLACE = re.compile(r"\bYou are currently ([^.]+)\.")
_WILLING_REFUEL = re.compile(r"willing to refuel (\d+(?:\.\d+)?) ?GB", re.IGNORECASE)

_PROPOSAL = re.compile(r"\b(confirm|proceed|go ahead|yes/no|shall i|should i|may i|can i|could i|would you like me to|"
                       r"do you want me to|is that ok|is that okay|is it ok|is it okay|do you agree)\b|\(yes\)",
                       re.IGNORECASE)
_ACCOUNT_ACTION = re.compile(r"\b(refuel\w*|top[- ]?up|roaming|payment|pay|bill|resume\w*|reactivat\w*|suspend\w*|"
                             r"unsuspend\w*|" + "|".join(AGENT_WRITE_TOOLS) + r")\b", re.IGNORECASE)
_ACTION_OF = {
    "refuel_data": re.compile(r"\b(refuel\w*|top[- ]?up|gb)\b|\badd\w* (\S+ )?data\b", re.IGNORECASE),
    "enable_roaming": re.compile(r"\benable_roaming\b|\b(enabl\w*|turn\w* on|switch\w* on|activat\w*|allow\w*)\b"
                                 r".*\broaming\b", re.IGNORECASE),
    "disable_roaming": re.compile(r"\bdisable_roaming\b|\b(disabl\w*|turn\w* off|switch\w* off|deactivat\w*)\b"
                                  r".*\broaming\b", re.IGNORECASE),
    "resume_line": re.compile(r"\b(resume\w*|reactivat\w*|restor\w*|unsuspend\w*|reconnect\w*)\b", re.IGNORECASE),
    "suspend_line": re.compile(r"\b(suspend_line|suspend|suspending)\b", re.IGNORECASE),
    "send_payment_request": re.compile(r"\b(send_payment_request|payment|pay|bill)\b", re.IGNORECASE),
}
"""For each agent write tool: the words by which a proposal names that action."""
_ASKING = re.compile(r"\?|\b(please|could you|can you|would you|provide|tell me|let me know|share|confirm|need|"
                     r"what is|what's)\b", re.IGNORECASE)
_ASK_NAME = re.compile(r"\bname\b", re.IGNORECASE)
_ASK_PHONE = re.compile(r"\b(phone|mobile|cell|telephone|contact) number\b|\byour number\b|\b(which|what) line\b|"
                        r"\bline (id|number)\b", re.IGNORECASE)
_ASK_CUSTOMER_ID = re.compile(r"\b(customer|account) (id|number)\b|\bcustomer_id\b", re.IGNORECASE)
_ASK_PLACE = re.compile(r"\b(abroad|travel\w*|overseas|country|where are you|location|located)\b", re.IGNORECASE)

_THANKS = "Thank you, that fixed it! " + STOP
_GIVE_UP = "This is going nowhere, I give up. " + STOP
_HAVE_TO_GO = "I have to go now. " + STOP


class TelecomView(Protocol):
    """What the telecom episode lets its scripted customer see and do."""

    task: Task

    def user_tools(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> list[ToolResult]: ...

    def assertions_hold(self) -> bool: ...

    def successful_calls(self) -> list[tuple[str, Mapping[str, Any]]]: ...


class ScriptedCustomer:
    """The deterministic customer of the module docstring."""

    def __init__(self, task: Task, view: TelecomView, *, patience: int = 3, max_replies: int = 40):
        if patience < 1 or max_replies < 1:
            raise ValueError(f"patience={patience}, max_replies={max_replies}: expected integers >= 1")
        self.task, self.view = task, view
        self.patience, self.max_replies = patience, max_replies
        self.replies = 0
        self.idle = 0
        self.transfers_seen = 0
        self.performed: list[tuple[str, dict[str, Any], ToolResult]] = []
        self.user_gold = [a for a in task.actions if requestor(a) == "user"]
        self.user_done = [False] * len(self.user_gold)
        self.agent_gold = [a for a in task.actions if requestor(a) != "user" and a.name in AGENT_WRITE_TOOLS]
        self.needs_transfer = any(a.name == TRANSFER_TOOL for a in task.actions)
        known = task.instructions.get("known_info") or ""
        name, phone, place = _KNOWN_NAME.search(known), _KNOWN_PHONE.search(known), _KNOWN_PLACE.search(known)
        self.name = name.group(1) if name else None
        self.phone = phone.group(0) if phone else None
        self.place = place.group(1) if place else None
        willing = _WILLING_REFUEL.search(task.instructions.get("task_instructions") or "")
        self.willing_refuel = willing.group(1) if willing else None

    async def opening(self) -> CustomerTurn:
        return CustomerTurn(self.problem(), "provide_info")

    async def aclose(self) -> None:
        return None

    def problem(self) -> str:
        """The reason for call in the first person."""
        return to_first_person(self.task.instructions.get("reason_for_call") or "").strip()

    # -- what the customer knows about the episode
    def _transfers(self) -> int:
        return sum(n == TRANSFER_TOOL for n, _ in self.view.successful_calls())

    def pending_agent_writes(self) -> list[Any]:
        """The gold agent writes the agent has not made yet (successful, equal compared arguments)."""
        calls = self.view.successful_calls()
        return [a for a in self.agent_gold if not any(n == a.name and _args_equal(a, args) for n, args in calls)]

    def pending_user_actions(self) -> list[Any]:
        """The gold user actions the customer has not performed yet."""
        return [a for a, done in zip(self.user_gold, self.user_done) if not done]

    # -- the reply
    async def respond(self, agent_text: str) -> CustomerTurn:
        self.replies += 1
        if self._transfers() > self.transfers_seen:
            self.transfers_seen = self._transfers()
            return CustomerTurn(TRANSFER, "accept" if self.needs_transfer else "complain", TRANSFER)
        parts: list[str] = []
        label: str | None = None
        calls = self._resolve(parse_device_requests(agent_text))
        if calls:
            parts += self._perform(calls)
            label = "provide_info"
        answers = self._answers(agent_text)
        if _PROPOSAL.search(agent_text) and _ACCOUNT_ACTION.search(agent_text):
            if self._acceptable(agent_text):
                parts.append("Yes, please go ahead.")
                label = "confirm"
            elif not answers:  # a proposal that asks who the customer is, is a question
                parts.append(self._refusal(agent_text))
                label = "reject"
        if answers:
            parts += answers
            label = label or "provide_info"
        moved = bool(calls) or bool(answers) or label == "confirm"
        self.idle = 0 if moved else self.idle + 1
        if not self.needs_transfer and self.view.assertions_hold():
            return CustomerTurn(" ".join([*parts, _THANKS]), "accept", STOP)
        if self.idle >= self.patience:
            return CustomerTurn(_GIVE_UP, "complain", STOP)
        if self.replies >= self.max_replies:
            return CustomerTurn(" ".join([*(parts if moved else []), _HAVE_TO_GO]), "complain", STOP)
        if label is None:
            if "?" in agent_text:
                return CustomerTurn("I am not sure what you mean. What exactly should I do on my phone? "
                                    + self._restate(), "clarify_request")
            return CustomerTurn(self._restate(), "be_vague")
        return CustomerTurn(" ".join(parts), label)

    def _restate(self) -> str:
        return "As I said: " + self.problem()

    def _resolve(self, requests: Sequence[tuple[str, dict[str, Any] | None]]) -> list[tuple[str, dict[str, Any]]]:
        """Explicit arguments, else the first pending gold user action's of that name, else ``{}``."""
        pending = self.pending_user_actions()
        calls = []
        for name, args in requests:
            if args is None:
                gold = next((a for a in pending if a.name == name), None)
                if gold is not None:
                    pending.remove(gold)
                args = dict(gold.arguments) if gold is not None else {}
            calls.append((name, args))
        return calls

    def _perform(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
        results = self.view.user_tools(calls)
        if len(results) != len(calls):
            raise RuntimeError(f"user_tools returned {len(results)} results for {len(calls)} calls")
        out = []
        for (name, args), res in zip(calls, results):
            self.performed.append((name, args, res))
            if not res.error:
                for i, gold in enumerate(self.user_gold):
                    if not self.user_done[i] and gold.name == name and _args_equal(gold, args):
                        self.user_done[i] = True
                        break
            said = f"{name} {json.dumps(args)}" if args else name
            out.append(f"I tried {said}, but it failed: {res.content}" if res.error
                       else f"I did {said}. It says: {res.content}")
        return out

    def _acceptable(self, text: str) -> bool:
        for gold in self.pending_agent_writes():
            if not (_ACTION_OF[gold.name].search(text) and names_every_value(text, gold.arguments)):
                continue
            amount = gold.arguments.get("gb_amount")
            if amount is not None and any(float(x) != float(amount) for x in _GB_AMOUNT.findall(text)):
                continue
            return True
        return False

    def _refusal(self, text: str) -> str:
        out = "No, please do not do that."
        if self.willing_refuel and re.search(r"\b(refuel\w*|top[- ]?up|gb)\b", text, re.IGNORECASE):
            out += f" I am only willing to refuel {self.willing_refuel} GB."
        return out + " " + self._restate()

    def _answers(self, text: str) -> list[str]:
        """Answers to the questions ``text`` asks about the customer, from its known info."""
        if not _ASKING.search(text):
            return []
        low = text.lower()
        out = []
        asks_name = bool(_ASK_NAME.search(text)) and not (self.name and self.name.lower() in low)
        asks_phone = bool(_ASK_PHONE.search(text)) and not (self.phone and self.phone in text)
        if _ASK_CUSTOMER_ID.search(text):
            out.append("I do not know my customer id.")
            asks_name = asks_phone = True
        if asks_name and self.name:
            out.append(f"My name is {self.name}.")
        if asks_phone and self.phone:
            out.append(f"My phone number is {self.phone}.")
        if _ASK_PLACE.search(text):
            out.append(f"I am currently {self.place}." if self.place else "No, I am not abroad.")
        return out


__all__ = [
    "AGENT_WRITE_TOOLS",
    "REQUEST_FORMAT",
    "TRANSFER_TOOL",
    "USER_TOOL_NAMES",
    "USER_TOOL_SCHEMAS_FILE",
    "ScriptedCustomer",
    "TelecomView",
    "device_request",
    "names_every_value",
    "parse_device_requests",
    "requestor",
    "to_first_person",
]

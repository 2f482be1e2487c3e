"""The scripted customer of tau2 retail.

**ScriptedCustomer** is driven by the task data alone, for offline training and tests. It is a
deterministic stand-in, not a claim of realism. What it does:

- opens with its reason for call, turned into the first person;
- answers identity questions (email; name and zip; user id) from the task's known info (and the
  gold lookups' arguments), says it does not remember what its unknown info says it does not
  know (e.g. the email), and names order ids that its scenario mentions;
- answers questions about the payment method, the cancel reason or the new address with the
  values of the gold write actions still pending;
- confirms ("yes") a proposal (a message asking to confirm or proceed that names an order id or
  an action: cancel, exchange, return, modify, change, update) whose text names every argument
  value of a pending gold write action, and refuses any other proposal;
- ends the episode (``###STOP###``) when the goal is met: the live database equals the gold
  target, every ``communicate_info`` string was said, and the gold lookups that authenticate
  the user (if any) were done; replies ``###TRANSFER###`` after a transfer to a human; ends it
  too, complaining, when the goal cannot be met any more (a successful write that is not a gold
  write), after ``patience`` replies in a row that moved nothing, or after ``max_replies``.

What it cannot do: understand paraphrase (it matches keywords and literal values), describe
items other than by repeating its scenario, follow the scenario's conditional instructions ("if
the agent asks to confirm, you regret"), or play the personality notes; it knows the gold
actions, which no real customer does. On a task whose goal is to change nothing, with nothing to
communicate and no lookup to require (train task 57), it is satisfied by the agent's first message. Scores against it measure tool use and protocol, not
dialogue skill.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from jaxagent.envs.tau2.customer import STOP, TRANSFER, CustomerTurn, EpisodeView
from jaxagent.envs.tau2.scoring import communicate_reward
from jaxagent.envs.tau2.tasks import Task

AUTH_TOOLS = ("find_user_id_by_email", "find_user_id_by_name_zip")


_SWAPS = [(r"\bYou are\b", "I am"), (r"\byou are\b", "I am"), (r"\bYou're\b", "I'm"), (r"\byou're\b", "I'm"),
          (r"\bYou've\b", "I've"), (r"\byou've\b", "I've"), (r"\bYou'd\b", "I'd"), (r"\byou'd\b", "I'd"),
          (r"\bYou'll\b", "I'll"), (r"\byou'll\b", "I'll"), (r"\bYour\b", "My"), (r"\byour\b", "my"),
          (r"\byourself\b", "myself"),
          (r"\b(to|ask|asks|tell|tells|give|gives|for|with|help|helps|let|lets|call|contact|offer|offers) you\b",
           r"\1 me"),
          (r"\bYou\b", "I"), (r"\byou\b", "I")]


def first_person(text: str) -> str:
    """The scenario's second person turned into the customer's first person (a keyword swap)."""
    for pat, rep in _SWAPS:
        text = re.sub(pat, rep, text)
    return text


_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_USER_ID = re.compile(r"\b[a-z]+_[a-z]+_\d{4}\b")
_ZIP = re.compile(r"\b\d{5}\b")
_ORDER = re.compile(r"#?W\d{7}\b")
_NAME = re.compile(r"\b(?:You are|You're|Your name is|You name is|I am)\s+([A-Z][a-z]+)\s+([A-Z][a-z]+)")
_PROPOSAL = re.compile(r"\b(confirm|proceed|go ahead|yes/no|\(yes\))", re.IGNORECASE)
_ACTION_WORDS = re.compile(r"\b(cancel|exchange|return|modify|change|update)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Identity:
    email: str | None = None
    first_name: str | None = None
    last_name: str | None = None
    zip: str | None = None
    user_id: str | None = None


def identity_of(task: Task) -> Identity:
    """What the customer can tell about itself: the gold lookups' arguments, else its known info."""
    known = task.instructions.get("known_info") or ""
    d: dict[str, str | None] = {}
    for a in task.actions:
        if a.name == "find_user_id_by_name_zip":
            d.update(first_name=a.arguments.get("first_name"), last_name=a.arguments.get("last_name"),
                     zip=a.arguments.get("zip"))
        elif a.name == "find_user_id_by_email":
            d["email"] = a.arguments.get("email")
        elif "user_id" in a.arguments and "user_id" not in d:
            d["user_id"] = a.arguments["user_id"]
    if "email" not in d and (m := _EMAIL.search(known)):
        d["email"] = m.group(0)
    if "user_id" not in d and (m := _USER_ID.search(known)):
        d["user_id"] = m.group(0)
    if "first_name" not in d and (m := _NAME.search(known)):
        d.update(first_name=m.group(1), last_name=m.group(2))
    if "zip" not in d and (m := _ZIP.search(known)):
        d["zip"] = m.group(0)
    return Identity(**{k: (str(v) if v is not None else None) for k, v in d.items()})


def _values(x: Any) -> list[str]:
    if isinstance(x, str):
        return [x] if x.strip() else []
    if isinstance(x, (list, tuple)):
        return [v for e in x for v in _values(e)]
    if isinstance(x, Mapping):
        return [v for e in x.values() for v in _values(e)]
    return [str(x)] if x is not None else []


def names_every_value(text: str, arguments: Mapping[str, Any]) -> bool:
    """Whether ``text`` names every argument value (case-insensitive; lists element by element)."""
    low = text.lower()
    return all(v.lower() in low for v in _values(dict(arguments)))


class ScriptedCustomer:
    """The deterministic customer of the module docstring."""

    def __init__(self, task: Task, view: EpisodeView, *, patience: int = 3, max_replies: int = 30):
        if patience < 1 or max_replies < 1:
            raise ValueError(f"patience={patience}, max_replies={max_replies}: expected integers >= 1")
        self.task, self.view = task, view
        self.patience, self.max_replies = patience, max_replies
        self.me = identity_of(task)
        self.replies = 0
        self.idle = 0
        self.transfers_seen = 0
        scen = " ".join(str(task.instructions.get(f) or "") for f in ("reason_for_call", "known_info"))
        self.order_ids = list(dict.fromkeys("#" + m.lstrip("#") for m in _ORDER.findall(scen)))
        self.needs_auth = any(a.name in AUTH_TOOLS for a in task.actions)
        self.needs_transfer = any(a.name == "transfer_to_human_agents" for a in task.actions)

    async def opening(self) -> CustomerTurn:
        return CustomerTurn(first_person(self.task.instructions["reason_for_call"] or "").strip(), "provide_info")

    async def aclose(self) -> None:
        return None

    # -- what the customer knows about the episode
    def _authenticated(self) -> bool:
        return any(n in AUTH_TOOLS for n, _ in self.view.successful_calls())

    def _transfers(self) -> int:
        return sum(n == "transfer_to_human_agents" for n, _ in self.view.successful_calls())

    def goal_met(self, agent_text: str = "") -> bool:
        """The goal holds, counting ``agent_text`` (the message being answered) among what was said."""
        return (self.view.goal_db_reached() and communicate_reward(self.task, [*self.view.assistant_texts(), agent_text]) == 1.0
                and (self._authenticated() or not self.needs_auth) and (self._transfers() > 0 or not self.needs_transfer))

    # -- the reply
    async def respond(self, agent_text: str) -> CustomerTurn:
        self.replies += 1
        turn = self._reply(agent_text)
        self.idle = self.idle + 1 if turn.label in ("be_vague", "reject") else 0
        if turn.stop is None and self.idle >= self.patience:
            return CustomerTurn("This is going nowhere, I give up. " + STOP, "complain", STOP)
        if turn.stop is None and self.replies >= self.max_replies:
            return CustomerTurn("I have to go now. " + STOP, "complain", STOP)
        return turn

    def _reply(self, agent_text: str) -> CustomerTurn:
        text = agent_text.lower()
        if self._transfers() > self.transfers_seen:
            self.transfers_seen = self._transfers()
            return CustomerTurn(TRANSFER, "accept" if self.needs_transfer else "complain", TRANSFER)
        if self.view.unexpected_writes():
            return CustomerTurn("That is not what I asked for. " + STOP, "complain", STOP)
        if self.goal_met(agent_text):
            return CustomerTurn("Thank you, that is all I needed. " + STOP, "accept", STOP)
        pending = self.view.pending_writes()
        if _PROPOSAL.search(agent_text) and (_ORDER.search(agent_text) or _ACTION_WORDS.search(agent_text)):
            if any(names_every_value(agent_text, a.arguments) for a in pending):
                return CustomerTurn("Yes, please go ahead.", "confirm")
            return CustomerTurn("No, that is not what I want. " + self._restate(), "reject")
        answer = self._answer_question(text, pending)
        return answer if answer is not None else CustomerTurn(self._restate(), "be_vague")

    def _restate(self) -> str:
        return "As I said: " + first_person(self.task.instructions["reason_for_call"] or "").strip()

    def _answer_question(self, text: str, pending: Sequence[Any]) -> CustomerTurn | None:
        me = self.me
        unknown = (self.task.instructions.get("unknown_info") or "").lower()
        name_zip = (f"My name is {me.first_name} {me.last_name} and my zip code is {me.zip}."
                    if me.first_name and me.zip else None)
        if "email" in text:
            if me.email:
                return CustomerTurn(f"My email is {me.email}.", "provide_info")
            if name_zip:
                return CustomerTurn(f"I do not remember my email address. {name_zip}", "provide_info")
            return CustomerTurn("I do not remember my email address.", "be_vague")
        if "zip" in text or "name" in text:
            if name_zip:
                return CustomerTurn(name_zip, "provide_info")
            if me.user_id:
                return CustomerTurn(f"My user id is {me.user_id}.", "provide_info")
            return CustomerTurn("I do not know that.", "be_vague")
        if "user id" in text:
            if me.user_id:
                return CustomerTurn(f"My user id is {me.user_id}.", "provide_info")
            return CustomerTurn("I do not know my user id.", "be_vague")
        if "order" in text and ("id" in text or "number" in text):
            if self.order_ids:
                return CustomerTurn("The order id is " + " and ".join(self.order_ids) + ".", "provide_info")
            if "order" in unknown:
                return CustomerTurn("I do not remember the order id.", "be_vague")
        for a in pending:
            args = a.arguments
            if ("payment" in text or "refund" in text or "pay " in text) and "payment_method_id" in args:
                return CustomerTurn(f"Please use {args['payment_method_id']}.", "provide_info")
            if "reason" in text and "reason" in args:
                return CustomerTurn(f"The reason is: {args['reason']}.", "provide_info")
            if "address" in text and "address1" in args:
                addr = ", ".join(str(args[k]) for k in ("address1", "address2", "city", "state", "country", "zip")
                                 if args.get(k))
                return CustomerTurn(f"The new address is {addr}.", "provide_info")
        return None


__all__ = ["AUTH_TOOLS", "Identity", "ScriptedCustomer", "first_person", "identity_of", "names_every_value"]

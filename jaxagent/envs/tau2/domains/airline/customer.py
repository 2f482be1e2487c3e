"""The scripted customer of tau2 airline.

**ScriptedCustomer** is driven by the task data alone, for offline training and tests. It is a
deterministic stand-in, not a claim of realism. It is retail's customer
(`jaxagent.envs.tau2.domains.retail.customer`) adapted to airline, whose customers identify by user
id and talk about reservations, flights, passengers and payment methods. What it does:

- opens with its reason for call, turned into the first person (sentences about "the agent", which
  are instructions to the role-player, left out);
- answers identity questions from the task's known info (and the gold actions' arguments): its
  user id, its name; for an email, a phone number or an address it gives its user id instead;
  names the reservation ids its scenario mentions, or says it does not remember them when its
  unknown info says so (or its scenario names none);
- answers questions about the passengers, the payment method, the cabin, the flights and dates,
  the baggage, the insurance, the trip type, origin and destination with the values of the gold
  write actions still pending (several topics asked in one message get one answer each), and says
  it does not know what its unknown info says it does not know (e.g. the cabin);
- confirms ("yes") a proposal (a message asking to confirm or proceed that names a reservation id
  or an action: cancel, book, change, modify, update, upgrade, add, remove...) whose text names
  every argument value of a pending gold write action (nested lists of flights, passengers and
  payments value by value; ``round_trip`` matches "round trip"; "1,786" matches 1786); refuses any
  other proposal, correcting it with the pending values the proposal touches when it can;
- ends the episode (``###STOP###``) when the goal is met: the live database equals the gold
  target, every ``communicate_info`` string was said, and the gold lookup that authenticates the
  user (``get_user_details``, when the gold actions make it) was done. On a task whose goal is to
  change nothing and that has nothing to communicate (17 of the 30 train tasks change nothing; 16
  of them communicate nothing), the goal is met only once the agent also declines the request or
  closes the conversation ("cannot", "unfortunately", "anything else?"): the customer insists once
  (``challenge``), then accepts. It replies ``###TRANSFER###`` after a transfer to a human, and
  ends the episode, complaining, when the goal cannot be met any more (a successful write that is
  not a gold write), after ``patience`` replies in a row that moved nothing (vague, rejecting,
  insisting or asking to clarify), or after ``max_replies``.

Its reaction labels are Faca's (`jaxagent.credit.reaction.DEFAULT_POLARITY`): ``provide_info``,
``confirm``, ``accept``, ``be_vague``, ``clarify_request``, ``correct``, ``reject``,
``challenge``, ``complain``.

What it cannot do: understand paraphrase (it matches keywords and literal values: "May 20" is not
2024-05-20), follow the scenario's conditional instructions ("if the agent says it is not possible,
ask to upgrade first", "only go ahead if the extra cost is under $1000", "say there are 3
passengers, then admit the mistake"), negotiate, persuade, lie or play the personality notes; it
knows the gold actions, which no real customer does. In particular it never agrees to a write that
is not a gold write, so on the tasks whose right outcome is a refusal an agent that asks before
acting is protected by the customer (a real customer would say yes): there, only an agent that
writes without asking, or against a "no", loses. Scores against it measure tool use and protocol,
not dialogue skill.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from jaxagent.envs.tau2.customer import STOP, TRANSFER, CustomerTurn, EpisodeView
from jaxagent.envs.tau2.domains.retail.customer import first_person, identity_of
from jaxagent.envs.tau2.domains.retail.customer import names_every_value as names_literally
from jaxagent.envs.tau2.scoring import communicate_reward
from jaxagent.envs.tau2.tasks import Task

AUTH_TOOLS = ("get_user_details",)

# A reservation id: 6 uppercase letters or digits, not a flight number (HAT045) nor an upper-case word.
_RESERVATION = re.compile(r"\b(?!HAT\d{3}\b)[A-Z0-9]{6}\b")
_WORDS = frozenset({"ACCEPT", "ALWAYS", "BEFORE", "CANCEL", "CANNOT", "CHANGE", "DOUBLE", "EITHER", "EXCEPT",
                    "PLEASE", "REFUND", "SHOULD", "UNLESS", "ACTION", "AGENTS", "ALMOST", "TRAVEL", "FLIGHT",
                    "NUMBER", "RETURN", "SECOND", "SILVER", "STATUS", "TICKET", "UPDATE", "ALLOWS"})
_PROPOSAL = re.compile(r"\b(confirm|proceed|go ahead|yes/no|\(yes\)|shall i|should i|would you like me to|"
                       r"do you want me to)", re.IGNORECASE)
_ACTION_WORDS = re.compile(r"\b(cancel|book|change|modify|update|upgrade|downgrade|add|remove|send|issue|rebook|"
                           r"switch)", re.IGNORECASE)
_DECLINE = re.compile(r"\b(cannot|can't|can not|unable|not able|not possible|impossible|not eligible|ineligible|"
                      r"not allowed|not permitted|won't be able|unfortunately|not entitled|do not qualify|"
                      r"doesn't qualify|does not qualify|must decline|have to decline)", re.IGNORECASE)
_CLOSING = re.compile(r"anything else|something else|have a (great|nice|good|wonderful) day|glad (i|we) could help",
                      re.IGNORECASE)
_IDLE = ("be_vague", "reject", "challenge", "clarify_request")


def _norm(text: str) -> str:
    """Lower case, underscores as spaces, thousands separators and dollar signs dropped."""
    return re.sub(r"(?<=\d),(?=\d)", "", text.lower().replace("_", " ")).replace("$", "")


def _norm_args(x: Any) -> Any:
    if isinstance(x, str):
        return _norm(x)
    if isinstance(x, Mapping):
        return {k: _norm_args(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_norm_args(v) for v in x]
    return x


def names_every_value(text: str, arguments: Mapping[str, Any]) -> bool:
    """Whether ``text`` names every argument value (retail's test, lists and objects value by value),
    after `_norm` on both sides ("round trip" names ``round_trip``, "1,786" names 1786)."""
    return names_literally(_norm(text), _norm_args(dict(arguments)))


def reservation_ids(text: str) -> list[str]:
    """The reservation ids ``text`` mentions, in order, once each."""
    return list(dict.fromkeys(m for m in _RESERVATION.findall(text) if m not in _WORDS))


# Swaps retail's `first_person` lacks (it turns "you were" into "I were" and an object "you" after
# these verbs into "I"); applied before it.
_MORE_SWAPS = [(r"\bYou were\b", "I was"), (r"\byou were\b", "I was"),
               ((r"\b(told|tells|allow|allows|allowed|cause|caused|causes|gave|helped|asked|sent|sends|want|wants|"
                 r"wanted|make|made|makes|remind|reminded|charge|charged|refund|refunded|book|booked) you\b"), r"\1 me")]


def to_first_person(text: str) -> str:
    """The scenario's second person in the customer's first person (retail's `first_person`, with the
    airline scenarios' extra cases)."""
    for pat, rep in _MORE_SWAPS:
        text = re.sub(pat, rep, text)
    return first_person(text)


def opening_text(task: Task) -> str:
    """The reason for call in the first person, without its sentences about "the agent" (instructions
    to the role-player), unless nothing else is left."""
    rfc = (task.instructions.get("reason_for_call") or "").strip()
    sentences = re.split(r"(?<=[.!?])\s+", rfc)
    kept = [s for s in sentences if "the agent" not in s.lower()]
    return to_first_person(" ".join(kept) if kept else rfc).strip()


def _spoken(value: Any) -> str:
    """A value with underscores as the customer says it, the literal value after it (``basic economy
    (basic_economy)``), so an agent may copy either."""
    text = str(value)
    return f"{text.replace('_', ' ')} ({text})" if "_" in text else text


def _names(passengers: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{p.get('first_name')} {p.get('last_name')} (born {p.get('dob')})" for p in passengers)


def _flights(flights: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{f.get('flight_number')} on {f.get('date')}" for f in flights)


def _payments(payments: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{p.get('payment_id')} for {p.get('amount')}" for p in payments)


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
        self.insisted = 0
        ins = task.instructions
        scen = " ".join(str(ins.get(f) or "") for f in ("reason_for_call", "known_info", "task_instructions"))
        self.reservation_ids = reservation_ids(scen)
        self.unknown = (ins.get("unknown_info") or "").lower()
        self.needs_auth = any(a.name in AUTH_TOOLS for a in task.actions)
        self.needs_transfer = any(a.name == "transfer_to_human_agents" for a in task.actions)
        # Nothing to change and nothing to say: the agent must also decline (or close) for the goal.
        self.refusal_task = not task.write_actions and not task.communicate_info

    async def opening(self) -> CustomerTurn:
        return CustomerTurn(opening_text(self.task), "provide_info")

    async def aclose(self) -> None:
        return None

    # -- what the customer knows about the episode
    def _authenticated(self) -> bool:
        return any(n in AUTH_TOOLS for n, _ in self.view.successful_calls())

    def _transfers(self) -> int:
        return sum(n == "transfer_to_human_agents" for n, _ in self.view.successful_calls())

    def goal_met(self, agent_text: str = "") -> bool:
        """The goal's state holds (database, communicate strings, authentication, transfer), counting
        ``agent_text`` (the message being answered) among what was said. On a refusal task the
        customer also waits for the agent to decline (`_reply`)."""
        return (self.view.goal_db_reached()
                and communicate_reward(self.task, [*self.view.assistant_texts(), agent_text]) == 1.0
                and (self._authenticated() or not self.needs_auth) and (self._transfers() > 0 or not self.needs_transfer))

    # -- the reply
    async def respond(self, agent_text: str) -> CustomerTurn:
        self.replies += 1
        turn = self._reply(agent_text)
        self.idle = self.idle + 1 if turn.label in _IDLE else 0
        if turn.stop is None and self.idle >= self.patience:
            return CustomerTurn("This is going nowhere, I give up. " + STOP, "complain", STOP)
        if turn.stop is None and self.replies >= self.max_replies:
            return CustomerTurn("I have to go now. " + STOP, "complain", STOP)
        return turn

    def _reply(self, agent_text: str) -> CustomerTurn:
        text = _norm(agent_text)
        if self._transfers() > self.transfers_seen:
            self.transfers_seen = self._transfers()
            return CustomerTurn(TRANSFER, "accept" if self.needs_transfer else "complain", TRANSFER)
        if self.view.unexpected_writes():
            return CustomerTurn("That is not what I asked for. " + STOP, "complain", STOP)
        identity = self._identity_answers(agent_text)
        declined = bool(_DECLINE.search(agent_text) or _CLOSING.search(agent_text))
        if self.goal_met(agent_text):
            if not self.refusal_task:
                return CustomerTurn("Thank you, that is all I needed. " + STOP, "accept", STOP)
            if declined and not identity:
                if self.insisted >= 1:
                    return CustomerTurn("I see. Thank you anyway. " + STOP, "accept", STOP)
                self.insisted += 1
                return CustomerTurn("Are you sure there is nothing you can do? " + self._restate(), "challenge")
        pending = self.view.pending_writes()
        proposal = bool(_PROPOSAL.search(agent_text) and (reservation_ids(agent_text) or _ACTION_WORDS.search(agent_text)))
        if proposal and any(names_every_value(agent_text, a.arguments) for a in pending):
            return CustomerTurn("Yes, please go ahead.", "confirm")
        details = self._detail_answers(text, pending)
        if proposal and not identity:  # a proposal that asks who the customer is, is a question
            known = [s for s, informative in details if informative]
            if known:
                return CustomerTurn("No, that is not quite what I want. " + " ".join(known), "correct")
            return CustomerTurn("No, please do not do that. " + self._restate(), "reject")
        if identity or details:
            return self._turn(identity + details)
        if declined and not self.refusal_task:
            return CustomerTurn("But I really need this done. " + self._restate(), "challenge")
        if "?" in agent_text:
            return CustomerTurn("I am not sure what you are asking. " + self._restate(), "clarify_request")
        return CustomerTurn(self._restate(), "be_vague")

    @staticmethod
    def _turn(answers: Sequence[tuple[str, bool]]) -> CustomerTurn:
        """One reply from several answers: informative when one of them is."""
        return CustomerTurn(" ".join(s for s, _ in answers),
                            "provide_info" if any(informative for _, informative in answers) else "be_vague")

    def _restate(self) -> str:
        return "As I said: " + opening_text(self.task)

    def _identity_answers(self, agent_text: str) -> list[tuple[str, bool]]:
        """(sentence, informative) for the identity questions in ``agent_text``."""
        me, out, text = self.me, [], _norm(agent_text)
        asks_user_id = any(k in text for k in ("user id", "userid", "account id", "customer id", "member id"))
        if me.user_id and _norm(me.user_id) in text:  # the agent names it: it is not asking for it
            asks_user_id = False
        elif asks_user_id or any(k in text for k in ("email", "e-mail", "phone", "address", "zip")):
            out.append((f"My user id is {me.user_id}.", True) if me.user_id else ("I do not know my user id.", False))
        if re.search(r"\b(your|full|first|last) name\b", text) and not asks_user_id and me.first_name:
            out.append((f"My name is {me.first_name} {me.last_name}.", True))
        if re.search(r"\b(reservation|confirmation|booking)( id| number| code| reference|s)?\b", text) and (
                re.search(r"\b(id|ids|number|numbers|code|reference|which|what)\b", text)) and not (
                reservation_ids(agent_text)):  # an agent that names one is not asking for it
            if "reservation" in self.unknown:
                out.append(("I do not remember the reservation id.", False))
            elif self.reservation_ids:
                out.append(("The reservation id is " + " and ".join(self.reservation_ids) + ".", True))
            elif asks_user_id or not out:
                out.append(("I do not have the reservation id at hand.", False))
        return out

    def _detail_answers(self, text: str, pending: Sequence[Any]) -> list[tuple[str, bool]]:
        """(sentence, informative) for the questions in ``text`` about the pending gold writes."""
        def first(key: str) -> Any:
            return next((a.arguments[key] for a in pending if key in a.arguments), None)

        def asks(*words: str) -> bool:
            return re.search(r"\b(" + "|".join(words) + r")\b", text) is not None

        out: list[tuple[str, bool]] = []
        if asks("passengers?", "travell?ers?", "date of birth", "birth", "dob") and first("passengers"):
            out.append(("The passengers are " + _names(first("passengers")) + ".", True))
        if asks("pay", "paying", "payment", "card", "refund", "charged?", "certificate", "gift"):
            if first("payment_id") is not None:
                out.append((f"Please use {first('payment_id')}.", True))
            elif first("payment_methods") is not None:
                out.append(("Please use " + _payments(first("payment_methods")) + ".", True))
        if asks("cabin", "class"):
            if first("cabin") is not None:
                out.append((f"I want {_spoken(first('cabin'))}.", True))
            elif "cabin" in self.unknown:
                out.append(("I do not know the cabin.", False))
        if asks("flights?", "dates?", "when", "which day", "itinerary", "depart", "departure", "return") and (
                first("flights") is not None):
            out.append(("The flights are " + _flights(first("flights")) + ".", True))
        if asks("bags?", "baggages?", "luggage", "suitcases?") and first("total_baggages") is not None:
            bags = f"I want {first('total_baggages')} checked bags in total ({first('nonfree_baggages')} of them paid)."
            out.append((bags, True))
        if asks("insurance") and first("insurance") is not None:
            out.append(("Yes, I want travel insurance." if first("insurance") == "yes" else "No insurance, thank you.",
                        True))
        if asks("one way", "round trip", "trip type", "type of trip") and first("flight_type") is not None:
            out.append((f"It is a {_spoken(first('flight_type'))} trip.", True))
        if asks("origin", "destination", "where") and first("origin") is not None:
            out.append((f"From {first('origin')} to {first('destination')}.", True))
        if asks("reason", "why"):
            out.append((self._restate(), True))
        if asks("amount", "how much") and first("amount") is not None:
            out.append((f"The amount is {first('amount')}.", True))
        return out


__all__ = ["AUTH_TOOLS", "ScriptedCustomer", "names_every_value", "opening_text", "reservation_ids", "to_first_person"]

"""The 14 agent tools of tau2-bench airline, on the plain-dict database of :mod:`.db` (host code, no jax).

Behaviour follows tau2-bench (``sierra-research/tau2-bench``) at commit ``a2c0247``, as written down
in the project's airline specification (sections 2, 3 and 7): every check runs in tau2's order and
fails with tau2's exact message, arithmetic uses tau2's operands and types (so the database hash
after any sequence of calls equals tau2's), and tau2's quirks are kept on purpose:

* booking ids are the fixed ``HATHAT``/``HATHAU``/``HATHAV`` and certificate ids
  ``certificate_3221322/3/4``; new bookings are stamped with the fixed "now" ``2024-05-15T15:00:00``;
* ``cancel_reservation`` appends the negation of every payment entry (refunds included), releases
  no seat and refunds no gift card;
* ``update_reservation_baggages`` stores the counts exactly as given and debits a gift card also
  when the price is 0; ``update_reservation_flights`` re-prices only new segments, credits a gift
  card on a negative difference and never changes seats;
* a certificate listed twice in a booking is a partial write (the deductions before the failing
  entry stay);
* searches return ``[]`` rather than an error and compare times as strings; the one-stop search
  builds the connection date as ``"2024-05-" + str(day + 1)``.

**Argument validation.** Tools take the argument object unchanged as keyword arguments. Where tau2
builds a record from an argument (flight, passenger and payment objects, the new reservation, a
certificate, a payment of an update) it validates it with pydantic; so do we, with pydantic models
of the same names, fields and types (:class:`FlightInfo`, :class:`Passenger`, :class:`Payment`,
:class:`Reservation`, :class:`Certificate`), so lax coercions (``137.0`` -> ``137`` in an int field)
and the error texts are pydantic's own. The one difference a pydantic version makes is the
documentation link at the end of each error, which names the version: it is written as tau2's
reference run printed it (pydantic :data:`PYDANTIC_REFERENCE_VERSION`), whatever pydantic is installed.

:class:`AirlineTools` holds the database and has one method per tool (tau2's names and parameters;
the class name makes Python's own argument errors read like tau2's) and tau2's non-tool helpers
(:data:`ENV_FUNCTIONS`). :func:`execute` turns one tool call into the tool message content and never
raises; :func:`tool_schemas` gives tau2's own 14 OpenAI function schemas, byte for byte.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Literal

import pydantic

from jaxagent.envs.tau2.domains.airline.db import DEFAULT_DATA_DIR
from jaxagent.envs.tau2.tools import ToolError, ToolResult, calculate, check_schemas, run_tool, schema_file_text

__all__ = [
    "AIRPORTS",
    "CABINS",
    "ENV_FUNCTIONS",
    "GENERIC_TOOLS",
    "NOW",
    "PYDANTIC_REFERENCE_VERSION",
    "READ_TOOLS",
    "TOOL_NAMES",
    "TOOL_SCHEMAS_FILE",
    "WRITE_TOOLS",
    "AirlineTools",
    "check_tool_schemas",
    "execute",
    "tool_schemas",
]

WRITE_TOOLS: frozenset[str] = frozenset({
    "book_reservation", "cancel_reservation", "send_certificate", "update_reservation_baggages",
    "update_reservation_flights", "update_reservation_passengers"})
"""The six tools that change the database (the ones tau2's evaluator replays)."""
READ_TOOLS: frozenset[str] = frozenset({
    "get_reservation_details", "get_user_details", "list_all_airports", "search_direct_flight",
    "search_onestop_flight", "get_flight_status"})
GENERIC_TOOLS: frozenset[str] = frozenset({"calculate", "transfer_to_human_agents"})
TOOL_NAMES: tuple[str, ...] = tuple(sorted(WRITE_TOOLS | READ_TOOLS | GENERIC_TOOLS))
"""All 14 tool names, sorted (tau2's serving order is :func:`tool_schemas`')."""
ENV_FUNCTIONS: frozenset[str] = frozenset({
    "_get_user", "_get_reservation", "_get_flight", "_get_flight_instance", "_get_flights_from_flight_infos",
    "_get_new_reservation_id", "_get_new_payment_id", "_get_datetime", "_search_direct_flight",
    "_payment_for_update"})
"""The non-tool methods of tau2's ``AirlineTools`` (same names and parameters here), which tau2's
environment functions (initialization actions, env assertions) may call."""

CABINS: tuple[str, ...] = ("business", "economy", "basic_economy")
NOW = "2024-05-15T15:00:00"
"""The domain's fixed current time (the policy's 2024-05-15 15:00:00 EST), stamped on new bookings."""
NEW_RESERVATION_IDS: tuple[str, ...] = ("HATHAT", "HATHAU", "HATHAV")
NEW_PAYMENT_NUMBERS: tuple[int, ...] = (3221322, 3221323, 3221324)
AIRPORTS: tuple[tuple[str, str], ...] = (
    ("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"), ("DFW", "Dallas"),
    ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"), ("BOS", "Boston"),
    ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"), ("EWR", "Newark"),
    ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"), ("PHL", "Philadelphia"), ("LGA", "LaGuardia"))
"""``list_all_airports``'s fixed list (not derived from the data), in tau2's order."""

PYDANTIC_REFERENCE_VERSION = "2.14"
"""The pydantic version of the tau2 run the specification was checked against; validation errors name
it in their documentation link."""
_ERROR_LINK = re.compile(r"(For further information visit https://errors\.pydantic\.dev/)[^/\s]+(/v/)")


# --------------------------------------------------------------------------------------------------
# tau2's records that tools build from arguments, for validation (pydantic's lax mode, extra keys dropped)

class FlightInfo(pydantic.BaseModel):
    flight_number: str
    date: str


class Passenger(pydantic.BaseModel):
    first_name: str
    last_name: str
    dob: str


class Payment(pydantic.BaseModel):
    payment_id: str
    amount: int


class ReservationFlight(pydantic.BaseModel):
    flight_number: str
    origin: str
    destination: str
    date: str
    price: int


class Reservation(pydantic.BaseModel):
    reservation_id: str
    user_id: str
    origin: str
    destination: str
    flight_type: Literal["round_trip", "one_way"]
    cabin: Literal["business", "economy", "basic_economy"]
    flights: list[ReservationFlight]
    passengers: list[Passenger]
    payment_history: list[Payment]
    created_at: str
    total_baggages: int
    nonfree_baggages: int
    insurance: Literal["yes", "no"]
    status: Literal["cancelled"] | None = None


class Certificate(pydantic.BaseModel):
    source: Literal["certificate"]
    id: str
    amount: float


class DirectFlight(pydantic.BaseModel):
    flight_number: str
    origin: str
    destination: str
    status: str
    scheduled_departure_time_est: str
    scheduled_arrival_time_est: str
    date: str | None = None
    available_seats: dict[str, int]
    prices: dict[str, int]


def _build(model: type[pydantic.BaseModel], /, **fields: Any) -> pydantic.BaseModel:
    """``model(**fields)``; a validation failure is a `ToolError` with pydantic's text (its link at
    the reference version). ``model`` is positional-only: a record may hold a key named ``model``,
    which pydantic drops like any extra key."""
    try:
        return model(**fields)
    except pydantic.ValidationError as exc:
        raise ToolError(_ERROR_LINK.sub(rf"\g<1>{PYDANTIC_REFERENCE_VERSION}\g<2>", str(exc))) from None


def _attr(obj: Any, name: str) -> Any:
    """``obj.name`` as tau2 reads it from a record: a model's field, else Python's AttributeError (tau2
    keeps a list that is not all objects unvalidated, so its elements may be strings or numbers)."""
    if isinstance(obj, pydantic.BaseModel):
        return getattr(obj, name)
    raise AttributeError(f"'{type(obj).__name__}' object has no attribute '{name}'")


def _validated(items: Any, model: type[pydantic.BaseModel]) -> Any:
    """tau2's ``if all(isinstance(x, dict) for x in items): items = [Model(**x) for x in items]``."""
    if all(isinstance(x, dict) for x in items):
        return [_build(model, **x) for x in items]
    return items


def _dump(value: Any) -> Any:
    """A record as stored and rendered: a model's fields in order; anything else (an unvalidated
    argument tau2 stores as given) as a deep copy."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return copy.deepcopy(value)


# --------------------------------------------------------------------------------------------------
# the tools

class AirlineTools:
    """tau2's airline toolkit over a canonical plain-dict database (mutated in place by write tools)."""

    def __init__(self, db: dict) -> None:
        self.db = db

    # -- tau2's helpers (spec 2.1), reachable as environment functions -----------------------------------

    def _get_user(self, user_id: str) -> dict:
        if user_id not in self.db["users"]:
            raise ToolError(f"User {user_id} not found")
        return self.db["users"][user_id]

    def _get_reservation(self, reservation_id: str) -> dict:
        if reservation_id not in self.db["reservations"]:
            raise ToolError(f"Reservation {reservation_id} not found")
        return self.db["reservations"][reservation_id]

    def _get_flight(self, flight_number: str) -> dict:
        if flight_number not in self.db["flights"]:
            raise ToolError(f"Flight {flight_number} not found")
        return self.db["flights"][flight_number]

    def _get_flight_instance(self, flight_number: str, date: str) -> dict:
        flight = self._get_flight(flight_number)
        if date not in flight["dates"]:
            raise ToolError(f"Flight {flight_number} not found on date {date}")
        return flight["dates"][date]

    def _get_flights_from_flight_infos(self, flight_infos: list) -> list[dict]:
        return [self._get_flight_instance(_attr(f, "flight_number"), _attr(f, "date")) for f in flight_infos]

    def _get_new_reservation_id(self) -> str:
        for reservation_id in NEW_RESERVATION_IDS:
            if reservation_id not in self.db["reservations"]:
                return reservation_id
        raise ToolError("Too many reservations")

    def _get_new_payment_id(self) -> list[int]:
        return list(NEW_PAYMENT_NUMBERS)

    def _get_datetime(self) -> str:
        return NOW

    def _search_direct_flight(self, date: str, origin: str | None = None, destination: str | None = None,
                              leave_after: str | None = None) -> list[dict]:
        """Available flights on ``date`` (file order), as DirectFlight records (``date`` null). The
        conditions are checked in tau2's order, so an unhashable ``date`` fails only on a flight whose
        origin and destination match."""
        out = []
        for flight in self.db["flights"].values():
            if ((origin is None or flight["origin"] == origin)
                    and (destination is None or flight["destination"] == destination)
                    and date in flight["dates"]
                    and flight["dates"][date]["status"] == "available"
                    and (leave_after is None or flight["scheduled_departure_time_est"] >= leave_after)):
                day = flight["dates"][date]
                out.append(DirectFlight(
                    flight_number=flight["flight_number"], origin=flight["origin"],
                    destination=flight["destination"], status="available",
                    scheduled_departure_time_est=flight["scheduled_departure_time_est"],
                    scheduled_arrival_time_est=flight["scheduled_arrival_time_est"],
                    available_seats=day["available_seats"], prices=day["prices"]).model_dump())
        return out

    def _payment_for_update(self, user: Any, payment_id: str, total_price: int) -> dict | None:
        """tau2's helper takes its ``User`` model, which no JSON value is: reading ``user.payment_methods``
        raises Python's AttributeError, as tau2's does when an environment function passes a JSON value.
        The tools use `_charge_update` on the stored user record."""
        raise AttributeError(f"'{type(user).__name__}' object has no attribute 'payment_methods'")

    def _charge_update(self, user: dict, payment_id: str, total_price: Any) -> dict | None:
        """tau2's payment of an update (``_payment_for_update``): checks, the gift-card debit (even of
        0), and the payment entry (None when the price is 0). The debit happens before the entry is
        validated, as in tau2 (a fractional price is refused after the gift card was debited)."""
        methods = user["payment_methods"]
        if payment_id not in methods:
            raise ToolError("Payment method not found")
        method = methods[payment_id]
        if method["source"] == "certificate":
            raise ToolError("Certificate cannot be used to update reservation")
        if method["source"] == "gift_card" and method["amount"] < total_price:
            raise ToolError("Gift card balance is not enough")
        if method["source"] == "gift_card":
            method["amount"] -= total_price
        if total_price != 0:
            return _build(Payment, payment_id=payment_id, amount=total_price).model_dump()
        return None

    # -- read tools (spec 2.2) --------------------------------------------------------------------------

    def get_user_details(self, user_id: str) -> dict:
        """The user record."""
        return self._get_user(user_id)

    def get_reservation_details(self, reservation_id: str) -> dict:
        """The reservation record, ``status`` included."""
        return self._get_reservation(reservation_id)

    def list_all_airports(self) -> list[dict]:
        """The fixed airport list (:data:`AIRPORTS`)."""
        return [{"iata": iata, "city": city} for iata, city in AIRPORTS]

    def search_direct_flight(self, origin: str, destination: str, date: str) -> list[dict]:
        """Direct flights available on ``date``; ``[]`` when none."""
        return self._search_direct_flight(date=date, origin=origin, destination=destination)

    def search_onestop_flight(self, origin: str, destination: str, date: str) -> list[list[dict]]:
        """Pairs ``[first, second]`` of available flights via one stop (spec 2.2: the connection date
        is built as text, times compared as strings)."""
        results = []
        for first in self._search_direct_flight(date=date, origin=origin):
            first["date"] = date
            date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first["scheduled_arrival_time_est"] else date
            for second in self._search_direct_flight(date=date2, origin=first["destination"],
                                                     destination=destination,
                                                     leave_after=first["scheduled_arrival_time_est"]):
                second["date"] = date2
                results.append([first, second])
        return results

    def get_flight_status(self, flight_number: str, date: str) -> str:
        """The bare status word of the flight on ``date``."""
        return self._get_flight_instance(flight_number, date)["status"]

    # -- generic tools (spec 2.3) -----------------------------------------------------------------------

    def calculate(self, expression: str) -> str:
        """tau2's ``calculate`` (shared with retail)."""
        return calculate(expression)

    def transfer_to_human_agents(self, summary: str) -> str:
        """Changes nothing; the episode goes on."""
        return "Transfer successful"

    # -- write tools (spec 2.4) -------------------------------------------------------------------------

    def book_reservation(self, user_id: str, origin: str, destination: str, flight_type: str, cabin: str,
                         flights: list, passengers: list, payment_methods: list, total_baggages: int,
                         nonfree_baggages: int, insurance: str) -> dict:
        """A new reservation (``HATHAT``, then ``HATHAU``, ``HATHAV``), paid in full, seats taken."""
        flights = _validated(flights, FlightInfo)
        passengers = _validated(passengers, Passenger)
        payment_methods = _validated(payment_methods, Payment)
        user = self._get_user(user_id)
        reservation_id = self._get_new_reservation_id()
        reservation = _build(
            Reservation, reservation_id=reservation_id, user_id=user_id, origin=origin, destination=destination,
            flight_type=flight_type, cabin=cabin, flights=[], passengers=copy.deepcopy(passengers),
            payment_history=copy.deepcopy(payment_methods), created_at=NOW, total_baggages=total_baggages,
            nonfree_baggages=nonfree_baggages, insurance=insurance).model_dump()
        total: Any = 0
        days = []
        for info in flights:
            flight = self._get_flight(_attr(info, "flight_number"))
            day = self._get_flight_instance(flight_number=info.flight_number, date=info.date)
            if day["status"] != "available":
                raise ToolError(f"Flight {info.flight_number} not available on date {info.date}")
            if day["available_seats"][cabin] < len(passengers):
                raise ToolError(f"Not enough seats on flight {info.flight_number}")
            price = day["prices"][cabin]
            reservation["flights"].append(ReservationFlight(
                flight_number=info.flight_number, origin=flight["origin"], destination=flight["destination"],
                date=info.date, price=price).model_dump())
            days.append(day)
            total += price * len(passengers)
        if insurance == "yes":
            total += 30 * len(passengers)
        total += 50 * nonfree_baggages   # the argument as given (the record holds the validated count)
        methods = user["payment_methods"]
        for payment in payment_methods:
            pid, amount = _attr(payment, "payment_id"), payment.amount
            if pid not in methods:
                raise ToolError(f"Payment method {pid} not found")
            method = methods[pid]
            if method["source"] in ("gift_card", "certificate") and method["amount"] < amount:
                raise ToolError(f"Not enough balance in payment method {pid}")
        paid = sum(payment.amount for payment in payment_methods)
        if paid != total:
            raise ToolError(f"Payment amount does not add up, total price is {total}, but paid {paid}")
        for payment in payment_methods:   # a certificate listed twice: KeyError here, after earlier debits
            method = methods[payment.payment_id]
            if method["source"] == "gift_card":
                method["amount"] -= payment.amount
            elif method["source"] == "certificate":
                methods.pop(payment.payment_id)
        for day in days:
            day["available_seats"][cabin] -= len(passengers)
        self.db["reservations"][reservation_id] = reservation
        user["reservations"].append(reservation_id)
        return reservation

    def cancel_reservation(self, reservation_id: str) -> dict:
        """Appends the negation of every payment entry and sets ``status`` to cancelled; nothing else."""
        reservation = self._get_reservation(reservation_id)
        refunds = [_build(Payment, payment_id=p["payment_id"], amount=-p["amount"]).model_dump()
                   for p in reservation["payment_history"]]
        reservation["payment_history"].extend(refunds)
        reservation["status"] = "cancelled"
        return reservation

    def update_reservation_baggages(self, reservation_id: str, total_baggages: int, nonfree_baggages: int,
                                    payment_id: str) -> dict:
        """New bag counts, stored as given; 50 per added non-free bag."""
        reservation = self._get_reservation(reservation_id)
        user = self._get_user(reservation["user_id"])
        total = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
        payment = self._charge_update(user, payment_id, total)
        if payment is not None:
            reservation["payment_history"].append(payment)
        reservation["total_baggages"] = copy.deepcopy(total_baggages)
        reservation["nonfree_baggages"] = copy.deepcopy(nonfree_baggages)
        return reservation

    def update_reservation_flights(self, reservation_id: str, cabin: str, flights: list, payment_id: str) -> dict:
        """The whole new itinerary: kept segments at their stored price, new ones at today's; the
        difference paid (or credited) with ``payment_id``; seats untouched."""
        flights = _validated(flights, FlightInfo)
        reservation = self._get_reservation(reservation_id)
        user = self._get_user(reservation["user_id"])
        n = len(reservation["passengers"])
        total: Any = 0
        segments = []
        for info in flights:
            number, date = _attr(info, "flight_number"), info.date
            kept = next((s for s in reservation["flights"]
                         if s["flight_number"] == number and s["date"] == date and cabin == reservation["cabin"]),
                        None)
            if kept is not None:
                total += kept["price"] * n
                segments.append(kept)
                continue
            day = self._get_flight_instance(flight_number=number, date=date)
            if day["status"] != "available":
                raise ToolError(f"Flight {number} not available on date {date}")
            if day["available_seats"][cabin] < n:
                raise ToolError(f"Not enough seats on flight {number}")
            flight = self._get_flight(number)
            segment = ReservationFlight(flight_number=number, date=date, price=day["prices"][cabin],
                                        origin=flight["origin"], destination=flight["destination"]).model_dump()
            total += segment["price"] * n
            segments.append(segment)
        total -= sum(s["price"] for s in reservation["flights"]) * n
        payment = self._charge_update(user, payment_id, total)
        if payment is not None:
            reservation["payment_history"].append(payment)
        reservation["flights"] = segments
        reservation["cabin"] = copy.deepcopy(cabin)
        return reservation

    def update_reservation_passengers(self, reservation_id: str, passengers: list) -> dict:
        """The passenger list replaced (same length required)."""
        passengers = _validated(passengers, Passenger)
        reservation = self._get_reservation(reservation_id)
        if len(passengers) != len(reservation["passengers"]):
            raise ToolError("Number of passengers does not match")
        reservation["passengers"] = _dump(passengers)
        return reservation

    def send_certificate(self, user_id: str, amount: int) -> str:
        """A certificate of ``amount`` (stored as a float) under the first free fixed id."""
        user = self._get_user(user_id)
        for number in self._get_new_payment_id():
            payment_id = f"certificate_{number}"
            if payment_id not in user["payment_methods"]:
                certificate = _build(Certificate, id=payment_id, amount=amount, source="certificate")
                user["payment_methods"][payment_id] = {"source": "certificate", "id": payment_id,
                                                       "amount": certificate.amount}
                return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
        raise ToolError("Too many certificates")


# --------------------------------------------------------------------------------------------------
# calling a tool

def execute(db: dict, name: str, arguments: Any) -> ToolResult:
    """Run one airline tool call against ``db`` (mutated in place by write tools); never raises
    (`jaxagent.envs.tau2.tools.run_tool`)."""
    return run_tool(AirlineTools(db), TOOL_NAMES, name, arguments)


# --------------------------------------------------------------------------------------------------
# schemas shown to the agent: tau2's own, from the packaged file

TOOL_SCHEMAS_FILE: Path = DEFAULT_DATA_DIR / "tool_schemas.json"
"""tau2's 14 OpenAI function schemas as its own code generates them (``{"source": ..., "tools": [...]}``,
MIT, Sierra Research); :func:`tool_schemas` serves its ``tools`` list unchanged."""

_PARAM_TYPES: dict[str, dict[str, Any]] = {"str": {"type": "string"}, "int": {"type": "integer"},
                                           "list": {"type": "array"}}


def check_tool_schemas(schemas: Any) -> None:
    """Raise ``ValueError`` unless ``schemas`` describe exactly the implemented tools
    (`jaxagent.envs.tau2.tools.check_schemas` over :class:`AirlineTools` and :data:`TOOL_NAMES`)."""
    check_schemas(schemas, AirlineTools, TOOL_NAMES, _PARAM_TYPES)


def tool_schemas() -> tuple[dict, ...]:
    """tau2's 14 OpenAI function schemas, exactly as in :data:`TOOL_SCHEMAS_FILE` (tau2's order,
    descriptions, ``$defs`` and quirks); fresh objects on every call."""
    return tuple(json.loads(schema_file_text(TOOL_SCHEMAS_FILE, check_tool_schemas)))

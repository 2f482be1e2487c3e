"""The 13 agent tools of tau2-bench telecom, on the plain-dict provider database of :mod:`.db` (host code, no jax).

Behaviour follows tau2-bench (``sierra-research/tau2-bench``) at commit ``a2c0247``, as written down
in the project's telecom specification (sections 2 and 3): every check runs in tau2's order and fails
with tau2's exact message (:class:`~jaxagent.envs.tau2.tools.ToolError`, a ``ValueError``), values are
stored with tau2's types (so the database hash after any sequence of calls equals tau2's), and tau2's
quirks are kept on purpose:

* arguments are used as given, without validation or coercion: a non-string id fails with Python's
  own text where tau2's code does (``get_details_by_id(7)`` -> ``'int' object has no attribute
  'startswith'``; ``get_bills_for_customer(limit="2")`` -> the slice error; ``refuel_data(gb_amount="2")``
  -> ``'<=' not supported between instances of 'str' and 'int'``) and is simply "not found" elsewhere;
* lookups scan the tables in order and take the first match; phone numbers and ids match exactly
  (``get_customer_by_name`` alone ignores case, through ``str.lower``);
* ``refuel_data`` writes ``str(gb_amount)`` into the bill's line item, so an int ``2`` leaves a
  different database (and hash) than ``2.0``; it adds to the line's refuelled data before charging,
  checks no line status, and charges the customer's first Draft bill, creating one with a random id
  ``B`` + 8 hex characters when there is none (never in the tasks);
* ``send_payment_request`` re-requests any bill, even a Paid one; ``resume_line`` checks neither the
  contract nor unpaid bills; ``suspend_line`` ignores its ``reason`` and charges nothing;
* ``enable_roaming`` / ``disable_roaming`` answer ``Roaming was already ...`` without change;
* "today" is fixed (:data:`TODAY`, 2025-02-25): suspension dates, line-item dates and the billing
  cycle's end (2025-02-28) derive from it.

**Values.** Tools return raw values: a record is the stored dict itself (every field, canonical
order), a list of records a list, a message a string, and the four dict results (``suspend_line``,
``resume_line``, ``refuel_data``, ``get_data_usage``) a :class:`DictResult` with real numbers.
:func:`render_result` turns them into tau2's tool message text (spec 3.2): strings unchanged, records
and lists of records as one-line JSON, and a :class:`DictResult` as a JSON object whose numbers and
booleans become their ``str()`` (``"8.7"``, ``"2.0"``) while the records in it stay full objects.

:class:`TelecomTools` holds the database and has one method per tool (tau2's names and parameters;
the class name makes Python's own argument errors read like tau2's) and tau2's non-tool functions
used by initialization actions and env assertions (:data:`ENV_FUNCTIONS`). :func:`execute` turns one
agent tool call into the tool message and never raises (no sync with the phone: the domain glue runs
it); :func:`tool_schemas` gives tau2's own 13 OpenAI function schemas, byte for byte.
"""

from __future__ import annotations

import datetime
import json
import secrets
from pathlib import Path
from typing import Any

from jaxagent.envs.tau2.domains.telecom.db import DEFAULT_DATA_DIR
from jaxagent.envs.tau2.tools import ToolError, ToolResult, check_schemas, run_tool, schema_file_text

__all__ = [
    "ENV_FUNCTIONS",
    "GENERIC_TOOLS",
    "READ_TOOLS",
    "TODAY",
    "TOOL_NAMES",
    "TOOL_SCHEMAS_FILE",
    "WRITE_TOOLS",
    "DictResult",
    "TelecomTools",
    "check_tool_schemas",
    "execute",
    "render_result",
    "tool_schemas",
]

TOOL_NAMES: tuple[str, ...] = (
    "get_customer_by_phone", "get_customer_by_id", "get_customer_by_name", "get_details_by_id", "suspend_line",
    "resume_line", "get_bills_for_customer", "send_payment_request", "get_data_usage", "enable_roaming",
    "disable_roaming", "transfer_to_human_agents", "refuel_data")
"""All 13 agent tool names, in tau2's (the schemas') order."""
READ_TOOLS: frozenset[str] = frozenset({
    "get_customer_by_phone", "get_customer_by_id", "get_customer_by_name", "get_details_by_id",
    "get_bills_for_customer", "get_data_usage"})
WRITE_TOOLS: frozenset[str] = frozenset({
    "suspend_line", "resume_line", "send_payment_request", "enable_roaming", "disable_roaming", "refuel_data"})
"""The six tools that change the database (the ones tau2's evaluator replays), also when they change
nothing (``Roaming was already enabled``)."""
GENERIC_TOOLS: frozenset[str] = frozenset({"transfer_to_human_agents"})
ENV_FUNCTIONS: frozenset[str] = frozenset({
    "set_data_usage", "suspend_line_for_overdue_bill", "assert_data_refueling_amount", "assert_line_status",
    "assert_overdue_bill_exists", "assert_no_overdue_bill", "get_available_plan_ids", "_get_line_by_id",
    "_get_line_by_phone", "_get_plan_by_id", "_get_device_by_id", "_get_bill_by_id", "_get_target_line",
    "_get_bills_awaiting_payment", "_set_bill_to_paid"})
"""tau2's non-tool provider functions (same names and parameters), which initialization actions and
env assertions call besides the tools (``enable_roaming`` / ``disable_roaming`` are tools), and the
toolkit's helpers that tau2's ``getattr`` also reaches (``get_available_plan_ids``, the ``_get_*``
lookups, ``_set_bill_to_paid``)."""

TODAY = "2025-02-25"
"""The domain's fixed "today" (tau2's ``get_today()``)."""
_TODAY = datetime.date.fromisoformat(TODAY)


class DictResult(dict):
    """A tool's dict result (not a record): :func:`render_result` stringifies its numbers and booleans."""


# --------------------------------------------------------------------------------------------------
# rendering (spec 3.2): tau2's Environment.to_json_str over our plain-dict records

def _process(value: Any) -> Any:
    """tau2's per-value conversion: records (plain dicts) as they are, strings and None unchanged,
    numbers and booleans as ``str()``, dict results and lists element by element."""
    if isinstance(value, DictResult):
        return {k: _process(v) for k, v in value.items()}
    if isinstance(value, (dict, str)) or value is None:
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_process(v) for v in value]
    return value


def render_result(value: Any) -> str:
    """The tool-message content of a successful telecom result (spec 3.2).

    A string unchanged; a record (a stored dict) or a list of records as one-line JSON in canonical
    field order, nulls included, real numbers; a :class:`DictResult` as a JSON object whose values are
    converted one level: records stay full objects, strings unchanged, numbers and booleans ``str()``
    (``{"data_used_gb": "8.7"}``), None null. ``json.dumps`` defaults (``", "``, ``": "``, ASCII).
    """
    if isinstance(value, str):
        return value
    return json.dumps(_process(value), default=str)


# --------------------------------------------------------------------------------------------------
# the tools

class TelecomTools:
    """tau2's telecom agent toolkit over the canonical provider dict of
    :func:`~jaxagent.envs.tau2.domains.telecom.db.load_db` (mutated in place by write tools)."""

    def __init__(self, db: dict) -> None:
        self.db = db

    # -- tau2's lookups (spec 2.1) --------------------------------------------------------------------

    def _get_line_by_id(self, line_id: str) -> dict:
        for line in self.db["lines"]:
            if line["line_id"] == line_id:
                return line
        raise ToolError(f"Line with ID {line_id} not found")

    def _get_line_by_phone(self, phone_number: str) -> dict:
        for line in self.db["lines"]:
            if line["phone_number"] == phone_number:
                return line
        raise ToolError(f"Line with phone number {phone_number} not found")

    def _get_plan_by_id(self, plan_id: str) -> dict:
        for plan in self.db["plans"]:
            if plan["plan_id"] == plan_id:
                return plan
        raise ToolError(f"Plan with ID {plan_id} not found")

    def _get_device_by_id(self, device_id: str) -> dict:
        for device in self.db["devices"]:
            if device["device_id"] == device_id:
                return device
        raise ToolError(f"Device with ID {device_id} not found")

    def _get_bill_by_id(self, bill_id: str) -> dict:
        for bill in self.db["bills"]:
            if bill["bill_id"] == bill_id:
                return bill
        raise ToolError(f"Bill with ID {bill_id} not found")

    def _get_target_line(self, customer_id: str, line_id: str) -> dict:
        """The customer's line: customer lookup, then ``line_id`` in its ``line_ids``, then the line."""
        customer = self.get_customer_by_id(customer_id)
        if line_id not in customer["line_ids"]:
            raise ToolError(f"Line {line_id} not found for customer {customer_id}")
        return self._get_line_by_id(line_id)

    def _get_bills_awaiting_payment(self, customer: dict) -> list[dict]:
        """The customer's bills (``bill_ids`` order) with status ``Awaiting Payment``."""
        return [bill for bill in map(self._get_bill_by_id, customer["bill_ids"])
                if bill["status"] == "Awaiting Payment"]

    def _set_bill_to_paid(self, bill_id: str) -> str:
        """The sync's payment step (spec 5): the bill becomes ``Paid``."""
        self._get_bill_by_id(bill_id)["status"] = "Paid"
        return f"Bill {bill_id} set to paid"

    def _apply_one_time_charge(self, customer_id: str, amount: float, description: str) -> None:
        """Charge ``amount`` on the customer's first Draft bill (``bill_ids`` order), creating next
        month's Draft bill (random id ``B`` + 8 hex characters) when there is none."""
        customer = self.get_customer_by_id(customer_id)
        draft = None
        for bill_id in customer["bill_ids"]:
            bill = self._get_bill_by_id(bill_id)
            if bill["status"] == "Draft":
                draft = bill
                break
        if draft is None:
            next_month = (_TODAY.replace(day=1) + datetime.timedelta(days=32)).replace(day=1)
            after = next_month.replace(month=next_month.month + 1 if next_month.month < 12 else 1,
                                       year=next_month.year if next_month.month < 12 else next_month.year + 1)
            new_bill_id = "B" + secrets.token_hex(4)
            draft = {"bill_id": new_bill_id, "customer_id": customer_id, "period_start": next_month.isoformat(),
                     "period_end": (after - datetime.timedelta(days=1)).isoformat(),
                     "issue_date": next_month.isoformat(), "total_due": 0.0,
                     "due_date": (next_month + datetime.timedelta(days=14)).isoformat(), "line_items": [],
                     "status": "Draft"}
            self.db["bills"].append(draft)
            customer["bill_ids"].append(new_bill_id)
        draft["line_items"].append({"description": description, "amount": amount, "date": TODAY,
                                    "item_type": "Credit" if amount < 0 else "Charge"})
        draft["total_due"] += amount

    def get_available_plan_ids(self) -> list[str]:
        """tau2's helper: every plan id, in order."""
        return [plan["plan_id"] for plan in self.db["plans"]]

    # -- read and generic tools (spec 2.2) ------------------------------------------------------------

    def get_customer_by_phone(self, phone_number: str) -> dict:
        """The first customer whose primary number, or one of whose lines' numbers (``line_ids``
        order), equals ``phone_number`` exactly."""
        for customer in self.db["customers"]:
            if customer["phone_number"] == phone_number:
                return customer
            for line_id in customer["line_ids"]:
                if self._get_line_by_id(line_id)["phone_number"] == phone_number:
                    return customer
        raise ToolError(f"Customer with phone number {phone_number} not found")

    def get_customer_by_id(self, customer_id: str) -> dict:
        """The customer record (exact, case-sensitive id)."""
        for customer in self.db["customers"]:
            if customer["customer_id"] == customer_id:
                return customer
        raise ToolError(f"Customer with ID {customer_id} not found")

    def get_customer_by_name(self, full_name: str, dob: str) -> list[dict]:
        """Every customer whose name equals ``full_name`` ignoring case (``str.lower``, no trimming) and
        whose ``date_of_birth`` equals ``dob``; ``[]`` when none."""
        return [customer for customer in self.db["customers"]
                if customer["full_name"].lower() == full_name.lower() and customer["date_of_birth"] == dob]

    def get_details_by_id(self, id: str) -> dict:
        """The line / device / bill / customer / plan, by the id's first letter (L, D, B, C, P)."""
        if id.startswith("L"):
            return self._get_line_by_id(id)
        if id.startswith("D"):
            return self._get_device_by_id(id)
        if id.startswith("B"):
            return self._get_bill_by_id(id)
        if id.startswith("C"):
            return self.get_customer_by_id(id)
        if id.startswith("P"):
            return self._get_plan_by_id(id)
        raise ToolError(f"Unknown ID format or type: {id}")

    def get_bills_for_customer(self, customer_id: str, limit: int = 12) -> list[dict]:
        """The customer's bills, newest ``issue_date`` first (stable), then ``[:limit]`` (Python's slice)."""
        customer = self.get_customer_by_id(customer_id)
        bills = [self._get_bill_by_id(bill_id) for bill_id in customer["bill_ids"]]
        return sorted(bills, key=lambda bill: bill["issue_date"], reverse=True)[:limit]

    def get_data_usage(self, customer_id: str, line_id: str) -> DictResult:
        """The line's usage, its plan's limit, its refuelled data and the cycle's end (numbers raw here,
        strings once rendered)."""
        line = self._get_target_line(customer_id, line_id)
        plan = self._get_plan_by_id(line["plan_id"])
        cycle_end = (datetime.date(_TODAY.year, _TODAY.month + 1 if _TODAY.month < 12 else 1, 1)
                     - datetime.timedelta(days=1))
        return DictResult(line_id=line_id, data_used_gb=line["data_used_gb"], data_limit_gb=plan["data_limit_gb"],
                          data_refueling_gb=line["data_refueling_gb"], cycle_end_date=cycle_end.isoformat())

    def transfer_to_human_agents(self, summary: str) -> str:
        """Changes nothing; the episode goes on."""
        return "Transfer successful"

    # -- write tools (spec 2.3) -----------------------------------------------------------------------

    def suspend_line(self, customer_id: str, line_id: str, reason: str) -> DictResult:
        """An Active line becomes Suspended from today (``reason`` ignored, no fee charged)."""
        line = self._get_target_line(customer_id, line_id)
        if line["status"] != "Active":
            raise ToolError("Line must be active to suspend")
        line["status"] = "Suspended"
        line["suspension_start_date"] = TODAY
        return DictResult(message="Line suspended successfully. $5/month holding fee will apply.", line=line)

    def resume_line(self, customer_id: str, line_id: str) -> DictResult:
        """A Suspended or Pending Activation line becomes Active (suspension date cleared)."""
        line = self._get_target_line(customer_id, line_id)
        if line["status"] not in ("Suspended", "Pending Activation"):
            raise ToolError("Line must be suspended to resume")
        line["status"] = "Active"
        line["suspension_start_date"] = None
        return DictResult(message="Line resumed successfully", line=line)

    def send_payment_request(self, customer_id: str, bill_id: str) -> str:
        """The bill becomes ``Awaiting Payment`` (whatever it was). Checks: customer, no bill already
        awaiting payment, ``bill_id`` among the customer's, the bill exists."""
        customer = self.get_customer_by_id(customer_id)
        if self._get_bills_awaiting_payment(customer):
            raise ToolError("A bill is already awaiting payment for this customer")
        if bill_id not in customer["bill_ids"]:
            raise ToolError(f"Bill {bill_id} not found for customer {customer_id}")
        bill = self._get_bill_by_id(bill_id)
        bill["status"] = "Awaiting Payment"
        return f"Payment request sent to the customer for bill {bill['bill_id']}"

    def enable_roaming(self, customer_id: str, line_id: str) -> str:
        """Turns the line's roaming on (no change when it already is)."""
        line = self._get_target_line(customer_id, line_id)
        if line["roaming_enabled"]:
            return "Roaming was already enabled"
        line["roaming_enabled"] = True
        return "Roaming enabled successfully"

    def disable_roaming(self, customer_id: str, line_id: str) -> str:
        """Turns the line's roaming off (no change when it already is)."""
        line = self._get_target_line(customer_id, line_id)
        if not line["roaming_enabled"]:
            return "Roaming was already disabled"
        line["roaming_enabled"] = False
        return "Roaming disabled successfully"

    def refuel_data(self, customer_id: str, line_id: str, gb_amount: float) -> DictResult:
        """Adds ``gb_amount`` to the line's refuelled data and charges ``gb_amount * price`` on the
        customer's Draft bill (spec 2.3; ``gb_amount`` stored and written as given)."""
        line = self._get_target_line(customer_id, line_id)
        if gb_amount <= 0:
            raise ToolError("Refuel amount must be positive")
        plan = self._get_plan_by_id(line["plan_id"])
        price = plan["data_refueling_price_per_gb"]
        charge = gb_amount * price
        line["data_refueling_gb"] += gb_amount
        self._apply_one_time_charge(customer_id, charge, f"Data refueling: {gb_amount} GB at ${price}/GB")
        return DictResult(message=f"Successfully added {gb_amount} GB of data for line {line_id} for ${charge:.2f}",
                          new_data_refueling_gb=line["data_refueling_gb"], charge=charge)

    # -- non-tool functions: initialization and assertions (spec 2.4) -----------------------------------

    def set_data_usage(self, customer_id: str, line_id: str, data_used_gb: float) -> str:
        """Stores ``data_used_gb`` as given (an int stays an int)."""
        line = self._get_target_line(customer_id, line_id)
        line["data_used_gb"] = data_used_gb
        return f"Data usage set to {data_used_gb} GB for line {line_id}"

    def suspend_line_for_overdue_bill(self, customer_id: str, line_id: str, new_bill_id: str,
                                      contract_ended: bool) -> str:
        """Creates last month's Overdue bill ``new_bill_id`` (the line's monthly price) and suspends the
        line from today; with ``contract_ended`` the contract ends on last month's last day."""
        line = self._get_line_by_id(line_id)
        if line["status"] != "Active":
            raise ToolError("Line must be active to suspend for unpaid bill")
        amount = self._get_plan_by_id(line["plan_id"])["price_per_month"]
        if amount <= 0:
            raise ToolError("Amount must be positive for overdue bill")
        customer = self.get_customer_by_id(customer_id)
        overdue = [b for b in customer["bill_ids"] if self._get_bill_by_id(b)["status"] == "Overdue"]
        if overdue:   # every bill is looked up first, as in tau2
            raise ToolError("Customer already has an overdue bill")
        last_day = _TODAY.replace(day=1) - datetime.timedelta(days=1)
        first_day = last_day.replace(day=1)
        bill = {"bill_id": new_bill_id, "customer_id": customer_id, "period_start": first_day.isoformat(),
                "period_end": last_day.isoformat(), "issue_date": first_day.isoformat(), "total_due": 0.0,
                "due_date": (first_day + datetime.timedelta(days=14)).isoformat(),
                "line_items": [{"description": f"Charge for line {line['line_id']}", "amount": amount,
                                "date": TODAY, "item_type": "Charge" if amount > 0 else "Credit"}],
                "status": "Overdue"}
        bill["total_due"] += amount
        self.db["bills"].append(bill)
        customer["bill_ids"].append(new_bill_id)
        line["status"] = "Suspended"
        line["suspension_start_date"] = TODAY
        if contract_ended:
            line["contract_end_date"] = last_day.isoformat()
        return f"Line {line_id} suspended for unpaid bill {new_bill_id}. Contract ended: {contract_ended}"

    def assert_data_refueling_amount(self, customer_id: str, line_id: str, expected_amount: float) -> bool:
        """The line's refuelled data is within 1e-6 of ``expected_amount``."""
        line = self._get_target_line(customer_id, line_id)
        return abs(line["data_refueling_gb"] - expected_amount) < 1e-6

    def assert_line_status(self, customer_id: str, line_id: str, expected_status: str) -> bool:
        """The line's status equals ``expected_status``."""
        return self._get_target_line(customer_id, line_id)["status"] == expected_status

    def assert_overdue_bill_exists(self, customer_id: str, overdue_bill_id: str) -> bool:
        """True, or raises: the bill is the customer's and is Overdue."""
        customer = self.get_customer_by_id(customer_id)
        if overdue_bill_id not in customer["bill_ids"]:
            raise ToolError(f"Overdue bill {overdue_bill_id} not found")
        if self._get_bill_by_id(overdue_bill_id)["status"] != "Overdue":
            raise ToolError(f"Overdue bill {overdue_bill_id} is not overdue")
        return True

    def assert_no_overdue_bill(self, overdue_bill_id: str) -> bool:
        """True when the bill does not exist or is Paid."""
        try:
            bill = self._get_bill_by_id(overdue_bill_id)
        except ValueError:
            return True
        return bill["status"] == "Paid"


def execute(db: dict, name: str, arguments: Any) -> ToolResult:
    """Run one telecom agent tool call against ``db`` (mutated in place by write tools); never raises
    (`jaxagent.envs.tau2.tools.run_tool`, rendered by :func:`render_result`). Only :data:`TOOL_NAMES`
    are callable; no sync with the phone happens here."""
    return run_tool(TelecomTools(db), TOOL_NAMES, name, arguments, render=render_result)


# --------------------------------------------------------------------------------------------------
# schemas shown to the agent: tau2's own, from the packaged file

TOOL_SCHEMAS_FILE: Path = DEFAULT_DATA_DIR / "tool_schemas.json"
"""tau2's 13 OpenAI function schemas as its own code generates them (``{"source": ..., "tools": [...]}``,
MIT, Sierra Research); :func:`tool_schemas` serves its ``tools`` list unchanged."""

_PARAM_TYPES: dict[str, dict[str, Any]] = {"str": {"type": "string"}, "int": {"type": "integer"},
                                           "float": {"type": "number"}}
"""Method annotation -> the JSON-schema keys of the parameter."""


def check_tool_schemas(schemas: Any) -> None:
    """Raise ``ValueError`` unless ``schemas`` describe exactly :data:`TOOL_NAMES` of :class:`TelecomTools`
    (`jaxagent.envs.tau2.tools.check_schemas`: ``limit`` of ``get_bills_for_customer`` is the only
    optional parameter, and its schema ``default`` must equal the method's)."""
    check_schemas(schemas, TelecomTools, TOOL_NAMES, _PARAM_TYPES)


def tool_schemas() -> tuple[dict, ...]:
    """tau2's 13 OpenAI function schemas, exactly as in :data:`TOOL_SCHEMAS_FILE` (tau2's order and
    descriptions); fresh objects on every call."""
    return tuple(json.loads(schema_file_text(TOOL_SCHEMAS_FILE, check_tool_schemas)))

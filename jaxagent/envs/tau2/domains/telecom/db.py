"""The tau2-bench telecom provider database: loading and canonical form (host code, no jax).

Behaviour follows tau2-bench (``sierra-research/tau2-bench``) at commit ``a2c0247``, as written
down in the project's telecom specification (sections 1 and 6.4). This is the agent side of the
dual-control domain (the provider's customers, lines, bills...); the user's phone is a separate
database. It is kept as plain dicts and lists so that the tools
(`jaxagent.envs.tau2.domains.telecom.tools`) mutate it in place and `jaxagent.envs.tau2.db.db_hash`
reproduces tau2's hash byte for byte:

* five tables, ``plans`` / ``customers`` / ``lines`` / ``bills`` / ``devices`` (:data:`TABLES`, the
  dict's keys in that order, whatever the file's order), each a **list** of records in file order
  (tau2 looks records up by scanning, first match wins; new bills are appended at the end);
* every record holds every field of tau2's model, in tau2's canonical field order (:data:`PLAN_FIELDS`
  ... :data:`DEVICE_FIELDS`; nested addresses, payment methods and line items too), with tau2's
  defaults for fields the file omits (null dates and ids, ``0.0`` amounts, ``[]`` lists, ``False``
  flags, status ``Pending Activation`` / ``Pending Verification`` / ``Draft``);
* float fields are floats (``0`` in the file loads as ``0.0``); values written later by tools are
  stored as given (``set_data_usage(..., 15)`` keeps the int, which renders and hashes as ``15``);
* dates are strings ``YYYY-MM-DD`` and datetimes strings ``YYYY-MM-DD HH:MM:SS`` (a space, as tau2's
  ``json.dumps(..., default=str)`` writes Python datetimes, in tool output and in the hash), enums
  their string values, ``date_of_birth`` a plain string (tau2 does not parse it).

Quirk kept on purpose: a customer without ``created_at`` gets tau2's default, which is the *date*
2025-01-01 (pydantic does not validate defaults), so it renders ``"2025-01-01"`` without a time.

The unmodified packaged database hashes to
``304cf5ef059852e117ea801ab9a5efc24c9713ec887679dc2e30acceb4b6742d`` (:data:`INITIAL_HASH`).
:func:`load_db` parses ``db.toml`` (with :mod:`tomllib`) once per path and hands out an independent
copy on every call; a malformed file raises ``ValueError`` naming the file, the record, the field and
what was expected. The packaged data (``jaxagent/data/tau2_telecom``: ``db.toml``, ``user_db.toml``,
``policy.md``, ``tasks_train.json``, ``tool_schemas.json``, ...; MIT licence of Sierra Research) is
the default; ``env.tau2.data_dir`` points elsewhere.
"""

from __future__ import annotations

import datetime
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxagent.envs.tau2.db import data_file, load_canonical, read_task_file

__all__ = [
    "ACCOUNT_STATUSES", "ADDRESS_FIELDS", "BILL_FIELDS", "BILL_STATUSES", "CUSTOMER_FIELDS", "DB_FILE",
    "DEFAULT_CREATED_AT", "DEFAULT_DATA_DIR", "DEVICE_FIELDS", "DEVICE_TYPES", "INITIAL_HASH", "LINE_FIELDS",
    "LINE_ITEM_FIELDS", "LINE_STATUSES", "PAYMENT_METHOD_FIELDS", "PAYMENT_METHOD_TYPES", "PLAN_FIELDS",
    "POLICY_FILE", "TABLES", "TASK_FILES", "canonicalize_db", "load_db", "load_policy", "load_tasks", "parse_toml",
]

DEFAULT_DATA_DIR: Path = Path(__file__).resolve().parents[4] / "data" / "tau2_telecom"
"""The packaged copy of tau2's telecom data (``jaxagent/data/tau2_telecom``)."""

DB_FILE = "db.toml"
POLICY_FILE = "policy.md"
TASK_FILES = {"train": "tasks_train.json", "test": "tasks_test.json"}
"""Split -> task file. Only ``train`` ships (tau2's telecom test tasks are withheld for now); a
``tasks_test.json`` dropped in the data directory is picked up as the test split."""
INITIAL_HASH = "304cf5ef059852e117ea801ab9a5efc24c9713ec887679dc2e30acceb4b6742d"

TABLES: tuple[str, ...] = ("plans", "customers", "lines", "bills", "devices")
"""The top-level keys of the database, in this order; the file must have exactly these (any order)."""

PLAN_FIELDS: tuple[str, ...] = ("plan_id", "name", "data_limit_gb", "price_per_month", "data_refueling_price_per_gb")
ADDRESS_FIELDS: tuple[str, ...] = ("street", "city", "state", "zip_code")
PAYMENT_METHOD_FIELDS: tuple[str, ...] = ("method_type", "account_number_last_4", "expiration_date")
CUSTOMER_FIELDS: tuple[str, ...] = (
    "customer_id", "full_name", "date_of_birth", "email", "phone_number", "address", "account_status",
    "payment_methods", "line_ids", "bill_ids", "created_at", "last_extension_date", "goodwill_credit_used_this_year")
LINE_FIELDS: tuple[str, ...] = (
    "line_id", "phone_number", "status", "plan_id", "device_id", "data_used_gb", "data_refueling_gb",
    "roaming_enabled", "contract_end_date", "last_plan_change_date", "last_sim_replacement_date",
    "suspension_start_date")
LINE_ITEM_FIELDS: tuple[str, ...] = ("description", "amount", "date", "item_type")
BILL_FIELDS: tuple[str, ...] = (
    "bill_id", "customer_id", "period_start", "period_end", "issue_date", "total_due", "due_date", "line_items",
    "status")
DEVICE_FIELDS: tuple[str, ...] = (
    "device_id", "device_type", "model", "imei", "is_esim_capable", "activated", "activation_date",
    "last_esim_transfer_date")

ACCOUNT_STATUSES: tuple[str, ...] = ("Active", "Suspended", "Pending Verification", "Closed")
PAYMENT_METHOD_TYPES: tuple[str, ...] = ("Credit Card", "Debit Card", "PayPal")
LINE_STATUSES: tuple[str, ...] = ("Active", "Suspended", "Pending Activation", "Closed")
BILL_STATUSES: tuple[str, ...] = ("Draft", "Issued", "Awaiting Payment", "Paid", "Overdue", "Disputed")
DEVICE_TYPES: tuple[str, ...] = ("phone", "router", "tablet", "watch", "other")

DEFAULT_CREATED_AT = "2025-01-01"
"""A customer's ``created_at`` when the file omits it: tau2's default is the date 2025-01-01, stored
unvalidated, so it renders as a date (no time)."""


# --------------------------------------------------------------------------------------------------
# field converters: (value, where) -> canonical value, ValueError naming `where` otherwise

def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(where: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"{where} is {_describe(value)} ({type(value).__name__}); expected {expected}")


Converter = Callable[[Any, str], Any]
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _bad(where, value, "a string")
    return value


def _float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(where, value, "a number")
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(where, value, "true or false")
    return value


def _date(value: Any, where: str) -> str:
    """A date as ``YYYY-MM-DD``: a TOML date, or a string in that form."""
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, str) and _DATE.fullmatch(value):
        try:
            return datetime.date.fromisoformat(value).isoformat()
        except ValueError:
            pass
    raise _bad(where, value, "a date YYYY-MM-DD")


def _datetime(value: Any, where: str) -> str:
    """A datetime as Python's ``str`` writes it (``YYYY-MM-DD HH:MM:SS``): a TOML datetime, or an ISO
    string (``T`` or space; a bare date is midnight, as pydantic reads it)."""
    if isinstance(value, datetime.datetime):
        return str(value)
    if isinstance(value, str) and _DATE.match(value):
        try:
            return str(datetime.datetime.fromisoformat(value))
        except ValueError:
            pass
    raise _bad(where, value, "a datetime YYYY-MM-DDTHH:MM:SS")


def _enum(values: tuple[str, ...]) -> Converter:
    def convert(value: Any, where: str) -> str:
        if value not in values or not isinstance(value, str):
            raise _bad(where, value, "one of " + ", ".join(map(repr, values)))
        return value
    return convert


def _nullable(convert: Converter) -> Converter:
    def nullable(value: Any, where: str) -> Any:
        return None if value is None else convert(value, where)
    return nullable


def _list(convert: Converter) -> Converter:
    def convert_list(value: Any, where: str) -> list:
        if not isinstance(value, list):
            raise _bad(where, value, "a list")
        return [convert(item, f"{where}[{i}]") for i, item in enumerate(value)]
    return convert_list


_REQUIRED = object()
"""Marks a field the file must give (tau2's model has no default)."""

# record type -> field -> (converter, default or _REQUIRED); defaults are immutable or rebuilt per record
_Spec = dict[str, tuple[Converter, Any]]


def _record(spec: _Spec, kind: str) -> Converter:
    def convert(value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise _bad(where, value, f"a {kind} table with fields {list(spec)}")
        unknown = [k for k in value if k not in spec]
        missing = [k for k, (_, default) in spec.items() if k not in value and default is _REQUIRED]
        if unknown or missing:
            raise ValueError(f"{where}: unknown field(s) {unknown}, missing field(s) {missing}; "
                             f"a {kind} has the fields {list(spec)}")
        out = {}
        for field, (conv, default) in spec.items():
            if field in value:
                out[field] = conv(value[field], f"{where}: field {field!r}")
            else:
                out[field] = [] if isinstance(default, list) else default
        return out
    return convert


_ADDRESS: _Spec = {f: (_str, _REQUIRED) for f in ADDRESS_FIELDS}
_PAYMENT_METHOD: _Spec = {"method_type": (_enum(PAYMENT_METHOD_TYPES), _REQUIRED),
                          "account_number_last_4": (_str, _REQUIRED), "expiration_date": (_str, _REQUIRED)}
_LINE_ITEM: _Spec = {"description": (_str, _REQUIRED), "amount": (_float, _REQUIRED), "date": (_date, _REQUIRED),
                     "item_type": (_str, _REQUIRED)}
_SPECS: dict[str, tuple[str, _Spec]] = {
    "plans": ("plan", {
        "plan_id": (_str, _REQUIRED), "name": (_str, _REQUIRED), "data_limit_gb": (_float, _REQUIRED),
        "price_per_month": (_float, _REQUIRED), "data_refueling_price_per_gb": (_float, _REQUIRED)}),
    "customers": ("customer", {
        "customer_id": (_str, _REQUIRED), "full_name": (_str, _REQUIRED), "date_of_birth": (_str, _REQUIRED),
        "email": (_str, _REQUIRED), "phone_number": (_str, _REQUIRED),
        "address": (_record(_ADDRESS, "address"), _REQUIRED),
        "account_status": (_enum(ACCOUNT_STATUSES), "Pending Verification"),
        "payment_methods": (_list(_record(_PAYMENT_METHOD, "payment method")), []),
        "line_ids": (_list(_str), []), "bill_ids": (_list(_str), []),
        "created_at": (_datetime, DEFAULT_CREATED_AT), "last_extension_date": (_nullable(_date), None),
        "goodwill_credit_used_this_year": (_float, 0.0)}),
    "lines": ("line", {
        "line_id": (_str, _REQUIRED), "phone_number": (_str, _REQUIRED),
        "status": (_enum(LINE_STATUSES), "Pending Activation"), "plan_id": (_str, _REQUIRED),
        "device_id": (_nullable(_str), None), "data_used_gb": (_float, 0.0), "data_refueling_gb": (_float, 0.0),
        "roaming_enabled": (_bool, False), "contract_end_date": (_nullable(_date), None),
        "last_plan_change_date": (_nullable(_date), None), "last_sim_replacement_date": (_nullable(_date), None),
        "suspension_start_date": (_nullable(_date), None)}),
    "bills": ("bill", {
        "bill_id": (_str, _REQUIRED), "customer_id": (_str, _REQUIRED), "period_start": (_date, _REQUIRED),
        "period_end": (_date, _REQUIRED), "issue_date": (_date, _REQUIRED), "total_due": (_float, _REQUIRED),
        "due_date": (_date, _REQUIRED), "line_items": (_list(_record(_LINE_ITEM, "line item")), []),
        "status": (_enum(BILL_STATUSES), "Draft")}),
    "devices": ("device", {
        "device_id": (_str, _REQUIRED), "device_type": (_enum(DEVICE_TYPES), _REQUIRED), "model": (_str, _REQUIRED),
        "imei": (_nullable(_str), None), "is_esim_capable": (_bool, _REQUIRED), "activated": (_bool, False),
        "activation_date": (_nullable(_datetime), None), "last_esim_transfer_date": (_nullable(_datetime), None)}),
}
_FIELDS = {"plans": PLAN_FIELDS, "customers": CUSTOMER_FIELDS, "lines": LINE_FIELDS, "bills": BILL_FIELDS,
           "devices": DEVICE_FIELDS}
assert all(tuple(_SPECS[t][1]) == _FIELDS[t] for t in TABLES)
assert tuple(_ADDRESS) == ADDRESS_FIELDS and tuple(_PAYMENT_METHOD) == PAYMENT_METHOD_FIELDS
assert tuple(_LINE_ITEM) == LINE_ITEM_FIELDS

_ID_FIELDS = {"plans": "plan_id", "customers": "customer_id", "lines": "line_id", "bills": "bill_id",
              "devices": "device_id"}


def canonicalize_db(raw: Any, source: str = "db") -> dict:
    """Validate a parsed telecom ``db.toml`` and return it in canonical form (see the module docstring).

    Raises ``ValueError`` naming ``source``, the table, the record (index and id), the field and what
    was expected.
    """
    if not isinstance(raw, dict):
        raise ValueError(  # noqa: TRY004 (a bad file)
            f"{source}: the database must be a table with keys {list(TABLES)}, got {type(raw).__name__}")
    keys = list(raw)
    if sorted(keys) != sorted(TABLES):
        extra = [k for k in keys if k not in TABLES]
        missing = [k for k in TABLES if k not in raw]
        raise ValueError(f"{source}: top-level keys {keys} (unexpected {extra}, missing {missing}); "
                         f"expected exactly {list(TABLES)}, each an array of tables")
    db: dict[str, list[dict]] = {}
    for table in TABLES:
        records = raw[table]
        if not isinstance(records, list):
            raise ValueError(f"{source}: field {table!r} is a {type(records).__name__} "  # noqa: TRY004 (a bad file)
                             f"({_describe(records)}); expected an array of tables ([[{table}]])")
        kind, spec = _SPECS[table]
        convert = _record(spec, kind)
        out = []
        for i, record in enumerate(records):
            label = record.get(_ID_FIELDS[table]) if isinstance(record, dict) else None
            where = f"{source}: {table}[{i}]" + (f" ({label})" if isinstance(label, str) else "")
            out.append(convert(record, where))
        db[table] = out
    return db


def parse_toml(text: str, source: str) -> Any:
    """``text`` parsed as TOML (:mod:`tomllib`); ``ValueError`` naming ``source`` when it is not valid TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not valid TOML ({exc})") from exc


def _file(data_dir: str | Path | None, name: str) -> Path:
    return data_file(data_dir, DEFAULT_DATA_DIR, name, domain="telecom",
                     holds=(DB_FILE, POLICY_FILE, TASK_FILES["train"]))


def load_db(data_dir: str | Path | None = None) -> dict:
    """A fresh, independent canonical provider database from ``<data_dir>/db.toml`` (default: the
    packaged copy): ``{"plans": [...], "customers": [...], "lines": [...], "bills": [...],
    "devices": [...]}``.

    The file is parsed and validated once per path; every call returns a new deep copy, so tools may
    mutate it freely.
    """
    return load_canonical(_file(data_dir, DB_FILE), lambda raw, source: canonicalize_db(raw, source=source),
                          parse=parse_toml)


def load_tasks(data_dir: str | Path | None = None, split: str = "train") -> list[dict]:
    """The raw task dicts of a split's file (``train``: tau2's 74 telecom train tasks)."""
    if split not in TASK_FILES:
        raise ValueError(f"split={split!r}: expected one of {', '.join(map(repr, TASK_FILES))}")
    return read_task_file(_file(data_dir, TASK_FILES[split]))


def load_policy(data_dir: str | Path | None = None) -> str:
    """The agent policy text ``<data_dir>/policy.md``, verbatim."""
    return _file(data_dir, POLICY_FILE).read_text(encoding="utf-8")

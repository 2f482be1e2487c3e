"""The tau2-bench retail database: loading and canonical form (host code, no jax).

Behaviour follows tau2-bench (``sierra-research/tau2-bench``) at commit ``a2c0247``, as written
down in the project's retail specification (sections 1 and 4.2). The database is kept as nested
plain dicts and lists — exactly the JSON objects of ``db.json`` — so that the tools
(`jaxagent.envs.tau2.domains.retail.tools`) mutate it in place and `jaxagent.envs.tau2.db.db_hash`
reproduces tau2's hash byte for byte:

* three tables, ``products`` / ``users`` / ``orders``, each a map id -> record, in file order (user
  searches and item lookups scan in that order; rendering keeps it);
* every order carries all 14 fields in the canonical order of :data:`ORDER_FIELDS`; the seven
  optional ones (:data:`ORDER_OPTIONAL_FIELDS`) are absent from ``db.json`` and are added as
  ``None`` on load, as tau2's pydantic model does;
* numbers stay as they are parsed (floats in the file; a tool may store an integer 0, which hashes
  differently from 0.0, as in tau2).

:func:`load_db` parses a file once per path (the cache is keyed by the resolved path, size and
modification time) and hands out an independent copy on every call, cheap enough for one per
episode. The packaged data (``jaxagent/data/tau2_retail``: ``db.json``, ``policy.md``,
``tasks_train.json``, MIT licence of Sierra Research) is the default; ``env.tau2.data_dir`` in a
config points elsewhere. (``tool_schemas.json``, tau2's tool schemas, lives there too but always
comes from the package: it describes the implemented tools, see :mod:`.tools`.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxagent.envs.tau2.db import check_tables, data_file, load_canonical, read_task_file

__all__ = ["DB_FILE", "DEFAULT_DATA_DIR", "ORDER_FIELDS", "ORDER_OPTIONAL_FIELDS", "ORDER_REQUIRED_FIELDS",
           "ORDER_STATUSES", "POLICY_FILE", "TABLES", "TASKS_FILE", "canonicalize_db", "load_db", "load_policy",
           "load_tasks"]

DEFAULT_DATA_DIR: Path = Path(__file__).resolve().parents[4] / "data" / "tau2_retail"
"""The packaged copy of tau2's retail data (``jaxagent/data/tau2_retail``)."""

DB_FILE = "db.json"
POLICY_FILE = "policy.md"
TASKS_FILE = "tasks_train.json"

TABLES: tuple[str, ...] = ("products", "users", "orders")
"""The top-level keys of the database, in file order; no others are accepted."""

ORDER_REQUIRED_FIELDS: tuple[str, ...] = (
    "order_id", "user_id", "address", "items", "status", "fulfillments", "payment_history")
ORDER_OPTIONAL_FIELDS: tuple[str, ...] = (
    "cancel_reason", "exchange_items", "exchange_new_items", "exchange_payment_method_id",
    "exchange_price_difference", "return_items", "return_payment_method_id")
"""The seven order fields that are ``None`` until a tool sets them (absent from ``db.json``)."""
ORDER_FIELDS: tuple[str, ...] = ORDER_REQUIRED_FIELDS + ORDER_OPTIONAL_FIELDS
"""All 14 order fields in tau2's canonical (rendering) order."""

ORDER_STATUSES: tuple[str, ...] = (
    "pending", "processed", "delivered", "cancelled", "pending (item modified)", "exchange requested",
    "return requested")

def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def canonicalize_db(raw: Any, source: str = "db") -> dict:
    """Validate a parsed ``db.json`` and return it in canonical form (orders get all 14 fields).

    The three tables keep their insertion order; each order is rebuilt with the fields in
    :data:`ORDER_FIELDS` order, the optional ones set to ``None`` where absent. Raises ``ValueError``
    naming the field, the value found and what was expected.
    """
    check_tables(raw, TABLES, source)
    orders: dict[str, dict] = {}
    for order_id, order in raw["orders"].items():
        where = f"{source}: orders[{order_id!r}]"
        if not isinstance(order, dict):
            raise ValueError(f"{where} is {_describe(order)}; expected an order object")  # noqa: TRY004 (a bad file)
        unknown = [k for k in order if k not in ORDER_FIELDS]
        if unknown:
            raise ValueError(f"{where} has unknown field(s) {unknown}; expected only {list(ORDER_FIELDS)}")
        missing = [k for k in ORDER_REQUIRED_FIELDS if k not in order]
        if missing:
            raise ValueError(f"{where} lacks the field(s) {missing}; every order needs "
                             f"{list(ORDER_REQUIRED_FIELDS)}")
        if order["status"] not in ORDER_STATUSES:
            raise ValueError(f"{where}: field 'status' is {_describe(order['status'])}; expected one of "
                             f"{list(ORDER_STATUSES)}")
        orders[order_id] = {field: order.get(field) for field in ORDER_FIELDS}
    return {"products": raw["products"], "users": raw["users"], "orders": orders}


def _file(data_dir: str | Path | None, name: str) -> Path:
    return data_file(data_dir, DEFAULT_DATA_DIR, name, domain="retail", holds=(DB_FILE, POLICY_FILE, TASKS_FILE))


def load_db(data_dir: str | Path | None = None) -> dict:
    """A fresh, independent canonical database from ``<data_dir>/db.json`` (default: the packaged copy).

    The file is parsed and validated once per path; every call returns a new deep copy (about 10 ms),
    so tools may mutate it freely.
    """
    return load_canonical(_file(data_dir, DB_FILE), lambda raw, source: canonicalize_db(raw, source=source))


def load_tasks(data_dir: str | Path | None = None) -> list[dict]:
    """The raw task dicts of ``<data_dir>/tasks_train.json`` (tau2's train split, 74 tasks)."""
    return read_task_file(_file(data_dir, TASKS_FILE))


def load_policy(data_dir: str | Path | None = None) -> str:
    """The agent policy text ``<data_dir>/policy.md``, verbatim."""
    return _file(data_dir, POLICY_FILE).read_text(encoding="utf-8")

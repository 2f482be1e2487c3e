"""The tau2-bench airline database: loading and canonical form (host code, no jax).

Behaviour follows tau2-bench (``sierra-research/tau2-bench``) at commit ``a2c0247``, as written
down in the project's airline specification (sections 1 and 5.2). The database is kept as nested
plain dicts and lists, the JSON objects of ``db.json``, so that the tools
(`jaxagent.envs.tau2.domains.airline.tools`) mutate it in place and `jaxagent.envs.tau2.db.db_hash`
reproduces tau2's hash byte for byte:

* three tables, ``flights`` / ``users`` / ``reservations``, each a map id -> record, in file order
  (flight searches scan flights in that order; new reservations are appended at the end);
* records are rebuilt in tau2's canonical field order (the order its models render): a flight is
  ``flight_number, origin, destination, scheduled_departure_time_est, scheduled_arrival_time_est,
  dates`` (the file has origin first), a reservation segment ``flight_number, origin, destination,
  date, price``, and every reservation gets ``status: None`` at the end (absent from ``db.json``;
  tau2's model defaults it, and it is part of the rendered record and of the hash);
* numbers stay as parsed (prices, seats and payment amounts ints; gift-card and certificate amounts
  floats).

The unmodified packaged database hashes to
``124e39a664b56402bcd09cb8a6a9cece6acb8462337c969799d5658e3250f263`` (:data:`INITIAL_HASH`).
:func:`load_db` parses a file once per path and hands out an independent copy on every call. The
packaged data (``jaxagent/data/tau2_airline``: ``db.json``, ``policy.md``, ``tasks_train.json``,
``tool_schemas.json``; MIT licence of Sierra Research) is the default; ``env.tau2.data_dir`` points
elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxagent.envs.tau2.db import check_tables, data_file, load_canonical, read_task_file

__all__ = ["DB_FILE", "DEFAULT_DATA_DIR", "FLIGHT_FIELDS", "INITIAL_HASH", "POLICY_FILE", "RESERVATION_FIELDS",
           "SEGMENT_FIELDS", "TABLES", "TASK_FILES", "canonicalize_db", "load_db", "load_policy", "load_tasks"]

DEFAULT_DATA_DIR: Path = Path(__file__).resolve().parents[4] / "data" / "tau2_airline"
"""The packaged copy of tau2's airline data (``jaxagent/data/tau2_airline``)."""

DB_FILE = "db.json"
POLICY_FILE = "policy.md"
TASK_FILES = {"train": "tasks_train.json", "test": "tasks_test.json"}
"""Split -> task file. Only ``train`` ships (tau2's 20 airline test tasks are withheld for now); a
``tasks_test.json`` dropped in the data directory is picked up as the test split."""
INITIAL_HASH = "124e39a664b56402bcd09cb8a6a9cece6acb8462337c969799d5658e3250f263"

TABLES: tuple[str, ...] = ("flights", "users", "reservations")
"""The top-level keys of the database, in file order; no others are accepted."""
FLIGHT_FIELDS: tuple[str, ...] = ("flight_number", "origin", "destination", "scheduled_departure_time_est",
                                  "scheduled_arrival_time_est", "dates")
SEGMENT_FIELDS: tuple[str, ...] = ("flight_number", "origin", "destination", "date", "price")
RESERVATION_REQUIRED_FIELDS: tuple[str, ...] = (
    "reservation_id", "user_id", "origin", "destination", "flight_type", "cabin", "flights", "passengers",
    "payment_history", "created_at", "total_baggages", "nonfree_baggages", "insurance")
RESERVATION_FIELDS: tuple[str, ...] = RESERVATION_REQUIRED_FIELDS + ("status",)
"""All 14 reservation fields in tau2's canonical (rendering) order; ``status`` is None unless cancelled."""


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _reorder(record: Any, fields: tuple[str, ...], where: str, *, optional: tuple[str, ...] = ()) -> dict:
    """``record`` with exactly ``fields`` in that order (those in ``optional`` None when absent);
    ValueError naming the record and the field otherwise."""
    if not isinstance(record, dict):
        raise ValueError(f"{where} is {_describe(record)}; expected an object with fields {list(fields)}")  # noqa: TRY004
    unknown = [k for k in record if k not in fields]
    missing = [k for k in fields if k not in record and k not in optional]
    if unknown or missing:
        raise ValueError(f"{where}: unknown field(s) {unknown}, missing field(s) {missing}; expected {list(fields)}")
    return {f: record.get(f) for f in fields}


def canonicalize_db(raw: Any, source: str = "db") -> dict:
    """Validate a parsed airline ``db.json`` and return it in canonical form (see the module docstring).

    Raises ``ValueError`` naming the table, the record, the field and what was expected.
    """
    check_tables(raw, TABLES, source)
    flights = {}
    for number, flight in raw["flights"].items():
        where = f"{source}: flights[{number!r}]"
        flight = _reorder(flight, FLIGHT_FIELDS, where)
        if flight["flight_number"] != number:
            raise ValueError(f"{where}: field 'flight_number' is {_describe(flight['flight_number'])}; expected "
                             f"its key {number!r}")
        if not isinstance(flight["dates"], dict):
            raise ValueError(f"{where}: field 'dates' is {_describe(flight['dates'])}; expected an object "  # noqa: TRY004
                             "mapping YYYY-MM-DD to a date status")
        flights[number] = flight
    reservations = {}
    for rid, res in raw["reservations"].items():
        where = f"{source}: reservations[{rid!r}]"
        res = _reorder(res, RESERVATION_FIELDS, where, optional=("status",))
        if res["status"] not in (None, "cancelled"):
            raise ValueError(f"{where}: field 'status' is {_describe(res['status'])}; expected null or 'cancelled'")
        if not isinstance(res["flights"], list):
            raise ValueError(f"{where}: field 'flights' is {_describe(res['flights'])}; expected a list")  # noqa: TRY004
        res["flights"] = [_reorder(s, SEGMENT_FIELDS, f"{where}.flights[{j}]") for j, s in enumerate(res["flights"])]
        reservations[rid] = res
    return {"flights": flights, "users": raw["users"], "reservations": reservations}


def _file(data_dir: str | Path | None, name: str) -> Path:
    return data_file(data_dir, DEFAULT_DATA_DIR, name, domain="airline",
                     holds=(DB_FILE, POLICY_FILE, TASK_FILES["train"]))


def load_db(data_dir: str | Path | None = None) -> dict:
    """A fresh, independent canonical database from ``<data_dir>/db.json`` (default: the packaged copy).

    The file is parsed and validated once per path; every call returns a new deep copy, so tools may
    mutate it freely.
    """
    return load_canonical(_file(data_dir, DB_FILE), lambda raw, source: canonicalize_db(raw, source=source))


def load_tasks(data_dir: str | Path | None = None, split: str = "train") -> list[dict]:
    """The raw task dicts of a split's file (``train``: tau2's 30 airline train tasks)."""
    if split not in TASK_FILES:
        raise ValueError(f"split={split!r}: expected one of {', '.join(map(repr, TASK_FILES))}")
    return read_task_file(_file(data_dir, TASK_FILES[split]))


def load_policy(data_dir: str | Path | None = None) -> str:
    """The agent policy text ``<data_dir>/policy.md``, verbatim."""
    return _file(data_dir, POLICY_FILE).read_text(encoding="utf-8")

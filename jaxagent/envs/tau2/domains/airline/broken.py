"""The broken variants of tau2 airline's oracle: plans that must score 0 (`jaxagent.envs.tau2.agents`).

For a task: ``wrong_argument`` (one gold write with one argument changed so that the call still
succeeds and the end state differs: another reservation of the user cancelled, another payment
method, cabin, baggage count, passenger birth date or certificate amount), ``missing_write`` (one
gold write left out) and ``extra_write`` (an extra successful write: a reservation of the user
that the gold writes leave alone cancelled (those the scenario names first, then those the gold
actions look up), else one of
the user's reservations given one more checked bag, else a certificate sent to the user; made
right after the last gold write, or first on a task whose gold writes change nothing). Each is
checked by replay on a fresh database; a variant that cannot be built for a task is absent from
the result. The 17 train tasks whose goal is to change nothing have no write to change or leave
out, so ``extra_write`` is their one variant.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxagent.envs.base import AgentMessage
from jaxagent.envs.tau2.agents import derive_broken_plans
from jaxagent.envs.tau2.domains.airline.customer import reservation_ids
from jaxagent.envs.tau2.domains.airline.tools import CABINS, WRITE_TOOLS
from jaxagent.envs.tau2.domains.retail.customer import identity_of
from jaxagent.envs.tau2.tasks import Action, Task


def _owner(args: Mapping[str, Any], db: Mapping[str, Any]) -> dict | None:
    rid = args.get("reservation_id")
    res = db["reservations"].get(rid) if isinstance(rid, str) else None
    uid = res["user_id"] if res else args.get("user_id")
    return db["users"].get(uid) if isinstance(uid, str) else None


def _other_dob(dob: str) -> str:
    return "1990-01-01" if dob != "1990-01-01" else "1991-01-01"


def _candidates(a: Action, db: Mapping[str, Any], written: set[str]) -> list[dict[str, Any]]:
    """Argument changes to try for ``a`` (each a full argument dict), most natural first."""
    args, out = dict(a.arguments), []
    user = _owner(args, db)
    methods = list(user["payment_methods"].values()) if user else []
    if a.name == "cancel_reservation" and user:
        out += [dict(args, reservation_id=r) for r in user["reservations"] if r not in written]
    if "payment_id" in args:
        out += [dict(args, payment_id=m["id"]) for m in methods
                if m["id"] != args["payment_id"] and m["source"] != "certificate"]
    if a.name == "update_reservation_flights":
        out += [dict(args, cabin=c) for c in CABINS if c != args.get("cabin")]
    if isinstance(args.get("total_baggages"), int):
        out.append(dict(args, total_baggages=args["total_baggages"] + 1))
    if isinstance(args.get("nonfree_baggages"), int) and a.name == "update_reservation_baggages":
        out.append(dict(args, nonfree_baggages=args["nonfree_baggages"] + 1))
    passengers = args.get("passengers")
    if isinstance(passengers, list) and passengers and isinstance(passengers[0], Mapping):
        first = dict(passengers[0], dob=_other_dob(str(passengers[0].get("dob"))))
        out.append(dict(args, passengers=[first, *passengers[1:]]))
    if a.name == "send_certificate" and isinstance(args.get("amount"), (int, float)):
        out.append(dict(args, amount=args["amount"] + 50))
    return out


def _extras(task: Task, db: Mapping[str, Any], user_id: str, written: set[str]) -> list[Action]:
    """Extra writes to try for the user, most natural first (see the module docstring)."""
    user = db["users"][user_id]
    theirs = [r for r in user["reservations"] if r not in written]
    scen = " ".join(str(task.instructions.get(f) or "") for f in ("reason_for_call", "known_info", "task_instructions"))
    named = [r for r in reservation_ids(scen) if r in theirs]
    read = [a.arguments.get("reservation_id") for a in task.actions if a.name == "get_reservation_details"]
    live = [r for r in theirs if db["reservations"][r]["status"] is None]
    order = list(dict.fromkeys(named + [r for r in read if r in theirs] + live + theirs))
    out = [Action("extra", "cancel_reservation", {"reservation_id": r}) for r in order]
    pay = next((m["id"] for m in user["payment_methods"].values() if m["source"] != "certificate"), None)
    if pay is not None:
        for r in order:
            res = db["reservations"][r]
            out.append(Action("extra", "update_reservation_baggages", {
                "reservation_id": r, "total_baggages": res["total_baggages"] + 1,
                "nonfree_baggages": res["nonfree_baggages"], "payment_id": pay}))
    out.append(Action("extra", "send_certificate", {"user_id": user_id, "amount": 100}))
    return out


def broken_plans(task: Task, data_dir: str | Path | None = None) -> dict[str, list[AgentMessage]]:
    """``{variant: turns}`` for the variants of `BROKEN_VARIANTS` this task admits, each verified
    by replay to end in a database other than the gold target (`derive_broken_plans` over airline's
    candidates; see the module docstring)."""
    written = {a.arguments.get("reservation_id") for a in task.actions if a.name in WRITE_TOOLS}
    user_id = identity_of(task).user_id

    def extras(db: Mapping[str, Any]) -> list[Action]:
        return _extras(task, db, user_id, written) if user_id is not None and user_id in db["users"] else []

    return derive_broken_plans(task, data_dir, candidates=lambda a, db: _candidates(a, db, written), extras=extras)


__all__ = ["broken_plans"]

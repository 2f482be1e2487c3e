"""The broken variants of tau2 retail's oracle: plans that must score 0 (`jaxagent.envs.tau2.agents`).

For a task: ``wrong_argument`` (one gold write with one argument changed so that the call still
succeeds and the end state differs: another cancel reason, zip, payment method, variant or
returned item), ``missing_write`` (one gold write left out) and ``extra_write`` (an extra
successful write: the customer's profile address changed, or else one of their pending orders the
task leaves alone cancelled; made right after the last gold write). Each is checked by replay on a
fresh database; a variant that cannot be built for a task is absent from the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxagent.envs.base import AgentMessage
from jaxagent.envs.tau2.agents import derive_broken_plans
from jaxagent.envs.tau2.domains.retail.customer import identity_of
from jaxagent.envs.tau2.domains.retail.tools import CANCEL_REASONS, execute
from jaxagent.envs.tau2.scoring import initial_db
from jaxagent.envs.tau2.tasks import Action, Task


def _candidates(a: Action, db: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Argument changes to try for ``a`` (each a full argument dict), most natural first."""
    args, out = dict(a.arguments), []
    if "reason" in args:
        out += [dict(args, reason=r) for r in CANCEL_REASONS if r != args["reason"]]
    if "zip" in args:
        out.append(dict(args, zip="99999" if args["zip"] != "99999" else "11111"))
    order = db["orders"].get(args.get("order_id")) if isinstance(args.get("order_id"), str) else None
    owner = order["user_id"] if order else args.get("user_id")
    user = db["users"].get(owner) if isinstance(owner, str) else None
    if "payment_method_id" in args and user:
        out += [dict(args, payment_method_id=p) for p in user["payment_methods"] if p != args["payment_method_id"]]
    if args.get("new_item_ids") and order:
        old = args["item_ids"][0]
        pid = next((it["product_id"] for it in order["items"] if it["item_id"] == old), None)
        if pid:
            for vid, v in db["products"][pid]["variants"].items():
                if v["available"] and vid not in (old, args["new_item_ids"][0]):
                    out.append(dict(args, new_item_ids=[vid, *args["new_item_ids"][1:]]))
    if a.name == "return_delivered_order_items" and order:
        if len(args["item_ids"]) > 1:
            out.append(dict(args, item_ids=args["item_ids"][:-1]))
        out += [dict(args, item_ids=[it["item_id"]]) for it in order["items"] if it["item_id"] not in args["item_ids"]]
        out.append(dict(args, item_ids=[]))
    return out


def _extras(task: Task, db: Mapping[str, Any], data_dir: str | Path | None) -> list[Action]:
    """Extra writes to try, most natural first: the customer's profile address changed, then each of
    their pending orders the task leaves alone cancelled (the customer found by the gold lookups'
    arguments, else by the lookups their identity allows)."""
    me = identity_of(task)
    user_id = me.user_id
    if user_id is None:
        probe = initial_db(task, data_dir)
        for name, args in (("find_user_id_by_email", {"email": me.email}),
                           ("find_user_id_by_name_zip", {"first_name": me.first_name, "last_name": me.last_name,
                                                         "zip": me.zip})):
            res = execute(probe, name, args)
            if not res.error:
                user_id = res.content
                break
    if user_id is None or user_id not in db["users"]:
        return []
    touched = {a.arguments.get("order_id") for a in task.actions}
    extras = [Action("extra", "modify_user_address", {"user_id": user_id, "address1": "1 Nowhere Lane",
                                                        "address2": "", "city": "Springfield", "state": "IL",
                                                        "country": "USA", "zip": "62701"})]
    return extras + [Action("extra", "cancel_pending_order", {"order_id": o, "reason": "ordered by mistake"})
                     for o in db["users"][user_id]["orders"]
                     if o not in touched and db["orders"][o]["status"] == "pending"]


def broken_plans(task: Task, data_dir: str | Path | None = None) -> dict[str, list[AgentMessage]]:
    """``{variant: turns}`` for the variants of `BROKEN_VARIANTS` this task admits, each verified
    by replay to end in a database other than the gold target (`derive_broken_plans` over retail's
    candidates; see the module docstring)."""
    return derive_broken_plans(task, data_dir, candidates=_candidates, extras=lambda db: _extras(task, db, data_dir))


__all__ = ["broken_plans"]

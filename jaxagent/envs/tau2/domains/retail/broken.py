"""The broken variants of tau2 retail's oracle: plans that must score 0 (`jaxagent.envs.tau2.agents`).

For a task: ``wrong_argument`` (one gold write with one argument changed so that the call still
succeeds and the end state differs: another cancel reason, zip, payment method, variant or
returned item), ``missing_write`` (one gold write left out) and ``extra_write`` (an extra
successful write: the customer's profile address changed, or else one of their pending orders the
task leaves alone cancelled; made right after the last gold write). Each is checked by replay on a
fresh database; a variant that cannot be built for a task is absent from the result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxagent.envs.base import AgentMessage
from jaxagent.envs.tau2.agents import plan_for
from jaxagent.envs.tau2.db import db_hash
from jaxagent.envs.tau2.domains.retail.customer import identity_of
from jaxagent.envs.tau2.domains.retail.tools import CANCEL_REASONS, WRITE_TOOLS, execute
from jaxagent.envs.tau2.scoring import initial_db, target_hash
from jaxagent.envs.tau2.tasks import Action, Task


def _replay_hash(task: Task, actions: Sequence[Action], data_dir) -> tuple[str, list[bool]]:
    db = initial_db(task, data_dir)
    ok = [not execute(db, a.name, dict(a.arguments)).error for a in actions]
    return db_hash(db), ok


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


def broken_plans(task: Task, data_dir: str | Path | None = None) -> dict[str, list[AgentMessage]]:
    """``{variant: turns}`` for the variants of `BROKEN_VARIANTS` this task admits, each verified
    by replay to end in a database other than the gold target (see the module docstring)."""
    target = target_hash(task, data_dir)
    acts = list(task.actions)
    writes = [i for i, a in enumerate(acts) if a.name in WRITE_TOOLS]
    _, gold_ok = _replay_hash(task, acts, data_dir)
    out: dict[str, list[AgentMessage]] = {}
    db0 = initial_db(task, data_dir)
    for i in writes:
        if "wrong_argument" in out:
            break
        for args in _candidates(acts[i], db0):
            wrong = dataclasses.replace(acts[i], arguments=args)
            changed = acts[:i] + [wrong] + acts[i + 1:]
            h, ok = _replay_hash(task, changed, data_dir)
            if ok[i] and h != target:
                out["wrong_argument"] = plan_for(task, changed, unconfirmed=[wrong])
                break
    for i in writes:
        if not gold_ok[i]:
            continue
        kept = acts[:i] + acts[i + 1:]
        if _replay_hash(task, kept, data_dir)[0] != target:
            out["missing_write"] = plan_for(task, kept)
            break
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
    if user_id is not None and user_id in db0["users"]:
        touched = {a.arguments.get("order_id") for a in acts}
        extras = [Action("extra", "modify_user_address", {"user_id": user_id, "address1": "1 Nowhere Lane",
                                                            "address2": "", "city": "Springfield", "state": "IL",
                                                            "country": "USA", "zip": "62701"})]
        extras += [Action("extra", "cancel_pending_order", {"order_id": o, "reason": "ordered by mistake"})
                   for o in db0["users"][user_id]["orders"]
                   if o not in touched and db0["orders"][o]["status"] == "pending"]
        # The extra write goes right after the last gold write (the customer is not consulted between
        # a tool call and the next message), or first when the goal holds from the start (the
        # customer would end the episode at the agent's first message).
        at = 0 if target == db_hash(db0) else max(writes, default=-1) + 1
        for extra in extras:
            changed = acts[:at] + [extra] + acts[at:]
            h, ok = _replay_hash(task, changed, data_dir)
            if ok[at] and h != target:
                out["extra_write"] = plan_for(task, changed, unconfirmed=[extra])
                break
    return out


__all__ = ["broken_plans"]

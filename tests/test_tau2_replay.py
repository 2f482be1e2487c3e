"""Property tests of the tau2 retail database under arbitrary tool-call sequences: the live state
equals tau2's evaluator state (a fresh database with the recorded writes re-executed, each
output equal to the recorded one), failing calls change nothing, and the hash moves only with a
successful write. Calls are drawn over real records of three users (pending, delivered and
processed orders, gift cards, another user's ids, invalid values) so that most paths of the write
tools are reached: successes, every check's failure, and chains (a modification after a
modification, a payment change after an item change...)."""

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxagent.envs.tau2.db import db_hash
from jaxagent.envs.tau2.domains.retail.db import load_db
from jaxagent.envs.tau2.scoring import ReplayMismatch, replay_db
from jaxagent.envs.tau2.tasks import load_task_set
from jaxagent.envs.tau2.domains.retail.tools import WRITE_TOOLS, execute

USERS = ("raj_sanchez_2970", "emma_smith_8564", "olivia_ito_3591")


@functools.cache
def pools():
    db = load_db()
    orders = [o for u in USERS for o in db["users"][u]["orders"]] + ["#W0000000", "W2417020"]
    items, variants = {}, {}
    for o in orders:
        items[o] = [it["item_id"] for it in db["orders"].get(o, {"items": []})["items"]]
        for it in db["orders"].get(o, {"items": []})["items"]:
            variants[it["item_id"]] = sorted(db["products"][it["product_id"]]["variants"])
    pms = [p for u in USERS for p in db["users"][u]["payment_methods"]] + ["credit_card_0000000"]
    owner_pms = {o: list(db["users"][db["orders"][o]["user_id"]]["payment_methods"]) for o in orders if o in db["orders"]}
    return {"order_id": sorted(set(orders)), "items": items, "variants": variants, "owner_pms": owner_pms,
            "all_items": sorted(variants), "payment_method_id": pms, "user_id": list(USERS) + ["nobody_0000"],
            "reason": ["no longer needed", "ordered by mistake", "changed my mind"]}


def _pm(draw, order):
    """A payment method for a call on ``order``: mostly one of its owner's, sometimes any."""
    p = pools()
    own = p["owner_pms"].get(order) or p["payment_method_id"]
    return draw(st.sampled_from(own if draw(st.integers(0, 4)) else p["payment_method_id"]))


def _items(draw, order):
    """Item ids for a call on ``order``: mostly its own (duplicates possible), sometimes any."""
    p = pools()
    own = p["items"].get(order) or p["all_items"]
    source = own if draw(st.integers(0, 4)) else p["all_items"]
    return draw(st.lists(st.sampled_from(source), min_size=0, max_size=2))


@st.composite
def call(draw):
    p = pools()
    name = draw(st.sampled_from(sorted(WRITE_TOOLS) + ["get_order_details", "get_user_details", "calculate"]))
    pick = lambda k: draw(st.sampled_from(p[k]))
    addr = {"address1": draw(st.sampled_from(["1 Main St", "22 Oak Ave"])), "address2": "", "city": "Austin",
            "state": "TX", "country": "USA", "zip": draw(st.sampled_from(["78701", "10001"]))}
    if name == "cancel_pending_order":
        args = {"order_id": pick("order_id"), "reason": pick("reason")}
    elif name == "modify_pending_order_address":
        args = {"order_id": pick("order_id"), **addr}
    elif name == "modify_user_address":
        args = {"user_id": pick("user_id"), **addr}
    elif name == "modify_pending_order_payment":
        order = pick("order_id")
        args = {"order_id": order, "payment_method_id": _pm(draw, order)}
    elif name in ("modify_pending_order_items", "exchange_delivered_order_items"):
        order = pick("order_id")
        old = _items(draw, order)
        new = [draw(st.sampled_from(p["variants"][i])) for i in old]  # same product (may be unavailable)
        if old and draw(st.integers(0, 5)) == 0:  # sometimes unequal lengths
            new = new[:-1]
        args = {"order_id": order, "item_ids": old, "new_item_ids": new, "payment_method_id": _pm(draw, order)}
    elif name == "return_delivered_order_items":
        order = pick("order_id")
        args = {"order_id": order, "item_ids": _items(draw, order), "payment_method_id": _pm(draw, order)}
    elif name == "get_order_details":
        args = {"order_id": pick("order_id")}
    elif name == "get_user_details":
        args = {"user_id": pick("user_id")}
    else:
        args = {"expression": draw(st.sampled_from(["1 + 2", "10 / 4", "2 *"]))}
    return name, args


TASK = load_task_set()["57"]  # a task with no initial state; its gold target is the initial DB


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(call(), min_size=1, max_size=8))
def test_live_state_equals_tau2_replay_and_failures_change_nothing(seq):
    db = load_db()
    h0 = db_hash(db)
    recorded, wrote = [], False
    for name, args in seq:
        before = db_hash(db)
        res = execute(db, name, args)
        recorded.append({"name": name, "arguments": args, "content": res.content, "error": res.error})
        if res.error or name not in WRITE_TOOLS:
            assert db_hash(db) == before, (name, args, res.content)
        wrote |= (not res.error and name in WRITE_TOOLS)
    live = db_hash(db)
    assert db_hash(replay_db(TASK, recorded)) == live
    # the writes that failed can be dropped from the replay: same end state
    assert db_hash(replay_db(TASK, [c for c in recorded if not c["error"]])) == live
    if not wrote:
        assert live == h0


def test_replay_mismatch_is_reported():
    db = load_db()
    args = {"order_id": "#W4566809", "reason": "no longer needed"}
    res = execute(db, "cancel_pending_order", args)
    assert not res.error
    forged = [{"name": "cancel_pending_order", "arguments": args, "content": res.content.replace("cancelled", "pending")}]
    with pytest.raises(ReplayMismatch, match="call 0 \\(cancel_pending_order\\)"):
        replay_db(TASK, forged)
    assert db_hash(replay_db(TASK, forged, strict=False)) == db_hash(db)

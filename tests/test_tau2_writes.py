"""tau2 retail tools that write: effects computed by hand (float rounding points, tau2's quirks),
the state machine, rendering, schemas, and a replay of every train task's gold actions."""

import hashlib
import inspect
import json

import pytest

from jaxagent.envs.tau2.domains.retail.db import DEFAULT_DATA_DIR, ORDER_FIELDS, load_db, load_tasks
from jaxagent.envs.tau2.db import db_hash
from jaxagent.envs.tau2.domains.retail.tools import RetailTools, TOOL_NAMES, TOOL_SCHEMAS_FILE, WRITE_TOOLS, check_tool_schemas, execute, tool_schemas
from jaxagent.envs.tau2.tools import render

from tests.tau2_tools_helpers import (ADDRESS, call, CC_PENDING, DELIVERED, E, EXCHANGE, GC_PENDING, HARPER_CC,
                                      HOSES, INITIAL_HASH, KEYBOARD, LIAM_CC, MODIFY_ITEMS, MULTI, ok, OLIVIA_CC,
                                      OLIVIA_GC, OMAR_CC, OMAR_GC, PET_BED, RETURN, SOPHIA_CC, SOPHIA_GC, VACUUM)
from tests.tau2_tools_helpers import db, initial_db  # noqa: F401 (pytest fixtures)


# ------------------------------------------------------------------------------------------------
# write effects, computed by hand from db.json


def test_cancel_refunds_to_gift_card(db):
    order = ok(db, "cancel_pending_order", order_id=GC_PENDING, reason="no longer needed")
    assert order["payment_history"] == [
        {"transaction_type": "payment", "amount": 585.97, "payment_method_id": OLIVIA_GC},
        {"transaction_type": "refund", "amount": 585.97, "payment_method_id": OLIVIA_GC}]
    assert (order["status"], order["cancel_reason"]) == ("cancelled", "no longer needed")
    assert db["users"]["olivia_lopez_9494"]["payment_methods"][OLIVIA_GC]["balance"] == round(35.0 + 585.97, 2)
    assert db["orders"][GC_PENDING]["payment_history"] == order["payment_history"]
    # the refunded balance is rounded: 44.0 + 109.27 is 153.26999999999998 in plain float arithmetic
    ok(db, "cancel_pending_order", order_id="#W9373487", reason="no longer needed")
    assert repr(db["users"][db["orders"]["#W9373487"]["user_id"]]["payment_methods"]["gift_card_7711863"]
                ["balance"]) == "153.27"


def test_cancel_after_payment_change_refunds_every_entry(db):
    ok(db, "modify_pending_order_payment", order_id=GC_PENDING, payment_method_id=OLIVIA_CC)
    gift = db["users"]["olivia_lopez_9494"]["payment_methods"][OLIVIA_GC]
    assert gift["balance"] == round(35.0 + 585.97, 2) == 620.97
    order = ok(db, "cancel_pending_order", order_id=GC_PENDING, reason="no longer needed")
    kinds = [(p["transaction_type"], p["payment_method_id"]) for p in order["payment_history"]]
    assert kinds == [("payment", OLIVIA_GC), ("payment", OLIVIA_CC), ("refund", OLIVIA_GC),
                     ("refund", OLIVIA_GC), ("refund", OLIVIA_CC), ("refund", OLIVIA_GC)]
    assert all(p["amount"] == 585.97 for p in order["payment_history"])
    # the gift card is credited once per history entry that names it (twice here), rounding each time
    assert gift["balance"] == round(round(620.97 + 585.97, 2) + 585.97, 2) == 1792.91


def test_modify_payment_updates_both_gift_card_directions(db):
    order = ok(db, "modify_pending_order_payment", order_id=CC_PENDING, payment_method_id=OMAR_GC)
    assert order["status"] == "pending" and len(order["payment_history"]) == 3
    assert db["users"]["omar_kim_3528"]["payment_methods"][OMAR_GC]["balance"] == round(91.0 - 53.43, 2) == 37.57
    order = ok(db, "modify_pending_order_payment", order_id=GC_PENDING, payment_method_id=OLIVIA_CC)
    assert order["payment_history"][1:] == [
        {"transaction_type": "payment", "amount": 585.97, "payment_method_id": OLIVIA_CC},
        {"transaction_type": "refund", "amount": 585.97, "payment_method_id": OLIVIA_GC}]
    assert db["users"]["olivia_lopez_9494"]["payment_methods"][OLIVIA_GC]["balance"] == 620.97
    # the new balance is rounded (a constructed balance whose plain difference is 37.669999999999995)
    other = load_db()
    other["users"]["omar_kim_3528"]["payment_methods"][OMAR_GC]["balance"] = 91.1
    ok(other, "modify_pending_order_payment", order_id=CC_PENDING, payment_method_id=OMAR_GC)
    assert repr(other["users"]["omar_kim_3528"]["payment_methods"][OMAR_GC]["balance"]) == "37.67"


def test_modify_items_last_variant_bug_and_unrounded_amount(db, initial_db):
    # Backpack 3557711149 (205.35) -> 3928046918 (198.0); Wall Clock 8917609800 (195.59) -> 9850781806 (184.48)
    order = ok(db, MODIFY_ITEMS, order_id=MULTI, item_ids=["3557711149", "8917609800"],
               new_item_ids=["3928046918", "9850781806"], payment_method_id=HARPER_CC)
    diff = 0
    diff += 198.0 - 205.35
    diff += 184.48 - 195.59
    entry = order["payment_history"][-1]
    assert entry == {"transaction_type": "refund", "amount": abs(diff), "payment_method_id": HARPER_CC}
    assert repr(entry["amount"]) == "18.460000000000008"           # not rounded
    wall_clock_variant = initial_db["products"]["2344688344"]["variants"]["9850781806"]
    old = initial_db["orders"][MULTI]["items"]
    new = order["items"]
    assert [i["item_id"] for i in new] == ["3928046918", "9850781806", "3557711149", "4035304400", "9747045638"]
    # both modified items get the LAST variant's price and options; name/product_id stay
    for k in (0, 1):
        assert new[k]["price"] == 184.48 and new[k]["options"] == wall_clock_variant["options"]
        assert (new[k]["name"], new[k]["product_id"]) == (old[k]["name"], old[k]["product_id"])
    assert new[2:] == old[2:]
    assert order["status"] == "pending (item modified)"
    assert "18.460000000000008" in execute(db, "get_order_details", {"order_id": MULTI}).content
    # the same modification with the pairs listed the other way round ends in another state
    other = load_db()
    ok(other, MODIFY_ITEMS, order_id=MULTI, item_ids=["8917609800", "3557711149"],
       new_item_ids=["9850781806", "3928046918"], payment_method_id=HARPER_CC)
    assert other["orders"][MULTI]["items"][0]["price"] == 198.0
    assert db_hash(other) != db_hash(db)


def test_modify_items_matches_current_ids(db, initial_db):
    # #W5918442 holds Action Cameras 1586641416 (497.39) and 6117189161 (481.5); the second pair's old id is
    # the first pair's new id, so it matches the item just modified, not the original 6117189161.
    order = ok(db, MODIFY_ITEMS, order_id="#W5918442", item_ids=["1586641416", "6117189161"],
               new_item_ids=["6117189161", "6700049080"], payment_method_id="credit_card_5051208")
    camera = initial_db["products"]["3377618313"]["variants"]["6700049080"]
    assert order["items"][2]["item_id"] == "6700049080"
    assert (order["items"][2]["price"], order["items"][2]["options"]) == (466.75, camera["options"])
    assert order["items"][3] == initial_db["orders"]["#W5918442"]["items"][3]
    diff = 0
    diff += 481.5 - 497.39
    diff += 466.75 - 481.5
    assert order["payment_history"][-1]["amount"] == abs(diff)


def test_modify_items_refund_to_gift_card(db):
    # Smart Watch 367.38 -> 2860956907 (315.61); Backpack 218.59 -> 3928046918 (198.0); gift card 35.0
    order = ok(db, MODIFY_ITEMS, order_id=GC_PENDING, item_ids=["2554056026", "6309044598"],
               new_item_ids=["2860956907", "3928046918"], payment_method_id=OLIVIA_GC)
    diff = 0
    diff += 315.61 - 367.38
    diff += 198.0 - 218.59
    assert order["payment_history"][-1] == {"transaction_type": "refund", "amount": abs(diff),
                                            "payment_method_id": OLIVIA_GC}
    balance = db["users"]["olivia_lopez_9494"]["payment_methods"][OLIVIA_GC]["balance"]
    assert balance == round(35.0 - diff, 2) == 107.36


def test_modify_items_empty_lists_record_zero_refund(db):
    order = ok(db, MODIFY_ITEMS, order_id=HOSES, item_ids=[], new_item_ids=[], payment_method_id=LIAM_CC)
    entry = db["orders"][HOSES]["payment_history"][-1]
    assert entry == {"transaction_type": "refund", "amount": 0.0, "payment_method_id": LIAM_CC}
    assert type(entry["amount"]) is float
    assert order["status"] == "pending (item modified)"


def test_exchange_sorted_lists_and_rounded_difference(db):
    # Vacuum 569.43 -> 4602305039 (561.05), Pet Bed 196.53 -> 7729002517 (193.0), Keyboard 249.95 -> 7706410293
    order = ok(db, EXCHANGE, order_id=DELIVERED, item_ids=[VACUUM, PET_BED, KEYBOARD],
               new_item_ids=["4602305039", "7729002517", "7706410293"], payment_method_id=SOPHIA_CC)
    total = 0
    total += 561.05 - 569.43
    total += 193.0 - 196.53
    total += 269.16 - 249.95
    assert repr(total) == "7.30000000000004"
    assert order["exchange_price_difference"] == round(total, 2) == 7.3
    assert order["exchange_items"] == [KEYBOARD, PET_BED, VACUUM]                    # sorted ...
    assert order["exchange_new_items"] == ["4602305039", "7706410293", "7729002517"]  # ... each on its own
    assert order["status"] == "exchange requested" and order["exchange_payment_method_id"] == SOPHIA_CC
    assert order["payment_history"] == [{"transaction_type": "payment", "amount": 3911.46,
                                         "payment_method_id": SOPHIA_CC}]
    assert [i["item_id"] for i in order["items"]] == [i["item_id"] for i in load_db()["orders"][DELIVERED]["items"]]
    # a gift card pays a negative difference without any balance change
    other = load_db()
    ok(other, EXCHANGE, order_id=DELIVERED, item_ids=[VACUUM], new_item_ids=["4602305039"],
       payment_method_id=SOPHIA_GC)
    assert other["orders"][DELIVERED]["exchange_price_difference"] == -8.38
    assert other["users"]["sophia_jackson_6355"]["payment_methods"][SOPHIA_GC]["balance"] == 10.0


def test_exchange_empty_lists_store_integer_zero(db):
    order = ok(db, EXCHANGE, order_id=DELIVERED, item_ids=[], new_item_ids=[], payment_method_id=SOPHIA_CC)
    assert order["exchange_price_difference"] == 0
    assert type(db["orders"][DELIVERED]["exchange_price_difference"]) is int
    assert '"exchange_price_difference": 0,' in execute(db, "get_order_details", {"order_id": DELIVERED}).content
    as_float = load_db()
    ok(as_float, EXCHANGE, order_id=DELIVERED, item_ids=[], new_item_ids=[], payment_method_id=SOPHIA_CC)
    as_float["orders"][DELIVERED]["exchange_price_difference"] = 0.0
    assert db_hash(as_float) != db_hash(db)


def test_return_original_method_or_gift_card(db):
    order = ok(db, RETURN, order_id=DELIVERED, item_ids=[VACUUM, PET_BED, KEYBOARD], payment_method_id=SOPHIA_CC)
    assert order["return_items"] == sorted([VACUUM, PET_BED, KEYBOARD])
    assert (order["status"], order["return_payment_method_id"]) == ("return requested", SOPHIA_CC)
    assert len(order["payment_history"]) == 1
    # a second request on the same order is refused either way
    assert call(db, RETURN, order_id=DELIVERED, item_ids=[], payment_method_id=SOPHIA_GC).content == \
        E + "Non-delivered order cannot be returned"
    assert call(db, EXCHANGE, order_id=DELIVERED, item_ids=[], new_item_ids=[], payment_method_id=SOPHIA_CC
                ).content == E + "Non-delivered order cannot be exchanged"
    # duplicates are counted against the order (order #W4316152 has item 7292993796 twice)
    dup = load_db()
    user = dup["orders"]["#W4316152"]["user_id"]
    original = dup["orders"]["#W4316152"]["payment_history"][0]["payment_method_id"]
    assert not call(dup, RETURN, order_id="#W4316152", item_ids=["7292993796"] * 2, payment_method_id=original).error
    assert dup["orders"]["#W4316152"]["return_items"] == ["7292993796"] * 2 and user


def test_state_machine(db):
    # pending -> payment changed (still pending): address and items may still change, payment may not
    ok(db, "modify_pending_order_payment", order_id=CC_PENDING, payment_method_id=OMAR_GC)
    assert db["orders"][CC_PENDING]["status"] == "pending"
    assert call(db, "modify_pending_order_payment", order_id=CC_PENDING, payment_method_id=OMAR_CC).content == \
        E + "There should be exactly one payment for a pending order"
    ok(db, "modify_pending_order_address", order_id=CC_PENDING, **ADDRESS)
    ok(db, MODIFY_ITEMS, order_id=CC_PENDING, item_ids=["8349118980"], new_item_ids=["9612497925"],
       payment_method_id=OMAR_GC)
    # pending (item modified): only the address may change
    assert db["orders"][CC_PENDING]["status"] == "pending (item modified)"
    ok(db, "modify_pending_order_address", order_id=CC_PENDING, **{**ADDRESS, "city": "Dallas"})
    assert db["orders"][CC_PENDING]["address"]["city"] == "Dallas"
    before = db_hash(db)
    for name, args, message in [
            ("cancel_pending_order", {"reason": "no longer needed"}, "Non-pending order cannot be cancelled"),
            (MODIFY_ITEMS, {"item_ids": [], "new_item_ids": [], "payment_method_id": OMAR_GC},
             "Non-pending order cannot be modified"),
            ("modify_pending_order_payment", {"payment_method_id": OMAR_CC},
             "There should be exactly one payment for a pending order"),
            (EXCHANGE, {"item_ids": [], "new_item_ids": [], "payment_method_id": OMAR_GC},
             "Non-delivered order cannot be exchanged"),
            (RETURN, {"item_ids": [], "payment_method_id": OMAR_GC}, "Non-delivered order cannot be returned")]:
        assert execute(db, name, {"order_id": CC_PENDING, **args}).content == E + message
    # cancelled: nothing
    ok(db, "cancel_pending_order", order_id=GC_PENDING, reason="no longer needed")
    assert call(db, "modify_pending_order_address", order_id=GC_PENDING, **ADDRESS).content == \
        E + "Non-pending order cannot be modified"
    assert call(db, "cancel_pending_order", order_id=GC_PENDING, reason="no longer needed").content == \
        E + "Non-pending order cannot be cancelled"
    assert db_hash(db) != before
    # modify_user_address works on any user, and orders keep their address
    ok(db, "modify_user_address", user_id="omar_kim_3528", **{**ADDRESS, "city": "Waco"})
    assert db["orders"][CC_PENDING]["address"]["city"] == "Dallas"


# ------------------------------------------------------------------------------------------------
# rendering and schemas


def test_render_canonical_order_and_floats(db):
    content = execute(db, "get_order_details", {"order_id": GC_PENDING}).content
    order = json.loads(content)
    assert list(order) == list(ORDER_FIELDS)
    assert list(order["address"]) == ["address1", "address2", "city", "country", "state", "zip"]
    assert list(order["items"][0]) == ["name", "product_id", "item_id", "price", "options"]
    assert content == json.dumps(db["orders"][GC_PENDING])
    assert '"cancel_reason": null, "exchange_items": null' in content and "\n" not in content
    assert render("plain text") == "plain text"
    assert render({"b": 95.0, "a": None, "c": [1e-05, 4.009999999999991]}) == \
        '{"b": 95.0, "a": null, "c": [1e-05, 4.009999999999991]}'
    assert render({"name": "Jos\u00e9"}) == '{"name": "Jos\\u00e9"}'


SCHEMA_FILE = DEFAULT_DATA_DIR / "tool_schemas.json"
# sha256 of the shared data's tau2_retail/tool_schemas.json, taken when it was copied in (tests never
# read ../shared: a user's clone has none)
SHARED_SCHEMA_SHA256 = "e0af784b468badcd493ce55908ad364c5f38bbed5f1708cc8218d8545aeb889f"


def _key_orders(value):
    """Every mapping's key order, recursively (``==`` on dicts ignores order)."""
    if isinstance(value, dict):
        return [list(value), [_key_orders(v) for v in value.values()]]
    if isinstance(value, (list, tuple)):
        return [_key_orders(v) for v in value]
    return None


def test_tool_schemas_are_tau2s_own_byte_for_byte():
    text = SCHEMA_FILE.read_text(encoding="utf-8")
    stored = json.loads(text)
    assert list(stored) == ["source", "tools"] and "a2c0247" in stored["source"]
    assert TOOL_SCHEMAS_FILE == SCHEMA_FILE
    served = tool_schemas()
    assert list(served) == stored["tools"] and _key_orders(list(served)) == _key_orders(stored["tools"])
    # the whole file re-serialised with its own layout, the served list in place of the stored one
    assert json.dumps({"source": stored["source"], "tools": list(served)}, indent=1) == text
    assert hashlib.sha256(SCHEMA_FILE.read_bytes()).hexdigest() == SHARED_SCHEMA_SHA256  # the shared file, unchanged
    # fresh objects each call: a caller's edit does not leak into the next episode
    served[0]["function"]["description"] = "changed"
    assert tool_schemas()[0]["function"]["description"] == stored["tools"][0]["function"]["description"]


def test_tool_schemas_tau2_quirks():
    by_name = {s["function"]["name"]: s["function"] for s in tool_schemas()}
    listing = by_name["list_all_product_types"]["parameters"]
    assert listing == {"properties": {}, "title": "parameters", "type": "object"} and "required" not in listing
    assert all(f["parameters"]["title"] == "parameters" for f in by_name.values())
    assert by_name["calculate"]["description"] == "Calculate the result of a mathematical expression."
    assert list(by_name["calculate"]["parameters"]["properties"]["expression"]) == ["description", "title", "type"]
    # tau2's order, not sorted: find_user_id_by_name_zip comes before find_user_id_by_email
    names = [s["function"]["name"] for s in tool_schemas()]
    assert names.index("find_user_id_by_name_zip") < names.index("find_user_id_by_email")


def test_tool_schemas_match_the_implemented_tools():
    schemas = tool_schemas()
    assert len(schemas) == 16 and len(TOOL_NAMES) == 16 and TOOL_NAMES == tuple(sorted(TOOL_NAMES))
    assert sorted(s["function"]["name"] for s in schemas) == list(TOOL_NAMES)
    assert len(WRITE_TOOLS) == 7 and WRITE_TOOLS < set(TOOL_NAMES)
    arrays = {"item_ids", "new_item_ids"}
    for schema in schemas:
        assert schema["type"] == "function"
        fn = schema["function"]
        params = fn["parameters"]
        assert params["type"] == "object" and fn["description"]
        signature = list(inspect.signature(getattr(RetailTools, fn["name"])).parameters)[1:]
        assert list(params["properties"]) == signature and params.get("required", []) == signature
        for name, prop in params["properties"].items():
            assert prop["title"] == " ".join(w.capitalize() for w in name.split("_"))
            assert prop["description"]
            if name in arrays:
                assert prop["type"] == "array" and prop["items"] == {"type": "string"}
            else:
                assert prop["type"] == "string"
    check_tool_schemas(schemas)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.pop(), "name"),
    (lambda s: s[0]["function"].update(name="calc"), "name"),
    (lambda s: s[1]["function"]["parameters"]["properties"].pop("reason"), "differ from the method"),
    (lambda s: s[1]["function"]["parameters"]["required"].reverse(), "differ from the method"),
    (lambda s: s[2]["function"]["parameters"]["properties"]["item_ids"].update(type="string"), r"takes list\[str\]"),
    (lambda s: s[0]["function"]["parameters"]["properties"]["expression"].update(type="number"), "takes str"),
    (lambda s: s[9]["function"]["parameters"].update(type="array"), "not a function schema"),
])
def test_check_tool_schemas_rejects_drift(edit, message):
    schemas = list(tool_schemas())
    edit(schemas)
    with pytest.raises(ValueError, match=message):
        check_tool_schemas(schemas)


# ------------------------------------------------------------------------------------------------
# gold replay of the train tasks (spec 4.3)

TASKS = load_tasks()
FAILING_READS = {"2", "3", "4", "35", "37", "46", "47", "54", "67"}
UNCHANGED = {"10", "24", "25", "50", "57", "67", "105"}


@pytest.mark.parametrize("task", TASKS, ids=[t["id"] for t in TASKS])
def test_gold_replay(task):
    db = load_db()
    failed = []
    for action in task["evaluation_criteria"]["actions"]:
        result = execute(db, action["name"], action["arguments"])
        if result.error:
            failed.append((action["name"], result.content))
    if task["id"] in FAILING_READS:
        assert failed and all(name not in WRITE_TOOLS and content.endswith(" not found")
                              for name, content in failed), failed
    elif task["id"] == "105":
        assert failed == [(EXCHANGE, E + "Insufficient gift card balance to pay for the price difference")]
    else:
        assert failed == []
    assert (db_hash(db) == INITIAL_HASH) == (task["id"] in UNCHANGED)

"""tau2 retail database and tools: the sanity hash, canonical orders, load errors, and every tool
message of the spec (table-driven, on real records of the packaged db.json)."""

import json

import pytest

from jaxagent.envs.tau2.domains.retail.db import DEFAULT_DATA_DIR, ORDER_FIELDS, ORDER_OPTIONAL_FIELDS, ORDER_STATUSES, load_db, load_policy, load_tasks
from jaxagent.envs.tau2.db import db_hash
from jaxagent.envs.tau2.domains.retail.tools import RetailTools, TOOL_NAMES, WRITE_TOOLS, execute
from jaxagent.envs.tau2.tools import ToolError, ToolResult

from tests.tau2_tools_helpers import (ADDRESS, CANONICAL_ADDRESS, CC_PENDING, DELIVERED, E, EXCHANGE, GC_PENDING,
                                      HOSES, INITIAL_HASH, KEYBOARD, LIAM_CC, MODIFY_ITEMS, OLIVIA_GC, OMAR_CC,
                                      OMAR_GC, PET_BED, PROCESSED, RETURN, SOPHIA_CC, SOPHIA_CC2, SOPHIA_GC,
                                      SOPHIA_PP, VACUUM)
from tests.tau2_tools_helpers import db, initial_db  # noqa: F401 (pytest fixtures)


# database


def test_sanity_hash_and_canonical_orders(initial_db):
    assert db_hash(initial_db) == INITIAL_HASH
    assert list(initial_db) == ["products", "users", "orders"]
    assert (len(initial_db["products"]), len(initial_db["users"]), len(initial_db["orders"])) == (50, 500, 1000)
    for order in initial_db["orders"].values():
        assert tuple(order) == ORDER_FIELDS
        assert all(order[field] is None for field in ORDER_OPTIONAL_FIELDS)
        assert order["status"] in ORDER_STATUSES
    assert len(ORDER_FIELDS) == 14 and ORDER_FIELDS[-7:] == ORDER_OPTIONAL_FIELDS
    # the file order is kept (searches and item lookups depend on it)
    assert list(initial_db["products"])[:2] == ["9523456873", "4760268021"]
    assert list(initial_db["users"])[:2] == ["noah_brown_6181", "ivan_santos_6635"]
    assert list(initial_db["orders"])[:2] == ["#W2611340", "#W4817420"]


def test_load_db_returns_independent_copies(initial_db):
    a, b = load_db(), load_db()
    a["orders"][PROCESSED]["items"][0]["options"]["color"] = "changed"
    a["users"]["omar_kim_3528"]["payment_methods"][OMAR_GC]["balance"] = 0.0
    del a["products"]["9523456873"]
    assert db_hash(b) == INITIAL_HASH and db_hash(load_db()) == INITIAL_HASH
    assert db_hash(initial_db) == INITIAL_HASH


def test_load_errors(tmp_path):
    bad = {"products": {}, "users": {}, "orders": {}, "extra": {}}
    (tmp_path / "db.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"unexpected \['extra'\].*expected exactly \['products', 'users', 'orders'\]"):
        load_db(tmp_path)
    (tmp_path / "db.json").write_text(json.dumps({"products": {}, "users": {}}))
    with pytest.raises(ValueError, match=r"missing \['orders'\]"):
        load_db(tmp_path)
    (tmp_path / "db.json").write_text(json.dumps({"products": [], "users": {}, "orders": {}}))
    with pytest.raises(ValueError, match=r"'products' is a list"):
        load_db(tmp_path)
    order = {"order_id": "#W1", "user_id": "u", "address": {}, "items": [], "status": "lost",
             "fulfillments": [], "payment_history": []}
    (tmp_path / "db.json").write_text(json.dumps({"products": {}, "users": {}, "orders": {"#W1": order}}))
    with pytest.raises(ValueError, match=r"'status' is 'lost'; expected one of"):
        load_db(tmp_path)
    # a valid file is re-read when it changes (the cache is keyed by size and mtime)
    order["status"] = "pending"
    (tmp_path / "db.json").write_text(json.dumps({"products": {}, "users": {}, "orders": {"#W1": order}}))
    assert list(load_db(tmp_path)["orders"]["#W1"]) == list(ORDER_FIELDS)
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=r"nowhere.*env\.tau2\.data_dir"):
        load_db(missing)
    with pytest.raises(FileNotFoundError, match=r"env\.tau2\.data_dir"):
        load_tasks(missing)


def test_tasks_and_policy():
    tasks = load_tasks()
    assert len(tasks) == 74 and all("evaluation_criteria" in t for t in tasks)
    assert DEFAULT_DATA_DIR.name == "tau2_retail" and (DEFAULT_DATA_DIR / "LICENSE").is_file()
    policy = load_policy()
    assert "retail" in policy.lower() and len(policy) > 1000


# ------------------------------------------------------------------------------------------------
# every tool message, on real records


def fields(**expected):
    """Predicate: the content is a JSON record whose given fields have these values."""
    def check(content):
        record = json.loads(content)
        return all(record[k] == v for k, v in expected.items())
    check.__name__ = f"fields({expected})"
    return check


def startswith(prefix):
    def check(content):
        return content.startswith(prefix)
    check.__name__ = f"startswith({prefix!r})"
    return check


def product_types(content):
    names = json.loads(content)
    return (len(names) == 50 and list(names) == sorted(names)
            and content.startswith('{"Action Camera": "3377618313", "Air Purifier": "3821016478", '))


def user_record(content):
    user = json.loads(content)
    return (list(user) == ["user_id", "name", "address", "email", "payment_methods", "orders"]
            and user["email"] == "noah.brown7922@example.com" and user["orders"] == ["#W7678072"]
            and list(user["payment_methods"]) == ["paypal_5727330", "credit_card_7815826"])


def t_shirt(content):
    product = json.loads(content)
    return (list(product) == ["name", "product_id", "variants"] and product["name"] == "T-Shirt"
            and len(product["variants"]) == 12 and product["variants"]["9612497925"]["price"] == 50.88)


def processed_order(content):
    order = json.loads(content)
    return (tuple(order) == ORDER_FIELDS and order["status"] == "processed" and order["user_id"] == "james_li_5688"
            and order["payment_history"] == [{"transaction_type": "payment", "amount": 536.65,
                                              "payment_method_id": "gift_card_1725971"}]
            and order["cancel_reason"] is None and order["return_payment_method_id"] is None)


def both_hoses_to_last_variant(content):
    order = json.loads(content)
    return ([(i["item_id"], i["price"]) for i in order["items"]] == [("8481719475", 90.43), ("9829827210", 90.43)]
            and order["status"] == "pending (item modified)")


ONE_PAYMENT_CHANGE = (("modify_pending_order_payment", {"order_id": CC_PENDING, "payment_method_id": OMAR_GC}),)
ITEMS_MODIFIED = ((MODIFY_ITEMS, {"order_id": HOSES, "item_ids": ["5753502325"], "new_item_ids": ["8481719475"],
                                  "payment_method_id": LIAM_CC}),)

# (id, setup calls, tool name, arguments, expected error flag, expected content or predicate)
CASES = [
    # -- reads
    ("email", (), "find_user_id_by_email", {"email": "noah.brown7922@example.com"}, False, "noah_brown_6181"),
    ("email-case", (), "find_user_id_by_email", {"email": "NOAH.Brown7922@Example.COM"}, False, "noah_brown_6181"),
    ("email-partial", (), "find_user_id_by_email", {"email": "noah.brown7922"}, True, E + "User not found"),
    ("name-zip", (), "find_user_id_by_name_zip", {"first_name": "noah", "last_name": "BROWN", "zip": "80279"},
     False, "noah_brown_6181"),
    ("name-zip-wrong", (), "find_user_id_by_name_zip", {"first_name": "Noah", "last_name": "Brown", "zip": "80280"},
     True, E + "User not found"),
    ("user", (), "get_user_details", {"user_id": "noah_brown_6181"}, False, user_record),
    ("user-case", (), "get_user_details", {"user_id": "Noah_Brown_6181"}, True, E + "User not found"),
    ("order", (), "get_order_details", {"order_id": PROCESSED}, False, processed_order),
    ("order-no-hash", (), "get_order_details", {"order_id": "W2611340"}, True, E + "Order not found"),
    ("order-int", (), "get_order_details", {"order_id": 2611340}, True, E + "Order not found"),
    ("product", (), "get_product_details", {"product_id": "9523456873"}, False, t_shirt),
    ("product-item-id", (), "get_product_details", {"product_id": "9612497925"}, True, E + "Product not found"),
    ("item", (), "get_item_details", {"item_id": "9612497925"}, False,
     ('{"item_id": "9612497925", "options": {"color": "blue", "size": "M", "material": "cotton", '
      '"style": "crew neck"}, "available": true, "price": 50.88}')),
    ("item-product-id", (), "get_item_details", {"item_id": "9523456873"}, True, E + "Item not found"),
    ("product-types", (), "list_all_product_types", {}, False, product_types),
    # -- generic
    ("calc-half", (), "calculate", {"expression": "(1 + 4) / 2"}, False, "2.5"),
    ("calc-pow", (), "calculate", {"expression": "2 ** 10"}, False, "1024.0"),
    ("calc-third", (), "calculate", {"expression": "1 / 3"}, False, "0.33"),
    ("calc-sum", (), "calculate", {"expression": "1000.5 + 1440.55"}, False, "2441.05"),
    ("calc-int-ops", (), "calculate", {"expression": " 10 // 3 - 6 / 2"}, False, "0.0"),
    ("calc-chars", (), "calculate", {"expression": "2 + x"}, True, E + "Invalid characters in expression"),
    ("calc-zero", (), "calculate", {"expression": "1 / 0"}, True, E + "division by zero"),
    ("calc-syntax", (), "calculate", {"expression": "2 +"}, True, E + "invalid syntax (<string>, line 1)"),
    ("calc-huge", (), "calculate", {"expression": "9 ** 9 ** 9"}, True, startswith(E + "Result too large")),
    ("transfer", (), "transfer_to_human_agents", {"summary": "wants a human"}, False, "Transfer successful"),
    # -- cancel_pending_order
    ("cancel-processed", (), "cancel_pending_order", {"order_id": PROCESSED, "reason": "no longer needed"},
     True, E + "Non-pending order cannot be cancelled"),
    ("cancel-reason", (), "cancel_pending_order", {"order_id": GC_PENDING, "reason": "changed my mind"},
     True, E + "Invalid reason"),
    ("cancel-unknown", (), "cancel_pending_order", {"order_id": "#W0000000", "reason": "no longer needed"},
     True, E + "Order not found"),
    ("cancel-item-modified", ITEMS_MODIFIED, "cancel_pending_order",
     {"order_id": HOSES, "reason": "ordered by mistake"},
     True, E + "Non-pending order cannot be cancelled"),
    ("cancel", (), "cancel_pending_order", {"order_id": GC_PENDING, "reason": "ordered by mistake"}, False,
     fields(status="cancelled", cancel_reason="ordered by mistake")),
    # -- addresses
    ("address-processed", (), "modify_pending_order_address", {"order_id": PROCESSED, **ADDRESS},
     True, E + "Non-pending order cannot be modified"),
    ("address-int-zip", (), "modify_pending_order_address", {"order_id": GC_PENDING, **ADDRESS, "zip": 73301},
     True, startswith(E + "1 validation error for UserAddress\nzip\n  Input should be a valid string")),
    ("address-two-bad", (), "modify_pending_order_address",
     {"order_id": GC_PENDING, **ADDRESS, "zip": 73301, "city": None},
     True, startswith(E + "2 validation errors for UserAddress\ncity\n")),
    ("address", (), "modify_pending_order_address", {"order_id": GC_PENDING, **ADDRESS}, False,
     fields(address=CANONICAL_ADDRESS, status="pending")),
    ("address-item-modified", ITEMS_MODIFIED, "modify_pending_order_address", {"order_id": HOSES, **ADDRESS}, False,
     fields(address=CANONICAL_ADDRESS, status="pending (item modified)")),
    ("user-address-unknown", (), "modify_user_address", {"user_id": "nobody_0000", **ADDRESS},
     True, E + "User not found"),
    ("user-address", (), "modify_user_address", {"user_id": "noah_brown_6181", **ADDRESS}, False,
     fields(user_id="noah_brown_6181", address=CANONICAL_ADDRESS)),
    # -- modify_pending_order_payment
    ("payment-processed", (), "modify_pending_order_payment", {"order_id": PROCESSED, "payment_method_id": OMAR_GC},
     True, E + "Non-pending order cannot be modified"),
    ("payment-other-users", (), "modify_pending_order_payment",
     {"order_id": CC_PENDING, "payment_method_id": SOPHIA_CC}, True, E + "Payment method not found"),
    ("payment-same", (), "modify_pending_order_payment", {"order_id": CC_PENDING, "payment_method_id": OMAR_CC},
     True, E + "The new payment method should be different from the current one"),
    ("payment-gift-short", (), "modify_pending_order_payment",
     {"order_id": "#W8367380", "payment_method_id": "gift_card_1994993"},
     True, E + "Insufficient gift card balance to pay for the order"),
    ("payment-twice", ONE_PAYMENT_CHANGE, "modify_pending_order_payment",
     {"order_id": CC_PENDING, "payment_method_id": OMAR_CC},
     True, E + "There should be exactly one payment for a pending order"),
    ("payment", (), "modify_pending_order_payment", {"order_id": CC_PENDING, "payment_method_id": OMAR_GC}, False,
     fields(status="pending", payment_history=[
         {"transaction_type": "payment", "amount": 53.43, "payment_method_id": OMAR_CC},
         {"transaction_type": "payment", "amount": 53.43, "payment_method_id": OMAR_GC},
         {"transaction_type": "refund", "amount": 53.43, "payment_method_id": OMAR_CC}])),
    # -- modify_pending_order_items
    ("items-processed", (), MODIFY_ITEMS, {"order_id": PROCESSED, "item_ids": [], "new_item_ids": [],
                                           "payment_method_id": "gift_card_1725971"},
     True, E + "Non-pending order cannot be modified"),
    ("items-count-first", (), MODIFY_ITEMS, {"order_id": HOSES, "item_ids": ["5753502325"] * 3, "new_item_ids": [],
                                             "payment_method_id": LIAM_CC}, True, E + "5753502325 not found"),
    ("items-length", (), MODIFY_ITEMS, {"order_id": HOSES, "item_ids": ["5753502325"], "new_item_ids": [],
                                        "payment_method_id": LIAM_CC},
     True, E + "The number of items to be exchanged should match"),
    ("items-same", (), MODIFY_ITEMS, {"order_id": HOSES, "item_ids": ["5753502325"], "new_item_ids": ["5753502325"],
                                      "payment_method_id": LIAM_CC},
     True, E + "The new item id should be different from the old item id"),
    ("items-other-product", (), MODIFY_ITEMS, {"order_id": HOSES, "item_ids": ["5753502325"],
                                               "new_item_ids": ["3928046918"], "payment_method_id": LIAM_CC},
     True, E + "Variant not found"),
    ("items-unavailable", (), MODIFY_ITEMS, {"order_id": HOSES, "item_ids": ["5753502325"],
                                             "new_item_ids": ["8249784860"], "payment_method_id": LIAM_CC},
     True, E + "New item 8249784860 not found or available"),
    ("items-payment", (), MODIFY_ITEMS, {"order_id": HOSES, "item_ids": ["5753502325"],
                                         "new_item_ids": ["8481719475"], "payment_method_id": "paypal_5727330"},
     True, E + "Payment method not found"),
    ("items-gift-short", (), MODIFY_ITEMS, {"order_id": "#W6779827", "item_ids": ["7896397433"],
                                            "new_item_ids": ["2444431651"], "payment_method_id": "gift_card_7219486"},
     True, E + "Insufficient gift card balance to pay for the new item"),
    ("items-twice", ITEMS_MODIFIED, MODIFY_ITEMS, {"order_id": HOSES, "item_ids": ["5753502325"],
                                                   "new_item_ids": ["9829827210"], "payment_method_id": LIAM_CC},
     True, E + "Non-pending order cannot be modified"),
    ("items-duplicates", (), MODIFY_ITEMS, {"order_id": HOSES, "item_ids": ["5753502325", "5753502325"],
                                            "new_item_ids": ["8481719475", "9829827210"], "payment_method_id": LIAM_CC},
     False, both_hoses_to_last_variant),
    # -- exchange_delivered_order_items
    ("exchange-pending", (), EXCHANGE, {"order_id": GC_PENDING, "item_ids": [], "new_item_ids": [],
                                        "payment_method_id": OLIVIA_GC},
     True, E + "Non-delivered order cannot be exchanged"),
    ("exchange-missing", (), EXCHANGE, {"order_id": DELIVERED, "item_ids": ["1234567890"], "new_item_ids": ["1"],
                                        "payment_method_id": SOPHIA_CC}, True, E + "Number of 1234567890 not found."),
    ("exchange-length", (), EXCHANGE, {"order_id": DELIVERED, "item_ids": [KEYBOARD], "new_item_ids": [],
                                       "payment_method_id": SOPHIA_CC},
     True, E + "The number of items to be exchanged should match."),
    ("exchange-other-product", (), EXCHANGE, {"order_id": DELIVERED, "item_ids": [VACUUM],
                                              "new_item_ids": ["7706410293"], "payment_method_id": SOPHIA_CC},
     True, E + "Variant not found"),
    ("exchange-unavailable", (), EXCHANGE, {"order_id": DELIVERED, "item_ids": [VACUUM],
                                            "new_item_ids": ["3019027053"], "payment_method_id": SOPHIA_CC},
     True, E + "New item 3019027053 not found or available"),
    ("exchange-payment", (), EXCHANGE, {"order_id": DELIVERED, "item_ids": [VACUUM], "new_item_ids": ["4602305039"],
                                        "payment_method_id": OMAR_GC}, True, E + "Payment method not found"),
    ("exchange-gift-short", (), EXCHANGE, {"order_id": DELIVERED, "item_ids": [VACUUM, KEYBOARD],
                                           "new_item_ids": ["4602305039", "7706410293"],
                                           "payment_method_id": SOPHIA_GC},
     True, E + "Insufficient gift card balance to pay for the price difference"),
    ("exchange-same-item", (), EXCHANGE, {"order_id": DELIVERED, "item_ids": [PET_BED], "new_item_ids": [PET_BED],
                                          "payment_method_id": SOPHIA_CC}, False,
     fields(status="exchange requested", exchange_items=[PET_BED], exchange_new_items=[PET_BED],
            exchange_price_difference=0.0, exchange_payment_method_id=SOPHIA_CC)),
    # -- return_delivered_order_items
    ("return-pending", (), RETURN, {"order_id": GC_PENDING, "item_ids": [], "payment_method_id": OLIVIA_GC},
     True, E + "Non-delivered order cannot be returned"),
    ("return-paypal", (), RETURN, {"order_id": DELIVERED, "item_ids": [VACUUM], "payment_method_id": SOPHIA_PP},
     True, E + "Payment method should be the original payment method"),
    ("return-other-card", (), RETURN, {"order_id": DELIVERED, "item_ids": [VACUUM], "payment_method_id": SOPHIA_CC2},
     True, E + "Payment method should be the original payment method"),
    ("return-other-users", (), RETURN, {"order_id": DELIVERED, "item_ids": [VACUUM], "payment_method_id": OMAR_GC},
     True, E + "Payment method not found"),
    ("return-missing", (), RETURN, {"order_id": DELIVERED, "item_ids": [VACUUM, VACUUM],
                                    "payment_method_id": SOPHIA_CC}, True, E + "Some item not found"),
    ("return-gift-card", (), RETURN, {"order_id": DELIVERED, "item_ids": [VACUUM, KEYBOARD],
                                      "payment_method_id": SOPHIA_GC}, False,
     fields(status="return requested", return_items=[KEYBOARD, VACUUM], return_payment_method_id=SOPHIA_GC)),
    ("exchange-after-return", ((RETURN, {"order_id": DELIVERED, "item_ids": [], "payment_method_id": SOPHIA_CC}),),
     EXCHANGE, {"order_id": DELIVERED, "item_ids": [], "new_item_ids": [], "payment_method_id": SOPHIA_CC},
     True, E + "Non-delivered order cannot be exchanged"),
    # -- calling (spec 3.2)
    ("unknown-tool", (), "think", {"thought": "hmm"}, True, "Error: Tool 'think' not found."),
    ("private-method", (), "_get_order", {"order_id": PROCESSED}, True, "Error: Tool '_get_order' not found."),
    ("missing-arg", (), "get_order_details", {}, True,
     E + "RetailTools.get_order_details() missing 1 required positional argument: 'order_id'"),
    ("extra-arg", (), "get_order_details", {"order_id": PROCESSED, "verbose": True}, True,
     E + "RetailTools.get_order_details() got an unexpected keyword argument 'verbose'"),
    ("args-not-object", (), "get_order_details", [PROCESSED], True,
     startswith(E + "the arguments of get_order_details")),
]


def test_cases_cover_every_tool():
    assert len(CASES) >= 45
    assert {c[2] for c in CASES} >= set(TOOL_NAMES)
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("setup, name, arguments, error, expected",
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_tool_call(setup, name, arguments, error, expected):
    db = load_db()
    for setup_name, setup_args in setup:
        assert execute(db, setup_name, setup_args).error is False
    before = db_hash(db)
    result = execute(db, name, arguments)
    assert isinstance(result, ToolResult)
    assert result.error is error, result.content
    if callable(expected):
        assert expected(result.content), result.content
    else:
        assert result.content == expected
    if error or name not in WRITE_TOOLS:
        assert db_hash(db) == before      # no partial write on failure; reads change nothing
    else:
        assert db_hash(db) != before


def test_methods_raise_tool_error(db):
    tools = RetailTools(db)
    with pytest.raises(ToolError, match="^Order not found$"):
        tools.get_order_details("#W0000000")
    assert isinstance(ToolError("x"), Exception)

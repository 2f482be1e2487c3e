"""tau2 telecom's provider database and 13 agent tools against hand-computed cases of the telecom
specification (sections 1-3, 6.4): exact contents, rendering, error texts, number types, check order
and the non-tool initialization/assertion functions."""

import json

import pytest

from jaxagent.envs.tau2 import db as shared_db
from jaxagent.envs.tau2.db import db_hash
from jaxagent.envs.tau2.domains.telecom import db as telecom_db
from jaxagent.envs.tau2.domains.telecom.db import (
    BILL_FIELDS,
    CUSTOMER_FIELDS,
    DEVICE_FIELDS,
    INITIAL_HASH,
    LINE_FIELDS,
    PLAN_FIELDS,
    TABLES,
    canonicalize_db,
    load_db,
    load_policy,
    load_tasks,
)
from jaxagent.envs.tau2.domains.telecom.tools import (
    ENV_FUNCTIONS,
    GENERIC_TOOLS,
    READ_TOOLS,
    TODAY,
    TOOL_NAMES,
    TOOL_SCHEMAS_FILE,
    WRITE_TOOLS,
    DictResult,
    TelecomTools,
    check_tool_schemas,
    execute,
    render_result,
    tool_schemas,
)
from jaxagent.envs.tau2.tools import render as shared_render
from jaxagent.envs.tau2.tools import run_tool


@pytest.fixture
def db():
    return load_db()


def ok(db, name, **args):
    res = execute(db, name, args)
    assert not res.error, res.content
    return res.content


def err(db, name, **args):
    res = execute(db, name, args)
    assert res.error, res.content
    assert res.content.startswith("Error: ")
    return res.content[len("Error: "):]


def find(db, table, key, value):
    return next(r for r in db[table] if r[key] == value)


# --------------------------------------------------------------------------------------------- database
def test_initial_hash_layout_and_types(db):
    assert db_hash(db) == INITIAL_HASH
    assert list(db) == list(TABLES) == ["plans", "customers", "lines", "bills", "devices"]
    assert [len(db[t]) for t in TABLES] == [5, 4, 9, 6, 9]
    assert [r["line_id"] for r in db["lines"]] == [f"L100{i}" for i in range(1, 10)]
    for table, fields in zip(TABLES, (PLAN_FIELDS, CUSTOMER_FIELDS, LINE_FIELDS, BILL_FIELDS, DEVICE_FIELDS)):
        assert all(tuple(r) == fields for r in db[table]), table
    john = db["customers"][0]
    assert john["created_at"] == "2025-01-15 10:30:00"                 # a space, not T
    assert list(john["address"]) == ["street", "city", "state", "zip_code"]
    assert list(john["payment_methods"][0]) == ["method_type", "account_number_last_4", "expiration_date"]
    assert john["last_extension_date"] is None and john["goodwill_credit_used_this_year"] == 25.0
    l1001 = db["lines"][0]
    assert l1001["last_sim_replacement_date"] is None and l1001["suspension_start_date"] is None
    assert type(db["lines"][2]["data_used_gb"]) is float                 # 0.0 in the file
    d1001 = db["devices"][0]
    assert d1001["activation_date"] == "2025-01-20 14:30:00" and d1001["last_esim_transfer_date"] is None
    b1001 = db["bills"][0]
    assert list(b1001["line_items"][0]) == ["description", "amount", "date", "item_type"]
    assert type(find(db, "bills", "bill_id", "B1003")["total_due"]) is float


def test_load_db_copies_and_reads_are_stable(db):
    other = load_db()
    assert other == db and other is not db
    db["lines"][1]["status"] = "Closed"
    db["customers"][3]["line_ids"].append("L9")
    assert load_db()["lines"][1]["status"] == "Active" and load_db()["customers"][3]["line_ids"] == []
    fresh = load_db()
    for name, args in [("get_customer_by_phone", {"phone_number": "555-123-2002"}),
                       ("get_bills_for_customer", {"customer_id": "C1001"}),
                       ("get_data_usage", {"customer_id": "C1001", "line_id": "L1002"}),
                       ("get_details_by_id", {"id": "D1002"}), ("transfer_to_human_agents", {"summary": "x"})]:
        execute(fresh, name, args)
    assert db_hash(fresh) == INITIAL_HASH


def test_defaults_and_malformed_files(tmp_path):
    raw = {"plans": [], "customers": [{"customer_id": "C1", "full_name": "A", "date_of_birth": "2000-01-01",
                                       "email": "a@b", "phone_number": "1",
                                       "address": {"street": "s", "city": "c", "state": "st", "zip_code": "z"}}],
           "lines": [{"line_id": "L1", "phone_number": "1", "plan_id": "P1", "data_used_gb": 3}],
           "bills": [{"bill_id": "B1", "customer_id": "C1", "period_start": "2025-01-01", "period_end": "2025-01-31",
                      "issue_date": "2025-01-01", "total_due": 0, "due_date": "2025-01-15"}],
           "devices": [{"device_id": "D1", "device_type": "watch", "model": "m", "is_esim_capable": False}]}
    db = canonicalize_db(raw, "x.toml")
    c = db["customers"][0]
    assert (c["account_status"], c["payment_methods"], c["line_ids"], c["created_at"]) == (
        "Pending Verification", [], [], "2025-01-01")
    line = db["lines"][0]
    assert (line["status"], line["device_id"], line["data_used_gb"], line["data_refueling_gb"],
            line["roaming_enabled"]) == ("Pending Activation", None, 3.0, 0.0, False)
    assert type(line["data_used_gb"]) is float
    assert db["bills"][0]["status"] == "Draft" and db["bills"][0]["line_items"] == []
    assert db["devices"][0]["activated"] is False and db["devices"][0]["imei"] is None

    def bad(mutate, *needles):
        broken = json.loads(json.dumps(raw))
        mutate(broken)
        with pytest.raises(ValueError) as info:
            canonicalize_db(broken, "x.toml")
        for needle in ("x.toml", *needles):
            assert needle in str(info.value), str(info.value)

    bad(lambda r: r["lines"][0].update(status="Open"), "lines[0] (L1)", "'status'", "'Pending Activation'")
    bad(lambda r: r["lines"][0].update(data_used_gb="3"), "'data_used_gb'", "a number")
    bad(lambda r: r["bills"][0].update(due_date="15/01/2025"), "bills[0] (B1)", "'due_date'", "YYYY-MM-DD")
    bad(lambda r: r["devices"][0].pop("is_esim_capable"), "devices[0] (D1)", "missing", "is_esim_capable")
    bad(lambda r: r["plans"].append({"plan_id": "P1"}), "plans[0] (P1)", "missing", "data_limit_gb")
    bad(lambda r: r["customers"][0]["address"].update(country="US"), "'address'", "unknown", "country")
    bad(lambda r: r.pop("devices"), "missing ['devices']")
    bad(lambda r: r.update(plans={}), "'plans'", "array of tables")

    (tmp_path / "db.toml").write_text('[[plans]]\nplan_id = "P1"\nname = \n')
    with pytest.raises(ValueError, match="db.toml: not valid TOML"):
        load_db(tmp_path)
    (tmp_path / "db.toml").write_text('customers = []\nlines = []\nbills = []\ndevices = []\n[[plans]]\nplan_id = "P1"\n')
    with pytest.raises(ValueError, match=r"db.toml: plans\[0\] \(P1\): .*missing"):
        load_db(tmp_path)
    with pytest.raises(FileNotFoundError, match="env.tau2.data_dir"):
        load_db(tmp_path / "nowhere")


def test_toml_dates_and_json_loading_unchanged(tmp_path):
    text = telecom_db.DEFAULT_DATA_DIR.joinpath("db.toml").read_text()
    # native TOML dates/datetimes load like the quoted strings
    text = text.replace('activation_date = "2025-01-20T14:30:00"', "activation_date = 2025-01-20T14:30:00")
    text = text.replace('period_start = "2025-03-01"', "period_start = 2025-03-01")
    (tmp_path / "db.toml").write_text(text)
    assert db_hash(load_db(tmp_path)) == INITIAL_HASH
    # the shared loader still parses JSON by default, with its old message
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(ValueError, match="x.json: not valid JSON"):
        shared_db.load_canonical(tmp_path / "x.json", lambda raw, source: raw)


def test_policy_and_tasks():
    policy = load_policy()
    assert policy.startswith("<main_policy>\n") and policy.endswith("</tech_support_policy>")
    assert len(load_tasks()) == 74
    with pytest.raises(ValueError, match="split='dev'"):
        load_tasks(split="dev")


# --------------------------------------------------------------------------------------------- constants, schemas
def test_tool_sets_and_schemas():
    assert len(TOOL_NAMES) == 13 and READ_TOOLS | WRITE_TOOLS | GENERIC_TOOLS == set(TOOL_NAMES)
    assert not (READ_TOOLS & WRITE_TOOLS) and GENERIC_TOOLS == {"transfer_to_human_agents"}
    assert WRITE_TOOLS == {"suspend_line", "resume_line", "send_payment_request", "enable_roaming",
                           "disable_roaming", "refuel_data"}
    assert all(callable(getattr(TelecomTools, n)) for n in TOOL_NAMES + tuple(ENV_FUNCTIONS))
    assert TODAY == "2025-02-25"
    file_tools = json.loads(TOOL_SCHEMAS_FILE.read_text())["tools"]
    assert tool_schemas() == tuple(file_tools)
    assert [s["function"]["name"] for s in tool_schemas()] == list(TOOL_NAMES)
    first = tool_schemas()
    first[0]["function"]["name"] = "changed"
    assert tool_schemas()[0]["function"]["name"] == "get_customer_by_phone"


def test_schema_check_is_honest():
    tools = json.loads(TOOL_SCHEMAS_FILE.read_text())["tools"]
    check_tool_schemas(tools)

    def broken(edit):
        copy = json.loads(json.dumps(tools))
        by_name = {t["function"]["name"]: t["function"]["parameters"] for t in copy}
        edit(by_name)
        with pytest.raises(ValueError):
            check_tool_schemas(copy)

    broken(lambda s: s["get_bills_for_customer"].update(required=["customer_id", "limit"]))
    broken(lambda s: s["get_bills_for_customer"]["properties"]["limit"].update(type="number"))
    broken(lambda s: s["get_bills_for_customer"]["properties"]["limit"].update(default=10))
    broken(lambda s: s["refuel_data"]["properties"]["gb_amount"].update(type="integer"))
    broken(lambda s: s["suspend_line"].update(required=["customer_id", "line_id"]))
    broken(lambda s: s["get_details_by_id"]["properties"].update(extra={"type": "string"}))
    with pytest.raises(ValueError):
        check_tool_schemas(tools[:-1])


# --------------------------------------------------------------------------------------------- routing, arguments
def test_routing_and_python_argument_errors(db):
    assert err(db, "get_customer_by_id") == (
        "TelecomTools.get_customer_by_id() missing 1 required positional argument: 'customer_id'")
    assert err(db, "get_customer_by_id", customer_id="C1001", extra=1) == (
        "TelecomTools.get_customer_by_id() got an unexpected keyword argument 'extra'")
    assert err(db, "toggle_airplane_mode") == "Tool 'toggle_airplane_mode' not found."
    for name in ENV_FUNCTIONS | {"_get_line_by_id", "__init__"}:
        assert err(db, name, customer_id="C1001") == f"Tool '{name}' not found."
    assert db_hash(db) == INITIAL_HASH
    # the shared runner still renders with its own default when not told otherwise
    assert run_tool(TelecomTools(db), TOOL_NAMES, "get_data_usage",
                    {"customer_id": "C1001", "line_id": "L1002"}).content == shared_render(
        {"line_id": "L1002", "data_used_gb": 8.7, "data_limit_gb": 15.0, "data_refueling_gb": 0.0,
         "cycle_end_date": "2025-02-28"})


# --------------------------------------------------------------------------------------------- rendering
def test_render_result():
    assert render_result("Roaming enabled successfully") == "Roaming enabled successfully"
    assert render_result("caf\u00e9 \U0001F4F6") == "caf\u00e9 \U0001F4F6"
    record = {"a": 1.0, "b": None, "c": True, "d": "\u00e9"}
    assert render_result(record) == '{"a": 1.0, "b": null, "c": true, "d": "\\u00e9"}'
    assert render_result([record]) == "[" + render_result(record) + "]"
    assert render_result([]) == "[]"
    result = DictResult(msg="m", n=0.1 + 0.2, i=15, flag=False, none=None, rec=record, day="2025-02-28")
    assert render_result(result) == (
        '{"msg": "m", "n": "0.30000000000000004", "i": "15", "flag": "False", "none": null, '
        '"rec": {"a": 1.0, "b": null, "c": true, "d": "\\u00e9"}, "day": "2025-02-28"}')


# --------------------------------------------------------------------------------------------- read tools
JOHN = ('{"customer_id": "C1001", "full_name": "John Smith", "date_of_birth": "1985-06-15", "email": '
        '"john.smith@example.com", "phone_number": "555-123-2002", "address": {"street": "123 Main St", "city": '
        '"Anytown", "state": "CA", "zip_code": "90210"}, "account_status": "Active", "payment_methods": '
        '[{"method_type": "Credit Card", "account_number_last_4": "1235", "expiration_date": "12/2026"}], '
        '"line_ids": ["L1001", "L1002", "L1003"], "bill_ids": ["B1001", "B1002", "B1003"], "created_at": '
        '"2025-01-15 10:30:00", "last_extension_date": null, "goodwill_credit_used_this_year": 25.0}')


def test_customer_lookups(db):
    assert ok(db, "get_customer_by_id", customer_id="C1001") == JOHN
    assert ok(db, "get_customer_by_phone", phone_number="555-123-2002") == JOHN
    assert json.loads(ok(db, "get_customer_by_phone", phone_number="555-123-2003"))["customer_id"] == "C1001"
    assert json.loads(ok(db, "get_customer_by_phone", phone_number="555-123-2007"))["customer_id"] == "C1002"
    assert json.loads(ok(db, "get_customer_by_phone", phone_number="555-123-1004"))["customer_id"] == "C1004"
    assert err(db, "get_customer_by_phone", phone_number="5551232002") == (
        "Customer with phone number 5551232002 not found")
    assert err(db, "get_customer_by_id", customer_id="c1001") == "Customer with ID c1001 not found"
    assert err(db, "get_customer_by_id", customer_id=1001) == "Customer with ID 1001 not found"
    assert ok(db, "get_customer_by_name", full_name="jOHN smith", dob="1985-06-15") == "[" + JOHN + "]"
    assert ok(db, "get_customer_by_name", full_name="John Smith ", dob="1985-06-15") == "[]"
    assert ok(db, "get_customer_by_name", full_name="John Smith", dob="06/15/1985") == "[]"
    assert err(db, "get_customer_by_name", full_name=5, dob="1985-06-15") == "'int' object has no attribute 'lower'"


def test_get_details_by_id(db):
    assert ok(db, "get_details_by_id", id="C1001") == JOHN
    assert json.loads(ok(db, "get_details_by_id", id="P1002")) == {
        "plan_id": "P1002", "name": "Premium Plan", "data_limit_gb": 15.0, "price_per_month": 65.0,
        "data_refueling_price_per_gb": 2.0}
    assert ok(db, "get_details_by_id", id="D1002") == (
        '{"device_id": "D1002", "device_type": "phone", "model": "Smartphone Pro Max", "imei": "234567890123456", '
        '"is_esim_capable": true, "activated": true, "activation_date": "2025-02-15 11:45:00", '
        '"last_esim_transfer_date": "2025-01-20 09:30:00"}')
    assert ok(db, "get_details_by_id", id="L1003") == (
        '{"line_id": "L1003", "phone_number": "555-123-2003", "status": "Suspended", "plan_id": "P1001", '
        '"device_id": "D1003", "data_used_gb": 0.0, "data_refueling_gb": 0.0, "roaming_enabled": false, '
        '"contract_end_date": "2026-06-30", "last_plan_change_date": "2024-10-05", "last_sim_replacement_date": '
        'null, "suspension_start_date": "2025-02-01"}')
    assert ok(db, "get_details_by_id", id="B1003") == (
        '{"bill_id": "B1003", "customer_id": "C1001", "period_start": "2025-03-01", "period_end": "2025-03-31", '
        '"issue_date": "2025-03-01", "total_due": 0.0, "due_date": "2025-03-15", "line_items": [], "status": "Draft"}')
    assert err(db, "get_details_by_id", id="L9999") == "Line with ID L9999 not found"
    assert err(db, "get_details_by_id", id="D1") == "Device with ID D1 not found"
    assert err(db, "get_details_by_id", id="B1") == "Bill with ID B1 not found"
    assert err(db, "get_details_by_id", id="C9999") == "Customer with ID C9999 not found"
    assert err(db, "get_details_by_id", id="P7") == "Plan with ID P7 not found"
    assert err(db, "get_details_by_id", id="") == "Unknown ID format or type: "
    assert err(db, "get_details_by_id", id="l1002") == "Unknown ID format or type: l1002"
    assert err(db, "get_details_by_id", id=1002) == "'int' object has no attribute 'startswith'"


def test_get_bills_for_customer(db):
    def ids(text):
        return [b["bill_id"] for b in json.loads(text)]

    assert ids(ok(db, "get_bills_for_customer", customer_id="C1001")) == ["B1003", "B1002", "B1001"]
    assert ids(ok(db, "get_bills_for_customer", customer_id="C1001", limit=2)) == ["B1003", "B1002"]
    assert ok(db, "get_bills_for_customer", customer_id="C1001", limit=0) == "[]"
    assert ids(ok(db, "get_bills_for_customer", customer_id="C1001", limit=-1)) == ["B1003", "B1002"]
    assert ok(db, "get_bills_for_customer", customer_id="C1004") == "[]"
    assert err(db, "get_bills_for_customer", customer_id="C1001", limit="2") == (
        "slice indices must be integers or None or have an __index__ method")
    assert err(db, "get_bills_for_customer", customer_id="C1001", limit=2.0) == (
        "slice indices must be integers or None or have an __index__ method")
    assert err(db, "get_bills_for_customer", customer_id="C9") == "Customer with ID C9 not found"
    # equal issue dates keep bill_ids order (stable newest-first)
    find(db, "bills", "bill_id", "B1001")["issue_date"] = "2025-02-05"
    assert ids(ok(db, "get_bills_for_customer", customer_id="C1001")) == ["B1003", "B1001", "B1002"]
    full = json.loads(ok(db, "get_bills_for_customer", customer_id="C1002", limit=1))
    assert full == [find(db, "bills", "bill_id", "B1005")]


def test_get_data_usage_and_transfer(db):
    assert ok(db, "get_data_usage", customer_id="C1001", line_id="L1002") == (
        '{"line_id": "L1002", "data_used_gb": "8.7", "data_limit_gb": "15.0", "data_refueling_gb": "0.0", '
        '"cycle_end_date": "2025-02-28"}')
    assert err(db, "get_data_usage", customer_id="C1001", line_id="L1004") == "Line L1004 not found for customer C1001"
    assert err(db, "get_data_usage", customer_id="C9", line_id="L1002") == "Customer with ID C9 not found"
    assert ok(db, "transfer_to_human_agents", summary="help") == "Transfer successful"
    assert db_hash(db) == INITIAL_HASH


# --------------------------------------------------------------------------------------------- write tools
def test_suspend_and_resume(db):
    out = json.loads(ok(db, "suspend_line", customer_id="C1001", line_id="L1002", reason="travel"))
    assert out["message"] == "Line suspended successfully. $5/month holding fee will apply."
    assert out["line"]["status"] == "Suspended" and out["line"]["suspension_start_date"] == "2025-02-25"
    assert out["line"]["data_used_gb"] == 8.7 and out["line"]["roaming_enabled"] is True   # real values
    suspended = db_hash(db)
    assert suspended != INITIAL_HASH
    assert err(db, "suspend_line", customer_id="C1001", line_id="L1002", reason="x") == "Line must be active to suspend"
    assert err(db, "suspend_line", customer_id="C1001", line_id="L1005", reason="x") == (
        "Line L1005 not found for customer C1001")
    assert db_hash(db) == suspended
    out = json.loads(ok(db, "resume_line", customer_id="C1001", line_id="L1002"))
    assert out["message"] == "Line resumed successfully"
    assert out["line"]["status"] == "Active" and out["line"]["suspension_start_date"] is None
    assert db_hash(db) == INITIAL_HASH            # back to the initial state
    assert err(db, "resume_line", customer_id="C1001", line_id="L1001") == "Line must be suspended to resume"
    find(db, "lines", "line_id", "L1001")["status"] = "Pending Activation"
    assert json.loads(ok(db, "resume_line", customer_id="C1001", line_id="L1001"))["line"]["status"] == "Active"
    find(db, "lines", "line_id", "L1001")["status"] = "Closed"
    assert err(db, "resume_line", customer_id="C1001", line_id="L1001") == "Line must be suspended to resume"
    # a line listed by the customer but absent from the table
    db["customers"][0]["line_ids"].append("L7777")
    assert err(db, "resume_line", customer_id="C1001", line_id="L7777") == "Line with ID L7777 not found"


def test_send_payment_request_check_order(db):
    assert err(db, "send_payment_request", customer_id="C9", bill_id="B1002") == "Customer with ID C9 not found"
    assert err(db, "send_payment_request", customer_id="C1001", bill_id="B1005") == (
        "Bill B1005 not found for customer C1001")
    assert db_hash(db) == INITIAL_HASH
    assert ok(db, "send_payment_request", customer_id="C1001", bill_id="B1001") == (
        "Payment request sent to the customer for bill B1001")       # even a Paid bill
    assert find(db, "bills", "bill_id", "B1001")["status"] == "Awaiting Payment"
    # the awaiting check comes before the ownership check
    assert err(db, "send_payment_request", customer_id="C1001", bill_id="B1005") == (
        "A bill is already awaiting payment for this customer")
    assert err(db, "send_payment_request", customer_id="C1001", bill_id="B1002") == (
        "A bill is already awaiting payment for this customer")
    assert ok(db, "send_payment_request", customer_id="C1002", bill_id="B1005") == (
        "Payment request sent to the customer for bill B1005")
    # a listed bill missing from the table: the awaiting scan looks it up first
    db["customers"][3]["bill_ids"].append("B4242")
    assert err(db, "send_payment_request", customer_id="C1004", bill_id="B4242") == "Bill with ID B4242 not found"


def test_roaming(db):
    assert ok(db, "enable_roaming", customer_id="C1001", line_id="L1002") == "Roaming was already enabled"
    assert db_hash(db) == INITIAL_HASH
    assert ok(db, "disable_roaming", customer_id="C1001", line_id="L1002") == "Roaming disabled successfully"
    assert find(db, "lines", "line_id", "L1002")["roaming_enabled"] is False
    assert db_hash(db) != INITIAL_HASH
    assert ok(db, "disable_roaming", customer_id="C1001", line_id="L1002") == "Roaming was already disabled"
    assert ok(db, "enable_roaming", customer_id="C1001", line_id="L1002") == "Roaming enabled successfully"
    assert db_hash(db) == INITIAL_HASH
    assert err(db, "enable_roaming", customer_id="C1002", line_id="L1002") == "Line L1002 not found for customer C1002"


def test_refuel_data(db):
    assert ok(db, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=2.0) == (
        '{"message": "Successfully added 2.0 GB of data for line L1002 for $4.00", '
        '"new_data_refueling_gb": "2.0", "charge": "4.0"}')
    line = find(db, "lines", "line_id", "L1002")
    assert line["data_refueling_gb"] == 2.0
    bill = find(db, "bills", "bill_id", "B1003")
    assert bill["line_items"] == [{"description": "Data refueling: 2.0 GB at $2.0/GB", "amount": 4.0,
                                   "date": "2025-02-25", "item_type": "Charge"}]
    assert bill["total_due"] == 4.0 and type(bill["total_due"]) is float
    assert len(db["bills"]) == 6
    gold = db_hash(db)
    assert gold != INITIAL_HASH
    assert ok(db, "get_data_usage", customer_id="C1001", line_id="L1002") == (
        '{"line_id": "L1002", "data_used_gb": "8.7", "data_limit_gb": "15.0", "data_refueling_gb": "2.0", '
        '"cycle_end_date": "2025-02-28"}')
    # a second refuel accumulates on the same Draft bill; float arithmetic unrounded
    out = json.loads(ok(db, "refuel_data", customer_id="C1001", line_id="L1001", gb_amount=0.1))
    assert out == {"message": "Successfully added 0.1 GB of data for line L1001 for $0.50",
                   "new_data_refueling_gb": "0.1", "charge": "0.5"}
    assert bill["total_due"] == 4.5 and len(bill["line_items"]) == 2
    # an int 2 gives "2 GB" in the description and a different hash than 2.0
    other = load_db()
    assert ok(other, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=2) == (
        '{"message": "Successfully added 2 GB of data for line L1002 for $4.00", '
        '"new_data_refueling_gb": "2.0", "charge": "4.0"}')
    assert find(other, "bills", "bill_id", "B1003")["line_items"][0]["description"] == (
        "Data refueling: 2 GB at $2.0/GB")
    assert db_hash(other) != gold


def test_refuel_data_failures(db):
    assert err(db, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=0) == (
        "Refuel amount must be positive")
    assert err(db, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=-1.5) == (
        "Refuel amount must be positive")
    assert err(db, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount="2") == (
        "'<=' not supported between instances of 'str' and 'int'")
    assert err(db, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=None) == (
        "'<=' not supported between instances of 'NoneType' and 'int'")
    # the line check comes before the amount check
    assert err(db, "refuel_data", customer_id="C1001", line_id="L1009", gb_amount="2") == (
        "Line L1009 not found for customer C1001")
    assert err(db, "refuel_data", customer_id="C9", line_id="L1002", gb_amount=1.0) == "Customer with ID C9 not found"
    find(db, "lines", "line_id", "L1002")["plan_id"] = "P9"
    assert err(db, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=1.0) == "Plan with ID P9 not found"
    find(db, "lines", "line_id", "L1002")["plan_id"] = "P1002"
    assert db_hash(db) == INITIAL_HASH
    # no status check: a suspended line can be refuelled
    assert "for $5.00" in ok(db, "refuel_data", customer_id="C1001", line_id="L1003", gb_amount=1.0)


def test_refuel_data_creates_a_draft_bill(db):
    out = json.loads(ok(db, "refuel_data", customer_id="C1002", line_id="L1004", gb_amount=3.0))
    assert out["charge"] == str(3.0 * 0.1) and out["message"].endswith("for $0.30")
    new = db["bills"][-1]
    assert len(db["bills"]) == 7 and db["customers"][1]["bill_ids"][-1] == new["bill_id"]
    assert len(new["bill_id"]) == 9 and new["bill_id"][0] == "B" and int(new["bill_id"][1:], 16) >= 0
    assert new["bill_id"][1:] == new["bill_id"][1:].lower()
    assert new == {"bill_id": new["bill_id"], "customer_id": "C1002", "period_start": "2025-03-01",
                   "period_end": "2025-03-31", "issue_date": "2025-03-01", "total_due": 0.0 + 3.0 * 0.1,
                   "due_date": "2025-03-15",
                   "line_items": [{"description": "Data refueling: 3.0 GB at $0.1/GB", "amount": 3.0 * 0.1,
                                   "date": "2025-02-25", "item_type": "Charge"}],
                   "status": "Draft"}
    assert tuple(new) == BILL_FIELDS


# --------------------------------------------------------------------------------------------- non-tool functions
def test_set_data_usage(db):
    tools = TelecomTools(db)
    assert tools.set_data_usage("C1001", "L1002", 15.1) == "Data usage set to 15.1 GB for line L1002"
    assert ok(db, "get_data_usage", customer_id="C1001", line_id="L1002").startswith(
        '{"line_id": "L1002", "data_used_gb": "15.1"')
    h_float = db_hash(db)
    assert tools.set_data_usage("C1001", "L1002", 15) == "Data usage set to 15 GB for line L1002"
    assert type(find(db, "lines", "line_id", "L1002")["data_used_gb"]) is int
    assert '"data_used_gb": "15"' in ok(db, "get_data_usage", customer_id="C1001", line_id="L1002")
    assert '"data_used_gb": 15,' in ok(db, "get_details_by_id", id="L1002")
    h_int = db_hash(db)
    tools.set_data_usage("C1001", "L1002", 15.0)
    assert len({h_float, h_int, db_hash(db)}) == 3
    with pytest.raises(ValueError, match="^Line L1004 not found for customer C1001$"):
        tools.set_data_usage("C1001", "L1004", 1.0)


def test_suspend_line_for_overdue_bill(db):
    tools = TelecomTools(db)
    assert tools.suspend_line_for_overdue_bill("C1001", "L1002", "B1234321", False) == (
        "Line L1002 suspended for unpaid bill B1234321. Contract ended: False")
    bill = db["bills"][-1]
    assert bill == {"bill_id": "B1234321", "customer_id": "C1001", "period_start": "2025-01-01",
                    "period_end": "2025-01-31", "issue_date": "2025-01-01", "total_due": 65.0,
                    "due_date": "2025-01-15",
                    "line_items": [{"description": "Charge for line L1002", "amount": 65.0, "date": "2025-02-25",
                                    "item_type": "Charge"}],
                    "status": "Overdue"}
    assert tuple(bill) == BILL_FIELDS and db["customers"][0]["bill_ids"][-1] == "B1234321"
    line = find(db, "lines", "line_id", "L1002")
    assert (line["status"], line["suspension_start_date"], line["contract_end_date"]) == (
        "Suspended", "2025-02-25", "2026-12-31")
    assert tools.assert_overdue_bill_exists("C1001", "B1234321") is True
    assert tools.assert_no_overdue_bill("B1234321") is False
    assert tools.assert_line_status("C1001", "L1002", "Suspended") is True
    assert tools.assert_line_status("C1001", "L1002", "Active") is False
    with pytest.raises(ValueError, match="^Line must be active to suspend for unpaid bill$"):
        tools.suspend_line_for_overdue_bill("C1001", "L1002", "B1", True)
    with pytest.raises(ValueError, match="^Customer already has an overdue bill$"):
        tools.suspend_line_for_overdue_bill("C1001", "L1001", "B2", True)
    # the bill is paid through the payment flow (the sync's step), then no overdue bill remains
    assert ok(db, "send_payment_request", customer_id="C1001", bill_id="B1234321").endswith("B1234321")
    assert tools.assert_no_overdue_bill("B1234321") is False
    assert tools._set_bill_to_paid("B1234321") == "Bill B1234321 set to paid"
    assert tools.assert_no_overdue_bill("B1234321") is True
    with pytest.raises(ValueError, match="^Overdue bill B1234321 is not overdue$"):
        tools.assert_overdue_bill_exists("C1001", "B1234321")


def test_suspend_line_for_overdue_bill_contract_and_checks():
    db = load_db()
    tools = TelecomTools(db)
    assert tools.suspend_line_for_overdue_bill("C1001", "L1002", "B1234321", True).endswith("Contract ended: True")
    assert find(db, "lines", "line_id", "L1002")["contract_end_date"] == "2025-01-31"
    # line by id without an ownership check; the customer already has the Overdue B1005
    db = load_db()
    tools = TelecomTools(db)
    with pytest.raises(ValueError, match="^Customer already has an overdue bill$"):
        tools.suspend_line_for_overdue_bill("C1002", "L1001", "B1", False)
    with pytest.raises(ValueError, match="^Customer with ID C9 not found$"):
        tools.suspend_line_for_overdue_bill("C9", "L1001", "B1", False)
    with pytest.raises(ValueError, match="^Line with ID L9 not found$"):
        tools.suspend_line_for_overdue_bill("C1001", "L9", "B1", False)
    assert db_hash(db) == INITIAL_HASH


def test_assertions(db):
    tools = TelecomTools(db)
    assert tools.assert_data_refueling_amount("C1001", "L1002", 0.0) is True
    ok(db, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=2.0)
    assert tools.assert_data_refueling_amount("C1001", "L1002", 2.0) is True
    assert tools.assert_data_refueling_amount("C1001", "L1002", 2.0000001) is True
    assert tools.assert_data_refueling_amount("C1001", "L1002", 2.1) is False
    assert tools.assert_line_status("C1001", "L1003", "Suspended") is True
    with pytest.raises(ValueError, match="^Overdue bill B1005 not found$"):
        tools.assert_overdue_bill_exists("C1001", "B1005")
    assert tools.assert_overdue_bill_exists("C1002", "B1005") is True
    with pytest.raises(ValueError, match="^Overdue bill B1002 is not overdue$"):
        tools.assert_overdue_bill_exists("C1001", "B1002")
    with pytest.raises(ValueError, match="^Customer with ID C9 not found$"):
        tools.assert_overdue_bill_exists("C9", "B1005")
    assert tools.assert_no_overdue_bill("B1234321") is True      # does not exist
    assert tools.assert_no_overdue_bill("B1001") is True         # Paid
    assert tools.assert_no_overdue_bill("B1005") is False        # Overdue
    assert tools.assert_no_overdue_bill("B1002") is False        # Issued

"""The replay tool on tau2 telecom (`python -m jaxagent.envs.tau2.replay --domain telecom`): both hashes
after every line, user calls routed to the phone, the sync after each successful call, environment
functions of either side, env assertions, and the evaluator's components (ENV_ASSERTION, ACTION, and
the DB diagnostic whose target skips the sync)."""

import json
import subprocess
import sys

import pytest

from jaxagent.envs.tau2 import get_domain, replay
from jaxagent.envs.tau2.domains.telecom.db import INITIAL_HASH
from jaxagent.envs.tau2.domains.telecom.phone import INITIAL_USER_HASH, USER_TOOL_SCHEMAS_FILE
from jaxagent.envs.tau2.domains.telecom.tools import TOOL_SCHEMAS_FILE

TASKS = replay.load_tasks("telecom")


@pytest.fixture()
def state():
    return replay.ReplayState(get_domain("telecom"), TASKS)


def ask(state, obj):
    out = replay.handle(state, json.dumps(obj))
    assert list(out) != ["error"], out
    return out


def call(name, requestor="assistant", **arguments):
    return {"call": {"requestor": requestor, "name": name, "arguments": arguments}}


def env_fn(env_type, func_name, **arguments):
    return {"env_function": {"env_type": env_type, "func_name": func_name, "arguments": arguments}}


def test_a_bare_episode_has_tau2s_sanity_hashes(state):
    assert ask(state, {"episode": {}}) == {"db_hash": INITIAL_HASH, "user_db_hash": INITIAL_USER_HASH}


@pytest.mark.parametrize("tid", list(TASKS))
def test_gold_calls_succeed_and_score_one_an_empty_run_zero(state, tid):
    task = TASKS[tid]
    ask(state, {"episode": {"task_id": tid}})
    agent_wrote = False
    for a in task.actions:
        out = ask(state, call(a.name, a.requestor, **a.arguments))
        assert out["error"] is False, (a.name, out["content"])
        agent_wrote |= a.requestor == "assistant" and a.name != "transfer_to_human_agents"
    score = ask(state, {"score": {"task_id": tid, "messages": []}})
    assert score["reward"] == 1.0 and score["components"]["ENV_ASSERTION"] == 1.0
    assert score["components"]["ACTION"] == 1.0 and score["components"]["COMMUNICATE"] == 1.0
    # tau2's DB target replays the gold actions without the sync: it misses the gold run exactly where an
    # agent-side write reaches the phone through the sync
    assert score["components"]["DB"] == (0.0 if agent_wrote else 1.0)
    ask(state, {"episode": {"task_id": tid}})
    empty = ask(state, {"score": {"task_id": tid, "messages": []}})
    assert empty["reward"] == 0.0


def test_requestors_reach_only_their_own_toolkit(state):
    ask(state, {"episode": {"task_id": next(iter(TASKS))}})
    out = ask(state, call("get_customer_by_id", "user", customer_id="C1001"))
    assert out["content"] == "Error: Tool 'get_customer_by_id' not found." and out["error"] is True
    out = ask(state, call("toggle_airplane_mode", "assistant"))
    assert out["content"] == "Error: Tool 'toggle_airplane_mode' not found." and out["error"] is True
    out = ask(state, call("toggle_data", "user", extra=1))
    assert out["content"] == "Error: TelecomUserTools.toggle_data() got an unexpected keyword argument 'extra'"
    out = ask(state, {"call": {"requestor": "user", "name": "toggle_data", "arguments": {"requestor": "x"}}})
    assert "got multiple values for keyword argument 'requestor'" in out["content"]


def test_the_sync_carries_a_payment_request_to_the_phone_and_the_payment_back(state):
    before = ask(state, {"episode": {"init": [
        {"env_type": "user", "func_name": "set_user_info", "arguments": {"name": "John Smith",
                                                                         "phone_number": "555-123-2002"}}]}})
    out = ask(state, call("send_payment_request", customer_id="C1001", bill_id="B1002"))
    assert out["content"] == "Payment request sent to the customer for bill B1002"
    assert out["user_db_hash"] != before["user_db_hash"]   # the sync wrote the request on the phone
    out = ask(state, call("check_payment_request", "user"))
    assert out["content"].startswith("You have a payment request for bill B1002 of ")
    paid = ask(state, call("make_payment", "user"))
    assert paid["content"].startswith("Payment of ") and paid["db_hash"] != out["db_hash"]   # bill Paid
    bills = ask(state, env_fn("assistant", "get_bills_for_customer", customer_id="C1001"))["result"]
    assert [b["status"] for b in bills if b["bill_id"] == "B1002"] == ["Paid"]


def test_environment_functions_of_both_sides(state):
    tid = next(t for t in TASKS if "data_usage_exceeded" in t)
    ask(state, {"episode": {"task_id": tid}})
    out = ask(state, env_fn("user", "assert_mobile_data_status", expected_status=True))
    assert out == {"result": False, "raised": None, "db_hash": out["db_hash"], "user_db_hash": out["user_db_hash"]}
    out = ask(state, env_fn("assistant", "assert_data_refueling_amount", customer_id="C1001", line_id="L1002",
                            expected_amount=0.0))
    assert out["result"] is True
    stats = ask(state, env_fn("user", "get_statistics"))["result"]
    assert stats["num_tools"] == 30 and stats["num_read_tools"] == 15 and stats["num_write_tools"] == 15
    assert ask(state, env_fn("user", "get_db_hash"))["result"] == out["user_db_hash"]
    missing = ask(state, env_fn("user", "no_such_function"))
    assert missing["raised"] == "AttributeError: 'TelecomUserTools' object has no attribute 'no_such_function'"


def test_schemas_line_serves_both_toolkits_byte_for_byte():
    out = subprocess.run([sys.executable, "-m", "jaxagent.envs.tau2.replay", "--domain", "telecom", "--schemas"],
                         capture_output=True, text=True, check=True)
    line = json.loads(out.stdout)
    assert line["tools"] == json.loads(TOOL_SCHEMAS_FILE.read_text())["tools"]
    assert line["user_tools"] == json.loads(USER_TOOL_SCHEMAS_FILE.read_text())["tools"]


def test_a_failing_sync_answers_the_call_with_its_error_and_keeps_the_change(state):
    # tau2 syncs inside get_response's try: an unknown phone number fails the sync after the tool ran
    ask(state, {"episode": {}})
    info = ask(state, env_fn("user", "set_user_info", name="X", phone_number="000"))
    # run_env_function_call's sync raises after the function ran (its change stays)
    assert info["raised"] == "ValueError: Line with phone number 000 not found"
    out = ask(state, call("toggle_data", "user"))
    assert out == {"content": "Error: Line with phone number 000 not found", "error": True,
                   "db_hash": out["db_hash"], "user_db_hash": out["user_db_hash"]}
    assert out["user_db_hash"] != info["user_db_hash"]   # the toggle happened
    # every later call fails the same way, reads included (tau2 syncs after each successful call)
    assert ask(state, call("check_network_status", "user"))["content"] == out["content"]


def test_a_null_network_mode_is_tau2s_failure_text_after_a_search(state):
    ask(state, {"episode": {"task_id": next(iter(TASKS))}})
    out = ask(state, {"call": {"requestor": "user", "name": "set_network_mode_preference", "arguments": {"mode": None}}})
    assert out["error"] is False
    assert out["content"].startswith("Failed to set network mode: 'None' is not a valid option. Please use one of: "
                                     "4g_5g_preferred, 4g_only, 3g_only, 2g_only\nStatus Bar: ")


def test_toolkit_helpers_reached_by_getattr(state):
    ask(state, {"episode": {}})
    out = ask(state, env_fn("assistant", "get_available_plan_ids"))
    assert out["result"] == ["P1001", "P1002", "P1003", "P1004", "P1005"]
    line = ask(state, env_fn("assistant", "_get_line_by_phone", phone_number="555-123-2002"))["result"]
    assert line["line_id"] == "L1002"


def test_a_tasks_file_in_tau2s_object_form(tmp_path):
    raw = json.loads((get_domain("telecom").data_dir / "tasks_train.json").read_text())[:3]
    (tmp_path / "t.json").write_text(json.dumps({"tasks": raw}))
    assert list(replay.load_tasks("telecom", tmp_path / "t.json")) == [t["id"] for t in raw]

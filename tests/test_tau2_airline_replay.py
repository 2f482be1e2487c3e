"""The replay tool on tau2 airline (`python -m jaxagent.envs.tau2.replay --domain airline`): every train
task's gold calls end at its target hash, the oracle's score is DB x COMMUNICATE (the airline reward
needs no judge), environment functions return raw values and raise as tau2 does, and the schemas are
served as tau2 serves them."""

import json
import subprocess
import sys

import pytest

from jaxagent.envs.tau2 import get_domain, replay
from jaxagent.envs.tau2.agents import plan_for
from jaxagent.envs.tau2.domains.airline.db import INITIAL_HASH
from jaxagent.envs.tau2.domains.airline.tools import TOOL_SCHEMAS_FILE
from jaxagent.envs.tau2.scoring import target_hash

TASKS = replay.load_tasks("airline")


@pytest.fixture()
def state():
    return replay.ReplayState(get_domain("airline"), TASKS)


def ask(state, obj):
    out = replay.handle(state, json.dumps(obj))
    assert list(out) != ["error"], out
    return out


def call(name, **arguments):
    return {"call": {"requestor": "assistant", "name": name, "arguments": arguments}}


def env_fn(func_name, **arguments):
    return {"env_function": {"env_type": "assistant", "func_name": func_name, "arguments": arguments}}


def test_thirty_train_tasks_and_every_reward_basis_is_db_times_communicate():
    assert len(TASKS) == 30
    assert all(t.reward_basis == ("DB", "COMMUNICATE") for t in TASKS.values())


@pytest.mark.parametrize("tid", list(TASKS))
def test_gold_calls_reach_the_target_and_score_like_tau2(state, tid):
    task = TASKS[tid]
    assert ask(state, {"episode": {"task_id": tid}})["db_hash"] == INITIAL_HASH
    last = None
    for a in task.actions:
        last = ask(state, call(a.name, **a.arguments))
        assert last["error"] is False, (a.name, last["content"])   # no gold action fails (spec 5.3)
    assert (last["db_hash"] if last else INITIAL_HASH) == target_hash(task)
    texts = [{"role": "assistant", "content": t.content} for t in plan_for(task, ()) if t.content]
    out = ask(state, {"score": {"task_id": tid, "messages": texts}})
    assert out == {"reward": 1.0, "components": {"DB": 1.0, "COMMUNICATE": 1.0, "ACTION": 1.0}}
    # COMMUNICATE is in the airline basis: without the message that states the numbers, reward 0
    silent = ask(state, {"score": {"task_id": tid, "messages": []}})
    assert silent["reward"] == (0.0 if task.communicate_info else 1.0)


def test_the_communicate_check_drops_commas(state):
    ask(state, {"episode": {"task_id": "7"}})
    for a in TASKS["7"].actions:
        ask(state, call(a.name, **a.arguments))
    said = ask(state, {"score": {"task_id": "7", "messages": [{"role": "assistant", "content": "That is $1,628."}]}})
    assert said["reward"] == 1.0


def test_env_functions_return_raw_values_and_raise_as_tau2(state):
    ask(state, {"episode": {}})
    assert ask(state, env_fn("_get_new_reservation_id"))["result"] == "HATHAT"
    assert ask(state, env_fn("_get_new_payment_id"))["result"] == [3221322, 3221323, 3221324]
    assert ask(state, env_fn("get_flight_status", flight_number="HAT001", date="2024-05-01"))["result"] == "landed"
    assert ask(state, env_fn("has_tool", tool_name="think"))["result"] is False
    assert ask(state, env_fn("tool_type", tool_name="send_certificate"))["result"] == "write"
    assert ask(state, env_fn("get_statistics"))["result"] == {
        "num_tools": 14, "num_read_tools": 6, "num_write_tools": 6, "num_think_tools": 0, "num_generic_tools": 2}
    assert ask(state, env_fn("_get_user", user_id="nobody"))["raised"] == "ValueError: User nobody not found"
    bad = ask(state, env_fn("update_reservation_passengers", reservation_id="4WQ150", passengers=[{"dob": "x"}]))
    assert bad["raised"].startswith("ValidationError: 2 validation errors for Passenger\nfirst_name\n")
    assert ask(state, env_fn("_charge_update", user={}, payment_id="x", total_price=0))["raised"] == (
        "AttributeError: 'AirlineTools' object has no attribute '_charge_update'")
    sent = ask(state, env_fn("send_certificate", user_id="chen_jackson_3290", amount=10))
    assert sent["result"].startswith("Certificate certificate_3221322") and sent["db_hash"] != INITIAL_HASH


def test_init_actions_build_the_state(state):
    out = ask(state, {"episode": {"init": [{"env_type": "assistant", "func_name": "cancel_reservation",
                                            "arguments": {"reservation_id": "4WQ150"}}]}})
    assert out["db_hash"] != INITIAL_HASH
    assert ask(state, call("get_reservation_details", reservation_id="4WQ150"))["content"].endswith(
        '"status": "cancelled"}')


def test_cli_schemas_are_taus_bytes():
    out = subprocess.run([sys.executable, "-m", "jaxagent.envs.tau2.replay", "--domain", "airline", "--schemas"],
                         capture_output=True, check=True, timeout=120).stdout.decode()
    line = json.loads(out)
    assert json.dumps(line["tools"]) == json.dumps(json.loads(TOOL_SCHEMAS_FILE.read_text())["tools"])
    assert line["user_tools"] == []


def test_func_tools_and_user_calls_with_colliding_arguments(state):
    ask(state, {"episode": {}})
    assert ask(state, env_fn("_func_tools"))["raised"] == "TypeError: 'dict' object is not callable"
    out = ask(state, {"call": {"requestor": "user", "name": "x", "arguments": {"requestor": 1}}})
    assert out["content"].endswith("got multiple values for keyword argument 'requestor'") and out["error"] is True
    out = ask(state, {"call": {"requestor": "user", "name": "x", "arguments": {}}})
    assert out["content"] == replay.USER_TOOLS_UNAVAILABLE

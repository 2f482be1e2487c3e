"""The replay tool (`jaxagent.envs.tau2.replay`): its line protocol in-process through `handle`, and the
command line as a subprocess (one answer line per input line, --schemas, a bad --tasks file)."""

import io
import json
import subprocess
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxagent.envs.tau2 import get_domain, replay
from jaxagent.envs.tau2.agents import broken_plans, plan_for
from jaxagent.envs.tau2.domains.retail.tools import TOOL_SCHEMAS_FILE
from jaxagent.envs.tau2.scoring import target_hash

INITIAL_HASH = "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c"  # spec 4.2
EPISODE_KEYS = ["db_hash", "user_db_hash"]
CALL_KEYS = ["content", "error", "db_hash", "user_db_hash"]
ENV_KEYS = ["result", "raised", "db_hash", "user_db_hash"]
CANCEL = {"order_id": "#W4566809", "reason": "no longer needed"}   # a pending order (tests/test_tau2_replay.py)


@pytest.fixture(scope="module")
def tasks():
    return replay.load_tasks("retail")


@pytest.fixture()
def state(tasks):
    return replay.ReplayState(get_domain("retail"), tasks)


def ask(state, obj):
    """One line through the handler, checked to encode as one line of standard JSON."""
    out = replay.handle(state, json.dumps(obj))
    line = replay.encode(out)
    assert "\n" not in line and json.loads(line) == out
    return out


def call(name, requestor="assistant", **arguments):
    return {"call": {"requestor": requestor, "name": name, "arguments": arguments}}


def env_fn(func_name, env_type="assistant", **arguments):
    return {"env_function": {"env_type": env_type, "func_name": func_name, "arguments": arguments}}


def oracle_lines(turns):
    """The oracle's turns as protocol lines: each tool call a `call` line, each text a score message."""
    calls, texts = [], []
    for t in turns:
        for c in t.tool_calls:
            calls.append(call(c.name, **c.arguments))
        if t.content:
            texts.append({"role": "assistant", "content": t.content})
    return calls, texts


# ============================================================================ episode
def test_fresh_episode_hashes_to_the_sanity_value(state):
    assert ask(state, {"episode": {}}) == {"db_hash": INITIAL_HASH, "user_db_hash": None}
    assert ask(state, {"episode": {"task_id": "0"}}) == {"db_hash": INITIAL_HASH, "user_db_hash": None}
    assert ask(state, {"episode": {"init": []}}) == {"db_hash": INITIAL_HASH, "user_db_hash": None}


def test_episode_init_runs_env_functions_and_a_failing_one_leaves_no_episode(state):
    init = [{"env_type": "assistant", "func_name": "cancel_pending_order", "arguments": CANCEL}]
    out = ask(state, {"episode": {"init": init}})
    assert list(out) == EPISODE_KEYS and out["db_hash"] != INITIAL_HASH
    again = ask(state, {"episode": {}})
    assert ask(state, call("cancel_pending_order", **CANCEL))["db_hash"] == out["db_hash"]  # same state either way
    assert again["db_hash"] == INITIAL_HASH
    bad = ask(state, {"episode": {"init": init + init}})   # the second cancel raises: tau2's set_state stops
    assert ("episode.init[1] (cancel_pending_order) raised ValueError: Non-pending order cannot be cancelled"
            in bad["error"])
    assert "before any episode" in ask(state, call("calculate", expression="1+1"))["error"]


def test_episode_from_a_tasks_file_with_an_initial_state(tmp_path, tasks):
    raw = json.loads((get_domain("retail").data_dir / "tasks_train.json").read_text())[0]
    raw = dict(raw, id="init_cancel", initial_state={"initialization_actions": [
        {"env_type": "assistant", "func_name": "cancel_pending_order", "arguments": CANCEL}]})
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([raw]))
    st_ = replay.new_state("retail", path)
    assert list(st_.tasks) == ["init_cancel"]
    out = ask(st_, {"episode": {"task_id": "init_cancel"}})
    ref = replay.new_state("retail")
    ask(ref, {"episode": {}})
    assert out["db_hash"] == ask(ref, call("cancel_pending_order", **CANCEL))["db_hash"] != INITIAL_HASH
    assert "unknown task id" in ask(st_, {"episode": {"task_id": "0"}})["error"]   # only the file's tasks


# ============================================================================ call
def test_gold_actions_through_call_lines_end_at_the_target_hash(state, tasks):
    checked = 0
    for tid in list(tasks)[::6]:
        task = tasks[tid]
        out = ask(state, {"episode": {"task_id": tid}})
        for a in task.actions:
            out = ask(state, call(a.name, **a.arguments))
            assert list(out) == CALL_KEYS and isinstance(out["content"], str) and isinstance(out["error"], bool)
        assert out["db_hash"] == target_hash(task), tid
        checked += bool(task.write_actions)
    assert checked >= 8


def test_call_matches_the_tool_messages_and_user_calls_get_taus_error(state):
    ask(state, {"episode": {}})
    out = ask(state, call("find_user_id_by_name_zip", first_name="Yusuf", last_name="Rossi", zip="19122"))
    assert out == {"content": "yusuf_rossi_9620", "error": False, "db_hash": INITIAL_HASH, "user_db_hash": None}
    assert ask(state, call("get_order_details", order_id="W2378156"))["content"] == "Error: Order not found"
    assert ask(state, call("nope"))["content"] == "Error: Tool 'nope' not found."
    user = ask(state, call("cancel_pending_order", requestor="user", **CANCEL))
    assert user == {"content": "Error: User tools not available", "error": True, "db_hash": INITIAL_HASH,
                    "user_db_hash": None}
    default = ask(state, {"call": {"name": "cancel_pending_order", "arguments": CANCEL}})   # requestor: assistant
    assert default["error"] is False and '"status": "cancelled"' in default["content"]
    assert default["db_hash"] != INITIAL_HASH


# ============================================================================ env_function
def test_env_function_returns_raw_values_and_a_bool_stays_a_bool(state):
    ask(state, {"episode": {}})
    out = ask(state, env_fn("has_tool", tool_name="calculate"))
    assert out["result"] is True and out["raised"] is None and list(out) == ENV_KEYS
    assert '"result": true' in replay.encode(out)
    assert ask(state, env_fn("has_tool", tool_name="think"))["result"] is False
    assert ask(state, env_fn("tool_type", tool_name="cancel_pending_order"))["result"] == "write"
    assert ask(state, env_fn("get_statistics"))["result"] == {
        "num_tools": 16, "num_read_tools": 7, "num_write_tools": 7, "num_think_tools": 0, "num_generic_tools": 2}
    assert ask(state, env_fn("get_db_hash"))["result"] == INITIAL_HASH
    order = ask(state, env_fn("get_order_details", order_id="#W2378156"))["result"]
    assert isinstance(order, dict) and order["order_id"] == "#W2378156" and order["cancel_reason"] is None
    assert ask(state, env_fn("_get_order", order_id="#W2378156"))["result"] == order
    assert ask(state, env_fn("calculate", expression="1 + 2"))["result"] == "3.0"
    types = json.loads(ask(state, env_fn("list_all_product_types"))["result"])   # a JSON text, as tau2 returns
    assert len(types) == 50


def test_env_function_raises_as_tau2_does(state):
    ask(state, {"episode": {}})
    assert ask(state, env_fn("_get_order", order_id="#W0"))["raised"] == "ValueError: Order not found"
    assert ask(state, env_fn("_is_pending_order", order={"status": "pending"}))["raised"] == \
        "AttributeError: 'dict' object has no attribute 'status'"
    assert ask(state, env_fn("_check_counts"))["raised"] == \
        "AttributeError: 'RetailTools' object has no attribute '_check_counts'"   # ours, not tau2's
    assert ask(state, env_fn("anything", env_type="user"))["raised"] == \
        "AttributeError: 'NoneType' object has no attribute 'anything'"
    assert ask(state, env_fn("has_tool"))["raised"] == \
        "TypeError: ToolKitBase.has_tool() missing 1 required positional argument: 'tool_name'"
    assert ask(state, env_fn("tool_type", tool_name="think"))["raised"] == "KeyError: 'think'"
    assert ask(state, env_fn("use_tool", tool_name="think"))["raised"] == "ValueError: Tool 'think' not found."
    bad_zip = {"user_id": "yusuf_rossi_9620", "address1": "1 A St", "address2": "", "city": "X", "state": "PA",
               "country": "USA", "zip": 19122}
    assert ask(state, env_fn("modify_user_address", **bad_zip))["raised"].startswith(
        "ValidationError: 1 validation error for UserAddress\nzip\n")
    assert "update_db" in ask(state, env_fn("update_db", update_data={}))["error"]
    write = ask(state, env_fn("use_tool", tool_name="cancel_pending_order", **CANCEL))
    assert write["result"]["status"] == "cancelled" and write["db_hash"] != INITIAL_HASH


# ============================================================================ score
@pytest.mark.parametrize("tid", ["0", "2", "34", "43", "57"])
def test_score_of_the_oracle_gives_db_1_and_communicate_1(state, tasks, tid):
    task = tasks[tid]
    calls, texts = oracle_lines(plan_for(task, task.actions))
    ask(state, {"episode": {"task_id": tid}})
    for c in calls:
        ask(state, c)
    out = ask(state, {"score": {"task_id": tid, "messages": texts}})
    assert list(out) == ["reward", "components"]
    comps = out["components"]
    assert comps["DB"] == 1.0 and comps["COMMUNICATE"] == 1.0 and comps["ACTION"] == 1.0
    if task.reward_basis == ("DB",):
        assert "NL_ASSERTION" not in comps
    else:   # a judge is needed only when the task has assertions; without one it is null and left out
        assert comps["NL_ASSERTION"] == (None if task.nl_assertions else 1.0)
    assert out["reward"] == 1.0
    # without the last message the communicate strings are missing (where there are any)
    short = ask(state, {"score": {"task_id": tid, "messages": texts[:-1]}})
    assert short["components"]["COMMUNICATE"] == (0.0 if task.communicate_info else 1.0)
    assert short["reward"] == 1.0          # COMMUNICATE is in no retail task's reward basis


@pytest.mark.parametrize("tid", ["0", "1", "43"])
def test_score_of_a_broken_plan_gives_db_0(state, tasks, tid):
    plans = broken_plans(tasks[tid])
    assert plans
    for variant, turns in plans.items():
        calls, texts = oracle_lines(turns)
        ask(state, {"episode": {"task_id": tid}})
        for c in calls:
            ask(state, c)
        out = ask(state, {"score": {"task_id": tid, "messages": texts}})
        assert out["components"]["DB"] == 0.0 and out["reward"] == 0.0, variant


def test_score_replays_like_tau2(state, tasks):
    ask(state, {"episode": {}})
    ask(state, call("cancel_pending_order", requestor="user", **CANCEL))   # changes nothing, replays to the same error
    out = ask(state, {"score": {"task_id": "57", "messages": []}})
    assert out["components"]["DB"] == 1.0 and out["reward"] == 1.0
    # the episode started elsewhere than task 57's initial state: the recorded output cannot be reproduced
    ask(state, {"episode": {"init": [{"env_type": "assistant", "func_name": "cancel_pending_order",
                                      "arguments": CANCEL}]}})
    assert ask(state, call("cancel_pending_order", **CANCEL))["error"] is True
    err = ask(state, {"score": {"task_id": "57", "messages": []}})["error"]
    assert "call 0 (cancel_pending_order)" in err and "strict" in err
    # a write outside the gold target
    ask(state, {"episode": {}})
    ask(state, call("cancel_pending_order", **CANCEL))
    assert ask(state, {"score": {"task_id": "57", "messages": []}})["components"]["DB"] == 0.0


# ============================================================================ bad lines
@pytest.mark.parametrize("line, expected", [
    ("", "empty line"),
    ("not json", "not JSON"),
    ("[1, 2]", "JSON list"),
    ('{"episode": {}, "call": {}}', "exactly one of"),
    ('{"play": {}}', "unknown command 'play'"),
    ('{"episode": 3}', "episode=3: expected a JSON object"),
    ('{"episode": {"task": "0"}}', "episode: unknown field(s) ['task']"),
    ('{"episode": {"task_id": "zzz"}}', "episode.task_id='zzz': unknown task id"),
    ('{"episode": {"task_id": 0}}', "episode.task_id=0: expected a string"),
    ('{"episode": {"task_id": "0", "init": []}}', "both task_id and init"),
    ('{"episode": {"init": [{"env_type": "admin", "func_name": "x", "arguments": {}}]}}',
     "episode.init[0].env_type='admin': expected one of 'assistant', 'user'"),
    ('{"call": {"name": "calculate"}}', "call: missing field(s) ['arguments']"),
    ('{"call": {"name": 5, "arguments": {}}}', "call.name=5: expected a string"),
    ('{"call": {"name": "calculate", "arguments": [1]}}', "call.arguments=[1]: expected a JSON object"),
    ('{"call": {"requestor": "bot", "name": "calculate", "arguments": {}}}', "call.requestor='bot'"),
    ('{"env_function": {"env_type": "assistant", "func_name": "x"}}', "env_function: missing field(s) ['arguments']"),
    ('{"score": {"task_id": "0"}}', "score: missing field(s) ['messages']"),
    ('{"score": {"task_id": "0", "messages": [{"role": "tool", "content": "x"}]}}', "score.messages[0].role='tool'"),
    ('{"score": {"task_id": "0", "messages": [{"role": "assistant", "content": 1}]}}',
     "score.messages[0].content=1: expected a string or null"),
    ('{"call": {"name": "calculate", "arguments": {"expression": NaN}}}', "no NaN or Infinity"),
    ('{"call": {"name": "calculate", "arguments": {"expression": 1e400}}}', "expected a finite number"),
    (b'\xff{"episode": {}}', "not UTF-8"),
    ("[" * 100_000, "nested too deeply"),
])
def test_bad_lines_are_named_and_the_tool_goes_on(state, line, expected):
    out = replay.handle(state, line)
    assert list(out) == ["error"] and expected in out["error"], out
    assert replay.handle(state, '{"episode": {}}') == {"db_hash": INITIAL_HASH, "user_db_hash": None}


def test_commands_before_any_episode_are_errors(state):
    for obj in (call("calculate", expression="1+1"), env_fn("has_tool", tool_name="calculate"),
                {"score": {"task_id": "0", "messages": []}}):
        assert "before any episode" in ask(state, obj)["error"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=12),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                    max_leaves=8)
FIELDS = ["task_id", "init", "requestor", "name", "arguments", "env_type", "func_name", "messages", "role", "content"]
NAMES = ["calculate", "cancel_pending_order", "get_order_details", "has_tool", "tool_type", "use_tool",
         "_get_order", "_is_pending_order", "get_db_hash", "update_db", "__init__", "nope"]
VALUES = st.one_of(JSON, st.sampled_from(NAMES + ["0", "57", "assistant", "user", "#W4566809"]),
                   st.just(CANCEL), st.just({"expression": "2 ** 3"}),
                   st.just([{"role": "assistant", "content": "x"}]))


@st.composite
def near_valid(draw):
    """An object with a command key (mostly a real one) and a body of protocol fields and odd values."""
    cmd = draw(st.sampled_from(list(replay.COMMANDS) + ["bogus"]))
    body = draw(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4))
    return json.dumps({cmd: body})


PARAMS = ["order_id", "user_id", "item_ids", "new_item_ids", "payment_method_id", "reason", "expression", "tool_name",
          "order", "product_id", "zip", "email"]


@st.composite
def well_formed(draw):
    """A command of the right shape whose names and argument values are drawn (tools run on junk)."""
    args = draw(st.dictionaries(st.sampled_from(PARAMS), VALUES, max_size=3))
    cmd = draw(st.sampled_from(["call", "env_function", "score", "episode"]))
    if cmd == "call":
        body = {"requestor": draw(st.sampled_from(["assistant", "user"])), "name": draw(st.sampled_from(NAMES)),
                "arguments": args}
    elif cmd == "env_function":
        body = {"env_type": draw(st.sampled_from(["assistant", "user"])), "func_name": draw(st.sampled_from(NAMES)),
                "arguments": args}
    elif cmd == "score":
        body = {"task_id": draw(st.sampled_from(["0", "2", "57", "x"])),
                "messages": draw(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["assistant", "user"]),
                                                                 "content": st.none() | st.text(max_size=20)}),
                                          max_size=2))}
    else:
        init = [{"env_type": "assistant", "func_name": draw(st.sampled_from(NAMES)), "arguments": args}]
        body = draw(st.sampled_from([{}, {"task_id": "57"}, {"init": init}]))
    return json.dumps({cmd: body})


JUNK = st.one_of(st.text(max_size=40), JSON.map(json.dumps), near_valid(), well_formed(), well_formed(),
                 st.binary(max_size=40).filter(lambda b: b"\n" not in b))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(lines=st.lists(JUNK, min_size=1, max_size=6))
def test_junk_never_crashes_and_gets_one_json_object_line_each(state, lines):
    if state.db is None:   # hypothesis reuses the fixture: one episode, which the junk may replace or end
        replay.handle(state, '{"episode": {}}')
    raw = [x if isinstance(x, bytes) else x.replace("\n", " ").encode("utf-8", "surrogatepass") for x in lines]
    out = io.StringIO()
    assert replay.serve(state, io.BytesIO(b"\n".join(raw) + b"\n"), out) == len(raw)
    answers = out.getvalue().split("\n")
    assert answers[-1] == "" and len(answers) == len(raw) + 1
    for a in answers[:-1]:
        obj = json.loads(a)
        assert isinstance(obj, dict)
        if list(obj) == ["error"]:   # a bad line, named
            assert isinstance(obj["error"], str) and not obj["error"].startswith("internal error"), obj
        else:
            assert list(obj) in (EPISODE_KEYS, CALL_KEYS, ENV_KEYS, ["reward", "components"]), obj


# ============================================================================ the command line
def run_cli(*args, stdin=b""):
    return subprocess.run([sys.executable, "-m", "jaxagent.envs.tau2.replay", *args], input=stdin,
                          capture_output=True, timeout=120, check=False)


def test_cli_answers_one_line_per_line_and_goes_on_after_errors():
    lines = [b'{"call": {"name": "calculate", "arguments": {"expression": "1+1"}}}',   # before any episode
             b'{"episode": {}}',
             b"garbage",
             b'{"call": {"requestor": "assistant", "name": "cancel_pending_order", "arguments": '
             + json.dumps(CANCEL).encode() + b"}}",
             b"",
             b'{"env_function": {"env_type": "assistant", "func_name": "has_tool", "arguments": {"tool_name": "x"}}}',
             b'\xfe\xff\r',
             b'{"score": {"task_id": "57", "messages": [{"role": "assistant", "content": "done"}]}}',
             '{"episode": {"task_id": "caf\u00e9 \u2028"}}'.encode()]
    proc = run_cli("--domain", "retail", stdin=b"\n".join(lines))   # the last line has no newline
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(x) for x in proc.stdout.decode("ascii").splitlines()]
    assert len(out) == len(lines)
    assert "before any episode" in out[0]["error"]
    assert out[1] == {"db_hash": INITIAL_HASH, "user_db_hash": None}
    assert "not JSON" in out[2]["error"]
    assert out[3]["error"] is False and out[3]["db_hash"] != INITIAL_HASH
    assert "empty line" in out[4]["error"]
    assert out[5]["result"] is False and out[5]["db_hash"] == out[3]["db_hash"]
    assert "not UTF-8" in out[6]["error"]
    assert out[7] == {"reward": 0.0, "components": {"DB": 0.0, "COMMUNICATE": 1.0, "ACTION": 1.0,
                                                    "NL_ASSERTION": 1.0}}
    assert "unknown task id" in out[8]["error"]


def test_cli_answers_each_line_before_the_next_arrives():
    proc = subprocess.Popen([sys.executable, "-m", "jaxagent.envs.tau2.replay"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    watchdog = threading.Timer(60, proc.kill)   # a missing answer fails the test instead of hanging it
    watchdog.start()
    try:
        for line, key in ((b'{"episode": {}}', "db_hash"), (b"{}", "error"),
                          (b'{"call": {"name": "calculate", "arguments": {"expression": "2 * 3"}}}', "content")):
            proc.stdin.write(line + b"\n")
            proc.stdin.flush()                       # the input stays open: the answer must come now
            answer = json.loads(proc.stdout.readline())
            assert key in answer, answer
        assert answer["content"] == "6.0"
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0 and proc.stdout.read() == b""
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()


def test_cli_schemas_are_the_packaged_ones_byte_for_byte():
    proc = run_cli("--domain", "retail", "--schemas")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.decode("ascii")
    assert text.endswith("\n") and text.count("\n") == 1
    packaged = json.loads(TOOL_SCHEMAS_FILE.read_text(encoding="utf-8"))["tools"]
    served = json.loads(text)
    assert served["user_tools"] == [] and list(served) == ["tools", "user_tools"]
    assert json.dumps(served["tools"]) == json.dumps(packaged)        # same order, keys in the same order
    assert text == '{"tools": ' + json.dumps(packaged) + ', "user_tools": []}\n'


def test_cli_bad_tasks_file_and_domain(tmp_path, capsys):
    bad = tmp_path / "tasks.json"
    bad.write_text('[{"id": "x"}]')
    assert replay.main(["--tasks", str(bad)]) == 2
    assert "user_scenario" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        replay.main(["--domain", "nowhere"])
    assert "nowhere" in capsys.readouterr().err

"""tau2 retail: the task file (parsing, selection, scenarios) and scoring (spec section 4),
hand-computed from the task data or taken from the spec."""

import copy
import json

import pytest

from jaxagent.envs.tau2 import scoring
from jaxagent.envs.tau2.db import db_hash
from jaxagent.envs.tau2.domains.retail.db import load_db, load_tasks
from jaxagent.envs.tau2.tasks import (
    Task,
    TaskError,
    load_task_set,
    parse_task,
    render_scenario,
    select_tasks,
)

from tests.tau2_helpers import EXCHANGE_0, INITIAL_HASH, NO_WRITE_TASKS, TASKS


# ============================================================================ tasks.py
def test_load_task_set_has_the_74_train_tasks_in_file_order():
    raw_ids = [t["id"] for t in load_tasks()]
    assert len(TASKS) == 74 and list(TASKS) == raw_ids
    assert raw_ids[:6] == ["0", "1", "2", "3", "4", "6"] and raw_ids[-1] == "113"
    # facts of spec 4.6 / 5
    assert sum(bool(t.nl_assertions) for t in TASKS.values()) == 29
    assert sum(bool(t.communicate_info) for t in TASKS.values()) == 25
    assert sorted((t.id for t in TASKS.values() if t.nl_assertions and not t.communicate_info), key=int) == [
        "105", "106", "107", "109", "110", "113"]
    assert sum(t.instructions["unknown_info"] is not None for t in TASKS.values()) == 56
    assert TASKS["34"].reward_basis == ("DB",) and TASKS["0"].reward_basis == ("DB", "NL_ASSERTION")
    t0 = TASKS["0"]
    assert [a.name for a in t0.actions] == ["find_user_id_by_name_zip", "get_order_details", "get_product_details",
                                            "get_product_details", "exchange_delivered_order_items"]
    assert dict(t0.actions[-1].arguments) == EXCHANGE_0 and t0.actions[-1].compare_args is None
    assert [a.name for a in t0.write_actions] == ["exchange_delivered_order_items"]
    assert TASKS["10"].actions[-1].compare_args == ()  # the transfer: compare_args []


def _raw0():
    return copy.deepcopy(load_tasks()[0])


def _set(raw, path, value):
    d = raw
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return raw


@pytest.mark.parametrize("path, value, pattern", [
    (("evaluation_criteria", "reward_basis"), ["DB", "FOO"],
     r"task\[3\] \(id='0'\)\.evaluation_criteria\.reward_basis=\['DB', 'FOO'\]: expected names among DB"),
    (("user_scenario", "instructions", "reason_for_call"), 42,
     r"task\[3\] \(id='0'\)\.user_scenario\.instructions\.reason_for_call=42: expected a string"),
    (("evaluation_criteria", "actions"), ["oops"],
     r"task\[3\] \(id='0'\)\.evaluation_criteria\.actions\[0\]='oops': expected an object"),
    (("evaluation_criteria", "actions"), [{"name": "cancel_pending_order", "arguments": ["#W1"]}],
     r"task\[3\] \(id='0'\)\.evaluation_criteria\.actions\[0\]\.arguments=\['#W1'\]: expected an object"),
    (("evaluation_criteria", "communicate_info"), ["ok", 3],
     r"task\[3\] \(id='0'\)\.evaluation_criteria\.communicate_info=\['ok', 3\]: expected a list of strings"),
])
def test_parse_task_errors_name_the_task_the_field_and_the_value(path, value, pattern):
    with pytest.raises(TaskError, match=pattern):
        parse_task(_set(_raw0(), path, value), 3)
    assert issubclass(TaskError, ValueError)
    assert parse_task(_raw0(), 3) == TASKS["0"]  # the unmodified task parses to the loaded one


def test_parse_task_defaults_the_reward_basis_to_db_communicate():
    assert parse_task(_set(_raw0(), ("evaluation_criteria", "reward_basis"), None)).reward_basis == ("DB", "COMMUNICATE")


def test_load_task_set_file_errors(tmp_path):
    dup = tmp_path / "dup"
    dup.mkdir()
    (dup / "tasks_train.json").write_text(json.dumps([_raw0(), load_tasks()[1], _raw0()]))
    with pytest.raises(TaskError, match=r"task ids \['0'\] occur more than once"):
        load_task_set(dup)
    with pytest.raises(FileNotFoundError, match=r"env\.tau2\.data_dir"):
        load_task_set(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"split='test': .*tasks_test\.json does not exist.*env\.tau2\.data_dir"):
        load_task_set(dup, "test")  # a data directory without the test split
    with pytest.raises(TaskError, match="split='validation': expected one of 'train', 'test'"):
        load_task_set(None, "validation")
    assert len(load_task_set(None, "test")) == 40  # retail ships tau2's test split
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "tasks_train.json").write_text(json.dumps(load_tasks()[:2]))
    assert list(load_task_set(ok)) == ["0", "1"]


def test_select_tasks():
    ids = list(TASKS)
    assert select_tasks(TASKS, "all") == ids and select_tasks(TASKS, None) == ids
    assert select_tasks(TASKS, "0:5") == ["0", "1", "2", "3", "4"]  # positions, not ids (there is no task 5)
    assert select_tasks(TASKS, "70:") == ["109", "110", "112", "113"]
    assert select_tasks(TASKS, "0,2") == ["0", "2"] and select_tasks(TASKS, " 6 , 113") == ["6", "113"]
    assert select_tasks(TASKS, ["24", "10"]) == ["24", "10"]
    with pytest.raises(TaskError, match=r"unknown task ids \['5', 'nope'\]"):
        select_tasks(TASKS, "0,5,nope")
    with pytest.raises(TaskError, match="expected 'all', a slice"):
        select_tasks(TASKS, "a:b")


def _task(**kw):
    base = {"id": "h", "instructions": {"domain": "retail", "reason_for_call": "You want a refund.\n\nThen you leave.",
                                        "known_info": "You are Ann Lee in 12345.", "unknown_info": None,
                                        "task_instructions": "Be brief."},
            "persona": None, "actions": (), "communicate_info": (), "nl_assertions": (),
            "reward_basis": ("DB", "NL_ASSERTION")}
    base.update(kw)
    return Task(**base)


def test_render_scenario_exact_text():
    # tau2: each label on its own line, its text indented by a tab (textwrap.indent: a blank line
    # stays blank), the whole instruction block indented by one more tab; Unknown info absent when None
    assert render_scenario(_task()) == (
        "<scenario>\n"
        "Instructions:\n"
        "\tDomain: retail\n"
        "\tReason for call:\n"
        "\t\tYou want a refund.\n"
        "\n"
        "\t\tThen you leave.\n"
        "\tKnown info:\n"
        "\t\tYou are Ann Lee in 12345.\n"
        "\tTask instructions:\n"
        "\t\tBe brief.\n"
        "</scenario>")
    ins = dict(_task().instructions, reason_for_call="R.", unknown_info="You forgot your email.")
    assert render_scenario(_task(instructions=ins, persona="A calm person.")) == (
        "<scenario>\n"
        "Persona:\n"
        "\tA calm person.\n"
        "Instructions:\n"
        "\tDomain: retail\n"
        "\tReason for call:\n"
        "\t\tR.\n"
        "\tKnown info:\n"
        "\t\tYou are Ann Lee in 12345.\n"
        "\tUnknown info:\n"
        "\t\tYou forgot your email.\n"
        "\tTask instructions:\n"
        "\t\tBe brief.\n"
        "</scenario>")


# ============================================================================ scoring.py
def test_communicate_reward_hand_cases():
    cr = scoring.communicate_reward
    # commas are removed from the message, not from the expected string
    assert cr(_task(communicate_info=("1,000",)), ["It costs 1,000 dollars."]) == 0.0
    assert cr(_task(communicate_info=("1,000",)), ["It costs 1000 dollars."]) == 0.0
    assert cr(_task(communicate_info=("1000",)), ["It costs 1,000 dollars."]) == 1.0
    assert cr(_task(communicate_info=("Polyester",)), ["it is POLYESTER"]) == 1.0  # case-insensitive
    two = _task(communicate_info=("54.04", "41.64"))
    assert cr(two, ["refund of $54.04", "you save $41.64"]) == 1.0  # each in some message
    assert cr(two, ["refund of $54.04", "", "you save $41.65"]) == 0.0
    assert cr(_task(), []) == 1.0  # empty list


def test_action_matches_semantics():
    am = scoring.action_matches
    gold = {"order_id": "#W1", "reason": "no longer needed"}
    assert am("cancel_pending_order", gold, None, "cancel_pending_order", dict(gold))
    assert am("cancel_pending_order", gold, None, "cancel_pending_order", {"order_id": "#W1"})  # gold key omitted
    assert not am("cancel_pending_order", gold, None, "cancel_pending_order", dict(gold, note="x"))  # extra key
    assert not am("cancel_pending_order", gold, None, "cancel_pending_order", {"order_id": "#W2"})
    assert not am("cancel_pending_order", gold, None, "modify_pending_order_address", dict(gold))
    assert am("cancel_pending_order", gold, ["order_id"], "cancel_pending_order", {"order_id": "#W1", "reason": "x"})
    assert not am("cancel_pending_order", gold, ["reason"], "cancel_pending_order", {"order_id": "#W1"})
    assert am("transfer_to_human_agents", {"summary": "a"}, [], "transfer_to_human_agents", {"summary": "b"})
    assert not am("transfer_to_human_agents", {"summary": "a"}, [], "calculate", {})
    # a compared key absent from both the gold action and the call compares equal (tau2 filters both dicts)
    assert am("cancel_pending_order", gold, ["order_id", "note"], "cancel_pending_order", {"order_id": "#W1"})
    assert not am("cancel_pending_order", gold, ["note"], "cancel_pending_order", {"note": "x"})
    items = {"order_id": "#W1", "item_ids": ["1", "2"]}
    assert not am("x", items, None, "x", {"order_id": "#W1", "item_ids": ["2", "1"]})  # list order matters
    t = _task(actions=(TASKS["10"].actions[-1],))
    assert scoring.action_reward(t, [("transfer_to_human_agents", {"summary": "anything"})]) == 1.0
    assert scoring.action_reward(TASKS["0"], [(a.name, a.arguments) for a in TASKS["0"].actions[:-1]]) == 0.0
    assert scoring.action_reward(TASKS["0"], [(a.name, a.arguments) for a in TASKS["0"].actions]) == 1.0


def _msgs(*texts):
    return [{"role": "user", "content": "hi"}] + [{"role": "assistant", "content": t, "tool_calls": []} for t in texts]


def test_score_product_modes_and_terminations():
    t24, db0 = TASKS["24"], load_db()  # target == the initial DB; communicate ("polyester", "cotton"); 1 assertion
    said = _msgs("Yours is Polyester, the other one is cotton.")
    s = scoring.score(t24, final_db=db0, messages=said, termination="user_stop")
    assert (s.reward, s.mode, s.basis, s.scored) == (1.0, "offline", ("DB", "COMMUNICATE"), True)
    assert s.components == {"DB": 1.0, "COMMUNICATE": 1.0, "ACTION": 1.0}
    s = scoring.score(t24, final_db=db0, messages=_msgs("Yours is polyester."), termination="user_stop")
    assert s.reward == 0.0 and s.components["DB"] == 1.0 and s.components["COMMUNICATE"] == 0.0
    changed = load_db()
    changed["users"]["sofia_hernandez_5364"] = {}
    s = scoring.score(t24, final_db=changed, messages=said, termination="user_stop")
    assert s.reward == 0.0 and s.components["DB"] == 0.0 and s.components["COMMUNICATE"] == 1.0
    # unscored terminations: reward 0, components kept
    for term in ("max_steps", "too_many_errors", "agent_error"):
        s = scoring.score(t24, final_db=db0, messages=said, termination=term)
        assert (s.reward, s.scored, s.termination) == (0.0, False, term) and s.components["DB"] == 1.0
    # tau2 mode: the task's basis DB x NL_ASSERTION; COMMUNICATE is diagnostic there
    with pytest.raises(ValueError, match=r"task '24'.*env\.tau2\.judge"):
        scoring.score(t24, final_db=db0, messages=said, termination="user_stop", mode="tau2")
    s = scoring.score(t24, final_db=db0, messages=_msgs("nothing"), termination="user_stop", mode="tau2", nl=1.0)
    assert (s.reward, s.basis) == (1.0, ("DB", "NL_ASSERTION")) and s.components["COMMUNICATE"] == 0.0
    assert scoring.score(t24, final_db=db0, messages=said, termination="user_stop", mode="tau2", nl=0.0).reward == 0.0
    assert scoring.score(t24, final_db=changed, messages=said, termination="user_stop", mode="tau2", nl=1.0).reward == 0.0
    # a task with no assertions needs no verdict in tau2 mode (NL = 1); task 34's basis is DB alone
    s = scoring.score(TASKS["10"], final_db=db0, messages=said, termination="user_stop", mode="tau2")
    assert s.reward == 1.0 and s.components["NL_ASSERTION"] == 1.0
    s = scoring.score(TASKS["34"], final_db=db0, messages=said, termination="user_stop", mode="tau2")
    assert (s.reward, s.basis, s.components["DB"]) == (0.0, ("DB",), 0.0) and "NL_ASSERTION" not in s.components
    with pytest.raises(ValueError, match="mode='judge'"):
        scoring.score(t24, final_db=db0, messages=said, termination="user_stop", mode="judge")
    d = scoring.score(t24, final_db=db0, messages=said, termination="user_stop").to_dict()
    assert d["scoring_mode"] == "offline" and d["basis"] == ["DB", "COMMUNICATE"]


def test_target_hash_equals_the_initial_hash_only_for_the_no_write_tasks():
    assert db_hash(load_db()) == INITIAL_HASH
    same = {tid for tid, t in TASKS.items() if scoring.target_hash(t) == INITIAL_HASH}
    assert same == NO_WRITE_TASKS


def test_parse_verdicts():
    good = 'Sure.\n```json\n{"results": [{"expectedOutcome": "a", "reasoning": "r", "metExpectation": true}, ' \
           '{"expectedOutcome": "b", "reasoning": "r", "metExpectation": false}]}\n```'
    assert scoring.parse_verdicts(good, 2) == ([True, False], None)
    flags, err = scoring.parse_verdicts(good, 3)
    assert flags is None and "2 results; expected 3" in err
    flags, err = scoring.parse_verdicts('{"results": [{"metExpectation": "yes"}]}', 1)
    assert flags is None and "boolean metExpectation" in err
    assert scoring.parse_verdicts("all met", 1) == (None, "no JSON object in the judge's reply")
    flags, err = scoring.parse_verdicts('{"results": [tru]}', 1)
    assert flags is None and "not valid JSON" in err
    flags, err = scoring.parse_verdicts('{"verdicts": []}', 1)
    assert flags is None and "no results" in err


def test_judge_messages_one_line_per_message():
    msgs = [{"role": "user", "content": "I want a refund.", "reaction": "provide_info"},
            {"role": "assistant", "content": None, "tool_calls": [{"name": "calculate", "arguments": {}}]},
            {"role": "tool", "content": "2.5", "name": "calculate"},
            {"role": "assistant", "content": "Your refund is 2.5.", "tool_calls": []}]
    out = scoring.judge_messages(_task(nl_assertions=("Agent says 2.5.", "Agent is polite.")), msgs)
    assert [m["role"] for m in out] == ["system", "user"] and out[0]["content"] == scoring.JUDGE_SYSTEM_PROMPT
    assert out[1]["content"] == ("Transcript:\nuser: I want a refund.\nassistant: None\ntool: 2.5\n"
                                 "assistant: Your refund is 2.5.\n\nExpected outcomes:\n- Agent says 2.5.\n"
                                 "- Agent is polite.")

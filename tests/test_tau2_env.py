"""tau2 retail episodes: the task file, scoring (spec section 4), the scripted and LLM customers
(section 5), the episode rules of `Tau2RetailEnv`, the oracle/broken-variant bar on all 74 train
tasks, and the HTTP paths (LLM customer, NL judge, endpoint agent) against a loopback server.

Expected values are hand-computed from the task data or taken from the spec; the database tools
themselves are covered by tests/test_tau2_tools.py."""

import asyncio
import collections
import contextlib
import copy
import dataclasses
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jaxagent.credit.reaction import DEFAULT_POLARITY
from jaxagent.envs.base import AgentMessage
from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig
from jaxagent.envs.tau2_retail import scoring
from jaxagent.envs.tau2_retail.agents import (
    BROKEN_VARIANTS,
    EndpointAgent,
    OracleAgent,
    ScriptedAgent,
    broken_plans,
    play,
)
from jaxagent.envs.tau2_retail.customer import (
    GREETING,
    STOP,
    STOP_TOKENS,
    TRANSFER,
    Identity,
    ScriptedCustomer,
    customer_config,
    first_person,
    identity_of,
)
from jaxagent.envs.tau2_retail.db import db_hash, load_db, load_policy, load_tasks
from jaxagent.envs.tau2_retail.env import EpisodeLimits, Tau2RetailEnv, llm_customers, scripted_customers
from jaxagent.envs.tau2_retail.tasks import (
    Action,
    Task,
    TaskError,
    load_task_set,
    parse_task,
    render_scenario,
    select_tasks,
)
from jaxagent.envs.tau2_retail.tools import TOOL_NAMES, tool_schemas
from jaxagent.text.toolcalls import ToolCall

TASKS = load_task_set()
INITIAL_HASH = "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c"  # spec 4.2
NO_WRITE_TASKS = {"10", "24", "25", "50", "57", "67", "105"}  # spec 4.3: target == initial DB
RFC_0 = ("I received my order #W2378156 and wish to exchange the mechanical keyboard for the same one but with "
         "clicky switches and the smart thermostat for one compatible with Google Home instead of Apple HomeKit. "
         "If there is no keyboard that is clicky, RGB backlight, full size, I'd go for no backlight.")
EXCHANGE_0 = {"order_id": "#W2378156", "item_ids": ["1151293680", "4983901480"],
              "new_item_ids": ["7706410293", "7747408585"], "payment_method_id": "credit_card_9513926"}


def run(coro):
    return asyncio.run(coro)


def call(name, **args):
    return AgentMessage("", (ToolCall(name, args),))


class SpyCustomer:
    """A ScriptedCustomer that records what it was told."""

    def __init__(self, task, view, **kw):
        self.inner = ScriptedCustomer(task, view, **kw)
        self.heard = []

    async def opening(self):
        return await self.inner.opening()

    async def respond(self, text):
        self.heard.append(text)
        return await self.inner.respond(text)

    async def aclose(self):
        return None


def spy_env(**kw):
    spies = []

    def make(task, view):
        spies.append(SpyCustomer(task, view, **kw.pop("customer_kw", {})))
        return spies[-1]

    return Tau2RetailEnv(TASKS, customer=make, **kw), spies


async def episode(env, task_id, turns):
    """reset, then each turn in order; returns (reset, [steps])."""
    reset = await env.reset(task_id, 0)
    steps = []
    for t in turns:
        steps.append(await env.step(t))
    return reset, steps


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
    with pytest.raises(TaskError, match="split='test'"):
        load_task_set(None, "test")
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


# ============================================================================ customer.py
def test_first_person():
    assert first_person("You received your order #W1 and you're unhappy.") == "I received my order #W1 and I'm unhappy."
    assert first_person("If the agent asks you to confirm, you'd rather keep your item.") == \
        "If the agent asks me to confirm, I'd rather keep my item."
    assert first_person("You are Yusuf Rossi in zip code 19122.") == "I am Yusuf Rossi in zip code 19122."
    assert first_person("Tell the agent you want it yourself.") == "Tell the agent I want it myself."
    assert first_person(TASKS["0"].instructions["reason_for_call"]) == RFC_0


def test_identity_of():
    assert identity_of(TASKS["0"]) == Identity(first_name="Yusuf", last_name="Rossi", zip="19122")  # gold lookup
    assert identity_of(TASKS["10"]) == Identity(email="mia.garcia2723@example.com", user_id="mia_garcia_4516")
    assert identity_of(TASKS["57"]) == Identity(zip="92133", user_id="ivan_hernandez_6923")  # known info only
    assert identity_of(TASKS["72"]) == Identity(first_name="Ivan", last_name="Khan", zip="28243")  # "You name is"


def _reply(step):
    assert len(step.messages) == 1 and step.messages[0].role == "user"
    m = step.messages[0]
    assert m.reaction in DEFAULT_POLARITY
    return m.content, m.reaction


def test_scripted_customer_opening_and_identity_answers():
    # task 57 (user id and zip only) has no gold action, so its goal holds from the start and the
    # customer would stop at once; the same customer with a pending write goes on answering
    tasks = dict(TASKS, **{"57": dataclasses.replace(TASKS["57"], actions=(
        Action("57_w", "cancel_pending_order", {"order_id": "#W6247578", "reason": "no longer needed"}),))})

    async def main():
        out = {}
        for tid in ("0", "10", "57"):
            env = Tau2RetailEnv(tasks, customer=scripted_customers())
            reset, steps = await episode(env, tid, [AgentMessage("Could you give me your email address?")])
            out[tid] = reset, steps[0]
        return out

    out = run(main())
    reset = out["0"][0]
    assert reset.messages[1].content == RFC_0 and reset.messages[1].reaction == "provide_info"
    assert _reply(out["0"][1]) == (
        "I do not remember my email address. My name is Yusuf Rossi and my zip code is 19122.", "provide_info")
    assert _reply(out["10"][1]) == ("My email is mia.garcia2723@example.com.", "provide_info")
    assert _reply(out["57"][1]) == ("I do not remember my email address.", "be_vague")


def test_scripted_customer_confirms_only_a_matching_proposal():
    ok = ("Shall I exchange items 1151293680 and 4983901480 of order #W2378156 for 7706410293 and 7747408585, "
          "paying the difference with credit_card_9513926? Please confirm.")
    wrong = ok.replace("7747408585", "7747408586")

    async def main(text):
        env = Tau2RetailEnv(TASKS, customer=scripted_customers())
        _, steps = await episode(env, "0", [AgentMessage(text)])
        return steps[0]

    s = run(main(ok))
    assert _reply(s) == ("Yes, please go ahead.", "confirm") and not s.done
    s = run(main(wrong))
    assert _reply(s) == ("No, that is not what I want. As I said: " + RFC_0, "reject") and not s.done


def test_scripted_customer_gives_up_after_patience_idle_replies():
    async def main():
        env = Tau2RetailEnv(TASKS, customer=scripted_customers(patience=2))
        _, steps = await episode(env, "0", [AgentMessage("Hmm."), AgentMessage("Let me think.")])
        return env, steps

    env, (s1, s2) = run(main())
    assert _reply(s1) == ("As I said: " + RFC_0, "be_vague") and not s1.done
    text, label = _reply(s2)
    assert label == "complain" and text.endswith(STOP) and s2.done
    assert s2.info["termination"] == "user_stop" and env.result.details["stop_token"] == STOP
    assert s2.reward == 0.0 and env.result.scored and env.result.components["DB"] == 0.0
    with pytest.raises(ValueError, match="patience=0"):
        ScriptedCustomer(TASKS["0"], env, patience=0)


@pytest.mark.parametrize("tid, label, reward", [("0", "complain", 0.0), ("10", "accept", 1.0)])
def test_scripted_customer_answers_a_transfer_with_the_transfer_token(tid, label, reward):
    async def main():
        env = Tau2RetailEnv(TASKS, customer=scripted_customers())
        _, steps = await episode(env, tid, [call("transfer_to_human_agents", summary="needs a human"),
                                            AgentMessage("I have transferred you to a human agent.")])
        return env, steps

    env, (s1, s2) = run(main())
    assert [m.content for m in s1.messages] == ["Transfer successful"] and not s1.done
    assert _reply(s2) == (TRANSFER, label) and s2.done
    assert s2.info["termination"] == "user_stop" and env.result.details["stop_token"] == TRANSFER
    # task 10's target is the untouched DB and it has no communicate strings: the transfer is a success
    assert s2.reward == reward == env.outcome_reward()


def test_scripted_customer_stops_complaining_after_an_unexpected_write():
    async def main():
        env = Tau2RetailEnv(TASKS, customer=scripted_customers())
        _, steps = await episode(env, "0", [
            call("cancel_pending_order", order_id="#W6247578", reason="no longer needed"),  # Yusuf's, not gold
            AgentMessage("Done. Anything else?")])
        return env, steps

    env, (s1, s2) = run(main())
    assert '"status": "cancelled"' in s1.messages[0].content
    assert _reply(s2) == ("That is not what I asked for. " + STOP, "complain") and s2.done
    assert env.unexpected_writes() == [("cancel_pending_order", {"order_id": "#W6247578", "reason": "no longer needed"})]
    assert s2.reward == 0.0 and env.result.components["DB"] == 0.0


# ============================================================================ env.py
def test_reset_messages_and_tools():
    async def main():
        env = Tau2RetailEnv(TASKS, customer=scripted_customers())
        reset = await env.reset("0", 7)
        with pytest.raises(KeyError, match="task_id='5'"):
            await env.reset("5", 0)
        return env, reset

    env, reset = run(main())
    assert [m.role for m in reset.messages] == ["system", "user"]
    assert load_policy() in reset.messages[0].content and reset.messages[0].reaction is None
    assert reset.messages[1].content == RFC_0
    assert len(reset.tools) == 16 and sorted(t["function"]["name"] for t in reset.tools) == list(TOOL_NAMES)
    assert list(reset.tools) == list(tool_schemas())       # tau2's own schemas, in tau2's order
    assert env.report()["seed"] == 7 and env.report()["termination"] == "unfinished"


def test_tool_calls_answer_one_tool_message_each_and_no_customer_message():
    env, spies = spy_env()

    async def main():
        return await episode(env, "0", [AgentMessage("", (
            ToolCall("find_user_id_by_name_zip", {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}),
            ToolCall("get_order_details", {"order_id": "W2378156"}),
            ToolCall("no_such_tool", {})))])

    _, (s,) = run(main())
    assert [(m.role, m.content, m.tool_call_id, m.name) for m in s.messages] == [
        ("tool", "yusuf_rossi_9620", "call_0", "find_user_id_by_name_zip"),
        ("tool", "Error: Order not found", "call_1", "get_order_details"),
        ("tool", "Error: Tool 'no_such_tool' not found.", "call_2", "no_such_tool")]
    assert not s.done and s.info["tool_errors"] == 2 and spies[0].heard == []


def test_text_with_tool_calls_is_routed_as_tool_calls_and_its_text_counts():
    async def main(first_text):
        env, spies = spy_env()
        _, steps = await episode(env, "24", [
            AgentMessage(first_text, (ToolCall("list_all_product_types", {}),)),
            AgentMessage("Anything else I can help with?")])
        return env, spies[0], steps

    env, spy, (s1, s2) = run(main("Your shirts are polyester and cotton."))
    assert [m.role for m in s1.messages] == ["tool"] and s1.messages[0].content.startswith('{"Action Camera": ')
    assert spy.heard == ["Anything else I can help with?"]  # the mixed message never reached the customer
    assert s2.done and _reply(s2)[1] == "accept" and s2.reward == 1.0
    assert env.result.components["COMMUNICATE"] == 1.0
    # control: without that text the goal is not met and the customer goes on
    env, spy, (s1, s2) = run(main(""))
    assert not s2.done and _reply(s2)[1] == "be_vague" and env.result is None


def test_empty_message_is_an_agent_error_and_step_after_the_end_raises():
    env = Tau2RetailEnv(TASKS, customer=scripted_customers())

    async def main():
        with pytest.raises(RuntimeError, match="expected reset"):
            await env.step(AgentMessage("hello"))
        _, (s,) = await episode(env, "24", [AgentMessage("   ")])
        with pytest.raises(RuntimeError, match="no episode in progress"):
            await env.step(AgentMessage("hello again"))
        return s

    s = run(main())
    assert s.done and s.messages == () and s.reward == 0.0 and s.info["termination"] == "agent_error"
    assert env.result.components["DB"] == 1.0 and not env.result.scored  # task 24: untouched DB is the target
    assert env.report()["termination"] == "agent_error"


def test_unparseable_calls_give_error_tool_messages_that_count():
    async def main():
        env = Tau2RetailEnv(TASKS, customer=scripted_customers())
        return await episode(env, "24", [
            AgentMessage("", (), ("invalid_json",)),
            AgentMessage("", (ToolCall("calculate", {"expression": "1 + 1"}),), ("bad_arguments",))])

    _, (s1, s2) = run(main())
    assert len(s1.messages) == 1 and s1.messages[0].role == "tool"
    assert s1.messages[0].content.startswith("Error: the tool call could not be parsed (invalid_json)")
    assert s1.info["tool_errors"] == 1 and not s1.done
    assert [m.content[:42] for m in s2.messages] == ["2.0", "Error: the tool call could not be parsed ("]
    assert "(bad_arguments)" in s2.messages[1].content and s2.info["tool_errors"] == 2


def test_ten_error_tool_messages_end_the_episode_with_reward_zero():
    bad = call("get_order_details", order_id="#W0000000")

    async def main():
        env = Tau2RetailEnv(TASKS, customer=scripted_customers())
        _, steps = await episode(env, "24", [bad] * 8 + [AgentMessage("", (), ("invalid_json",)), bad])
        return env, steps

    env, steps = run(main())
    assert [s.done for s in steps] == [False] * 9 + [True]
    assert [s.info["tool_errors"] for s in steps] == list(range(1, 11))
    last = steps[-1]
    assert last.info["termination"] == "too_many_errors" and last.reward == 0.0 and len(last.messages) == 1
    assert env.result.components["DB"] == 1.0 and not env.result.scored  # the DB matches, still 0
    assert env.result.details["tool_errors"] == 10


def test_max_steps_ends_the_episode():
    read = call("get_order_details", order_id="#W2378156")

    async def main(limit, turns, tid="0"):
        env, spies = spy_env(limits=EpisodeLimits(max_steps=limit))
        _, steps = await episode(env, tid, turns)
        return env, spies[0], steps

    # reset = step 1 (the customer's opening); each tool batch = 2 steps (call + results)
    env, _, (s1, s2) = run(main(5, [read, read]))
    assert not s1.done and s2.done and s2.info["termination"] == "max_steps" and s2.reward == 0.0
    assert len(s2.messages) == 1 and s2.messages[0].role == "tool"
    # an agent text that reaches the limit ends the episode before the customer replies (tau2 checks
    # after every step whose next recipient is not the environment)
    env, spy, (s1, s2) = run(main(4, [read, AgentMessage("What is your email?")]))
    assert s2.done and s2.info["termination"] == "max_steps" and s2.messages == () and spy.heard == []
    # task 24: saying both materials makes the customer stop (step 3); at max_steps=3 the limit wins
    said = AgentMessage("Your shirts are polyester and cotton.")
    env, _, (s,) = run(main(3, [said], "24"))
    assert s.done and s.info["termination"] == "max_steps" and s.reward == 0.0 and STOP in s.messages[0].content
    assert env.result.components == {"DB": 1.0, "COMMUNICATE": 1.0, "ACTION": 1.0} and not env.result.scored
    env, _, (s,) = run(main(4, [said], "24"))
    assert s.info["termination"] == "user_stop" and s.reward == 1.0
    with pytest.raises(ValueError, match="max_steps=0"):
        EpisodeLimits(max_steps=0)


def test_database_is_isolated_per_episode():
    async def main():
        a = Tau2RetailEnv(TASKS, customer=scripted_customers())
        b = Tau2RetailEnv(TASKS, customer=scripted_customers())
        await a.reset("0", 0)
        await b.reset("0", 0)
        s = await a.step(call("cancel_pending_order", order_id="#W6247578", reason="no longer needed"))
        c = Tau2RetailEnv(TASKS, customer=scripted_customers())
        await c.reset("0", 0)
        return a, b, c, s

    a, b, c, s = run(main())
    assert '"status": "cancelled"' in s.messages[0].content
    assert a.db["orders"]["#W6247578"]["status"] == "cancelled" and a.db_hash() != INITIAL_HASH
    assert b.db["orders"]["#W6247578"]["status"] == "pending" and b.db_hash() == INITIAL_HASH
    assert c.db_hash() == INITIAL_HASH and db_hash(load_db()) == INITIAL_HASH


# ============================================================================ agents.py: the bar
def test_oracle_scores_one_and_every_broken_variant_zero_on_all_74_tasks():
    async def main():
        oracle, broken = [], []
        for tid, task in TASKS.items():
            oracle.append(await play(Tau2RetailEnv(TASKS, customer=scripted_customers()), OracleAgent(), tid))
            for kind, turns in broken_plans(task).items():
                rep = await play(Tau2RetailEnv(TASKS, customer=scripted_customers()), ScriptedAgent(turns), tid)
                broken.append((kind, rep))
        return oracle, broken

    oracle, broken = run(main())
    assert [r["task_id"] for r in oracle] == list(TASKS)
    bad = [(r["task_id"], r["termination"], r["score"]["components"], r["score"]["reward"]) for r in oracle
           if r["termination"] != "user_stop" or r["score"]["components"]["DB"] != 1.0 or r["score"]["reward"] != 1.0]
    assert bad == []
    assert all(r["score"]["scoring_mode"] == "offline" for r in oracle)
    counts = collections.Counter(kind for kind, _ in broken)
    assert set(counts) == set(BROKEN_VARIANTS) and all(counts[k] >= 60 for k in BROKEN_VARIANTS), counts
    leaked = [(kind, r["task_id"]) for kind, r in broken if r["score"]["components"]["DB"] != 0.0]
    assert leaked == [] and all(r["score"]["reward"] == 0.0 for _, r in broken)
    labels = {m["reaction"] for r in oracle + [r for _, r in broken] for m in r["messages"] if m["role"] == "user"}
    assert labels <= set(DEFAULT_POLARITY), labels - set(DEFAULT_POLARITY)


# ============================================================================ HTTP paths
@contextlib.contextmanager
def serve(replies):
    """A loopback chat-completions server answering with ``replies`` in order (a str is the
    message content, a dict the whole message); yields the list of request bodies it received."""
    requests = []
    lock = threading.Lock()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                requests.append(body)
                r = replies[min(len(requests), len(replies)) - 1]
            msg = {"role": "assistant", "content": r} if isinstance(r, str) else r
            data = json.dumps({"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield requests, f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def _config(url):
    return LLMUserConfig(base_url=url, model="sim", temperature=0.0, max_retries=0, connect_timeout_s=2.0,
                         read_timeout_s=10.0, trust_env=False)


def test_llm_customer_end_to_end():
    replies = ['{"utterance": "I want to exchange two items of a delivered order.", "strategy": "provide_info"}',
               '{"utterance": "I do not remember it.", "strategy": "be_vague"}',
               '{"utterance": "###TRANSFER###", "strategy": "accept"}']
    with serve(replies) as (requests, url):
        async def main():
            async with LLMUserClient(customer_config(_config(url))) as client:
                env = Tau2RetailEnv(TASKS, customer=llm_customers(client))
                reset = await env.reset("0", 0)
                s1 = await env.step(call("find_user_id_by_name_zip", first_name="Yusuf", last_name="Rossi",
                                         zip="19122"))
                n_after_tool = len(requests)
                s2 = await env.step(AgentMessage("What is your email address?"))
                s3 = await env.step(AgentMessage("Transferring you now.", (
                    ToolCall("transfer_to_human_agents", {"summary": "SUMMARY-7781"}),)))
                s4 = await env.step(AgentMessage("You are now with a human agent."))
                return env, reset, s1, n_after_tool, s2, s3, s4

        env, reset, s1, n_after_tool, s2, s3, s4 = run(main())

    assert len(requests) == 3 and n_after_tool == 1  # tool calls cost no simulator request
    system = requests[0]["messages"][0]
    assert system["role"] == "system" and render_scenario(TASKS["0"]) in system["content"]
    assert all(t in system["content"] for t in STOP_TOKENS)
    for r in requests:
        first_user = next(m for m in r["messages"] if m["role"] == "user")
        assert first_user["content"] == GREETING and r["messages"][1] == first_user
        assert {m["role"] for m in r["messages"]} <= {"system", "user", "assistant"}
        assert all(set(m) == {"role", "content"} for m in r["messages"])
    wire = json.dumps(requests)
    for secret in ("yusuf_rossi_9620", "SUMMARY-7781", "Transfer successful", "find_user_id_by_name_zip",
                   "transfer_to_human_agents", "Transferring you now."):
        assert secret not in wire, secret
    assert [(m["role"], m["content"]) for m in requests[2]["messages"][1:]] == [
        ("user", GREETING),
        ("assistant", json.dumps({"utterance": "I want to exchange two items of a delivered order.",
                                  "strategy": "provide_info"})),
        ("user", "What is your email address?"),
        ("assistant", json.dumps({"utterance": "I do not remember it.", "strategy": "be_vague"})),
        ("user", "You are now with a human agent.")]
    assert (reset.messages[1].content, reset.messages[1].reaction) == (
        "I want to exchange two items of a delivered order.", "provide_info")
    assert [m.role for m in s1.messages] == ["tool"] and s1.messages[0].content == "yusuf_rossi_9620"
    assert _reply(s2) == ("I do not remember it.", "be_vague") and not s2.done
    assert [m.content for m in s3.messages] == ["Transfer successful"]
    assert _reply(s4) == (TRANSFER, "accept") and s4.done and s4.info["termination"] == "user_stop"
    assert env.result.details["stop_token"] == TRANSFER and env.result.scored
    assert s4.reward == 0.0 and env.result.components["DB"] == 0.0  # the exchange was not made


@pytest.mark.parametrize("verdicts, reward", [((True, True), 1.0), ((True, False), 0.0)])
def test_tau2_scoring_with_a_judge_server(verdicts, reward):
    task = TASKS["19"]  # two assertions; DB x NL_ASSERTION
    assert len(task.nl_assertions) == 2
    verdict = json.dumps({"results": [{"expectedOutcome": a, "reasoning": "checked", "metExpectation": v}
                                      for a, v in zip(task.nl_assertions, verdicts)]})
    with serve(["Here is my grading:\n" + verdict]) as (requests, url):
        async def main():
            async with LLMUserClient(_config(url)) as judge:
                env = Tau2RetailEnv(TASKS, customer=scripted_customers(), scoring_mode="tau2", judge=judge)
                return await play(env, OracleAgent(), "19")

        rep = run(main())

    assert len(requests) == 1
    msgs = requests[0]["messages"]
    assert msgs[0] == {"role": "system", "content": scoring.JUDGE_SYSTEM_PROMPT}
    # tau2's transcript opens with the fixed greeting, then the customer's first message
    assert msgs[1]["content"].startswith("Transcript:\nassistant: Hi! How can I help you today?\nuser: "
                                         + first_person(task.instructions["reason_for_call"]))
    assert "\nassistant: None\n" in msgs[1]["content"]
    assert msgs[1]["content"].endswith("Expected outcomes:\n" + "\n".join("- " + a for a in task.nl_assertions))
    s = rep["score"]
    assert rep["termination"] == "user_stop" and s["scoring_mode"] == "tau2" and s["basis"] == ["DB", "NL_ASSERTION"]
    assert s["components"]["DB"] == 1.0 and s["components"]["NL_ASSERTION"] == reward and s["reward"] == reward
    assert s["details"]["judge"] == {"verdicts": list(verdicts)}


def test_tau2_scoring_without_a_judge():
    said = AgentMessage("Your shirts are polyester and cotton.")

    async def main():
        env = Tau2RetailEnv(TASKS, customer=scripted_customers(), scoring_mode="tau2")
        await env.reset("24", 0)
        with pytest.raises(ValueError, match=r"env\.tau2\.judge"):
            await env.step(said)
        # a task without assertions needs no judge: task 10's transfer scores DB 1 x NL 1
        env = Tau2RetailEnv(TASKS, customer=scripted_customers(), scoring_mode="tau2")
        _, steps = await episode(env, "10", [call("transfer_to_human_agents", summary="s"), AgentMessage("Done.")])
        return env, steps[-1]

    env, s = run(main())
    assert s.done and s.reward == 1.0 and env.result.mode == "tau2" and env.result.components["NL_ASSERTION"] == 1.0
    with pytest.raises(ValueError, match="scoring_mode='both'"):
        Tau2RetailEnv(TASKS, customer=scripted_customers(), scoring_mode="both")


def _tool_call(cid, name, arguments):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_endpoint_agent_plays_through_openai_tool_calls():
    replies = [
        {"role": "assistant", "content": None, "tool_calls": [
            _tool_call("c_A", "find_user_id_by_email", json.dumps({"email": "mia.garcia2723@example.com"}))]},
        {"role": "assistant", "content": None, "tool_calls": [
            _tool_call("c_B", "get_user_details", '{"user_id": ')]},  # truncated JSON arguments
        {"role": "assistant", "content": "", "tool_calls": [
            _tool_call("c_C", "transfer_to_human_agents", json.dumps({"summary": "cross refunds"}))]},
        {"role": "assistant", "content": "You are now with a human agent."},
    ]
    with serve(replies) as (requests, url):
        env = Tau2RetailEnv(TASKS, customer=scripted_customers())

        async def main():
            async with LLMUserClient(_config(url)) as client:
                return await play(env, EndpointAgent(client), "10")

        rep = run(main())

    assert len(requests) == 4 and rep["agent_turns"] == 4
    assert rep["termination"] == "user_stop" and rep["score"]["reward"] == 1.0  # task 10: transfer, DB untouched
    first = requests[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]  # the reset messages, once
    assert load_policy() in first["messages"][0]["content"]
    assert first["messages"][1]["content"] == first_person(TASKS["10"].instructions["reason_for_call"]).strip()
    # tau2's own schemas as the endpoint receives them, key order included
    assert json.dumps(first["tools"]) == json.dumps(list(tool_schemas()))
    assert sorted(t["function"]["name"] for t in first["tools"]) == list(TOOL_NAMES)
    # arguments parsed into the call the environment ran
    assert env.calls[0] == {"name": "find_user_id_by_email", "arguments": {"email": "mia.garcia2723@example.com"},
                            "error": False, "content": "mia_garcia_4516"}
    # the call id threads into the next request
    asst, tool = requests[1]["messages"][-2:]
    assert asst["role"] == "assistant" and [c["id"] for c in asst["tool_calls"]] == ["c_A"]
    assert json.loads(asst["tool_calls"][0]["function"]["arguments"]) == {"email": "mia.garcia2723@example.com"}
    assert tool == {"role": "tool", "content": "mia_garcia_4516", "name": "find_user_id_by_email",
                    "tool_call_id": "c_A"}
    # bad JSON arguments: no call runs, the agent gets an error tool message (it counts)
    asst, tool = requests[2]["messages"][-2:]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "c_B"  # servers reject a tool message without it
    assert tool["content"].startswith("Error: the tool call could not be parsed (bad_arguments)")
    assert asst["tool_calls"] == [_tool_call("c_B", "get_user_details", "{}")]
    assert [c["name"] for c in env.calls] == ["find_user_id_by_email", "transfer_to_human_agents"]
    assert env.errors == 1
    assert requests[3]["messages"][-1] == {"role": "tool", "content": "Transfer successful",
                                           "name": "transfer_to_human_agents", "tool_call_id": "c_C"}
    assert all("reaction" not in m for r in requests for m in r["messages"])  # labels stay private
    assert rep["messages"][-1] == {"role": "user", "content": TRANSFER, "reaction": "accept"}


def test_endpoint_eval_gives_the_agent_the_environments_prompt_not_the_user_simulators(tmp_path, capsys):
    from jaxagent import configlib
    from jaxagent.jobs.config import load_config
    from jaxagent.envs.user_prompt import DEFAULT_SYSTEM_PROMPT
    from jaxagent.envs.tau2_retail.agents import EndpointConfig
    from jaxagent.envs.tau2_retail.env import system_prompt
    from jaxagent.launch import main

    base = ["job=eval", "env.kind=tau2_retail", "eval.agent=endpoint", "eval.endpoint.base_url=http://127.0.0.1:1/v1",
            "eval.endpoint.model=m"]
    cfg = load_config(None, base)
    assert isinstance(cfg.eval.endpoint, EndpointConfig)
    assert not hasattr(cfg.eval.endpoint, "system_prompt") and not hasattr(cfg.eval.endpoint, "temperature")
    for key in ("system_prompt", "temperature", "opening_message"):   # not silently ignored: refused
        with pytest.raises(configlib.ConfigError, match=f"eval.endpoint.{key}: unknown key"):
            load_config(None, base + [f"eval.endpoint.{key}=x"])
    with pytest.raises(configlib.ConfigError, match="http:// or https://"):
        load_config(None, base + ["eval.endpoint.base_url=ftp://h"])
    assert cfg.eval.endpoint.client_config(0.25).temperature == 0.25

    replies = [{"role": "assistant", "content": None, "tool_calls": [
                   _tool_call("c_A", "transfer_to_human_agents", json.dumps({"summary": "s"}))]},
               {"role": "assistant", "content": "You are now with a human agent."}]
    with serve(replies) as (requests, url):
        assert main(["job=eval", "env=tau2_retail", "agent=endpoint", "env.tau2.tasks=10", "eval.temperature=0.25",
                     f"eval.endpoint.base_url={url}", "eval.endpoint.model=served", "eval.endpoint.max_retries=0",
                     "eval.endpoint.trust_env=false", f"runs_dir={tmp_path}", "name=ep", "progress=false"]) == 0
    first = requests[0]
    assert first["model"] == "served" and first["temperature"] == 0.25
    assert first["messages"][0] == {"role": "system", "content": system_prompt(load_policy())}
    assert all(DEFAULT_SYSTEM_PROMPT[:40] not in m["content"] for m in first["messages"])
    assert json.loads((tmp_path / "ep" / "summary.json").read_text())["reward"] == 1.0


# ============================================================================ failures: retried, counted, contained
class FlakyCustomer:
    """A ScriptedCustomer whose first ``respond`` (or ``opening``) raises (or hangs past a timeout)."""

    def __init__(self, task, view, mode="raise"):
        self.inner, self.mode, self.failed = ScriptedCustomer(task, view), mode, False
        self.heard = []

    async def opening(self):
        return await self.inner.opening()

    async def respond(self, text):
        if not self.failed:
            self.failed = True
            if self.mode == "hang":
                await asyncio.sleep(10)
            raise ConnectionError("injected customer failure")
        self.heard.append(text)
        return await self.inner.respond(text)

    async def aclose(self):
        return None


@pytest.mark.parametrize("mode", ["raise", "hang"])
def test_a_retried_step_after_a_customer_failure_commits_once(mode):
    from jaxagent.rollout.loop import EpisodeConfig, _call

    customers = []

    def make(task, view):
        customers.append(FlakyCustomer(task, view, mode))
        return customers[-1]

    env = Tau2RetailEnv(TASKS, customer=make)
    counters = {"simulator_errors": 0}

    async def main():
        await env.reset("0", 0)
        msg = AgentMessage("What is your email address?")
        return await _call(lambda: env.step(msg), EpisodeConfig(retries=2, timeout_s=0.5), counters)

    step = run(main())
    assert counters["simulator_errors"] == 1 and step is not None and not step.done
    assert env.steps == 3  # the opening, the agent's message, the customer's reply: each once
    assert [m["role"] for m in env.messages] == ["user", "assistant", "user"]
    assert customers[0].heard == ["What is your email address?"]


def test_an_llm_customer_failure_leaves_its_conversation_unchanged():
    from jaxagent.envs.llm_user import SimulatorError
    from jaxagent.envs.tau2_retail.customer import LLMCustomer, customer_config

    with socket.socket() as sock:  # a port nobody listens on: every request fails
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    cust = LLMCustomer(LLMUserClient(customer_config(_config(url))), TASKS["0"])
    with pytest.raises(SimulatorError):
        run(cust.respond("hello"))
    assert cust.conversation == []  # a retry sends "hello" once, not twice


def test_a_judge_failure_is_retried_and_the_ending_resumes():
    task = TASKS["19"]
    verdict = json.dumps({"results": [{"expectedOutcome": a, "reasoning": "ok", "metExpectation": True}
                                      for a in task.nl_assertions]})
    with serve([{"role": "assistant", "content": None}, verdict]) as (requests, url):  # 1st: unusable body
        async def main():
            async with LLMUserClient(_config(url)) as judge:
                env = Tau2RetailEnv(TASKS, customer=scripted_customers(), scoring_mode="tau2", judge=judge)
                agent = OracleAgent()
                reset = await env.reset("19", 0)
                agent.start(env.task, reset)
                msgs, failures = reset.messages, 0
                while True:
                    msg = await agent.act(msgs)
                    while True:
                        try:
                            step = await env.step(msg)
                            break
                        except Exception:  # noqa: BLE001 - the loop's retry
                            failures += 1
                    if step.done:
                        return env, step, failures
                    msgs = step.messages

        env, step, failures = run(main())
    assert failures == 1 and len(requests) == 2
    assert env.termination == "user_stop" and step.reward == 1.0 and env.result.components["NL_ASSERTION"] == 1.0
    assert sum(m["role"] == "user" for m in env.messages) == sum(m["role"] == "user" for m in env.report()["messages"])


def test_evaluate_host_contains_a_failing_reset(monkeypatch):
    from jaxagent.jobs.config import Tau2Section
    from jaxagent.envs.tau2_retail import env as env_module
    from jaxagent.envs.tau2_retail.harness import Tau2EnvFactory, evaluate_host

    real = env_module.scoring.initial_db
    calls = []

    def flaky_initial_db(task, data_dir=None):
        calls.append(task.id)
        if task.id == "1":
            raise OSError("disk gone")
        return real(task, data_dir)

    monkeypatch.setattr(env_module.scoring, "initial_db", flaky_initial_db)
    factory = Tau2EnvFactory(Tau2Section(tasks="0,1,2"))
    factory.record(False)
    reports = run(evaluate_host(factory, OracleAgent, k=1, concurrency=2))
    by = {r["task_id"]: r for r in reports}
    assert set(by) == {"0", "1", "2"}
    assert by["1"]["termination"] == "simulator_failure" and "disk gone" in by["1"]["error"]
    assert by["0"]["score"]["reward"] == 1.0 and by["2"]["score"]["reward"] == 1.0

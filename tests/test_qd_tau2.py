"""The Q&D loop inside a tau2 retail agent (jaxagent/qd/tau2.py, job=qd_tau2): evidence identity, the
offline selector, tool plans, the agent against the real environment and scripted customer (reads
outside the transcript, budgets, plans executed and scored), the endpoint roles over loopback HTTP,
and the job."""

import asyncio
import json

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig
from jaxagent.rollout.runner import play
from jaxagent.envs.tau2.env import Tau2Env, scripted_customers
from jaxagent.envs.tau2.scoring import initial_db
from jaxagent.envs.tau2.db import db_hash
from jaxagent.qd.agents import NeverAsk, Reply
from jaxagent.qd.loop import RoleFailed
from jaxagent.qd.tau2 import (
    PLAN_MARKER,
    EndpointAnswerer,
    EndpointDrafter,
    EndpointSelector,
    LookupAnswerer,
    LookupDrafter,
    RuleSelector,
    ScriptedTau2Questioner,
    Tau2Context,
    Tau2QDAgent,
    Tau2QDConfig,
    evidence_key,
    follow_up_turns,
    split_plan,
)
from jaxagent.text.toolcalls import ToolCall
from tests.loopback import chat_server
from tests.tau2_helpers import TASKS

CTX = Tau2Context("", ())


def _select(q):
    return asyncio.run(RuleSelector().select(q, CTX))


def test_evidence_is_the_record_the_arguments_name_else_the_request():
    assert evidence_key("get_order_details", {"order_id": "#W2378156"}) == "order:#W2378156"
    assert evidence_key("get_user_details", {"user_id": "yusuf_rossi_9620"}) == "user:yusuf_rossi_9620"
    assert evidence_key("get_product_details", {"product_id": "1656367028"}) == "product:1656367028"
    assert evidence_key("get_item_details", {"item_id": "1151293680"}) == "item:1151293680"
    assert evidence_key("list_all_product_types", {}) == "list_all_product_types"
    assert evidence_key("find_user_id_by_name_zip", {"zip": "19122", "first_name": "Yusuf", "last_name": "Rossi"}) \
        == "find_user_id_by_name_zip:first_name=Yusuf,last_name=Rossi,zip=19122"


def test_the_rule_selector_reads_the_identifier_the_question_names():
    assert _select("What are the details of order #W2378156?") == ToolCall("get_order_details", {"order_id": "#W2378156"})
    assert _select("Show user yusuf_rossi_9620") == ToolCall("get_user_details", {"user_id": "yusuf_rossi_9620"})
    assert _select("Find the user with email mia.garcia2723@example.com.") == ToolCall(
        "find_user_id_by_email", {"email": "mia.garcia2723@example.com"})
    assert _select("Details of product 1656367028?") == ToolCall("get_product_details", {"product_id": "1656367028"})
    assert _select("Details of item 1151293680?") == ToolCall("get_item_details", {"item_id": "1151293680"})
    assert _select("Find the user id of Yusuf Rossi with zip code 19122.") == ToolCall(
        "find_user_id_by_name_zip", {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"})
    assert _select("Which product types are there?") == ToolCall("list_all_product_types", {})
    assert _select("What does the customer want?") is None


def test_wire_calls_parse_to_name_and_arguments_or_refuse():
    from jaxagent.envs.tau2.agents import wire_call

    assert wire_call({"function": {"name": "get_user_details", "arguments": '{"user_id": "u"}'}}) == (
        "get_user_details", {"user_id": "u"})
    assert wire_call({"function": {"name": "f", "arguments": {"a": 1}}}) == ("f", {"a": 1})  # already parsed
    assert wire_call({"function": {"name": "f", "arguments": "[1, 2]"}}) == ("f", None)
    assert wire_call({"function": {"name": "f", "arguments": "{oops"}}) == ("f", None)
    assert wire_call({"function": {"name": 3}}) == ("unknown", {})
    assert wire_call({}) == ("unknown", {})


_NAMES = st.sampled_from(["cancel_pending_order", "modify_user_address", "calculate", "get_order_details"])
_ARGS = st.dictionaries(st.sampled_from(["order_id", "reason", "zip", "item_ids"]),
                        st.one_of(st.text(max_size=12), st.lists(st.text(max_size=6), max_size=3)), max_size=3)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80), st.lists(st.tuples(_NAMES, _ARGS), max_size=4))
def test_a_drafted_plan_parses_back(text, calls):
    body = text.replace(PLAN_MARKER, "")
    draft = f"{body}\n{PLAN_MARKER}\n" + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    rest, parsed, bad = split_plan(draft)
    assert rest == body.rstrip() and bad == 0
    assert parsed == [ToolCall(n, a) for n, a in calls]
    assert split_plan(body) == (body, [], 0)  # no marker, no plan


def test_malformed_plan_entries_are_counted_not_executed():
    _, calls, bad = split_plan(f'x\n{PLAN_MARKER} [{{"name": "cancel_pending_order", "arguments": {{}}}}, 7, '
                               '{"arguments": {}}]')
    assert calls == [ToolCall("cancel_pending_order", {})] and bad == 2
    assert split_plan(f"x {PLAN_MARKER} [not json")[1:] == ([], 1)


def _episode(task_id, questioner, *, drafter=None, answerer=None, config=Tau2QDConfig(), selector=None):
    async def main():
        env = Tau2Env(TASKS, customer=scripted_customers())
        agent = Tau2QDAgent(questioner, selector or RuleSelector(), drafter or LookupDrafter(),
                            answerer or LookupAnswerer(), reader=env.read, key=jax.random.key(0), config=config)
        report = await play(env, agent, task_id, 0, max_turns=100)
        return env, report, agent.record()

    return asyncio.run(main())


def test_env_read_runs_read_only_tools_and_nothing_else():
    env = Tau2Env(TASKS, customer=scripted_customers())
    with pytest.raises(RuntimeError, match="reset"):
        env.read("get_order_details", {"order_id": "#W2378156"})
    asyncio.run(env.reset("0", 0))
    res = env.read("get_order_details", {"order_id": "#W2378156"})
    assert not res.error and '"order_id": "#W2378156"' in res.content
    assert env.read("cancel_pending_order", {"order_id": "#W2378156", "reason": "no longer needed"}) is None
    assert env.read("no_such_tool", {}) is None
    assert env.read("get_order_details", {"order_id": "#W0000000"}).error
    assert [c["via"] for c in env.calls] == ["read", "read"] and env.steps == 1  # the opening only
    assert db_hash(env.db) == db_hash(initial_db(TASKS["0"]))


def test_questions_read_the_live_database_outside_the_transcript():
    env, report, rec = _episode("0", ScriptedTau2Questioner())
    first = rec["turns"][0]["questions"]
    # the customer named order #W2378156: its record, then its owner's, their orders, the named order's products
    assert first[0] == {"question": "What are the details of order #W2378156?",
                        "call": {"name": "get_order_details", "arguments": {"order_id": "#W2378156"}},
                        "evidence": "order:#W2378156", "new": True}
    assert first[1]["evidence"] == "user:yusuf_rossi_9620"
    assert {"product:1656367028", "product:4896585277"} <= set(rec["evidence"])
    assert rec["questions"] == sum(len(t["questions"]) for t in rec["turns"]) == len(rec["evidence"])
    # never in the transcript: the customer saw only the answerer's text, no tool message was sent
    assert all(m["role"] in ("user", "assistant") for m in report["messages"])
    assert not any(m.get("tool_calls") for m in report["messages"])
    reads = [c for c in env.calls if c.get("via") == "read"]
    assert len(reads) == rec["questions"] and not any(c["error"] for c in reads)
    assert report["db_hash"] == db_hash(initial_db(TASKS["0"]))  # reads change nothing
    assert follow_up_turns(report) == sum(m["role"] == "user" for m in report["messages"]) - 1


def test_never_ask_asks_nothing_and_the_question_budget_holds():
    _, _, rec = _episode("0", NeverAsk())
    assert rec["questions"] == 0 and rec["evidence"] == []
    _, _, rec = _episode("0", ScriptedTau2Questioner(), config=Tau2QDConfig(questions=3))
    assert rec["questions"] == 3
    assert rec["turns"][0]["stop"] == "budget" and all(t["stop"] == "budget" for t in rec["turns"][1:])


class GoldPlanDrafter(LookupDrafter):
    """Drafts the task's gold actions as the plan, once (a stand-in for a model that planned right)."""

    def __init__(self, task):
        self.actions, self.planned = task.actions, False

    async def draft(self, context, held):
        if self.planned:
            return Reply("Done.")
        self.planned = True
        return Reply("Plan.\n" + PLAN_MARKER + json.dumps([{"name": a.name, "arguments": a.arguments}
                                                             for a in self.actions]))


def test_a_drafted_plan_is_executed_by_the_environment_and_scored():
    env, report, rec = _episode("0", NeverAsk(), drafter=GoldPlanDrafter(TASKS["0"]))
    assert rec["planned_calls"] == len(TASKS["0"].actions)
    assert report["termination"] == "user_stop" and report["score"]["reward"] == 1.0
    tool_msgs = [m for m in report["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == len(TASKS["0"].actions)  # the plan went through the conversation
    turn = rec["turns"][0]
    assert len(turn["results"]) == len(TASKS["0"].actions) and turn["answer"]
    # with a one-call budget the rest of the plan is dropped and counted, and the task fails
    _, report, rec = _episode("0", NeverAsk(), drafter=GoldPlanDrafter(TASKS["0"]), config=Tau2QDConfig(tool_calls=1))
    assert rec["planned_calls"] == 1 and rec["turns"][0]["dropped_calls"] == len(TASKS["0"].actions) - 1
    assert report["score"]["reward"] == 0.0


def test_a_read_that_is_not_read_only_executes_nothing():
    class WriteSelector:
        name = "writes"

        async def select(self, question, context):
            return ToolCall("cancel_pending_order", {"order_id": "#W2378156", "reason": "no longer needed"})

    env, report, rec = _episode("0", ScriptedTau2Questioner(), selector=WriteSelector(),
                                config=Tau2QDConfig(questions=2))
    q = rec["turns"][0]["questions"][0]
    assert q["evidence"] is None and "not a read-only tool" in q["error"]
    assert report["db_hash"] == db_hash(initial_db(TASKS["0"])) and not env.calls


def test_a_role_that_keeps_failing_fails_the_episode():
    class Broken(LookupDrafter):
        async def draft(self, context, held):
            raise ConnectionError("drafter down")

    env = Tau2Env(TASKS, customer=scripted_customers())
    agent = Tau2QDAgent(NeverAsk(), RuleSelector(), Broken(), LookupAnswerer(), reader=env.read, key=jax.random.key(0))
    with pytest.raises(RoleFailed, match="drafter.draft: ConnectionError: drafter down"):
        asyncio.run(play(env, agent, "0", 0))


def _client(url):
    return LLMUserClient(LLMUserConfig(base_url=url, model="m", temperature=0.0, max_retries=0,
                                       connect_timeout_s=2.0, read_timeout_s=10.0, trust_env=False))


def test_endpoint_selector_drafter_and_answerer_over_http():
    select = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_order_details", "arguments": json.dumps({"order_id": "#W2378156"})}}]}
    plan = [{"name": a.name, "arguments": a.arguments} for a in TASKS["0"].actions]
    replies = [select, "The order has a keyboard and a thermostat.", "Draft: exchange both.\n" + PLAN_MARKER +
               json.dumps(plan), "Your exchange is done.", "Thanks."]

    class OneQuestion:
        name = "one"

        async def act(self, state, key):
            return Reply(json.dumps({"action": "ask", "question": "What is in the order?"}) if not state.history
                         else json.dumps({"action": "stop"}))

    with chat_server(replies) as (requests, url):
        async def main():
            env = Tau2Env(TASKS, customer=scripted_customers())
            c = _client(url)
            agent = Tau2QDAgent(OneQuestion(), EndpointSelector(c), EndpointDrafter(c), EndpointAnswerer(c),
                                reader=env.read, key=jax.random.key(0), config=Tau2QDConfig(max_decisions=2))
            report = await play(env, agent, "0", 0, max_turns=3)
            await c.aclose()
            return report, agent.record()

        report, rec = asyncio.run(main())
    # selector: the seven read tools, a call required; drafter and answerer: the policy in the system turn
    assert {t["function"]["name"] for t in requests[0]["tools"]} == {
        "find_user_id_by_email", "find_user_id_by_name_zip", "get_item_details", "get_order_details",
        "get_product_details", "get_user_details", "list_all_product_types"}
    assert requests[0]["tool_choice"] == "required"
    assert "<policy>" in requests[1]["messages"][0]["content"]
    assert '"order_id": "#W2378156"' in requests[2]["messages"][1]["content"]  # the record, to the drafter
    turn = rec["turns"][0]
    assert turn["questions"][0]["evidence"] == "order:#W2378156"
    assert [c["name"] for c in turn["calls"]] == [a.name for a in TASKS["0"].actions]
    assert turn["answer"] == "Your exchange is done."
    assert "exchange_delivered_order_items" in requests[3]["messages"][1]["content"]  # results, to the answerer
    assert report["score"]["reward"] == 1.0 and report["termination"] == "user_stop"


def test_job_runs_both_arms_and_compares_them(tmp_path):
    from jaxagent.jobs.config import load_config
    from jaxagent.jobs.qd_tau2 import run_qd_tau2

    cfg = load_config(None, ["job=qd_tau2", "env.kind=tau2_retail", "env.tau2.tasks=0:4", "qd.seeds=1",
                             f"runs_dir={tmp_path}", "name=t", "progress=false", "qd.bootstrap=200"])
    s = run_qd_tau2(cfg)
    t, b = s["arms"]["treatment"], s["arms"]["baseline"]
    assert t["episodes"] == b["episodes"] == 4 and t["failed_episodes"] == 0
    assert "scripted-tau2" in t["agent"] and "never_ask" in b["agent"] and "offline stand-in" in t["agent"]
    assert t["questions"] > 0 and b["questions"] == 0
    assert s["comparison"]["questions"]["mean_diff"] == pytest.approx(t["questions"])
    rows = [json.loads(x) for x in (tmp_path / "t" / "episodes_treatment.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["qd"]["turns"] for r in rows)
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["arms"]["baseline"]["questions"] == 0


@pytest.mark.parametrize("overrides, message", [
    (["job=qd_tau2"], "expected env.kind='tau2_retail'"),
    (["job=qd_tau2", "env.kind=tau2_retail", "qd.tau2.baseline=endpoint"], "expected qd.drafter_endpoint"),
    (["job=qd_tau2", "env.kind=tau2_retail", "qd.baseline=never_ask"], "qd.tau2.baseline"),
])
def test_job_refuses_what_cannot_run(overrides, message):
    from jaxagent.jobs.config import load_config

    with pytest.raises(Exception, match=message):
        load_config(None, overrides)

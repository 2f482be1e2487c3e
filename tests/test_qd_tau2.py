"""The Q&D loop inside a tau2 agent (jaxagent/qd/tau2.py, job=qd_tau2): evidence identity, the
offline selector, tool plans, the agent against the real environment and scripted customer (reads
outside the transcript, budgets, plans executed and scored), the endpoint roles over loopback HTTP,
and the job; on retail, and on airline through its Q&D plug-in (the domain as a setting)."""

import asyncio
import hashlib
import json

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig
from jaxagent.envs.tau2.db import db_hash
from jaxagent.envs.tau2.env import Tau2Env, scripted_customers
from jaxagent.envs.tau2.scoring import initial_db
from jaxagent.envs.tau2.tasks import load_task_set
from jaxagent.qd.agents import NeverAsk, Reply
from jaxagent.qd.loop import RoleFailed
from jaxagent.qd.tau2 import (
    PLAN_MARKER,
    QD_DOMAINS,
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
    qd_domain,
    reservation_ids,
    split_plan,
)
from jaxagent.rollout.runner import play
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
    assert requests[1]["messages"][0]["content"].startswith("You work for a retail customer-service agent.\n<policy>")
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
    (["job=qd_tau2"], "expected env.kind='tau2'"),
    (["job=qd_tau2", "env.kind=tau2_retail", "qd.tau2.baseline=endpoint"], "expected qd.drafter_endpoint"),
    (["job=qd_tau2", "env.kind=tau2_retail", "qd.baseline=never_ask"], "qd.tau2.baseline"),
])
def test_job_refuses_what_cannot_run(overrides, message):
    from jaxagent.jobs.config import load_config

    with pytest.raises(Exception, match=message):
        load_config(None, overrides)


# ----------------------------------------------------------------------------- the domain as a setting
AIRLINE_TASKS = load_task_set(domain="airline")
AIR_READS = {"get_user_details", "get_reservation_details", "get_flight_status", "search_direct_flight",
             "search_onestop_flight", "list_all_airports"}


def _air_select(q):
    return asyncio.run(RuleSelector("airline").select(q, CTX))


def test_each_domain_has_one_plug_in_and_an_unknown_one_is_named():
    from jaxagent.envs.tau2 import DOMAINS

    assert set(QD_DOMAINS) == {"retail", "airline"} <= set(DOMAINS)
    with pytest.raises(ValueError, match=r"domain='telecom'.*'retail', 'airline'"):
        qd_domain("telecom")
    with pytest.raises(ValueError, match="domain='telecom'"):
        RuleSelector("telecom")
    # the retail routing prompt is the one measured in docs/QD.md, byte for byte
    assert hashlib.sha256(qd_domain("retail").prompts["routing_stop"].encode()).hexdigest()[:16] == "f923aea2c8cfc021"
    air = qd_domain("airline").prompts["routing"]
    assert "airline customer-service agent" in air and "4WQ150" in air and "order" not in air


def test_airline_reservation_ids_are_six_capitals_or_digits_but_not_flights_or_words():
    assert reservation_ids("Cancel EHGLP3 and 4WQ150, not flight HAT001 nor 123456.") == ["EHGLP3", "4WQ150"]
    assert reservation_ids("My reservation is VAAOXJ. PLEASE hurry.") == ["VAAOXJ"]  # letters only: after the word
    assert reservation_ids("PLEASE help, it is URGENT") == []


def test_airline_evidence_is_the_record_the_arguments_name():
    assert evidence_key("get_reservation_details", {"reservation_id": "4WQ150"}, "airline") == "reservation:4WQ150"
    assert evidence_key("get_user_details", {"user_id": "emma_kim_9957"}, "airline") == "user:emma_kim_9957"
    assert evidence_key("get_flight_status", {"flight_number": "HAT001", "date": "2024-05-16"}, "airline") \
        == "flight:HAT001:2024-05-16"
    assert evidence_key("search_direct_flight", {"origin": "JFK", "destination": "SFO", "date": "2024-05-20"},
                        "airline") == "search_direct_flight:date=2024-05-20,destination=SFO,origin=JFK"
    assert evidence_key("list_all_airports", {}, "airline") == "list_all_airports"


def test_the_airline_rule_selector_reads_airline_identifiers_and_calls_only_airline_lookups():
    assert _air_select("What are the details of reservation 4WQ150?") == ToolCall(
        "get_reservation_details", {"reservation_id": "4WQ150"})
    assert _air_select("Show user emma_kim_9957") == ToolCall("get_user_details", {"user_id": "emma_kim_9957"})
    assert _air_select("What is the status of flight HAT001 on 2024-05-16?") == ToolCall(
        "get_flight_status", {"flight_number": "HAT001", "date": "2024-05-16"})
    assert _air_select("Direct flights from JFK to SFO on 2024-05-20?") == ToolCall(
        "search_direct_flight", {"origin": "JFK", "destination": "SFO", "date": "2024-05-20"})
    assert _air_select("One-stop flights from JFK to SFO on 2024-05-20?").name == "search_onestop_flight"
    assert _air_select("Which airports are there?") == ToolCall("list_all_airports", {})
    assert _air_select("What is the status of flight HAT001?") is None  # a flight's status needs its date
    assert _air_select("What are the details of order #W2378156?") is None  # retail's ids mean nothing here
    assert _select("What are the details of reservation 4WQ150?") is None  # and airline's nothing in retail
    env = Tau2Env(AIRLINE_TASKS, customer=scripted_customers(), domain="airline")
    asyncio.run(env.reset("0", 0))
    for q in ("reservation EHGLP3", "user emma_kim_9957", "flight HAT001 on 2024-05-16",
              "from JFK to SFO on 2024-05-20", "one-stop from JFK to SFO on 2024-05-20", "airports"):
        call = _air_select(q)
        assert call.name in AIR_READS and not env.read(call.name, call.arguments).error, q


def _air_episode(task_id, questioner, *, drafter=None, selector=None, config=None):
    async def main():
        env = Tau2Env(AIRLINE_TASKS, customer=scripted_customers(), domain="airline")
        agent = Tau2QDAgent(questioner, selector or RuleSelector("airline"), drafter or LookupDrafter(),
                            LookupAnswerer("airline"), reader=env.read, key=jax.random.key(0), config=config or Tau2QDConfig(),
                            domain="airline")
        report = await play(env, agent, task_id, 0, max_turns=100)
        return env, report, agent.record()

    return asyncio.run(main())


def test_airline_questions_read_the_reservation_its_owner_and_the_named_flights():
    _, report, rec = _air_episode("0", ScriptedTau2Questioner("airline"))
    first = rec["turns"][0]["questions"]
    # the customer names reservation EHGLP3: its record, its owner's, the owner's reservations, its flights' status
    assert first[0] == {"question": "What are the details of reservation EHGLP3?",
                        "call": {"name": "get_reservation_details", "arguments": {"reservation_id": "EHGLP3"}},
                        "evidence": "reservation:EHGLP3", "new": True}
    assert first[1]["evidence"] == "user:emma_kim_9957"
    fresh = Tau2Env(AIRLINE_TASKS, customer=scripted_customers(), domain="airline")
    asyncio.run(fresh.reset("0", 0))
    user = json.loads(fresh.read("get_user_details", {"user_id": "emma_kim_9957"}).content)
    named = json.loads(fresh.read("get_reservation_details", {"reservation_id": "EHGLP3"}).content)
    assert {f"reservation:{r}" for r in user["reservations"]} <= set(rec["evidence"])
    assert {f"flight:{f['flight_number']}:{f['date']}" for f in named["flights"]} <= set(rec["evidence"])
    assert all(q["call"]["name"] in AIR_READS for t in rec["turns"] for q in t["questions"])
    assert rec["questions"] == len(rec["evidence"])
    assert all(m["role"] in ("user", "assistant") for m in report["messages"])  # reads stay out of the transcript
    assert report["messages"][1]["content"].startswith("I found your account (emma_kim_9957): reservations EHGLP3 (")
    assert report["db_hash"] == db_hash(initial_db(AIRLINE_TASKS["0"]))
    # without questions the lookup answerer asks for the airline customer's identity: the user id
    _, report, rec = _air_episode("0", NeverAsk())
    assert rec["questions"] == 0 and "your user id" in report["messages"][1]["content"]


def test_an_airline_plan_is_executed_by_the_environment_and_scored():
    _, report, rec = _air_episode("40", NeverAsk(), drafter=GoldPlanDrafter(AIRLINE_TASKS["40"]))
    assert rec["planned_calls"] == len(AIRLINE_TASKS["40"].actions) == 2
    assert report["termination"] == "user_stop" and report["score"]["reward"] == 1.0


def test_roles_and_environment_of_another_domain_are_refused():
    with pytest.raises(ValueError, match="selector.domain='airline'.*'retail'"):
        Tau2QDAgent(NeverAsk(), RuleSelector("airline"), LookupDrafter(), LookupAnswerer(), reader=None,
                    key=jax.random.key(0))
    env = Tau2Env(AIRLINE_TASKS, customer=scripted_customers(), domain="airline")
    agent = Tau2QDAgent(NeverAsk(), RuleSelector(), LookupDrafter(), LookupAnswerer(), reader=env.read,
                        key=jax.random.key(0))
    with pytest.raises(ValueError, match="domain 'airline'; this Q&D agent was built for 'retail'"):
        asyncio.run(play(env, agent, "0", 0))


def test_airline_endpoint_roles_see_airline_tools_and_wording():
    task = AIRLINE_TASKS["40"]
    select = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_reservation_details", "arguments": json.dumps({"reservation_id": "3RK2T9"})}}]}
    plan = [{"name": a.name, "arguments": a.arguments} for a in task.actions]
    replies = [select, "Two passengers.", "Draft: rename.\n" + PLAN_MARKER + json.dumps(plan), "Done.", "Thanks."]

    class OneQuestion:
        name = "one"

        async def act(self, state, key):
            return Reply(json.dumps({"action": "ask", "question": "Who flies?"}) if not state.history
                         else json.dumps({"action": "stop"}))

    with chat_server(replies) as (requests, url):
        async def main():
            env = Tau2Env(AIRLINE_TASKS, customer=scripted_customers(), domain="airline")
            c = _client(url)
            agent = Tau2QDAgent(OneQuestion(), EndpointSelector(c, "airline"), EndpointDrafter(c, "airline"),
                                EndpointAnswerer(c, "airline"), reader=env.read, key=jax.random.key(0),
                                config=Tau2QDConfig(max_decisions=2), domain="airline")
            report = await play(env, agent, "40", 0, max_turns=3)
            await c.aclose()
            return report, agent.record()

        report, rec = asyncio.run(main())
    assert {t["function"]["name"] for t in requests[0]["tools"]} == AIR_READS  # the airline lookups, nothing else
    system = requests[1]["messages"][0]["content"]
    assert system.startswith("You work for an airline customer-service agent.\n<policy>\n")
    assert "# Airline Agent Policy" in system  # the environment's policy
    tools = requests[2]["messages"][1]["content"]  # the drafter's plan tools: airline's writes and the exempt two
    assert '"name": "update_reservation_passengers"' in tools and '"name": "get_order_details"' not in tools
    assert '"name": "cancel_pending_order"' not in tools and '"name": "get_user_details"' not in tools
    assert rec["turns"][0]["questions"][0]["evidence"] == "reservation:3RK2T9"
    assert report["score"]["reward"] == 1.0 and report["termination"] == "user_stop"


def test_job_runs_on_airline_as_on_retail(tmp_path):
    from jaxagent.jobs.config import load_config
    from jaxagent.jobs.qd_tau2 import run_qd_tau2, summary_table

    cfg = load_config(None, ["job=qd_tau2", "env.kind=tau2", "env.tau2.domain=airline", "env.tau2.tasks=0:3",
                             "qd.seeds=1", f"runs_dir={tmp_path}", "progress=false", "qd.bootstrap=200"])
    assert cfg.name == "qd_tau2-airline"
    s = run_qd_tau2(cfg)
    t, b = s["arms"]["treatment"], s["arms"]["baseline"]
    assert s["domain"] == "airline" and s["tasks"] == 3 and t["episodes"] == b["episodes"] == 3
    assert t["failed_episodes"] == b["failed_episodes"] == 0 and t["questions"] > 0 and b["questions"] == 0
    assert summary_table(s).startswith("qd_tau2 on tau2 airline (scripted customer")
    rows = [json.loads(x) for x in (tmp_path / "qd_tau2-airline" / "episodes_treatment.jsonl").read_text().splitlines()]
    keys = {k for r in rows for k in r["qd"]["evidence"]}
    assert any(k.startswith("reservation:") for k in keys) and not any(k.startswith("order:") for k in keys)
    assert load_config(None, ["job=qd_tau2", "env.kind=tau2_retail"]).name == "qd_tau2-retail"


def test_job_refuses_a_domain_without_a_plug_in(monkeypatch):
    from jaxagent.jobs.config import load_config
    from jaxagent.qd import tau2

    monkeypatch.setattr(tau2, "QD_DOMAINS", {"retail": tau2.RETAIL})
    with pytest.raises(Exception, match=r"env.tau2.domain='airline': job=qd_tau2 has Q&D plug-ins for tau2 domains "
                                        r"'retail'"):
        load_config(None, ["job=qd_tau2", "env.kind=tau2", "env.tau2.domain=airline"])

"""tau2 telecom episodes against the scripted customer: the oracle (gold agent actions, and the gold
device actions asked of the customer, who performs them on its phone) scores 1.0 on every train task,
ended by the customer; every broken variant scores 0; the state, the hashes and the transcript keep
whose action each tool call was."""

import asyncio
import dataclasses

import pytest

from jaxagent.envs.tau2 import get_domain, scoring
from jaxagent.envs.tau2.agents import BROKEN_VARIANTS, OracleAgent, ScriptedAgent, broken_plans, plan_for
from jaxagent.envs.tau2.domains.telecom.broken import replay_reward
from jaxagent.envs.tau2.env import Tau2Env, scripted_customers
from jaxagent.envs.tau2.tasks import load_task_set
from jaxagent.rollout.runner import play

TASKS = load_task_set(domain="telecom")


def env():
    return Tau2Env(TASKS, customer=scripted_customers(), domain="telecom")


def test_seventy_four_train_tasks_scored_by_env_assertions_and_actions():
    assert len(TASKS) == 74
    bases = [t.reward_basis for t in TASKS.values()]
    assert bases.count(("ENV_ASSERTION",)) == 66 and bases.count(("ENV_ASSERTION", "ACTION")) == 8
    assert all(t.env_assertions for t in TASKS.values())
    assert all(a.requestor in ("assistant", "user") for t in TASKS.values() for a in t.actions)


def test_the_oracle_scores_one_on_every_train_task_and_every_broken_variant_zero():
    async def main():
        oracle, broken = [], []
        for tid, task in TASKS.items():
            oracle.append(await play(env(), OracleAgent(), tid))
            for variant, turns in broken_plans(task).items():
                assert variant in BROKEN_VARIANTS
                broken.append((tid, variant, await play(env(), ScriptedAgent(turns), tid)))
        return oracle, broken

    oracle, broken = asyncio.run(main())
    assert [r["score"]["reward"] for r in oracle] == [1.0] * 74
    assert {r["termination"] for r in oracle} == {"user_stop"}
    assert len(broken) >= 190 and all(r["score"]["reward"] == 0.0 for _, _, r in broken), [
        (t, v) for t, v, r in broken if r["score"]["reward"] != 0.0]
    kinds = {v for _, v, _ in broken}
    assert kinds == set(BROKEN_VARIANTS)


def test_an_oracle_episode_records_whose_action_each_call_is():
    tid = next(t for t in TASKS if "data_usage_exceeded" in t and "mobile_data" in t)
    task = TASKS[tid]

    async def main():
        e = env()
        report = await play(e, OracleAgent(), tid)
        return e, report

    e, report = asyncio.run(main())
    sides = {(c["requestor"], c["name"]) for c in e.calls}
    assert sides == {(a.requestor, a.name) for a in task.actions}
    # the user's calls are in the transcript as user messages with tool calls, answered by tool messages
    user_calls = [m for m in report["messages"] if m["role"] == "user" and m.get("tool_calls")]
    assert len(user_calls) == sum(a.requestor == "user" for a in task.actions)
    assert report["user_db_hash"] and report["db_hash"]
    # the oracle asks for each device action in one message the scripted customer reads
    asks = [t.content for t in plan_for(task, task.actions) if not t.tool_calls]
    assert all(get_domain("telecom").ask_user_action(a.name, a.arguments) in asks
               for a in task.actions if a.requestor == "user")


def test_replayed_gold_runs_hold_every_assertion_and_empty_runs_none():
    for task in TASKS.values():
        assert replay_reward(task, task.actions)[0] == 1.0
        assert replay_reward(task, [])[0] == 0.0


def test_initial_state_errors_name_the_action():
    task = next(iter(TASKS.values()))
    bad = dict(task.initial_state)
    bad["initialization_actions"] = [*bad["initialization_actions"],
                                     {"env_type": "user", "func_name": "no_such", "arguments": {}}]
    with pytest.raises(scoring.InitialStateError, match=r"initialization_actions\[\d+\] \(no_such\) failed: "
                                                        "AttributeError: 'TelecomUserTools' object has no attribute"):
        scoring.initial_db(dataclasses.replace(task, initial_state=bad))

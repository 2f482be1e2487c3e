"""tau2 airline: the oracle scores 1.0 on every train task against the scripted customer (offline
scoring and tau2's, which for airline is the same DB x COMMUNICATE), and every broken variant of
every task (`jaxagent.envs.tau2.domains.airline.broken`) scores 0."""

import collections

from jaxagent.credit.reaction import DEFAULT_POLARITY
from jaxagent.envs.tau2.agents import BROKEN_VARIANTS, OracleAgent, ScriptedAgent, broken_plans
from jaxagent.envs.tau2.db import db_hash
from jaxagent.envs.tau2.env import Tau2Env, scripted_customers
from jaxagent.envs.tau2.scoring import initial_db, target_hash
from jaxagent.envs.tau2.tasks import load_task_set
from jaxagent.rollout.runner import play
from tests.tau2_helpers import run

TASKS = load_task_set(domain="airline")
# spec 5.3: the train tasks whose target database is the initial one
NO_CHANGE_TASKS = {"0", "1", "3", "4", "5", "9", "10", "27", "28", "34", "36", "38", "41", "43", "46", "47", "49"}


def env(mode="offline"):
    return Tau2Env(TASKS, customer=scripted_customers(), domain="airline", scoring_mode=mode)


def test_the_train_split():
    assert len(TASKS) == 30
    assert {tid for tid, t in TASKS.items() if target_hash(t) == db_hash(initial_db(t))} == NO_CHANGE_TASKS
    assert {tid for tid, t in TASKS.items() if not t.write_actions} == NO_CHANGE_TASKS
    assert all(t.reward_basis == ("DB", "COMMUNICATE") for t in TASKS.values())


def test_oracle_scores_one_and_every_broken_variant_zero_on_all_30_tasks():
    async def main():
        oracle, tau2, broken = [], [], []
        for tid, task in TASKS.items():
            oracle.append(await play(env(), OracleAgent(), tid))
            if task.communicate_info:   # tau2's mode on the tasks whose reward COMMUNICATE gates
                tau2.append(await play(env("tau2"), OracleAgent(), tid))
            for kind, turns in broken_plans(task).items():
                broken.append((kind, await play(env(), ScriptedAgent(turns), tid)))
        return oracle, tau2, broken

    oracle, tau2, broken = run(main())
    assert [r["task_id"] for r in oracle] == list(TASKS)
    assert [r["task_id"] for r in tau2] == ["3", "7", "11", "14", "23"]
    for mode, reports in (("offline", oracle), ("tau2", tau2)):
        bad = [(r["task_id"], r["termination"], r["score"]["components"], r["score"]["reward"]) for r in reports
               if r["termination"] != "user_stop" or r["score"]["reward"] != 1.0
               or r["score"]["components"]["DB"] != 1.0 or r["score"]["components"]["COMMUNICATE"] != 1.0]
        assert bad == [] and all(r["score"]["scoring_mode"] == mode for r in reports)
    assert all(r["score"]["basis"] == ["DB", "COMMUNICATE"] for r in tau2)
    # every task has a broken variant: the 13 with gold writes all three, the 17 that change nothing extra_write
    counts = collections.Counter(kind for kind, _ in broken)
    assert set(counts) == set(BROKEN_VARIANTS)
    assert counts == {"wrong_argument": 13, "missing_write": 13, "extra_write": 30}, counts
    # each scores 0 through the database, in an episode the customer ended (a scored ending)
    leaked = [(kind, r["task_id"], r["termination"]) for kind, r in broken
              if r["termination"] != "user_stop" or r["score"]["components"]["DB"] != 0.0 or r["score"]["reward"] != 0.0]
    assert leaked == []
    labels = {m["reaction"] for r in oracle + [r for _, r in broken] for m in r["messages"] if m["role"] == "user"}
    assert labels <= set(DEFAULT_POLARITY), labels - set(DEFAULT_POLARITY)
    # the oracle's episodes end on the customer's acceptance, the broken ones on its complaint
    assert {r["messages"][-1]["reaction"] for r in oracle} == {"accept"}
    assert {r["messages"][-1]["reaction"] for _, r in broken} == {"complain"}


def test_broken_variants_of_a_no_change_task_and_of_a_booking_task():
    # task 0 (a refusal: EHGLP3 may not be cancelled): the broken agent cancels it without asking
    plans = broken_plans(TASKS["0"])
    assert list(plans) == ["extra_write"]
    calls = [(c.name, c.arguments) for m in plans["extra_write"] for c in m.tool_calls]
    assert calls == [("cancel_reservation", {"reservation_id": "EHGLP3"})]
    # task 20 (one booking): the booking with one more bag than asked, and no booking at all
    plans = broken_plans(TASKS["20"])
    wrong = [c.arguments for m in plans["wrong_argument"] for c in m.tool_calls if c.name == "book_reservation"]
    assert len(wrong) == 1 and wrong[0]["total_baggages"] == 4
    assert not any(c.name == "book_reservation" for m in plans["missing_write"] for c in m.tool_calls)

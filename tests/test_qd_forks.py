"""Forking a run at its decision points (the Q&D spec's §4.1-§4.2): candidate 0 is the parent,
every candidate's prefix is the parent's and they differ only from the fork turn on, the
candidate labels by hand, failures dropped and counted, and ``job=qd_label`` end to end."""

import asyncio
import json
import math

import jax
import pytest

from jaxagent.envs.retrieval_qa.tasks import musique_task
from jaxagent.launch import main
from jaxagent.qd import metrics as M
from jaxagent.qd.agents import ExtractiveAnswerer, ExtractiveDrafter, Reply
from jaxagent.qd.forks import candidate_seed, fork_state, fork_suite, turns_to_complete
from jaxagent.qd.graphs import musique_graph
from jaxagent.qd.labels import ask_value
from jaxagent.qd.loop import LoopConfig, run_episode
from jaxagent.qd.prompts import STOP_JSON, ask_json
from jaxagent.qd.synthetic import generate, write_suite
from jaxagent.qd.transcript import read_runs

KEY = jax.random.key(3)


class Sampled:
    """A questioner whose action is drawn from ``key``: STOP with probability 1/5, else a question
    about one pool title not asked yet (so forks reseeded at a turn differ from there on)."""

    name = "sampled-test"

    async def act(self, state, key):
        asked = {q for q, _ in state.history}
        options = [f"What is known about {u.title}?" for u in state.task.pool]
        options = [q for q in options if q not in asked]
        k1, k2 = jax.random.split(key)
        if not options or float(jax.random.uniform(k1)) < 0.2:
            return Reply(STOP_JSON)
        return Reply(ask_json(options[int(jax.random.randint(k2, (), 0, len(options)))], "test"))


class Failing(ExtractiveDrafter):
    """A drafter whose every call fails once the run holds more than ``after`` units."""

    def __init__(self, after):
        self.after = after

    async def resolve(self, task, held, question):
        if len(held) > self.after:
            raise RuntimeError("drafter down")
        return await super().resolve(task, held, question)


def _suite(n=3, depth=3):
    out = []
    for record in generate(n, depth=depth, breadth=1, pool=12, seed=11):
        task = musique_task(record, "synthetic")
        out.append((task, musique_graph(record, task)))
    return out


def _parent(task, seed=0, config=LoopConfig(cap=6, max_turns=8)):
    return asyncio.run(run_episode(task, Sampled(), ExtractiveDrafter(), ExtractiveAnswerer(), seed=seed, key=KEY,
                                   config=config))


def _long_parent(task, graph, want=3):
    for seed in range(50):
        p = _parent(task, seed)
        if p.n_asks >= want:
            return p
    raise AssertionError("no parent with enough questions")


def test_candidate_seeds():
    assert candidate_seed(7, 0) == 7
    seeds = [candidate_seed(7, i) for i in range(8)]
    assert len(set(seeds)) == 8 and all(0 <= s < 2**31 for s in seeds)
    assert seeds == [candidate_seed(7, i) for i in range(8)]  # stable
    assert candidate_seed(8, 1) != candidate_seed(7, 1)
    with pytest.raises(ValueError, match="candidate index -1"):
        candidate_seed(7, -1)


def test_candidate_zero_is_the_parent_and_the_others_differ_only_from_the_fork_turn():
    task, graph = _suite()[0]
    parent = _long_parent(task, graph)
    config = LoopConfig(cap=6, max_turns=8)
    for t in range(parent.n_asks):
        state, runs = asyncio.run(fork_state(parent, task, graph, t, Sampled(), ExtractiveDrafter(),
                                             ExtractiveAnswerer(), key=KEY, config=config, n=8))
        assert state is not None and len(runs) == 8 and len(state.candidates) == 8
        zero = runs[0]
        for field in ("turns", "stop_reason", "answer", "draft", "final_raw", "malformed", "seed", "task_id"):
            assert getattr(zero, field) == getattr(parent, field), (t, field)
        assert all(r.turns[:t] == parent.turns[:t] for r in runs)
        # reseeded at t: the actions at t are not all alike (the sampler draws them from the key)
        acts = {(c.action, c.question) for c in state.candidates}
        assert len(acts) > 1, t
        assert state.turn == t and state.parent_seed == parent.seed and state.task_id == task.task_id
        assert {c.prompt for c in state.candidates} == {state.candidates[0].prompt}
        assert state.candidates[0].seed == parent.seed and [c.index for c in state.candidates] == list(range(8))


def test_candidate_labels_by_hand():
    task, graph = _suite()[1]
    parent = _long_parent(task, graph)
    t = 1
    state, runs = asyncio.run(fork_state(parent, task, graph, t, Sampled(), ExtractiveDrafter(), ExtractiveAnswerer(),
                                         key=KEY, config=LoopConfig(cap=6, max_turns=8), n=6))
    held = {i for turn in parent.turns[:t] for i in turn.retrieved}
    cov = len(graph.required_evidence & held) / len(graph.required_evidence)
    assert state.done_before is (cov >= 1 - 1e-12)
    for c, r in zip(state.candidates, runs):
        assert c.answer_correct == M.answer_correct(r.answer, task.answer, task.aliases) or (
            math.isnan(c.answer_correct) and math.isnan(M.answer_correct(r.answer, task.answer, task.aliases)))
        if c.action == "stop":
            assert r.n_asks == t and c.value == 0.0 and c.turns_to_complete == -1 and r.stop_reason == "policy_stop"
            continue
        turn = r.turns[t]
        assert c.question == turn.question and c.raw == turn.raw
        # value by hand: gain of uid coverage, redundancy, the call's cost
        after = held | set(turn.retrieved)
        gain = max(0.0, len(graph.required_evidence & after) / len(graph.required_evidence) - cov)
        new = [i for i in turn.retrieved if i not in held]
        rho = 1 - len(new) / len(turn.retrieved) if turn.retrieved else 0.0
        assert c.value == pytest.approx(0.5 * gain - 0.1 * rho - 0.05, abs=1e-12)
        assert c.phi_gain == pytest.approx(gain, abs=1e-12)
        v = ask_value(held, turn.retrieved, graph)
        assert (c.value, c.phi_gain) == (v.value, v.phi_gain)
        # turns to complete by hand: the first prefix j > t whose held evidence covers every required unit
        want = -1
        for j in range(t + 1, r.n_asks + 1):
            if graph.required_evidence <= {i for x in r.turns[:j] for i in x.retrieved}:
                want = j - t
                break
        assert c.turns_to_complete == want == turns_to_complete(r, graph, t)


def test_a_replay_that_retrieves_otherwise_is_refused():
    (task, graph), (other, _) = _suite(2)[:2]
    parent = _long_parent(task, graph, want=2)
    import dataclasses

    moved = dataclasses.replace(other, task_id=task.task_id)  # same id, another pool
    with pytest.raises(ValueError, match="the parent recorded"):
        asyncio.run(run_episode(moved, Sampled(), ExtractiveDrafter(), ExtractiveAnswerer(), seed=parent.seed,
                                key=KEY, config=LoopConfig(cap=6, max_turns=8), replay=parent, fork_turn=1))
    with pytest.raises(ValueError, match="fork_turn=9"):
        asyncio.run(run_episode(task, Sampled(), ExtractiveDrafter(), ExtractiveAnswerer(), seed=parent.seed, key=KEY,
                                replay=parent, fork_turn=9))
    with pytest.raises(ValueError, match="expected task"):
        asyncio.run(run_episode(task, Sampled(), ExtractiveDrafter(), ExtractiveAnswerer(), seed=parent.seed + 1,
                                key=KEY, replay=parent, fork_turn=0))
    with pytest.raises(ValueError, match=f"fork turn t={5 + parent.n_asks}: expected 0 <= t"):
        asyncio.run(fork_state(parent, task, graph, 5 + parent.n_asks, Sampled(), ExtractiveDrafter(),
                               ExtractiveAnswerer(), key=KEY))


def test_a_state_whose_candidate_failed_is_dropped_and_counted():
    suite = _suite(3)
    tasks = {t.task_id: t for t, _ in suite}
    graphs = {t.task_id: g for t, g in suite}
    config = LoopConfig(cap=6, max_turns=8, retries=1)
    parents = [_long_parent(t, g) for t, g in suite]
    states, counts = asyncio.run(fork_suite(parents, tasks, graphs, Sampled(), ExtractiveDrafter(),
                                            ExtractiveAnswerer(), key=KEY, config=config, n=4))
    n_states = sum(p.n_asks for p in parents)
    assert counts["parents"] == 3 and counts["states"] == n_states == len(states)
    assert counts["candidate_runs"] == 4 * n_states and counts["states_failed"] == 0
    assert [(s.task_id, s.turn) for s in states] == [(p.task_id, t) for p in parents for t in range(p.n_asks)]
    # a drafter failing once a run holds more than the first question's units: forks past turn 0 fail
    states, counts = asyncio.run(fork_suite(parents, tasks, graphs, Sampled(), Failing(after=task_k(suite)),
                                            ExtractiveAnswerer(), key=KEY, config=config, n=4))
    assert counts["states_failed"] > 0 and counts["states"] == len(states)
    assert counts["states"] + counts["states_failed"] == n_states


def task_k(suite):
    return suite[0][0].k


# ----------------------------------------------------------------------------- the job
def test_job_qd_label_with_the_scripted_questioner(tmp_path):
    """The scripted questioner is deterministic: its candidates are its parent, so the job keeps SFT
    rows (the asks clearing the floor, the stops at done states), no question pair (every pair
    identical) and only the synthesised stop pairs, and says so."""
    suite = write_suite(tmp_path / "syn.json", 8, depth=3, breadth=1, pool=12, seed=5)
    args = ["job=qd_label", "progress=false", f"runs_dir={tmp_path}", "name=lab", "qd.benchmark=synthetic",
            f"qd.file={suite}", "qd.tasks=6", "qd.seeds=1", "qd.forks=3", "qd.questioner=scripted"]
    assert main(args) == 0
    run = tmp_path / "lab"
    s = json.loads((run / "summary.json").read_text())
    parents = read_runs(run / "parents.jsonl")
    assert len(parents) == 6 and s["forking"]["states"] == sum(p.n_asks for p in parents)
    assert len(read_runs(run / "candidates.jsonl")) == 3 * s["forking"]["states"]
    assert s["sft_rows"] > 0 and s["stage2_pairs"] == 0 and s["pair_counts"]["identical"] > 0
    synth = s["pair_counts"].get("synth_done/stop_done", 0) + s["pair_counts"]["synth_not_done/stop_contrast"]
    assert s["pairs"] == synth and s["stage3_pairs"] == s["pair_counts"]["synth_not_done/stop_contrast"]
    rows = [json.loads(line) for line in (run / "sft.jsonl").read_text().splitlines()]
    assert len(rows) == s["sft_rows"] and {r["reason"] for r in rows} <= {"ask_clears_floor", "stop_done"}
    states = [json.loads(line) for line in (run / "states.jsonl").read_text().splitlines()]
    assert len(states) == s["forking"]["states"]
    decisions = [json.loads(line) for line in (run / "decisions.jsonl").read_text().splitlines()]
    assert len(decisions) == sum(p.n_asks + (p.stop_reason != "max_turns") for p in parents)


def test_job_qd_label_that_keeps_nothing_exits_nonzero(tmp_path, capsys):
    suite = write_suite(tmp_path / "syn.json", 4, depth=2, breadth=1, pool=12, seed=5)
    args = ["job=qd_label", "progress=false", f"runs_dir={tmp_path}", "name=none", "qd.benchmark=synthetic",
            f"qd.file={suite}", "qd.tasks=3", "qd.seeds=1", "qd.questioner=never_ask"]
    with pytest.raises(SystemExit, match="training failed: .*no SFT row and no pair"):
        main(args)
    s = json.loads((tmp_path / "none" / "summary.json").read_text())
    assert s["forking"] == {"parents": 3} and s["sft_rows"] == s["pairs"] == 0

"""Q&D transcript metrics (spec §3, §6 check 6): the §3.9 worked example under both depth rules and
both prefixes, out-of-order per edge vs per need, the stop 2x2, equal spend and the length
control, answer scoring (§1.4), and property tests of the bookkeeping."""

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.qd import metrics as m
from jaxagent.qd.graphs import Need, NeedGraph
from jaxagent.qd.transcript import QDRun, QDTurn


def _graph(evidence, edges=(), seeds=None, task_id="t"):
    """Needs in the given order; seeds default to the needs without a parent."""
    children = {v for _, v in edges}
    seeds = [v for v in evidence if v not in children] if seeds is None else seeds
    needs = tuple(Need(v, v, tuple(ev)) for v, ev in evidence.items())
    return NeedGraph(task_id, needs, tuple(edges), tuple(seeds))


def _run(retrieved, stop_reason="policy_stop", task_id="t", seed=0, tokens=None, question_tokens=None,
         questions=None, answer="", cap=8):
    turns = tuple(QDTurn(question=(questions or {}).get(i, f"question {i}"), retrieved=tuple(r),
                         question_tokens=(question_tokens or [0] * len(retrieved))[i])
                  for i, r in enumerate(retrieved))
    return QDRun("musique", task_id, seed, "test", turns, stop_reason, answer=answer, cap=cap,
                 tokens=dict(tokens or {}))


# ----------------------------------------------------------------------------- §3.9 worked example
@pytest.fixture
def example():
    graph = _graph({"n1": [1], "n2": [2], "n3": [3], "n4": [4, 5], "n5": [], "n6": [6], "n7": [7]},
                   [("n1", "n3"), ("n2", "n4"), ("n3", "n4"), ("n4", "n5"), ("n6", "n7")], ["n1", "n2", "n6"])
    run = _run([(1, 9), (4, 3), (7,), (2, 6)], tokens={"questioner_prompt": 100, "questioner_completion": 20,
                                                       "drafter_prompt": 30})
    return graph, run


def test_example_graph_shape(example):
    graph, _ = example
    assert graph.depths() == {"n1": 0, "n2": 0, "n3": 1, "n4": 2, "n5": 3, "n6": 0, "n7": 1}
    assert graph.depths("shortest") == {"n1": 0, "n2": 0, "n3": 1, "n4": 1, "n5": 2, "n6": 0, "n7": 1}
    assert graph.facets() == [("n3", "n4", "n5"), ("n7",)]


def test_example_resolution_turns(example):
    graph, run = example
    assert m.resolution_turns(run, graph) == {"n1": 0, "n2": 3, "n3": 1, "n4": None, "n5": None, "n6": 3, "n7": 2}
    assert m.resolution_turns(run, graph, 2) == {"n1": 0, "n2": None, "n3": 1, "n4": None, "n5": None, "n6": None,
                                                 "n7": None}
    assert m.first_retrieval(run) == {1: 0, 9: 0, 4: 1, 3: 1, 7: 2, 2: 3, 6: 3}


def test_example_full_run(example):
    graph, run = example
    assert m.coverage(run, graph) == pytest.approx(6 / 7)
    assert m.coverage(run, graph) == pytest.approx(0.857143, abs=1e-6)
    assert m.need_recall(run, graph) == pytest.approx(5 / 6)
    assert m.depth_coverage(run, graph) == {0: (3, 3), 1: (2, 2), 2: (0, 1), 3: (0, 1)}
    assert [c.rate for c in m.depth_coverage(run, graph).values()] == [1.0, 1.0, 0.0, 0.0]
    assert m.dwr(run, graph) == pytest.approx(0.3)  # (0.5 + 1) / 5
    assert m.depth_coverage(run, graph, required_only=True) == {0: (3, 3), 1: (2, 2), 2: (0, 1)}
    assert m.dwr(run, graph, required_only=True) == pytest.approx(0.5)  # 1.5 / 3
    assert m.deepest_resolved(run, graph) == 1
    assert m.breadth(run, graph) == 2
    assert m.out_of_order(run, graph) == pytest.approx(0.5)  # n1->n3 in order, n6->n7 violated
    assert m.out_of_order(run, graph, per="need") == pytest.approx(0.5)  # n3 ok, n7 before n6


def test_example_prefix_2(example):
    graph, run = example
    assert m.coverage(run, graph, 2) == pytest.approx(3 / 7)
    assert m.need_recall(run, graph, 2) == pytest.approx(2 / 6)
    assert m.depth_coverage(run, graph, 2) == {0: (1, 3), 1: (1, 2), 2: (0, 1), 3: (0, 1)}
    assert m.dwr(run, graph, 2) == pytest.approx((0.5 / 3 + 0.5) / 5)
    assert m.dwr(run, graph, 2) == pytest.approx(0.133333, abs=1e-6)
    assert m.dwr(run, graph, 2, required_only=True) == pytest.approx((0.5 / 3 + 0.5) / 3)
    assert m.dwr(run, graph, 2, required_only=True) == pytest.approx(0.222222, abs=1e-6)
    assert m.deepest_resolved(run, graph, 2) == 1
    assert m.breadth(run, graph, 2) == 1
    assert m.out_of_order(run, graph, 2) == 0.0  # only n1->n3 is eligible
    assert m.out_of_order(run, graph, 2, per="need") == 0.0


def test_example_shortest_depths(example):
    graph, run = example
    # shortest: d0 {n1,n2,n6}, d1 {n3,n7,n4}, d2 {n5}
    assert m.depth_coverage(run, graph, depth_rule="shortest") == {0: (3, 3), 1: (2, 3), 2: (0, 1)}
    assert m.dwr(run, graph, depth_rule="shortest") == pytest.approx((0.5 + 2 / 3) / 3)
    assert m.dwr(run, graph, depth_rule="shortest") == pytest.approx(0.388889, abs=1e-6)
    assert m.dwr(run, graph, depth_rule="shortest", required_only=True) == pytest.approx((0.5 + 2 / 3) / 1.5)
    assert m.deepest_resolved(run, graph, depth_rule="shortest") == 1
    # prefix 2 (not in the spec's table; by hand): C_0 1/3, C_1 1/3, C_2 0
    assert m.depth_coverage(run, graph, 2, depth_rule="shortest") == {0: (1, 3), 1: (1, 3), 2: (0, 1)}
    assert m.dwr(run, graph, 2, depth_rule="shortest") == pytest.approx((0.5 / 3 + 1 / 3) / 3)


def test_example_full_run_equals_prefix_n_asks(example):
    graph, run = example
    for k in (4, 5, 100):
        assert m.run_metrics(run, graph, k) == m.run_metrics(run, graph)


def test_run_metrics_row(example):
    graph, run = example
    row = m.run_metrics(run, graph)
    expected = {"task_id": "t", "seed": 0, "questioner": "test", "k": 4, "n_asks": 4, "stop_reason": "policy_stop",
                "deepest": 1, "breadth": 2, "question_words_mean": 2.0,
                "c_d0": 1.0, "n_d0": 3, "c_d1": 1.0, "n_d1": 2, "c_d2": 0.0, "n_d2": 1, "c_d3": 0.0, "n_d3": 1}
    assert {key: row[key] for key in expected} == expected
    assert row["coverage"] == pytest.approx(6 / 7) and row["need_recall"] == pytest.approx(5 / 6)
    assert row["dwr"] == pytest.approx(0.3) and row["dwr_required_only"] == pytest.approx(0.5)
    assert row["out_of_order_edge"] == pytest.approx(0.5) and row["out_of_order_need"] == pytest.approx(0.5)
    assert set(row) == set(expected) | {"coverage", "need_recall", "dwr", "dwr_required_only", "out_of_order_edge",
                                        "out_of_order_need"}
    cut = m.run_metrics(run, graph, 2)
    assert (cut["k"], cut["n_asks"], cut["stop_reason"], cut["breadth"]) == (2, 2, "budget", 1)
    assert cut["c_d0"] == pytest.approx(1 / 3) and cut["c_d1"] == 0.5 and cut["dwr"] == pytest.approx(2 / 15)
    short = m.run_metrics(run, graph, depth_rule="shortest")
    assert short["dwr"] == pytest.approx(7 / 18) and (short["n_d1"], short["c_d1"]) == (3, pytest.approx(2 / 3))
    assert "c_d3" not in short


def test_breadth_components(example):
    graph, run = example
    assert m.breadth_components(run, graph) == (2, 0)  # {n1..n5} and {n6, n7}
    assert m.breadth_components(run, graph, 1) == (1, 0)
    assert math.isnan(m.breadth_components(run, graph, 0).singleton_share)
    flat = _graph({"a": [1], "b": [2], "c": [3]})
    hit = m.breadth_components(_run([(1, 3)]), flat)
    assert hit == (2, 2) and hit.singleton_share == 1.0
    assert m.breadth(_run([(1, 3)]), flat) == 0  # a flat task has no facets


def test_tokens_per_need(example):
    graph, run = example
    assert m.tokens_per_need(run, graph) == pytest.approx(150 / 5)
    assert math.isnan(m.tokens_per_need(_run([(9,)], tokens={"x": 10}), graph))
    other = _run([(1,)], tokens={"questioner_prompt": 50})
    assert m.pooled_tokens_per_need([run, other], {"t": graph}) == pytest.approx(200 / 6)


# ----------------------------------------------------------------------------- edge cases of §6 check 6
def test_out_of_order_per_edge_vs_per_need():
    graph = _graph({"a": [1], "b": [2], "c": [3]}, [("a", "c"), ("b", "c")])
    run = _run([(1,), (3,), (2,)])  # turns a 0, c 1, b 2
    assert m.out_of_order(run, graph, per="edge") == pytest.approx(1 / 2)
    assert m.out_of_order(run, graph, per="need") == 1.0
    with pytest.raises(ValueError, match="per="):
        m.out_of_order(run, graph, per="node")


def test_out_of_order_same_turn_is_in_order():
    graph = _graph({"a": [1], "c": [3]}, [("a", "c")])
    assert m.out_of_order(_run([(3, 1)]), graph) == 0.0
    assert m.out_of_order(_run([(3,), (1,)]), graph) == 1.0


def test_out_of_order_nan_without_eligible_edge():
    graph = _graph({"a": [1], "b": [2], "c": [3]}, [("a", "c"), ("b", "c")])
    run = _run([(1,), (2,)])  # c never resolved: no edge has both ends resolved
    assert math.isnan(m.out_of_order(run, graph)) and math.isnan(m.out_of_order(run, graph, per="need"))
    flat = _graph({"a": [1], "b": [2]})
    assert math.isnan(m.out_of_order(_run([(1, 2)]), flat))


def test_deepest_is_minus_one_without_resolution(example):
    graph, _ = example
    run = _run([(9,), (5,)])  # half of n4's evidence, nothing else
    assert m.deepest_resolved(run, graph) == -1 and m.breadth(run, graph) == 0
    assert m.deepest_resolved(_run([]), graph) == -1
    assert m.coverage(run, graph) == pytest.approx(1 / 7) and m.need_recall(run, graph) == 0.0


def test_multi_paragraph_need_resolves_at_last_paragraph(example):
    graph, _ = example
    run = _run([(5,), (1,), (4,), (3,)])  # n4 = {p4, p5}: p5 at 0, p4 at 2
    turns = m.resolution_turns(run, graph)
    assert turns["n4"] == 2 and turns["n1"] == 1 and turns["n3"] == 3
    assert "n4" not in m.resolved(run, graph, 2) and m.resolved(run, graph, 3)["n4"] == 2
    # n3 (turn 3) -> n4 (turn 2) is violated; n1 -> n3 is in order
    assert m.out_of_order(run, graph) == pytest.approx(1 / 2)
    assert m.deepest_resolved(run, graph, 3) == 2


def test_unscorable_graph_is_nan():
    graph = _graph({"a": [], "b": []}, [("a", "b")])
    run = _run([(1,)])
    assert math.isnan(m.coverage(run, graph)) and math.isnan(m.need_recall(run, graph))
    assert math.isnan(m.dwr(run, graph, required_only=True))
    assert m.dwr(run, graph) == 0.0  # optional needs have depths and never resolve
    assert m.stop_cells(run, graph) == m.StopCells()


def test_dwr_ignores_depths_beyond_five():
    chain = {f"s{i}": [i] for i in range(7)}
    graph = _graph(chain, [(f"s{i}", f"s{i + 1}") for i in range(6)])
    run = _run([(6,)])  # only the depth-6 need
    assert m.depth_coverage(run, graph)[6] == (1, 1)
    assert m.dwr(run, graph) == 0.0
    assert m.deepest_resolved(run, graph) == 6
    assert math.isnan(m.dwr(_run([]), _graph({"x": [1]}, [("x", "x")], seeds=[])))  # no defined depth


def test_bad_prefix_raises(example):
    graph, run = example
    with pytest.raises(ValueError, match="k=-1"):
        m.coverage(run, graph, -1)


# ----------------------------------------------------------------------------- stop 2x2 (§3.7)
def test_stop_2x2_never_done(example):
    graph, run = example
    assert m.coverage_ladder(run, graph) == pytest.approx([0, 1 / 7, 3 / 7, 4 / 7, 6 / 7])
    assert m.stop_cells(run, graph) == m.StopCells(n_done=0, n_stop_at_done=0, n_not_done=5, n_ask_at_not_done=4,
                                                   asks_after_done=0, forced_stops=0)


def test_stop_2x2_done_then_stop():
    graph = _graph({"a": [1], "b": [2]})
    run = _run([(1,), (2,), ()])
    assert m.coverage_ladder(run, graph) == [0.0, 0.5, 1.0, 1.0]
    assert m.stop_cells(run, graph) == m.StopCells(n_done=2, n_stop_at_done=1, n_not_done=2, n_ask_at_not_done=2,
                                                   asks_after_done=1, forced_stops=0)
    for reason in ("budget", "max_turns"):
        forced = m.stop_cells(_run([(1,), (2,), ()], stop_reason=reason), graph)
        assert forced == m.StopCells(n_done=1, n_stop_at_done=0, n_not_done=2, n_ask_at_not_done=2,
                                     asks_after_done=1, forced_stops=1)


def test_stop_rates_pool_over_runs(example):
    graph, run = example
    g2 = _graph({"a": [1], "b": [2]})
    cells = [m.stop_cells(run, graph), m.stop_cells(_run([(1,), (2,), ()]), g2)]
    rates = m.stop_rates(cells)
    assert rates["stop_when_done"] == pytest.approx(1 / 2)  # 0 + 1 of 0 + 2
    assert rates["ask_when_not_done"] == pytest.approx(6 / 7)  # 4 + 2 of 5 + 2
    assert (rates["n_done"], rates["n_not_done"], rates["asks_after_done"]) == (2, 7, 1)
    assert math.isnan(m.stop_rates([cells[0]])["stop_when_done"])


def test_done_tolerance():
    assert m.is_done(1 - 1e-13) and not m.is_done(1 - 1e-11) and not m.is_done(math.nan)


# ----------------------------------------------------------------------------- spend (§3.8)
@pytest.fixture
def spend():
    graph = _graph({"q1": [1], "q2": [2], "q3": [3], "q4": [4]})
    t = _run([(1, 2), (9,), (3, 4)], answer="one")  # ladder 0, 1/2, 1/2, 1
    c = _run([(1,), (2,), (3,), (9,), (4,), (9,)], answer="two")  # ladder 0, 1/4, 1/2, 3/4, 3/4, 1, 1
    return graph, t, c


def test_equal_spend_example(spend):
    graph, t, c = spend
    assert m.coverage_ladder(t, graph) == [0, 0.5, 0.5, 1]
    assert m.coverage_ladder(c, graph) == [0, 0.25, 0.5, 0.75, 0.75, 1, 1]
    out = m.equal_spend([t], [c], {"t": graph})
    assert out.contrast == pytest.approx(0.25)
    assert out.per_task == {"t": m.TaskPair(1.0, 0.75, 1)} and (out.dropped, out.unpaired) == (0, 0)
    assert (out.treatment, out.comparator) == (1.0, 0.75)
    own_t, own_c = m.own_stop([t], {"t": graph}), m.own_stop([c], {"t": graph})
    assert (own_t["coverage"], own_t["questions"]) == (1.0, 3) and (own_c["coverage"], own_c["questions"]) == (1.0, 6)


def test_equal_spend_asymmetric(spend):
    graph, t, c = spend
    # roles swapped: the treatment asks more. symmetric: both at k = 3; asymmetric: the treatment at its own 6
    assert m.equal_spend([c], [t], {"t": graph}).contrast == pytest.approx(-0.25)
    assert m.equal_spend([c], [t], {"t": graph}, variant="asymmetric").contrast == 0.0
    assert m.equal_spend([t], [c], {"t": graph}, variant="asymmetric").contrast == pytest.approx(0.25)
    with pytest.raises(ValueError, match="variant"):
        m.equal_spend([t], [c], {"t": graph}, variant="both")


def test_equal_spend_other_metric(example):
    graph, run = example
    never = _run([])
    out = m.equal_spend([run], [never], {"t": graph}, metric=m.deepest_resolved)
    assert out.contrast == 0.0  # k = 0: both -1
    out = m.equal_spend([run], [never], {"t": graph}, metric=m.deepest_resolved, variant="asymmetric")
    assert out.contrast == 2.0  # 1 - (-1)


def test_equal_spend_pairs_by_task_and_seed_and_means_over_tasks(spend):
    graph, t, c = spend
    graphs = {"t": graph, "u": _graph({"x": [1]}, task_id="u"), "z": _graph({"o": []}, task_id="z")}
    t_other_training_seed = _run([(1, 2), (3,), (4,)])  # same task and rollout seed: k = 3, T 1.0
    u_t, u_c = _run([(1,)], task_id="u"), _run([(1,)], task_id="u")  # delta 0
    z_t, z_c = _run([(1,)], task_id="z"), _run([(1,)], task_id="z")  # unscorable: dropped
    lone = _run([(1,)], task_id="u", seed=7)  # no comparator of seed 7
    out = m.equal_spend([t, t_other_training_seed, u_t, z_t, lone], [c, u_c, z_c], graphs)
    assert out.per_task == {"t": m.TaskPair(1.0, 0.75, 2), "u": m.TaskPair(1.0, 1.0, 1)}
    assert out.contrast == pytest.approx((0.25 + 0.0) / 2)  # over tasks, not pairs (which would be 1/6)
    assert (out.dropped, out.unpaired) == (1, 1)
    with pytest.raises(ValueError, match="expected one"):
        m.equal_spend([t], [c, c], graphs)
    assert math.isnan(m.equal_spend([], [c], graphs).contrast)


def test_length_matched_prefix_by_hand():
    c = _run([(1,), (2,), (3,), (4,)], question_tokens=[4, 6, 6, 2])  # cumulative 4, 10, 16, 18
    assert m.length_matched_prefix(15, c) == 2
    assert m.length_matched_prefix(16, c) == 3
    assert m.length_matched_prefix(3, c) == 0
    assert m.length_matched_prefix(18, c) == 4 and m.length_matched_prefix(100, c) == 4
    assert m.length_matched_prefix(0, _run([])) == 0


def test_length_control(spend):
    graph, _, _ = spend
    t = _run([(1, 2), (9,), (3, 4)], question_tokens=[5, 7, 3])  # B = 15, coverage 1.0
    c = _run([(1,), (2,), (3,), (4,)], question_tokens=[4, 6, 6, 2])  # j = 2: coverage 0.5
    out = m.length_control([t], [c], {"t": graph})
    assert out.per_task == {"t": m.TaskPair(1.0, 0.5, 1)} and out.contrast == 0.5
    wordy = _run([(1,), (2,), (3,), (4,)], question_tokens=[20, 1, 1, 1])  # j = 0
    assert m.length_control([t], [wordy], {"t": graph}).contrast == 1.0


def test_own_stop_with_answers(spend):
    graph, t, c = spend
    gold = {"t": ("One", ())}
    out = m.own_stop([t, c], {"t": graph}, gold)  # both runs are seeds of task t: means over the task's runs
    assert out == {"coverage": 1.0, "questions": 4.5, "tasks": 1, "answer_f1": 0.5}


def test_own_stop_means_over_tasks_not_runs(spend):
    graph, t, c = spend
    third = _run([(1,)], seed=2)  # coverage 1/4, one question
    u = _run([(1,)], task_id="u")
    out = m.own_stop([t, c, third, u], {"t": graph, "u": _graph({"x": [1]}, task_id="u")})
    assert out["coverage"] == pytest.approx(((1 + 1 + 0.25) / 3 + 1) / 2)  # runs pooled would give 0.8125
    assert out["questions"] == pytest.approx(((3 + 6 + 1) / 3 + 1) / 2) and out["tasks"] == 2


def test_budget_frontier(example):
    graph, run = example
    run = dataclasses.replace(run, cap=24)
    other_seed = _run([(1,)], seed=1, cap=24)
    points = m.budget_frontier([run, other_seed], {"t": graph}, caps=(0, 2, 4, 8))
    assert [p.cap for p in points] == [0, 2, 4, 8]
    assert [p.calls for p in points] == [0.0, 1.5, 2.5, 2.5]
    assert [p.coverage for p in points] == pytest.approx([0.0, (3 / 7 + 1 / 7) / 2, (6 / 7 + 1 / 7) / 2,
                                                          (6 / 7 + 1 / 7) / 2])
    cut = _run([(1,), (2,)], stop_reason="budget", cap=2)
    assert m.budget_frontier([cut], {"t": graph}, caps=(2,))[0] == (2, 2.0, 2 / 7)
    with pytest.raises(ValueError, match="cap >= 4"):
        m.budget_frontier([cut], {"t": graph}, caps=(2, 4))


def test_question_lengths():
    run = _run([(), ()], questions={0: "Who  founded the\tcompany?", 1: ""})
    assert m.question_lengths(run) == [4, 0] and m.question_lengths(run, 1) == [4]
    assert m.question_words(" a b  c ") == 3
    assert math.isnan(m.run_metrics(_run([]), _graph({"a": [1]}))["question_words_mean"])


# ----------------------------------------------------------------------------- answers (§1.4)
def test_normalize_answer():
    assert m.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert m.normalize_answer("  An apple, a PEAR and the plum. ") == "apple pear and plum"
    assert m.normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_token_f1_and_answer_f1():
    assert m.token_f1("the cat sat", "cat sat down") == pytest.approx(0.8)  # p 1, r 2/3
    assert m.token_f1("Barack Obama", "Obama") == pytest.approx(2 / 3)
    assert m.token_f1("a dog", "cat") == 0.0
    assert m.token_f1("the", "") == 1.0 and m.token_f1("", "cat") == 0.0
    assert m.token_f1("cat cat", "cat") == pytest.approx(2 / 3)  # bags: 1 common of 2 predicted
    assert m.answer_f1("NYC", "New York City") == 0.0
    assert m.answer_f1("NYC", "New York City", ("nyc", "Big Apple")) == 1.0
    assert m.answer_f1("big apple city", "New York City", ("Big Apple",)) == pytest.approx(0.8)


def test_answer_correct_containment():
    assert m.answer_correct("It was Barack Obama.", "Obama") == 1.0
    assert m.answer_correct("Obamacare", "Obama") == 0.0  # a token sequence, not a substring
    assert m.answer_correct("in the New York City area", "new york city") == 1.0
    assert m.answer_correct("York New City", "New York City") == 0.0
    assert m.answer_correct("they call it NYC", "New York City", ("NYC",)) == 1.0
    assert m.answer_correct("the evidence does not say", "Paris") == 0.0  # no hedge outside yes/no tasks


def test_answer_correct_strategyqa():
    assert m.answer_correct("Yes, because the river floods.", "yes", ("true",)) == 1.0
    assert m.answer_correct("True.", "yes", ("true",)) == 1.0
    assert m.answer_correct("True.", "yes") == 1.0  # the polarity alias is implied on a yes/no task
    assert m.answer_correct("No.", "yes", ("true",)) == 0.0
    assert m.answer_correct("false", "no", ("false",)) == 1.0
    assert m.answer_correct("Yes", "no", ("false",)) == 0.0
    assert math.isnan(m.answer_correct("The evidence does not say.", "yes", ("true",)))
    assert math.isnan(m.answer_correct("Yes or no: it is unclear.", "no", ("false",)))  # both polarities
    assert m.is_hedge("It is unknown") and not m.is_hedge("Nope, no.") and m.is_hedge("nope")
    assert m.is_yes_no("Yes") and m.is_yes_no("false") and not m.is_yes_no("yes man")
    assert m.answer_f1("The evidence does not say.", "yes", ("true",)) == 0.0


# ----------------------------------------------------------------------------- properties
def _monotone(xs):
    return all(a <= b for a, b in itertools.pairwise(xs))


@st.composite
def graph_and_run(draw):
    n = draw(st.integers(1, 6))
    ids = [f"v{i}" for i in range(n)]
    evidence = {v: draw(st.lists(st.integers(0, 7), max_size=3, unique=True)) for v in ids}
    edges = draw(st.lists(st.tuples(st.sampled_from(ids), st.sampled_from(ids)), max_size=8))
    seeds = draw(st.lists(st.sampled_from(ids), max_size=n, unique=True))
    turns = draw(st.lists(st.lists(st.integers(0, 9), max_size=4, unique=True), max_size=7))
    reason = draw(st.sampled_from(["policy_stop", "budget", "max_turns"]))
    tokens = draw(st.lists(st.integers(0, 9), min_size=len(turns), max_size=len(turns)))
    return _graph(evidence, edges, seeds), _run(turns, stop_reason=reason, question_tokens=tokens)


@settings(max_examples=300, deadline=None)
@given(graph_and_run())
def test_prefix_bookkeeping(case):
    graph, run = case
    n = run.n_asks
    covs = [m.coverage(run, graph, k) for k in range(n + 2)]
    if not graph.scorable:
        assert all(math.isnan(c) for c in covs) and math.isnan(m.need_recall(run, graph))
        return
    assert covs == m.coverage_ladder(run, graph) + [covs[-1]]
    assert _monotone(covs)  # monotone in k
    assert covs[n] == covs[n + 1] == m.coverage(run, graph)
    recalls = [m.need_recall(run, graph, k) for k in range(n + 1)]
    assert _monotone(recalls)
    assert recalls[n] == m.need_recall(run, graph)
    for k in range(n + 1):
        assert (recalls[k] == 1.0) == (covs[k] >= 1 - m.DONE_TOL)  # need recall 1 iff uid coverage 1
    deepest = [m.deepest_resolved(run, graph, k) for k in range(n + 1)]
    assert _monotone(deepest) and deepest[0] == -1


@settings(max_examples=300, deadline=None)
@given(graph_and_run())
def test_reading_ranges(case):
    graph, run = case
    for k in (None, 0, run.n_asks // 2):
        assert 0 <= m.breadth(run, graph, k) <= len(graph.facets())
        assert 0 <= m.breadth_components(run, graph, k).count <= len(graph.components())
        per_edge, per_need = m.out_of_order(run, graph, k), m.out_of_order(run, graph, k, per="need")
        assert math.isnan(per_edge) == math.isnan(per_need)  # eligible edges exist iff eligible needs do
        assert math.isnan(per_edge) or 0 <= per_edge <= 1 and 0 <= per_need <= 1
        for rule in ("longest", "shortest"):
            for req in (False, True):
                v = m.dwr(run, graph, k, rule, req)
                assert math.isnan(v) or 0 <= v <= 1 + 1e-12
            cells = m.depth_coverage(run, graph, k, rule)
            assert sum(c.total for c in cells.values()) == sum(d is not None for d in graph.depths(rule).values())
    if run.n_asks == 0:
        assert m.deepest_resolved(run, graph) == -1 and m.breadth(run, graph) == 0


@settings(max_examples=300, deadline=None)
@given(graph_and_run())
def test_stop_cells_account_for_every_point(case):
    graph, run = case
    cells = m.stop_cells(run, graph)
    if not graph.scorable:
        assert cells == m.StopCells()
        return
    policy = run.stop_reason == "policy_stop"
    assert cells.n_done + cells.n_not_done + cells.forced_stops == run.n_asks + 1
    assert cells.forced_stops == (not policy)
    assert cells.asks_after_done + cells.n_ask_at_not_done == run.n_asks
    assert cells.n_stop_at_done + (cells.n_not_done - cells.n_ask_at_not_done) == policy
    assert cells.asks_after_done == cells.n_done - cells.n_stop_at_done


@settings(max_examples=200, deadline=None)
@given(graph_and_run(), st.integers(0, 60))
def test_length_matched_prefix_is_largest(case, budget):
    _, run = case
    j = m.length_matched_prefix(budget, run)
    spent = [sum(t.question_tokens for t in run.turns[:i]) for i in range(run.n_asks + 1)]
    assert 0 <= j <= run.n_asks and spent[j] <= budget
    assert j == run.n_asks or spent[j + 1] > budget


# ----------------------------------------------------------------------------- candidate values (§4.2, check 7)
def test_ask_value_by_hand(example):
    from jaxagent.qd.labels import STOP_VALUE, ask_value, held_coverage

    g, _ = example
    assert held_coverage({1, 9, 3, 4, 7}, g) == pytest.approx(4 / 7)
    v = ask_value({1, 9, 3, 4, 7}, [2, 6, 9], g)
    assert v.phi_gain == pytest.approx(2 / 7) and v.rho == pytest.approx(1 / 3)
    assert round(v.value, 6) == 0.059524
    assert ask_value({1}, [], g).value == pytest.approx(-0.05)  # a turn retrieving nothing
    assert ask_value({1}, [1], g) == pytest.approx((0.0, 1.0, -0.15))  # all already held
    assert ask_value({1}, [1, 9], g) == pytest.approx((0.0, 0.5, -0.1))  # new but off the graph: no gain
    assert STOP_VALUE == 0.0

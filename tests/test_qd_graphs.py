"""Need graphs: depth under both rules, facets, the three builders on the spec's named tasks
(§6 checks 2-4), whole-file shapes (§2.7, check 5) and the command."""

import json
import subprocess
import sys

import pytest

from jaxagent.envs.retrieval_qa.tasks import musique_task
from jaxagent.qd.graphs import Need, NeedGraph, build_graphs, musique_graph, shapes, wiki2_key

SHAPES = {  # spec §2.7
    "musique": dict(tasks=100, unscorable_tasks=0, nodes=237, required_nodes=237, optional_nodes=0,
                    required_pool_ids=237, edges=137, orphans=0, depth_hist={"0": 105, "1": 100, "2": 29, "3": 3},
                    depth_hist_shortest={"0": 105, "1": 102, "2": 27, "3": 3}, tasks_gt1_facet=0, tasks_0_facets=0),
    "strategyqa": dict(tasks=229, unscorable_tasks=0, nodes=674, required_nodes=549, optional_nodes=125,
                       required_pool_ids=553, edges=451, orphans=0, depth_hist={"0": 371, "1": 233, "2": 65, "3": 5},
                       depth_hist_shortest={"0": 371, "1": 266, "2": 37}, tasks_gt1_facet=0, tasks_0_facets=3),
    "2wiki": dict(tasks=500, unscorable_tasks=1, nodes=1184, required_nodes=1162, optional_nodes=22,
                  required_pool_ids=1162, edges=421, orphans=0, depth_hist={"0": 763, "1": 421},
                  depth_hist_shortest={"0": 763, "1": 421}, tasks_gt1_facet=90, tasks_0_facets=169),
}


@pytest.fixture(scope="module")
def graphs():
    return {b: {t.task_id: (t, g) for t, g in build_graphs(b)} for b in SHAPES}


def _graph(edges, seeds, ids=None, evidence=None):
    ids = ids or sorted({x for e in edges for x in e} | set(seeds))
    return NeedGraph("t", tuple(Need(i, i, (evidence or {}).get(i, (0,))) for i in ids), tuple(edges), tuple(seeds))


def test_longest_and_shortest_depth_by_hand():
    g = _graph([("s1", "s2"), ("s2", "s4"), ("s3", "s4")], ["s1", "s3"])
    assert g.depths() == {"s1": 0, "s2": 1, "s3": 0, "s4": 2}
    assert g.depths("shortest") == {"s1": 0, "s2": 1, "s3": 0, "s4": 1}
    assert g.facets() == [("s2", "s4")] and g.components() == [("s1", "s2", "s3", "s4")]
    with pytest.raises(ValueError, match="qd.depth_rule='deepest'"):
        g.depths("deepest")


def test_orphans_cycles_and_seeds_with_parents():
    # a non-seed without parents, a cycle b <-> c fed by the seed, and d below the cycle: undefined;
    # the seed s keeps depth 0 although e points at it
    g = _graph([("s", "b"), ("b", "c"), ("c", "b"), ("c", "d"), ("e", "s")], ["s"], ids=["s", "b", "c", "d", "e", "o"])
    assert g.depths() == {"s": 0, "b": None, "c": None, "d": None, "e": None, "o": None}
    assert g.depths("shortest") == {"s": 0, "b": 1, "c": 2, "d": 3, "e": None, "o": None}
    assert shapes([g])["orphans"] == 5
    # undefined needs stay in the facets (only depth 0 is deleted: e's one edge went with s)
    assert g.facets() == [("b", "c", "d"), ("e",), ("o",)]


def test_a_flat_graph_has_no_facets_and_an_evidence_free_one_is_unscorable():
    flat = _graph([], ["a", "b"])
    assert flat.facets() == [] and flat.scorable and flat.required_evidence == {0}
    empty = _graph([], ["a"], evidence={"a": ()})
    assert not empty.scorable and not empty.needs[0].required


def test_bad_graphs_are_refused():
    with pytest.raises(ValueError, match="edge a->z names an unknown need"):
        NeedGraph("t", (Need("a", "a"),), (("a", "z"),), ("a",))
    with pytest.raises(ValueError, match="distinct"):
        NeedGraph("t", (Need("a", "a"), Need("a", "b")), (), ("a",))


def test_musique_named_tasks(graphs):
    _, g = graphs["musique"]["4hop3__822796_608613_83398_4107"]
    assert g.edges == (("s1", "s2"), ("s2", "s4"), ("s3", "s4")) and g.seeds == ("s1", "s3")
    assert list(g.depths().values()) == [0, 1, 0, 2] and g.depths("shortest")["s4"] == 1
    assert g.facets() == [("s2", "s4")]
    _, g = graphs["musique"]["3hop2__130734_798404_834843"]
    assert g.parents()["s3"] == ["s1", "s2"] and g.depths()["s3"] == 1 and g.facets() == [("s3",)]


def test_musique_references_by_hand():
    para = [{"idx": i, "title": f"T{i}", "paragraph_text": "x"} for i in range(3)]
    steps = [{"question": "who #1 is #9", "answer": "A", "paragraph_support_idx": 0},  # self and out of range
             {"question": "what of #1 and #1", "answer": "B", "paragraph_support_idx": 2},
             {"question": "where #0", "answer": "C", "paragraph_support_idx": 7}]  # idx 7 not in the pool
    rec = {"id": "3hop1__x", "question": "q", "answer": "a", "answerable": True, "paragraphs": para,
           "question_decomposition": steps}
    g = musique_graph(rec, musique_task(rec))
    assert g.edges == (("s1", "s2"),) and g.seeds == ("s1", "s3")
    assert [n.evidence for n in g.needs] == [(0,), (2,), ()] and [n.alias for n in g.needs] == ["A", "B", "C"]
    assert not g.needs[2].required
    assert musique_task(dict(rec, answerable=False)) is None


def test_strategyqa_named_tasks(graphs):
    t, g = graphs["strategyqa"]["e0044a7b4d146d611e73"]
    assert [n.required for n in g.needs] == [True, True, False, False, False]
    assert g.edges == (("s1", "s3"), ("s2", "s4"), ("s3", "s5"), ("s4", "s5"))
    assert list(g.depths().values()) == [0, 0, 1, 1, 2] and g.facets() == [("s3", "s4", "s5")]
    assert len(t.pool) == 20 and [n.evidence for n in g.needs[:2]] == [(5,), (13,)]
    assert (t.pool[5].source_id, t.pool[13].source_id) == ("Albany, Georgia-1", "Albany, New York-2")
    _, g = graphs["strategyqa"]["be5c9933987f046b476e"]
    s1, s2 = g.needs[:2]
    assert s1.evidence == s2.evidence  # one paragraph, two needs: uid coverage and need recall differ
    assert len(g.required_evidence) < sum(n.required for n in g.needs)


def test_wiki2_named_tasks(graphs):
    _, g = graphs["2wiki"]["58f39f7808b511ebbd88ac1f6bf848b6"]
    assert g.edges == (("e1", "e3"), ("e2", "e4")) and g.facets() == [("e3",), ("e4",)]
    assert [n.evidence for n in g.needs] == [(8,), (0,), (2,), (7,)]
    t, g = graphs["2wiki"]["93402dbc0bdb11eba7f7acde48001122"]
    assert t.pool[g.needs[0].evidence[0]].title == "Get Low (Dillon Francis and DJ Snake song)"
    assert wiki2_key("Get Low (Dillon Francis and DJ Snake song)") == wiki2_key("Get Low") == "get low"
    _, g = graphs["2wiki"]["e19a61860bda11eba7f7acde48001122"]
    assert not g.needs[0].required and g.edges == (("e1", "e2"),) and g.depths()["e2"] == 1
    comparison = [g for t, g in graphs["2wiki"].values() if t.kind == "comparison"]
    assert comparison and all(not g.edges for g in comparison)
    unscorable = [t for t, g in graphs["2wiki"].values() if not g.scorable]
    assert len(unscorable) == 1


def test_wiki2_without_context_is_unscorable():
    from jaxagent.envs.retrieval_qa.tasks import wiki2_task
    from jaxagent.qd.graphs import wiki2_graph

    rec = {"_id": "w", "type": "compositional", "question": "q", "answer": "a",
           "evidences": [["A", "r", "B"], ["B (x)", "s", "C"], ["short", "triple"]]}
    g = wiki2_graph(rec, wiki2_task(rec))
    assert not g.scorable and [n.id for n in g.needs] == ["e1", "e2"] and g.edges == (("e1", "e2"),)


@pytest.mark.parametrize("bench", list(SHAPES))
def test_whole_file_shapes(graphs, bench):
    assert shapes([g for _, g in graphs[bench].values()]) == SHAPES[bench]


def test_the_command_prints_the_shapes():
    out = subprocess.run([sys.executable, "-m", "jaxagent.qd.graphs", "--benchmark", "strategyqa", "--json"],
                         capture_output=True, text=True, check=True).stdout
    got = json.loads(out)
    assert {k: got[k] for k in SHAPES["strategyqa"]} == SHAPES["strategyqa"]
    bad = subprocess.run([sys.executable, "-m", "jaxagent.qd.graphs", "--benchmark", "musique", "/nonexistent.json"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "/nonexistent.json: expected a readable JSON file" in bad.stderr

"""Synthetic multi-hop suites (`jaxagent.qd.synthetic`): records load through the MuSiQue task and
graph builders with exactly the configured shape (depth histogram, facets, edges, every need
required), each supporting paragraph names the entity the next step needs (BM25 on that name finds
the next paragraph), pools and distractors, determinism per seed, bad arguments and the command."""

import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from jaxagent.envs.retrieval_qa.bm25 import PoolIndex, tokenize
from jaxagent.envs.retrieval_qa.tasks import TOP_K, load_suite, musique_task
from jaxagent.qd.graphs import musique_graph
from jaxagent.qd.synthetic import generate, main, supporting_count, write_suite

SHAPES = [(1, 1), (3, 1), (1, 3), (2, 2), (3, 2), (4, 3)]
JOIN = ["step", "question"]


def _graph(record):
    task = musique_task(record)
    return task, musique_graph(record, task)


def _expected_edges(depth, breadth, join):
    edges = {(f"s{ln * depth + j}", f"s{ln * depth + j + 1}") for ln in range(breadth) for j in range(1, depth)}
    if breadth > 1 and join == "step":
        edges |= {(f"s{(ln + 1) * depth}", f"s{breadth * depth + 1}") for ln in range(breadth)}
    return edges


@pytest.mark.parametrize("join", JOIN)
@pytest.mark.parametrize("depth,breadth", SHAPES)
def test_shape_through_the_musique_builders(depth, breadth, join):
    final = breadth > 1 and join == "step"
    for record in generate(5, depth=depth, breadth=breadth, pool=20, seed=1, join=join):
        task, g = _graph(record)
        assert task.kind == f"syn{depth}x{breadth}" + ("q" if breadth > 1 and join == "question" else "")
        assert record["id"].split("__")[0] == task.kind and len(task.pool) == 20
        assert len(g.needs) == depth * breadth + final and all(n.required for n in g.needs)
        hist = Counter(g.depths().values())
        assert hist == Counter({d: breadth for d in range(depth)} | ({depth: 1} if final else {}))
        assert set(g.edges) == _expected_edges(depth, breadth, join) and len(g.edges) == len(set(g.edges))
        assert set(g.seeds) == {f"s{ln * depth + 1}" for ln in range(breadth)}
        # facets (spec §2.3): a final step joins the lines; without it each line of depth >= 2 is one
        if depth == 1 and not final:
            assert g.facets() == []
        elif final:
            assert len(g.facets()) == 1
        else:
            assert g.facets() == [tuple(f"s{ln * depth + j}" for j in range(2, depth + 1)) for ln in range(breadth)]
            assert len(g.facets()) == breadth
        # every required need's evidence is its own supporting paragraph, distinct per need
        assert sorted(i for n in g.needs for i in n.evidence) == sorted(
            p["idx"] for p in record["paragraphs"] if p["is_supporting"])


def test_step_questions_reference_earlier_steps_with_hash_n():
    record = generate(1, depth=3, breadth=2, seed=4)[0]
    qs = [s["question"] for s in record["question_decomposition"]]
    refs = [sorted(int(m) for m in re.findall(r"#(\d+)", q)) for q in qs]
    assert refs == [[], [1], [2], [], [4], [5], [3, 6]]
    assert record["answer"] in {s["answer"] for s in record["question_decomposition"]}
    assert record["question_decomposition"][-1]["answer"] == record["answer"]
    assert record["answer_aliases"] == [] and record["answerable"] is True


@pytest.mark.parametrize("join", JOIN)
def test_supporting_paragraphs_name_the_next_entity_and_bm25_finds_it(join):
    k = TOP_K["synthetic"]
    for record in generate(10, depth=3, breadth=2, seed=2, join=join):
        steps = record["question_decomposition"]
        paras = {p["idx"]: p for p in record["paragraphs"]}
        index = PoolIndex([(p["title"], p["paragraph_text"]) for p in record["paragraphs"]])
        for i, step in enumerate(steps):
            refs = [int(m) for m in re.findall(r"#(\d+)", step["question"])]
            # the entities this step needs: the answers it references, else the one its question names
            needed = [steps[n - 1]["answer"] for n in refs] or [paras[step["paragraph_support_idx"]]["title"]]
            if refs:
                assert "#" not in " ".join(needed)
                for n in refs:  # the evidence of the referenced step names this step's entity
                    assert steps[n - 1]["answer"] in paras[steps[n - 1]["paragraph_support_idx"]]["paragraph_text"]
            else:
                assert needed[0] in step["question"]
            assert step["paragraph_support_idx"] in index.search(" ".join(needed), k), (record["id"], i)
            assert step["answer"] in paras[step["paragraph_support_idx"]]["paragraph_text"]


def test_pool_size_and_distractors():
    for pool in (7, 12, 30):
        for record in generate(3, depth=3, breadth=2, pool=pool, seed=5):
            paras = record["paragraphs"]
            assert [p["idx"] for p in paras] == list(range(pool))
            support = {s["paragraph_support_idx"] for s in record["question_decomposition"]}
            assert {p["idx"] for p in paras if p["is_supporting"]} == support and len(support) == 7
            chain = {s["answer"] for s in record["question_decomposition"]} | {paras[i]["title"] for i in support}
            for p in paras:
                if not p["is_supporting"]:  # a distractor: another entity, named by its title, no chain entity
                    assert p["title"] in p["paragraph_text"] and p["title"] not in chain
                    words = set(tokenize(p["paragraph_text"]))
                    assert not any(set(tokenize(e)) <= words for e in chain)
            titles = [p["title"] for p in paras]
            assert len(set(titles)) == len(titles)


def test_deterministic_per_seed_and_different_across_seeds():
    a = generate(6, depth=2, breadth=2, seed=7)
    assert a == generate(6, depth=2, breadth=2, seed=7)
    assert generate(3, depth=2, breadth=2, seed=7) == a[:3]  # task i does not depend on n
    b = generate(6, depth=2, breadth=2, seed=8)
    assert all(x != y for x, y in zip(a, b)) and [r["id"] for r in a] == [r["id"] for r in b]
    assert len({json.dumps(r["question_decomposition"]) for r in a}) == 6  # tasks differ within a suite
    # a subprocess (another hash seed) writes the same bytes
    code = ("import json,sys; from jaxagent.qd.synthetic import generate; "
            "sys.stdout.write(json.dumps(generate(6, depth=2, breadth=2, seed=7)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    assert json.loads(out.stdout) == a


@pytest.mark.parametrize("kwargs,match", [
    (dict(n=-1), "n=-1: expected an integer >= 0"),
    (dict(depth=0), "depth=0: expected an integer >= 1"),
    (dict(breadth=0), "breadth=0: expected an integer >= 1"),
    (dict(breadth=2.0), "breadth=2.0: expected an integer >= 1"),
    (dict(depth=True), "depth=True: expected an integer >= 1"),
    (dict(seed="a"), "seed='a': expected an integer"),
    (dict(join="tail"), "join='tail': expected one of step, question"),
    (dict(depth=3, breadth=2, pool=6), r"pool=6: expected at least 7 paragraphs"),
    (dict(depth=3, breadth=2, pool=5, join="question"), r"pool=5: expected at least 6 paragraphs"),
    (dict(breadth=1001, pool=5000), "breadth=1001: expected at most 1000"),
])
def test_bad_arguments_are_refused(kwargs, match):
    args = dict(n=2, depth=2, breadth=1, pool=20, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        generate(args.pop("n"), **args)


def test_supporting_count():
    assert supporting_count(3, 1) == 3 and supporting_count(3, 2) == 7 and supporting_count(3, 2, "question") == 6
    assert generate(0, depth=1, breadth=1) == []


def test_write_suite_and_command(tmp_path):
    path = write_suite(tmp_path / "sub" / "s.json", 4, depth=2, breadth=2, pool=9, seed=3)
    assert json.loads(path.read_text()) == generate(4, depth=2, breadth=2, pool=9, seed=3)
    out = tmp_path / "cmd.json"
    r = subprocess.run([sys.executable, "-m", "jaxagent.qd.synthetic", str(out), "--n", "5", "--depth", "3",
                        "--breadth", "2", "--seed", "9"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "wrote 5 tasks" in r.stdout
    suite = load_suite("synthetic", out)
    assert [t.task_id for _, t in suite] == [f"syn3x2__{i}" for i in range(5)]
    assert all(t.benchmark == "synthetic" and len(t.pool) == 20 for _, t in suite)
    assert [rec for rec, _ in suite] == generate(5, depth=3, breadth=2, seed=9)
    assert main([str(tmp_path / "bad.json"), "--n", "2", "--depth", "0"]) == 1
    assert not (tmp_path / "bad.json").exists()

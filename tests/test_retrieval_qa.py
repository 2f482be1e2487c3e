"""Retrieval QA: the tasks and pools of the three shipped suites, and BM25 over a pool (bm25s
against a plain loop over the formula; the Q&D spec's §6 check 1)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.envs.retrieval_qa.bm25 import PoolIndex, bm25_scores_reference, tokenize
from jaxagent.envs.retrieval_qa.tasks import (
    load_suite,
    musique_task,
    strategyqa_corpus,
    strategyqa_step_evidence,
    strategyqa_task,
    wiki2_task,
)

POOL = [("Alpha", "red apple"), ("Beta", "red red pear"), ("Gamma", "blue sky")]


def test_bm25_by_hand():
    # avgdl = 10/3; idf(red) = ln(1 + 1.5/2.5) = ln 1.6, idf(apple) = ln(1 + 2.5/1.5)
    assert math.log(1.6) == pytest.approx(0.470004, abs=1e-6)
    assert math.log(1 + 2.5 / 1.5) == pytest.approx(0.980829, abs=1e-6)
    ix = PoolIndex(POOL)
    np.testing.assert_allclose(ix.scores("Red apple?"), [1.512717, 0.611839, 0.0], atol=1e-6)
    assert ix.search("Red apple?", 5) == [0, 1]  # the zero-score document is absent
    np.testing.assert_allclose(ix.scores("red red"), [0.980102, 1.223678, 0.0], atol=1e-6)  # query tf is linear
    assert ix.search("red red", 5) == [1, 0]
    assert ix.search("zzzz", 5) == []  # nothing positive: nothing returned, never padded
    assert ix.search("red red", 1) == [1]  # k truncates
    assert ix.search("gamma", 3) == [2]  # the title's tokens count


def test_equal_scores_order_by_pool_index():
    ix = PoolIndex([("x", "common"), ("y", "other"), ("z", "common")])
    s = ix.scores("common")
    assert s[0] == s[2] > 0 and ix.search("common", 3) == [0, 2]
    assert PoolIndex([("b", "same words"), ("a", "same words")]).search("same", 2) == [0, 1]
    # a tie only in exact arithmetic (found by hypothesis): 1*2.5/1.75 == 3*2.5/5.25 with avgdl 3
    docs = [("", ""), ("", "red"), ("", "red red red red red red"), ("", "red red red apple apple")]
    assert PoolIndex(docs).search("red", 3) == [2, 1, 3]


def test_tokenizer():
    assert tokenize("Hello, World! x2-y_3 Ünïcode café") == ["hello", "world", "x2", "y", "3", "n", "code", "caf"]
    assert tokenize("") == [] and tokenize("!!!") == []


def test_an_empty_or_tokenless_pool_returns_nothing():
    assert PoolIndex([]).search("anything", 3) == []
    assert PoolIndex([("", "!!!")]).search("anything", 3) == []
    with pytest.raises(ValueError, match="k=0"):
        PoolIndex(POOL).search("red", 0)


WORDS = st.sampled_from(["red", "apple", "pear", "blue", "sky", "x1", "the", "of", "Alpha", "zeta"])
TEXT = st.lists(WORDS, min_size=0, max_size=12).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(docs=st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=8), query=TEXT)
def test_bm25s_equals_the_formula(docs, query):
    ix = PoolIndex(docs)
    ref = bm25_scores_reference(docs, query) if any(tokenize(f"{t} {x}") for t, x in docs) else [0.0] * len(docs)
    np.testing.assert_allclose(ix.scores(query), ref, rtol=1e-12, atol=1e-12)
    top = ix.search(query, 3)
    # Scores equal in exact arithmetic (tf=1 in a 1-token document and tf=3 in a 5-token one, avgdl 3) can
    # differ by an ulp in the plain loop: the reference order treats scores equal to 10 decimals as tied.
    want = [i for i in sorted(range(len(docs)), key=lambda i: (-round(ref[i], 10), i))[:3] if ref[i] > 0]
    assert top == want


def test_bm25_on_a_real_pool_equals_the_formula():
    (_, task), *_ = load_suite("musique")
    docs = [(u.title, u.text) for u in task.pool]
    np.testing.assert_allclose(PoolIndex(docs).scores(task.question), bm25_scores_reference(docs, task.question),
                               rtol=1e-12)
    assert len(PoolIndex(docs).search(task.question, task.k)) == 5


# ----------------------------------------------------------------------------- tasks and pools
def test_shipped_suites():
    for bench, n, pool, k in (("musique", 100, {20}, 5), ("strategyqa", 229, {20}, 2), ("2wiki", 500, {10}, 3)):
        suite = load_suite(bench)
        assert len(suite) == n
        assert {len(t.pool) for _, t in suite} <= pool | {0}, bench
        assert {t.k for _, t in suite} == {k} and len({t.task_id for _, t in suite}) == n
        for _, t in suite:
            assert [u.index for u in t.pool] == list(range(len(t.pool)))


def test_musique_pool_is_sorted_by_idx_and_unanswerable_is_skipped():
    rec = {"id": "2hop__1_2", "question": "q?", "answer": "a", "answer_aliases": ["b"], "answerable": True,
           "paragraphs": [{"idx": 1, "title": "T1", "paragraph_text": "one"},
                          {"idx": 0, "title": "T0", "paragraph_text": "zero"}],
           "question_decomposition": []}
    t = musique_task(rec)
    assert [(u.index, u.title) for u in t.pool] == [(0, "T0"), (1, "T1")] and t.aliases == ("b",) and t.kind == "2hop"
    assert musique_task(dict(rec, answerable=False)) is None
    with pytest.raises(ValueError, match="idx"):
        musique_task(dict(rec, paragraphs=[{"idx": 3, "title": "x", "paragraph_text": "y"}]))


def test_strategyqa_pool_is_seeded_gold_plus_distractors():
    corpus = {f"P{i}-0": (f"P{i}", f"text {i}") for i in range(30)}
    rec = {"qid": "q1", "question": "Is it?", "answer": True, "decomposition": ["a", "b #1"],
           "evidence": [[[["P3-0", "missing-9"]], ["operation"]]]}
    t = strategyqa_task(rec, corpus)
    assert len(t.pool) == 20 and t.answer == "yes" and t.aliases == ("true",)
    assert "P3-0" in [u.source_id for u in t.pool]
    assert strategyqa_task(rec, corpus) == t  # seeded: the same pool every time
    assert [u.source_id for u in strategyqa_task(dict(rec, qid="q2"), corpus).pool] != [u.source_id for u in t.pool]
    assert strategyqa_task(dict(rec, decomposition=[]), corpus) is None
    assert strategyqa_task(dict(rec, answer=False), corpus).aliases == ("false",)


def test_strategyqa_step_evidence_takes_the_first_annotator_with_a_list():
    corpus = {"A-1": 0, "B-2": 0, "C-3": 0}
    rec = {"decomposition": ["s1", "s2", "s3"],
           "evidence": [[[[]], ["no_evidence"], ["operation"]],  # annotator 1: nothing for s1, s2
                        [[["A-1"], ["B-2"]], [["gone-1"], ["C-3"]], ["operation"]],
                        [[["B-2", "C-3"]], [["A-1"]], [["A-1"]]]]}
    # s1: annotator 2's first list (no union with its second or annotator 3's); s2: annotator 2's
    # second alternative (its first names only a missing id); s3: annotator 3
    assert strategyqa_step_evidence(rec, corpus) == [["A-1"], ["C-3"], ["A-1"]]


def test_strategyqa_corpus_from_the_list_or_the_upstream_dict():
    listed = strategyqa_corpus([{"title": "T", "para_index": 2, "contents": "x"}])
    assert listed == {"T-2": ("T", "x")} == strategyqa_corpus({"T-2": {"title": "T", "content": "x"}})


def test_wiki2_pool_joins_the_stripped_sentences():
    t = wiki2_task({"_id": "w", "type": "bridge-comparison", "question": "q", "answer": "a",
                    "context": [["T", [" One. ", "Two."]]]})
    assert t.pool[0].text == "One. Two." and t.kind == "bridge_comparison"
    assert wiki2_task({"_id": "w", "question": "q", "answer": "a"}).pool == ()


def test_a_bad_file_is_named(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="x.json: expected a readable JSON file"):
        load_suite("musique", bad)
    bad.write_text("{}")
    with pytest.raises(ValueError, match="expected a list of musique records"):
        load_suite("musique", bad)
    with pytest.raises(ValueError, match="benchmark='hotpot'"):
        load_suite("hotpot")

"""Q&D labels (spec §4.2-§4.6; §6 checks 7, 8, 9): values, canonical targets, the leak filter, SFT
rows with their weights, preference pairs (ask_ask, ask_stop, synthesised) with their guards and
cap, the stage filters, JSONL round trips, and property tests over random candidate sets."""

import dataclasses
import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.qd import labels as L
from jaxagent.qd.graphs import Need, NeedGraph
from jaxagent.qd.labels import Candidate, ForkState, Pair, SFTRow
from jaxagent.qd.prompts import parse_action

M = 0.071213
PROMPT = "Task: who?\n\n(rendered state)"
PIN = "policy:x|cap=8|max_turns=16"


def cand(index, value=0.0, *, action="ask", question=None, phi=None, correct=math.nan, ttc=-1, prompt=PROMPT,
         pin=PIN, rationale="r", malformed=False):
    if action == "stop":
        return Candidate(index=index, seed=100 + index, action="stop", raw="{}", malformed=malformed,
                         answer_correct=correct, prompt=prompt, pin=pin)
    return Candidate(index=index, seed=100 + index, action="ask",
                     question=question if question is not None else f"question number {index}?", rationale=rationale,
                     value=value, phi_gain=value if phi is None else phi, answer_correct=correct,
                     turns_to_complete=ttc, prompt=prompt, pin=pin)


def state(cands, done=False, task="t1", turn=0, answer="Ann Lee", aliases=("Ann",), seed=0, benchmark="musique"):
    return ForkState(benchmark, task, seed, turn, done, answer, tuple(aliases), tuple(cands))


# ----------------------------------------------------------------------------- check 7: values (§4.2)
def test_check7_value():
    needs = tuple(Need(v, v, tuple(ev)) for v, ev in
                  {"n1": [1], "n2": [2], "n3": [3], "n4": [4, 5], "n5": [], "n6": [6], "n7": [7]}.items())
    g = NeedGraph("t", needs, (("n1", "n3"), ("n2", "n4"), ("n3", "n4"), ("n4", "n5"), ("n6", "n7")),
                  ("n1", "n2", "n6"))
    v = L.ask_value({1, 9, 3, 4, 7}, [2, 6, 9], g)
    assert round(v.value, 6) == 0.059524 and v.phi_gain == pytest.approx(2 / 7) and v.rho == pytest.approx(1 / 3)
    assert L.ask_value({1}, [], g).value == pytest.approx(-0.05)
    assert L.STOP_VALUE == 0.0 and cand(0, action="stop").value == 0.0


# ----------------------------------------------------------------------------- canonical targets (§4.3)
def test_canonical_targets_by_hand_and_parse_back():
    ask = cand(3, 0.1, question='Who founded "Quux" Corp?', rationale="need the founder")
    t = L.canonical_target(ask)
    assert t == '{"action": "ASK", "question": "Who founded \\"Quux\\" Corp?", "rationale": "need the founder"}'
    assert t == json.dumps(json.loads(t), sort_keys=True)
    a = parse_action(t)
    assert (a.kind, a.question, a.rationale, a.malformed) == ("ask", 'Who founded "Quux" Corp?', "need the founder",
                                                             False)
    stop = L.canonical_target(cand(1, action="stop"))
    assert stop == '{"action": "STOP"}' == L.STOP_COMPLETION
    assert parse_action(stop).kind == "stop" and not parse_action(stop).malformed
    # a malformed reply's target is the canonical STOP, never its verbatim text
    assert L.canonical_target(cand(2, action="stop", malformed=True)) == stop


@given(st.text(min_size=1).filter(str.strip), st.text())
def test_canonical_ask_parses_back(question, rationale):
    q = question.strip()
    a = parse_action(L.canonical_target(cand(0, question=q, rationale=rationale)))
    assert (a.kind, a.question, a.rationale, a.malformed) == ("ask", q, rationale, False)


# ----------------------------------------------------------------------------- leak filter
@pytest.mark.parametrize("question,answer,aliases,leaks", [
    ("Who founded Quux? Was it Ann Lee?", "Ann Lee", (), True),
    ("Was it ann  LEE, the painter?", "Ann Lee", (), True),      # case, punctuation, spacing normalised
    ("Who is Annlee?", "Ann Lee", (), False),                     # not the token sequence
    ("Who is Ann Leeds?", "Ann Lee", (), False),                  # tokens, not substrings
    ("Where was Ann born?", "Ann Lee", ("Ann",), True),          # an alias
    ("Who managed the Beatles?", "The Beatles", (), True),        # articles dropped on both sides
    ("What happened in 1994?", "1994", (), True),
    ("Is there no record of it being true?", "no", ("no", "false"), False),   # yes/no gold: never a leak
    ("Is it yes or no?", "Yes", ("yes", "true"), False),
    ("Is the True Detective cast known?", "True Detective", (), True),        # not a bare yes/no word
    ("Is it true the detective is known?", "Sherlock", ("true",), False),     # a yes/no alias is never looked for
    ("Is it yes indeed?", "Yes", ("yes indeed",), False),                     # a yes/no task: nothing looked for
    ("Who is the the?", "The", (), False),                                    # normalises to nothing
])
def test_leaks_answer(question, answer, aliases, leaks):
    assert L.leaks_answer(question, answer, aliases) is leaks


def test_leak_apostrophe_is_a_leak_after_normalisation():
    # SQuAD normalisation drops the apostrophe: "beatles'" is the token "beatles"
    assert L.leaks_answer("Who were the Beatles' rivals?", "Beatles")


# ----------------------------------------------------------------------------- check 8: SFT rows (§4.3)
def test_check8_done_state_is_a_stop_row():
    rows, counts = L.sft_rows([state([cand(0, 0.3, phi=0.5), cand(1, action="stop")], done=True)], floor=M)
    assert len(rows) == 1 and rows[0].kind == "STOP" and rows[0].reason == "stop_done"
    assert rows[0].completion == L.STOP_COMPLETION and rows[0].prompt == PROMPT and rows[0].candidate_index == -1
    assert counts == {("STOP", "stop_done"): 1}


def test_check8_best_ask_clears_the_floor_or_no_row():
    # best by value has phi 0.08 > m: that ASK; a higher phi on a lower value does not matter
    s = state([cand(0, 0.02, phi=0.9), cand(1, 0.10, phi=0.08), cand(2, action="stop")])
    rows, counts = L.sft_rows([s], floor=M)
    assert [(r.kind, r.reason, r.candidate_index) for r in rows] == [("ASK", "ask_clears_floor", 1)]
    assert rows[0].completion == L.canonical_target(s.candidates[1]) and rows[0].phi_gain == 0.08
    assert counts == {("ASK", "ask_clears_floor"): 1}
    # best by value has phi 0.07 < m: no row, although another ASK's phi clears it
    rows, counts = L.sft_rows([state([cand(0, 0.02, phi=0.9), cand(1, 0.10, phi=0.07)])], floor=M)
    assert rows == [] and counts == {"below_floor": 1}


def test_check8_a_recorded_stop_is_never_a_target_at_a_not_done_state():
    rows, counts = L.sft_rows([state([cand(0, action="stop"), cand(1, action="stop", malformed=True),
                                      cand(2, -0.05, phi=0.0)]),
                               state([cand(0, action="stop")], turn=1)], floor=M)
    assert rows == [] and counts == {"below_floor": 1, "no_ask": 1}


def test_sft_leaks_unknown_and_ties():
    leak = cand(0, 0.3, question="Is it Ann Lee?", phi=0.5)
    rows, counts = L.sft_rows([state([leak, cand(1, 0.1, phi=0.2)]),       # the leak skipped: candidate 1
                               state([leak], turn=1),                         # only leaks
                               state([cand(0, 0.3, phi=0.5)], turn=2, done=None)], floor=M)
    assert [r.candidate_index for r in rows] == [1] and counts["all_leak"] == 1 and counts["unknown_done"] == 1
    # a value tie goes to the smaller identity hash, whatever the listing order
    a, b = cand(0, 0.1, phi=0.2), cand(1, 0.1, phi=0.2)
    s = state([a, b])
    want = min((a, b), key=lambda c: L.candidate_hash(s, c)).index
    assert L.sft_rows([s])[0][0].candidate_index == want == L.sft_rows([state([b, a])])[0][0].candidate_index


def test_check8_duplicates_removed():
    s0 = state([cand(0, 0.2, phi=0.2)], turn=0, seed=0)
    s1 = state([cand(0, 0.2, phi=0.2)], turn=0, seed=1)    # another parent, same prompt and target
    s2 = state([cand(0, 0.2, phi=0.2, prompt="other")], turn=0, seed=2)   # another prompt: kept
    d0, d1 = state([cand(0, 0.1)], done=True, seed=0, turn=3), state([cand(0, 0.1)], done=True, seed=1, turn=3)
    rows, counts = L.sft_rows([s0, s1, s2, d0, d1], floor=M)
    assert [r.state_id for r in rows] == [s0.state_id, s2.state_id, d0.state_id]
    assert counts == {("ASK", "ask_clears_floor"): 2, ("STOP", "stop_done"): 1, "duplicate": 2}


def test_check8_weights_mean_one_per_kind_by_hand():
    # task A 3 ASK rows, task B 1 ASK row: raw 1/sqrt(3) x3 and 1; mean (sqrt 3 + 1)/4
    ask_states = [state([cand(0, 0.2, phi=0.2, question=f"q {i}?")], task="A", turn=i) for i in range(3)]
    ask_states.append(state([cand(0, 0.2, phi=0.2)], task="B"))
    stop_states = [state([cand(0, 0.1)], done=True, task="A", turn=10), state([cand(0, 0.1)], done=True, task="C")]
    rows, _ = L.sft_rows(ask_states + stop_states, floor=M)
    w = {(r.kind, r.task_id, r.state_id): r.weight for r in rows}
    a = [v for (k, t, _), v in w.items() if (k, t) == ("ASK", "A")]
    assert a == pytest.approx([4 / (3 + math.sqrt(3))] * 3) and a[0] == pytest.approx(0.845299, abs=1e-6)
    assert w[("ASK", "B", ask_states[3].state_id)] == pytest.approx(4 / (1 + math.sqrt(3)))  # 1.464102
    for kind in ("ASK", "STOP"):
        ws = [r.weight for r in rows if r.kind == kind]
        assert sum(ws) / len(ws) == pytest.approx(1.0)
    assert [r.weight for r in rows if r.kind == "STOP"] == pytest.approx([1.0, 1.0])


# ----------------------------------------------------------------------------- check 9: pairs (§4.4, §4.5)
def _abc(**kw):
    return [cand(0, 0.10, correct=0.0, ttc=2, question="Who founded the company?", **kw),
            cand(1, 0.05, correct=1.0, ttc=3, question="Where is Quux Corp based?", **kw),
            cand(2, 0.02, correct=1.0, ttc=1, question="When was Quux Corp founded?", **kw)]


def _sides(ps):
    return {(p.chosen_index, p.rejected_index): (p.kind, p.decided_by, round(p.margin, 9)) for p in ps}


def test_check9_by_hand():
    s = state(_abc(), done=None)  # unknown done: no synthesised pair, nothing else changes
    ps, counts = L.pairs([s], floor=0.04)
    assert _sides(ps) == {(1, 0): ("ask_ask", "outcome", 0.05), (2, 0): ("ask_ask", "outcome", 0.08)}
    assert counts == {("ask_ask", "outcome"): 2, "margin": 1}  # C > B by quickest, margin 0.03 <= m: dropped
    # at m = 0.02 the C > B pair is kept and decided by speed
    assert _sides(L.pairs([s], floor=0.02)[0])[(2, 1)] == ("ask_ask", "quickest", 0.03)


def test_check9_nan_outcome_and_unfinished_runs_never_decide():
    s = state([cand(0, 0.30, correct=math.nan, ttc=5, question="first question here?"),
               cand(1, 0.10, correct=1.0, ttc=1, question="second question here?")], done=None)
    assert _sides(L.pairs([s], floor=0.04)[0]) == {(1, 0): ("ask_ask", "quickest", 0.2)}  # NaN: to speed
    s = state([cand(0, 0.30, correct=1.0, ttc=-1, question="first question here?"),
               cand(1, 0.10, correct=1.0, ttc=1, question="second question here?")], done=None)
    assert _sides(L.pairs([s], floor=0.04)[0]) == {(0, 1): ("ask_ask", "gain", 0.2)}  # -1: to gain
    s = state([cand(0, 0.30, correct=math.nan, ttc=-1, question="first question here?"),
               cand(1, 0.10, correct=0.0, ttc=1, question="second question here?")], done=None)
    assert _sides(L.pairs([s], floor=0.04)[0]) == {(0, 1): ("ask_ask", "gain", 0.2)}


def test_check9_identical_and_length_guards():
    s = state([cand(0, 0.3, question="Who  founded Quux?"), cand(1, 0.1, question="who founded QUUX?")], done=None)
    assert L.pairs([s])[1] == {"identical": 1}
    base = "Who founded Quux?"  # 17 characters
    for extra, kept in ((41, False), (40, True)):
        other = base + " " + "x" * (extra - 1)
        assert len(other) - len(base) == extra
        s = state([cand(0, 0.3, question=base), cand(1, 0.1, question="  " + other.replace(" ", "   "))],
                  done=None)  # whitespace is collapsed before measuring
        ps, counts = L.pairs([s])
        assert (len(ps) == 1) is kept and counts == ({("ask_ask", "gain"): 1} if kept else {"length": 1})


def test_pin_prompt_and_leak_guards():
    a, b = cand(0, 0.3), cand(1, 0.1, pin="policy:y|cap=8|max_turns=16")
    assert L.pairs([state([a, b], done=None)])[1] == {"pin": 1}
    assert L.pairs([state([a, cand(1, 0.1, prompt="another state")], done=None)])[1] == {"prompt": 1}
    ps, counts = L.pairs([state([a, cand(1, 0.1, question="Was it Ann?"), cand(2, action="stop", correct=1.0)],
                                done=False)], floor=M)
    assert counts == {"leak": 2, ("ask_stop", "floor"): 1}  # the leak's ask_ask and ask_stop pairs
    assert all(1 not in (p.chosen_index, p.rejected_index) for p in ps)


def test_ask_stop_recorded():
    asks = [cand(0, 0.20, phi=0.30, correct=1.0, question="q zero about the founder?"),
            cand(1, 0.05, phi=0.08, correct=math.nan, question="q one about the company?"),
            cand(2, -0.05, phi=0.0, correct=math.nan, question="q two about the city?")]
    stop = cand(3, action="stop", correct=0.0)
    ps, counts = L.pairs([state(asks + [stop], done=False)], floor=M)
    got = _sides(p for p in ps if p.kind == "ask_stop")
    assert got == {(0, 3): ("ask_stop", "outcome", 0.2), (1, 3): ("ask_stop", "floor", 0.05)}
    assert counts["no_pair"] == 1 and not any(p.synthesised for p in ps)  # a candidate stopped: no synthesis
    ps, counts = L.pairs([state(asks + [stop], done=True)], floor=M)
    got = _sides(p for p in ps if p.kind == "ask_stop")
    assert got == {(0, 3): ("ask_stop", "outcome", 0.2), (3, 1): ("ask_stop", "stop_done", 0.05),
                   (3, 2): ("ask_stop", "stop_done", 0.05)}
    # unknown done: only the outcome decides
    ps, counts = L.pairs([state(asks + [stop], done=None)], floor=M)
    assert _sides(p for p in ps if p.kind == "ask_stop") == {(0, 3): ("ask_stop", "outcome", 0.2)}
    assert counts["no_pair"] == 2
    # a malformed reply is a recorded STOP
    ps, _ = L.pairs([state(asks[:2] + [cand(3, action="stop", malformed=True)], done=False)], floor=M)
    assert {p.kind for p in ps} == {"ask_stop", "ask_ask"}
    p = next(p for p in ps if p.kind == "ask_stop")
    assert p.rejected == L.STOP_COMPLETION and p.rejected_index == 3


def _wide(n, **kw):
    """n ASKs whose values are 0.1 apart (every ask_ask pair clears the floor), distinct questions."""
    return [cand(i, 0.5 - 0.1 * i, phi=0.2 if i < 3 else 0.0, question=f"question about entity number {i}?", **kw)
            for i in range(n)]


def test_check9_thirteenth_pair_dropped_by_hash_not_margin():
    # 5 asks: 10 ask_ask pairs; a not-done STOP vs 3 asks clearing the floor (2 do not): 13 recorded pairs
    s = state(_wide(5) + [cand(9, action="stop")], done=False)
    ps, counts = L.pairs([s], floor=M)
    assert len(ps) == 12 and counts["cap"] == 1 and counts["no_pair"] == 2
    assert counts[("ask_ask", "gain")] + counts[("ask_stop", "floor")] == 12
    everything, _ = L.pairs([s], floor=M, max_pairs=100)
    assert len(everything) == 13
    by_id = {c.index: c for c in s.candidates}

    def h(p):
        return L.pair_hash(s, p.kind, by_id[p.chosen_index], by_id[p.rejected_index])

    dropped = [p for p in everything if p not in ps]
    assert len(dropped) == 1 and h(dropped[0]) == max(map(h, everything))
    assert [h(p) for p in ps] == sorted(h(p) for p in ps)


def test_check9_synthesised_pairs_once_per_state_and_outside_the_cap():
    leak = cand(7, 0.9, question="Is it Ann Lee?")
    for done, kind, decided in ((True, "synth_done", "stop_done"), (False, "synth_not_done", "stop_contrast")):
        s = state(_wide(6) + [leak], done=done)  # 15 clean ask_ask pairs: 12 kept, 3 capped
        ps, counts = L.pairs([s], floor=M)
        synth = [p for p in ps if p.synthesised]
        assert len(ps) == 13 and counts["cap"] == 3 and len(synth) == 1
        (p,) = synth
        assert (p.kind, p.decided_by) == (kind, decided) and counts[(kind, decided)] == 1
        best = s.candidates[0]  # highest non-leaking value (the leak has 0.9)
        if done:
            assert (p.chosen, p.rejected, p.chosen_index, p.rejected_index) == (
                L.STOP_COMPLETION, L.canonical_target(best), -1, 0)
        else:
            assert (p.chosen, p.rejected, p.chosen_index, p.rejected_index) == (
                L.canonical_target(best), L.STOP_COMPLETION, 0, -1)
        assert p.margin == pytest.approx(0.5)
        # also with max_pairs 0 the synthesised pair is there
        assert [q.kind for q in L.pairs([s], floor=M, max_pairs=0)[0]] == [kind]
    # unknown done, a recorded stop, or only leaking asks: no synthesised pair
    assert not any(p.synthesised for p in L.pairs([state(_wide(2), done=None)])[0])
    assert not any(p.synthesised for p in L.pairs([state(_wide(2) + [cand(5, action="stop")], done=True)])[0])
    ps, counts = L.pairs([state([leak], done=False)])
    assert ps == [] and counts == {"leak": 1}


def test_stage_filters():
    s1 = state(_wide(3, correct=0.0) + [cand(5, action="stop", correct=1.0)], done=True, turn=0)  # STOP by outcome
    s2 = state(_wide(2), done=True, turn=1)   # synth_done
    s3 = state(_wide(2), done=False, turn=2)  # synth_not_done
    s4 = state(_wide(2) + [cand(5, action="stop")], done=False, turn=3)  # ask_stop floor
    s5 = state(_wide(2) + [cand(5, action="stop")], done=True, turn=4)  # ask_stop stop_done
    ps, _ = L.pairs([s1, s2, s3, s4, s5], floor=M)
    kinds = {(p.kind, p.decided_by) for p in ps}
    assert kinds == {("ask_ask", "gain"), ("ask_stop", "outcome"), ("ask_stop", "floor"), ("ask_stop", "stop_done"),
                     ("synth_done", "stop_done"), ("synth_not_done", "stop_contrast")}
    assert all(p.chosen == L.STOP_COMPLETION for p in ps if p.state_id == s1.state_id and p.kind == "ask_stop")
    two, three = L.stage_pairs(ps, 2), L.stage_pairs(ps, 3)
    assert two and all(p.kind == "ask_ask" for p in two) and len(two) == sum(p.kind == "ask_ask" for p in ps)
    assert all(p.decided_by != "stop_done" for p in three)
    assert [p for p in ps if p.decided_by != "stop_done"] == three and set(two) < set(three)
    assert {p.kind for p in three} == {"ask_ask", "ask_stop", "synth_not_done"}
    with pytest.raises(ValueError, match="stage=1"):
        L.stage_pairs(ps, 1)


# ----------------------------------------------------------------------------- JSONL
def _some_records():
    states = [state(_wide(3) + [cand(5, action="stop", correct=1.0)], done=True, turn=0),
              state(_wide(2, rationale="naïve “quotes”"), done=False, turn=1)]
    return L.sft_rows(states, floor=M)[0], L.pairs(states, floor=M)[0]


def test_jsonl_round_trip(tmp_path):
    rows, ps = _some_records()
    assert rows and ps
    assert L.write_jsonl(tmp_path / "rows.jsonl", rows) == len(rows)
    assert L.write_jsonl(tmp_path / "pairs.jsonl", ps) == len(ps)
    assert L.read_sft_rows(tmp_path / "rows.jsonl") == rows
    assert L.read_pairs(tmp_path / "pairs.jsonl") == ps
    assert all(SFTRow.from_json(r.to_json()) == r for r in rows) and all(Pair.from_json(p.to_json()) == p for p in ps)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("edit,field,expected", [
    ({"weight": "heavy"}, "weight", "a finite number > 0"),
    ({"kind": "ASKED"}, "kind", "'ASK' or 'STOP'"),
    ({"reason": "stop_done"}, "reason", "'ask_clears_floor' or 'parent' for a ASK row"),
    ({"completion": '{"action":"ASK"}'}, "completion", "the canonical ASK target"),
    ({"extra": 1}, "extra", "no such field"),
    ({"prompt": None}, "prompt", "a string"),
])
def test_jsonl_rows_validation_names_line_field_value_expected(tmp_path, edit, field, expected):
    rows, _ = _some_records()
    ask = next(r for r in rows if r.kind == "ASK")
    lines = [r.to_json() for r in rows]
    bad = {**json.loads(ask.to_json()), **edit}
    lines.insert(1, json.dumps(bad))
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as e:
        L.read_sft_rows(tmp_path / "r.jsonl")
    msg = str(e.value)
    assert "line 2:" in msg and f"field {field!r}" in msg and expected in msg
    assert repr(next(iter(edit.values())))[:20] in msg


def test_jsonl_pairs_validation(tmp_path):
    _, ps = _some_records()
    good = json.loads(ps[0].to_json())
    cases = [({**good, "decided_by": "vibes"}, "decided_by"), ({**good, "margin": -1}, "margin"),
             ({k: v for k, v in good.items() if k != "chosen"}, "chosen"),
             ({**good, "rejected": good["chosen"]}, "rejected"), ({**good, "chosen_index": 1.5}, "chosen_index")]
    for obj, field in cases:
        (tmp_path / "p.jsonl").write_text(ps[0].to_json() + "\n" + json.dumps(obj) + "\n")
        with pytest.raises(ValueError, match=rf"line 2: field '{field}': value .*: expected"):
            L.read_pairs(tmp_path / "p.jsonl")
    (tmp_path / "p.jsonl").write_text(ps[0].to_json() + "\n{not json\n")
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        L.read_pairs(tmp_path / "p.jsonl")


def test_record_validation():
    with pytest.raises(ValueError, match="field 'question'"):
        Candidate(index=0, seed=0, action="ask", question="  ")
    with pytest.raises(ValueError, match="field 'action'"):
        Candidate(index=0, seed=0, action="ASK", question="q")
    with pytest.raises(ValueError, match="distinct candidate indices"):
        state([cand(0, 0.1), cand(0, 0.2)])
    with pytest.raises(ValueError, match="field 'done_before'"):
        state([cand(0, 0.1)], done=1)
    assert state([cand(0)]).state_id == "musique/t1/seed0/t0"


# ----------------------------------------------------------------------------- properties
QUESTIONS = ["Who founded Quux?", "who  founded quux?", "Where is Quux based?", "When was Quux founded?",
             "Is it Ann Lee?", "Which city hosts the headquarters of the company that makes Zorp drinks today?",
             "Ann?", "What is Zorp?"]


@st.composite
def fork_states(draw):
    n = draw(st.integers(1, 8))
    cands = []
    for i in range(n):
        kw = {"correct": draw(st.sampled_from([0.0, 1.0, math.nan])),
              "prompt": draw(st.sampled_from([PROMPT, PROMPT, "other"])),
              "pin": draw(st.sampled_from([PIN, PIN, PIN, "other pin"]))}
        if draw(st.integers(0, 4)) == 0:
            cands.append(cand(i, action="stop", malformed=draw(st.booleans()), **kw))
        else:
            cands.append(cand(i, draw(st.sampled_from([-0.15, -0.05, 0.0, 0.02, 0.05, 0.1, 0.2, 0.45])),
                              phi=draw(st.sampled_from([0.0, 0.05, 0.08, 0.3])),
                              question=draw(st.sampled_from(QUESTIONS)), ttc=draw(st.integers(-1, 4)), **kw))
    return state(cands, done=draw(st.sampled_from([True, False, None])), turn=draw(st.integers(0, 3)))


@settings(max_examples=300, deadline=None)
@given(fork_states(), st.sampled_from([0.0, 0.04, M]), st.integers(0, 6), st.randoms(use_true_random=False))
def test_pair_properties(s, floor, max_pairs, rnd):
    ps, counts = L.pairs([s], floor=floor, max_pairs=max_pairs)
    by_id = {c.index: c for c in s.candidates}
    assert sum(not p.synthesised for p in ps) <= max_pairs and sum(p.synthesised for p in ps) <= 1
    for p in ps:
        assert p.chosen != p.rejected and p.state_id == s.state_id
        sides = [by_id[i] for i in (p.chosen_index, p.rejected_index) if i != -1]
        assert not any(L.leaks_answer(c.question, s.answer, s.aliases) for c in sides if c.is_ask)
        if p.kind == "ask_ask":
            hi, lo = sides
            assert p.margin > floor and hi.pin == lo.pin and hi.prompt == lo.prompt
            assert p.margin == pytest.approx(abs(hi.value - lo.value))
        if p.synthesised:
            assert not any(c.action == "stop" for c in s.candidates) and s.done_before is not None
    assert sum(v for k, v in counts.items() if isinstance(k, tuple)) == len(ps)
    # the result does not depend on the order the candidates are listed in
    shuffled = list(s.candidates)
    rnd.shuffle(shuffled)
    assert L.pairs([dataclasses.replace(s, candidates=tuple(shuffled))], floor=floor, max_pairs=max_pairs) == (
        ps, counts)
    # stage filters partition as described
    assert all(p.kind == "ask_ask" for p in L.stage_pairs(ps, 2))
    assert all(p.decided_by != "stop_done" for p in L.stage_pairs(ps, 3))


@settings(max_examples=200, deadline=None)
@given(st.lists(fork_states(), max_size=6), st.randoms(use_true_random=False))
def test_sft_properties(states, rnd):
    states = [dataclasses.replace(s, task_id=f"t{i % 3}", turn=i) for i, s in enumerate(states)]
    rows, counts = L.sft_rows(states, floor=M)
    assert len(rows) <= len(states)
    assert sum(v for k, v in counts.items() if isinstance(k, tuple)) == len(rows)
    assert sum(v for k, v in counts.items() if isinstance(k, str)) + len(rows) == len(states)
    for kind in ("ASK", "STOP"):
        ws = [r.weight for r in rows if r.kind == kind]
        assert not ws or sum(ws) / len(ws) == pytest.approx(1.0)
    by_state = {s.state_id: s for s in states}
    for r in rows:
        s = by_state[r.state_id]
        assert (r.kind == "STOP") == (s.done_before is True)
        if r.kind == "ASK":
            c = next(c for c in s.candidates if c.index == r.candidate_index)
            assert c.is_ask and c.phi_gain > M and not L.leaks_answer(c.question, s.answer, s.aliases)
    assert len({(r.task_id, r.prompt, r.completion) for r in rows}) == len(rows)
    shuffled = [dataclasses.replace(s, candidates=tuple(rnd.sample(s.candidates, len(s.candidates)))) for s in states]
    assert L.sft_rows(shuffled, floor=M) == (rows, counts)


def test_random_order_of_states_keeps_pairs_as_a_multiset():
    rng = random.Random(0)
    states = [state(_wide(4), done=d, turn=i) for i, d in enumerate([True, False, None, False])]
    ps = L.pairs(states, floor=M)[0]
    rng.shuffle(states)
    assert sorted(map(Pair.to_json, L.pairs(states, floor=M)[0])) == sorted(map(Pair.to_json, ps))

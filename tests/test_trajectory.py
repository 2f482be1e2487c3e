"""Trajectory records: spans, loss mask, turns, feedback and U2U segments derived from rendered
conversations (property-tested), JSONL round trips, and the collator to the credit batch."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxagent.rollout import Trajectory, from_jsonl, to_jsonl
from jaxagent.train.collate import collate
from jaxagent.text import ChatRenderer, load_tokenizer
from tests.conftest import FIXTURES

TOK = load_tokenizer(FIXTURES / "tokenizer_qwen")
STOP = TOK.eos_token_ids[0]
WORDS = ["yes", "no", "the", "red", "blue", "flight", "at", "noon", "ok", "why", "42", "maybe"]
LABELS = ["confirm", "be_vague", "provide_info", "reject", "chitchat"]


@st.composite
def episodes(draw):
    """A random episode: system + user, then turns of (generated reply, then tool results and/or
    a labelled user message), as the rollout loop produces them."""
    chat = ChatRenderer(TOK)
    text = lambda: " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6)))  # noqa: E731
    chat.add({"role": "system", "content": "Be brief."}, {"role": "user", "content": text()})
    contents = {1: None}
    labels = {1: draw(st.sampled_from(LABELS))}
    gen_lps, n_turns = [], draw(st.integers(1, 4))
    for t in range(n_turns):
        chat.start_generation()
        ids = TOK.encode(text()) + ([STOP] if draw(st.booleans()) or t < n_turns - 1 else [])
        chat.append_generated(ids)
        gen_lps.append([-0.5 - 0.01 * i for i in range(len(ids))])
        if t == n_turns - 1:
            break
        for _ in range(draw(st.integers(0, 2))):
            (span,) = chat.add({"role": "tool", "content": text()})
            contents[span.index] = chat.messages[span.index]["content"]
        if draw(st.booleans()):
            (span,) = chat.add({"role": "user", "content": text()})
            contents[span.index] = chat.messages[span.index]["content"]
            labels[span.index] = draw(st.sampled_from(LABELS))
    record = chat.finish()
    traj = Trajectory.from_rendered(
        record, task_id="t", group_id=draw(st.integers(0, 3)), generated_logprobs=gen_lps,
        turn_rewards=[0.0] * len(gen_lps), outcome_reward=draw(st.floats(0, 1)), reaction_labels=labels,
    )
    return traj, record, chat, gen_lps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes())
def test_spans_mask_turns_and_segments(ep):
    traj, record, chat, gen_lps = ep
    # Every non-generated content span decodes to exactly the message's content.
    for i, s in enumerate(traj.spans):
        if not s.generated:
            assert TOK.decode(traj.tokens[s.content_start : s.content_end]) == chat.messages[i]["content"]
    # The loss mask covers exactly the generated tokens, and the log-probs sit on them.
    mask = traj.loss_mask()
    np.testing.assert_array_equal(mask, record.loss_mask())
    assert mask.sum() == sum(len(lp) for lp in gen_lps)
    np.testing.assert_allclose(np.asarray(traj.logprobs)[mask == 1], np.concatenate(gen_lps))
    assert (np.asarray(traj.logprobs)[mask == 0] == 0).all()
    # Actions are the generated spans, in order, disjoint; feedback lies between consecutive actions.
    acts = traj.action_spans()
    fbs = traj.feedback_spans()
    assert len(acts) == len(gen_lps) == len(fbs)
    for t, ((s, e), (fs, fe)) in enumerate(zip(acts, fbs)):
        assert s < e and e <= fs <= fe
        if t + 1 < len(acts):
            assert fe <= acts[t + 1][0]
    # Segments partition the actions after the first user message, in order.
    members = [t for seg, _ in traj.segments() for t in seg]
    assert members == list(range(len(acts)))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(episodes(), min_size=1, max_size=4))
def test_jsonl_round_trip_and_collate(tmp_path_factory, eps):
    trajs = [e[0] for e in eps]
    path = to_jsonl(trajs, tmp_path_factory.mktemp("runs") / "traj.jsonl")
    back = from_jsonl(path)
    assert [t.to_dict() for t in back] == [t.to_dict() for t in trajs]
    batch, old_lp = collate(back)
    B, L = batch.tokens_BL.shape
    assert B == len(trajs) and L % 64 == 0
    for b, tr in enumerate(trajs):
        n = len(tr.tokens)
        assert np.asarray(batch.tokens_BL[b, :n]).tolist() == tr.tokens
        assert int(batch.pad_mask_BL[b].sum()) == n
        np.testing.assert_array_equal(np.asarray(batch.loss_mask_BL[b, :n]), tr.loss_mask())
        np.testing.assert_allclose(old_lp[b, :n], tr.logprobs, rtol=1e-6)
        for t, (s, e) in enumerate(tr.action_spans()):
            assert np.asarray(batch.action_span_BT2[b, t]).tolist() == [s, e]
            assert (np.asarray(batch.turn_idx_BL[b, s:e]) == t).all()
        # turn_idx marks exactly the action tokens
        assert ((np.asarray(batch.turn_idx_BL[b]) >= 0) == (np.asarray(batch.loss_mask_BL[b]) > 0)).all()
    groups = np.asarray(batch.group_id_B)
    assert groups.min() == 0 and set(groups.tolist()) == set(range(groups.max() + 1))


def test_segments_and_polarity_by_hand():
    chat = ChatRenderer(TOK)
    chat.add({"role": "system", "content": "s"}, {"role": "user", "content": "book a flight"})
    gen = []
    for _ in range(2):  # two agent messages (a tool call round) in the first U2U segment
        chat.start_generation()
        ids = TOK.encode("ok") + [STOP]
        chat.append_generated(ids)
        gen.append([-1.0] * len(ids))
        chat.add({"role": "tool", "content": "result"})
    chat.start_generation()
    ids = TOK.encode("when") + [STOP]
    chat.append_generated(ids)
    gen.append([-1.0] * len(ids))
    (user,) = chat.add({"role": "user", "content": "at noon"})
    chat.start_generation()
    ids = TOK.encode("done") + [STOP]
    chat.append_generated(ids)
    gen.append([-1.0] * len(ids))
    traj = Trajectory.from_rendered(chat.finish(), task_id="x", group_id=7, generated_logprobs=gen,
                                    turn_rewards=[0, 0, 0, 1], outcome_reward=1.0,
                                    reaction_labels={1: None, user.index: "provide_info"})
    assert traj.segments() == [([0, 1, 2], "provide_info"), ([3], None)]
    fbs = traj.feedback_spans()
    assert TOK.decode(traj.tokens[fbs[0][0] : fbs[0][1]]) == "result"
    assert TOK.decode(traj.tokens[fbs[2][0] : fbs[2][1]]) == "at noon"
    assert fbs[3][0] == fbs[3][1]  # the last action drew no feedback
    batch, _ = collate([traj])
    assert np.asarray(batch.segment_polarity_BQ[0]).tolist() == [1.0, 0.0]
    assert np.asarray(batch.segment_valid_BQ[0]).tolist() == [True, False]
    assert int(batch.group_id_B[0]) == 0


def test_bad_records_are_errors(tmp_path):
    chat = ChatRenderer(TOK)
    chat.add({"role": "user", "content": "hi"})
    chat.start_generation()
    chat.append_generated(TOK.encode("yo") + [STOP])
    rec = chat.finish()
    kw = dict(task_id="t", group_id=0, turn_rewards=[0.0], outcome_reward=0.0)
    with pytest.raises(ValueError, match=r"generated_logprobs\[0\]: 1 values, expected 3"):
        Trajectory.from_rendered(rec, generated_logprobs=[[0.0]], **kw)
    with pytest.raises(ValueError, match="reaction_labels\\[1\\]: expected the index of a user message"):
        Trajectory.from_rendered(rec, generated_logprobs=[[0.0] * 3], reaction_labels={1: "confirm"}, **kw)
    with pytest.raises(ValueError, match="termination='crashed'"):
        Trajectory.from_rendered(rec, generated_logprobs=[[0.0] * 3], termination="crashed", **kw)
    good = Trajectory.from_rendered(rec, generated_logprobs=[[0.0] * 3], **kw)
    with pytest.raises(ValueError, match="length=8: shorter than the longest record"):
        collate([good], length=8)
    (tmp_path / "bad.jsonl").write_text('{"task_id": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: not a trajectory record"):
        from_jsonl(tmp_path / "bad.jsonl")

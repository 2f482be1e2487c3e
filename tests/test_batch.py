"""The one host batch builder (`jaxagent.train.batch`): a two-row batch laid out by hand, the
defaults (loss on the actions, no feedback), errors that name the row, and the packed info-gain
length from the host arrays equal to the device batch's."""

import numpy as np
import pytest

from jaxagent.train.batch import Row, build_batch, packed_length


def test_two_rows_by_hand():
    rows = [
        # prompt 0-1, action 2-4, feedback 5-6 (a user message ending segment 0), action 7-8
        Row(tokens=list(range(1, 10)), logprobs=[-0.5] * 9, actions=[(2, 4), (7, 9)], feedback=[(5, 7), (9, 9)],
            segments=[([0], 1.0), ([1], None)], reward=1.0, group=3),
        Row(tokens=[7, 7, 7], actions=[(1, 3)], reward=0.0, group=3),  # no feedback given: none
    ]
    b = build_batch(rows, multiple=8)
    assert b.shape == (2, 16)
    np.testing.assert_array_equal(b.tokens_BL[0, :10], [1, 2, 3, 4, 5, 6, 7, 8, 9, 0])
    np.testing.assert_array_equal(b.pad_mask_BL.sum(axis=1), [9, 3])
    np.testing.assert_array_equal(b.turn_idx_BL[0, :10], [-1, -1, 0, 0, -1, -1, -1, 1, 1, -1])
    np.testing.assert_array_equal(b.loss_mask_BL[0, :10], [0, 0, 1, 1, 0, 0, 0, 1, 1, 0])  # the actions
    np.testing.assert_array_equal(b.loss_mask_BL[1, :4], [0, 1, 1, 0])
    np.testing.assert_array_equal(b.segment_idx_BL[0, :10], [-1, -1, 0, 0, -1, -1, -1, 1, 1, -1])
    np.testing.assert_array_equal(b.action_span_BT2, [[[2, 4], [7, 9]], [[1, 3], [0, 0]]])
    np.testing.assert_array_equal(b.feedback_span_BT2, [[[5, 7], [9, 9]], [[3, 3], [0, 0]]])
    np.testing.assert_array_equal(b.turn_valid_BT, [[True, True], [True, False]])
    np.testing.assert_array_equal(b.segment_polarity_BQ, [[1.0, 0.0], [0.0, 0.0]])
    np.testing.assert_array_equal(b.segment_valid_BQ, [[True, False], [False, False]])
    np.testing.assert_array_equal(b.logprobs_BL[0, :10], [-0.5] * 9 + [0.0])
    np.testing.assert_array_equal(b.reward_B, [1.0, 0.0])
    np.testing.assert_array_equal(b.group_id_B, [3, 3])
    cb = b.credit_batch()  # on the device, shape-checked
    assert cb.tokens_BL.shape == (2, 16) and cb.segment_polarity_BQ.shape == (2, 2)


def test_an_explicit_loss_mask_wins_and_pads():
    b = build_batch([Row(tokens=[1, 2, 3], loss_mask=[0, 1, 1])], multiple=4)
    np.testing.assert_array_equal(b.loss_mask_BL, [[0, 1, 1, 0]])
    assert b.loss_mask_BL.dtype == np.float32 and b.tokens_BL.dtype == np.int32


def test_errors_name_the_row():
    with pytest.raises(ValueError, match="rows: empty"):
        build_batch([])
    with pytest.raises(ValueError, match="length=4: shorter than the longest demonstration"):
        build_batch([Row(tokens=[1] * 5)], length=4, noun="demonstration")
    with pytest.raises(ValueError, match=r"turns=1: record 1 \('t1'\) has 2 action turns"):
        build_batch([Row(tokens=[1] * 4, actions=[(0, 1)]), Row(tokens=[1] * 4, actions=[(0, 1), (2, 3)])], turns=1,
                    noun="record", names=["t0", "t1"])
    with pytest.raises(ValueError, match="row 0: 1 feedback spans for 2 action turns"):
        build_batch([Row(tokens=[1] * 4, actions=[(0, 1), (2, 3)], feedback=[(1, 2)])])
    with pytest.raises(ValueError, match="segments=1: row 0 has 2 segments"):
        build_batch([Row(tokens=[1] * 4, actions=[(0, 1), (2, 3)], segments=[([0], 1.0), ([1], None)])], segments=1)


def test_packed_length_by_hand_from_the_host_arrays():
    # row 0: turn 0 is info-valid (feedback 5-7, next action 7-9) and the row ends at 9; its
    # counterfactual suffix is the replacement + the tokens from the feedback's end to a_1's end:
    # replace with P placeholder tokens: P + (9 - 7); overwrite: the feedback's own 2 + 2
    rows = [Row(tokens=list(range(1, 10)), actions=[(2, 4), (7, 9)], feedback=[(5, 7), (9, 9)]),
            Row(tokens=[7, 7, 7], actions=[(1, 3)])]
    b = build_batch(rows, multiple=8)  # L = 16
    assert b.packed_length(10, "replace", multiple=1) == 9 + 10 + 2 == 21
    assert b.packed_length(10, "replace", multiple=8) == 24
    assert b.packed_length(3, "replace", multiple=1) == 16  # 9 + 5 fits in the padded length
    assert b.packed_length(10, "overwrite", multiple=1) == 16  # 9 + 4
    # the same figures from the device batch (pulled back): what compute_infogain checks against
    assert packed_length(b.credit_batch(), 10, "replace", multiple=1) == 21

"""Credit assignment: GRPO outcome advantage, group statistics, Faca reaction credit and its
ablations, InfoPO normalisation / gate / fusion. Hand-computed cases, jit/no-jit variants,
hypothesis properties and config errors."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxagent.rollout.batch import Row
from jaxagent.rollout.batch import build_batch as build_host_batch
from jaxagent.credit.fusion import (
    InfoPOConfig,
    broadcast_turns,
    fuse,
    gate_per_group,
    infogain_valid_turns,
    normalize_turn_rewards,
    variance_gate,
)
from jaxagent.credit.grpo import GRPOConfig, broadcast_to_tokens, group_normalize, group_stats, grpo_advantage
from jaxagent.credit.reaction import (
    DEFAULT_POLARITY,
    FacaConfig,
    ablate_polarity,
    broadcast_segments,
    polarity_of,
    reaction_advantage,
    reaction_telemetry,
)

EPS = 1e-6
R2 = math.sqrt(2.0)
PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def z(x, mean, std, eps=EPS):
    """The hand formula (float64): (x - mean) / (std + eps)."""
    return (np.asarray(x, np.float64) - mean) / (std + eps)


# ----------------------------------------------------------------------------- a hand-built batch
def build_batch(rollouts, rewards, groups, *, T, Q, L, prompt=2):
    """A CreditBatch laid out as conversations (through the one batch builder): per rollout a
    prompt (ending in the first user message), then per turn ``(action_len, feedback_len, kind,
    label)``: the action's tokens, one template token, the feedback content (``kind`` "user" /
    "tool" / None = no feedback), one template token. A user message ends the current U2U segment
    with ``label``'s polarity; the segment after the last user message has no reaction (invalid)."""
    rows = []
    for turns, reward, group in zip(rollouts, rewards, groups):
        pos, actions, feedback, segments, current = prompt, [], [], [], []
        for t, (a, f, kind, label) in enumerate(turns):
            actions.append((pos, pos + a))
            current.append(t)
            pos += a + 1
            feedback.append((pos, pos) if kind is None else (pos, pos + f))
            pos += (0 if kind is None else f) + 1
            if kind == "user":
                segments.append((current, float(polarity_of(label))))
                current = []
        if current:
            segments.append((current, None))
        assert pos <= L
        rows.append(Row(tokens=1 + (np.arange(pos) % 7), actions=actions, feedback=feedback, segments=segments,
                        reward=reward, group=group))
    return build_host_batch(rows, length=L, turns=T, segments=Q).credit_batch()


# Two groups of two. Group 0 has rewards 1, 0 (A_ext = +-0.5/(0.5+eps), gate sigmoid(-1)); group 1
# has equal rewards (A_ext = 0, gate 0.5, homogeneous).
ROLLOUTS = [
    [(2, 2, "user", "confirm"), (1, 1, "tool", None), (2, 0, None, None)],  # info-valid t0, t1
    [(1, 1, "user", "reject"), (2, 0, None, None)],  # info-valid t0
    [(2, 0, None, None), (1, 2, "user", "accept"), (1, 0, None, None)],  # t0 has no feedback: t1 only
    [(1, 1, "user", "be_vague"), (1, 1, "user", "approve"), (1, 0, None, None)],  # t0, t1
]
BATCH = build_batch(ROLLOUTS, [1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], T=3, Q=3, L=24)
NAN = float("nan")
# Values on turns that are not info-valid are garbage (NaN included) and must not matter.
R_INFO = jnp.asarray([[0.3, 0.1, NAN], [0.2, 5.0, 0.0], [9.0, 0.5, -7.0], [-0.5, 0.5, 3.0]], jnp.float32)
INFO_VALID = np.array([[1, 1, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]], bool)
# Group 0 valid turns 0.3, 0.1, 0.2: mean 0.2, population std sqrt(0.02/3).
# Group 1 valid turns 0.5, -0.5, 0.5: mean 1/6, population std sqrt(2)/3.
S0, S1 = math.sqrt(0.02 / 3), R2 / 3
A_INFO = np.zeros((4, 3))
A_INFO[0, :2] = z([0.3, 0.1], 0.2, S0)  # +-1.2247
A_INFO[1, 0] = z(0.2, 0.2, S0)  # 0
A_INFO[2, 1] = z(0.5, 1 / 6, S1)  # 0.7071
A_INFO[3, :2] = z([-0.5, 0.5], 1 / 6, S1)  # -1.4142, 0.7071
A_EXT = np.array([z(1, 0.5, 0.5), z(0, 0.5, 0.5), 0.0, 0.0])  # +-0.999998, group 1 degenerate
GATE = np.array([1 / (1 + math.e), 1 / (1 + math.e), 0.5, 0.5])  # sigmoid(-0.5 / 0.5), sigmoid(0)
# Faca: segment 0 of group 0 has reactions +1, -1 (mean 0, std 1); segment 0 of group 1 has +1
# (rollout 2), -1 (rollout 3); segment 1 only in rollout 3 (a single rollout: 0).
A_PROC = np.zeros((4, 3))
A_PROC[:, 0] = z([1, -1, 1, -1], 0.0, 1.0)


def tokens_of(A_BK, idx_BL, mask_BL):
    """Reference broadcast by explicit loops."""
    idx, mask = np.asarray(idx_BL), np.asarray(mask_BL)
    out = np.zeros(idx.shape)
    for b in range(idx.shape[0]):
        for l in range(idx.shape[1]):
            if mask[b, l] and 0 <= idx[b, l] < A_BK.shape[1]:
                out[b, l] = A_BK[b, idx[b, l]]
    return out


def permute_batch(batch, perm):
    return jax.tree.map(lambda x: x[perm], batch)


# ----------------------------------------------------------------------------- GRPO
class TestGRPO(chex.TestCase):
    # Rollouts interleaved over groups 5, 3, 0 (ids need not be contiguous) with uneven sizes:
    # group 5 = R 1, 0, 0 (mean 1/3, std sqrt(2)/3), group 3 = 0.5, 0.5 (all equal), group 0 single.
    R = jnp.asarray([1.0, 0.5, 0.0, 0.5, 0.0, 7.0], jnp.float32)
    G = jnp.asarray([5, 3, 5, 3, 5, 0], jnp.int32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        fn = self.variant(grpo_advantage, static_argnames=("config",))
        A = fn(self.R, self.G, GRPOConfig())
        s = R2 / 3
        expected = [z(1, 1 / 3, s), 0, z(0, 1 / 3, s), 0, z(0, 1 / 3, s), 0]  # sqrt(2), -1/sqrt(2)
        np.testing.assert_allclose(A, expected, rtol=1e-6)
        np.testing.assert_allclose(A[0], R2, rtol=1e-5)
        assert A[1] == 0 and A[3] == 0 and A[5] == 0  # degenerate groups: exactly 0
        A = fn(self.R, self.G, GRPOConfig(normalize_std=False))
        np.testing.assert_allclose(A, [2 / 3, 0, -1 / 3, 0, -1 / 3, 0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_equal_rewards_are_exactly_zero(self):
        # 0.1 is not representable: the float32 mean of three 0.1s need not equal 0.1, yet A is 0.
        fn = self.variant(grpo_advantage, static_argnames=("config",))
        for cfg in (GRPOConfig(), GRPOConfig(normalize_std=False), GRPOConfig(eps=1e-12)):
            A = fn(jnp.asarray([0.1, 0.1, 0.1, 0.7], jnp.float32), jnp.asarray([1, 1, 1, 0], jnp.int32), cfg)
            np.testing.assert_array_equal(A, 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_padding_rows_are_excluded(self):
        fn = self.variant(lambda r, g, v: grpo_advantage(r, g, GRPOConfig(), valid_B=v))
        r = jnp.asarray([1.0, 0.0, NAN, 100.0], jnp.float32)
        A = fn(r, jnp.asarray([0, 0, 0, 0], jnp.int32), jnp.asarray([True, True, False, False]))
        np.testing.assert_allclose(A, [z(1, 0.5, 0.5), z(0, 0.5, 0.5), 0, 0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_group_stats_hand_computed(self):
        fn = self.variant(group_stats, static_argnames=("num_groups",))
        s = fn(self.R, self.G, None, 6)
        np.testing.assert_allclose(s.mean_G[jnp.asarray([5, 3, 0])], [1 / 3, 0.5, 7.0], rtol=1e-6)
        np.testing.assert_allclose(s.std_G[jnp.asarray([5, 3, 0])], [R2 / 3, 0.0, 0.0], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(s.count_G, [1, 0, 0, 2, 0, 3])
        np.testing.assert_array_equal(s.degenerate_G, [True, True, True, True, True, False])
        # Out-of-range ids (-1, 6) are dropped from every statistic and get advantage 0.
        A, _ = group_normalize(jnp.asarray([1.0, 0.0, 5.0, 9.0]), jnp.asarray([0, 0, -1, 6]))
        np.testing.assert_allclose(A, [z(1, 0.5, 0.5), z(0, 0.5, 0.5), 0, 0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_broadcast_to_tokens(self):
        mask = jnp.asarray([[0, 1, 1, 0], [1, 0, 0, 0]], jnp.float32)
        A = self.variant(broadcast_to_tokens)(jnp.asarray([2.0, -3.0]), mask)
        np.testing.assert_array_equal(A, [[0, 2, 2, 0], [-3, 0, 0, 0]])
        chex.assert_type(A, jnp.float32)


NB = 12  # property tests pad to fixed shapes (invalid rows), so each jitted function compiles once
jit_group_normalize = jax.jit(group_normalize, static_argnames=("num_groups", "normalize_std", "eps"))
jit_grpo = jax.jit(grpo_advantage, static_argnames=("config",))


@st.composite
def grouped(draw):
    B = draw(st.integers(1, NB))
    vals = st.sampled_from([0.0, 0.25, 1.0, -2.0]) | st.floats(-10, 10, width=32)
    x = np.zeros(NB, np.float32)
    x[:B] = draw(st.lists(vals, min_size=B, max_size=B))
    g = np.asarray(draw(st.lists(st.integers(0, 3), min_size=NB, max_size=NB)), np.int32)
    v = np.zeros(NB, bool)
    v[:B] = draw(st.lists(st.booleans(), min_size=B, max_size=B))
    return x, g, v


@PROPS
@given(grouped(), st.booleans())
def test_group_normalized_zero_mean_unit_std_per_group(data, normalize_std):
    x, g, v = data
    A, _ = jit_group_normalize(x, g, v, num_groups=4, normalize_std=normalize_std, eps=EPS)
    A = np.asarray(A)
    assert np.all(A[~v] == 0)
    for k in range(4):
        m = v & (g == k)
        xs = x[m].astype(np.float64)
        if m.sum() < 2 or xs.max() == xs.min():
            assert np.all(A[m] == 0)
            continue
        np.testing.assert_allclose(A[m].mean(), 0.0, atol=1e-4 * max(1, np.abs(xs).max()))
        std = xs.std()  # population
        np.testing.assert_allclose(A[m].std(), std / (std + EPS) if normalize_std else std, rtol=1e-3, atol=1e-5)


@PROPS
@given(grouped(), st.randoms(use_true_random=False))
def test_grpo_invariant_to_permuting_rollouts_and_relabelling_groups(data, rnd):
    x, g, v = data
    A = np.asarray(jit_grpo(x, g, GRPOConfig(), valid_B=v))
    perm = np.asarray(rnd.sample(range(NB), NB))
    A_perm = np.asarray(jit_grpo(x[perm], g[perm], GRPOConfig(), valid_B=v[perm]))
    np.testing.assert_allclose(A_perm, A[perm], rtol=1e-5, atol=1e-5)
    relabel = np.asarray(rnd.sample(range(NB), 4), np.int32)[g]  # a bijection of the ids used into [0, B)
    np.testing.assert_allclose(np.asarray(jit_grpo(x, relabel, GRPOConfig(), valid_B=v)), A, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- Faca
def test_polarity_of():
    for label, p in DEFAULT_POLARITY.items():
        assert polarity_of(label) == p
    assert {k for k, p in DEFAULT_POLARITY.items() if p > 0} == {"provide_info", "confirm", "approve", "accept"}
    assert len([p for p in DEFAULT_POLARITY.values() if p < 0]) == 6
    out = polarity_of([["Confirm ", "reject", None], ["chit_chat", "accept", "be_vague"]])
    chex.assert_type(out, np.float32)
    np.testing.assert_array_equal(out, [[1, -1, 0], [0, 1, -1]])
    np.testing.assert_array_equal(polarity_of(["nice", "rude", "x"], {"nice": 1, "rude": -1}), [1, -1, 0])
    with pytest.raises(ValueError, match=r"mapping\['nice'\]=2.*expected -1, 0 or \+1"):
        polarity_of(["nice"], {"nice": 2})


# Q=3; group 0 = rollouts 0..2, group 1 = rollout 3 alone.
POL = jnp.asarray([[1, -1, 0], [-1, -1, 1], [1, 1, -1], [1, 0, -1]], jnp.float32)
SVALID = jnp.asarray([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 0]], bool)
GID = jnp.asarray([0, 0, 0, 1], jnp.int32)
S8 = math.sqrt(8 / 9)  # population std of {1, -1, 1} and of {-1, -1, 1}


class TestFaca(chex.TestCase):
    def _fn(self):
        return self.variant(reaction_advantage, static_argnames=("config",))

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        A = self._fn()(POL, SVALID, GID, FacaConfig())
        expected = np.zeros((4, 3))
        expected[:3, 0] = z([1, -1, 1], 1 / 3, S8)  # 0.7071, -1.4142, 0.7071
        expected[:3, 1] = z([-1, -1, 1], -1 / 3, S8)  # -0.7071, -0.7071, 1.4142
        # q = 2: only rollout 0 has it -> 0; rollout 3 is alone in its group -> 0; invalid -> 0.
        np.testing.assert_allclose(A, expected, rtol=1e-6)
        assert np.all(np.asarray(A)[:, 2] == 0) and np.all(np.asarray(A)[3] == 0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_zero_spread_is_zero(self):
        pol = POL.at[:3, 1].set(-1.0)  # every rollout of group 0 reacted -1 to segment 1
        A = self._fn()(pol, SVALID, GID, FacaConfig())
        np.testing.assert_array_equal(np.asarray(A)[:, 1], 0.0)
        np.testing.assert_allclose(A[:3, 0], z([1, -1, 1], 1 / 3, S8), rtol=1e-6)  # q = 0 untouched

    @chex.variants(with_jit=True, without_jit=True)
    def test_reverse_flips_signs_exactly(self):
        A = self._fn()(POL, SVALID, GID, FacaConfig())
        A_rev = self._fn()(POL, SVALID, GID, FacaConfig(ablation="reverse"))
        np.testing.assert_array_equal(A_rev, -A)
        assert np.abs(np.asarray(A)).sum() > 0

    @chex.variants(with_jit=True, without_jit=True)
    def test_shift_moves_reactions_by_one_segment(self):
        r, v = ablate_polarity(POL, SVALID, FacaConfig(ablation="shift"))
        np.testing.assert_array_equal(r, [[-1, 0, 0], [-1, 0, 0], [1, 0, 0], [0, 0, 0]])
        np.testing.assert_array_equal(v, [[1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0]])
        A = self._fn()(POL, SVALID, GID, FacaConfig(ablation="shift"))
        expected = np.zeros((4, 3))
        expected[:3, 0] = z([-1, -1, 1], -1 / 3, S8)  # segment 0 now carries segment 1's reactions
        np.testing.assert_allclose(A, expected, rtol=1e-6)
        # Same as the plain credit of hand-shifted inputs.
        shifted = jnp.concatenate([POL[:, 1:], jnp.zeros((4, 1))], 1)
        valid = SVALID & jnp.concatenate([SVALID[:, 1:], jnp.zeros((4, 1), bool)], 1)
        np.testing.assert_array_equal(A, reaction_advantage(shifted, valid, GID, FacaConfig()))

    @chex.variants(with_jit=True, without_jit=True)
    def test_random_keeps_label_frequencies_and_validity(self):
        rng = np.random.default_rng(0)
        pol = jnp.asarray(rng.choice([-1.0, 0.0, 1.0], size=(16, 5), p=[0.5, 0.2, 0.3]), jnp.float32)
        valid = jnp.asarray(rng.random((16, 5)) < 0.7)
        gid = jnp.asarray(np.repeat(np.arange(4), 4), jnp.int32)
        cfg = FacaConfig(ablation="random")
        ablate = self.variant(ablate_polarity, static_argnames=("config",))
        seen, fn = set(), self._fn()
        for seed in range(3):
            r, v = ablate(pol, valid, cfg, jax.random.key(seed))
            r, v = np.asarray(r), np.asarray(v)
            np.testing.assert_array_equal(v, valid)  # validity unchanged
            np.testing.assert_array_equal(r[~v], 0)
            for p in (-1, 0, 1):  # label frequencies kept exactly
                assert (r[v] == p).sum() == (np.asarray(pol)[np.asarray(valid)] == p).sum()
            seen.add(r.tobytes())
            A = fn(pol, valid, gid, cfg, jax.random.key(seed))
            np.testing.assert_array_equal(A, reaction_advantage(jnp.asarray(r), valid, gid, FacaConfig()))
        assert len(seen) == 3  # different keys, different permutations
        r0, _ = ablate(pol, valid, cfg, jax.random.key(0))
        np.testing.assert_array_equal(r0, ablate(pol, valid, cfg, jax.random.key(0))[0])  # deterministic

    def test_random_needs_a_key(self):
        with pytest.raises(ValueError, match=r'key=None: FacaConfig.ablation="random"'):
            reaction_advantage(POL, SVALID, GID, FacaConfig(ablation="random"))

    @chex.variants(with_jit=True, without_jit=True)
    def test_broadcast_segments(self):
        A_BQ = jnp.asarray([[1.0, 2.0], [3.0, 4.0]])
        idx = jnp.asarray([[-1, 0, 0, 1, 1, 2], [1, 1, -1, 0, 0, 0]], jnp.int32)  # 2 is out of range
        mask = jnp.asarray([[0, 1, 1, 1, 0, 1], [1, 1, 0, 1, 1, 1]], jnp.float32)
        out = self.variant(broadcast_segments)(A_BQ, idx, mask)
        np.testing.assert_array_equal(out, [[0, 1, 1, 2, 0, 0], [4, 4, 0, 3, 3, 3]])
        np.testing.assert_array_equal(out, tokens_of(np.asarray(A_BQ), idx, mask))

    @chex.variants(with_jit=True, without_jit=True)
    def test_telemetry_hand_computed(self):
        b = BATCH
        A_proc_BL = broadcast_segments(jnp.asarray(A_PROC, jnp.float32), b.segment_idx_BL, b.loss_mask_BL)
        A_out_BL = broadcast_to_tokens(jnp.asarray(A_EXT, jnp.float32), b.loss_mask_BL)
        fn = self.variant(reaction_telemetry, static_argnames=("lam",))
        tel = fn(b.segment_polarity_BQ, b.segment_valid_BQ, A_proc_BL, A_out_BL, b.loss_mask_BL, b.reward_B,
                 b.group_id_B, lam=0.5)  # fmt: skip
        assert float(tel["positive_reaction_rate"]) == pytest.approx(3 / 5)  # +1 -1 +1 -1 +1
        assert float(tel["nonzero_proc_token_share"]) == pytest.approx(7 / 15)  # segment-0 tokens 2+1+3+1 of 15
        assert float(tel["homogeneous_group_share"]) == pytest.approx(1 / 2)  # group 1 of groups {0, 1}
        # |A_out| = 1 on the 5 + 3 agent tokens of group 0; |lam A_proc| = 0.5 on 7 tokens.
        assert float(tel["proc_l1_share"]) == pytest.approx(3.5 / (8 * A_EXT[0] + 3.5), rel=1e-5)


jit_ablate = jax.jit(ablate_polarity, static_argnames=("config",))


@PROPS
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0))
def test_random_ablation_is_a_permutation_of_valid_labels(seed, p_valid):
    rng = np.random.default_rng(seed)
    pol = rng.choice([-1.0, 0.0, 1.0], size=(6, 5)).astype(np.float32)
    valid = rng.random((6, 5)) < p_valid
    r, v = jit_ablate(pol, valid, FacaConfig(ablation="random"), jax.random.key(seed))
    r, v = np.asarray(r), np.asarray(v)
    np.testing.assert_array_equal(v, valid)
    assert sorted(r[valid].tolist()) == sorted(pol[valid].tolist())
    assert np.all(r[~valid] == 0)


# ----------------------------------------------------------------------------- InfoPO pieces
class TestInfoPO(chex.TestCase):
    def test_valid_turns_hand_computed(self):
        np.testing.assert_array_equal(infogain_valid_turns(BATCH), INFO_VALID)
        # A feedback span that overlaps the next action, or lies outside [0, L), is not valid.
        bad = BATCH.replace(
            feedback_span_BT2=BATCH.feedback_span_BT2.at[0, 0, 1].set(BATCH.action_span_BT2[0, 1, 0] + 1)
        )
        assert not bool(infogain_valid_turns(bad)[0, 0]) and bool(infogain_valid_turns(bad)[0, 1])
        bad = BATCH.replace(turn_valid_BT=BATCH.turn_valid_BT.at[3, 1].set(False))  # no action 1 -> t0, t1 invalid
        np.testing.assert_array_equal(infogain_valid_turns(bad)[3], [False, False, False])

    @chex.variants(with_jit=True, without_jit=True)
    def test_normalize_turn_rewards_hand_computed(self):
        fn = self.variant(normalize_turn_rewards, static_argnames=("normalize_std", "eps"))
        A = fn(R_INFO, jnp.asarray(INFO_VALID), BATCH.group_id_B, True, EPS)
        np.testing.assert_allclose(A, A_INFO, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(A[0, :2], [math.sqrt(1.5), -math.sqrt(1.5)], rtol=1e-4)
        # "w/o std": mean-centering only.
        A = fn(R_INFO, jnp.asarray(INFO_VALID), BATCH.group_id_B, False, EPS)
        expected = np.where(INFO_VALID, [[0.1, -0.1, 0], [0, 0, 0], [0, 1 / 3, 0], [-2 / 3, 1 / 3, 0]], 0)
        np.testing.assert_allclose(A, expected, rtol=1e-5, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_normalize_turn_rewards_degenerate_groups(self):
        fn = self.variant(normalize_turn_rewards, static_argnames=("normalize_std", "eps"))
        valid = jnp.asarray([[1, 0], [0, 0], [1, 1], [0, 0], [1, 0]], bool)
        r = jnp.asarray([[0.4, 1.0], [2.0, 3.0], [0.3, 0.3], [NAN, 1.0], [5.0, 0.0]], jnp.float32)
        # group 0: one valid turn in total (rows 0, 1) -> 0; group 1: two equal turns -> 0;
        # group 2: rows 3 (none valid) and 4 (one valid turn) -> 0.
        A = fn(r, valid, jnp.asarray([0, 0, 1, 2, 2], jnp.int32), True, EPS)
        np.testing.assert_array_equal(A, 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_variance_gate_hand_computed(self):
        fn = self.variant(variance_gate, static_argnames=("temperature",))
        g = fn(BATCH.reward_B, BATCH.group_id_B, temperature=0.5)
        np.testing.assert_allclose(g, GATE, rtol=1e-6)
        # std 0.5 at T = 0.25: sigmoid(-2); a single-member group (id 2): 0.5.
        g = fn(jnp.asarray([1.0, 0.0, 3.0]), jnp.asarray([0, 0, 2], jnp.int32), temperature=0.25)
        np.testing.assert_allclose(g, [1 / (1 + math.e**2)] * 2 + [0.5], rtol=1e-6)
        np.testing.assert_allclose(
            gate_per_group(BATCH.reward_B, BATCH.group_id_B, 0.5), [GATE[0], 0.5, 0.5, 0.5], rtol=1e-6
        )

    @chex.variants(with_jit=True, without_jit=True)
    def test_broadcast_turns(self):
        out = self.variant(broadcast_turns)(jnp.asarray(A_INFO, jnp.float32), BATCH.turn_idx_BL, BATCH.loss_mask_BL)
        np.testing.assert_allclose(out, tokens_of(A_INFO, BATCH.turn_idx_BL, BATCH.loss_mask_BL), rtol=1e-6)
        # Row 0: prompt (2), action 0 (2 tokens), template, feedback (2), template, action 1 (1), ...
        np.testing.assert_allclose(np.asarray(out)[0, :8], [0, 0, A_INFO[0, 0], A_INFO[0, 0], 0, 0, 0, 0], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(out)[0, 8], A_INFO[0, 1], rtol=1e-6)


def test_normalize_turn_rewards_by_turn_hand_computed():
    """by_turn: each turn against the same turn of its group's other rollouts; pooled (InfoPO's
    default) the later turn's higher gain alone would give it the advantage in every rollout."""
    r = jnp.asarray([[0.1, 0.5], [0.3, 0.9], [0.2, 0.0]], jnp.float32)
    valid = jnp.asarray([[True, True], [True, True], [True, False]])
    gid = jnp.asarray([0, 0, 1], jnp.int32)
    A = normalize_turn_rewards(r, valid, gid, False, EPS, by_turn=True)
    # group 0: turn 0 mean 0.2, turn 1 mean 0.7; group 1: one valid turn -> 0; invalid -> 0
    np.testing.assert_allclose(A, [[-0.1, -0.2], [0.1, 0.2], [0.0, 0.0]], atol=1e-6)
    A = normalize_turn_rewards(r, valid, gid, True, EPS, by_turn=True)  # population std 0.1 and 0.2
    np.testing.assert_allclose(A, [[-1, -1], [1, 1], [0, 0]], atol=1e-4)
    A = normalize_turn_rewards(r, valid, gid, False, EPS)  # pooled over group 0's four turns: mean 0.45
    np.testing.assert_allclose(A, [[-0.35, 0.05], [-0.15, 0.45], [0.0, 0.0]], atol=1e-6)
    # a rollout outside every group (id -1) gets nothing and enters no cell
    A = normalize_turn_rewards(r, valid, jnp.asarray([0, 0, -1], jnp.int32), False, EPS, by_turn=True)
    np.testing.assert_allclose(A[2], [0, 0], atol=0)
    # through fuse: InfoPOConfig(normalize_by="group_turn") reaches it
    A_by = normalize_turn_rewards(R_INFO, jnp.asarray(INFO_VALID), BATCH.group_id_B, True, EPS, by_turn=True)
    A, d = fuse(BATCH, R_INFO, InfoPOConfig(normalize_by="group_turn", use_gate=False), None, GRPOConfig())
    np.testing.assert_allclose(d["A_info_BT"], A_by, atol=1e-6)
    np.testing.assert_allclose(A, expected_tokens(A_EXT, 0.5 * np.asarray(A_by), 0 * A_PROC), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="normalize_by"):
        InfoPOConfig(normalize_by="turn")


jit_turn_norm = jax.jit(normalize_turn_rewards, static_argnames=("normalize_std", "eps"))


@PROPS
@given(st.integers(0, 2**31 - 1), st.booleans())
def test_turn_normalization_properties(seed, normalize_std):
    rng = np.random.default_rng(seed)
    B, T = 6, 4
    r = rng.normal(size=(B, T)).astype(np.float32)
    valid = (rng.random((B, T)) < 0.6) & (np.arange(T) < rng.integers(0, T + 1, size=(B, 1)))  # uneven turn counts
    gid = rng.integers(0, 3, size=B).astype(np.int32)
    A = np.asarray(jit_turn_norm(r, valid, gid, normalize_std, EPS))
    assert np.all(A[~valid] == 0)
    garbage = np.where(valid, r, np.nan).astype(np.float32)  # invalid turns do not enter the statistics
    np.testing.assert_array_equal(jit_turn_norm(garbage, valid, gid, normalize_std, EPS), A)
    for k in range(3):
        m = valid & (gid == k)[:, None]
        if m.sum() >= 2:
            # float32 inputs: each deviation carries a rounding of ~eps32 * |r|, which dividing by
            # a small group std magnifies (seed 178: three values within 0.004 of -1.455 -> 2.4e-5)
            scale = np.abs(r[m]).max() / (r[m].std() + EPS) if normalize_std else np.abs(r[m]).max()
            np.testing.assert_allclose(A[m].mean(), 0.0, atol=1e-5 + 8 * np.finfo(np.float32).eps * scale)
    perm = rng.permutation(B)
    np.testing.assert_allclose(jit_turn_norm(r[perm], valid[perm], gid[perm], normalize_std, EPS), A[perm], atol=1e-5)


# ----------------------------------------------------------------------------- fusion
INFOPO = InfoPOConfig(beta=0.5, gate_temperature=0.5)
FACA = FacaConfig(lam=0.5)
FUSE_STATIC = ("infopo", "faca", "grpo")
JIT_FUSE = jax.jit(fuse, static_argnames=FUSE_STATIC)


def expected_tokens(ext_B, info_BT, proc_BQ, b=BATCH):
    return (
        tokens_of(
            np.asarray(ext_B, np.float64)[:, None],
            np.where(np.asarray(b.loss_mask_BL) > 0, 0, -1),
            b.loss_mask_BL,
        )
        + tokens_of(info_BT, b.turn_idx_BL, b.loss_mask_BL)
        + tokens_of(proc_BQ, b.segment_idx_BL, b.loss_mask_BL)
    )


class TestFuse(chex.TestCase):
    def _fuse(self):
        return self.variant(fuse, static_argnames=FUSE_STATIC)

    @chex.variants(with_jit=True, without_jit=True)
    def test_all_three_terms_hand_computed(self):
        A, d = self._fuse()(BATCH, R_INFO, INFOPO, FACA, GRPOConfig())
        expected = expected_tokens(A_EXT, 0.5 * GATE[:, None] * A_INFO, 0.5 * A_PROC)
        np.testing.assert_allclose(A, expected, rtol=1e-5, atol=1e-6)
        # Rollout 0, action 0 (tokens 2, 3): A_ext + beta g A_info + lam A_proc, by hand.
        by_hand = 1.0 + 0.5 * 0.2689414 * math.sqrt(1.5) + 0.5 * 1.0
        np.testing.assert_allclose(np.asarray(A)[0, 2:4], by_hand, rtol=1e-5)
        assert np.all(np.asarray(A)[np.asarray(BATCH.loss_mask_BL) == 0] == 0)
        np.testing.assert_allclose(d["A_ext_B"], A_EXT, rtol=1e-6)
        np.testing.assert_allclose(d["A_info_BT"], A_INFO, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            d["r_info_BT"], np.where(INFO_VALID, np.nan_to_num(np.asarray(R_INFO)), 0), rtol=1e-6
        )
        np.testing.assert_array_equal(d["info_valid_BT"], INFO_VALID)
        np.testing.assert_allclose(d["gate_B"], GATE, rtol=1e-6)
        np.testing.assert_allclose(d["gate_G"][:2], [GATE[0], 0.5], rtol=1e-6)
        np.testing.assert_allclose(d["A_proc_BQ"], A_PROC, rtol=1e-6)
        mask = np.asarray(BATCH.loss_mask_BL) > 0
        l1 = [np.abs(expected_tokens(A_EXT, 0 * A_INFO, 0 * A_PROC))[mask].sum(),
              np.abs(expected_tokens(0 * A_EXT, 0.5 * GATE[:, None] * A_INFO, 0 * A_PROC))[mask].sum(),
              np.abs(expected_tokens(0 * A_EXT, 0 * A_INFO, 0.5 * A_PROC))[mask].sum()]  # fmt: skip
        np.testing.assert_allclose(d["info_l1_share"], l1[1] / sum(l1), rtol=1e-5)
        assert float(d["faca/positive_reaction_rate"]) == pytest.approx(0.6)
        assert float(d["faca/homogeneous_group_share"]) == pytest.approx(0.5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_infopo_ablations(self):
        fn = self._fuse()
        A, d = fn(BATCH, R_INFO, InfoPOConfig(use_gate=False), None, GRPOConfig())  # g = 1
        np.testing.assert_allclose(A, expected_tokens(A_EXT, 0.5 * A_INFO, 0 * A_PROC), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(d["gate_B"], 1.0)
        A, _ = fn(BATCH, R_INFO, InfoPOConfig(use_ext=False), None, GRPOConfig())  # A = A_info
        np.testing.assert_allclose(A, expected_tokens(0 * A_EXT, A_INFO, 0 * A_PROC), rtol=1e-5, atol=1e-6)
        A, d = fn(BATCH, R_INFO, InfoPOConfig(normalize_std=False, beta=1.0), None, GRPOConfig())  # w/o std
        centred = np.where(INFO_VALID, [[0.1, -0.1, 0], [0, 0, 0], [0, 1 / 3, 0], [-2 / 3, 1 / 3, 0]], 0)
        np.testing.assert_allclose(A, expected_tokens(A_EXT, GATE[:, None] * centred, 0 * A_PROC), rtol=1e-5, atol=1e-6)
        A, d = fn(BATCH, None, None, None, GRPOConfig(normalize_std=False))  # outcome only, Dr. GRPO
        np.testing.assert_allclose(A, expected_tokens([0.5, -0.5, 0, 0], 0 * A_INFO, 0 * A_PROC), rtol=1e-6)
        # no info or reaction term: their diagnostics are absent; the coverage ones are by hand
        assert set(d) == {"A_ext_B", "cover/ext", "cover/total", "zero_adv_group_share"}
        agent = np.asarray(BATCH.loss_mask_BL) != 0
        moved = agent & (np.asarray([0.5, -0.5, 0, 0])[:, None] != 0)
        assert float(d["cover/ext"]) == float(d["cover/total"]) == pytest.approx(moved.sum() / agent.sum())
        gid = np.asarray(BATCH.group_id_B)
        zero = [g for g in set(gid.tolist()) if np.all(np.asarray([0.5, -0.5, 0, 0])[gid == g] == 0)]
        assert float(d["zero_adv_group_share"]) == pytest.approx(len(zero) / len(set(gid.tolist())))

    def test_infopo_negative_weight_scales_the_info_terms_negative_entries_only(self):
        info = 0.5 * GATE[:, None] * A_INFO  # beta g A_info, by turn
        assert (info < 0).any() and (info > 0).any()
        for w in (0.0, 0.25):
            A, _ = fuse(BATCH, R_INFO, InfoPOConfig(negative_weight=w), None, GRPOConfig())
            # the outcome term (here with both signs) is untouched: only beta g A_info < 0 is scaled
            expected = expected_tokens(A_EXT, np.where(info < 0, w * info, info), 0 * A_PROC)
            np.testing.assert_allclose(A, expected, rtol=1e-5, atol=1e-6)
        # rollout 0's turn 1 has A_info = -sqrt(1.5) (hand-computed above): its action token 8
        A, _ = fuse(BATCH, R_INFO, InfoPOConfig(negative_weight=0.0), None, GRPOConfig())
        np.testing.assert_allclose(np.asarray(A)[0, 8], A_EXT[0], rtol=1e-6)
        for bad in (-0.1, 1.5, True, "0"):
            with pytest.raises(ValueError, match="negative_weight"):
                InfoPOConfig(negative_weight=bad)

    def test_lambda_zero_leaves_the_outcome_advantage(self):
        fn = fuse  # eager: the ops are compiled already, a jit per config would not be
        for infopo in (None, INFOPO):
            A_out, _ = fn(BATCH, R_INFO, infopo, None, GRPOConfig())
            A, d = fn(BATCH, R_INFO, infopo, FacaConfig(lam=0.0), GRPOConfig())
            np.testing.assert_array_equal(A, A_out)
            assert float(d["faca/proc_l1_share"]) == 0.0

    def test_faca_ablations_change_only_the_process_term(self):
        fn = fuse
        A_out, d_out = fn(BATCH, R_INFO, INFOPO, None, GRPOConfig())
        A_proc_BL = {}
        for ablation in ("none", "shift", "random", "reverse"):
            A, d = fn(BATCH, R_INFO, INFOPO, FacaConfig(lam=0.5, ablation=ablation), GRPOConfig(), jax.random.key(1))
            for k in ("A_ext_B", "A_info_BT", "gate_B"):
                np.testing.assert_array_equal(d[k], d_out[k])
            proc = np.asarray(broadcast_segments(d["A_proc_BQ"], BATCH.segment_idx_BL, BATCH.loss_mask_BL))
            np.testing.assert_allclose(A, np.asarray(A_out) + 0.5 * proc, rtol=1e-6, atol=1e-7)
            # Telemetry reads the users' raw reactions, whatever the ablation.
            assert float(d["faca/positive_reaction_rate"]) == pytest.approx(0.6)
            A_proc_BL[ablation] = proc
            # Credit only on segments that were followed by a reaction.
            assert np.all(np.asarray(d["A_proc_BQ"])[~np.asarray(BATCH.segment_valid_BQ)] == 0)
        np.testing.assert_array_equal(A_proc_BL["reverse"], -A_proc_BL["none"])
        # Shift: segment 0 gets segment 1's reaction; only rollout 3 has a valid segment 1, so
        # every (group, segment) cell has fewer than two rollouts: no process credit at all.
        np.testing.assert_array_equal(A_proc_BL["shift"], 0.0)

    def test_random_ablation_needs_a_key_and_infopo_needs_r_info(self):
        with pytest.raises(ValueError, match="key=None"):
            fuse(BATCH, R_INFO, INFOPO, FacaConfig(ablation="random"), GRPOConfig())
        with pytest.raises(ValueError, match="r_info_BT=None"):
            fuse(BATCH, None, INFOPO, None, GRPOConfig())


@PROPS
@given(st.permutations(range(4)))
def test_fuse_is_invariant_to_permuting_rollouts(perm):
    perm = np.asarray(perm)
    A, d = JIT_FUSE(BATCH, R_INFO, INFOPO, FACA, GRPOConfig())
    A_p, d_p = JIT_FUSE(permute_batch(BATCH, perm), R_INFO[perm], INFOPO, FACA, GRPOConfig())
    np.testing.assert_allclose(A_p, np.asarray(A)[perm], rtol=1e-5, atol=1e-6)
    for k in ("info_l1_share", "faca/proc_l1_share", "faca/nonzero_proc_token_share"):
        np.testing.assert_allclose(d_p[k], d[k], rtol=1e-5)


# ----------------------------------------------------------------------------- config errors
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: GRPOConfig(eps=0.0), r"GRPOConfig.eps=0.0: expected a finite number > 0"),
        (lambda: GRPOConfig(normalize_std=1), r"GRPOConfig.normalize_std=1: expected a bool"),
        (lambda: FacaConfig(lam=0.6), r"FacaConfig.lam=0.6: expected lam in \[0, 0.5\].*force_lambda=True"),
        (lambda: FacaConfig(lam=-0.1, force_lambda=True), r"FacaConfig.lam=-0.1: expected a finite number"),
        (lambda: FacaConfig(lam=float("nan")), r"FacaConfig.lam=nan"),
        (lambda: FacaConfig(ablation="flip"), r"FacaConfig.ablation='flip': expected one of \('none', 'shift'"),
        (lambda: FacaConfig(eps=-1.0), r"FacaConfig.eps=-1.0"),
        (lambda: InfoPOConfig(beta=-0.5), r"InfoPOConfig.beta=-0.5: expected a finite number >= 0"),
        (
            lambda: InfoPOConfig(gate_temperature=0.0),
            r"InfoPOConfig.gate_temperature=0.0: expected a finite number > 0",
        ),
        (lambda: InfoPOConfig(use_gate="no"), r"InfoPOConfig.use_gate='no': expected a bool"),
        (lambda: InfoPOConfig(eps=float("inf")), r"InfoPOConfig.eps=inf"),
        (lambda: InfoPOConfig(placeholder=" "), r"InfoPOConfig.placeholder=' ': expected a non-empty string"),
        (
            lambda: InfoPOConfig(placeholder_mode="pad"),
            r"InfoPOConfig.placeholder_mode='pad': expected one of \('replace', 'overwrite'\)",
        ),
        (
            lambda: InfoPOConfig(mode="fast"),
            r"InfoPOConfig.mode='fast': expected one of \('naive', 'vmapped', 'shared_prefix'\)",
        ),
    ],
)
def test_config_errors_name_field_value_and_expectation(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_configs_are_hashable_and_forced_lambda_is_allowed():
    assert FacaConfig(lam=0.8, force_lambda=True).lam == 0.8
    assert FacaConfig(lam=0.5).lam == 0.5 and FacaConfig(lam=0).lam == 0
    assert len({GRPOConfig(), GRPOConfig(), InfoPOConfig(), FacaConfig()}) == 3
    cfg = InfoPOConfig()
    assert (cfg.beta, cfg.gate_temperature, cfg.placeholder, cfg.placeholder_mode, cfg.mode) == (
        0.5, 0.5, "No information found.", "replace", "shared_prefix")  # fmt: skip


def test_grpo_negative_weight_by_hand():
    """rewards [1, 0, 0, 0]: mean 1/4, population std sqrt(3)/4, so A = [sqrt(3), -1/sqrt(3) x 3];
    negative_weight scales the negative entries only (0: the positive part alone)."""
    from jaxagent.credit.grpo import GRPOConfig, grpo_advantage

    r = jnp.asarray([1.0, 0.0, 0.0, 0.0])
    g = jnp.zeros(4, jnp.int32)
    s3 = np.sqrt(3.0)
    np.testing.assert_allclose(grpo_advantage(r, g), [s3, -1 / s3, -1 / s3, -1 / s3], rtol=1e-5)
    np.testing.assert_allclose(grpo_advantage(r, g, GRPOConfig(negative_weight=0.25)),
                               [s3, -0.25 / s3, -0.25 / s3, -0.25 / s3], rtol=1e-5)
    np.testing.assert_allclose(grpo_advantage(r, g, GRPOConfig(negative_weight=0.0)), [s3, 0, 0, 0], rtol=1e-5)
    for bad in (1.5, -0.1, float("nan"), True):
        with pytest.raises(ValueError, match="negative_weight"):
            GRPOConfig(negative_weight=bad)


def test_grpo_positive_weight_by_hand():
    """Same rewards: positive_weight scales the positive entry only (0: the negative part alone);
    both weights 0 is refused."""
    from jaxagent.credit.grpo import GRPOConfig, grpo_advantage

    r = jnp.asarray([1.0, 0.0, 0.0, 0.0, 2.0, 2.0])
    g = jnp.asarray([0, 0, 0, 0, 1, 1], jnp.int32)
    s3 = np.sqrt(3.0)
    np.testing.assert_allclose(grpo_advantage(r, g, GRPOConfig(positive_weight=0.0)),
                               [0, -1 / s3, -1 / s3, -1 / s3, 0, 0], rtol=1e-5)
    np.testing.assert_allclose(grpo_advantage(r, g, GRPOConfig(positive_weight=0.5, negative_weight=0.5)),
                               [s3 / 2, -0.5 / s3, -0.5 / s3, -0.5 / s3, 0, 0], rtol=1e-5)
    for bad in (1.5, -0.1, float("nan"), True):
        with pytest.raises(ValueError, match="positive_weight"):
            GRPOConfig(positive_weight=bad)
    with pytest.raises(ValueError, match="at least one"):
        GRPOConfig(positive_weight=0.0, negative_weight=0.0)

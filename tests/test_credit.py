"""Credit assignment: GRPO outcome advantage, group statistics, Faca reaction credit and its
ablations. Hand-computed cases, jit/no-jit variants and hypothesis properties."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

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

from tests.credit_helpers import A_EXT, A_PROC, BATCH, EPS, NAN, PROPS, R2, tokens_of, z


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

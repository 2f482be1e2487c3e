"""Credit assignment: InfoPO normalisation / gate / fusion of all terms, and the credit configs'
errors. Hand-computed cases, jit/no-jit variants and hypothesis properties."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxagent.credit.fusion import fuse
from jaxagent.credit.infopo import (
    InfoPOConfig,
    broadcast_turns,
    gate_per_group,
    infogain_valid_turns,
    normalize_turn_rewards,
    variance_gate,
)
from jaxagent.credit.grpo import GRPOConfig
from jaxagent.credit.reaction import (
    FacaConfig,
    broadcast_segments,
)

from tests.credit_helpers import (A_EXT, A_INFO, A_PROC, BATCH, EPS, GATE, INFO_VALID, NAN, PROPS, R_INFO, permute_batch,
                                   tokens_of)


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
        assert set(d) == {"A_ext_B", "cover/ext", "cover/total", "zero_adv_group_share", "credit/all_zero_group_share"}
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

"""The InfoPO reference code's choices and this issue's options, each on a hand-computed case:
n - 1 standard deviations, token-weighted statistics (r_t / |a_t| per token), the magnitude ratio,
the gate's n - 1 std with verl's single-member std of 1, beta's decay, a single-member group's
A = R, corrections left out of the valid turns, the all-zero group share, and Faca's polarity map."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.credit.fusion import fuse_terms
from jaxagent.credit.grpo import GRPOConfig, GRPOTerm, all_zero_group_share, group_stats, grpo_advantage
from jaxagent.credit.infopo import (InfoPOConfig, InfoPOTerm, gate_per_group, info_advantage, magnitude_ratio,
                                    masked_std)
from jaxagent.credit.reaction import DEFAULT_POLARITY, FacaConfig
from tests.credit_helpers import A_EXT, A_INFO, BATCH, EPS, R_INFO, tokens_of


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ----------------------------------------------------------------------------- group statistics
def test_group_stats_n_minus_1_and_weights_by_hand():
    x, g = jnp.asarray([1.0, 2.0, 3.0, 5.0]), jnp.asarray([0, 0, 0, 1])
    pop, unb = group_stats(x, g, num_groups=2), group_stats(x, g, num_groups=2, ddof=1)
    np.testing.assert_allclose(pop.std_G, [math.sqrt(2 / 3), 0.0], rtol=1e-6)
    np.testing.assert_allclose(unb.std_G, [1.0, 0.0], rtol=1e-6)  # sum d^2 = 2 over n - 1 = 2
    # weights 3 and 1: the values 1, 1, 1, 3 -> mean 1.5, sum w d^2 = 3 * 0.25 + 2.25 = 3
    w = group_stats(jnp.asarray([1.0, 3.0]), jnp.asarray([0, 0]), num_groups=1, weight_B=jnp.asarray([3.0, 1.0]))
    np.testing.assert_allclose([w.mean_G[0], w.std_G[0], w.count_G[0]], [1.5, math.sqrt(3 / 4), 4.0], rtol=1e-6)
    w1 = group_stats(jnp.asarray([1.0, 3.0]), jnp.asarray([0, 0]), num_groups=1, weight_B=jnp.asarray([3.0, 1.0]),
                     ddof=1)
    np.testing.assert_allclose(w1.std_G[0], 1.0, rtol=1e-6)  # 3 / (4 - 1)


def test_grpo_n_minus_1_and_single_member_reward_by_hand():
    r, g = jnp.asarray([1.0, 0.0, 0.0, 0.7]), jnp.asarray([0, 0, 0, 1])
    A = grpo_advantage(r, g, GRPOConfig(std_ddof=1))
    s = math.sqrt(1 / 3)  # deviations 2/3, -1/3, -1/3: sum 6/9 over 2
    np.testing.assert_allclose(A, [(2 / 3) / (s + EPS), (-1 / 3) / (s + EPS), (-1 / 3) / (s + EPS), 0.0], rtol=1e-5)
    A = grpo_advantage(r, g, GRPOConfig(singleton="reward"))  # verl: mean 0, std 1 for a lone member
    assert float(A[3]) == pytest.approx(0.7 / (1 + EPS), rel=1e-6)
    assert float(grpo_advantage(r, g, GRPOConfig(singleton="reward", normalize_std=False))[3]) == pytest.approx(0.7)
    assert float(grpo_advantage(r, g, GRPOConfig())[3]) == 0.0  # ours: nothing to compare with
    # a padding row alone in its group is not a member
    A = grpo_advantage(r, g, GRPOConfig(singleton="reward"), valid_B=jnp.asarray([1, 1, 1, 0], bool))
    assert float(A[3]) == 0.0


def test_all_zero_group_share_by_hand():
    r = jnp.asarray([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    g = jnp.asarray([0, 0, 1, 1, 2, 2])
    assert float(all_zero_group_share(r, g, jnp.ones(6, bool))) == pytest.approx(2 / 3)
    assert float(all_zero_group_share(r, g, jnp.asarray([1, 1, 1, 1, 0, 0], bool))) == pytest.approx(1 / 2)


# ----------------------------------------------------------------------------- InfoPO's statistics
def test_token_statistics_by_hand():
    """The reference code spreads r_t / |a_t| over a_t's tokens and normalises over tokens with n - 1.
    BATCH's info-valid turns: group 0 (0,0) r=0.3 |a|=2, (0,1) 0.1 |a|=1, (1,0) 0.2 |a|=1; group 1
    (2,1) 0.5, (3,0) -0.5, (3,1) 0.5, each |a|=1."""
    A, valid = info_advantage(R_INFO, BATCH, InfoPOConfig(stat_unit="token", std_ddof=1))
    # group 0 tokens: 0.15, 0.15, 0.1, 0.2 -> mean 0.15, sum d^2 = 0.005 over 3
    s0 = math.sqrt(0.005 / 3)
    # group 1 tokens: 0.5, -0.5, 0.5 -> mean 1/6, sum d^2 = 6/9 over 2
    s1 = math.sqrt(1 / 3)
    want = np.zeros((4, 3))
    want[0, :2] = [0.0, -0.05 / (s0 + EPS)]
    want[1, 0] = 0.05 / (s0 + EPS)
    want[2, 1] = (0.5 - 1 / 6) / (s1 + EPS)
    want[3, :2] = [(-0.5 - 1 / 6) / (s1 + EPS), (0.5 - 1 / 6) / (s1 + EPS)]
    np.testing.assert_allclose(A, want, rtol=1e-5, atol=1e-6)
    # the default (the paper's): each turn once, population std, as credit_helpers' A_INFO
    A, _ = info_advantage(R_INFO, BATCH, InfoPOConfig())
    np.testing.assert_allclose(A, A_INFO, rtol=1e-5, atol=1e-6)


def test_token_statistics_leave_zero_gain_turns_out():
    r = R_INFO.at[0, 1].set(0.0)  # the code keeps non-zero token values only
    A, valid = info_advantage(r, BATCH, InfoPOConfig(stat_unit="token"))
    assert not bool(valid[0, 1]) and float(A[0, 1]) == 0.0
    # group 0 is then 0.15, 0.15, 0.2: mean 0.5/3, population std
    vals = np.array([0.15, 0.15, 0.2])
    np.testing.assert_allclose(A[1, 0], (0.2 - vals.mean()) / (vals.std() + EPS), rtol=1e-5)


def test_exclude_corrections_by_hand():
    kinds = jnp.zeros((4, 3), jnp.int32).at[0, 1].set(2).at[3, 0].set(1)  # (0, 1) drew a correction
    batch = BATCH.replace(feedback_kind_BT=kinds)
    A, valid = info_advantage(R_INFO, batch, InfoPOConfig(exclude_corrections=True))
    assert not bool(valid[0, 1]) and float(A[0, 1]) == 0.0
    # group 0 is left with 0.3 and 0.2: mean 0.25, population std 0.05
    np.testing.assert_allclose([A[0, 0], A[1, 0]], [0.05 / (0.05 + EPS), -0.05 / (0.05 + EPS)], rtol=1e-5)
    A_kept, _ = info_advantage(R_INFO, batch, InfoPOConfig())  # the paper's: every turn with feedback
    np.testing.assert_allclose(A_kept, A_INFO, rtol=1e-5, atol=1e-6)


def test_magnitude_ratio_by_hand():
    agent = jnp.asarray([[1, 1, 1, 1, 0]], bool)
    ext, info = jnp.asarray([[1.0, -1.0, 1.0, -1.0, 9.0]]), jnp.asarray([[3.0, -3.0, 3.0, -3.0, 9.0]])
    assert float(masked_std(info, agent)) == pytest.approx(3.0)
    assert float(magnitude_ratio(ext, info, agent)) == pytest.approx((1 + EPS) / (3 + EPS), rel=1e-6)
    assert float(magnitude_ratio(2 * ext, info, agent)) == pytest.approx((2 + EPS) / (3 + EPS), rel=1e-6)
    assert float(magnitude_ratio(ext, info / 6, agent)) == 1.0  # never scales up
    assert float(magnitude_ratio(0 * ext, info, agent)) == pytest.approx(1 / (3 + EPS), rel=1e-6)  # the floor 1
    # n - 1 over the 4 tokens: sqrt(36 / 3)
    assert float(masked_std(info, agent, ddof=1)) == pytest.approx(math.sqrt(12.0))


def test_gate_n_minus_1_single_member_std_1():
    r, g = jnp.asarray([1.0, 0.0, 0.3]), jnp.asarray([0, 0, 1])
    np.testing.assert_allclose(gate_per_group(r, g, 0.5, num_groups=2, ddof=1),
                               [sigmoid(-math.sqrt(0.5) / 0.5), sigmoid(-1 / 0.5)], rtol=1e-6)
    np.testing.assert_allclose(gate_per_group(r, g, 0.5, num_groups=2), [sigmoid(-1.0), 0.5], rtol=1e-6)


def _fuse(infopo, inputs, grpo=GRPOConfig()):
    return fuse_terms(BATCH, (GRPOTerm(grpo), InfoPOTerm(infopo)), inputs)


def test_beta_decay_by_hand():
    s = InfoPOConfig(beta=0.5, beta_decay=0.1, use_gate=False)
    A, d = _fuse(s, {"r_info": R_INFO, "iteration": jnp.float32(3.0)})
    beta = 0.5 * math.exp(-0.3)
    want = tokens_of(np.asarray(A_EXT)[:, None], np.where(np.asarray(BATCH.loss_mask_BL) > 0, 0, -1),
                     BATCH.loss_mask_BL) + tokens_of(beta * A_INFO, BATCH.turn_idx_BL, BATCH.loss_mask_BL)
    np.testing.assert_allclose(A, want, rtol=1e-5, atol=1e-6)
    assert float(d["info/beta"]) == pytest.approx(beta, rel=1e-6)
    _, d0 = _fuse(s, {"r_info": R_INFO})  # no iteration given: iteration 0
    assert float(d0["info/beta"]) == pytest.approx(0.5)


def test_magnitude_ratio_in_the_fusion():
    s = InfoPOConfig(use_gate=False, magnitude_ratio=True, beta=1.0)
    A, d = _fuse(s, {"r_info": R_INFO})
    agent = np.asarray(BATCH.loss_mask_BL) > 0
    ext = tokens_of(np.asarray(A_EXT)[:, None], np.where(agent, 0, -1), BATCH.loss_mask_BL)
    info = tokens_of(A_INFO, BATCH.turn_idx_BL, BATCH.loss_mask_BL)
    ratio = min(1.0, max(ext[agent].std() + EPS, 1.0) / (info[agent].std() + EPS))
    assert float(d["info/magnitude_ratio"]) == pytest.approx(ratio, rel=1e-5)
    np.testing.assert_allclose(A, ext + ratio * info, rtol=1e-5, atol=1e-6)


def test_settings_refuse_bad_values_naming_the_field():
    for kw, field in (({"std_ddof": 2}, "std_ddof"), ({"stat_unit": "row"}, "stat_unit"),
                      ({"prior": "uniform"}, "prior"), ({"beta_decay": -1.0}, "beta_decay"),
                      ({"magnitude_ratio": 1}, "magnitude_ratio"), ({"exclude_corrections": "yes"},
                                                                   "exclude_corrections")):
        with pytest.raises(ValueError, match=f"InfoPOConfig.{field}"):
            InfoPOConfig(**kw)
    with pytest.raises(ValueError, match="GRPOConfig.singleton"):
        GRPOConfig(singleton="one")
    with pytest.raises(ValueError, match="GRPOConfig.std_ddof"):
        GRPOConfig(std_ddof=True)


# ----------------------------------------------------------------------------- Faca's polarity map
def test_polarity_map_overrides_and_hashes():
    a = FacaConfig(polarity={"be_vague": 0, " Correct ": 1})
    m = a.polarity_map()
    assert m["be_vague"] == 0 and m["correct"] == 1 and m["provide_info"] == DEFAULT_POLARITY["provide_info"]
    assert hash(a) == hash(FacaConfig(polarity={" Correct ": 1, "be_vague": 0})) and a == FacaConfig(
        polarity={" Correct ": 1, "be_vague": 0})
    assert hash(a) != hash(FacaConfig())
    with pytest.raises(ValueError, match=r"FacaConfig.polarity\['be_vague'\]=2"):
        FacaConfig(polarity={"be_vague": 2})


def test_nonconstant_reaction_cell_share_by_hand():
    from jaxagent.credit.reaction import reaction_telemetry

    # group 0: rows 0, 1; group 1: rows 2, 3. Cells (g, q): (0,0) +1/-1 differ; (0,1) +1/+1 equal;
    # (1,0) -1 and invalid: one member, not a pair; (1,1) 0/0 equal -> 1 of 3 pairs differ
    pol = jnp.asarray([[1.0, 1.0], [-1.0, 1.0], [-1.0, 0.0], [1.0, 0.0]])
    valid = jnp.asarray([[1, 1], [1, 1], [1, 1], [0, 1]], bool)
    zeros = jnp.zeros((4, 3))
    t = reaction_telemetry(pol, valid, zeros, zeros, jnp.ones((4, 3)), jnp.zeros(4), jnp.asarray([0, 0, 1, 1]), 0.5)
    assert float(t["nonconstant_cell_share"]) == pytest.approx(1 / 3)

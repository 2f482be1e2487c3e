"""Tests for jaxagent/credit/losses.py: hand-computed values for every formula (numbers written
out), jit/no-jit variants, hand-derived gradients, clip branches for both advantage signs,
aggregation on ragged masks, KL estimator properties, DPO/IPO, SFT and config errors."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.credit.losses import (
    AGG_MODES,
    PPOConfig,
    aggregate,
    dpo_loss,
    entropy_bonus,
    kl_estimate,
    kl_loss,
    kl_penalty,
    policy_loss,
    ppo_token_loss,
    sequence_logp,
    sft_loss,
)
from jaxagent.models.config import ConfigError

ATOL = 1e-5
f32 = lambda x: jnp.asarray(x, jnp.float32)


def close(a, b, atol=ATOL):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), atol=atol, rtol=1e-5)


# ----------------------------------------------------------------------------- the PPO hand case
# Two sequences of four tokens, old log-prob -1 everywhere, logp = -1 + log(ratio). Clip 0.2/0.2,
# so the band is [0.8, 1.2]. Per token (ratio, advantage) -> token loss, d loss_tok / d logp:
#   (1.5, +2) clip_high: -2 * 1.2 = -2.4, grad 0
#   (1.1, +2) inside:    -2 * 1.1 = -2.2, grad -2.2
#   (0.5, +2) below the band but A > 0, so unclipped: -2 * 0.5 = -1.0, grad -1.0
#   (0.9, -1) inside:    +0.9, grad +0.9
#   (0.5, -1) clip_low:  +1 * 0.8 = +0.8, grad 0
#   (1.5, -1) above the band but A < 0, so unclipped: +1.5, grad +1.5
#   (1.0,  0) zero advantage: 0, grad 0
#   padding (masked out; holds nan/inf in old log-prob and advantage)
# N = 7 masked tokens; sum of token losses = -2.4 - 2.2 - 1.0 + 0.9 + 0.8 + 1.5 + 0 = -2.4.
RATIO = [[1.5, 1.1, 0.5, 0.9], [0.5, 1.5, 1.0, 1.0]]
ADV = [[2.0, 2.0, 2.0, -1.0], [-1.0, -1.0, 0.0, np.inf]]
MASK = [[1, 1, 1, 1], [1, 1, 1, 0]]
TOK_LOSS = [[-2.4, -2.2, -1.0, 0.9], [0.8, 1.5, 0.0, 0.0]]
TOK_GRAD = [[0.0, -2.2, -1.0, 0.9], [0.0, 1.5, 0.0, 0.0]]  # d token loss / d logp


def ppo_case():
    logp = f32(-1.0 + np.log(RATIO))
    old = f32([[-1.0] * 4, [-1.0, -1.0, -1.0, np.nan]])
    return logp, old, f32(ADV), f32(MASK)


class TestPPO(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_case_token_mean(self):
        logp, old, adv, mask = ppo_case()
        cfg = PPOConfig(clip_low=0.2, clip_high=0.2, agg="token_mean")
        fn = self.variant(lambda *a: policy_loss(*a, config=cfg))
        loss, m = fn(logp, old, adv, mask)
        close(loss, -2.4 / 7)  # -0.3428571
        close(m["pg_loss"], -2.4 / 7)
        close(m["loss"], -2.4 / 7)
        close(m["clip_frac_high"], 1 / 7)
        close(m["clip_frac_low"], 1 / 7)
        close(m["clip_frac"], 2 / 7)
        close(m["clip_frac_dual"], 0.0)
        # ratios sum to 7.0 -> mean 1.0; min 0.5, max 1.5
        close(m["ratio_mean"], 1.0)
        close(m["ratio_min"], 0.5)
        close(m["ratio_max"], 1.5)
        close(m["advantage_mean"], 3 / 7)  # (2 + 2 + 2 - 1 - 1 - 1 + 0) / 7
        # 0.5 * mean(log r ** 2) and mean(r - 1 - log r) over the 7 ratios
        close(m["approx_kl_k2"], 0.0935639)
        close(m["approx_kl_k3"], 0.0836306)
        close(m["num_tokens"], 7.0)
        close(m["num_seqs"], 2.0)
        assert "kl_ref" not in m and "entropy" not in m

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_gradient_token_mean(self):
        """d loss / d logp = -A * ratio / N where unclipped, 0 where the clip is active."""
        logp, old, adv, mask = ppo_case()
        cfg = PPOConfig()
        grad = self.variant(jax.grad(lambda lp, o, a: policy_loss(lp, o, a, mask, config=cfg)[0], argnums=(0, 1, 2)))
        g_logp, g_old, g_adv = grad(logp, old, adv)
        close(g_logp, np.array(TOK_GRAD) / 7)
        # hand-derived from the definition, too
        r, a = np.array(RATIO), np.array(ADV)
        unclipped = ~(((a > 0) & (r > 1.2)) | ((a < 0) & (r < 0.8)))
        close(g_logp, np.where(np.array(MASK) & unclipped, -a * r / 7, 0.0))
        # no gradient through the stored log-probs or the advantages
        close(g_old, np.zeros((2, 4)))
        close(g_adv, np.zeros((2, 4)))
        assert np.all(np.isfinite(g_logp))

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_case_seq_mean_token_mean(self):
        # row 0: (-2.4 - 2.2 - 1.0 + 0.9) / 4 = -1.175; row 1: (0.8 + 1.5 + 0) / 3 = 0.7666667
        logp, old, adv, mask = ppo_case()
        cfg = PPOConfig(agg="seq_mean_token_mean")
        fn = self.variant(jax.value_and_grad(lambda lp: policy_loss(lp, old, adv, mask, config=cfg)[0]))
        loss, g = fn(logp)
        close(loss, (-1.175 + 2.3 / 3) / 2)  # -0.2041667
        close(g, np.array(TOK_GRAD) / np.array([[8.0], [6.0]]))  # 1 / (n_b * num_seqs)

    @chex.variants(with_jit=True, without_jit=True)
    def test_token_loss_and_indicators(self):
        logp, old, adv, mask = ppo_case()
        fn = self.variant(lambda *a: ppo_token_loss(*a, config=PPOConfig()))
        tok, info = fn(logp, old, adv, mask)
        close(tok, TOK_LOSS)
        np.testing.assert_array_equal(info["clip_high"], [[1, 0, 0, 0], [0, 0, 0, 0]])
        np.testing.assert_array_equal(info["clip_low"], [[0, 0, 0, 0], [1, 0, 0, 0]])
        close(info["ratio"], np.where(np.array(MASK) > 0, RATIO, 1.0))

    @chex.variants(with_jit=True, without_jit=True)
    def test_clip_higher_is_asymmetric(self):
        # ratio 1.25 with A = +1: clip_high=0.2 clips it (loss -1.2, grad 0);
        # clip_high=0.28 does not (loss -1.25, grad -1.25). ratio 0.75 with A = -1 is clipped at
        # 0.8 by clip_low=0.2 in both (loss 0.8, grad 0).
        logp = f32(np.log([[1.25, 0.75]]))
        old, adv, mask = f32([[0.0, 0.0]]), f32([[1.0, -1.0]]), f32([[1, 1]])
        for clip_high, loss_want, g_want, high_frac in (
            (0.2, (-1.2 + 0.8) / 2, 0.0, 0.5),
            (0.28, (-1.25 + 0.8) / 2, -1.25 / 2, 0.0),
        ):
            cfg = PPOConfig(clip_low=0.2, clip_high=clip_high)
            fn = self.variant(
                jax.value_and_grad(lambda lp, c=cfg: policy_loss(lp, old, adv, mask, config=c), has_aux=True)
            )
            (loss, m), g = fn(logp)
            close(loss, loss_want)
            close(g, [[g_want, 0.0]])
            close(m["clip_frac_high"], high_frac)
            close(m["clip_frac_low"], 0.5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_dual_clip(self):
        # A = -1: ratio 4 -> capped at c = 3 (loss 3, grad 0); ratio 2 -> plain 2 (grad +1);
        # A = +1, ratio 4 -> clip_high as usual (loss -1.2).
        logp = f32(np.log([[4.0, 2.0, 4.0]]))
        old, adv, mask = f32([[0.0] * 3]), f32([[-1.0, -1.0, 1.0]]), f32([[1, 1, 1]])
        cfg = PPOConfig(dual_clip=3.0)
        fn = self.variant(jax.value_and_grad(lambda lp: policy_loss(lp, old, adv, mask, config=cfg), has_aux=True))
        (loss, m), g = fn(logp)
        close(loss, (3.0 + 2.0 - 1.2) / 3)
        close(g, [[0.0, 2.0 / 3, 0.0]])
        close(m["clip_frac_dual"], 1 / 3)
        close(m["clip_frac_high"], 1 / 3)
        # without dual clip the first token costs 4 with gradient 4/3
        loss0, g0 = self.variant(jax.value_and_grad(lambda lp: policy_loss(lp, old, adv, mask, config=PPOConfig())[0]))(
            logp
        )
        close(loss0, (4.0 + 2.0 - 1.2) / 3)
        close(g0, [[4.0 / 3, 2.0 / 3, 0.0]])

    @chex.variants(with_jit=True, without_jit=True)
    def test_kl_and_entropy_terms(self):
        # logp = old (ratio 1) so the surrogate is -A per token: [-1, 1, -2] -> mean -2/3.
        # ref - logp = [-1, 1, 0]: k3 = [e^-1 + 1 - 1, e - 1 - 1, 0] = [0.3678794, 0.7182818, 0] -> mean 0.3620537
        # entropy [0.5, 1.0, 1.5] -> mean 1.0
        # loss = -2/3 + 0.5 * 0.3620537 - 0.01 * 1.0 = -0.4956398
        logp = f32([[-1.0, -2.0, -0.5]])
        ref = f32([[-2.0, -1.0, -0.5]])
        ent = f32([[0.5, 1.0, 1.5]])
        adv, mask = f32([[1.0, -1.0, 2.0]]), f32([[1, 1, 1]])
        cfg = PPOConfig(kl_coef=0.5, kl_estimator="k3", entropy_coef=0.01)

        def f(lp, old, ref, ent, adv):
            return policy_loss(lp, old, adv, mask, config=cfg, ref_logp_BL=ref, entropy_BL=ent)

        fn = self.variant(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4), has_aux=True))
        (loss, m), (g_lp, g_old, g_ref, g_ent, g_adv) = fn(logp, logp, ref, ent, adv)
        close(loss, -2 / 3 + 0.5 * 0.3620537 - 0.01)
        close(m["pg_loss"], -2 / 3)
        close(m["kl_ref"], 0.3620537)
        close(m["kl_loss"], 0.3620537)
        close(m["entropy"], 1.0)
        close(m["entropy_loss"], 1.0)
        close(m["approx_kl_k3"], 0.0)
        # d/dlogp: surrogate -A/3; k3: 0.5 * (1 - e^(ref - logp)) / 3 = 0.5 * [0.6321206, -1.7182818, 0] / 3
        close(g_lp, [[-1 / 3 + 0.1053534, 1 / 3 - 0.2863803, -2 / 3]])
        close(g_ent, [[-0.01 / 3] * 3])
        for g in (g_old, g_ref, g_adv):
            close(g, np.zeros((1, 3)))

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_numpy_reference_on_random_data(self):
        rng = np.random.default_rng(0)
        B, L = 5, 9
        old = rng.normal(-1.5, 0.5, (B, L))
        logp = old + rng.normal(0.0, 0.3, (B, L))
        adv = rng.normal(0.0, 1.0, (B, L))
        mask = (rng.random((B, L)) < 0.6).astype(np.float32)
        mask[2] = 0  # a sequence with no masked tokens
        r = np.exp(logp - old)
        lo, hi = 0.8, 1.28
        tok = np.maximum(-adv * r, -adv * np.clip(r, lo, hi))
        n_b = mask.sum(1)
        has = n_b > 0
        want = {
            "token_mean": (tok * mask).sum() / mask.sum(),
            "seq_mean_token_mean": ((tok * mask).sum(1)[has] / n_b[has]).mean(),
            "seq_mean_token_sum": (tok * mask).sum(1)[has].mean(),
            "seq_mean_token_sum_norm": (tok * mask).sum() / (B * L),
        }
        assert set(want) == set(AGG_MODES)
        clipped = ((adv > 0) & (r > hi)) | ((adv < 0) & (r < lo))
        for agg, value in want.items():
            cfg = PPOConfig(clip_low=0.2, clip_high=0.28, agg=agg)
            fn = self.variant(
                jax.value_and_grad(lambda lp, c=cfg: policy_loss(lp, f32(old), f32(adv), f32(mask), config=c)[0])
            )
            loss, g = fn(f32(logp))
            close(loss, value)
            # the gradient is -A * r * (weight of the token in the aggregate), 0 where clipped
            weight = {
                "token_mean": mask / mask.sum(),
                "seq_mean_token_mean": mask / np.maximum(n_b, 1)[:, None] / has.sum(),
                "seq_mean_token_sum": mask / has.sum(),
                "seq_mean_token_sum_norm": mask / (B * L),
            }[agg]
            close(g, np.where(clipped, 0.0, -adv * r * weight))


def test_garbage_outside_the_mask_never_leaks():
    """nan / inf in every input off the mask: same loss, metrics and gradient as clean zeros."""
    rng = np.random.default_rng(1)
    shape = (3, 5)
    mask = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 0]], np.float32)
    clean = [rng.normal(-1, 0.3, shape) for _ in range(3)] + [rng.normal(0, 1, shape), rng.random(shape)]
    dirty = [np.where(mask > 0, x, v) for x, v in zip(clean, (np.nan, -np.inf, np.inf, np.nan, np.inf))]
    cfg = PPOConfig(kl_coef=0.1, entropy_coef=0.01, dual_clip=3.0, agg="seq_mean_token_mean")

    def f(lp, old, ref, adv, ent):
        return policy_loss(lp, old, adv, f32(mask), config=cfg, ref_logp_BL=ref, entropy_BL=ent)

    vg = jax.jit(jax.value_and_grad(f, argnums=(0, 4), has_aux=True))
    (l1, m1), g1 = vg(*map(f32, clean))
    (l2, m2), g2 = vg(*map(f32, dirty))
    chex.assert_tree_all_finite((l2, m2, g2))
    chex.assert_trees_all_close((l1, m1, g1), (l2, m2, g2), atol=1e-6)
    for x in g2:
        close(np.where(mask > 0, 0.0, x), np.zeros(shape))


def test_empty_mask_gives_zeros_not_nan():
    z = f32(np.zeros((2, 3)))
    cfg = PPOConfig(kl_coef=0.1, entropy_coef=0.1)
    vg = jax.jit(
        jax.value_and_grad(lambda lp, *a: policy_loss(lp, *a, config=cfg, ref_logp_BL=z, entropy_BL=z), has_aux=True)
    )
    (loss, m), g = vg(z - 1, z - 2, z + 1, z)
    chex.assert_tree_all_finite((loss, m, g))
    close(loss, 0.0)
    close(m["clip_frac"], 0.0)
    close(m["num_tokens"], 0.0)
    for k in ("ratio_mean", "ratio_min", "ratio_max"):
        close(m[k], 1.0)
    close(g, np.zeros((2, 3)))
    assert float(sft_loss(z, z)[0]) == 0.0


def test_config_is_a_static_jit_argument():
    logp, old, adv, mask = ppo_case()
    jitted = jax.jit(policy_loss, static_argnames="config")
    for cfg in (PPOConfig(), PPOConfig(clip_high=0.28), PPOConfig()):  # hashable; equal configs share a cache entry
        loss, _ = jitted(logp, old, adv, mask, config=cfg)
        assert np.isfinite(float(loss))
    assert hash(PPOConfig()) == hash(PPOConfig())


def test_ppo_gradient_at_ratio_one_is_the_policy_gradient():
    """With old = logp (the first PPO step) the PPO gradient w.r.t. the policy's parameters is
    the REINFORCE gradient of -mean(A * logp) (+ the entropy bonus's). The policy is the models'
    log-prob head (`logprobs_from_hidden`, as `token_logprobs` uses it) on learnable hidden
    states and unembedding, scored next-token and shifted so entry t scores token t."""
    from jaxagent.models import logprobs_from_hidden, next_token_targets

    rng = np.random.default_rng(0)
    B, L, D, V = 2, 7, 8, 16
    params = {"h": f32(rng.normal(size=(B, L, D))), "w": f32(rng.normal(size=(D, V)))}
    tokens = jnp.asarray(rng.integers(0, V, (B, L)), jnp.int32)
    mask = f32([[0, 0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0]])
    adv = f32(rng.normal(size=(B, L)))

    def scored(p):
        lp, ent = logprobs_from_hidden(p["h"], p["w"], next_token_targets(tokens), chunk_size=3, return_entropy=True)
        pad = jnp.zeros((B, 1), jnp.float32)
        return jnp.concatenate([pad, lp[:, :-1]], 1), jnp.concatenate([pad, ent[:, :-1]], 1)

    old = jax.lax.stop_gradient(scored(params)[0])
    ppo = PPOConfig(entropy_coef=0.01)

    def loss_ppo(p):
        lp, ent = scored(p)
        return policy_loss(lp, old, adv, mask, config=ppo, entropy_BL=ent)[0]

    def loss_pg(p):
        lp, ent = scored(p)
        return -jnp.sum(adv * lp * mask) / mask.sum() - 0.01 * jnp.sum(ent * mask) / mask.sum()

    g_ppo, g_pg = jax.jit(lambda p: (jax.grad(loss_ppo)(p), jax.grad(loss_pg)(p)))(params)
    chex.assert_trees_all_close(g_ppo, g_pg, atol=1e-6, rtol=1e-5)
    assert float(jnp.abs(g_ppo["w"]).max()) > 1e-3


# ----------------------------------------------------------------------------- aggregation
# x = [[1, 2, 3, 4], [5, 6, 0, 0], [7, 7, 7, 7]], mask = [[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
# masked tokens 1, 2, 3 | none | 7: sum 13 over 4 tokens; sequence 1 has none and is excluded.
AGG_X = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0]]
AGG_M = [[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
AGG_WANT = {
    "token_mean": 13 / 4,  # 3.25
    "seq_mean_token_mean": (6 / 3 + 7 / 1) / 2,  # 4.5
    "seq_mean_token_sum": (6 + 7) / 2,  # 6.5
    "seq_mean_token_sum_norm": 13 / (3 * 4),  # 1.0833333: every row counts, normaliser B * L
}


class TestAggregate(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_values_on_ragged_mask(self):
        for agg, want in AGG_WANT.items():
            fn = self.variant(lambda x, m, a=agg: aggregate(x, m, a))
            close(fn(f32(AGG_X), f32(AGG_M)), want)
        fn = self.variant(lambda x, m: aggregate(x, m, "seq_mean_token_sum_norm", norm_length=2))
        close(fn(f32(AGG_X), f32(AGG_M)), 13 / (3 * 2))

    @chex.variants(with_jit=True, without_jit=True)
    def test_empty_mask_and_bool_mask(self):
        for agg in AGG_MODES:
            fn = self.variant(lambda x, m, a=agg: aggregate(x, m, a))
            close(fn(f32(AGG_X), jnp.zeros((3, 4), bool)), 0.0)
            close(fn(f32(AGG_X), jnp.asarray(AGG_M, bool)), AGG_WANT[agg])

    @chex.variants(with_jit=True, without_jit=True)
    def test_entropy_bonus_and_kl_loss_aggregate(self):
        fn = self.variant(lambda x, m: entropy_bonus(x, m, agg="seq_mean_token_mean"))
        close(fn(f32(AGG_X), f32(AGG_M)), 4.5)
        # k1 of logp = x vs ref = 0 is x itself
        fn = self.variant(lambda x, m: kl_loss(x, jnp.zeros_like(x), m, estimator="k1", agg="seq_mean_token_sum"))
        close(fn(f32(AGG_X), f32(AGG_M)), 6.5)


# ----------------------------------------------------------------------------- KL estimators
# logp = [-1, -2, -0.5], ref = [-2, -1, -0.5]: x = ref - logp = [-1, 1, 0]
KL_LOGP = [[-1.0, -2.0, -0.5]]
KL_REF = [[-2.0, -1.0, -0.5]]
KL_WANT = {
    "k1": [[1.0, -1.0, 0.0]],  # logp - ref
    "k2": [[0.5, 0.5, 0.0]],  # (logp - ref)^2 / 2
    "k3": [[0.3678794, 0.7182818, 0.0]],  # e^x - x - 1: e^-1 + 1 - 1, e - 1 - 1, 0
}
KL_GRAD = {  # d kl / d logp
    "k1": [[1.0, 1.0, 1.0]],
    "k2": [[1.0, -1.0, 0.0]],  # logp - ref
    "k3": [[0.6321206, -1.7182818, 0.0]],  # 1 - e^x
}


class TestKL(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_values_and_gradients(self):
        mask = f32([[1, 1, 1]])
        for est in ("k1", "k2", "k3"):
            fn = self.variant(lambda lp, r, e=est: kl_estimate(lp, r, mask, estimator=e))
            close(fn(f32(KL_LOGP), f32(KL_REF)), KL_WANT[est])
            g_lp, g_ref = jax.grad(lambda lp, r, f=fn: jnp.sum(f(lp, r)), argnums=(0, 1))(f32(KL_LOGP), f32(KL_REF))
            close(g_lp, KL_GRAD[est])
            close(g_ref, np.zeros((1, 3)))

    @chex.variants(with_jit=True, without_jit=True)
    def test_penalty_is_coef_times_kl_without_gradient(self):
        mask = f32([[1, 1, 0]])
        fn = self.variant(lambda lp, r: kl_penalty(lp, r, mask, coef=0.1))  # default estimator k1
        close(fn(f32(KL_LOGP), f32(KL_REF)), [[0.1, -0.1, 0.0]])
        fn = self.variant(lambda lp, r: kl_penalty(lp, r, mask, coef=0.1, estimator="k3"))
        close(fn(f32(KL_LOGP), f32(KL_REF)), [[0.03678794, 0.07182818, 0.0]])
        g = jax.grad(lambda lp: jnp.sum(kl_penalty(lp, f32(KL_REF), mask, coef=0.1)))(f32(KL_LOGP))
        close(g, np.zeros((1, 3)))
        # subtracting it from per-token rewards
        rewards = f32([[0.0, 0.0, 1.0]])
        close(rewards - fn(f32(KL_LOGP), f32(KL_REF)), [[-0.03678794, -0.07182818, 1.0]])

    def test_clamped_log_ratio_never_overflows(self):
        kl = kl_estimate(f32([[-200.0, 0.0]]), f32([[0.0, -200.0]]), f32([[1, 1]]), estimator="k3")
        chex.assert_tree_all_finite(kl)
        close(kl, [[math.expm1(20.0) - 20.0, math.expm1(-20.0) + 20.0]], atol=1e3)

    def test_estimators_are_unbiased_and_k3_has_lower_variance(self):
        """Samples y ~ p: mean(k1) and mean(k3) both estimate KL(p || q); var(k3) < var(k1)."""
        rng = np.random.default_rng(0)
        p = np.array([0.5, 0.3, 0.15, 0.05])
        q = np.array([0.4, 0.35, 0.15, 0.1])
        true_kl = float(np.sum(p * np.log(p / q)))  # 0.0389..
        y = rng.choice(4, size=(200, 1000), p=p)
        logp, ref = f32(np.log(p)[y]), f32(np.log(q)[y])
        mask = f32(np.ones(y.shape))
        k1 = np.asarray(kl_estimate(logp, ref, mask, estimator="k1"), np.float64)
        k3 = np.asarray(kl_estimate(logp, ref, mask, estimator="k3"), np.float64)
        close(k1.mean(), true_kl, atol=3e-3)
        close(k3.mean(), true_kl, atol=3e-3)
        assert k3.var() < 0.5 * k1.var()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-30.0, 0.0, width=32), min_size=1, max_size=12),
    st.lists(st.floats(-30.0, 0.0, width=32), min_size=1, max_size=12),
)
def test_k3_is_nonnegative_and_zero_iff_equal(a, b):
    n = min(len(a), len(b))
    logp = np.array(a[:n], np.float32)[None]
    ref = np.array(b[:n], np.float32)[None]
    ref[0, ::2] = logp[0, ::2]  # half the entries equal
    k3 = np.asarray(kl_estimate(f32(logp), f32(ref), f32(np.ones((1, n))), estimator="k3"))
    assert np.all(k3 >= 0)
    equal = logp == ref
    assert np.all(k3[equal] == 0)
    far = np.abs(logp - ref) >= 1e-3
    assert np.all(k3[far] > 0)


# ----------------------------------------------------------------------------- DPO / IPO
# policy chosen/rejected = [-1, -3] / [-2, -1]; reference chosen/rejected = [-1.5, -2] / [-1.5, -2]
# logits = (pc - pr) - (rc - rr) = [1, -2] - [0, 0] = [1, -2]; beta = 0.5 -> beta * logits = [0.5, -1]
DPO_IN = ([-1.0, -3.0], [-2.0, -1.0], [-1.5, -2.0], [-1.5, -2.0])


class TestDPO(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_sigmoid_hand_values_metrics_and_gradient(self):
        # -log sigmoid(0.5) = 0.4740770, -log sigmoid(-1) = 1.3132617 -> mean 0.8936693
        fn = self.variant(jax.value_and_grad(lambda *a: dpo_loss(*a, beta=0.5), argnums=(0, 1, 2, 3), has_aux=True))
        (loss, m), (g_pc, g_pr, g_rc, g_rr) = fn(*map(f32, DPO_IN))
        close(loss, (0.4740770 + 1.3132617) / 2)
        # rewards chosen = 0.5 * (pc - rc) = [0.25, -0.5]; rejected = 0.5 * (pr - rr) = [-0.25, 0.5]
        close(m["rewards_chosen"], -0.125)
        close(m["rewards_rejected"], 0.125)
        close(m["reward_margin"], -0.25)  # mean of [0.5, -1]
        close(m["reward_accuracy"], 0.5)
        close(m["logp_chosen"], -2.0)
        close(m["logp_rejected"], -1.5)
        close(m["logits"], -0.5)
        # d/dpc = -beta * sigmoid(-beta * logits) / B: -0.5 * [0.3775407, 0.7310586] / 2
        close(g_pc, [-0.0943852, -0.1827646])
        close(g_pr, [0.0943852, 0.1827646])
        close(g_rc, [0.0, 0.0])
        close(g_rr, [0.0, 0.0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_label_smoothing(self):
        # pair 1: 0.9 * 0.4740770 + 0.1 * 0.9740770 = 0.5240770 (-log sigmoid(-0.5) = 0.9740770)
        # pair 2: 0.9 * 1.3132617 + 0.1 * 0.3132617 = 1.2132617 (-log sigmoid(1) = 0.3132617)
        fn = self.variant(lambda *a: dpo_loss(*a, beta=0.5, label_smoothing=0.1)[0])
        close(fn(*map(f32, DPO_IN)), (0.5240770 + 1.2132617) / 2)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ipo_hand_values_and_gradient(self):
        # (logits - 1 / (2 * 0.5))^2 = [(1 - 1)^2, (-2 - 1)^2] = [0, 9] -> 4.5
        fn = self.variant(
            jax.value_and_grad(lambda *a: dpo_loss(*a, beta=0.5, loss_type="ipo"), argnums=(0, 2), has_aux=True)
        )
        (loss, m), (g_pc, g_rc) = fn(*map(f32, DPO_IN))
        close(loss, 4.5)
        close(m["reward_accuracy"], 0.5)
        close(g_pc, [0.0, -3.0])  # 2 * (logits - 1) / B
        close(g_rc, [0.0, 0.0])
        # beta = 0.25: target margin 2 -> [(1 - 2)^2, (-2 - 2)^2] = [1, 16] -> 8.5
        close(dpo_loss(*map(f32, DPO_IN), beta=0.25, loss_type="ipo")[0], 8.5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_sequence_logp(self):
        logp = f32([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0], [-1.0, np.nan, -0.5]])
        mask = f32([[1, 1, 0], [0, 0, 0], [1, 0, 1]])
        close(self.variant(sequence_logp)(logp, mask), [-3.0, 0.0, -1.5])
        close(self.variant(lambda lp, m: sequence_logp(lp, m, average=True))(logp, mask), [-1.5, 0.0, -0.75])

    def test_traced_beta(self):
        loss = jax.jit(lambda b, *a: dpo_loss(*a, beta=b)[0])(f32(0.5), *map(f32, DPO_IN))
        close(loss, (0.4740770 + 1.3132617) / 2)


# ----------------------------------------------------------------------------- SFT
# logp = [[-1, -2, -3], [-4, -5, -6], [-7, -8, -9]], mask = [[1, 1, 0], [0, 0, 1], [0, 0, 0]]
# masked nll 1, 2 | 6 | none: token mean 9 / 3 = 3; seq mean (1.5 + 6) / 2 = 3.75 (row 2 excluded)
SFT_LOGP = [[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0], [-7.0, -8.0, -9.0]]
SFT_MASK = [[1, 1, 0], [0, 0, 1], [0, 0, 0]]


class TestSFT(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_values_and_gradient(self):
        fn = self.variant(jax.value_and_grad(lambda lp: sft_loss(lp, f32(SFT_MASK)), has_aux=True))
        (loss, m), g = fn(f32(SFT_LOGP))
        close(loss, 3.0)
        close(m["nll"], 3.0)
        close(m["ppl"], 20.0855369)  # e^3
        close(m["num_tokens"], 3.0)
        close(m["num_seqs"], 2.0)
        close(g, -np.array(SFT_MASK) / 3)

        fn = self.variant(jax.value_and_grad(lambda lp: sft_loss(lp, f32(SFT_MASK), agg="seq_mean_token_mean")[0]))
        loss, g = fn(f32(SFT_LOGP))
        close(loss, 3.75)
        close(g, [[-0.25, -0.25, 0.0], [0.0, 0.0, -0.5], [0.0, 0.0, 0.0]])  # -1 / (n_b * 2)


# ----------------------------------------------------------------------------- config errors
@pytest.mark.parametrize(
    "field, value",
    [
        ("clip_low", -0.1),
        ("clip_low", 1.0),
        ("clip_low", "0.2"),
        ("clip_high", -0.2),
        ("clip_high", float("nan")),
        ("dual_clip", 1.0),
        ("dual_clip", 0.5),
        ("agg", "seq_mean"),
        ("norm_length", 0),
        ("norm_length", 2.5),
        ("kl_coef", -0.1),
        ("kl_estimator", "k4"),
        ("entropy_coef", -0.01),
        ("entropy_coef", True),
        ("max_log_ratio", 0.0),
    ],
)
def test_ppo_config_errors_name_field_value_and_expected(field, value):
    with pytest.raises(ConfigError, match=field) as e:
        PPOConfig(**{field: value})
    assert repr(value) in str(e.value) and "expected" in str(e.value)


def test_missing_reference_or_entropy_is_an_error():
    logp, old, adv, mask = ppo_case()
    with pytest.raises(ConfigError, match="kl_coef=0.1: expected ref_logp_BL"):
        policy_loss(logp, old, adv, mask, config=PPOConfig(kl_coef=0.1))
    with pytest.raises(ConfigError, match="entropy_coef=0.01: expected entropy_BL"):
        policy_loss(logp, old, adv, mask, config=PPOConfig(entropy_coef=0.01))
    with pytest.raises(ValueError, match="expected all equal"):
        policy_loss(logp, old[:, :3], adv, mask, config=PPOConfig())


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"beta": 0.0}, "beta"),
        ({"beta": -1.0}, "beta"),
        ({"loss_type": "hinge"}, "loss_type"),
        ({"label_smoothing": 0.5}, "label_smoothing"),
        ({"label_smoothing": -0.1}, "label_smoothing"),
        ({"loss_type": "ipo", "label_smoothing": 0.1}, "label_smoothing"),
    ],
)
def test_dpo_errors(kwargs, field):
    with pytest.raises(ConfigError, match=field) as e:
        dpo_loss(*map(f32, DPO_IN), **kwargs)
    assert "expected" in str(e.value)


def test_other_errors():
    x, m = f32(AGG_X), f32(AGG_M)
    with pytest.raises(ConfigError, match="agg='mean': expected one of"):
        aggregate(x, m, "mean")
    with pytest.raises(ConfigError, match="agg='sum'"):
        sft_loss(x, m, agg="sum")
    with pytest.raises(ConfigError, match="estimator='kl'"):
        kl_estimate(x, x, m, estimator="kl")
    with pytest.raises(ConfigError, match="coef=-1.0"):
        kl_penalty(x, x, m, coef=-1.0)
    with pytest.raises(ValueError, match="rank 1"):
        dpo_loss(x, x, x, x)

"""Policy-gradient, KL, entropy, DPO and SFT losses (pure ``jax.numpy``, jit-able).

Shapes: B sequences, L tokens. Every per-token input is ``[B, L]`` float32 and aligned so that
entry ``t`` scores token ``t`` (``jaxagent.models.token_logprobs`` scores the *next* token at
entry ``t``; callers shift). ``mask_BL`` marks the tokens that are trained (the agent's tokens);
any nonzero entry counts as 1. Entries outside the mask never reach a loss, a metric or a
gradient, even when they hold ``nan`` or ``inf`` (they are replaced before any arithmetic).

Conventions:

- Configs are frozen dataclasses validated on construction (`ConfigError` naming the field, the
  value and what was expected); pass them as static arguments to ``jax.jit``.
- Losses are minimised. Each loss returns ``(loss, metrics)``, ``metrics`` a flat dict of float32
  scalars computed under ``stop_gradient``.
- Gradients flow only through the current policy's ``logp_BL`` (and ``entropy_BL``, which is a
  function of the current policy): old log-probs, reference log-probs and advantages are wrapped
  in ``stop_gradient``.
- Metrics that describe tokens (clip fractions, ratios, KLs, entropy, advantage) are token means
  over the masked tokens of the batch, whatever the loss aggregation; an empty mask gives 0 losses
  and 0 metrics (ratio statistics 1), never ``nan``.

Aggregation modes (`aggregate`), for a per-token quantity ``x_BL``:

- ``token_mean``: sum of ``x`` over all masked tokens / their number (DAPO, the GRPO default here).
- ``seq_mean_token_mean``: mean over sequences with at least one masked token of each sequence's
  token mean (the original GRPO). Sequences without masked tokens are excluded.
- ``seq_mean_token_sum``: mean over sequences with at least one masked token of each sequence's
  token sum.
- ``seq_mean_token_sum_norm``: sum over all masked tokens / (B * ``norm_length``), ``norm_length``
  defaulting to L (Dr. GRPO: a constant normaliser, so every row counts, empty ones too).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, get_args

import jax
import jax.numpy as jnp

from jaxagent.models.config import ConfigError

Agg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]
DPOLossType = Literal["sigmoid", "ipo"]

AGG_MODES: tuple[str, ...] = get_args(Agg)
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
DPO_LOSS_TYPES: tuple[str, ...] = get_args(DPOLossType)

Metrics = dict[str, jax.Array]


# ----------------------------------------------------------------------------- validation helpers
def _require(cond: bool, field: str, value: object, expected: str) -> None:
    if not cond:
        raise ConfigError(f"{field}={value!r}: expected {expected}")


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_agg(agg: object, field: str = "agg") -> None:
    _require(agg in AGG_MODES, field, agg, f"one of {AGG_MODES}")


def _check_estimator(estimator: object, field: str = "kl_estimator") -> None:
    _require(estimator in KL_ESTIMATORS, field, estimator, f"one of {KL_ESTIMATORS}")


def _check_shapes(**arrays: jax.Array | None) -> None:
    shapes = {k: tuple(jnp.shape(v)) for k, v in arrays.items() if v is not None}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"shapes {shapes}: expected all equal and of rank 2 [B, L]")


# ----------------------------------------------------------------------------- config
@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Token-level PPO objective (hashable: a static ``jax.jit`` argument).

    - ``clip_low``, ``clip_high``: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``;
      ``clip_high > clip_low`` is DAPO's "clip-higher". ``0 <= clip_low < 1``, ``clip_high >= 0``.
    - ``dual_clip``: ``None`` (off) or ``c > 1``: for negative advantages the token loss is
      capped at ``-A * c`` (Ye et al. 2020), so huge ratios on bad tokens stop pushing.
    - ``agg``: loss aggregation (module docstring); ``norm_length`` only for
      ``seq_mean_token_sum_norm`` (``None``: L).
    - ``kl_coef`` >= 0 with ``kl_estimator`` k1/k2/k3: a KL-to-reference loss term (needs
      ``ref_logp_BL``). For KL as a reward penalty use `kl_penalty` instead and leave this 0.
    - ``entropy_coef`` >= 0: entropy bonus (needs ``entropy_BL``); the loss subtracts it.
    - ``max_log_ratio`` > 0: log-ratios (PPO and KL) are clamped to ``[-max, max]`` before
      ``exp`` (no overflow; zero gradient beyond, as verl does).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    agg: Agg = "token_mean"
    norm_length: int | None = None
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    entropy_coef: float = 0.0
    max_log_ratio: float = 20.0

    def __post_init__(self) -> None:
        _require(_is_real(self.clip_low) and 0 <= self.clip_low < 1, "clip_low", self.clip_low, "a number in [0, 1)")
        _require(_is_real(self.clip_high) and self.clip_high >= 0, "clip_high", self.clip_high, "a number >= 0")
        _require(
            self.dual_clip is None or (_is_real(self.dual_clip) and self.dual_clip > 1),
            "dual_clip", self.dual_clip, "None or a number > 1",
        )  # fmt: skip
        _check_agg(self.agg)
        _require(
            self.norm_length is None
            or (isinstance(self.norm_length, int) and not isinstance(self.norm_length, bool) and self.norm_length > 0),
            "norm_length", self.norm_length, "None or a positive int",
        )  # fmt: skip
        _require(_is_real(self.kl_coef) and self.kl_coef >= 0, "kl_coef", self.kl_coef, "a number >= 0")
        _check_estimator(self.kl_estimator)
        _require(
            _is_real(self.entropy_coef) and self.entropy_coef >= 0, "entropy_coef", self.entropy_coef, "a number >= 0"
        )
        _require(
            _is_real(self.max_log_ratio) and self.max_log_ratio > 0, "max_log_ratio", self.max_log_ratio, "a number > 0"
        )


# ----------------------------------------------------------------------------- masking and aggregation
def _mask(mask_BL: jax.Array) -> jax.Array:
    return jnp.asarray(mask_BL) != 0


def _masked(x_BL: jax.Array, m_BL: jax.Array) -> jax.Array:
    """``x`` on the mask, 0 elsewhere (via ``where``, so nan/inf outside the mask never leak)."""
    return jnp.where(m_BL, jnp.asarray(x_BL, jnp.float32), 0.0)


def _safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
    return num / jnp.maximum(den, 1.0)


def masked_mean(x_BL: jax.Array, mask_BL: jax.Array) -> jax.Array:
    """Mean of ``x_BL`` over all masked tokens of the batch: float32 scalar (0 if none)."""
    m = _mask(mask_BL)
    return _safe_div(jnp.sum(_masked(x_BL, m)), jnp.sum(m, dtype=jnp.float32))


def aggregate(
    x_BL: jax.Array, mask_BL: jax.Array, agg: Agg = "token_mean", *, norm_length: int | None = None
) -> jax.Array:
    """Reduces a per-token quantity ``x_BL`` [B, L] to a float32 scalar over ``mask_BL`` [B, L].

    Modes are described in the module docstring. An empty mask gives 0.
    """
    _check_agg(agg)
    m = _mask(mask_BL)
    x = _masked(x_BL, m)
    if agg == "token_mean":
        return _safe_div(jnp.sum(x), jnp.sum(m, dtype=jnp.float32))
    if agg == "seq_mean_token_sum_norm":
        B, L = m.shape
        return jnp.sum(x) / (B * (norm_length if norm_length is not None else L))
    n_B = jnp.sum(m, axis=-1, dtype=jnp.float32)
    seq_B = jnp.sum(x, axis=-1)
    if agg == "seq_mean_token_mean":
        seq_B = _safe_div(seq_B, n_B)
    has_B = n_B > 0
    return _safe_div(jnp.sum(jnp.where(has_B, seq_B, 0.0)), jnp.sum(has_B, dtype=jnp.float32))


# ----------------------------------------------------------------------------- KL and entropy
def kl_estimate(
    logp_BL: jax.Array,
    ref_logp_BL: jax.Array,
    mask_BL: jax.Array,
    *,
    estimator: KLEstimator = "k3",
    max_log_ratio: float = 20.0,
) -> jax.Array:
    """Per-token estimate of KL(pi || pi_ref) on tokens sampled from pi: float32 [B, L], 0 off the mask.

    With ``x = ref_logp - logp`` (clamped to ``[-max_log_ratio, max_log_ratio]``):
    ``k1 = -x = logp - ref_logp`` (unbiased, can be negative), ``k2 = x**2 / 2``,
    ``k3 = exp(x) - x - 1`` (unbiased, >= 0, low variance; Schulman 2020), computed as
    ``expm1(x) - x``. The gradient flows through ``logp_BL`` only.
    """
    _check_estimator(estimator, "estimator")
    _check_shapes(logp_BL=logp_BL, ref_logp_BL=ref_logp_BL, mask_BL=mask_BL)
    m = _mask(mask_BL)
    logp = _masked(logp_BL, m)
    ref = _masked(jax.lax.stop_gradient(ref_logp_BL), m)
    x = jnp.clip(ref - logp, -max_log_ratio, max_log_ratio)
    if estimator == "k1":
        kl = -x
    elif estimator == "k2":
        kl = 0.5 * jnp.square(x)
    else:
        kl = jnp.maximum(jnp.expm1(x) - x, 0.0)  # exact >= 0 despite rounding
    return jnp.where(m, kl, 0.0)


def kl_penalty(
    logp_BL: jax.Array,
    ref_logp_BL: jax.Array,
    mask_BL: jax.Array,
    *,
    coef: float = 1.0,
    estimator: KLEstimator = "k1",
    max_log_ratio: float = 20.0,
) -> jax.Array:
    """KL as a reward penalty: ``coef * kl_estimate(...)``, float32 [B, L], 0 off the mask, no gradient.

    Subtract it from per-token rewards (or advantages) before credit assignment; ``logp_BL`` is
    then the rollout policy's log-probs (the stored old log-probs). k1 is the usual choice here
    (InstructGPT); k3 is available.
    """
    if isinstance(coef, (int, float)):
        _require(_is_real(coef) and coef >= 0, "coef", coef, "a number >= 0")
    kl = kl_estimate(logp_BL, ref_logp_BL, mask_BL, estimator=estimator, max_log_ratio=max_log_ratio)
    return jax.lax.stop_gradient(coef * kl)


def kl_loss(
    logp_BL: jax.Array,
    ref_logp_BL: jax.Array,
    mask_BL: jax.Array,
    *,
    estimator: KLEstimator = "k3",
    agg: Agg = "token_mean",
    norm_length: int | None = None,
    max_log_ratio: float = 20.0,
) -> jax.Array:
    """KL(pi || pi_ref) as a loss term: `aggregate` of `kl_estimate` (float32 scalar, uncoefficiented)."""
    kl = kl_estimate(logp_BL, ref_logp_BL, mask_BL, estimator=estimator, max_log_ratio=max_log_ratio)
    return aggregate(kl, mask_BL, agg, norm_length=norm_length)


def entropy_bonus(
    entropy_BL: jax.Array, mask_BL: jax.Array, *, agg: Agg = "token_mean", norm_length: int | None = None
) -> jax.Array:
    """Aggregated per-token entropy (from ``token_logprobs(..., return_entropy=True)``): scalar.

    A loss *subtracts* ``entropy_coef * entropy_bonus(...)``; the gradient flows through
    ``entropy_BL``.
    """
    return aggregate(entropy_BL, mask_BL, agg, norm_length=norm_length)


# ----------------------------------------------------------------------------- PPO
def ppo_token_loss(
    logp_BL: jax.Array,
    old_logp_BL: jax.Array,
    advantages_BL: jax.Array,
    mask_BL: jax.Array,
    *,
    config: PPOConfig,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token clipped surrogate loss [B, L] float32 (0 off the mask) and per-token indicators.

    ``ratio = exp(logp - old_logp)``; ``loss = max(-A * ratio, -A * clip(ratio, 1 - lo, 1 + hi))``,
    written as a ``where`` on the clipped region so that the gradient is ``-A * ratio`` (w.r.t.
    ``logp``) where the ratio is inside the band or moving back toward it, and exactly 0 where
    the clip is active: ``A > 0 and ratio > 1 + hi`` (``clip_high``) or ``A < 0 and ratio < 1 - lo``
    (``clip_low``); a ratio on the boundary counts as unclipped. With ``dual_clip = c``, tokens
    with ``A < 0`` and ``ratio > c`` get the constant loss ``-A * c`` (``dual``).

    Returns ``(loss_BL, {"ratio", "log_ratio", "clip_low", "clip_high", "dual"})``: the ratio and
    the clamped log-ratio float32 [B, L] (1 and 0 off the mask), indicators bool [B, L] restricted
    to the mask.
    """
    _check_shapes(logp_BL=logp_BL, old_logp_BL=old_logp_BL, advantages_BL=advantages_BL, mask_BL=mask_BL)
    m = _mask(mask_BL)
    logp = _masked(logp_BL, m)
    old = _masked(jax.lax.stop_gradient(old_logp_BL), m)
    adv = _masked(jax.lax.stop_gradient(advantages_BL), m)
    log_ratio = jnp.clip(logp - old, -config.max_log_ratio, config.max_log_ratio)
    ratio = jnp.exp(log_ratio)
    lo, hi = 1.0 - config.clip_low, 1.0 + config.clip_high
    clip_high = m & (adv > 0) & (ratio > hi)
    clip_low = m & (adv < 0) & (ratio < lo)
    loss = jnp.where(clip_high | clip_low, -adv * jnp.clip(ratio, lo, hi), -adv * ratio)
    dual = jnp.zeros_like(m)
    if config.dual_clip is not None:
        dual = m & (adv < 0) & (ratio > config.dual_clip)
        loss = jnp.where(dual, -adv * config.dual_clip, loss)
    loss = jnp.where(m, loss, 0.0)
    return loss, {"ratio": ratio, "log_ratio": log_ratio, "clip_low": clip_low, "clip_high": clip_high, "dual": dual}


def truncated_is_weights(
    prox_logp_BL: jax.Array, behaviour_logp_BL: jax.Array, mask_BL: jax.Array, *, cap: float,
    max_log_ratio: float = 20.0,
) -> tuple[jax.Array, jax.Array]:
    """Truncated importance weights of tokens sampled from a stale behaviour policy mu, for the
    decoupled PPO objective of asynchronous RL (the PPO ratio taken against the proximal policy,
    the weights the update starts from; this weight corrects from mu to it, Espeholt et al. 2018's
    truncation): ``w = min(exp(prox_logp - behaviour_logp), cap)``, the log-ratio clamped to
    ``[-max_log_ratio, max_log_ratio]`` first. Inputs [B, L] float32; ``cap`` > 0.

    Returns ``(w_BL, truncated_BL)``: float32 weights under ``stop_gradient`` (1 off the mask) and
    bool [B, L], the masked tokens whose weight the cap cut."""
    _require(_is_real(cap) and cap > 0, "cap", cap, "a number > 0")
    _check_shapes(prox_logp_BL=prox_logp_BL, behaviour_logp_BL=behaviour_logp_BL, mask_BL=mask_BL)
    m = _mask(mask_BL)
    sg = jax.lax.stop_gradient
    x = jnp.clip(_masked(sg(prox_logp_BL), m) - _masked(sg(behaviour_logp_BL), m), -max_log_ratio, max_log_ratio)
    raw = jnp.exp(x)
    w = jnp.where(m, jnp.minimum(raw, cap), 1.0)
    return w, m & (raw > cap)


def policy_loss(
    logp_BL: jax.Array,
    old_logp_BL: jax.Array,
    advantages_BL: jax.Array,
    mask_BL: jax.Array,
    *,
    config: PPOConfig,
    ref_logp_BL: jax.Array | None = None,
    entropy_BL: jax.Array | None = None,
    is_weight_BL: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
    """PPO/GRPO policy loss: clipped surrogate + ``kl_coef`` * KL(pi || ref) - ``entropy_coef`` * entropy.

    Inputs, all [B, L] float32: ``logp_BL`` (current policy; the only input with a gradient,
    besides ``entropy_BL``), ``old_logp_BL`` (stored at rollout), ``advantages_BL``, ``mask_BL``
    (trained tokens), optional ``ref_logp_BL`` (required when ``kl_coef > 0``) and ``entropy_BL``
    (required when ``entropy_coef > 0``). Each term is aggregated with ``config.agg``.

    Metrics (float32 scalars; token means over the mask): ``loss``, ``pg_loss``, ``clip_frac``
    (= ``clip_frac_low + clip_frac_high``: tokens whose gradient the clip zeroes),
    ``clip_frac_low``, ``clip_frac_high``, ``clip_frac_dual`` (0 without dual clip),
    ``approx_kl_k3`` (mean of ``ratio - 1 - log ratio``, KL(old || new)), ``approx_kl_k2`` (mean
    of ``(logp - old)**2 / 2``), ``ratio_mean``/``ratio_min``/``ratio_max`` (1 if the mask is
    empty), ``advantage_mean``, ``num_tokens``, ``num_seqs`` (sequences with a masked token); with
    a reference ``kl_ref`` (token mean of ``config.kl_estimator``) and ``kl_loss`` (the aggregated
    term); with entropy ``entropy`` (token mean) and ``entropy_loss`` (the aggregated term).

    ``is_weight_BL`` (optional, under ``stop_gradient``): a per-token importance weight multiplying
    the clipped surrogate's token loss before aggregation (`truncated_is_weights`: decoupled PPO,
    ``old_logp_BL`` then the proximal policy's); metric ``is_weight_mean``.
    """
    if config.kl_coef > 0 and ref_logp_BL is None:
        raise ConfigError(f"kl_coef={config.kl_coef!r}: expected ref_logp_BL to be given (or kl_coef=0)")
    if config.entropy_coef > 0 and entropy_BL is None:
        raise ConfigError(f"entropy_coef={config.entropy_coef!r}: expected entropy_BL to be given (or entropy_coef=0)")
    _check_shapes(
        logp_BL=logp_BL, old_logp_BL=old_logp_BL, advantages_BL=advantages_BL, mask_BL=mask_BL,
        ref_logp_BL=ref_logp_BL, entropy_BL=entropy_BL, is_weight_BL=is_weight_BL,
    )  # fmt: skip
    agg = {"agg": config.agg, "norm_length": config.norm_length}
    m = _mask(mask_BL)
    tok_loss, info = ppo_token_loss(logp_BL, old_logp_BL, advantages_BL, mask_BL, config=config)
    if is_weight_BL is not None:
        tok_loss = tok_loss * _masked(jax.lax.stop_gradient(is_weight_BL), m)
    pg_loss = aggregate(tok_loss, m, **agg)
    loss = pg_loss

    sg = jax.lax.stop_gradient
    n_tok = jnp.sum(m, dtype=jnp.float32)
    mean = lambda x: sg(masked_mean(x, m))
    ratio, log_ratio = sg(info["ratio"]), sg(info["log_ratio"])
    any_tok = n_tok > 0
    metrics: Metrics = {
        "pg_loss": sg(pg_loss),
        "clip_frac_low": mean(info["clip_low"]),
        "clip_frac_high": mean(info["clip_high"]),
        "clip_frac": mean(info["clip_low"] | info["clip_high"]),
        "clip_frac_dual": mean(info["dual"]),
        "approx_kl_k3": mean(jnp.expm1(log_ratio) - log_ratio),
        "approx_kl_k2": mean(0.5 * jnp.square(log_ratio)),
        "ratio_mean": jnp.where(any_tok, mean(ratio), 1.0),
        "ratio_min": jnp.where(any_tok, jnp.min(jnp.where(m, ratio, jnp.inf)), 1.0),
        "ratio_max": jnp.where(any_tok, jnp.max(jnp.where(m, ratio, -jnp.inf)), 1.0),
        "advantage_mean": mean(sg(advantages_BL)),
        "num_tokens": n_tok,
        "num_seqs": jnp.sum(jnp.any(m, axis=-1), dtype=jnp.float32),
    }
    if is_weight_BL is not None:
        metrics["is_weight_mean"] = jnp.where(any_tok, mean(is_weight_BL), 1.0)
    if ref_logp_BL is not None:
        kl_BL = kl_estimate(logp_BL, ref_logp_BL, m, estimator=config.kl_estimator, max_log_ratio=config.max_log_ratio)
        kl_term = aggregate(kl_BL, m, **agg)
        metrics["kl_ref"] = mean(kl_BL)
        metrics["kl_loss"] = sg(kl_term)
        if config.kl_coef > 0:
            loss = loss + config.kl_coef * kl_term
    if entropy_BL is not None:
        ent_term = entropy_bonus(entropy_BL, m, **agg)
        metrics["entropy"] = mean(entropy_BL)
        metrics["entropy_loss"] = sg(ent_term)
        if config.entropy_coef > 0:
            loss = loss - config.entropy_coef * ent_term
    metrics["loss"] = sg(loss)
    return loss, metrics


# ----------------------------------------------------------------------------- DPO
def sequence_logp(logp_BL: jax.Array, mask_BL: jax.Array, *, average: bool = False) -> jax.Array:
    """Summed log-prob of each sequence's masked tokens: float32 [B] (0 for an empty row).

    With ``average=True`` the mean over the masked tokens instead (length-normalised; 0 for an
    empty row), as some IPO implementations use.
    """
    _check_shapes(logp_BL=logp_BL, mask_BL=mask_BL)
    m = _mask(mask_BL)
    s = jnp.sum(_masked(logp_BL, m), axis=-1)
    return _safe_div(s, jnp.sum(m, axis=-1, dtype=jnp.float32)) if average else s


def dpo_loss(
    policy_chosen_logp_B: jax.Array,
    policy_rejected_logp_B: jax.Array,
    ref_chosen_logp_B: jax.Array,
    ref_rejected_logp_B: jax.Array,
    *,
    beta: float = 0.1,
    loss_type: DPOLossType = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """DPO (Rafailov et al. 2023) or IPO (Azar et al. 2023) loss over B preference pairs.

    Inputs are sequence log-probs [B] (`sequence_logp`). With
    ``logits = (pi_c - pi_r) - (ref_c - ref_r)``:

    - ``sigmoid``: ``-(1 - eps) * log sigmoid(beta * logits) - eps * log sigmoid(-beta * logits)``
      with ``eps = label_smoothing`` in [0, 0.5) (conservative DPO; 0 is plain DPO);
    - ``ipo``: ``(logits - 1 / (2 * beta))**2`` (label smoothing must be 0).

    The loss is the mean over the pairs; the gradient flows through the policy log-probs only.
    Metrics (float32 scalars, means over pairs): ``loss``, ``rewards_chosen`` (``beta * (pi_c -
    ref_c)``), ``rewards_rejected``, ``reward_margin`` (chosen - rejected), ``reward_accuracy``
    (share of pairs with chosen > rejected), ``logp_chosen``, ``logp_rejected``, ``logits``.
    ``beta`` > 0 is checked when it is a Python number (it may also be a traced scalar).
    """
    _require(loss_type in DPO_LOSS_TYPES, "loss_type", loss_type, f"one of {DPO_LOSS_TYPES}")
    if isinstance(beta, (int, float)):
        _require(_is_real(beta) and beta > 0, "beta", beta, "a number > 0")
    _require(
        _is_real(label_smoothing) and 0 <= label_smoothing < 0.5, "label_smoothing", label_smoothing,
        "a number in [0, 0.5)",
    )  # fmt: skip
    _require(
        loss_type != "ipo" or label_smoothing == 0, "label_smoothing", label_smoothing,
        "0 with loss_type='ipo'",
    )  # fmt: skip
    shapes = {
        k: tuple(jnp.shape(v))
        for k, v in {
            "policy_chosen_logp_B": policy_chosen_logp_B, "policy_rejected_logp_B": policy_rejected_logp_B,
            "ref_chosen_logp_B": ref_chosen_logp_B, "ref_rejected_logp_B": ref_rejected_logp_B,
        }.items()
    }  # fmt: skip
    if len(set(shapes.values())) != 1 or len(shapes["policy_chosen_logp_B"]) != 1:
        raise ValueError(f"shapes {shapes}: expected all equal and of rank 1 [B]")

    sg = jax.lax.stop_gradient
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    pc, pr = f32(policy_chosen_logp_B), f32(policy_rejected_logp_B)
    rc, rr = sg(f32(ref_chosen_logp_B)), sg(f32(ref_rejected_logp_B))
    logits = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        eps = label_smoothing
        losses = -(1.0 - eps) * jax.nn.log_sigmoid(beta * logits) - eps * jax.nn.log_sigmoid(-beta * logits)
    else:
        losses = jnp.square(logits - 1.0 / (2.0 * beta))
    loss = jnp.mean(losses)
    chosen = sg(beta * (pc - rc))
    rejected = sg(beta * (pr - rr))
    metrics: Metrics = {
        "loss": sg(loss),
        "rewards_chosen": jnp.mean(chosen),
        "rewards_rejected": jnp.mean(rejected),
        "reward_margin": jnp.mean(chosen - rejected),
        "reward_accuracy": jnp.mean((chosen > rejected).astype(jnp.float32)),
        "logp_chosen": sg(jnp.mean(pc)),
        "logp_rejected": sg(jnp.mean(pr)),
        "logits": sg(jnp.mean(logits)),
    }
    return loss, metrics


# ----------------------------------------------------------------------------- SFT
def sft_loss(
    logp_BL: jax.Array, mask_BL: jax.Array, *, agg: Agg = "token_mean", norm_length: int | None = None
) -> tuple[jax.Array, Metrics]:
    """Masked SFT cross-entropy: `aggregate` of ``-logp_BL`` over ``mask_BL`` (both [B, L]).

    Metrics (float32 scalars): ``loss``, ``nll`` (token mean of ``-logp``), ``ppl``
    (``exp(nll)``), ``num_tokens``, ``num_seqs``. An empty mask gives loss 0.
    """
    _check_agg(agg)
    _check_shapes(logp_BL=logp_BL, mask_BL=mask_BL)
    m = _mask(mask_BL)
    nll_BL = -_masked(logp_BL, m)
    loss = aggregate(nll_BL, m, agg, norm_length=norm_length)
    sg = jax.lax.stop_gradient
    nll = sg(masked_mean(nll_BL, m))
    metrics: Metrics = {
        "loss": sg(loss),
        "nll": nll,
        "ppl": jnp.exp(nll),
        "num_tokens": jnp.sum(m, dtype=jnp.float32),
        "num_seqs": jnp.sum(jnp.any(m, axis=-1), dtype=jnp.float32),
    }
    return loss, metrics


__all__ = [
    "AGG_MODES",
    "DPO_LOSS_TYPES",
    "KL_ESTIMATORS",
    "Agg",
    "DPOLossType",
    "KLEstimator",
    "PPOConfig",
    "aggregate",
    "dpo_loss",
    "entropy_bonus",
    "kl_estimate",
    "kl_loss",
    "kl_penalty",
    "masked_mean",
    "policy_loss",
    "ppo_token_loss",
    "sequence_logp",
    "sft_loss",
    "truncated_is_weights",
]

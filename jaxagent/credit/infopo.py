"""InfoPO's model-free pieces: turn-level information-gain advantages and the variance gate.

Shapes: B rollouts, L tokens, T action turns (padded), G groups.

`InfoPOTerm` is InfoPO's credit term (`jaxagent.credit.terms`):

    info_BL = beta_k * g * A_info      (A_info alone with ``use_ext=False``)

- ``A_info``: the per-turn information gain ``r_info(t)`` (computed by ``infogain``; credited to
  action t, the action that drew feedback o_t) group-normalised over **all valid turns of all
  rollouts of the group** (invalid turns are left out of the statistics, not counted as 0), then
  put on the agent tokens of action t. ``normalize_std=False`` is the paper's "w/o std" ablation:
  mean-centering only, ``r - mean_g`` (the InfoPO reference code does the same with
  ``norm_adv_by_std_in_grpo=False``).
- ``g``: the variance gate of the rollout's group, ``sigmoid(-std_g(R_ext) / T)`` (population
  std, so a group with equal rewards or a single member has g = 0.5, the largest value).
- ``beta_k = beta * exp(-beta_decay * k)`` at RL iteration k (the host input ``iteration``;
  ``beta_decay=0``: beta throughout).

Ablations: ``use_gate=False`` (g = 1), ``use_ext=False`` (A = A_info: the outcome term silenced and
no beta / gate weighting, as the reference code's intrinsic-only mode; a Faca term still adds),
``normalize_std=False`` (above), ``exclude_corrections=True`` (turns whose feedback the
environment marked a correction, e.g. a tool error or "ask one thing at a time", are not valid
turns: no gain, no statistic).

Group normalisation follows ``grpo``: population std, eps outside the sqrt, degenerate groups
(fewer than 2 valid entries or all equal) exactly 0, group ids in ``[0, B)``.

**The InfoPO reference code's choices** (kfq20/InfoPO, verl's ``compute_info_grpo_advantage``),
each selectable; defaults are the paper's (docs/CREDIT.md has the table):

- ``stat_unit="token"``: the gain of turn t is spread over its action's tokens as ``r_t / |a_t|``
  each, and the group statistics run over those tokens (each turn weighted by its length; a
  turn whose gain is exactly 0 is left out, as the code keeps only non-zero tokens); the default
  ``"turn"`` takes each turn once, as the paper states.
- ``std_ddof=1``: ``torch.std``'s n - 1 (in A_info's statistics and the gate, where a
  single-member group then has std 1, verl's convention); 0: the population std.
- ``magnitude_ratio=True``: the info advantage is scaled by ``min(1, max(std_ext, 1) / std_info)``,
  the stds over all agent tokens of the batch (``std_ddof`` applies; each + eps) of the outcome
  term as fused and of A_info on tokens: it only shrinks an info term whose spread exceeds the
  outcome's (or 1).
- ``gate_temperature``: the code's default is 0.05, its shipped yaml's 0.5 (ours: 0.5).
- ``beta_decay`` (above; the code's ``intrinsic_decay_rate`` per epoch, 0 in its yaml).
- the single-member group's outcome advantage A = R: ``GRPOConfig.singleton="reward"``, and the
  outcome's n - 1: ``GRPOConfig.std_ddof=1``.
- the code writes the placeholder over the observation at its length: ``placeholder_mode=
  "overwrite"``.

The counterfactual prior (``prior``): ``"placeholder"`` scores a_{t+1} with o_t replaced by the
``placeholder`` text (the paper's); ``"marginal"`` with the mixture over the replies o' the
environment could have given at that turn, ``log sum_o' p(o') pi(a_{t+1} | h, o')`` (the
estimator the paper's argument assumes; environments that enumerate their replies only:
`jaxagent.train.infogain.marginal_infogain`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import ClassVar, Literal

import chex
import jax
import jax.numpy as jnp

from jaxagent.credit.batch import infogain_valid_turns
from jaxagent.credit.grpo import (
    check_bool,
    check_ddof,
    check_eps,
    check_weight,
    gather_groups,
    gather_to_tokens,
    group_normalize,
    group_stats,
    in_range,
    safe_ratio,
)
from jaxagent.credit.terms import OUTCOME_TERM, CreditTerm, FuseContext

PLACEHOLDER_MODES = ("replace", "overwrite")
INFOGAIN_MODES = ("naive", "vmapped", "shared_prefix")
PRIORS = ("placeholder", "marginal")
STAT_UNITS = ("turn", "token")
#: The code of a correction in ``CreditBatch.feedback_kind_BT`` (1: information, 0: unmarked)
FEEDBACK_CORRECTION = 2


@dataclasses.dataclass(frozen=True)
class InfoPOConfig:
    """InfoPO settings (frozen: a static argument to ``jax.jit``).

    beta: weight of the info term (>= 0). gate_temperature: T of the variance gate (> 0).
    normalize_std: divide A_info by the group std (False: the "w/o std" ablation, centering only).
    normalize_by: "group" (InfoPO: each turn against every valid turn of its group) or
    "group_turn" (against the same turn index of the group's other rollouts only; removes the
    advantage that turn position alone gives, see ``normalize_turn_rewards``).
    use_gate: False sets g = 1. use_ext: False gives A = A_info (no outcome term).
    negative_weight: in [0, 1], the weight of the info term's negative entries (1: InfoPO as
    published; 0 keeps only the credit of turns that gained more information than their group's
    mean, the info term's analogue of ``GRPOConfig.negative_weight``).
    eps: added to the std in the A_info denominator (> 0).
    placeholder, placeholder_mode, mode: read by ``infogain`` (the counterfactual feedback text;
    "replace" = PH replaces o_t, "overwrite" = PH written over o_t at o_t's length; which of the
    three equivalent implementations computes the counterfactual log-probs).
    prior: "placeholder" (the paper's) or "marginal" (module docstring).
    exclude_corrections: leave turns whose feedback is a correction out of the valid turns.
    stat_unit, std_ddof, magnitude_ratio, beta_decay: the reference code's choices (module docstring).
    """

    beta: float = 0.5
    gate_temperature: float = 0.5
    normalize_std: bool = True
    normalize_by: Literal["group", "group_turn"] = "group"
    use_gate: bool = True
    use_ext: bool = True
    negative_weight: float = 1.0
    eps: float = 1e-6
    placeholder: str = "No information found."
    placeholder_mode: Literal["replace", "overwrite"] = "replace"
    mode: Literal["naive", "vmapped", "shared_prefix"] = "shared_prefix"
    prior: Literal["placeholder", "marginal"] = "placeholder"
    exclude_corrections: bool = False
    stat_unit: Literal["turn", "token"] = "turn"
    std_ddof: int = 0
    magnitude_ratio: bool = False
    beta_decay: float = 0.0

    def __post_init__(self):
        b = self.beta
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not (math.isfinite(b) and b >= 0):
            raise ValueError(f"InfoPOConfig.beta={b!r}: expected a finite number >= 0")
        check_eps("InfoPOConfig", "gate_temperature", self.gate_temperature)
        for name in ("normalize_std", "use_gate", "use_ext", "exclude_corrections", "magnitude_ratio"):
            check_bool("InfoPOConfig", name, getattr(self, name))
        if self.prior not in PRIORS:
            raise ValueError(f"InfoPOConfig.prior={self.prior!r}: expected one of {PRIORS}")
        if self.stat_unit not in STAT_UNITS:
            raise ValueError(f"InfoPOConfig.stat_unit={self.stat_unit!r}: expected one of {STAT_UNITS}")
        check_ddof("InfoPOConfig", self.std_ddof)
        d = self.beta_decay
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not (math.isfinite(d) and d >= 0):
            raise ValueError(f"InfoPOConfig.beta_decay={d!r}: expected a finite number >= 0 (0: no decay)")
        if self.normalize_by not in ("group", "group_turn"):
            raise ValueError(f"InfoPOConfig.normalize_by={self.normalize_by!r}: expected 'group' or 'group_turn'")
        check_weight("InfoPOConfig", "negative_weight", self.negative_weight, "1: InfoPO")
        check_eps("InfoPOConfig", "eps", self.eps)
        if not isinstance(self.placeholder, str) or not self.placeholder.strip():
            raise ValueError(f"InfoPOConfig.placeholder={self.placeholder!r}: expected a non-empty string")
        if self.placeholder_mode not in PLACEHOLDER_MODES:
            raise ValueError(
                f"InfoPOConfig.placeholder_mode={self.placeholder_mode!r}: expected one of {PLACEHOLDER_MODES}"
            )
        if self.mode not in INFOGAIN_MODES:
            raise ValueError(f"InfoPOConfig.mode={self.mode!r}: expected one of {INFOGAIN_MODES}")


def normalize_turn_rewards(
    r_info_BT: jax.Array,
    valid_BT: jax.Array,
    group_id_B: jax.Array,
    normalize_std: bool = True,
    eps: float = 1e-6,
    *,
    num_groups: int | None = None,
    by_turn: bool = False,
    ddof: int = 0,
    weight_BT: jax.Array | None = None,
) -> jax.Array:
    """Group-normalised info advantage ``A_info_BT``.

    r_info_BT: ``[B, T]`` float per-turn information gain (any value, NaN included, on invalid
    turns); valid_BT: ``[B, T]`` bool; group_id_B: ``[B]`` int32 in ``[0, num_groups)`` (default B).
    The statistics of group g run over every valid turn of every rollout in g:
    ``A = (r - mean_g) / (std_g + eps)`` (population std) or ``r - mean_g`` without std; exactly
    0 on invalid turns and in groups with fewer than 2 valid turns or all-equal values.
    by_turn: the statistics run over the valid turns of index t of the rollouts in g instead, one
    set per (g, t): each turn is compared with the same turn of the group's other rollouts, so
    what differs between turn positions (the first turn's gain is lower in every rollout, say)
    gives no advantage. ddof, weight_BT: as ``grpo.group_stats`` (n - 1; a turn counted weight
    times, e.g. once per token of its action).
    """
    r_BT = jnp.asarray(r_info_BT)
    B, T = r_BT.shape
    G = B if num_groups is None else int(num_groups)
    gid_BT = jnp.broadcast_to(jnp.asarray(group_id_B, jnp.int32)[:, None], (B, T))
    if by_turn:  # cell (g, t) -> g * T + t; ids outside [0, G) stay outside [0, G * T)
        gid_BT = jnp.where(gid_BT >= 0, gid_BT * T + jnp.arange(T, dtype=jnp.int32)[None, :], -1)
        G = G * T
    A_N, _ = group_normalize(
        r_BT.reshape(-1), gid_BT.reshape(-1), jnp.asarray(valid_BT, bool).reshape(-1),
        num_groups=G, normalize_std=normalize_std, eps=eps, ddof=ddof,
        weight_B=None if weight_BT is None else jnp.asarray(weight_BT, jnp.float32).reshape(-1),
    )  # fmt: skip
    return A_N.reshape(B, T)


def gate_per_group(
    reward_B: jax.Array, group_id_B: jax.Array, temperature: float, *, num_groups: int | None = None,
    valid_B: jax.Array | None = None, ddof: int = 0,
) -> jax.Array:
    """``g_G = sigmoid(-std_g(R) / temperature)`` per group over its valid rows (population std;
    0.5 for an empty, single-member or all-equal group). ``ddof=1``: the n - 1 std, and a
    single-member group's std is 1 (verl's convention). Returns float32 ``[G]``."""
    stats = group_stats(reward_B, group_id_B, valid_B, num_groups, ddof=ddof)
    std_G = jnp.where(stats.count_G == 1, 1.0, stats.std_G) if ddof == 1 else stats.std_G
    return jax.nn.sigmoid(-std_G / temperature)


def variance_gate(
    reward_B: jax.Array, group_id_B: jax.Array, temperature: float, *, num_groups: int | None = None,
    valid_B: jax.Array | None = None, ddof: int = 0,
) -> jax.Array:
    """InfoPO's variance gate per rollout: ``g_B[i] = sigmoid(-std_{g(i)}(R_ext) / temperature)``.

    reward_B: ``[B]`` float outcome rewards; group_id_B: ``[B]`` int32 in ``[0, num_groups)``
    (default B; an out-of-range id gets 0.5). High outcome spread in the group (an informative
    outcome signal) closes the gate toward 0; a homogeneous group opens it to 0.5. ddof: as
    `gate_per_group`. Returns float32 ``[B]``.
    """
    gid_B = jnp.asarray(group_id_B, jnp.int32)
    G = gid_B.shape[0] if num_groups is None else int(num_groups)
    g_G = gate_per_group(reward_B, gid_B, temperature, num_groups=G, valid_B=valid_B, ddof=ddof)
    return jnp.where(in_range(gid_B, G), gather_groups(g_G, gid_B), 0.5)


def broadcast_turns(A_BT: jax.Array, turn_idx_BL: jax.Array, loss_mask_BL: jax.Array) -> jax.Array:
    """Turn t's advantage on the agent tokens of action t: ``A_BL[i, l] = A_BT[i, turn_idx_BL[i,
    l]]`` where ``loss_mask_BL != 0`` and ``0 <= turn_idx < T``, else exactly 0. float32 ``[B, L]``."""
    return gather_to_tokens(A_BT, turn_idx_BL, loss_mask_BL)


def _l1(x_BL, agent_BL):
    return jnp.sum(jnp.where(agent_BL, jnp.abs(x_BL), 0.0))


def masked_std(x_BL: jax.Array, mask_BL: jax.Array, ddof: int = 0) -> jax.Array:
    """The std of ``x_BL`` over the entries where ``mask_BL`` (population, or n - 1 with ``ddof=1``;
    0 with fewer than ddof + 1 entries). Float32 scalar."""
    m = jnp.asarray(mask_BL, bool)
    x = jnp.where(m, jnp.asarray(x_BL, jnp.float32), 0.0)
    n = jnp.sum(m, dtype=jnp.float32)
    mean = jnp.sum(x) / jnp.maximum(n, 1.0)
    var = jnp.sum(jnp.where(m, (x - mean) ** 2, 0.0)) / jnp.maximum(n - ddof, 1.0)
    return jnp.sqrt(var)


def magnitude_ratio(ext_BL: jax.Array, info_BL: jax.Array, agent_BL: jax.Array, *, ddof: int = 0,
                    eps: float = 1e-6) -> jax.Array:
    """The reference code's bound on the info term: ``min(1, max(std_ext + eps, 1) / (std_info + eps))``,
    the stds over the agent tokens (`masked_std`) of the outcome advantage ``ext_BL`` and of the
    (unweighted) info advantage ``info_BL``, both [B, L]. Float32 scalar in (0, 1]."""
    s_ext = masked_std(ext_BL, agent_BL, ddof) + eps
    s_info = masked_std(info_BL, agent_BL, ddof) + eps
    return jnp.minimum(1.0, jnp.maximum(s_ext, 1.0) / s_info)


def info_valid_turns(batch, exclude_corrections: bool = False) -> jax.Array:
    """The turns InfoPO credits, ``[B, T]`` bool: `infogain_valid_turns`, without those whose
    feedback is a correction (``batch.feedback_kind_BT``) when ``exclude_corrections``."""
    valid_BT = infogain_valid_turns(batch)
    if exclude_corrections and batch.feedback_kind_BT is not None:
        valid_BT = valid_BT & (jnp.asarray(batch.feedback_kind_BT) != FEEDBACK_CORRECTION)
    return valid_BT


def info_advantage(r_info_BT: jax.Array, batch, s: InfoPOConfig) -> tuple[jax.Array, jax.Array]:
    """``(A_info_BT, valid_BT)``: the group-normalised gain of each valid turn under ``s``'s
    statistics (``stat_unit``, ``std_ddof``, ``normalize_by``, ``normalize_std``); the value of
    each turn as its tokens carry it (``r_t / |a_t|`` normalised per token with ``stat_unit="token"``)."""
    valid_BT = info_valid_turns(batch, s.exclude_corrections)
    r_BT = jnp.asarray(r_info_BT, jnp.float32)
    weight_BT = None
    if s.stat_unit == "token":  # r_t / |a_t| on each of a_t's tokens; zero-gain turns left out
        a_BT2 = jnp.asarray(batch.action_span_BT2, jnp.int32)
        n_BT = jnp.maximum(a_BT2[..., 1] - a_BT2[..., 0], 1).astype(jnp.float32)
        r_BT = jnp.where(valid_BT, r_BT, 0.0) / n_BT
        valid_BT = valid_BT & (r_BT != 0)
        weight_BT = n_BT
    A_BT = normalize_turn_rewards(r_BT, valid_BT, batch.group_id_B, s.normalize_std, s.eps,
                                  by_turn=s.normalize_by == "group_turn", ddof=s.std_ddof, weight_BT=weight_BT)
    return A_BT, valid_BT


@dataclasses.dataclass(frozen=True)
class InfoPOTerm(CreditTerm):
    """InfoPO's information-gain term (module docstring); needs the host input ``r_info`` [B, T]
    (the teacher-forced gain per turn, `jaxagent.train.infogain.compute_infogain`).

    Diagnostics: ``r_info_BT`` (0 on invalid turns), ``info_valid_BT`` (bool), ``A_info_BT``,
    ``gate_B`` and ``gate_G`` (the gate applied: ones without the gate), ``info_l1_share`` (sum |info
    term| / the L1 mass of all terms, over agent tokens); logged: ``info/gain_mean`` (over valid
    turns, 0 with none), ``info/gate_mean`` (over the rows with tokens), ``info/l1_share`` and
    ``info/gain_by_turn`` [T] (NaN where no turn of that index is valid), ``info/magnitude_ratio``
    (1 without it), ``info/beta`` (beta at this iteration) and ``info/valid_turn_share`` (the
    share of turns with a gain that the term credits: below 1 with ``exclude_corrections`` or
    ``stat_unit="token"``'s zero-gain turns). The gain diagnostics cover every turn with a gain;
    ``info_valid_BT`` the credited ones. Host input ``iteration`` (a float32 scalar, the RL
    iteration; 0 when absent) drives ``beta_decay``."""

    settings: InfoPOConfig = InfoPOConfig()
    name: ClassVar[str] = "infopo"
    cover: ClassVar[str] = "info"
    needs: ClassVar[tuple[str, ...]] = ("r_info", "iteration")
    settings_type: ClassVar[type] = InfoPOConfig

    def silences(self) -> tuple[str, ...]:
        return () if self.settings.use_ext else (OUTCOME_TERM,)

    def advantage(self, ctx: FuseContext) -> tuple[jax.Array, dict[str, jax.Array]]:
        s, batch = self.settings, ctx.batch
        r_info_BT = ctx.inputs.get("r_info")
        if r_info_BT is None:
            raise ValueError("r_info_BT=None: expected a [B, T] array when infopo is set")
        chex.assert_shape(r_info_BT, batch.turn_valid_BT.shape)
        B = batch.tokens_BL.shape[0]
        A_info_BT, valid_BT = info_advantage(r_info_BT, batch, s)
        A_info_BL = broadcast_turns(A_info_BT, batch.turn_idx_BL, batch.loss_mask_BL)
        ratio = jnp.float32(1.0)
        if s.magnitude_ratio:
            ratio = magnitude_ratio(ctx.before_BL, A_info_BL, ctx.agent_BL, ddof=s.std_ddof, eps=s.eps)
            A_info_BL = ratio * A_info_BL
        if s.use_gate and s.use_ext:
            kw = dict(valid_B=ctx.row_valid_B, ddof=s.std_ddof)
            gate_G = gate_per_group(batch.reward_B, batch.group_id_B, s.gate_temperature, **kw)
            gate_B = variance_gate(batch.reward_B, batch.group_id_B, s.gate_temperature, **kw)
        else:  # no gate, or A = A_info alone (no gate applied): report ones
            gate_G, gate_B = jnp.ones((B,), jnp.float32), jnp.ones((B,), jnp.float32)
        beta = s.beta
        if s.beta_decay:
            beta = s.beta * jnp.exp(-s.beta_decay * jnp.asarray(ctx.inputs.get("iteration", 0.0), jnp.float32))
        info_BL = beta * gate_B[:, None] * A_info_BL if s.use_ext else A_info_BL
        if s.negative_weight != 1.0:
            info_BL = jnp.where(info_BL < 0, s.negative_weight * info_BL, info_BL)
        info_BL = jnp.where(ctx.agent_BL, info_BL, 0.0)
        all_valid_BT = infogain_valid_turns(batch)
        r_BT = jnp.where(all_valid_BT, jnp.asarray(r_info_BT, jnp.float32), 0.0)
        n_T = jnp.sum(all_valid_BT, axis=0, dtype=jnp.float32)
        rows = ctx.row_valid_B
        return info_BL, {
            "r_info_BT": r_BT, "info_valid_BT": valid_BT, "A_info_BT": A_info_BT, "gate_B": gate_B, "gate_G": gate_G,
            "info/gain_mean": safe_ratio(jnp.sum(r_BT), jnp.sum(n_T)),
            "info/gate_mean": safe_ratio(jnp.sum(jnp.where(rows, gate_B, 0.0)), jnp.sum(rows, dtype=jnp.float32)),
            "info/gain_by_turn": jnp.where(n_T > 0, jnp.sum(r_BT, axis=0) / jnp.maximum(n_T, 1.0), jnp.nan),
            "info/magnitude_ratio": ratio, "info/beta": jnp.asarray(beta, jnp.float32),
            "info/valid_turn_share": safe_ratio(jnp.sum(valid_BT, dtype=jnp.float32), jnp.sum(n_T)),
        }

    def finalize(self, ctx: FuseContext, parts: Mapping[str, jax.Array], diag) -> dict[str, jax.Array]:
        total = sum(_l1(p, ctx.agent_BL) for p in parts.values())
        share = safe_ratio(_l1(parts[self.name], ctx.agent_BL), total)
        return {"info_l1_share": share, "info/l1_share": share}


__all__ = [
    "FEEDBACK_CORRECTION",
    "INFOGAIN_MODES",
    "PLACEHOLDER_MODES",
    "PRIORS",
    "STAT_UNITS",
    "InfoPOConfig",
    "InfoPOTerm",
    "broadcast_turns",
    "gate_per_group",
    "info_advantage",
    "info_valid_turns",
    "infogain_valid_turns",
    "magnitude_ratio",
    "masked_std",
    "normalize_turn_rewards",
    "variance_gate",
]

"""InfoPO's model-free pieces and the fusion of all credit terms.

Shapes: B rollouts, L tokens, T action turns (padded), Q U2U segments (padded), G groups.

    A_BL = A_ext + beta * g * A_info + lam * A_proc

- ``A_ext``: GRPO outcome advantage of the rollout (``grpo.grpo_advantage``) on its agent tokens.
- ``A_info``: the per-turn information gain ``r_info(t)`` (computed by ``infogain``; credited to
  action t, the action that drew feedback o_t) group-normalised over **all valid turns of all
  rollouts of the group** (invalid turns are left out of the statistics, not counted as 0), then
  put on the agent tokens of action t. ``normalize_std=False`` is the paper's "w/o std" ablation:
  mean-centering only, ``r - mean_g`` (the InfoPO reference code does the same with
  ``norm_adv_by_std_in_grpo=False``).
- ``g``: the variance gate of the rollout's group, ``sigmoid(-std_g(R_ext) / T)`` (population
  std, so a group with equal rewards or a single member has g = 0.5, the largest value).
- ``A_proc``: Faca's reaction credit (``reaction.reaction_advantage``) on the agent tokens of
  each U2U segment.

Ablations: ``use_gate=False`` (g = 1), ``use_ext=False`` (A = A_info: no outcome term and no
beta / gate weighting, as the reference code's intrinsic-only mode; a Faca term still adds),
``normalize_std=False`` (above), ``infopo=None`` / ``faca=None`` (term off).

Group normalisation follows ``grpo``: population std, eps outside the sqrt, degenerate groups
(fewer than 2 valid entries or all equal) exactly 0, group ids in ``[0, B)``.

Departures from the InfoPO reference code (verl, ``compute_info_grpo_advantage``), on purpose:
its statistics are over tokens (each turn weighted by its action length) with ``torch.std``
(n - 1); ours are over turns, as the paper states, with the population std. It also rescales
the info term down when its token std exceeds max(1, std of A_ext) ("magnitude ratio"); the
issue's formula has no such step and neither do we.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import chex
import jax
import jax.numpy as jnp

from jaxagent.credit.batch import CreditBatch
from jaxagent.credit.grpo import (
    GRPOConfig,
    _gather,
    broadcast_to_tokens,
    check_bool,
    check_eps,
    check_weight,
    gather_to_tokens,
    group_normalize,
    group_stats,
    grpo_advantage,
    in_range,
    safe_ratio,
)
from jaxagent.credit.reaction import FacaConfig, broadcast_segments, reaction_advantage, reaction_telemetry

PLACEHOLDER_MODES = ("replace", "overwrite")
INFOGAIN_MODES = ("naive", "vmapped", "shared_prefix")


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

    def __post_init__(self):
        b = self.beta
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not (math.isfinite(b) and b >= 0):
            raise ValueError(f"InfoPOConfig.beta={b!r}: expected a finite number >= 0")
        check_eps("InfoPOConfig", "gate_temperature", self.gate_temperature)
        for name in ("normalize_std", "use_gate", "use_ext"):
            check_bool("InfoPOConfig", name, getattr(self, name))
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


def infogain_valid_turns(batch: CreditBatch) -> jax.Array:
    """Turns t that get an information gain, ``[B, T]`` bool.

    t is valid when: action t exists with a non-empty span inside ``[0, L)``; action t+1 exists
    likewise (so the last turn never is); the feedback o_t span is non-empty, inside ``[0, L)``,
    and lies between the two actions (``end(a_t) <= start(o_t)``, ``end(o_t) <= start(a_{t+1})``).
    """
    L = batch.tokens_BL.shape[1]
    a_BT2 = jnp.asarray(batch.action_span_BT2, jnp.int32)
    f_BT2 = jnp.asarray(batch.feedback_span_BT2, jnp.int32)
    a0, a1 = a_BT2[..., 0], a_BT2[..., 1]
    f0, f1 = f_BT2[..., 0], f_BT2[..., 1]
    act_BT = jnp.asarray(batch.turn_valid_BT, bool) & (a0 >= 0) & (a1 > a0) & (a1 <= L)
    B = act_BT.shape[0]
    next_act_BT = jnp.concatenate([act_BT[:, 1:], jnp.zeros((B, 1), bool)], axis=1)
    next_a0 = jnp.concatenate([a0[:, 1:], jnp.zeros((B, 1), jnp.int32)], axis=1)
    feedback_BT = (f0 >= 0) & (f1 > f0) & (f1 <= L) & (a1 <= f0) & (f1 <= next_a0)
    return act_BT & next_act_BT & feedback_BT


def normalize_turn_rewards(
    r_info_BT: jax.Array,
    valid_BT: jax.Array,
    group_id_B: jax.Array,
    normalize_std: bool = True,
    eps: float = 1e-6,
    *,
    num_groups: int | None = None,
    by_turn: bool = False,
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
    gives no advantage.
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
        num_groups=G, normalize_std=normalize_std, eps=eps,
    )  # fmt: skip
    return A_N.reshape(B, T)


def gate_per_group(
    reward_B: jax.Array, group_id_B: jax.Array, temperature: float, *, num_groups: int | None = None,
    valid_B: jax.Array | None = None,
) -> jax.Array:
    """``g_G = sigmoid(-std_g(R) / temperature)`` per group over its valid rows (population std;
    0.5 for an empty, single-member or all-equal group). Returns float32 ``[G]``."""
    stats = group_stats(reward_B, group_id_B, valid_B, num_groups)
    return jax.nn.sigmoid(-stats.std_G / temperature)


def variance_gate(
    reward_B: jax.Array, group_id_B: jax.Array, temperature: float, *, num_groups: int | None = None,
    valid_B: jax.Array | None = None,
) -> jax.Array:
    """InfoPO's variance gate per rollout: ``g_B[i] = sigmoid(-std_{g(i)}(R_ext) / temperature)``.

    reward_B: ``[B]`` float outcome rewards; group_id_B: ``[B]`` int32 in ``[0, num_groups)``
    (default B; an out-of-range id gets 0.5). High outcome spread in the group (an informative
    outcome signal) closes the gate toward 0; a homogeneous group opens it to 0.5.
    Returns float32 ``[B]``.
    """
    gid_B = jnp.asarray(group_id_B, jnp.int32)
    G = gid_B.shape[0] if num_groups is None else int(num_groups)
    g_G = gate_per_group(reward_B, gid_B, temperature, num_groups=G, valid_B=valid_B)
    return jnp.where(in_range(gid_B, G), _gather(g_G, gid_B), 0.5)


def broadcast_turns(A_BT: jax.Array, turn_idx_BL: jax.Array, loss_mask_BL: jax.Array) -> jax.Array:
    """Turn t's advantage on the agent tokens of action t: ``A_BL[i, l] = A_BT[i, turn_idx_BL[i,
    l]]`` where ``loss_mask_BL != 0`` and ``0 <= turn_idx < T``, else exactly 0. float32 ``[B, L]``."""
    return gather_to_tokens(A_BT, turn_idx_BL, loss_mask_BL)


def _l1(x_BL, agent_BL):
    return jnp.sum(jnp.where(agent_BL, jnp.abs(x_BL), 0.0))


def fuse(
    batch: CreditBatch,
    r_info_BT: jax.Array | None,
    infopo: InfoPOConfig | None,
    faca: FacaConfig | None,
    grpo: GRPOConfig = GRPOConfig(),
    key: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The fused per-token advantage ``A_BL = A_ext + beta * g * A_info + lam * A_proc``.

    batch: the ``CreditBatch`` (group ids in ``[0, B)``). r_info_BT: ``[B, T]`` float per-turn
    information gain from ``infogain`` (ignored on turns ``infogain_valid_turns`` rejects; may be
    None when ``infopo`` is None). infopo / faca: None turns that term off. grpo: settings of
    A_ext. key: PRNG key, needed only for Faca's "random" ablation. Configs are static under jit.

    Returns ``(A_BL float32 [B, L], diagnostics)``: A_BL is 0 off the agent tokens. Diagnostics
    (float32 unless noted): ``A_ext_B``; with InfoPO ``r_info_BT`` (0 on invalid turns),
    ``info_valid_BT`` (bool), ``A_info_BT``, ``gate_B`` and ``gate_G`` (the gate applied: ones
    without the gate; ``gate_G[g]`` for group id g), ``info_l1_share`` (sum |info term| / sum of
    the L1 masses of all terms, over agent tokens); with Faca ``A_proc_BQ`` (unweighted) and
    ``faca/<name>`` for each entry of ``reaction_telemetry`` (its ``proc_l1_share`` is relative
    to |A_ext + info term| + |lam * A_proc|). Coverage (float32 scalars): ``cover/ext``,
    ``cover/total`` and with the terms on ``cover/info``, ``cover/proc``: the share of agent tokens
    where that term is nonzero; ``zero_adv_group_share`` (`zero_advantage_group_share`).
    """
    batch.check()
    B, L = batch.tokens_BL.shape
    agent_BL = jnp.asarray(batch.loss_mask_BL) != 0
    zeros_BL = jnp.zeros((B, L), jnp.float32)

    # Batch-padding rows (no tokens) enter no group statistic and get no advantage.
    row_valid_B = jnp.any(jnp.asarray(batch.pad_mask_BL) != 0, axis=-1)
    A_ext_B = grpo_advantage(batch.reward_B, batch.group_id_B, grpo, valid_B=row_valid_B)
    use_ext = infopo is None or infopo.use_ext
    ext_BL = broadcast_to_tokens(A_ext_B, batch.loss_mask_BL) if use_ext else zeros_BL
    diag: dict[str, jax.Array] = {"A_ext_B": A_ext_B}

    info_BL = zeros_BL
    if infopo is not None:
        if r_info_BT is None:
            raise ValueError("r_info_BT=None: expected a [B, T] array when infopo is set")
        chex.assert_shape(r_info_BT, batch.turn_valid_BT.shape)
        valid_BT = infogain_valid_turns(batch)
        A_info_BT = normalize_turn_rewards(r_info_BT, valid_BT, batch.group_id_B, infopo.normalize_std, infopo.eps,
                                           by_turn=infopo.normalize_by == "group_turn")
        A_info_BL = broadcast_turns(A_info_BT, batch.turn_idx_BL, batch.loss_mask_BL)
        if infopo.use_gate and infopo.use_ext:
            gate_G = gate_per_group(batch.reward_B, batch.group_id_B, infopo.gate_temperature, valid_B=row_valid_B)
            gate_B = variance_gate(batch.reward_B, batch.group_id_B, infopo.gate_temperature, valid_B=row_valid_B)
        else:  # no gate, or A = A_info alone (no gate applied): report ones
            gate_G, gate_B = jnp.ones((B,), jnp.float32), jnp.ones((B,), jnp.float32)
        info_BL = infopo.beta * gate_B[:, None] * A_info_BL if infopo.use_ext else A_info_BL
        if infopo.negative_weight != 1.0:
            info_BL = jnp.where(info_BL < 0, infopo.negative_weight * info_BL, info_BL)
        info_BL = jnp.where(agent_BL, info_BL, 0.0)
        diag.update(
            r_info_BT=jnp.where(valid_BT, jnp.asarray(r_info_BT, jnp.float32), 0.0),
            info_valid_BT=valid_BT,
            A_info_BT=A_info_BT,
            gate_B=gate_B,
            gate_G=gate_G,
        )

    A_out_BL = ext_BL + info_BL
    proc_BL = zeros_BL
    if faca is not None:
        A_proc_BQ = reaction_advantage(batch.segment_polarity_BQ, batch.segment_valid_BQ, batch.group_id_B, faca, key)
        A_proc_BL = broadcast_segments(A_proc_BQ, batch.segment_idx_BL, batch.loss_mask_BL)
        proc_BL = faca.lam * A_proc_BL
        diag["A_proc_BQ"] = A_proc_BQ
        telemetry = reaction_telemetry(
            batch.segment_polarity_BQ, batch.segment_valid_BQ, A_proc_BL, A_out_BL, batch.loss_mask_BL,
            batch.reward_B, batch.group_id_B, faca.lam, valid_B=row_valid_B,
        )  # fmt: skip
        diag.update({f"faca/{k}": v for k, v in telemetry.items()})
        A_BL = A_out_BL + proc_BL
    else:
        A_BL = A_out_BL

    if infopo is not None:
        total = _l1(ext_BL, agent_BL) + _l1(info_BL, agent_BL) + _l1(proc_BL, agent_BL)
        diag["info_l1_share"] = safe_ratio(_l1(info_BL, agent_BL), total)
    # coverage: the share of agent tokens each term reaches (nonzero), and of groups whose
    # outcome advantage is 0 (all rewards equal: the outcome does not discriminate)
    n_agent = jnp.sum(agent_BL, dtype=jnp.float32)
    cover = lambda x_BL: safe_ratio(jnp.sum(agent_BL & (x_BL != 0), dtype=jnp.float32), n_agent)  # noqa: E731
    diag["cover/ext"] = cover(ext_BL)
    diag["cover/total"] = cover(A_BL)
    if infopo is not None:
        diag["cover/info"] = cover(info_BL)
    if faca is not None:
        diag["cover/proc"] = cover(proc_BL)
    diag["zero_adv_group_share"] = zero_advantage_group_share(A_ext_B, batch.group_id_B, row_valid_B)
    return A_BL, diag


def zero_advantage_group_share(A_ext_B: jax.Array, group_id_B: jax.Array, valid_B: jax.Array) -> jax.Array:
    """The share of groups (with at least one valid row) whose outcome advantages are all 0: groups
    whose rewards are all equal (or that have one member), where GRPO has nothing to learn from.
    A_ext_B, group_id_B (ids in [0, B)), valid_B: [B]. Float32 scalar (0 with no valid group)."""
    B = A_ext_B.shape[0]
    valid = jnp.asarray(valid_B, bool)
    gid = jnp.where(valid, group_id_B, B)  # invalid rows to a dropped bucket
    members = jax.ops.segment_sum(valid.astype(jnp.float32), gid, num_segments=B + 1)[:B]
    nonzero = jax.ops.segment_sum((valid & (A_ext_B != 0)).astype(jnp.float32), gid, num_segments=B + 1)[:B]
    present = members > 0
    return safe_ratio(jnp.sum(present & (nonzero == 0), dtype=jnp.float32), jnp.sum(present, dtype=jnp.float32))


__all__ = [
    "InfoPOConfig",
    "broadcast_turns",
    "fuse",
    "gate_per_group",
    "infogain_valid_turns",
    "normalize_turn_rewards",
    "variance_gate",
    "zero_advantage_group_share",
]

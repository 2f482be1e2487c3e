"""Faca: the simulated user's reaction to a U2U segment credits that segment.

Shapes: B rollouts, L tokens, Q U2U segments (padded), G groups.

A U2U segment q of rollout i is all agent tokens between one user message and the next; the
user message that ends it carries a private reaction label (never shown to the agent), mapped
on the host to a polarity +1 / 0 / -1 (``polarity_of``). Then, all in pure jnp:

    r_proc(i, q) = polarity of the reaction that follows segment q of rollout i
    A_proc(i, q) = (r_proc(i, q) - mean) / (std + eps)   over the rollouts of i's group that
                                                          have a segment q (population std)

with 0 where fewer than two rollouts of the group have segment q or their reactions are all
equal, and 0 on invalid segments. The fused advantage is ``A = A_out + lam * A_proc``
(`FacaTerm`, fused by ``fusion.fuse_terms``); ``reaction_advantage`` returns the unweighted A_proc.

Ablations (``FacaConfig.ablation``), applied to the polarities before normalisation:
``shift`` (segment q gets the reaction that follows segment q+1; a segment without a valid
successor becomes invalid), ``random`` (valid polarities permuted over the valid segments of the
whole batch: label frequencies kept exactly; needs a PRNG key), ``reverse`` (sign flipped), and
``lam = 0`` (no process credit).
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from typing import ClassVar, Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.credit.grpo import check_bool, check_eps, gather_to_tokens, group_normalize, group_stats, safe_ratio
from jaxagent.credit.terms import CreditTerm, FuseContext

POSITIVE_LABELS = ("provide_info", "confirm", "approve", "accept")
NEGATIVE_LABELS = ("be_vague", "challenge", "clarify_request", "correct", "reject", "complain")

DEFAULT_POLARITY: Mapping[str, int] = types.MappingProxyType(
    {**{k: 1 for k in POSITIVE_LABELS}, **{k: -1 for k in NEGATIVE_LABELS}}
)
"""Reaction label -> polarity. Any label not listed (and None) maps to 0."""

ABLATIONS = ("none", "shift", "random", "reverse")
MAX_LAMBDA = 0.5


def _norm_label(label) -> str:
    return str(label).strip().lower()


def polarity_of(labels, mapping: Mapping[str, int] | None = None) -> np.ndarray:
    """Host helper: reaction labels -> float32 polarities (+1 / 0 / -1), same shape as ``labels``.

    labels: a label, or a (nested, rectangular) sequence / numpy array of labels; None and
    labels missing from the mapping give 0. Labels are matched case- and whitespace-
    insensitively. mapping: label -> polarity in {-1, 0, 1}; default ``DEFAULT_POLARITY``.
    """
    table = DEFAULT_POLARITY if mapping is None else mapping
    norm: dict[str, int] = {}
    for k, v in table.items():
        if isinstance(v, bool) or v not in (-1, 0, 1):
            raise ValueError(f"polarity mapping[{k!r}]={v!r}: expected -1, 0 or +1")
        norm[_norm_label(k)] = int(v)
    arr = np.asarray(labels, dtype=object)
    out = np.zeros(arr.shape, np.float32)
    for idx, label in np.ndenumerate(arr):
        if label is not None:
            out[idx] = norm.get(_norm_label(label), 0)
    return out


@dataclasses.dataclass(frozen=True)
class FacaConfig:
    """Reaction-credit settings (frozen: a static argument to ``jax.jit``).

    lam: weight of the process term, in [0, 0.5]; above 0.5 only with ``force_lambda=True``.
    force_lambda: allow ``lam > 0.5`` (never a negative lam).
    ablation: "none" | "shift" | "random" | "reverse" (see the module docstring).
    eps: added to the std in the z-normalisation denominator.
    polarity: label -> polarity (-1, 0 or +1) overriding ``DEFAULT_POLARITY`` for those labels
    (``faca.polarity.be_vague=0``: a vague reply credits nothing); `polarity_map` is the result.
    The labels are checked against those the environment declares where the run is configured.
    """

    lam: float = 0.5
    force_lambda: bool = False
    ablation: Literal["none", "shift", "random", "reverse"] = "none"
    eps: float = 1e-6
    polarity: dict[str, int] = dataclasses.field(default_factory=dict)

    def __hash__(self) -> int:  # static under jit: the mapping hashed by its items
        return hash((self.lam, self.force_lambda, self.ablation, self.eps, tuple(sorted(self.polarity.items()))))

    def polarity_map(self) -> dict[str, int]:
        """``DEFAULT_POLARITY`` with ``polarity``'s entries over it (labels normalised)."""
        return {**DEFAULT_POLARITY, **{_norm_label(k): int(v) for k, v in self.polarity.items()}}

    def __post_init__(self):
        if not isinstance(self.polarity, Mapping):
            raise ValueError(f"FacaConfig.polarity={self.polarity!r}: expected a mapping label -> -1, 0 or +1")
        for k, v in self.polarity.items():
            if not isinstance(k, str) or not k.strip():
                raise ValueError(f"FacaConfig.polarity: label {k!r}: expected a non-empty string")
            if isinstance(v, bool) or v not in (-1, 0, 1):
                raise ValueError(f"FacaConfig.polarity[{k!r}]={v!r}: expected -1, 0 or +1")
        check_bool("FacaConfig", "force_lambda", self.force_lambda)
        lam = self.lam
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam) or lam < 0:
            raise ValueError(f"FacaConfig.lam={lam!r}: expected a finite number in [0, {MAX_LAMBDA}]")
        if lam > MAX_LAMBDA and not self.force_lambda:
            raise ValueError(
                f"FacaConfig.lam={lam!r}: expected lam in [0, {MAX_LAMBDA}] (set force_lambda=True to allow a larger lam)"
            )
        if self.ablation not in ABLATIONS:
            raise ValueError(f"FacaConfig.ablation={self.ablation!r}: expected one of {ABLATIONS}")
        check_eps("FacaConfig", "eps", self.eps)


def ablate_polarity(
    segment_polarity_BQ: jax.Array,
    segment_valid_BQ: jax.Array,
    config: FacaConfig,
    key: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The polarities and validity Faca normalises under ``config.ablation``.

    Returns ``(r_proc_BQ float32, valid_BQ bool)``: unchanged for "none"; "shift": r[:, q] =
    r[:, q+1], valid[:, q] = valid[:, q] & valid[:, q+1] (the last column invalid); "reverse":
    -r; "random": the valid entries' polarities permuted uniformly over the valid positions of
    the whole batch (validity and label counts unchanged), drawn with ``key``. Invalid entries
    are returned as 0.
    """
    r_BQ = jnp.asarray(segment_polarity_BQ, jnp.float32)
    v_BQ = jnp.asarray(segment_valid_BQ, bool)
    B, Q = r_BQ.shape
    if config.ablation == "shift":
        r_BQ = jnp.concatenate([r_BQ[:, 1:], jnp.zeros((B, 1), jnp.float32)], axis=1)
        v_BQ = v_BQ & jnp.concatenate([v_BQ[:, 1:], jnp.zeros((B, 1), bool)], axis=1)
    elif config.ablation == "reverse":
        r_BQ = -r_BQ
    elif config.ablation == "random":
        if key is None:
            raise ValueError('key=None: FacaConfig.ablation="random" expected a jax.random key')
        r_N, v_N = r_BQ.reshape(-1), v_BQ.reshape(-1)
        # Both orders list the valid positions first and the invalid ones after, in index order;
        # the first in index order, the second shuffled. Scattering the shuffled sources onto the
        # ordered destinations permutes valid entries among valid positions and fixes the rest.
        dest_N = jnp.argsort(~v_N, stable=True)
        u_N = jax.random.uniform(key, r_N.shape)
        src_N = jnp.argsort(jnp.where(v_N, u_N, 2.0), stable=True)
        r_BQ = jnp.zeros_like(r_N).at[dest_N].set(r_N[src_N]).reshape(B, Q)
    return jnp.where(v_BQ, r_BQ, 0.0), v_BQ


def reaction_advantage(
    segment_polarity_BQ: jax.Array,
    segment_valid_BQ: jax.Array,
    group_id_B: jax.Array,
    config: FacaConfig = FacaConfig(),
    key: jax.Array | None = None,
    *,
    num_groups: int | None = None,
) -> jax.Array:
    """Faca process advantage ``A_proc_BQ`` (unweighted: the caller multiplies by ``config.lam``).

    segment_polarity_BQ: ``[B, Q]`` float polarity of the reaction after segment q;
    segment_valid_BQ: ``[B, Q]`` bool (segment q exists and was followed by a reaction);
    group_id_B: ``[B]`` int32 in ``[0, num_groups)`` (default B); key: PRNG key, needed only for
    the "random" ablation. For each (group, q) the rollouts with a valid segment q are
    z-normalised (population std, eps outside the sqrt); fewer than 2 of them, or all reactions
    equal, gives 0; invalid segments give 0. Returns float32 ``[B, Q]``.
    """
    r_BQ, v_BQ = ablate_polarity(segment_polarity_BQ, segment_valid_BQ, config, key)
    B, Q = r_BQ.shape
    G = B if num_groups is None else int(num_groups)
    gid_B = jnp.asarray(group_id_B, jnp.int32)
    # (group, q) cells; an out-of-range group id stays out of range (< 0 or >= G * Q).
    gid_ok_B = (gid_B >= 0) & (gid_B < G)
    cell_BQ = jnp.where(gid_ok_B[:, None], gid_B[:, None] * Q + jnp.arange(Q, dtype=jnp.int32)[None, :], -1)
    A_N, _ = group_normalize(
        r_BQ.reshape(-1), cell_BQ.reshape(-1), v_BQ.reshape(-1), num_groups=G * Q, normalize_std=True, eps=config.eps
    )
    return A_N.reshape(B, Q)


def broadcast_segments(A_BQ: jax.Array, segment_idx_BL: jax.Array, loss_mask_BL: jax.Array) -> jax.Array:
    """Segment q's advantage on each agent token of segment q: ``A_BL[i, l] = A_BQ[i,
    segment_idx_BL[i, l]]`` where ``loss_mask_BL != 0`` and ``0 <= segment_idx < Q``, else exactly
    0. Returns float32 ``[B, L]``."""
    return gather_to_tokens(A_BQ, segment_idx_BL, loss_mask_BL)


def reaction_telemetry(
    segment_polarity_BQ: jax.Array,
    segment_valid_BQ: jax.Array,
    A_proc_BL: jax.Array,
    A_out_BL: jax.Array,
    loss_mask_BL: jax.Array,
    reward_B: jax.Array,
    group_id_B: jax.Array,
    lam: float,
    *,
    num_groups: int | None = None,
    valid_B: jax.Array | None = None,
) -> dict[str, jax.Array]:
    """Faca telemetry (float32 scalars; 0 where a denominator is empty):

    - ``positive_reaction_rate``: share of valid segments whose (raw, un-ablated) reaction
      polarity is > 0.
    - ``nonzero_proc_token_share``: share of agent tokens (``loss_mask_BL != 0``) with A_proc != 0.
    - ``homogeneous_group_share``: share of groups present in the batch whose outcome rewards are
      all equal (a single-member group counts as homogeneous).
    - ``proc_l1_share``: sum |lam * A_proc| / (sum |A_out| + sum |lam * A_proc|) over agent tokens,
      the process branch's share of the L1 advantage mass.
    - ``nonconstant_cell_share``: of the (group, segment q) cells with at least two valid
      segments, the share whose (raw) reactions differ: where Faca has anything to compare.

    A_proc_BL: unweighted ``[B, L]`` (``broadcast_segments``); A_out_BL: ``[B, L]`` the rest of
    the advantage (outcome + info terms).
    """
    r_BQ = jnp.asarray(segment_polarity_BQ, jnp.float32)
    v_BQ = jnp.asarray(segment_valid_BQ, bool)
    agent_BL = jnp.asarray(loss_mask_BL) != 0
    A_proc_BL = jnp.where(agent_BL, jnp.asarray(A_proc_BL, jnp.float32), 0.0)
    A_out_BL = jnp.where(agent_BL, jnp.asarray(A_out_BL, jnp.float32), 0.0)
    stats = group_stats(reward_B, group_id_B, valid_B, num_groups)  # valid_B: batch-padding rows excluded
    present_G = stats.count_G > 0
    proc_l1 = jnp.sum(jnp.abs(lam * A_proc_BL))
    B, Q = r_BQ.shape
    G = B if num_groups is None else int(num_groups)
    gid_B = jnp.asarray(group_id_B, jnp.int32)
    row_ok_B = (gid_B >= 0) & (gid_B < G) & (jnp.ones((B,), bool) if valid_B is None else jnp.asarray(valid_B, bool))
    cell_N = jnp.where(v_BQ & row_ok_B[:, None], gid_B[:, None] * Q + jnp.arange(Q, dtype=jnp.int32)[None, :],
                       G * Q).reshape(-1)
    r_N = r_BQ.reshape(-1)
    n_C = jax.ops.segment_sum(jnp.ones_like(r_N), cell_N, num_segments=G * Q + 1)[: G * Q]
    hi_C = jax.ops.segment_max(r_N, cell_N, num_segments=G * Q + 1)[: G * Q]
    lo_C = jax.ops.segment_min(r_N, cell_N, num_segments=G * Q + 1)[: G * Q]
    pairs_C = n_C >= 2
    return {
        "positive_reaction_rate": safe_ratio(
            jnp.sum(v_BQ & (r_BQ > 0)).astype(jnp.float32), jnp.sum(v_BQ).astype(jnp.float32)
        ),
        "nonzero_proc_token_share": safe_ratio(
            jnp.sum(agent_BL & (A_proc_BL != 0)).astype(jnp.float32), jnp.sum(agent_BL).astype(jnp.float32)
        ),
        "homogeneous_group_share": safe_ratio(
            jnp.sum(present_G & stats.degenerate_G).astype(jnp.float32), jnp.sum(present_G).astype(jnp.float32)
        ),
        "proc_l1_share": safe_ratio(proc_l1, jnp.sum(jnp.abs(A_out_BL)) + proc_l1),
        "nonconstant_cell_share": safe_ratio(jnp.sum(pairs_C & (hi_C > lo_C), dtype=jnp.float32),
                                             jnp.sum(pairs_C, dtype=jnp.float32)),
    }


@dataclasses.dataclass(frozen=True)
class FacaTerm(CreditTerm):
    """Faca's process term ``lam * A_proc`` on the agent tokens of each U2U segment. Diagnostics:
    ``A_proc_BQ`` (unweighted) and ``faca/<name>`` for each entry of `reaction_telemetry` (its
    ``proc_l1_share`` relative to |the terms fused before it| + |lam * A_proc|)."""

    settings: FacaConfig = FacaConfig()
    name: ClassVar[str] = "faca"
    cover: ClassVar[str] = "proc"
    settings_type: ClassVar[type] = FacaConfig

    def advantage(self, ctx: FuseContext) -> tuple[jax.Array, dict[str, jax.Array]]:
        s, batch = self.settings, ctx.batch
        A_proc_BQ = reaction_advantage(batch.segment_polarity_BQ, batch.segment_valid_BQ, batch.group_id_B, s, ctx.key)
        A_proc_BL = broadcast_segments(A_proc_BQ, batch.segment_idx_BL, batch.loss_mask_BL)
        telemetry = reaction_telemetry(
            batch.segment_polarity_BQ, batch.segment_valid_BQ, A_proc_BL, ctx.before_BL, batch.loss_mask_BL,
            batch.reward_B, batch.group_id_B, s.lam, valid_B=ctx.row_valid_B,
        )  # fmt: skip
        return s.lam * A_proc_BL, {"A_proc_BQ": A_proc_BQ, **{f"faca/{k}": v for k, v in telemetry.items()}}


__all__ = [
    "DEFAULT_POLARITY",
    "FacaConfig",
    "FacaTerm",
    "ablate_polarity",
    "broadcast_segments",
    "polarity_of",
    "reaction_advantage",
    "reaction_telemetry",
]

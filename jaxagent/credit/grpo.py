"""GRPO outcome advantage and the group statistics every credit term shares.

Shapes: B rollouts, L tokens, N entries of a flattened table (e.g. B*T turns), G groups.

Conventions (used by ``grpo``, ``reaction`` and ``fusion`` alike):

- **Group ids** are int32 in ``[0, num_groups)``; ``num_groups`` defaults to the number of
  entries (so rollout ids in ``[0, B)`` always fit). Entries whose id falls outside that range
  are dropped from every statistic (``jax.ops.segment_sum`` semantics) and get advantage 0.
- **Population std** (divide by the number of valid members n, not n - 1) by default. verl's GRPO
  uses ``torch.std`` (n - 1); for a group of n the two differ by sqrt(n / (n - 1)), a constant
  per group size that only rescales the advantage. ``std_ddof=1`` selects verl's.
- **eps outside the square root**: ``A = (x - mean_g) / (std_g + eps)``, as in the GRPO paper
  and verl. Without std normalisation ``A = x - mean_g`` (Dr. GRPO).
- **Degenerate groups give exactly 0**: a group with fewer than 2 valid members, or whose valid
  members are all equal (max == min, tested exactly, not via std < eps), gets advantage 0.0
  exactly, never ``(x - mean) / eps`` rounding noise. (verl instead uses mean 0 / std 1 for a
  single-member group, i.e. A = R / (1 + eps): ``GRPOConfig.singleton="reward"``.)
- **Invalid entries** are masked out of the statistics (not counted as zeros), may hold any
  value (NaN included) and get advantage 0.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp

from jaxagent.credit.terms import OUTCOME_TERM, CreditTerm, FuseContext

SINGLETONS = ("zero", "reward")

__all__ = [
    "SINGLETONS",
    "GRPOConfig",
    "GRPOTerm",
    "GroupStats",
    "broadcast_to_tokens",
    "gather_groups",
    "gather_to_tokens",
    "group_normalize",
    "group_stats",
    "grpo_advantage",
    "all_zero_group_share",
    "safe_ratio",
    "zero_advantage_group_share",
]


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Outcome-advantage settings (frozen: a static argument to ``jax.jit``).

    normalize_std: divide by the group's population std (+ eps); False = mean-centering only.
    eps: added to the std in the denominator; must be > 0.
    negative_weight: in [0, 1], the weight of negative advantages (1: GRPO). Below 1 the update
    pushes an episode below its group's mean down less than it pulls one above the mean up
    (asymmetric REINFORCE: 0 keeps the positive part alone, a reward-weighted imitation of the
    group's better episodes); docs/RESULTS.md, "RL that learns", says why and when it helps.
    positive_weight: in [0, 1], the weight of positive advantages (1: GRPO); 0 keeps the negative
    part alone (an unlikelihood update on the group's worse episodes). Not both 0.
    std_ddof: 0 (population std, ours) or 1 (``torch.std``'s n - 1, verl's and the InfoPO
    reference code's).
    singleton: the advantage of a group with one member: "zero" (ours: nothing to compare it
    with) or "reward" (verl's mean 0 / std 1: ``R / (1 + eps)``, ``R`` without std).
    """

    normalize_std: bool = True
    eps: float = 1e-6
    negative_weight: float = 1.0
    positive_weight: float = 1.0
    std_ddof: int = 0
    singleton: Literal["zero", "reward"] = "zero"

    def __post_init__(self):
        check_bool("GRPOConfig", "normalize_std", self.normalize_std)
        check_eps("GRPOConfig", "eps", self.eps)
        for name in ("negative_weight", "positive_weight"):
            check_weight("GRPOConfig", name, getattr(self, name), "1: GRPO")
        if self.negative_weight == 0 and self.positive_weight == 0:
            raise ValueError("GRPOConfig.negative_weight=0 and positive_weight=0: every advantage would be 0; "
                             "expected at least one of them > 0")
        check_ddof("GRPOConfig", self.std_ddof)
        if self.singleton not in SINGLETONS:
            raise ValueError(f"GRPOConfig.singleton={self.singleton!r}: expected one of {SINGLETONS}")


def check_bool(cls: str, field: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{cls}.{field}={value!r}: expected a bool")


def check_weight(cls: str, field: str, value, note: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and 0 <= value <= 1):
        raise ValueError(f"{cls}.{field}={value!r}: expected a number in [0, 1] ({note})")


def check_ddof(cls: str, value) -> None:
    if isinstance(value, bool) or value not in (0, 1):
        raise ValueError(f"{cls}.std_ddof={value!r}: expected 0 (population std) or 1 (n - 1, torch.std)")


def check_eps(cls: str, field: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{cls}.{field}={value!r}: expected a finite number > 0")


class GroupStats(NamedTuple):
    """Per-group statistics over valid entries, each ``[G]`` (G = num_groups).

    mean_G float32 (0 for an empty group), std_G float32 population std (0 for an empty group),
    count_G float32 number of valid members, degenerate_G bool (count < 2 or all values equal).
    """

    mean_G: jax.Array
    std_G: jax.Array
    count_G: jax.Array
    degenerate_G: jax.Array


def group_stats(
    x_B: jax.Array, group_id_B: jax.Array, valid_B: jax.Array | None = None, num_groups: int | None = None,
    *, ddof: int = 0, weight_B: jax.Array | None = None,
) -> GroupStats:
    """Per-group mean and std of ``x_B`` over valid entries, by segment sums.

    x_B: ``[B]`` values (any float dtype; computed in float32). B may be any flat length N
    (e.g. B*T turns flattened, with each turn carrying its rollout's group id).
    group_id_B: ``[B]`` int group ids in ``[0, num_groups)``; others are dropped.
    valid_B: ``[B]`` bool, or None (all valid). Invalid entries do not count and may hold NaN.
    num_groups: static number of groups G; default B.
    ddof: 0, the population std ``sqrt(sum w d^2 / n)``; 1, ``sqrt(sum w d^2 / (n - 1))``
    (``torch.std``; 0 for a group with n <= 1).
    weight_B: ``[B]`` float multiplicities (None: 1 each): an entry of weight w counts as w equal
    entries (n = sum of the weights), e.g. a turn counted once per token of its action.

    Two-pass (mean, then centred second moment), so the std does not cancel catastrophically.
    """
    x_B = jnp.asarray(x_B)
    B = x_B.shape[0]
    G = B if num_groups is None else int(num_groups)
    gid_B = jnp.asarray(group_id_B, jnp.int32)
    valid_B = jnp.ones((B,), bool) if valid_B is None else jnp.asarray(valid_B, bool)
    w_B = jnp.ones((B,), jnp.float32) if weight_B is None else jnp.asarray(weight_B, jnp.float32)
    w_B = jnp.where(valid_B, w_B, 0.0)
    x_B = jnp.where(valid_B, x_B.astype(jnp.float32), 0.0)
    count_G = jax.ops.segment_sum(w_B, gid_B, num_segments=G)
    denom_G = jnp.maximum(count_G, 1.0)
    mean_G = jax.ops.segment_sum(w_B * x_B, gid_B, num_segments=G) / denom_G
    dev_B = jnp.where(valid_B, x_B - gather_groups(mean_G, gid_B), 0.0)
    var_G = jax.ops.segment_sum(w_B * dev_B * dev_B, gid_B, num_segments=G) / jnp.maximum(count_G - ddof, 1.0)
    hi_G = jax.ops.segment_max(jnp.where(valid_B, x_B, -jnp.inf), gid_B, num_segments=G)
    lo_G = jax.ops.segment_min(jnp.where(valid_B, x_B, jnp.inf), gid_B, num_segments=G)
    degenerate_G = (count_G < 2) | (hi_G == lo_G)
    return GroupStats(mean_G, jnp.sqrt(var_G), count_G, degenerate_G)


def gather_groups(v_G: jax.Array, gid_B: jax.Array) -> jax.Array:
    """v_G[gid] with out-of-range ids clipped (callers mask those entries themselves)."""
    return jnp.take(v_G, jnp.clip(gid_B, 0, v_G.shape[0] - 1), axis=0)


def in_range(gid_B: jax.Array, num_groups: int) -> jax.Array:
    return (gid_B >= 0) & (gid_B < num_groups)


def group_normalize(
    x_B: jax.Array,
    group_id_B: jax.Array,
    valid_B: jax.Array | None = None,
    *,
    num_groups: int | None = None,
    normalize_std: bool = True,
    eps: float = 1e-6,
    ddof: int = 0,
    weight_B: jax.Array | None = None,
) -> tuple[jax.Array, GroupStats]:
    """Group-relative advantage of each entry: ``(x - mean_g) / (std_g + eps)`` (or ``x - mean_g``).

    Shapes, ``ddof`` and ``weight_B`` as in ``group_stats``. Returns ``(A_B float32, stats)``; A is
    exactly 0 on invalid entries, on entries with an out-of-range group id and on degenerate groups.
    """
    x_B = jnp.asarray(x_B)
    B = x_B.shape[0]
    G = B if num_groups is None else int(num_groups)
    gid_B = jnp.asarray(group_id_B, jnp.int32)
    valid_B = jnp.ones((B,), bool) if valid_B is None else jnp.asarray(valid_B, bool)
    stats = group_stats(x_B, gid_B, valid_B, G, ddof=ddof, weight_B=weight_B)
    centred_B = jnp.where(valid_B, x_B.astype(jnp.float32), 0.0) - gather_groups(stats.mean_G, gid_B)
    if normalize_std:
        centred_B = centred_B / (gather_groups(stats.std_G, gid_B) + eps)
    live_B = valid_B & in_range(gid_B, G) & ~gather_groups(stats.degenerate_G, gid_B)
    return jnp.where(live_B, centred_B, 0.0), stats


def grpo_advantage(
    reward_B: jax.Array,
    group_id_B: jax.Array,
    config: GRPOConfig = GRPOConfig(),
    *,
    valid_B: jax.Array | None = None,
    num_groups: int | None = None,
) -> jax.Array:
    """GRPO outcome advantage ``A_B = (R_i - mean_g) / (std_g + eps)`` (population std), or
    ``R_i - mean_g`` with ``config.normalize_std=False``.

    reward_B: ``[B]`` float outcome rewards; group_id_B: ``[B]`` int32 in ``[0, num_groups)``
    (default num_groups = B); valid_B: optional ``[B]`` bool (padding rows: excluded, A = 0).
    Returns ``A_B`` float32; exactly 0 for degenerate groups (single member or all equal), except
    a single member with ``config.singleton="reward"`` (``R / (1 + eps)``, or ``R`` without std).
    ``config.std_ddof`` picks the std (population or n - 1). Negative entries are scaled by ``config.negative_weight``, positive ones by
    ``config.positive_weight`` (1: unchanged).
    """
    A_B, _ = group_normalize(
        reward_B, group_id_B, valid_B, num_groups=num_groups, normalize_std=config.normalize_std, eps=config.eps,
        ddof=config.std_ddof,
    )
    if config.singleton == "reward":  # verl: a lone member's statistics are mean 0, std 1
        valid = jnp.ones(A_B.shape, bool) if valid_B is None else jnp.asarray(valid_B, bool)
        gid = jnp.asarray(group_id_B, jnp.int32)
        G = A_B.shape[0] if num_groups is None else int(num_groups)
        count_G = jax.ops.segment_sum(valid.astype(jnp.float32), gid, num_segments=G)
        alone = valid & in_range(gid, G) & (gather_groups(count_G, gid) == 1)
        r = jnp.asarray(reward_B, jnp.float32)
        A_B = jnp.where(alone, r / (1.0 + config.eps) if config.normalize_std else r, A_B)
    if config.negative_weight != 1.0:
        A_B = jnp.where(A_B < 0, config.negative_weight * A_B, A_B)
    if config.positive_weight != 1.0:
        A_B = jnp.where(A_B > 0, config.positive_weight * A_B, A_B)
    return A_B


def broadcast_to_tokens(A_B: jax.Array, loss_mask_BL: jax.Array) -> jax.Array:
    """A rollout's advantage on each of its agent tokens: ``A_BL[i, l] = A_B[i]`` where
    ``loss_mask_BL[i, l] != 0``, else exactly 0. Returns float32 ``[B, L]``."""
    return jnp.where(jnp.asarray(loss_mask_BL) != 0, jnp.asarray(A_B, jnp.float32)[:, None], 0.0)


def gather_to_tokens(A_BK: jax.Array, idx_BL: jax.Array, loss_mask_BL: jax.Array) -> jax.Array:
    """Per-unit advantages onto tokens: ``A_BL[i, l] = A_BK[i, idx_BL[i, l]]`` where
    ``loss_mask_BL != 0`` and ``0 <= idx < K``, else exactly 0 (idx -1 marks non-agent tokens).
    The shared body of ``fusion.broadcast_turns`` (K = T) and ``reaction.broadcast_segments``
    (K = Q). Returns float32 ``[B, L]``."""
    A_BK = jnp.asarray(A_BK, jnp.float32)
    K = A_BK.shape[1]
    idx_BL = jnp.asarray(idx_BL, jnp.int32)
    take_BL = jnp.take_along_axis(A_BK, jnp.clip(idx_BL, 0, K - 1), axis=1)
    keep_BL = (jnp.asarray(loss_mask_BL) != 0) & (idx_BL >= 0) & (idx_BL < K)
    return jnp.where(keep_BL, take_BL, 0.0)


def safe_ratio(num: jax.Array, den: jax.Array) -> jax.Array:
    """``num / den``, and 0 where ``den <= 0`` (an empty denominator in a share)."""
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def zero_advantage_group_share(A_ext_B: jax.Array, group_id_B: jax.Array, valid_B: jax.Array) -> jax.Array:
    """The share of groups (with at least one valid row) whose outcome advantages are all 0: groups
    whose rewards are all equal (or that have one member), where GRPO has nothing to learn from.
    A_ext_B, group_id_B (ids in [0, B)), valid_B: [B]. Float32 scalar (0 with no valid group)."""
    return all_zero_group_share(A_ext_B, group_id_B, valid_B)


def all_zero_group_share(reward_B: jax.Array, group_id_B: jax.Array, valid_B: jax.Array) -> jax.Array:
    """The share of groups (with at least one valid row) whose values are all 0; of the outcomes:
    "honourable failures", where a turn-level term is the only signal. reward_B, group_id_B (ids
    in [0, B)), valid_B: [B]. Float32 scalar (0 with no valid group)."""
    B = reward_B.shape[0]
    valid = jnp.asarray(valid_B, bool)
    gid = jnp.where(valid, group_id_B, B)
    members = jax.ops.segment_sum(valid.astype(jnp.float32), gid, num_segments=B + 1)[:B]
    nonzero = jax.ops.segment_sum((valid & (jnp.asarray(reward_B) != 0)).astype(jnp.float32), gid,
                                  num_segments=B + 1)[:B]
    present = members > 0
    return safe_ratio(jnp.sum(present & (nonzero == 0), dtype=jnp.float32), jnp.sum(present, dtype=jnp.float32))


@dataclasses.dataclass(frozen=True)
class GRPOTerm(CreditTerm):
    """The outcome term ``A_ext``: each rollout's `grpo_advantage` (over the rows with tokens) on
    its agent tokens. Diagnostics: ``A_ext_B`` [B] and ``zero_adv_group_share`` (the share of
    groups the outcome does not discriminate: `zero_advantage_group_share`), logged as
    ``credit/zero_adv_group_share``, and ``credit/all_zero_group_share`` (`all_zero_group_share`)."""

    settings: GRPOConfig = GRPOConfig()
    name: ClassVar[str] = OUTCOME_TERM
    cover: ClassVar[str] = "ext"
    settings_type: ClassVar[type] = GRPOConfig

    def advantage(self, ctx: FuseContext) -> tuple[jax.Array, dict[str, jax.Array]]:
        batch = ctx.batch
        A_ext_B = grpo_advantage(batch.reward_B, batch.group_id_B, self.settings, valid_B=ctx.row_valid_B)
        return broadcast_to_tokens(A_ext_B, batch.loss_mask_BL), {"A_ext_B": A_ext_B}

    def finalize(self, ctx: FuseContext, parts, diag) -> dict[str, jax.Array]:
        return {"zero_adv_group_share": zero_advantage_group_share(diag["A_ext_B"], ctx.batch.group_id_B,
                                                                   ctx.row_valid_B),
                "credit/all_zero_group_share": all_zero_group_share(ctx.batch.reward_B, ctx.batch.group_id_B,
                                                                    ctx.row_valid_B)}

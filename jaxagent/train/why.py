"""Why a credit term helps or not: where its advantage goes, from one RL batch (host code).

`why_metrics` reads a fusion's diagnostics (`jaxagent.credit.fusion.fuse_terms`), the host batch
they were computed on and each episode's graded score (the gyms' ``info["partial"]``, the partial
credit a binary outcome hides), and reports:

- ``why/all_zero_rows``: rows in groups whose outcomes are all 0 (where only a turn-level term
  can tell episodes apart);
- ``why/info_partial_corr`` / ``why/proc_partial_corr``: inside those groups, the correlation
  (Pearson, over rows, centred per group) between a row's summed InfoPO advantage (A_info over its
  credited turns) or summed Faca advantage (A_proc over its segments) and its graded score: > 0
  when the term pushes up the episodes that got further;
- by feedback kind (``information`` / ``correction``, as the environment marked the turns'
  feedback): ``why/r_info/<kind>`` and ``why/A_info/<kind>`` (means over the turns with a gain)
  and ``why/A_info_pos_share/<kind>`` (the share of the positive A_info mass on that kind).

Absent keys mean the term, the marks or enough rows were missing; None where a correlation is
undefined (fewer than 3 rows or a constant side).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

KINDS = {1: "information", 2: "correction"}


def _centred_corr(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> float | None:
    """Pearson correlation of x and y after subtracting each group's mean from both."""
    if len(x) < 3:
        return None
    xc, yc = x.astype(np.float64).copy(), y.astype(np.float64).copy()
    for g in np.unique(groups):
        m = groups == g
        xc[m] -= xc[m].mean()
        yc[m] -= yc[m].mean()
    if xc.std() == 0 or yc.std() == 0:
        return None
    return float(np.corrcoef(xc, yc)[0, 1])


def all_zero_rows(reward_B: np.ndarray, group_B: np.ndarray, valid_B: np.ndarray) -> np.ndarray:
    """[B] bool: valid rows whose group's valid rows all have outcome 0."""
    out = np.zeros(len(reward_B), bool)
    for g in np.unique(group_B[valid_B]):
        m = valid_B & (group_B == g)
        out[m] = bool(np.all(reward_B[m] == 0))
    return out


def why_metrics(diag: Mapping[str, Any], host: Any, partial_B: Sequence[float | None]) -> dict[str, Any]:
    """The module docstring's figures. ``diag``: the fusion's diagnostics (host or device arrays);
    ``host``: the `HostBatch`; ``partial_B``: per row the graded score (None: unknown)."""
    reward = np.asarray(host.reward_B, np.float64)
    group = np.asarray(host.group_id_B)
    valid_rows = np.asarray(host.pad_mask_BL).any(axis=1)
    partial = np.asarray([np.nan if p is None else float(p) for p in partial_B], np.float64)
    zero = all_zero_rows(reward, group, valid_rows) & ~np.isnan(partial)
    out: dict[str, Any] = {"why/all_zero_rows": int(zero.sum())}
    if "A_info_BT" in diag:
        A = np.asarray(diag["A_info_BT"], np.float64)
        credited = np.asarray(diag["info_valid_BT"], bool)
        out["why/info_partial_corr"] = _centred_corr(np.where(credited, A, 0.0).sum(1)[zero], partial[zero],
                                                     group[zero])
        r = np.asarray(diag["r_info_BT"], np.float64)
        kinds = None if host.feedback_kind_BT is None else np.asarray(host.feedback_kind_BT)
        if kinds is not None:
            pos = np.where(credited & (A > 0), A, 0.0)
            for code, name in KINDS.items():
                m = credited & (kinds == code)
                if m.any():
                    out[f"why/r_info/{name}"] = float(r[m].mean())
                    out[f"why/A_info/{name}"] = float(A[m].mean())
                out[f"why/A_info_pos_share/{name}"] = float(pos[kinds == code].sum() / pos.sum()) if pos.sum() else 0.0
    if "A_proc_BQ" in diag:
        P = np.asarray(diag["A_proc_BQ"], np.float64)
        out["why/proc_partial_corr"] = _centred_corr(P.sum(1)[zero], partial[zero], group[zero])
    return out


__all__ = ["all_zero_rows", "why_metrics"]

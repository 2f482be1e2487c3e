"""Bootstrap intervals for the mean of paired differences (numpy and the standard library only).

Runs compared on the same units (a held-out task under one seed, with the same sampling keys)
are compared through their per-unit differences ``d_i = a_i - b_i``; the statistic is their mean.

- `percentile_interval`: the plain percentile bootstrap.
- `bca_interval`: the bias-corrected and accelerated bootstrap (Efron 1987; Efron & Tibshirani,
  *An Introduction to the Bootstrap*, ch. 14), as ``scipy.stats.bootstrap(method="BCa")``
  computes it (tests check the two agree): bias correction ``z0 = Phi^-1`` of the share of
  resampled means below the observed one (ties counted half), acceleration ``a`` from the
  jackknife (`jackknife_acceleration`), and the interval's ends at the resampled means' quantiles
  ``Phi(z0 + (z0 + z_q) / (1 - a (z0 + z_q)))`` for ``z_q = Phi^-1(q)``, ``q = (1 -/+ level) / 2``.
- `paired_bca` / `paired_bootstrap`: the mean difference with its BCa / percentile interval, from
  two paired sequences.

Why not ``scipy.stats.bootstrap`` itself: its BCa counts resampled means that equal the observed
mean only up to rounding (the same units summed in another order) on one side or the other, so its
interval moves when the data are shifted: on per-task success differences (many ties) shifted by
0.1, its upper end moved by 0.02 while ours stays equivariant to 1e-12, as it counts those as ties
(tests/test_eval_stats.py). The two agree within 2% of the interval's width otherwise (same file).

With every difference equal (no spread) the interval is that value at both ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

_N = NormalDist()


def _check(d: np.ndarray, n: int, level: float) -> None:
    if d.ndim != 1 or d.size == 0:
        raise ValueError(f"differences: shape {d.shape}; expected a non-empty 1-d sequence")
    if not np.isfinite(d).all():
        raise ValueError("differences: expected finite numbers (a nan or inf is a missing figure upstream)")
    if n < 1 or not 0 < level < 1:
        raise ValueError(f"n={n}, level={level}: expected n >= 1 and 0 < level < 1")


def _resampled_means(d: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    return d[rng.integers(0, d.size, size=(n, d.size))].mean(axis=1)


def percentile_interval(d: Sequence[float], *, n: int = 10_000, level: float = 0.95,
                        rng: np.random.Generator | None = None) -> tuple[float, float]:
    """The percentile bootstrap interval of ``mean(d)``: the ``(1 -/+ level) / 2`` quantiles of
    ``n`` resampled means (``rng`` default: seeded 0)."""
    d = np.asarray(d, np.float64)
    _check(d, n, level)
    means = _resampled_means(d, n, np.random.default_rng(0) if rng is None else rng)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def jackknife_acceleration(d: Sequence[float]) -> float:
    """BCa's acceleration of the mean: with ``t_i`` the mean without unit i and ``t.`` their mean,
    ``sum((t. - t_i)^3) / (6 * sum((t. - t_i)^2)^1.5)`` (for the mean this is
    ``sum(e^3) / (6 * sum(e^2)^1.5)`` with ``e = d - mean(d)``); 0 when the units do not vary."""
    d = np.asarray(d, np.float64)
    if d.size < 2:
        return 0.0
    loo = (d.sum() - d) / (d.size - 1)
    u = loo.mean() - loo
    den = 6.0 * float(np.sum(u**2)) ** 1.5
    return float(np.sum(u**3) / den) if den > 0 else 0.0


def bca_interval(d: Sequence[float], *, n: int = 10_000, level: float = 0.95,
                 rng: np.random.Generator | None = None) -> tuple[float, float]:
    """The BCa bootstrap interval of ``mean(d)`` at ``level`` from ``n`` resamples (module
    docstring). ``rng`` default: seeded 0, so a report is reproducible."""
    d = np.asarray(d, np.float64)
    _check(d, n, level)
    theta = float(d.mean())
    if np.all(d == d[0]):
        return theta, theta
    means = _resampled_means(d, n, np.random.default_rng(0) if rng is None else rng)
    # resampled means equal to the observed one up to rounding are ties (a resample that permutes
    # the data sums in another order), so the correction does not depend on summation order
    eps = 1e-12 * float(np.abs(d).max())
    share = (np.sum(means < theta - eps) + np.sum(means <= theta + eps)) / (2.0 * n)
    share = min(max(share, 0.5 / n), 1 - 0.5 / n)  # a finite z0 even when every resample falls on one side
    z0 = _N.inv_cdf(share)
    a = jackknife_acceleration(d)
    ends = []
    for q in ((1 - level) / 2, (1 + level) / 2):
        z = z0 + _N.inv_cdf(q)
        ends.append(_N.cdf(z0 + z / (1 - a * z)))
    lo, hi = np.percentile(means, [100 * ends[0], 100 * ends[1]])
    return float(lo), float(hi)


def paired_bca(a: Sequence[float], b: Sequence[float], *, n: int = 10_000, level: float = 0.95,
               rng: np.random.Generator | None = None) -> tuple[float, float, float]:
    """``(mean(a - b), lo, hi)``: the mean paired difference and its BCa interval; ``a[i]`` and
    ``b[i]`` are one unit under two conditions."""
    if len(a) != len(b):
        raise ValueError(f"a and b: lengths {len(a)} and {len(b)}; expected one value per unit in each")
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    lo, hi = bca_interval(d, n=n, level=level, rng=rng)
    return float(d.mean()), lo, hi


def steps_to_threshold(series: Sequence[tuple[int, float]], threshold: float) -> int | None:
    """The smallest step whose value reaches ``threshold`` (``>= threshold``, float tolerance
    1e-9), or None when none does (censored). ``series``: (step, value) pairs in any order; a step
    listed twice (a resumed run re-logs it) keeps its last value; None/NaN values never reach it."""
    last: dict[int, float] = {}
    for step, value in series:
        last[int(step)] = value
    for step in sorted(last):
        v = last[step]
        if v is not None and not (isinstance(v, float) and math.isnan(v)) and v >= threshold - 1e-9:
            return step
    return None


def paired_bootstrap(a: Sequence[float], b: Sequence[float], n: int = 10_000,
                     rng: np.random.Generator | None = None, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean(a - b), lo, hi)``: the mean paired difference and its percentile interval
    (`percentile_interval` of the differences); ``a[i]`` and ``b[i]`` are one unit under two
    conditions."""
    if len(a) != len(b):
        raise ValueError(f"a and b: expected two 1-d sequences of one length, got {len(a)} and {len(b)}")
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    lo, hi = percentile_interval(d, n=n, level=level, rng=rng)
    return float(d.mean()), lo, hi


__all__ = ["bca_interval", "jackknife_acceleration", "paired_bca", "paired_bootstrap", "percentile_interval",
           "steps_to_threshold"]

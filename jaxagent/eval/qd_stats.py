"""Q&D's comparison statistics (the Q&D spec's §5.2): two arms paired at the task.

A reading (coverage, DWR, answer_correct, ...) is given per (task, seed) for each arm, where a seed
is any hashable key (a rollout seed, or a ``(training seed, rollout seed)`` pair). The task is the
cluster: `pair_tasks` averages each task's seeds within each arm (the arms need not share seeds)
and keeps the tasks present in both, so the unit of every statistic is a task's difference
``d_t = mean_a(t) - mean_b(t)``:

- `task_interval`: the BCa bootstrap interval of ``mean(d)`` over tasks (`jaxagent.eval.stats.bca_interval`,
  acceleration by the jackknife over tasks), printed at 10,000 resamples (seed 0).
- `decided`: the cell is decided when three independent 50,000-resample BCa runs (seeds 101, 202,
  303) all exclude zero -- a guard against resampling error, not a multiplicity correction.
- `sign_flip_p`: the two-sided sign-flip permutation p-value of the task means,
  ``(hits + 1) / (n_perm + 1)``, or exact over all ``2^T`` flips for small T.
- `mde`: the minimum detectable effect at 80% power, two-sided 0.05:
  ``(1.95996 + 0.84162) * sd(d) / sqrt(T)`` (sd with ddof = 1).
- `compare_arms`: all of them in one dict.

Every statistic is a function of the multiset of task differences: the functions sort ``d`` before
resampling, so a result does not depend on the order of the tasks and reproduces exactly for a seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxagent.eval.stats import bca_interval

#: z for a two-sided 0.05 test and for 80% power (spec §5.2's constants)
Z_ALPHA, Z_POWER = 1.95996, 0.84162
INTERVAL_RESAMPLES = 10_000
DECIDE_RESAMPLES = 50_000
DECIDE_SEEDS = (101, 202, 303)
#: largest task count `sign_flip_p` enumerates exactly (2^20 sign vectors)
EXACT_MAX = 20

Values = Mapping[tuple[Hashable, Hashable], Any] | Iterable[tuple[Hashable, Hashable, Any]]


# ----------------------------------------------------------------------------- pairing at the task
def _cells(values: Values, arm: str) -> dict[Hashable, list[float]]:
    """task -> its seeds' finite values (None / NaN are missing and skipped)."""
    if isinstance(values, Mapping):
        items = []
        for key, v in values.items():
            if not isinstance(key, tuple) or len(key) != 2:
                raise ValueError(f"{arm}: key {key!r}; expected a (task, seed) pair")
            items.append((key[0], key[1], v))
    else:
        items = []
        for row in values:
            if not isinstance(row, (tuple, list)) or len(row) != 3:
                raise ValueError(f"{arm}: row {row!r}; expected a (task, seed, value) triple")
            items.append(tuple(row))
    seen: set[tuple[Hashable, Hashable]] = set()
    out: dict[Hashable, list[float]] = {}
    for task, seed, v in items:
        if (task, seed) in seen:
            raise ValueError(f"{arm}: task {task!r} seed {seed!r} given twice; expected one value per (task, seed)")
        seen.add((task, seed))
        if v is None:
            continue
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{arm}: task {task!r} seed {seed!r} value {v!r}; expected a number or None") from None
        if math.isnan(x):
            continue
        if math.isinf(x):
            raise ValueError(f"{arm}: task {task!r} seed {seed!r} value {x}; expected a finite number (or None/NaN "
                             "for a missing one)")
        out.setdefault(task, []).append(x)
    return out


def task_means(values: Values, arm: str = "values") -> dict[Hashable, float]:
    """Each task's mean over its seeds. ``values``: ``{(task, seed): value}`` or an iterable of
    ``(task, seed, value)``; a None / NaN value is missing (not averaged), and a task none of whose
    values is present is left out. An infinite value or a repeated (task, seed) is refused."""
    return {t: float(np.mean(v)) for t, v in _cells(values, arm).items()}


@dataclasses.dataclass(frozen=True)
class PairedTasks:
    """Two arms paired at the task: ``tasks`` (sorted by ``str``) are in both arms, ``a[i]`` /
    ``b[i]`` ([T] float64) their seed means; ``only_a`` / ``only_b``: the tasks dropped because one
    arm lacks them."""

    tasks: tuple[Hashable, ...]
    a: np.ndarray
    b: np.ndarray
    only_a: tuple[Hashable, ...]
    only_b: tuple[Hashable, ...]

    @property
    def d(self) -> np.ndarray:
        """[T] the per-task differences ``a - b``."""
        return self.a - self.b

    @property
    def dropped(self) -> int:
        """Tasks present in only one arm."""
        return len(self.only_a) + len(self.only_b)


def pair_tasks(a: Values, b: Values) -> PairedTasks:
    """Per-(task, seed) values of two arms -> per-task means in both (`task_means`); tasks present in
    one arm only are dropped and listed."""
    ma, mb = task_means(a, "a"), task_means(b, "b")
    both = sorted(set(ma) & set(mb), key=str)
    return PairedTasks(tuple(both), np.array([ma[t] for t in both], np.float64),
                       np.array([mb[t] for t in both], np.float64),
                       tuple(sorted(set(ma) - set(mb), key=str)), tuple(sorted(set(mb) - set(ma), key=str)))


# ----------------------------------------------------------------------------- statistics of d
def _diffs(d: Sequence[float]) -> np.ndarray:
    x = np.asarray(d, np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"d: shape {x.shape}; expected a non-empty 1-d sequence of per-task differences")
    if not np.isfinite(x).all():
        raise ValueError("d: expected finite per-task differences (a nan or inf is a missing figure upstream)")
    return np.sort(x)  # canonical order: nothing below depends on the order of the tasks


def _check_int(name: str, value: Any, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name}={value!r}: expected an integer >= {lo}")


def task_interval(d: Sequence[float], *, n: int = INTERVAL_RESAMPLES, level: float = 0.95,
                  seed: int = 0) -> tuple[float, float]:
    """``(lo, hi)``: the BCa interval of ``mean(d)`` over tasks (``d``: [T] per-task differences),
    from ``n`` resamples drawn by ``numpy.random.default_rng(seed)``; equal differences give the
    zero-width interval at their value."""
    _check_int("n", n, 1)
    return bca_interval(_diffs(d), n=n, level=level, rng=np.random.default_rng(seed))


def excludes_zero(interval: tuple[float, float]) -> bool:
    """Whether ``(lo, hi)`` lies strictly on one side of zero (an end at exactly 0 does not exclude it)."""
    lo, hi = interval
    return lo > 0 or hi < 0


@dataclasses.dataclass(frozen=True)
class Decision:
    """`decided`'s verdict: ``decided`` iff every one of ``intervals`` (one per seed of ``seeds``,
    ``n`` resamples each) excludes zero."""

    decided: bool
    intervals: tuple[tuple[float, float], ...]
    seeds: tuple[int, ...]
    n: int


def decided(d: Sequence[float], *, n: int = DECIDE_RESAMPLES, seeds: Sequence[int] = DECIDE_SEEDS,
            level: float = 0.95) -> Decision:
    """Three (``len(seeds)``) independent BCa runs of ``n`` resamples over the tasks' differences
    ``d`` ([T]); the cell is decided when all of them exclude zero (`excludes_zero`)."""
    if not seeds:
        raise ValueError("seeds=(): expected at least one seed")
    intervals = tuple(task_interval(d, n=n, level=level, seed=int(s)) for s in seeds)
    return Decision(all(excludes_zero(iv) for iv in intervals), intervals, tuple(int(s) for s in seeds), n)


def sign_flip_p(d: Sequence[float], *, n_perm: int = 10_000, seed: int = 0, exact: bool = False) -> float:
    """The two-sided sign-flip permutation p-value of ``mean(d)`` (``d``: [T] task means of the
    differences): under the null each task's difference is as likely negated, so a flip vector ``s``
    (each ``s_t`` = +-1) is a hit when ``|sum(s * d)| >= |sum(d)|`` (up to rounding, 1e-10 of
    ``sum |d|``). Monte Carlo: ``(hits + 1) / (n_perm + 1)`` over ``n_perm`` flips drawn by
    ``numpy.random.default_rng(seed)``. ``exact=True``: ``hits / 2^T`` over every flip (the identity
    among them), for ``T <= 20``. All-zero differences give 1."""
    x = _diffs(d)
    observed = abs(float(x.sum()))
    tol = 1e-10 * float(np.abs(x).sum())
    if exact:
        if x.size > EXACT_MAX:
            raise ValueError(f"exact=True with {x.size} tasks: expected at most {EXACT_MAX} (2^T flips); use the "
                             "Monte Carlo mode (n_perm)")
        hits, bits = 0, np.arange(x.size)
        for start in range(0, 2**x.size, 2**16):  # sign vectors by their bit codes, 65,536 at a time
            codes = np.arange(start, min(start + 2**16, 2**x.size), dtype=np.int64)[:, None]
            hits += int(np.sum(np.abs((1.0 - 2.0 * ((codes >> bits) & 1)) @ x) >= observed - tol))
        return hits / 2**x.size
    _check_int("n_perm", n_perm, 1)
    rng = np.random.default_rng(seed)
    hits, left, chunk = 0, n_perm, max(1, 2**22 // x.size)
    while left:
        m = min(chunk, left)
        signs = 1.0 - 2.0 * rng.integers(0, 2, size=(m, x.size))
        hits += int(np.sum(np.abs(signs @ x) >= observed - tol))
        left -= m
    return (hits + 1) / (n_perm + 1)


def mde(d: Sequence[float]) -> float:
    """The minimum detectable effect at 80% power, two-sided 0.05: ``(1.95996 + 0.84162) *
    sd(d) / sqrt(T)`` with ``sd`` the sample standard deviation (ddof = 1) of the T per-task
    differences. NaN for a single task (no spread to estimate); an empty ``d`` is refused."""
    x = _diffs(d)
    if x.size < 2:
        return float("nan")
    return (Z_ALPHA + Z_POWER) * float(np.std(x, ddof=1)) / math.sqrt(x.size)


# ----------------------------------------------------------------------------- one comparison
def compare_arms(a: Values, b: Values, *, n: int = INTERVAL_RESAMPLES, level: float = 0.95, seed: int = 0,
                 decide: bool = True, decide_n: int = DECIDE_RESAMPLES, decide_seeds: Sequence[int] = DECIDE_SEEDS,
                 n_perm: int = 10_000, perm_seed: int = 0) -> dict[str, Any]:
    """Arm ``a`` against arm ``b`` from their per-(task, seed) values (`pair_tasks`): one dict with

    - ``n_tasks`` (tasks in both arms), ``dropped`` (tasks in one arm only) and ``dropped_tasks``
      (``{"only_a": [...], "only_b": [...]}``);
    - ``mean_a``, ``mean_b`` (over the paired tasks) and ``mean_diff`` (``mean(d)``, d = a - b);
    - ``interval``: `task_interval` at ``n`` resamples (``seed``), with ``level`` and ``resamples``;
    - ``decided`` and ``decided_intervals`` (`decided`; None for both when ``decide`` is false);
    - ``p``: `sign_flip_p` with ``n_perm`` flips (``perm_seed``) and ``n_perm``;
    - ``mde``: `mde` (NaN for a single task).

    No task in both arms is refused (the message gives each arm's task count)."""
    paired = pair_tasks(a, b)
    if not paired.tasks:
        raise ValueError(f"a and b: no task in both arms (a has {len(paired.only_a)} tasks, b has "
                         f"{len(paired.only_b)}); expected at least one shared task")
    d = paired.d
    verdict = decided(d, n=decide_n, seeds=decide_seeds, level=level) if decide else None
    return {"n_tasks": len(paired.tasks), "dropped": paired.dropped,
            "dropped_tasks": {"only_a": list(paired.only_a), "only_b": list(paired.only_b)},
            "mean_a": float(paired.a.mean()), "mean_b": float(paired.b.mean()), "mean_diff": float(_diffs(d).mean()),
            "interval": task_interval(d, n=n, level=level, seed=seed), "level": level, "resamples": n,
            "decided": None if verdict is None else verdict.decided,
            "decided_intervals": None if verdict is None else list(verdict.intervals),
            "p": sign_flip_p(d, n_perm=n_perm, seed=perm_seed), "n_perm": n_perm, "mde": mde(d)}


__all__ = ["DECIDE_RESAMPLES", "DECIDE_SEEDS", "INTERVAL_RESAMPLES", "Z_ALPHA", "Z_POWER", "Decision", "PairedTasks",
           "compare_arms", "decided", "excludes_zero", "mde", "pair_tasks", "sign_flip_p", "task_interval",
           "task_means"]

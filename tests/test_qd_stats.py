"""Q&D comparison statistics (`jaxagent.eval.qd_stats`, the spec's §5.2 and §6 check 11): pairing at
the task by hand, the BCa interval over tasks (zero width for equal differences, independent of task
order, reproducible per seed, matching scipy's BCa), "decided" needing all three 50k runs, the
sign-flip p-value exactly and by Monte Carlo, the MDE by hand, and `compare_arms`."""

import math

import numpy as np
import pytest
import scipy.stats

from jaxagent.eval.qd_stats import (
    DECIDE_SEEDS,
    Z_ALPHA,
    Z_POWER,
    compare_arms,
    decided,
    excludes_zero,
    mde,
    pair_tasks,
    sign_flip_p,
    task_interval,
    task_means,
)
from jaxagent.eval.stats import bca_interval


# ----------------------------------------------------------------------------- pairing at the task
def test_per_task_aggregation_by_hand():
    a = {("t1", 0): 1.0, ("t1", 1): 0.0, ("t2", 0): 0.5, ("t2", 1): 0.5, ("t3", 0): 1.0}
    b = {("t1", 0): 0.0, ("t1", 1): 0.0, ("t2", 0): 1.0, ("t2", 1): None, ("t4", 0): 1.0, ("t5", 0): float("nan")}
    p = pair_tasks(a, b)
    # t1: a (1 + 0) / 2 = 0.5, b 0 -> 0.5; t2: a 0.5, b 1.0 (its missing seed skipped) -> -0.5
    assert p.tasks == ("t1", "t2") and p.a.tolist() == [0.5, 0.5] and p.b.tolist() == [0.0, 1.0]
    assert p.d.tolist() == [0.5, -0.5]
    # t3 only in a, t4 only in b; t5's only value is missing, so b lacks it too (and a never had it)
    assert p.only_a == ("t3",) and p.only_b == ("t4",) and p.dropped == 2
    out = compare_arms(a, b, n=1000, decide=False, n_perm=100)
    assert out["n_tasks"] == 2 and out["dropped"] == 2 and out["dropped_tasks"] == {"only_a": ["t3"], "only_b": ["t4"]}
    assert out["mean_a"] == 0.5 and out["mean_b"] == 0.5 and out["mean_diff"] == 0.0
    assert out["decided"] is None and out["decided_intervals"] is None


def test_triples_tuple_seeds_and_bad_values():
    # (training seed, rollout seed) keys: a task's value averages all four
    rows = [("q", (ts, rs), float(ts + rs)) for ts in (0, 1) for rs in (0, 1)]
    assert task_means(rows) == {"q": 1.0}
    assert task_means({(k[0], k[1]): k[2] for k in rows}) == {"q": 1.0}
    with pytest.raises(ValueError, match=r"task 'q' seed 0 given twice"):
        task_means([("q", 0, 1.0), ("q", 0, 2.0)])
    with pytest.raises(ValueError, match=r"key 'q'; expected a \(task, seed\) pair"):
        task_means({"q": 1.0})
    with pytest.raises(ValueError, match=r"value inf; expected a finite number"):
        task_means({("q", 0): float("inf")}, "a")
    with pytest.raises(ValueError, match=r"value 'x'; expected a number or None"):
        task_means([("q", 0, "x")])
    with pytest.raises(ValueError, match=r"no task in both arms \(a has 1 tasks, b has 2\)"):
        compare_arms({("x", 0): 1.0}, {("y", 0): 1.0, ("z", 0): 0.0})


# ----------------------------------------------------------------------------- intervals
def test_equal_differences_give_a_zero_width_interval_at_the_point():
    assert task_interval([0.25] * 9) == (0.25, 0.25)
    lo, hi = task_interval([0.1] * 7)
    assert lo == hi == pytest.approx(0.1, abs=1e-15)
    # arms a constant 0.25 apart on every (task, seed): every interval is that point, and it excludes zero
    a = {(f"t{i}", s): 0.25 + 0.5 * (i % 2) + 0.125 * s for i in range(6) for s in (0, 1)}
    b = {k: v - 0.25 for k, v in a.items()}
    out = compare_arms(a, b, n_perm=200)
    assert out["interval"] == (0.25, 0.25) and out["decided_intervals"] == [(0.25, 0.25)] * 3
    assert out["decided"] is True and out["mde"] == 0.0
    zero = decided([0.0] * 5)
    assert zero.intervals == ((0.0, 0.0),) * 3 and zero.decided is False


def test_intervals_do_not_depend_on_task_order_and_reproduce_for_a_seed():
    rng = np.random.default_rng(3)
    d = rng.normal(0.05, 0.3, 60)
    shuffled = rng.permutation(d)
    assert not np.array_equal(d, shuffled)
    iv = task_interval(d)
    assert task_interval(shuffled) == iv and task_interval(d) == iv
    assert task_interval(d, seed=1) != iv  # the seed is used
    assert decided(shuffled, n=5000) == decided(d, n=5000)
    assert sign_flip_p(shuffled, n_perm=2000, seed=4) == sign_flip_p(d, n_perm=2000, seed=4)
    assert mde(shuffled) == mde(d)
    # the same arms given in another order of tasks and seeds: the same report, exactly
    a = {(f"t{i}", s): float(rng.uniform()) for i in range(30) for s in (0, 1)}
    b = {(f"t{i}", s): float(rng.uniform()) for i in range(30) for s in (0, 1)}
    keys = list(a)
    order = rng.permutation(len(keys))
    a2 = {keys[j]: a[keys[j]] for j in order}
    b2 = {keys[j]: b[keys[j]] for j in order[::-1]}
    kw = dict(n=2000, decide_n=2000, n_perm=500)
    assert compare_arms(a2, b2, **kw) == compare_arms(a, b, **kw)


@pytest.mark.parametrize("data", ["normal", "exponential", "lognormal"])
def test_intervals_match_scipy_bca(data):
    rng = np.random.default_rng(11)
    d = {"normal": rng.normal(0.1, 1.0, 40), "exponential": rng.exponential(1.0, 30) - 0.8,
         "lognormal": rng.lognormal(0.0, 0.8, 50) - 1.0}[data]
    assert len(np.unique(d)) == d.size  # continuous: no ties
    ref = scipy.stats.bootstrap((d,), np.mean, method="BCa", n_resamples=100_000, random_state=0).confidence_interval
    width = ref.high - ref.low
    np.testing.assert_allclose(task_interval(d, n=100_000), (ref.low, ref.high), atol=0.02 * width)
    for iv in decided(d).intervals:  # the three 50k runs
        np.testing.assert_allclose(iv, (ref.low, ref.high), atol=0.02 * width)
    # the printed 10k interval carries more resampling error (a skewed tail's end: up to ~2% of the width)
    np.testing.assert_allclose(task_interval(d), (ref.low, ref.high), atol=0.04 * width)


# ----------------------------------------------------------------------------- decided
def test_decided_runs_three_50k_bca_runs_with_seeds_101_202_303():
    d = np.random.default_rng(5).normal(0.4, 1.0, 25)
    v = decided(d)
    assert v.seeds == DECIDE_SEEDS == (101, 202, 303) and v.n == 50_000
    assert v.intervals == tuple(bca_interval(np.sort(d), n=50_000, rng=np.random.default_rng(s))
                                for s in (101, 202, 303))
    assert len(set(v.intervals)) == 3  # independent runs


def test_decided_false_when_zero_is_inside_and_true_when_clearly_excluded():
    rng = np.random.default_rng(8)
    inside = rng.normal(0.0, 1.0, 40)
    v = decided(inside)
    assert v.decided is False and all(lo < 0 < hi for lo, hi in v.intervals)
    clear = rng.normal(1.0, 1.0, 40)
    v = decided(clear)
    assert v.decided is True and all(lo > 0 for lo, _ in v.intervals)
    below = decided(-clear)
    assert below.decided is True and all(hi < 0 for _, hi in below.intervals)


def test_decided_needs_all_three_runs():
    """The interval shifts with the data (same resamples), so a shift puts zero between the three
    runs' lower ends: one or two runs exclude zero, the verdict stays False; below all three, True."""
    d = np.random.default_rng(9).normal(0.0, 1.0, 30)
    l1, l2, l3 = sorted(lo for lo, _ in decided(d).intervals)
    assert l1 < l2 < l3
    eps = 1e-3 * (l2 - l1)
    for shift, n_excluding, verdict in [(-(l2 + l3) / 2, 1, False), (-(l1 + l2) / 2, 2, False),
                                        (-l1 - eps, 2, False), (-l1 + eps, 3, True)]:
        v = decided(d + shift)
        assert sum(excludes_zero(iv) for iv in v.intervals) == n_excluding and v.decided is verdict, shift
    assert excludes_zero((0.0, 1.0)) is False and excludes_zero((-1.0, 0.0)) is False
    assert excludes_zero((1e-9, 1.0)) and excludes_zero((-1.0, -1e-9))


# ----------------------------------------------------------------------------- p-value
@pytest.mark.parametrize("d,p", [
    # sum 10; |sum| >= 10 only for all + and all -: 2 / 16
    ([1.0, 2.0, 3.0, 4.0], 2 / 16),
    # magnitudes 0.5, 1, 2, 3 (total 6.5); sum(s * d) = 6.5 - 2 * (negated magnitudes) and |sum(d)| = 4.5, so a
    # hit negates a set of magnitude <= 1 ({}, {0.5}, {1}) or >= 5.5 (their complements): 6 / 16
    ([0.5, -1.0, 2.0, 3.0], 6 / 16),
    # a zero difference flips to itself: |sum| >= 2 for (+, +) and (-, -) of the two ones, 4 of 8 vectors
    ([1.0, 0.0, 1.0], 4 / 8),
])
def test_sign_flip_p_exact_by_hand_and_monte_carlo(d, p):
    assert sign_flip_p(d, exact=True) == p
    assert sign_flip_p(d, n_perm=200_000, seed=1) == pytest.approx(p, abs=0.005)


def test_sign_flip_p_counts_plus_one():
    # thirty equal differences: a random flip reaches |sum| = 30 with chance 2^-29, so no hit: 1 / (n + 1)
    assert sign_flip_p([1.0] * 30, n_perm=999, seed=0) == 1 / 1000
    # all zero: every flip is a hit
    assert sign_flip_p([0.0] * 5, n_perm=99) == 1.0 and sign_flip_p([0.0] * 5, exact=True) == 1.0
    assert sign_flip_p([1.0, -2.0, 0.5], n_perm=500, seed=3) == sign_flip_p([1.0, -2.0, 0.5], n_perm=500, seed=3)
    with pytest.raises(ValueError, match="exact=True with 21 tasks: expected at most 20"):
        sign_flip_p([1.0] * 21, exact=True)
    with pytest.raises(ValueError, match="n_perm=0: expected an integer >= 1"):
        sign_flip_p([1.0, 2.0], n_perm=0)


# ----------------------------------------------------------------------------- MDE
def test_mde_by_hand():
    # d = [0, 1]: sd = sqrt(1/2), / sqrt(2) = 1/2
    assert mde([0.0, 1.0]) == pytest.approx((1.95996 + 0.84162) / 2, rel=1e-12) == pytest.approx(1.40079)
    # d = [1, 2, 3, 4]: squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, sd = sqrt(5/3), n = 4
    assert mde([1.0, 2.0, 3.0, 4.0]) == pytest.approx(2.80158 * math.sqrt(5 / 3) / 2, rel=1e-12)
    assert mde([1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.808412, abs=1e-6)
    assert (Z_ALPHA, Z_POWER) == (1.95996, 0.84162)
    assert math.isnan(mde([0.3]))  # one task: no spread to estimate
    with pytest.raises(ValueError, match="non-empty"):
        mde([])


# ----------------------------------------------------------------------------- compare_arms and bad input
def test_compare_arms_fields():
    rng = np.random.default_rng(2)
    a = {(f"t{i}", s): float(rng.normal(0.6, 0.2)) for i in range(40) for s in (0, 1)}
    b = {(f"t{i}", s): float(rng.normal(0.4, 0.2)) for i in range(40) for s in (0, 1)}
    out = compare_arms(a, b, n_perm=2000)
    p = pair_tasks(a, b)
    assert out["n_tasks"] == 40 and out["dropped"] == 0
    assert out["mean_diff"] == pytest.approx(float(p.d.mean()), abs=1e-15)
    assert out["interval"] == task_interval(p.d) and out["resamples"] == 10_000 and out["level"] == 0.95
    assert out["decided"] is True and out["decided_intervals"] == list(decided(p.d).intervals)
    assert out["p"] == sign_flip_p(p.d, n_perm=2000) == 1 / 2001  # a large effect: no flip reaches it
    assert out["mde"] == mde(p.d)


def test_bad_input():
    with pytest.raises(ValueError, match="non-empty"):
        task_interval([])
    with pytest.raises(ValueError, match="finite"):
        task_interval([0.0, float("nan")])
    with pytest.raises(ValueError, match="n=0: expected an integer >= 1"):
        task_interval([0.0, 1.0], n=0)
    with pytest.raises(ValueError, match="level=1.5"):
        task_interval([0.0, 1.0], level=1.5)
    with pytest.raises(ValueError, match="seeds=.*expected at least one seed"):
        decided([0.0, 1.0], seeds=())

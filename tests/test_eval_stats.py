"""Paired bootstrap intervals (`jaxagent.eval.stats`): the BCa interval against scipy's, the
jackknife acceleration by hand, equivariance properties, degenerate and bad input."""

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.eval.stats import bca_interval, jackknife_acceleration, paired_bca, percentile_interval


def test_jackknife_acceleration_by_hand():
    # d = [0, 0, 3]: deviations -1, -1, 2: sum e^3 = 6, sum e^2 = 6 -> 6 / (6 * 6^1.5)
    assert jackknife_acceleration([0, 0, 3]) == pytest.approx(1 / 6**1.5, rel=1e-12)
    assert jackknife_acceleration([1, 1, 1]) == 0.0 and jackknife_acceleration([2.0]) == 0.0
    # symmetric data: no skew, no acceleration
    assert jackknife_acceleration([-1, 0, 1]) == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("data", ["normal", "exponential", "success"])
def test_bca_matches_scipy(data):
    rng = np.random.default_rng(1)
    d = {"normal": rng.normal(0.1, 1.0, 30), "exponential": rng.exponential(1.0, 25),
         # per-task success differences of two runs: many ties, a skewed spread
         "success": np.array([0, 0, 0, 1, 1, 0, 0.5, 1, 0, 1.0, 0, 0, -0.25, 1])}[data]
    ours = bca_interval(d, n=100_000)
    ref = scipy.stats.bootstrap((d,), np.mean, method="BCa", n_resamples=100_000, random_state=0).confidence_interval
    width = ref.high - ref.low
    np.testing.assert_allclose(ours, (ref.low, ref.high), atol=0.02 * width)


def test_percentile_interval_is_the_quantiles_of_resampled_means():
    d = np.array([0.0, 1.0, 0.5, 0.25, 1.0, 0.0])
    rng = np.random.default_rng(7)
    means = d[rng.integers(0, d.size, size=(2000, d.size))].mean(axis=1)
    assert percentile_interval(d, n=2000, rng=np.random.default_rng(7)) == tuple(np.quantile(means, [0.025, 0.975]))


def test_degenerate_and_bad_input():
    assert bca_interval([0.25] * 5) == (0.25, 0.25)
    assert paired_bca([1, 1, 0], [0, 1, 0], n=1000)[0] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="lengths 2 and 3"):
        paired_bca([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="non-empty"):
        bca_interval([])
    with pytest.raises(ValueError, match="finite"):
        bca_interval([0.0, float("nan")])
    with pytest.raises(ValueError, match="level=1.5"):
        bca_interval([0.0, 1.0], level=1.5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=3, max_size=25), st.floats(-3, 3), st.floats(0.1, 4))
def test_bca_is_equivariant_under_shift_and_scale(d, shift, scale):
    """Same resamples (same seed): shifting the data shifts the interval, scaling scales it."""
    d = np.asarray(d)
    lo, hi = bca_interval(d, n=500)
    lo2, hi2 = bca_interval(scale * d + shift, n=500)
    tol = 1e-7 * (1 + abs(shift) + scale * np.abs(d).max())
    assert lo <= hi
    assert lo2 == pytest.approx(scale * lo + shift, abs=tol) and hi2 == pytest.approx(scale * hi + shift, abs=tol)


def test_ties_keep_the_interval_equivariant_where_scipys_moves():
    # Why eval.stats keeps its own BCa (module docstring): per-task success differences tie a lot,
    # and a shift of the data changes which resampled means scipy counts below the observed one.
    import warnings

    d = np.array([0, 0, 1, 1, 0, 0.5, 0, 1, 0, 0, -1, 0.25])
    shift = 0.1

    def scipy_bca(x):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = scipy.stats.bootstrap((x,), np.mean, method="BCa", n_resamples=2000,
                                      random_state=np.random.default_rng(0)).confidence_interval
        return np.array([r.low, r.high])

    moved = np.abs(scipy_bca(d + shift) - (scipy_bca(d) + shift)).max()
    ours = np.abs(np.array(bca_interval(d + shift, n=2000)) - (np.array(bca_interval(d, n=2000)) + shift)).max()
    assert moved > 1e-3 and ours < 1e-12

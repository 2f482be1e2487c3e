"""The sampler's building blocks: `argmax_first` against `jnp.argmax`, `draw_categorical` against
the softmax (a chi-square test), a naive float64 two-level inverse CDF on the same uniforms, and
its edge cases (-inf ids, whole -inf blocks, one finite id, a partial last block)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import stats

from jaxagent.models.generate import argmax_first, draw_categorical

_VALUES = st.sampled_from([-np.inf, -3.0, -1.0, 0.0, 0.5, 1.0, 2.0, np.inf, np.nan])


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 40)), elements=_VALUES))
def test_argmax_first_is_jnp_argmax(x):
    """Ties, infinities and NaN included (few distinct values: ties are common)."""
    np.testing.assert_array_equal(argmax_first(jnp.asarray(x)), jnp.argmax(jnp.asarray(x), axis=-1))


def test_argmax_first_hand_computed():
    x = jnp.array([[1.0, 3.0, 3.0, 2.0], [-jnp.inf] * 4, [0.0, jnp.nan, 5.0, jnp.nan]])
    assert argmax_first(x).tolist() == [1, 0, 1]


def _keys(n, seed=0):
    return jax.random.split(jax.random.key(seed), n)


def _naive_two_level(u, logits, block):
    """The same draw in float64 with Python loops: block by its mass, then the id within it."""
    p = np.exp(np.asarray(logits, np.float64) - np.max(logits))
    blocks = [p[i:i + block] for i in range(0, len(p), block)]
    mass = np.array([b.sum() for b in blocks])
    j = int(np.searchsorted(np.cumsum(mass), u[0] * mass.sum(), side="right"))
    i = int(np.searchsorted(np.cumsum(blocks[j]), u[1] * mass[j], side="right"))
    return j * block + i


@pytest.mark.parametrize("V,block", [(700, 256), (64, 16), (5, 256)])
def test_draw_equals_a_naive_float64_inverse_cdf_on_the_same_uniforms(V, block):
    n = 300
    logits = jax.random.normal(jax.random.key(1), (n, V)) * 3.0
    keys = _keys(n)
    tok, logz = draw_categorical(keys, logits, block=block)
    u = np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (2,)))(keys))
    want = [_naive_two_level(u[b], np.asarray(logits[b]), block) for b in range(n)]
    np.testing.assert_array_equal(tok, want)
    np.testing.assert_allclose(logz, jax.nn.logsumexp(logits, axis=-1), rtol=1e-6)


def test_draw_frequencies_match_the_softmax():
    """Chi-square goodness of fit over 3 blocks (the last one partial), 60,000 draws of one row."""
    V, n = 600, 60_000
    logits = jax.random.normal(jax.random.key(3), (V,)) * 1.5
    tok, _ = draw_categorical(_keys(n, 7), jnp.broadcast_to(logits, (n, V)), block=256)
    p = np.exp(np.asarray(logits, np.float64))
    p /= p.sum()
    counts = np.bincount(np.asarray(tok), minlength=V)
    rare = p * n < 5  # pooled into one cell, so that every expected count is >= 5 (chi-square's condition)
    obs = np.append(counts[~rare], counts[rare].sum())
    exp = np.append(p[~rare], p[rare].sum()) * n
    assert exp.min() >= 5
    assert stats.chisquare(obs, exp).pvalue > 1e-3


def test_hand_computed_frequencies_and_never_a_minus_inf_id():
    n = 20_000
    probs = jnp.array([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    logits = jnp.broadcast_to(jnp.log(probs), (n, 6))  # log 0 = -inf
    tok, logz = draw_categorical(_keys(n), logits, block=2)  # block 0 = ids 0-1, 1 = 2-3, 2 = 4-5
    freq = np.bincount(np.asarray(tok), minlength=6) / n
    np.testing.assert_allclose(freq, probs, atol=0.01)
    assert freq[1] == 0 and freq[5] == 0
    np.testing.assert_allclose(logz, 0.0, atol=1e-6)


@pytest.mark.parametrize("finite", [0, 255, 256, 511, 599])
def test_one_finite_id_is_always_drawn(finite):
    """Whole blocks at -inf before and after it, and a last block padded past V."""
    n = 64
    logits = jnp.full((n, 600), -jnp.inf).at[:, finite].set(-80.0)
    tok, logz = draw_categorical(_keys(n), logits, block=256)
    assert set(np.asarray(tok).tolist()) == {finite}
    np.testing.assert_allclose(logz, -80.0)


def test_a_rows_draw_depends_on_its_key_and_logits_only():
    logits = jax.random.normal(jax.random.key(4), (8, 1000))
    keys = _keys(8, 5)
    together, _ = draw_categorical(keys, logits)
    alone = [int(draw_categorical(keys[b:b + 1], logits[b:b + 1])[0][0]) for b in range(8)]
    assert np.asarray(together).tolist() == alone

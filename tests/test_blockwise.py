"""Blockwise attention (`jaxagent.models.blockwise`) against the plain XLA path: values and
gradients on every attention structure (causal, packed segments with padding, the arbitrary masks
of the shared-prefix info-gain layout, a cache extension S > L), block sizes that do not divide the
lengths, GQA; queries that see nothing; the model and the info-gain scorer end to end; the
``attn_impl`` setting reaching the model from a run config."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent import configlib
from jaxagent.models import attention_structure, attention_xla, forward, init_params, preset, token_logprobs
from jaxagent.models.attention import attention
from jaxagent.models.blockwise import attention_blockwise
from jaxagent.models.config import ConfigError

SCALE = 0.35


def _qkv(B=2, L=37, S=None, N=4, K=2, H=8, seed=0):
    S = L if S is None else S
    rng = np.random.default_rng(seed)
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    return f(B, L, N, H), f(B, S, K, H), f(B, S, K, H)


def _structures(B, L, S, seed=1):
    """Named keyword sets for both implementations."""
    rng = np.random.default_rng(seed)
    packed = np.zeros((B, L), np.int32)  # two packed sequences, then padding (id 0)
    packed[:, : L // 3] = 1
    packed[:, L // 3: L - 5] = 2
    mask = rng.random((B, L, S)) < 0.6
    return {
        "causal": dict(causal=True),
        "causal+segments": dict(causal=True, segment_ids_BL=jnp.asarray(packed)),
        "causal+mask": dict(causal=True, mask_BLS=jnp.asarray(mask)),
        "causal+segments+mask": dict(causal=True, segment_ids_BL=jnp.asarray(packed), mask_BLS=jnp.asarray(mask)),
        "bidirectional+mask": dict(causal=False, mask_BLS=jnp.asarray(mask)),
        "bidirectional": dict(causal=False),
    }


def _sees_some_key(kw, B, L, S):
    allowed = attention_structure(L, S, batch=B, **kw)
    return np.ones((B, L), bool) if allowed is None else np.asarray(allowed).any(-1)


@pytest.mark.parametrize("blocks", [(8, 8), (16, 5), (64, 64)], ids=["8x8", "16x5", "one-block"])
@pytest.mark.parametrize("name", list(_structures(2, 37, 37)))
def test_values_and_gradients_equal_the_xla_path(name, blocks):
    B, L = 2, 37
    q, k, v = _qkv(B, L)
    kw = _structures(B, L, L)[name]
    sees = _sees_some_key(kw, B, L, L)
    assert sees.any() and (name != "causal+segments" or not sees.all())  # padding queries see nothing
    allowed = attention_structure(L, L, **kw)
    ref = functools.partial(attention_xla, allowed_BLS=allowed, scale=SCALE)
    ours = functools.partial(attention_blockwise, scale=SCALE, block_q=blocks[0], block_k=blocks[1], **kw)
    w = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32) * sees[:, :, None, None]

    got, want = jax.jit(ours)(q, k, v), ref(q, k, v)
    np.testing.assert_allclose(np.asarray(got)[sees], np.asarray(want)[sees], atol=1e-5, rtol=0)
    assert np.isfinite(np.asarray(got)).all()
    g_ours = jax.jit(jax.grad(lambda *x: jnp.sum(ours(*x) * w), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.grad(lambda *x: jnp.sum(ref(*x) * w), argnums=(0, 1, 2))(q, k, v)
    for a, b, what in zip(g_ours, g_ref, "qkv"):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=0, err_msg=f"d{what}")


@pytest.mark.parametrize("N,K", [(4, 4), (8, 2), (3, 1)])
def test_gqa_groups_and_a_cache_extension(N, K):
    """Queries that are the last L of S keys (causal, S > L), for each head grouping."""
    B, L, S = 2, 11, 30
    q, k, v = _qkv(B, L, S, N=N, K=K)
    allowed = attention_structure(L, S, causal=True)
    want = attention_xla(q, k, v, allowed, scale=SCALE)
    got = attention_blockwise(q, k, v, scale=SCALE, causal=True, block_q=4, block_k=7)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    gw = jax.grad(lambda *x: jnp.sum(jnp.sin(attention_xla(*x, allowed, scale=SCALE))), argnums=(0, 1, 2))(q, k, v)
    go = jax.grad(lambda *x: jnp.sum(jnp.sin(attention_blockwise(*x, scale=SCALE, block_q=4, block_k=7))),
                  argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(go, gw):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


def test_a_query_that_sees_nothing_is_finite_and_passes_no_gradient_to_q():
    B, L = 1, 10
    q, k, v = _qkv(B, L, N=2, K=1)
    mask = np.ones((B, L, L), bool)
    mask[0, 4] = False  # query 4 sees no key
    out = attention_blockwise(q, k, v, scale=SCALE, causal=True, mask_BLS=jnp.asarray(mask), block_q=4, block_k=4)
    assert np.isfinite(np.asarray(out)).all()
    dq = jax.grad(lambda q: jnp.sum(attention_blockwise(q, k, v, scale=SCALE, mask_BLS=jnp.asarray(mask),
                                                        block_q=4, block_k=4)))(q)
    np.testing.assert_array_equal(np.asarray(dq)[0, 4], 0.0)
    assert np.abs(np.asarray(dq)[0, 5]).max() > 0


def test_bad_arguments_are_named():
    q, k, v = _qkv(1, 8, N=3, K=2)
    with pytest.raises(ValueError, match="3 query heads are not a multiple of 2"):
        attention_blockwise(q, k, v, scale=SCALE)
    q, k, v = _qkv(1, 8)
    with pytest.raises(ValueError, match="block_q=0"):
        attention_blockwise(q, k, v, scale=SCALE, block_q=0)
    with pytest.raises(ValueError, match="attn_impl='flash'"):
        attention(q, k, v, scale=SCALE, impl="flash")


# ----------------------------------------------------------------------------- in the model
CFG = preset("tiny-qwen3", vocab_size=64, max_position_embeddings=128)


def test_the_model_with_blockwise_attention_equals_xla_in_values_and_gradients(blockwise_calls):
    params = init_params(jax.random.key(0), CFG)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(1, 64, (2, 40)), jnp.int32)
    seg = np.ones((2, 40), np.int32)
    seg[0, 25:] = 2  # two sequences packed in row 0
    seg[1, 33:] = 0  # padding in row 1
    seg = jnp.asarray(seg)
    blockwise = CFG.replace(attn_impl="blockwise")
    a = forward(params, tokens, config=CFG, segment_ids_BL=seg)
    assert not blockwise_calls
    b = forward(params, tokens, config=blockwise, segment_ids_BL=seg)
    assert blockwise_calls
    real = np.asarray(seg) > 0
    np.testing.assert_allclose(np.asarray(b)[real], np.asarray(a)[real], atol=1e-5, rtol=0)
    # the call's own attn_impl wins over the config's
    np.testing.assert_array_equal(forward(params, tokens, config=blockwise, segment_ids_BL=seg, attn_impl="xla"), a)

    def loss(p, cfg):
        lp = token_logprobs(p, tokens, config=cfg, segment_ids_BL=seg)
        return -jnp.sum(lp * (seg > 0))

    ga = jax.grad(loss)(params, CFG)
    gb = jax.jit(jax.grad(loss), static_argnums=1)(params, blockwise)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(y, x, atol=1e-4, rtol=0, err_msg=jax.tree_util.keystr(path))


@pytest.fixture
def blockwise_calls(monkeypatch):
    """Counts the traces that reach `attention_blockwise` through `attention`."""
    import sys

    attention_module = sys.modules["jaxagent.models.attention"]  # the package's `attention` is the function
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs.get("mask_BLS") is not None)
        return attention_blockwise(*args, **kwargs)

    monkeypatch.setattr(attention_module, "attention_blockwise", counted)
    return calls


def test_the_shared_prefix_infogain_scorer_with_blockwise_attention(blockwise_calls):
    """The arbitrary [B, L, L] masks of the packed counterfactual layout, and padding."""
    from jaxagent.train.synthetic import synthetic_batch
    from jaxagent.train.infogain import compute_infogain

    batch = synthetic_batch(np.random.default_rng(1), batch=3, length=72, turns=6, vocab=64)
    params = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, init_params(jax.random.key(0), CFG))
    want = compute_infogain(params, batch, [5, 6, 7], config=CFG, mode="shared_prefix")
    assert not blockwise_calls
    got = compute_infogain(params, batch, [5, 6, 7], config=CFG.replace(attn_impl="blockwise"), mode="shared_prefix")
    assert blockwise_calls and all(blockwise_calls)  # the config's choice, with the layout's mask
    valid = np.asarray(want.valid_BT)
    assert valid.sum() >= 4
    np.testing.assert_allclose(np.asarray(got.r_info_BT), np.asarray(want.r_info_BT), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(got.counterfactual_sum_BT), np.asarray(want.counterfactual_sum_BT),
                               atol=1e-4, rtol=0)


def test_attn_impl_is_validated_and_comes_from_the_run_config():
    with pytest.raises(ConfigError, match="attn_impl.*'xla', 'cudnn', 'blockwise', 'splash' or 'auto'"):
        CFG.replace(attn_impl="flash")
    assert "attn_impl" not in CFG.replace(attn_impl="blockwise").to_hf_dict()
    from jaxagent.jobs.build import build_model, model_config
    from jaxagent.jobs.config import load_config

    assert model_config(load_config(overrides=["model.attn_impl=blockwise"]), 64).attn_impl == "blockwise"
    with pytest.raises(Exception, match="model.attn_impl"):
        load_config(overrides=["model.attn_impl=flash"])
    # a GPU config (its --dry-run passes anywhere) run on this CPU: refused before any weight is read
    if jax.default_backend() != "gpu":
        with pytest.raises(configlib.ConfigError, match="model.attn_impl=.cudnn.: needs a GPU backend"):
            build_model(load_config(overrides=["model.attn_impl=cudnn", "model.path=/nonexistent"]), None, None)
    if jax.default_backend() != "tpu":
        with pytest.raises(configlib.ConfigError, match="model.attn_impl=.splash.: needs a TPU backend"):
            build_model(load_config(overrides=["model.attn_impl=splash", "model.path=/nonexistent"]), None, None)


def test_auto_is_blockwise_on_a_cpu_cudnn_on_a_gpu_for_16_bit():
    from jaxagent.models.attention import resolve_impl

    backend = jax.default_backend()
    want32 = {"cpu": "blockwise", "gpu": "xla", "tpu": "splash"}.get(backend, "xla")
    want16 = {"cpu": "blockwise", "gpu": "cudnn", "tpu": "splash"}.get(backend, "xla")
    assert resolve_impl("auto", jnp.float32) == want32 and resolve_impl("auto", jnp.bfloat16) == want16
    impls = ("xla", "cudnn", "blockwise", "splash")
    assert [resolve_impl(i, jnp.float32) for i in impls] == list(impls)
    from jaxagent.jobs.config import load_config

    assert load_config().model.attn_impl == "auto"  # what runs get unless they say otherwise


def test_a_prefill_into_a_cache_with_blockwise_attention_equals_xla(monkeypatch):
    """`extend` twice (rows of different lengths, then a second chunk on top): the logits of each
    row's last new token and the cache agree with the XLA path; greedy decoding afterwards too."""
    from jaxagent.models.generate import SamplingParams, extend, generate_from_prompts, init_cache

    import sys

    generate_module = sys.modules["jaxagent.models.generate"]
    calls = []
    monkeypatch.setattr(generate_module, "attention_blockwise",
                        lambda *a, **k: calls.append(k["query_offset_B"].shape) or attention_blockwise(*a, **k))
    params = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, init_params(jax.random.key(0), CFG))
    rng = np.random.default_rng(3)
    first = jnp.asarray(rng.integers(1, 64, (3, 21)), jnp.int32)
    second = jnp.asarray(rng.integers(1, 64, (3, 13)), jnp.int32)
    n1, n2 = jnp.asarray([21, 7, 15]), jnp.asarray([13, 0, 9])
    out = {}
    for impl in ("xla", "blockwise"):
        cfg = CFG.replace(attn_impl=impl)
        cache = init_cache(cfg, 3, 48)
        l1, cache = extend(params, cache, first, n1, config=cfg, window=40)
        l2, cache = extend(params, cache, second, n2, config=cfg, window=40)
        out[impl] = (l1, l2, cache)
        assert bool(calls) == (impl == "blockwise")
    (a1, a2, ac), (b1, b2, bc) = out["xla"], out["blockwise"]
    np.testing.assert_allclose(b1, a1, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(b2)[[0, 2]], np.asarray(a2)[[0, 2]], atol=1e-4, rtol=0)  # row 1: no new token
    # layer 0's keys and values come before any attention: equal; later layers' carry its rounding
    np.testing.assert_array_equal(bc.k[0], ac.k[0])
    np.testing.assert_allclose(bc.k, ac.k, atol=1e-4, rtol=0)  # |k| up to ~6 with these x4 weights
    np.testing.assert_allclose(bc.v, ac.v, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(bc.lengths, ac.lengths)
    np.testing.assert_array_equal(out["xla"][2].lengths, [34, 7, 24])
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 8], [10, 11, 12, 13, 14]]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=6)
    got, _ = generate_from_prompts(params, prompts, config=CFG.replace(attn_impl="blockwise"), sampling=sampling,
                                   key=jax.random.key(0))
    want, _ = generate_from_prompts(params, prompts, config=CFG, sampling=sampling, key=jax.random.key(0))
    np.testing.assert_array_equal(got.tokens, want.tokens)

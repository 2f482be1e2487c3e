"""The Pallas splash-attention path (`jaxagent.models.splash`) against the plain XLA path, run in
Pallas's interpreter on this CPU (the TPU kernel's own code, not a stand-in): values and gradients
on causal, bidirectional and packed-segment structures with padding under GQA; the model end to
end; `attention(impl="splash")` handing what the kernel cannot express (an arbitrary mask, a
cache extension, a length that is not a multiple of 128) to the blockwise path; bad lengths named."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import attention_structure, attention_xla, forward, init_params, preset, token_logprobs
from jaxagent.models.attention import attention
from jaxagent.models.blockwise import attention_blockwise
from jaxagent.models.splash import attention_splash, splash_applies

SCALE = 0.3
attention_module = importlib.import_module("jaxagent.models.attention")  # the module (the package exports the function)


def _qkv(B, L, N, K, H=16, S=None, seed=0):
    S = L if S is None else S
    rng = np.random.default_rng(seed)
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    return f(B, L, N, H), f(B, S, K, H), f(B, S, K, H)


def _packed(B, L):
    seg = np.ones((B, L), np.int32)
    seg[0, 100:] = 2  # two sequences packed in row 0
    seg[-1, L - 37:] = 0  # padding at the end of the last row
    return jnp.asarray(seg)


@pytest.mark.parametrize("causal,segments,N,K", [(True, False, 4, 2), (True, True, 4, 4), (False, True, 2, 1)],
                         ids=["causal-gqa", "causal+segments", "bidirectional+segments-mqa"])
def test_values_and_gradients_equal_the_xla_path(causal, segments, N, K):
    B, L = 2, 256  # two 128-blocks: the kernel's block skipping and its online softmax both run
    q, k, v = _qkv(B, L, N, K)
    seg = _packed(B, L) if segments else None
    real = np.ones((B, L), bool) if seg is None else np.asarray(seg) > 0
    w = jnp.asarray(np.random.default_rng(1).normal(size=(B, L, N, q.shape[-1])) * real[:, :, None, None], jnp.float32)
    allowed = attention_structure(L, L, segment_ids_BL=seg, causal=causal)

    def splash(q, k, v):
        return attention_splash(q, k, v, scale=SCALE, causal=causal, segment_ids_BL=seg)

    def xla(q, k, v):
        return attention_xla(q, k, v, allowed, scale=SCALE)

    got, want = splash(q, k, v), xla(q, k, v)
    assert bool(jnp.isfinite(got).all())  # padding queries too (they see padding keys)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5, rtol=0)
    g_got = jax.grad(lambda *a: jnp.sum(splash(*a) * w), argnums=(0, 1, 2))(q, k, v)
    g_want = jax.grad(lambda *a: jnp.sum(xla(*a) * w), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", g_got, g_want):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0, err_msg=f"d{name}")


def test_the_model_with_splash_attention_equals_xla(monkeypatch):
    cfg = preset("tiny-qwen2", vocab_size=64, max_position_embeddings=256)
    params = init_params(jax.random.key(0), cfg)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 64, (2, 128)), jnp.int32)
    seg = np.ones((2, 128), np.int32)
    seg[0, 70:] = 2
    seg[1, 110:] = 0
    seg = jnp.asarray(seg)
    calls = []
    monkeypatch.setattr(attention_module, "attention_splash",
                        lambda *a, **kw: calls.append(a[0].shape) or attention_splash(*a, **kw))
    want = forward(params, tokens, config=cfg, segment_ids_BL=seg)
    got = forward(params, tokens, config=cfg.replace(attn_impl="splash"), segment_ids_BL=seg)
    assert calls  # the kernel ran in every layer's attention
    real = np.asarray(seg) > 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5, rtol=0)

    def loss(p, impl):
        return -jnp.sum(token_logprobs(p, tokens, config=cfg.replace(attn_impl=impl), segment_ids_BL=seg) * (seg > 0))

    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(jax.grad(loss)(params, "xla")),
                            jax.tree.leaves(jax.grad(loss)(params, "splash"))):
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=0, err_msg=jax.tree_util.keystr(path))


def test_what_the_kernel_cannot_express_goes_to_the_blockwise_path(monkeypatch):
    calls = []
    monkeypatch.setattr(attention_module, "attention_blockwise",
                        lambda *a, **kw: calls.append(a[0].shape) or attention_blockwise(*a, **kw))
    monkeypatch.setattr(attention_module, "attention_splash", lambda *a, **kw: pytest.fail("splash called"))
    mask = jnp.asarray(np.random.default_rng(2).random((2, 128, 128)) < 0.6)
    cases = [dict(L=128, mask_BLS=mask), dict(L=128, S=160), dict(L=200)]  # a mask; a cache extension; L % 128
    for case in cases:
        L, S = case["L"], case.get("S", case["L"])
        q, k, v = _qkv(2, L, 4, 2, S=S)
        assert not splash_applies(L, S, case.get("mask_BLS"))
        got = attention(q, k, v, scale=SCALE, causal=True, mask_BLS=case.get("mask_BLS"), impl="splash")
        allowed = attention_structure(L, S, batch=2, mask_BLS=case.get("mask_BLS"), causal=True)
        sees = np.ones((2, L), bool) if allowed is None else np.asarray(allowed).any(-1)
        want = attention_xla(q, k, v, allowed, scale=SCALE)
        np.testing.assert_allclose(np.asarray(got)[sees], np.asarray(want)[sees], atol=1e-5, rtol=0)
    assert len(calls) == len(cases)


def test_bad_lengths_are_named():
    q, k, v = _qkv(1, 200, 2, 1)
    with pytest.raises(ValueError, match="q length 200, kv length 200; expected equal lengths, a multiple of 128"):
        attention_splash(q, k, v, scale=SCALE)
    q, k, v = _qkv(1, 128, 2, 1, S=256)
    with pytest.raises(ValueError, match="q length 128, kv length 256"):
        attention_splash(q, k, v, scale=SCALE)

"""Unit tests of the pure model functions: config, RoPE, RMSNorm, attention structure, forward,
chunked log-probs, remat, dtype policy and input errors."""

import math

import chex
import jax
from hypothesis import given, settings
from hypothesis import strategies as st
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import (
    ConfigError,
    DTypePolicy,
    QwenConfig,
    RopeScaling,
    attention_structure,
    attention_xla,
    forward,
    init_params,
    next_token_targets,
    param_shapes,
    preset,
    preset_names,
    token_logprobs,
)
from jaxagent.models.config import rope_inv_freq
from jaxagent.models.qwen import apply_rope, rms_norm

TINY = preset("tiny-qwen2", vocab_size=64, max_position_embeddings=64)
TINY3 = preset("tiny-qwen3", vocab_size=64, max_position_embeddings=64)
# Two computations of the same quantity through differently shaped float32 matmuls differ by
# round-off (~1e-5 on logits of size ~3 here); a structural mistake moves them by > 1e-2.
ATOL = 1e-4


def _params(cfg, seed=0, scale=8.0):
    """Random params with larger-than-default weights so logits are far from uniform."""
    p = init_params(jax.random.key(seed), cfg)
    keys = iter(jax.random.split(jax.random.key(seed + 1), 64))
    return jax.tree.map(lambda x: x * scale if x.ndim > 1 else x + 0.1 * jax.random.normal(next(keys), x.shape), p)


def assert_close_to_scale(a, b, rel=1e-5):
    """Each leaf of ``a`` equals ``b`` within ``rel`` times the leaf's largest magnitude (float32
    sums reordered by recomputation or chunking err relative to the largest terms summed)."""

    def check(x, y):
        x, y = np.asarray(x), np.asarray(y)
        scale = max(float(np.abs(y).max()), 1e-30)
        assert float(np.abs(x - y).max()) <= rel * scale, (float(np.abs(x - y).max()), scale)

    jax.tree.map(check, a, b)


def _tokens(B, L, V, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, (B, L)), jnp.int32)


# ----------------------------------------------------------------------------- config
def test_presets_build_and_count_params():
    for name in preset_names():
        cfg = preset(name)
        shapes = jax.tree.leaves(param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
        assert sum(math.prod(s) for s in shapes) == cfg.num_params()
    # Public figure: Qwen2.5-1.5B has 1.54B parameters (tied), Qwen2.5-7B 7.62B.
    assert abs(preset("qwen2.5-1.5b").num_params() / 1e9 - 1.54) < 0.01
    assert abs(preset("qwen2.5-7b").num_params() / 1e9 - 7.62) < 0.01


@pytest.mark.parametrize("cfg", [TINY, TINY3, preset("tiny-qwen2", rope_scaling=RopeScaling("yarn", 4.0, 128)),
                                 preset("tiny-qwen3", rope_scaling=RopeScaling("linear", 2.0))])
def test_hf_dict_round_trip(cfg):
    assert QwenConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


@st.composite
def _configs(draw):
    family = draw(st.sampled_from(["qwen2", "qwen3"]))
    kv = draw(st.integers(1, 4))
    rope_type = draw(st.sampled_from(["default", "linear", "yarn"]))
    rope = RopeScaling()
    if rope_type == "linear":
        rope = RopeScaling("linear", draw(st.floats(1.0, 16.0)))
    elif rope_type == "yarn":
        rope = RopeScaling("yarn", draw(st.floats(1.0, 16.0)), draw(st.integers(16, 4096)),
                           beta_fast=draw(st.floats(2.0, 64.0)), beta_slow=draw(st.floats(0.5, 2.0)),
                           attention_factor=draw(st.none() | st.floats(0.5, 2.0)),
                           truncate=draw(st.booleans()))
    bias = True if family == "qwen2" else draw(st.booleans())
    return QwenConfig(
        family=family, vocab_size=draw(st.integers(1, 200_000)), hidden_size=draw(st.integers(1, 8192)),
        intermediate_size=draw(st.integers(1, 30000)), num_hidden_layers=draw(st.integers(1, 96)),
        num_attention_heads=kv * draw(st.integers(1, 8)), num_key_value_heads=kv,
        head_dim=2 * draw(st.integers(1, 128)), max_position_embeddings=draw(st.integers(1, 1 << 20)),
        rms_norm_eps=draw(st.floats(1e-8, 1e-3)), rope_theta=draw(st.floats(1.0, 1e7)), rope_scaling=rope,
        tie_word_embeddings=draw(st.booleans()), qkv_bias=bias, o_bias=bias and family == "qwen3",
        qk_norm=family == "qwen3", eos_token_id=draw(st.none() | st.integers(0, 10) | st.tuples(st.integers(0, 9))),
    )


@settings(max_examples=200, deadline=None)
@given(_configs())
def test_hf_dict_round_trip_property(cfg):
    assert QwenConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


def test_from_hf_dict_legacy_rope_keys_and_defaults():
    hf = {
        "architectures": ["Qwen2ForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 5000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        "max_position_embeddings": 131072, "tie_word_embeddings": False,
    }
    cfg = QwenConfig.from_hf_dict(hf)
    assert cfg.head_dim == 16 and cfg.rope_theta == 5000.0 and cfg.qkv_bias and not cfg.qk_norm
    assert cfg.rope_scaling.rope_type == "yarn" and cfg.rope_scaling.original_max_position_embeddings == 32768


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "LlamaForCausalLM"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding_attention"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
        ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"vocab_size": None}, "vocab_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers=0"),
    ],
)
def test_from_hf_dict_errors_name_the_field(change, needle):
    hf = dict(TINY.to_hf_dict(), rope_parameters=None, rope_scaling=None)
    hf.update(change)
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("(", r"\(")):
        QwenConfig.from_hf_dict(hf)


def test_dtype_policy_rejects_unknown():
    with pytest.raises(ConfigError, match="param_dtype='fp8'"):
        DTypePolicy("fp8", "float32")


# ----------------------------------------------------------------------------- building blocks
def test_rope_inv_freq_hand_computed():
    cfg = preset("tiny-qwen2", head_dim=4, num_attention_heads=4, rope_theta=10000.0)
    inv, factor = rope_inv_freq(cfg)
    np.testing.assert_allclose(inv, [1.0, 0.01], rtol=1e-6)
    assert factor == 1.0
    inv_lin, _ = rope_inv_freq(cfg.replace(rope_scaling=RopeScaling("linear", 4.0)))
    np.testing.assert_allclose(inv_lin, [0.25, 0.0025], rtol=1e-6)
    # yarn: attention factor 0.1 * ln(4) + 1 when not given.
    _, af = rope_inv_freq(cfg.replace(rope_scaling=RopeScaling("yarn", 4.0, 16)))
    assert af == pytest.approx(0.1 * math.log(4.0) + 1.0)


def test_rope_rotation_hand_computed():
    # One head, H=2: (x0, x1) rotated by angle theta -> (x0 cos - x1 sin, x1 cos + x0 sin).
    x = jnp.array([[[[1.0, 2.0]]]])
    t = 0.3
    cos = jnp.full((1, 1, 2), math.cos(t))
    sin = jnp.full((1, 1, 2), math.sin(t))
    out = apply_rope(x, cos, sin)
    np.testing.assert_allclose(
        out[0, 0, 0], [math.cos(t) - 2 * math.sin(t), 2 * math.cos(t) + math.sin(t)], rtol=1e-6
    )


def test_rms_norm_hand_computed():
    x = jnp.array([3.0, 4.0])  # rms = sqrt(12.5)
    w = jnp.array([1.0, 2.0])
    np.testing.assert_allclose(rms_norm(x, w, 0.0), [3 / math.sqrt(12.5), 8 / math.sqrt(12.5)], rtol=1e-6)


def test_attention_structure_hand_computed():
    seg = jnp.array([[1, 1, 2, 0]])
    got = attention_structure(4, segment_ids_BL=seg, causal=True)
    want = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], bool)
    np.testing.assert_array_equal(got[0], want)
    extra = jnp.array([[[1, 1, 1, 1]] * 4], bool).at[0, 1, 0].set(False)
    got = attention_structure(4, segment_ids_BL=seg, mask_BLS=extra, causal=True)
    want[1, 0] = False
    np.testing.assert_array_equal(got[0], want)
    assert attention_structure(3, causal=False) is None


def test_attention_xla_matches_naive_loop():
    rng = np.random.default_rng(0)
    B, L, N, K, H = 2, 5, 4, 2, 8
    q, k, v = (rng.normal(size=s).astype(np.float32) for s in [(B, L, N, H), (B, L, K, H), (B, L, K, H)])
    allowed = rng.random((B, L, L)) < 0.6
    allowed[:, np.arange(L), np.arange(L)] = True
    got = attention_xla(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(allowed), scale=0.3)
    want = np.zeros((B, L, N, H), np.float32)
    for b in range(B):
        for n in range(N):
            kv = n // (N // K)
            for i in range(L):
                s = np.array([q[b, i, n] @ k[b, j, kv] * 0.3 if allowed[b, i, j] else -np.inf for j in range(L)])
                p = np.exp(s - s.max())
                p /= p.sum()
                want[b, i, n] = p @ v[b, :, kv]
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("L", [65, 200, 1100])
def test_causal_block_skipping_equals_full_attention(L):
    """The XLA path's causal key skipping (query blocks see only keys up to their end) computes
    exactly the full masked attention, with segments and an extra mask, on ragged last blocks."""
    from jaxagent.models import attention

    rng = np.random.default_rng(L)
    B, N, K, H = 2, 4, 2, 8
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(B, L, N, H), (B, L, K, H), (B, L, K, H)])
    seg = jnp.asarray(np.where(np.arange(L) < L // 3, 1, 2)[None].repeat(B, 0)).at[1, -5:].set(0)
    extra = jnp.asarray(rng.random((B, L, L)) < 0.9)
    got = attention(q, k, v, scale=0.35, segment_ids_BL=seg, mask_BLS=extra)
    allowed = attention_structure(L, segment_ids_BL=seg, mask_BLS=extra, causal=True)
    want = attention_xla(q, k, v, allowed, scale=0.35)
    seen = np.asarray(allowed).any(-1)  # queries that see no key have no defined output
    assert seen.sum() > 0.9 * seen.size
    np.testing.assert_allclose(np.asarray(got)[seen], np.asarray(want)[seen], atol=1e-5)


# ----------------------------------------------------------------------------- forward
@pytest.mark.parametrize("cfg", [TINY, TINY3], ids=["qwen2", "qwen3"])
def test_forward_is_causal(cfg):
    p = _params(cfg)
    t = _tokens(2, 10, cfg.vocab_size)
    t2 = t.at[:, 6:].set((t[:, 6:] + 1) % cfg.vocab_size)
    a, b = forward(p, t, config=cfg), forward(p, t2, config=cfg)
    np.testing.assert_allclose(a[:, :6], b[:, :6], atol=ATOL)
    assert np.abs(np.asarray(a[:, 6:] - b[:, 6:])).max() > 1e-3


@pytest.mark.parametrize("cfg", [TINY, TINY3], ids=["qwen2", "qwen3"])
def test_packed_segments_equal_separate_runs(cfg):
    p = _params(cfg)
    a, b = _tokens(1, 7, cfg.vocab_size, 1), _tokens(1, 5, cfg.vocab_size, 2)
    packed = jnp.concatenate([a, b, jnp.zeros((1, 3), jnp.int32)], axis=1)
    seg = jnp.array([[1] * 7 + [2] * 5 + [0] * 3])
    pos = jnp.array([list(range(7)) + list(range(5)) + [0] * 3])
    out = forward(p, packed, config=cfg, positions_BL=pos, segment_ids_BL=seg)
    np.testing.assert_allclose(out[:, :7], forward(p, a, config=cfg), atol=ATOL)
    np.testing.assert_allclose(out[:, 7:12], forward(p, b, config=cfg), atol=ATOL)


def test_arbitrary_mask_shared_prefix_counterfactual():
    """The info-gain layout: a suffix [PH, a0, a1] packed after the trajectory, attending only to the
    prefix before the replaced observation, scores like the counterfactual history run directly."""
    cfg = TINY3
    p = _params(cfg)
    V = cfg.vocab_size
    prefix, obs, act = _tokens(1, 5, V, 3), _tokens(1, 3, V, 4), _tokens(1, 2, V, 5)
    ph = jnp.array([[7]])
    traj = jnp.concatenate([prefix, obs, act], axis=1)  # 10 tokens
    suffix = jnp.concatenate([ph, act], axis=1)  # 3 tokens
    packed = jnp.concatenate([traj, suffix], axis=1)  # 13
    T, S = traj.shape[1], suffix.shape[1]
    allowed = np.tril(np.ones((T + S, T + S), bool))
    allowed[T:, 5:T] = False  # the suffix never sees the observation or the factual action
    pos = jnp.array([list(range(T)) + list(range(5, 5 + S))])
    out = forward(p, packed, config=cfg, positions_BL=pos, mask_BLS=jnp.asarray(allowed)[None])
    direct = forward(p, jnp.concatenate([prefix, suffix], axis=1), config=cfg)
    np.testing.assert_allclose(out[:, T:], direct[:, 5:], atol=ATOL)
    np.testing.assert_allclose(out[:, :T], forward(p, traj, config=cfg), atol=ATOL)


def test_non_causal_structure():
    cfg = TINY
    p = _params(cfg)
    t = _tokens(1, 6, cfg.vocab_size)
    full = forward(p, t, config=cfg, causal=False)
    t2 = t.at[:, 5].set((t[:, 5] + 1) % cfg.vocab_size)
    assert np.abs(np.asarray(full[:, 0] - forward(p, t2, config=cfg, causal=False)[:, 0])).max() > 1e-4


# ----------------------------------------------------------------------------- log-probs
class TestTokenLogprobs(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_equals_log_softmax_of_forward_for_any_chunk(self):
        cfg = TINY3
        p = _params(cfg)
        t = _tokens(3, 11, cfg.vocab_size)
        logits = forward(p, t, config=cfg).astype(jnp.float32)
        ref = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), next_token_targets(t)[..., None], -1)[..., 0]
        probs = jax.nn.softmax(logits, -1)
        ref_ent = -jnp.sum(probs * jax.nn.log_softmax(logits, -1), -1)
        for chunk in (1, 3, 11, 64):
            fn = self.variant(lambda p, t, c=chunk: token_logprobs(p, t, config=cfg, chunk_size=c, return_entropy=True))
            lp, ent = fn(p, t)
            chex.assert_shape(lp, (3, 11))
            chex.assert_trees_all_close(lp, ref, atol=1e-5)
            chex.assert_trees_all_close(ent, ref_ent, atol=1e-5)


def test_explicit_targets():
    cfg = TINY
    p = _params(cfg)
    t = _tokens(2, 6, cfg.vocab_size)
    targets = _tokens(2, 6, cfg.vocab_size, 9)
    lp = token_logprobs(p, t, config=cfg, targets_BL=targets, chunk_size=4)
    ref = jnp.take_along_axis(jax.nn.log_softmax(forward(p, t, config=cfg), -1), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(lp, ref, atol=1e-5)


def test_chunked_gradient_equals_unchunked():
    cfg = TINY
    p = _params(cfg)
    t = _tokens(2, 9, cfg.vocab_size)

    def loss(p, chunk):
        return token_logprobs(p, t, config=cfg, chunk_size=chunk)[:, :-1].mean()

    assert_close_to_scale(jax.grad(loss)(p, 2), jax.grad(loss)(p, 512))


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_same_values_and_grads(remat):
    cfg = TINY3
    p = _params(cfg)
    t = _tokens(2, 8, cfg.vocab_size)

    def loss(p, c):
        return token_logprobs(p, t, config=c)[:, :-1].sum()

    rc = cfg.replace(remat=remat)
    base = jax.value_and_grad(loss)(p, cfg)
    # Rematerialisation only reorders float32 work, so it may move the result as far as round-off
    # of the inputs does: with these large weights the gradient is ill-conditioned (a relative
    # change of one float32 epsilon in every weight moves it by ~4e-5 of its scale), more than a
    # fixed 1e-5 allows for XLA's fusion choices. The bound is measured here, and a structural
    # mistake (a layer recomputed with the wrong inputs) is orders of magnitude above it.
    eps = float(np.finfo(np.float32).eps)
    nudged = jax.value_and_grad(loss)(jax.tree.map(lambda x: x * (1 + eps), p), cfg)

    def worst(a, b):
        return max(float(np.abs(np.asarray(x) - np.asarray(y)).max() / np.abs(np.asarray(y)).max())
                   for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    sensitivity = worst(nudged, base)
    assert 0 < sensitivity < 1e-3  # the bound itself is round-off sized
    assert worst(jax.value_and_grad(loss)(p, rc), base) <= max(1e-5, sensitivity)


def test_bfloat16_policy_close_to_float32():
    cfg = TINY
    p = _params(cfg)
    t = _tokens(2, 8, cfg.vocab_size)
    bf = cfg.replace(dtype=DTypePolicy("bfloat16", "bfloat16"))
    pb = jax.tree.map(lambda x: x.astype(jnp.bfloat16), p)
    logits = forward(pb, t, config=bf)
    assert logits.dtype == jnp.bfloat16
    lp32 = token_logprobs(p, t, config=cfg)
    lp16 = token_logprobs(pb, t, config=bf)
    assert lp16.dtype == jnp.float32
    assert np.isfinite(np.asarray(lp16)).all()
    # bf16 has ~3 significant digits; on log-probs of magnitude ~5 that is an error well under 0.5.
    assert np.abs(np.asarray(lp16 - lp32)).max() < 0.5
    # float32 params with bf16 compute (mixed precision) run too
    mixed = cfg.replace(dtype=DTypePolicy("float32", "bfloat16"))
    assert forward(p, t, config=mixed).dtype == jnp.bfloat16


# ----------------------------------------------------------------------------- bad input
def test_sequence_longer_than_positions_is_an_error():
    cfg = TINY.replace(max_position_embeddings=8)
    p = init_params(jax.random.key(0), cfg)
    with pytest.raises(ValueError, match="length 9 exceeds the model's max_position_embeddings=8"):
        forward(p, jnp.zeros((1, 9), jnp.int32), config=cfg)


def test_bad_shapes_and_dtypes_are_errors():
    p = init_params(jax.random.key(0), TINY)
    with pytest.raises(ValueError, match=r"tokens: shape \(4,\)"):
        forward(p, jnp.zeros((4,), jnp.int32), config=TINY)
    with pytest.raises(ValueError, match="tokens: dtype float32"):
        forward(p, jnp.zeros((1, 4), jnp.float32), config=TINY)
    with pytest.raises(ValueError, match=r"positions: shape \(1, 3\), expected \(1, 4\)"):
        forward(p, jnp.zeros((1, 4), jnp.int32), config=TINY, positions_BL=jnp.zeros((1, 3), jnp.int32))
    with pytest.raises(ValueError, match=r"mask: shape \(1, 4, 3\)"):
        forward(p, jnp.zeros((1, 4), jnp.int32), config=TINY, mask_BLS=jnp.ones((1, 4, 3), bool))
    with pytest.raises(ValueError, match="attn_impl='flash'"):
        forward(p, jnp.zeros((1, 4), jnp.int32), config=TINY, attn_impl="flash")


def test_logprobs_never_hold_full_float32_logits():
    """Compiled temp memory of the chunked log-probs (forward and gradient) stays a small fraction
    of the [B, L, V] float32 logits that an unchunked computation holds."""
    from jaxagent.models import logprobs_from_hidden

    B, L, D, V = 4, 1024, 64, 16384
    h = jax.ShapeDtypeStruct((B, L, D), jnp.float32)
    w = jax.ShapeDtypeStruct((D, V), jnp.float32)
    t = jax.ShapeDtypeStruct((B, L), jnp.int32)
    full = B * L * V * 4

    def temp(fn):
        return jax.jit(fn).lower(h, w, t).compile().memory_analysis().temp_size_in_bytes

    fwd = temp(lambda h, w, t: logprobs_from_hidden(h, w, t, chunk_size=64))
    grad = temp(jax.grad(lambda h, w, t: logprobs_from_hidden(h, w, t, chunk_size=64, return_entropy=True)[0].sum(),
                         argnums=(0, 1)))
    unchunked = temp(lambda h, w, t: logprobs_from_hidden(h, w, t, chunk_size=L))
    assert unchunked >= full  # the measurement sees the full logits when they exist
    assert fwd < full / 8 and grad < full / 4, (fwd, grad, full)

"""Sharding: meshes, logical rules, and sharded == single-device numerics.

conftest.py gives eight simulated CPU devices. Every sharded computation is compared with the
same computation on one device; expected specs and shard shapes are worked out by hand from the
tiny presets:

    tiny-qwen2: V=512 D=64 F=128 Ly=2 N=4 K=2 H=16, tied embeddings, q/k/v biases
    tiny-qwen3: V=512 D=64 F=128 Ly=2 N=4 K=2 H=32, untied lm_head, q/k norms, no biases
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxagent.models import (
    LogicalRules,
    MeshConfig,
    forward,
    init_params,
    load_pretrained,
    make_mesh,
    param_logical_axes,
    param_shardings,
    preset,
    save_pretrained,
    shard_params,
    token_logprobs,
)
from jaxagent.models.sharding import DEFAULT_RULES, batch_sharding, constrain
from jaxagent.models.placement import init_params_sharded

PRESETS = ("tiny-qwen2", "tiny-qwen3")
# (data, fsdp, tensor); all use the 8 devices.
MESHES = {
    "d8": (8, 1, 1),
    "d2f2t2": (2, 2, 2),
    "f4t2": (1, 4, 2),
    "f2t4": (1, 2, 4),
}
B, L = 8, 12  # B divisible by data*fsdp for every mesh above
CHUNK = 5  # token_logprobs chunk size that does not divide L (exercises chunk padding)
ATOL = RTOL = 1e-5


def _rules(data: int, fsdp: int, tensor: int, rules=DEFAULT_RULES) -> LogicalRules:
    return LogicalRules(make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor)), rules)


def _leaves_with_paths(tree):
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [("/".join(k.key for k in path), leaf) for path, leaf in flat]


def _is_single_device(x) -> bool:
    return len(x.sharding.device_set) == 1


@pytest.fixture(scope="module")
def batch():
    """A padded, partly packed batch: segment id 0 = padding (tokens there are 0)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 512, size=(B, L)).astype(np.int32)
    seg = np.zeros((B, L), np.int32)
    lengths = [12, 9, 5, 12, 1, 7, 11, 3]
    for b, n in enumerate(lengths):
        seg[b, :n] = 1
    seg[3, 6:] = 2  # row 3: two packed sequences, 1 x6 then 2 x6
    seg[6, 4:11] = 2  # row 6: 1 x4, 2 x7, one padding token
    tokens[seg == 0] = 0
    return jnp.asarray(tokens), jnp.asarray(seg)


@pytest.fixture(scope="module")
def models():
    """(config, params) per preset, plain single-device arrays. `init_params` is jitted (eager
    dispatch of its many small ops is slower on CPU than one compile)."""
    out = {}
    init = jax.jit(init_params, static_argnums=1)
    for i, name in enumerate(PRESETS):
        cfg = preset(name)
        params = init(jax.random.key(i), cfg)
        assert all(_is_single_device(x) for x in jax.tree.leaves(params))
        out[name] = (cfg, params)
    return out


def _fwd_and_logprobs(params, tokens, seg, *, config, rules):
    logits = forward(params, tokens, config=config, segment_ids_BL=seg, rules=rules)
    lp = token_logprobs(params, tokens, config=config, segment_ids_BL=seg, rules=rules, chunk_size=CHUNK)
    return logits, lp


@pytest.fixture(scope="module")
def reference(models, batch):
    """Single-device logits and log-probs per preset."""
    tokens, seg = batch
    out = {}
    for name, (cfg, params) in models.items():
        fn = jax.jit(functools.partial(_fwd_and_logprobs, config=cfg, rules=None))
        logits, lp = fn(params, tokens, seg)
        assert _is_single_device(logits)
        out[name] = (np.asarray(logits), np.asarray(lp))
    return out


def _loss(params, tokens, seg, *, config, rules):
    """Mean negative log-prob of next tokens that stay within the same (non-padding) segment."""
    lp = token_logprobs(params, tokens, config=config, segment_ids_BL=seg, rules=rules, chunk_size=CHUNK)
    nxt = jnp.concatenate([seg[:, 1:], jnp.zeros_like(seg[:, :1])], axis=1)
    mask = ((seg > 0) & (nxt == seg)).astype(jnp.float32)
    return -jnp.sum(lp * mask) / jnp.sum(mask)


# ---------------------------------------------------------------------------- 1. sharded forward
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("mesh_id", list(MESHES))
def test_sharded_forward_matches_single_device(name, mesh_id, models, batch, reference):
    cfg, params = models[name]
    tokens, seg = batch
    data, fsdp, tensor = MESHES[mesh_id]
    rules = _rules(data, fsdp, tensor)
    p_sh = param_shardings(cfg, rules)
    b_sh = batch_sharding(rules)
    logits_sh = rules.sharding(("batch", "seq", "act_vocab"), (B, L, cfg.vocab_size))
    lp_sh = batch_sharding(rules)

    sharded_params = shard_params(params, cfg, rules)
    tokens_s = jax.device_put(tokens, b_sh)
    seg_s = jax.device_put(seg, b_sh)
    fn = jax.jit(
        functools.partial(_fwd_and_logprobs, config=cfg, rules=rules),
        in_shardings=(p_sh, b_sh, b_sh),
        out_shardings=(logits_sh, lp_sh),
    )
    logits, lp = fn(sharded_params, tokens_s, seg_s)

    # The inputs really were spread over the mesh.
    assert b_sh.spec == P(("data", "fsdp") if data > 1 and fsdp > 1 else "data" if data > 1 else "fsdp", None)
    assert tokens_s.addressable_shards[0].data.shape == (B // (data * fsdp), L)
    assert len(logits.sharding.device_set) == 8
    assert logits.sharding.is_equivalent_to(logits_sh, 3)
    # The vocab axis (512) is split over "tensor" whenever tensor > 1.
    assert logits.addressable_shards[0].data.shape == (B // (data * fsdp), L, cfg.vocab_size // tensor)

    ref_logits, ref_lp = reference[name]
    assert np.all(np.isfinite(ref_logits)) and np.all(np.isfinite(ref_lp))
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(np.asarray(lp), ref_lp, atol=ATOL, rtol=RTOL)


def test_sharded_forward_without_activation_rules(models, batch, reference):
    """Sharded inputs with rules=None (GSPMD propagates on its own) give the same logits."""
    cfg, params = models["tiny-qwen3"]
    tokens, seg = batch
    rules = _rules(2, 2, 2)
    p_sh, b_sh = param_shardings(cfg, rules), batch_sharding(rules)
    fn = jax.jit(
        functools.partial(_fwd_and_logprobs, config=cfg, rules=None), in_shardings=(p_sh, b_sh, b_sh)
    )
    logits, lp = fn(shard_params(params, cfg, rules), jax.device_put(tokens, b_sh), jax.device_put(seg, b_sh))
    np.testing.assert_allclose(np.asarray(logits), reference["tiny-qwen3"][0], atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(np.asarray(lp), reference["tiny-qwen3"][1], atol=ATOL, rtol=RTOL)


def test_params_are_really_sharded(models):
    """data=2, fsdp=2, tensor=2 on tiny-qwen2: hand-computed specs and per-device shard shapes."""
    cfg, params = models["tiny-qwen2"]
    rules = _rules(2, 2, 2)
    sp = shard_params(params, cfg, rules)
    lay = sp["layers"]
    # layers/q [Ly=2, D=64, N=4, H=16]: (layers, embed->fsdp, q_heads->tensor, head_dim)
    assert lay["q"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert lay["q"].addressable_shards[0].data.shape == (2, 32, 2, 16)
    # layers/k [2, 64, K=2, 16]: 2 KV heads split over tensor=2
    assert lay["k"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert lay["k"].addressable_shards[0].data.shape == (2, 32, 1, 16)
    # layers/o [2, N=4, 16, D=64]
    assert lay["o"].sharding.spec == P(None, "tensor", None, "fsdp")
    assert lay["o"].addressable_shards[0].data.shape == (2, 2, 16, 32)
    # layers/gate [2, 64, F=128] and layers/down [2, 128, 64]
    assert lay["gate"].sharding.spec == P(None, "fsdp", "tensor")
    assert lay["gate"].addressable_shards[0].data.shape == (2, 32, 64)
    assert lay["down"].sharding.spec == P(None, "tensor", "fsdp")
    assert lay["down"].addressable_shards[0].data.shape == (2, 64, 32)
    # biases [2, N or K, 16]: heads over tensor
    assert lay["q_bias"].addressable_shards[0].data.shape == (2, 2, 16)
    assert lay["k_bias"].addressable_shards[0].data.shape == (2, 1, 16)
    # norms replicated
    assert lay["attn_norm"].sharding.spec == P(None, None)
    assert lay["attn_norm"].addressable_shards[0].data.shape == (2, 64)
    assert sp["final_norm"].sharding.spec == P(None)
    # embed [V=512, D=64]: (vocab->tensor, embed->fsdp)
    assert sp["embed"].sharding.spec == P("tensor", "fsdp")
    assert sp["embed"].addressable_shards[0].data.shape == (256, 32)
    # Every leaf lives on all 8 devices and still holds the original values.
    for (path, a), (_, b) in zip(_leaves_with_paths(sp), _leaves_with_paths(params)):
        assert len(a.sharding.device_set) == 8, path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path)
    # Each shard holds exactly its slice of the original.
    q = np.asarray(params["layers"]["q"])
    for shard in lay["q"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), q[shard.index])


def test_lm_head_sharding_untied(models):
    """tiny-qwen3 has an lm_head [D=64, V=512]: (embed->fsdp, vocab->tensor)."""
    cfg, params = models["tiny-qwen3"]
    rules = _rules(1, 4, 2)
    sp = shard_params(params, cfg, rules)
    assert sp["lm_head"].sharding.spec == P("fsdp", "tensor")
    assert sp["lm_head"].addressable_shards[0].data.shape == (16, 256)
    # q_norm [Ly, H] is replicated: ("layers", "head_dim") have no mesh axes.
    assert sp["layers"]["q_norm"].sharding.spec == P(None, None)
    assert sp["layers"]["q_norm"].sharding.is_fully_replicated


# ---------------------------------------------------------------------------- 2. LogicalRules.spec
def test_spec_drops_axis_that_does_not_divide():
    cfg = preset("tiny-qwen2")  # N=4 query heads, K=2 KV heads
    rules = _rules(1, 2, 4)
    sh = param_shardings(cfg, rules)
    # 2 KV heads on tensor=4: replicated on the kv_heads dim
    assert sh["layers"]["k"].spec == P(None, "fsdp", None, None)
    assert sh["layers"]["v"].spec == P(None, "fsdp", None, None)
    assert sh["layers"]["k_bias"].spec == P(None, None, None)
    # 4 query heads on tensor=4: sharded
    assert sh["layers"]["q"].spec == P(None, "fsdp", "tensor", None)
    assert sh["layers"]["q_bias"].spec == P(None, "tensor", None)
    assert sh["layers"]["o"].spec == P(None, "tensor", None, "fsdp")
    # Directly via spec, with and without a shape
    assert rules.spec(("kv_heads",), (2,)) == P(None)
    assert rules.spec(("kv_heads",)) == P("tensor")  # no shape: nothing to check against
    assert rules.spec(("kv_heads",), (8,)) == P("tensor")
    assert rules.spec(("kv_heads",), (6,)) == P(None)  # 6 % 4 != 0
    # Multi-axis rule: each axis is kept only while the running product divides the dim.
    r = _rules(2, 2, 2)
    assert r.spec(("batch", None), (8, 3)) == P(("data", "fsdp"), None)
    assert r.spec(("batch", None), (6, 3)) == P("data", None)  # 6 % 2 == 0, 6 % 4 != 0
    assert r.spec(("batch", None), (3, 3)) == P(None, None)
    # Size-1 mesh axes are dropped: data=1 leaves batch over fsdp only.
    r = _rules(1, 4, 2)
    assert r.spec(("batch", "seq")) == P("fsdp", None)
    assert batch_sharding(r).spec == P("fsdp", None)
    assert batch_sharding(r, 3).spec == P("fsdp", None, None)


def test_sharded_kv_replicated_params_have_full_kv_shards(models):
    """With tensor=4 the placed k keeps both KV heads on each device; q has one head each."""
    cfg, params = models["tiny-qwen2"]
    rules = _rules(1, 2, 4)
    sp = shard_params(params, cfg, rules)
    assert sp["layers"]["k"].addressable_shards[0].data.shape == (2, 32, 2, 16)
    assert sp["layers"]["q"].addressable_shards[0].data.shape == (2, 32, 1, 16)


def test_spec_never_uses_a_mesh_axis_twice():
    r = _rules(2, 2, 2)
    # embed -> fsdp, but batch already took fsdp
    assert r.spec(("batch", "embed")) == P(("data", "fsdp"), None)
    assert r.spec(("embed", "batch")) == P("fsdp", "data")
    # q_heads and mlp both -> tensor: only the first dim gets it
    assert r.spec(("q_heads", "mlp")) == P("tensor", None)
    assert r.spec(("mlp", "q_heads", "vocab")) == P("tensor", None, None)
    # an axis dropped for divisibility stays free for later dims
    assert r.spec(("q_heads", "mlp"), (3, 4)) == P(None, "tensor")
    custom = LogicalRules(r.mesh, (("a", ("tensor", "data")), ("b", ("data", "tensor", "fsdp"))))
    assert custom.spec(("a", "b")) == P(("tensor", "data"), "fsdp")
    for logical in [("batch", "embed"), ("mlp", "q_heads", "vocab"), ("a", "b")]:
        rr = custom if logical == ("a", "b") else r
        spec = rr.spec(logical)
        used = [a for entry in spec if entry is not None for a in ((entry,) if isinstance(entry, str) else entry)]
        assert len(used) == len(set(used)), (logical, spec)


def test_spec_unknown_logical_name_raises():
    r = _rules(2, 2, 2)
    with pytest.raises(KeyError, match="no_such_axis"):
        r.spec(("batch", "no_such_axis"))
    with pytest.raises(KeyError, match="no_such_axis"):
        constrain(jnp.zeros((8, 2)), ("batch", "no_such_axis"), r)
    # None means replicated and never raises
    assert r.spec((None, None)) == P(None, None)


def test_constrain_is_identity_without_rules():
    x = jnp.arange(6.0).reshape(2, 3)
    assert constrain(x, ("no_such_axis", None), None) is x


def test_param_logical_axes_cover_param_tree(models):
    """Every parameter has a logical-axis tuple of its rank, and the rules know every name."""
    rules = _rules(2, 2, 2)
    for cfg, params in models.values():
        axes = param_logical_axes(cfg)
        flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
        flat_params = jax.tree.leaves(params)
        assert jax.tree.structure(axes, is_leaf=lambda x: isinstance(x, tuple)) == jax.tree.structure(params)
        for ax, p in zip(flat_axes, flat_params):
            assert len(ax) == p.ndim
            rules.spec(ax, p.shape)  # raises KeyError if a name has no rule


# ---------------------------------------------------------------------------- 3. MeshConfig.shape
@pytest.mark.parametrize(
    "cfg, expected",
    [
        (MeshConfig(), (1, 8, 1)),
        (MeshConfig(data=2, fsdp=-1, tensor=2), (2, 2, 2)),
        (MeshConfig(data=-1, fsdp=1, tensor=4), (2, 1, 4)),
        (MeshConfig(data=2, fsdp=4, tensor=-1), (2, 4, 1)),
        (MeshConfig(data=8, fsdp=1, tensor=1), (8, 1, 1)),
        (MeshConfig(data=1, fsdp=-1, tensor=8), (1, 1, 8)),
    ],
)
def test_mesh_config_shape(cfg, expected):
    assert cfg.shape(8) == expected


def test_mesh_config_shape_other_device_counts():
    assert MeshConfig(data=-1, fsdp=1, tensor=1).shape(1) == (1, 1, 1)
    assert MeshConfig(data=3, fsdp=-1, tensor=2).shape(12) == (3, 2, 2)


@pytest.mark.parametrize(
    "kw, n, match",
    [
        (dict(data=-1, fsdp=-1), 8, r"at most one axis may be -1"),
        (dict(data=-1, fsdp=1, tensor=-1), 8, r"at most one axis may be -1"),
        (dict(data=3, fsdp=-1), 8, r"8 devices are not divisible by 3"),
        (dict(data=2, fsdp=-1, tensor=3), 8, r"not divisible by 6"),
        (dict(data=2, fsdp=2, tensor=1), 8, r"product 4 != 8"),
        (dict(data=4, fsdp=4, tensor=1), 8, r"product 16 != 8"),
        (dict(data=0, fsdp=-1), 8, r"mesh\.data=0"),
        (dict(data=1, fsdp=-1, tensor=-2), 8, r"mesh\.tensor=-2"),
        (dict(data=1, fsdp=-3, tensor=1), 8, r"mesh\.fsdp=-3"),
        (dict(data=2.0, fsdp=-1), 8, r"mesh\.data=2\.0"),
    ],
)
def test_mesh_config_shape_errors(kw, n, match):
    # the axes' own values fail at construction, the device count at shape()
    with pytest.raises(ValueError, match=match):
        MeshConfig(**kw).shape(n)


def test_make_mesh():
    mesh = make_mesh(MeshConfig(data=2, fsdp=-1, tensor=2))
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert set(mesh.devices.flat) == set(jax.devices())
    sub = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=2), devices=jax.devices()[:4])
    assert dict(sub.shape) == {"data": 1, "fsdp": 2, "tensor": 2}
    assert set(sub.devices.flat) == set(jax.devices()[:4])
    with pytest.raises(ValueError, match=r"product 8 != 4"):
        make_mesh(MeshConfig(data=2, fsdp=2, tensor=2), devices=jax.devices()[:4])
    # LogicalRules is hashable (usable as a static jit argument) and compares by value.
    assert hash(LogicalRules(mesh)) == hash(LogicalRules(mesh))
    assert LogicalRules(mesh) == LogicalRules(mesh, DEFAULT_RULES)


# ---------------------------------------------------------------------------- 4. load_pretrained
# Custom rules that also split the stacked layer axis and head_dim, so that loading reads
# per-layer and within-head slices of the HF tensors.
ODD_RULES = tuple(
    (k, {"layers": "data", "head_dim": "tensor", "q_heads": None, "kv_heads": None}.get(k, v))
    for k, v in DEFAULT_RULES
)


@pytest.fixture(scope="module")
def saved(models, tmp_path_factory):
    out = {}
    for name, (cfg, params) in models.items():
        path = save_pretrained(tmp_path_factory.mktemp("ckpt") / name, cfg, params)
        out[name] = path
    return out


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize(
    "mesh_shape, rule_set",
    [((2, 2, 2), DEFAULT_RULES), ((1, 2, 4), DEFAULT_RULES), ((2, 1, 4), ODD_RULES)],
    ids=["d2f2t2", "f2t4", "odd-rules"],
)
def test_load_pretrained_sharded(name, mesh_shape, rule_set, models, saved):
    cfg, params = models[name]
    rules = _rules(*mesh_shape, rules=rule_set)
    loaded_cfg, loaded = load_pretrained(saved[name], rules=rules)
    assert loaded_cfg == cfg
    expected = param_shardings(cfg, rules)
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    got = _leaves_with_paths(loaded)
    want_sh = dict(_leaves_with_paths(expected))
    want_val = dict(_leaves_with_paths(params))
    assert set(want_sh) == {p for p, _ in got}
    n_sharded = 0
    for path, arr in got:
        sh = want_sh[path]
        assert isinstance(arr.sharding, NamedSharding), path
        assert arr.sharding.mesh == rules.mesh, path
        assert arr.sharding.spec == sh.spec, (path, arr.sharding.spec, sh.spec)
        assert arr.sharding.is_equivalent_to(sh, arr.ndim), path
        assert arr.dtype == jnp.float32, path
        ref = np.asarray(want_val[path])
        np.testing.assert_array_equal(np.asarray(arr), ref, err_msg=path)
        for shard in arr.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), ref[shard.index], err_msg=path)
        n_sharded += not arr.sharding.is_fully_replicated
    assert n_sharded >= 8  # q, k or o, gate, up, down, embed, ... really are split


def test_odd_rules_shard_layers_and_head_dim():
    """Hand-check of ODD_RULES on tiny-qwen3 (H=32) with data=2, tensor=4: q [2, 64, 4, 32]
    is (layers->data, embed->fsdp (size 1, dropped), q_heads None, head_dim->tensor)."""
    cfg = preset("tiny-qwen3")
    rules = _rules(2, 1, 4, rules=ODD_RULES)
    sh = param_shardings(cfg, rules)
    assert sh["layers"]["q"].spec == P("data", None, None, "tensor")
    assert sh["layers"]["o"].spec == P("data", None, "tensor", None)
    assert sh["layers"]["q_norm"].spec == P("data", "tensor")
    assert sh["layers"]["q"].shard_shape((2, 64, 4, 32)) == (1, 64, 4, 8)


def test_load_pretrained_sharded_forward(models, saved, batch, reference):
    """A checkpoint loaded straight into shards runs the sharded forward to the same logits."""
    cfg, _ = models["tiny-qwen2"]
    tokens, seg = batch
    rules = _rules(2, 2, 2)
    _, loaded = load_pretrained(saved["tiny-qwen2"], rules=rules)
    b_sh = batch_sharding(rules)
    fn = jax.jit(functools.partial(_fwd_and_logprobs, config=cfg, rules=rules))
    logits, lp = fn(loaded, jax.device_put(tokens, b_sh), jax.device_put(seg, b_sh))
    np.testing.assert_allclose(np.asarray(logits), reference["tiny-qwen2"][0], atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(np.asarray(lp), reference["tiny-qwen2"][1], atol=ATOL, rtol=RTOL)


# ---------------------------------------------------------------------------- 5. init_params_sharded
@pytest.mark.parametrize("name, mesh_shape", [("tiny-qwen2", (2, 2, 2)), ("tiny-qwen3", (1, 2, 4))])
def test_init_params_sharded(name, mesh_shape, models):
    cfg, params = models[name]
    rules = _rules(*mesh_shape)
    key = jax.random.key(PRESETS.index(name))  # the key the `models` fixture used
    sp = init_params_sharded(key, cfg, rules)
    expected = dict(_leaves_with_paths(param_shardings(cfg, rules)))
    ref = dict(_leaves_with_paths(params))
    # `ref` comes from `init_params` jitted on one device (the `models` fixture): the sharded
    # version must be bit-identical, i.e. sharding does not change the random stream. (Eager,
    # un-jitted `init_params` may differ from any jitted run by ~1 ulp because XLA fuses
    # `normal * initializer_range` differently; that is not a sharding property.)
    got = _leaves_with_paths(sp)
    assert {p for p, _ in got} == set(ref)
    for path, arr in got:
        assert arr.sharding.spec == expected[path].spec, (path, arr.sharding.spec, expected[path].spec)
        assert arr.sharding.is_equivalent_to(expected[path], arr.ndim), path
        assert arr.dtype == ref[path].dtype, path
        np.testing.assert_array_equal(np.asarray(arr), np.asarray(ref[path]), err_msg=path)
    # not trivially equal: the random matrices differ from one another
    assert not np.array_equal(np.asarray(sp["layers"]["q"][0]), np.asarray(sp["layers"]["q"][1]))


# ---------------------------------------------------------------------------- 6. gradients
@pytest.mark.parametrize("name, mesh_shape", [("tiny-qwen2", (2, 2, 2)), ("tiny-qwen3", (1, 2, 4))])
def test_sharded_grad_matches_single_device(name, mesh_shape, models, batch):
    cfg, params = models[name]
    tokens, seg = batch
    ref_loss, ref_grad = jax.jit(jax.value_and_grad(functools.partial(_loss, config=cfg, rules=None)))(
        params, tokens, seg
    )
    # a real loss: about log(V) = log(512) ~ 6.24 for a random model
    assert 5.5 < float(ref_loss) < 7.0

    rules = _rules(*mesh_shape)
    p_sh, b_sh = param_shardings(cfg, rules), batch_sharding(rules)
    rep = NamedSharding(rules.mesh, P())
    step = jax.jit(
        jax.value_and_grad(functools.partial(_loss, config=cfg, rules=rules)),
        in_shardings=(p_sh, b_sh, b_sh),
        out_shardings=(rep, p_sh),
    )
    loss, grad = step(shard_params(params, cfg, rules), jax.device_put(tokens, b_sh), jax.device_put(seg, b_sh))
    np.testing.assert_allclose(float(loss), float(ref_loss), atol=ATOL, rtol=RTOL)
    ref_flat = dict(_leaves_with_paths(ref_grad))
    sh_flat = dict(_leaves_with_paths(p_sh))
    nonzero = 0
    for path, g in _leaves_with_paths(grad):
        assert g.sharding.is_equivalent_to(sh_flat[path], g.ndim), path
        r = np.asarray(ref_flat[path])
        np.testing.assert_allclose(np.asarray(g), r, atol=ATOL, rtol=RTOL, err_msg=path)
        nonzero += bool(np.any(r != 0))
    assert nonzero == len(ref_flat)  # every parameter gets gradient signal


def test_initialize_distributed_single_process_subprocess():
    """The multi-host path: jax.distributed.initialize through MeshConfig, with a one-process
    coordinator on loopback (in a subprocess: initialisation is process-global)."""
    import socket
    import subprocess
    import sys
    import textwrap

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = textwrap.dedent(f"""
        import os
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax
        from jaxagent.models.sharding import MeshConfig, initialize_distributed, make_mesh
        cfg = MeshConfig(data=2, fsdp=-1, tensor=1, distributed=True,
                         coordinator_address="127.0.0.1:{port}", num_processes=1, process_id=0)
        initialize_distributed(cfg)
        mesh = make_mesh(cfg)
        print(jax.process_count(), jax.process_index(), dict(mesh.shape))
        jax.distributed.shutdown()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1 0 {'data': 2, 'fsdp': 2, 'tensor': 1}"


def test_row_rules_give_the_rules_only_to_rows_that_split_over_the_batch_axes():
    """`row_rules`: the rules when the rows divide the devices of the batch axes (data x fsdp;
    tensor does not split rows), None otherwise, on one device, or without rules."""
    from jaxagent.models.sharding import place_rows, row_rules

    r = _rules(2, 2, 2)  # batch axes: 2 x 2 = 4 devices
    assert [row_rules(r, n) is r for n in (4, 8, 12, 2, 6, 1, 0)] == [True, True, True, False, False, False, False]
    tensor_only = _rules(1, 1, 8)
    assert row_rules(tensor_only, 8) is None  # no batch axis larger than 1
    assert row_rules(None, 8) is None
    # place_rows: the leading axis over the batch axes that divide it, scalars replicated
    tree = {"a": jnp.zeros((8, 3)), "b": jnp.zeros((6,)), "c": jnp.float32(1.0)}
    placed = place_rows(tree, r)
    assert placed["a"].sharding.spec[0] == ("data", "fsdp")
    assert placed["b"].sharding.spec[0] == "data"  # 6 rows: fsdp (2 x 2 = 4) does not divide, data does
    assert placed["c"].sharding.spec == P() and len(placed["c"].sharding.device_set) == 8

"""LoRA: the adapter inside the forward (fresh = base, merged = unmerged, dropout), decoding with it,
training only the adapter (the base bit for bit unchanged, optimizer state of the adapter only,
sharded), checkpoints of such states, PEFT's adapter format (parity with transformers + peft, merges,
round trips) and clear errors for adapters we do not compute."""

import functools
import importlib.util
import json
import math
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from safetensors.numpy import load_file, save_file

from jaxagent.models import (
    CheckpointError,
    ConfigError,
    LogicalRules,
    LoraSpec,
    MeshConfig,
    forward,
    init_lora,
    init_params,
    load_peft_adapter,
    load_pretrained,
    make_mesh,
    merge_lora,
    num_lora_params,
    param_shapes,
    preset,
    save_peft_adapter,
    save_pretrained,
    shard_params,
    token_logprobs,
)
from jaxagent.models.generate import SamplingParams, generate_from_prompts
from jaxagent.models.lora_hf import read_peft_spec
from jaxagent.models.sharding import batch_sharding
from jaxagent.train.step import (
    OptimSettings,
    StepShardings,
    TrainState,
    combine_params,
    make_optimizer,
    make_update,
    place_on_mesh,
    sft_loss_fn,
    split_trainable,
)

HAS_PEFT = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("peft") is not None
ALL = ("q", "k", "v", "o", "gate", "up", "down")
CFG2 = preset("tiny-qwen2", vocab_size=64, max_position_embeddings=128)
CFG3 = preset("tiny-qwen3", vocab_size=64, max_position_embeddings=128)
SPEC = LoraSpec(rank=4, alpha=8.0, targets=ALL)


_fwd = jax.jit(forward, static_argnames=("config",))
_lp = jax.jit(token_logprobs, static_argnames=("config", "row_chunk"))


def _tokens(B=3, L=12, vocab=64, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(1, vocab, (B, L)), jnp.int32)


def _random_adapter(params, seed=1, scale=0.3):
    """``params`` with its adapter's A and B replaced by nonzero normal draws."""
    leaves, treedef = jax.tree.flatten(params["lora"])
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [scale * jax.random.normal(k, x.shape, jnp.float32) for k, x in zip(keys, leaves)]
    return {**params, "lora": jax.tree.unflatten(treedef, new)}


def _lora_model(cfg, spec=SPEC, seed=0):
    lcfg = cfg.replace(lora=spec)
    return lcfg, _random_adapter(init_params(jax.random.key(seed), lcfg), seed + 1)


# ----------------------------------------------------------------------------- the spec
def test_spec_is_static_hashable_and_stays_out_of_the_hf_config():
    spec = LoraSpec(rank=8, alpha=16, dropout=0.1, targets=["v", "q"])  # a list, out of order
    assert spec.targets == ("q", "v") and spec.scale == 2.0 and isinstance(spec.alpha, float)
    lcfg = CFG2.replace(lora=spec)
    assert hash(lcfg) == hash(CFG2.replace(lora=LoraSpec(8, 16.0, 0.1, ("q", "v"))))
    assert lcfg != CFG2 and lcfg.to_hf_dict() == CFG2.to_hf_dict()
    shapes = param_shapes(lcfg)["lora"]["layers"]
    assert shapes["q"] == {"a": (2, 64, 8), "b": (2, 8, 4, 16)}
    assert num_lora_params(lcfg) == 2 * ((64 * 8 + 8 * 4 * 16) + (64 * 8 + 8 * 2 * 16))  # Ly * (q + v)
    for kwargs, needle in [(dict(rank=0), "lora.rank=0"), (dict(alpha=-1.0), "lora.alpha=-1.0"),
                           (dict(dropout=1.0), "lora.dropout=1.0"), (dict(targets=("q", "lm_head")), "lora.targets"),
                           (dict(targets=()), "lora.targets"), (dict(targets=("q", "q")), "repeated")]:
        with pytest.raises(ConfigError, match=needle):
            LoraSpec(**kwargs)


def test_init_is_peft_kaiming_uniform_and_zero_b():
    lcfg = preset("small-qwen2", num_hidden_layers=2).replace(lora=LoraSpec(rank=16))
    lora = init_lora(jax.random.key(0), lcfg)["layers"]
    for t, ab in lora.items():
        a, b = np.asarray(ab["a"]), np.asarray(ab["b"])
        assert a.dtype == np.float32 and b.dtype == np.float32
        fan_in = math.prod(a.shape[1:-1])  # torch's lora_A [r, in]: fan_in = in
        bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)): gain sqrt(1/3) * sqrt(3 / fan_in)
        assert np.abs(a).max() <= bound and np.abs(a).max() > 0.95 * bound
        assert abs(a.std() - bound / math.sqrt(3)) < 0.05 * bound, t
        np.testing.assert_array_equal(b, 0.0)


# ----------------------------------------------------------------------------- the forward
@pytest.mark.parametrize("cfg", [CFG2, CFG3], ids=["qwen2", "qwen3"])
def test_fresh_adapter_is_the_base_model_exactly(cfg):
    lcfg = cfg.replace(lora=LoraSpec(rank=4, dropout=0.2))
    params = init_params(jax.random.key(0), lcfg)
    base = init_params(jax.random.key(0), cfg)
    chex.assert_trees_all_equal({k: v for k, v in params.items() if k != "lora"}, base)
    tokens = _tokens()
    np.testing.assert_array_equal(_fwd(params, tokens, config=lcfg), _fwd(base, tokens, config=cfg))
    # B = 0: dropout on the adapter's input changes nothing either
    np.testing.assert_array_equal(_fwd(params, tokens, config=lcfg, dropout_key=jax.random.key(3)),
                                  _fwd(base, tokens, config=cfg))


class TestMerged(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_merged_logits_equal_the_adapter_model(self):
        for cfg, targets in ((CFG2, ALL), (CFG3, ("q", "v", "o", "down"))):
            lcfg, params = _lora_model(cfg, LoraSpec(rank=4, alpha=8.0, targets=targets))
            tokens = _tokens()
            got = self.variant(functools.partial(forward, config=lcfg))(params, tokens)
            merged, mcfg = merge_lora(params, lcfg)
            assert mcfg.lora is None and "lora" not in merged and mcfg == cfg
            want = self.variant(functools.partial(forward, config=mcfg))(merged, tokens)
            # W x + s (x A) B against (W + s A B) x: two float32 orders of one function. Against a
            # float64 evaluation each is off by up to 1e-5 on these logits (|logit| <= 0.5, two
            # layers; jax 0.10.2 CPU), so they may differ by twice that; a wrong merge is off by > 0.1
            chex.assert_trees_all_close(got, want, atol=3e-5, rtol=0)
            base = _fwd({k: v for k, v in params.items() if k != "lora"}, tokens, config=cfg)
            assert float(jnp.abs(got - base).max()) > 0.1  # the adapter does something
            for t in ALL:  # untargeted weights are untouched
                if t not in targets:
                    np.testing.assert_array_equal(merged["layers"][t], params["layers"][t])


def test_merge_by_hand_for_q():
    lcfg, params = _lora_model(CFG2, LoraSpec(rank=2, alpha=6.0, targets=("q",)))
    merged, _ = merge_lora(params, lcfg)
    a = np.asarray(params["lora"]["layers"]["q"]["a"][1])  # [D, r]
    b = np.asarray(params["lora"]["layers"]["q"]["b"][1])  # [r, N, H]
    want = np.asarray(params["layers"]["q"][1]) + 3.0 * np.einsum("dr,rnh->dnh", a, b)
    np.testing.assert_allclose(np.asarray(merged["layers"]["q"][1]), want, atol=1e-6)


def test_dropout_only_with_a_key():
    lcfg, params = _lora_model(CFG3, LoraSpec(rank=4, alpha=8.0, dropout=0.5))
    tokens = _tokens()
    plain = _fwd(params, tokens, config=lcfg)
    k1, k2 = jax.random.key(1), jax.random.key(2)
    d1 = _fwd(params, tokens, config=lcfg, dropout_key=k1)
    assert float(jnp.abs(d1 - plain).max()) > 1e-2
    np.testing.assert_array_equal(d1, _fwd(params, tokens, config=lcfg, dropout_key=k1))  # a pure function of the key
    assert float(jnp.abs(d1 - _fwd(params, tokens, config=lcfg, dropout_key=k2)).max()) > 1e-2
    # no key = evaluation: exactly the merged model's output up to rounding
    merged, mcfg = merge_lora(params, lcfg)
    chex.assert_trees_all_close(plain, _fwd(merged, tokens, config=mcfg), atol=1e-5, rtol=0)
    # dropout 0 with a key: no dropout
    lcfg0 = lcfg.replace(lora=LoraSpec(rank=4, alpha=8.0, dropout=0.0))
    np.testing.assert_array_equal(_fwd(params, tokens, config=lcfg0, dropout_key=k1), plain)
    # token_logprobs takes the key too (also row by row)
    lp = _lp(params, tokens, config=lcfg)
    lp_d = _lp(params, tokens, config=lcfg, dropout_key=k1)
    lp_rows = _lp(params, tokens, config=lcfg, dropout_key=k1, row_chunk=1)
    assert float(jnp.abs(lp_d - lp).max()) > 1e-3 and float(jnp.abs(lp_rows - lp).max()) > 1e-3
    np.testing.assert_allclose(_lp(params, tokens, config=lcfg, row_chunk=1), lp, atol=1e-5)


def test_adapter_and_spec_must_agree():
    lcfg, params = _lora_model(CFG2)
    tokens = _tokens()
    with pytest.raises(ConfigError, match=r"params\['lora'\] is present but config.lora=None"):
        forward(params, tokens, config=CFG2)
    with pytest.raises(ConfigError, match="params has no 'lora' entry"):
        forward({k: v for k, v in params.items() if k != "lora"}, tokens, config=lcfg)
    with pytest.raises(ConfigError, match=r"targets .* expected \['q', 'v'\]"):
        forward(params, tokens, config=CFG2.replace(lora=LoraSpec(rank=4, targets=("q", "v"))))
    with pytest.raises(ConfigError, match="expected rank 8"):
        forward(params, tokens, config=CFG2.replace(lora=LoraSpec(rank=8)))
    with pytest.raises(CheckpointError, match="config.lora=.*expected None.*merge_lora"):
        save_pretrained("/nonexistent/never-written", lcfg, params)


# ----------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("cfg", [CFG2, CFG3], ids=["qwen2", "qwen3"])
def test_greedy_decode_with_the_adapter_equals_the_merged_model(cfg):
    lcfg, params = _lora_model(cfg, LoraSpec(rank=4, alpha=8.0))
    params = {**jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, {k: v for k, v in params.items() if k != "lora"}),
              "lora": params["lora"]}  # far from uniform logits, as tests/test_generate.py
    merged, mcfg = merge_lora(params, lcfg)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [10, 11, 12, 13]]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    out, _ = generate_from_prompts(params, prompts, config=lcfg, sampling=sampling, key=jax.random.key(0))
    ref, _ = generate_from_prompts(merged, prompts, config=mcfg, sampling=sampling, key=jax.random.key(0))
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logp_policy, ref.logp_policy, atol=1e-4)  # merged: float32 rounding of W + s A B
    base, _ = generate_from_prompts({k: v for k, v in params.items() if k != "lora"}, prompts, config=cfg,
                                    sampling=sampling, key=jax.random.key(0))
    assert not np.array_equal(base.tokens, out.tokens)  # the adapter changes what is generated
    # and the decode agrees with teacher forcing of the adapter model
    for b, prompt in enumerate(prompts):
        seq = jnp.asarray([prompt + np.asarray(out.tokens[b]).tolist()])
        lp = _lp(params, seq, config=lcfg)[0, len(prompt) - 1: -1]
        # the cached decode and the full forward sum in different orders: float32 rounding that
        # grows with |logp| (measured 1.2e-5 at logp = -3.0, jax 0.10.2 CPU)
        np.testing.assert_allclose(out.logp_policy[b], lp, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- training the adapter only
TRAIN_CFG = preset("tiny-qwen2", vocab_size=48, max_position_embeddings=64).replace(lora=LoraSpec(rank=4, alpha=8.0))


def _train_batch(B=8, L=16):
    rng = np.random.default_rng(0)
    mask = np.zeros((B, L), np.float32)
    mask[:, L // 2:] = 1
    return {"tokens": jnp.asarray(rng.integers(1, 48, (B, L)), jnp.int32), "loss_mask": jnp.asarray(mask)}


def test_split_trainable_and_errors():
    params = init_params(jax.random.key(0), TRAIN_CFG)
    trained, frozen = split_trainable(params)
    assert set(trained) == {"lora"} and "lora" not in frozen and set(frozen) | {"lora"} == set(params)
    assert combine_params(trained, frozen).keys() == params.keys() and combine_params(params, None) is params
    with pytest.raises(ValueError, match=r"trainable=\['adapter'\].*missing: \['adapter'\]"):
        split_trainable(params, ("adapter",))
    with pytest.raises(ValueError, match=r"both hold \['embed'\]"):
        combine_params({"embed": 1}, {"embed": 2})


def test_an_update_changes_only_the_adapter():
    params = _random_adapter(init_params(jax.random.key(0), TRAIN_CFG), scale=0.05)
    tx = make_optimizer(OptimSettings(lr=1e-2, clip_norm=None))
    state = TrainState.create(jax.tree.map(jnp.copy, params), tx, trainable=("lora",))
    assert set(state.params) == {"lora"} and set(state.frozen) == set(params) - {"lora"}
    # the optimizer state holds the adapter only: every array leaf has an adapter leaf's shape
    adapter_shapes = {x.shape for x in jax.tree.leaves(params["lora"])}
    opt_shapes = [x.shape for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    assert opt_shapes and set(opt_shapes) <= adapter_shapes
    n_opt = sum(x.size for x in jax.tree.leaves(state.opt_state))
    assert n_opt <= 2 * num_lora_params(TRAIN_CFG) + 8
    base_before = jax.tree.map(np.asarray, state.frozen)
    lora_before = jax.tree.map(np.asarray, state.params)
    update = make_update(sft_loss_fn(TRAIN_CFG), tx, microbatches=2)
    state, m = update(state, _train_batch())
    assert float(m["finite"]) == 1.0 and int(state.step) == 1
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, state.frozen), base_before)  # bit for bit
    changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)), state.params, lora_before)
    assert all(jax.tree.leaves(changed))
    assert state.model_params.keys() == params.keys()

    # the adapter's own step equals training everything and keeping only its part (Adam is per
    # leaf, no clipping): freezing the base changes what is updated, not how
    full = TrainState.create(jax.tree.map(jnp.copy, params), tx)
    full, m_full = make_update(sft_loss_fn(TRAIN_CFG), tx, microbatches=2)(full, _train_batch())
    # Adam's first step is lr g / (|g| + eps): ~lr * sign(g), except where |g| is near eps, where
    # the float32 rounding of g in the two differently fused jits shows (measured 2.7e-6 on one
    # element, jax 0.10.2 CPU). Freezing a leaf by mistake or updating it twice is off by ~lr = 1e-2.
    chex.assert_trees_all_close(state.params["lora"], full.params["lora"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(m["loss"], m_full["loss"], rtol=1e-6)


def test_frozen_base_is_an_argument_of_the_jit_not_a_constant():
    params = _random_adapter(init_params(jax.random.key(0), TRAIN_CFG), scale=0.05)
    tx = optax.sgd(0.0)
    update = make_update(sft_loss_fn(TRAIN_CFG), tx)
    _, m1 = update(TrainState.create(jax.tree.map(jnp.copy, params), tx, trainable=("lora",)), _train_batch())
    other = jax.tree.map(jnp.copy, {**params, "embed": params["embed"] * 3})
    want = np.asarray(other["embed"])
    s2, m2 = update(TrainState.create(other, tx, trainable=("lora",)), _train_batch())
    assert update._cache_size() == 1  # the same program ...
    assert abs(float(m1["loss"]) - float(m2["loss"])) > 1e-3  # ... computing with the base it was given
    np.testing.assert_array_equal(s2.frozen["embed"], want)


def test_sharded_update_with_a_frozen_base_keeps_every_sharding():
    rules = LogicalRules(make_mesh(MeshConfig(data=2, fsdp=4, tensor=1)))
    params = shard_params(_random_adapter(init_params(jax.random.key(0), TRAIN_CFG), scale=0.05), TRAIN_CFG, rules)
    assert len(params["lora"]["layers"]["q"]["a"].sharding.device_set) == 8
    tx = make_optimizer(OptimSettings(lr=1e-2))
    state = place_on_mesh(TrainState.create(params, tx, trainable=("lora",)), rules.mesh)
    batch = _train_batch()
    shardings = StepShardings.of(state, batch_sharding(rules, shape=batch["tokens"].shape))
    assert shardings.state.frozen["embed"] == params["embed"].sharding
    update = make_update(sft_loss_fn(TRAIN_CFG), tx, microbatches=2, shardings=shardings)
    before = jax.tree.map(lambda x: x.sharding, state)
    base = jax.tree.map(np.asarray, state.frozen)
    for _ in range(2):
        state, m = update(state, shardings.put_batch(batch))
    assert jax.tree.map(lambda x: x.sharding, state) == before and update._cache_size() == 1
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, state.frozen), base)
    assert float(m["finite"]) == 1.0


def test_dropout_seed_gives_each_microbatch_a_key_and_replays():
    cfg = TRAIN_CFG.replace(lora=LoraSpec(4, 8.0, 0.3))
    params = _random_adapter(init_params(jax.random.key(0), cfg), scale=0.2)
    tx = optax.sgd(0.0)
    fresh = lambda: TrainState.create(jax.tree.map(jnp.copy, params), tx, trainable=("lora",))  # noqa: E731
    seeded = make_update(sft_loss_fn(cfg), tx, microbatches=2, dropout_seed=0)
    a, b = (float(seeded(fresh(), _train_batch())[1]["loss"]) for _ in range(2))
    state, m1 = seeded(fresh(), _train_batch())
    _, m2 = seeded(state, _train_batch())  # the next update (step 1) draws other masks
    plain = float(make_update(sft_loss_fn(cfg), tx, microbatches=2)(fresh(), _train_batch())[1]["loss"])
    assert a == b  # a replay draws the same masks
    assert float(m1["loss"]) != float(m2["loss"]) and abs(a - plain) > 1e-4


# ----------------------------------------------------------------------------- checkpoints of train states
def test_train_states_round_trip_through_checkpoints(tmp_path):
    from flax import struct

    from jaxagent.train.checkpoint import Checkpointer

    @struct.dataclass
    class FourFieldState:  # the TrainState layout before ``frozen`` existed
        params: Any
        opt_state: Any
        step: jax.Array
        skipped: jax.Array

    params = _random_adapter(init_params(jax.random.key(0), TRAIN_CFG))
    tx = make_optimizer(OptimSettings(lr=1e-2))
    plain = TrainState.create(params, tx)
    lora = TrainState.create(params, tx, trainable=("lora",))
    old = FourFieldState(params, tx.init(params), jnp.int32(3), jnp.int32(1))
    assert jax.tree.structure(plain).num_leaves == jax.tree.structure(old).num_leaves
    ck = Checkpointer(tmp_path / "ck", async_save=False)
    for step, state in enumerate((plain, lora, old)):
        ck.save(step, {"state": state}, {})
    got, _ = ck.restore({"state": plain}, step=0)
    assert isinstance(got["state"], TrainState) and got["state"].frozen is None
    chex.assert_trees_all_equal(got["state"], plain)
    got, _ = ck.restore({"state": lora}, step=1)
    chex.assert_trees_all_equal(got["state"], lora)
    assert set(got["state"].frozen) == set(params) - {"lora"}
    got, _ = ck.restore({"state": plain}, step=2)  # a checkpoint written before the field existed
    chex.assert_trees_all_equal(got["state"].params, params)
    assert int(got["state"].step) == 3 and got["state"].frozen is None
    ck.close()


# ----------------------------------------------------------------------------- PEFT's format
def test_adapter_round_trip_and_peft_names(tmp_path):
    lcfg, params = _lora_model(CFG3, LoraSpec(rank=4, alpha=8.0, dropout=0.05, targets=("q", "o", "up")))
    save_peft_adapter(tmp_path / "ad", params, lcfg, base_model_name_or_path="Qwen/Qwen3-0.6B")
    c = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert (c["peft_type"], c["task_type"], c["r"], c["lora_alpha"], c["lora_dropout"], c["bias"]) == \
        ("LORA", "CAUSAL_LM", 4, 8.0, 0.05, "none")
    assert c["target_modules"] == ["o_proj", "q_proj", "up_proj"] and c["base_model_name_or_path"] == "Qwen/Qwen3-0.6B"
    assert not c["use_rslora"] and not c["use_dora"] and not c["fan_in_fan_out"]
    t = load_file(str(tmp_path / "ad" / "adapter_model.safetensors"))
    assert len(t) == 2 * 3 * 2
    # PEFT's layouts: lora_A [r, in], lora_B [out, r]; heads flattened as HF does (n * H + h)
    assert t["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"].shape == (4, 64)
    assert t["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"].shape == (4 * 32, 4)
    assert t["base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight"].shape == (4, 4 * 32)
    assert t["base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"].shape == (128, 4)
    np.testing.assert_array_equal(t["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"][3 * 32 + 5],
                                  np.asarray(params["lora"]["layers"]["q"]["b"][1, :, 3, 5]))
    base = {k: v for k, v in params.items() if k != "lora"}
    back, bcfg = load_peft_adapter(tmp_path / "ad", base, CFG3)
    assert bcfg == lcfg
    chex.assert_trees_all_equal(back, params)
    # into a config that already has the spec (its dropout is kept), and over an existing adapter
    keep = lcfg.replace(lora=LoraSpec(rank=4, alpha=8.0, dropout=0.2, targets=("q", "o", "up")))
    back2, bcfg2 = load_peft_adapter(tmp_path / "ad", init_params(jax.random.key(5), keep) | base, keep)
    assert bcfg2 == keep
    chex.assert_trees_all_equal(back2, params)
    assert read_peft_spec(tmp_path / "ad") == lcfg.lora


QV = LoraSpec(rank=4, alpha=8.0, targets=("q", "v"))


def _write_adapter(tmp_path, name, spec=QV):
    lcfg, params = _lora_model(CFG2, spec)
    save_peft_adapter(tmp_path / name, params, lcfg)
    return tmp_path / name, {k: v for k, v in params.items() if k != "lora"}


@pytest.mark.parametrize("change,needle", [
    (dict(use_rslora=True), "use_rslora=True: expected false"),
    (dict(use_dora=True), "use_dora=True: expected false"),
    (dict(bias="lora_only"), "bias='lora_only': expected 'none'"),
    (dict(peft_type="IA3"), "peft_type='IA3': expected 'LORA'"),
    (dict(task_type="SEQ_CLS"), "task_type='SEQ_CLS'"),
    (dict(target_modules=["q_proj", "lm_head"]), r"target_modules=\['q_proj', 'lm_head'\].*unknown: \['lm_head'\]"),
    (dict(target_modules=".*proj"), "a regular expression is not supported"),
    (dict(rank_pattern={"q_proj": 8}), "rank_pattern="),
    (dict(layers_to_transform=[0]), "layers_to_transform=\\[0\\]"),
    (dict(modules_to_save=["lm_head"]), "modules_to_save="),
    (dict(fan_in_fan_out=True), "fan_in_fan_out=True"),
    (dict(r=0), "r=0: expected a positive integer"),
    (dict(r=8), r"q_proj.lora_A.weight' has shape \[4, 64\], expected \[8, 64\] \(r=8"),
    (dict(target_modules=["q_proj", "v_proj", "k_proj"]), "k_proj.lora_A.weight' is missing"),
    (dict(target_modules=["q_proj"]), r"unexpected tensor\(s\).*v_proj"),
])
def test_unsupported_adapters_are_refused_naming_the_field(tmp_path, change, needle):
    path, base = _write_adapter(tmp_path, "ad")
    cfile = path / "adapter_config.json"
    cfile.write_text(json.dumps({**json.loads(cfile.read_text()), **change}))
    with pytest.raises(CheckpointError, match=needle):
        load_peft_adapter(path, base, CFG2)


def test_adapter_file_errors(tmp_path):
    path, base = _write_adapter(tmp_path, "ad")
    with pytest.raises(CheckpointError, match=r"lora.rank=4 in adapter_config.json, expected 8 \(config.lora.rank\)"):
        load_peft_adapter(path, base, CFG2.replace(lora=LoraSpec(rank=8, alpha=8.0, targets=("q", "v"))))
    with pytest.raises(CheckpointError, match=r"lora.targets=\('q', 'v'\).*expected \('q',\)"):
        load_peft_adapter(path, base, CFG2.replace(lora=LoraSpec(rank=4, alpha=8.0, targets=("q",))))
    t = load_file(str(path / "adapter_model.safetensors"))
    name = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    save_file({k: v for k, v in t.items() if k != name}, str(path / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match=f"tensor '{name}' is missing"):
        load_peft_adapter(path, base, CFG2)
    (path / "adapter_model.safetensors").unlink()
    (path / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(CheckpointError, match=r"adapter_model.safetensors is missing \(found \['adapter_model.bin'\]\)"):
        load_peft_adapter(path, base, CFG2)
    (path / "adapter_config.json").unlink()
    with pytest.raises(CheckpointError, match="adapter_config.json is missing"):
        load_peft_adapter(path, base, CFG2)
    # 'all-linear' (peft's shorthand) is every projection
    path2, _ = _write_adapter(tmp_path, "all", LoraSpec(rank=2, alpha=2.0))
    c = json.loads((path2 / "adapter_config.json").read_text())
    (path2 / "adapter_config.json").write_text(json.dumps({**c, "target_modules": "all-linear"}))
    assert read_peft_spec(path2).targets == ALL


HF_VARIANTS = {
    # Qwen2: q/k/v biases, tied embeddings; every projection adapted
    "qwen2": ("qwen2", dict(tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
              LoraSpec(rank=4, alpha=8.0, dropout=0.1, targets=ALL)),
    # Qwen3: q/k norms, head_dim != hidden / heads, untied; a subset, another scale
    "qwen3": ("qwen3", dict(tie_word_embeddings=False, head_dim=16, attention_bias=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
              LoraSpec(rank=3, alpha=4.0, targets=("q", "k", "o", "up", "down"))),
}


@pytest.mark.skipif(not HAS_PEFT, reason="PEFT parity needs torch and peft")
@pytest.mark.parametrize("name", sorted(HF_VARIANTS))
def test_peft_parity_and_merges(tmp_path, name):
    import peft
    import torch
    import transformers

    from tests.hf_reference import hf_logits, make_model, padded_batch

    arch, extra, spec = HF_VARIANTS[name]
    hf_kwargs = dict(vocab_size=80, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, **extra)
    model = make_model(arch, hf_kwargs, seed=7)
    model.save_pretrained(tmp_path / "base")
    cfg, base = load_pretrained(tmp_path / "base")
    lcfg = cfg.replace(lora=spec)
    params = _random_adapter({**base, "lora": init_lora(jax.random.key(0), lcfg)}, seed=3, scale=0.3)
    save_peft_adapter(tmp_path / "adapter", params, lcfg, base_model_name_or_path=str(tmp_path / "base"))

    tokens, mask, positions = padded_batch(hf_kwargs["vocab_size"], seed=3, offset=20)
    real = mask.astype(bool)
    ours = np.asarray(forward(params, jnp.asarray(tokens), config=lcfg, positions_BL=jnp.asarray(positions),
                              segment_ids_BL=jnp.asarray(mask)))
    base_logits = hf_logits(model, tokens, mask, positions)
    assert np.abs(ours[real] - base_logits[real]).max() > 0.1  # the adapter matters

    pm = peft.PeftModel.from_pretrained(model, tmp_path / "adapter").eval()
    pc = pm.peft_config["default"]
    assert (pc.r, pc.lora_alpha, set(pc.target_modules)) == (
        spec.rank, spec.alpha, {f"{t}_proj" for t in spec.targets})
    np.testing.assert_allclose(hf_logits(pm, tokens, mask, positions)[real], ours[real], atol=1e-4)

    # our merge, written as a plain HF checkpoint, loads in transformers and computes the same
    merged, mcfg = merge_lora(params, lcfg)
    save_pretrained(tmp_path / "merged", mcfg, merged)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    plain.config._attn_implementation = "eager"
    np.testing.assert_allclose(hf_logits(plain, tokens, mask, positions)[real], ours[real], atol=1e-4)

    # peft's own merge_and_unload gives our merged weights
    pm.merge_and_unload().save_pretrained(tmp_path / "peft_merged")
    _, theirs = load_pretrained(tmp_path / "peft_merged")
    chex.assert_trees_all_close(theirs, merged, atol=1e-6, rtol=0)

    # and an adapter peft saved (from its own model) reads back into ours
    fresh = make_model(arch, hf_kwargs, seed=7)
    pm2 = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter", is_trainable=True)
    pm2.save_pretrained(tmp_path / "peft_saved")
    back, bcfg = load_peft_adapter(tmp_path / "peft_saved", base, cfg)
    assert bcfg.lora == spec
    chex.assert_trees_all_close(back["lora"], params["lora"], atol=0, rtol=0)

"""HF interop: parity with transformers (committed fixtures, and live when torch is installed),
exact load -> save -> load round trips, and clear errors for bad checkpoints."""

import importlib.util
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxagent.models import (
    CheckpointError,
    ConfigError,
    DTypePolicy,
    forward,
    init_params,
    load_pretrained,
    preset,
    save_pretrained,
    token_logprobs,
)

FIXTURES = ["qwen2_tied", "qwen3_untied_yarn"]
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _forward_fixture(cfg, params, expected):
    return np.asarray(
        forward(
            params,
            jnp.asarray(expected["tokens"]),
            config=cfg,
            positions_BL=jnp.asarray(expected["position_ids"]),
            segment_ids_BL=jnp.asarray(expected["attention_mask"]),
        )
    )


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_logits_match_transformers(fixtures_dir, name):
    cfg, params = load_pretrained(fixtures_dir / name)
    expected = np.load(fixtures_dir / name / "expected.npz")
    real = expected["attention_mask"].astype(bool)
    assert real.sum() < real.size  # the batch really is padded (left and right)
    got = _forward_fixture(cfg, params, expected)
    assert np.abs(got[real] - expected["logits"][real]).max() <= 1e-4
    # And the log-prob path agrees with transformers' logits on the real tokens.
    lp = np.asarray(
        token_logprobs(
            params,
            jnp.asarray(expected["tokens"]),
            config=cfg,
            positions_BL=jnp.asarray(expected["position_ids"]),
            segment_ids_BL=jnp.asarray(expected["attention_mask"]),
            chunk_size=5,
        )
    )
    ref_logits = expected["logits"]
    ref = ref_logits - np.log(np.exp(ref_logits - ref_logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - ref_logits.max(-1, keepdims=True)
    nxt = np.concatenate([expected["tokens"][:, 1:], np.zeros_like(expected["tokens"][:, :1])], 1)
    ref_lp = np.take_along_axis(ref, nxt[..., None], -1)[..., 0]
    both = real & np.concatenate([real[:, 1:], np.zeros_like(real[:, :1])], 1)
    assert np.abs(lp[both] - ref_lp[both]).max() <= 1e-4


def test_fixture_configs_parsed(fixtures_dir):
    c2, _ = load_pretrained(fixtures_dir / "qwen2_tied")
    assert (c2.family, c2.tie_word_embeddings, c2.qkv_bias, c2.qk_norm) == ("qwen2", True, True, False)
    assert "lm_head" not in _
    c3, p3 = load_pretrained(fixtures_dir / "qwen3_untied_yarn")
    assert (c3.family, c3.tie_word_embeddings, c3.qkv_bias, c3.qk_norm, c3.head_dim) == ("qwen3", False, False, True, 16)
    assert c3.rope_scaling.rope_type == "yarn" and c3.rope_scaling.factor == 4.0
    assert p3["lm_head"].shape == (32, 96)
    assert len(list((fixtures_dir / "qwen3_untied_yarn").glob("*.safetensors"))) > 1


@pytest.mark.parametrize("name", FIXTURES)
def test_load_save_load_is_exact(fixtures_dir, tmp_path, name):
    cfg, params = load_pretrained(fixtures_dir / name)
    save_pretrained(tmp_path / "out", cfg, params, max_shard_size="30KB")
    cfg2, params2 = load_pretrained(tmp_path / "out")
    assert cfg2 == cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)
    # The saved tensors are bit-identical to the source checkpoint's.
    src = {}
    for f in (fixtures_dir / name).glob("*.safetensors"):
        src.update(load_file(str(f)))
    out = {}
    for f in (tmp_path / "out").glob("*.safetensors"):
        out.update(load_file(str(f)))
    assert set(out) == set(src) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    for k in out:
        np.testing.assert_array_equal(out[k], src[k])
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()


def test_save_bfloat16_and_load(tmp_path):
    cfg = preset("tiny-qwen3")
    params = init_params(jax.random.key(0), cfg)
    save_pretrained(tmp_path / "bf", cfg, params, dtype="bfloat16")
    assert json.loads((tmp_path / "bf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    cfg2, p2 = load_pretrained(tmp_path / "bf")
    assert cfg2.dtype == DTypePolicy("bfloat16", "bfloat16")
    assert p2["layers"]["q"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(p2["layers"]["q"]), np.asarray(params["layers"]["q"].astype(jnp.bfloat16))
    )
    # An explicit policy converts on load.
    cfg3, p3 = load_pretrained(tmp_path / "bf", dtype=DTypePolicy("float32", "float32"))
    assert p3["embed"].dtype == jnp.float32 and cfg3.dtype.compute_dtype == "float32"


def test_save_replaces_atomically_and_failed_save_keeps_old(tmp_path):
    cfg = preset("tiny-qwen2")
    p1 = init_params(jax.random.key(1), cfg)
    p2 = init_params(jax.random.key(2), cfg)
    save_pretrained(tmp_path / "m", cfg, p1)
    save_pretrained(tmp_path / "m", cfg, p2)
    _, got = load_pretrained(tmp_path / "m")
    np.testing.assert_array_equal(np.asarray(got["embed"]), np.asarray(p2["embed"]))
    bad = dict(p2, embed=p2["embed"][:10])
    with pytest.raises(CheckpointError, match=r"params\['embed'\]: shape \[10, 64\], expected \[512, 64\]"):
        save_pretrained(tmp_path / "m", cfg, bad)
    _, still = load_pretrained(tmp_path / "m")
    np.testing.assert_array_equal(np.asarray(still["embed"]), np.asarray(p2["embed"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary leftovers


# ----------------------------------------------------------------------------- bad checkpoints
def test_missing_shard_is_named(fixtures_dir, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(fixtures_dir / "qwen3_untied_yarn", d)
    (d / "model-00002-of-00008.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00008.safetensors"):
        load_pretrained(d)


def test_wrong_tensor_shape_is_named(fixtures_dir, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(fixtures_dir / "qwen2_tied", d)
    tensors = load_file(str(d / "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"][:, :31].copy()
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError, match=r"'model.layers.1.mlp.up_proj.weight' has shape \[48, 31\], expected \[48, 32\]"
    ):
        load_pretrained(d)


def test_missing_tensor_is_named(fixtures_dir, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(fixtures_dir / "qwen2_tied", d)
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.0.self_attn.k_proj.bias"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"'model.layers.0.self_attn.k_proj.bias' is missing"):
        load_pretrained(d)


def test_other_architecture_is_named(fixtures_dir, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(fixtures_dir / "qwen2_tied", d)
    hf = json.loads((d / "config.json").read_text())
    hf.update(architectures=["MistralForCausalLM"], model_type="mistral")
    (d / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ConfigError, match=r"architectures=\['MistralForCausalLM'\]"):
        load_pretrained(d)


def test_missing_config_and_directory(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_pretrained(tmp_path / "empty")


# ----------------------------------------------------------------------------- live parity (torch)
LIVE_VARIANTS = {
    "qwen2_untied_linear": ("qwen2", dict(tie_word_embeddings=False,
                                          rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                           "factor": 2.0})),
    "qwen2_yarn_truncate_false": ("qwen2", dict(tie_word_embeddings=True, max_position_embeddings=512,
                                                rope_parameters={"rope_type": "yarn", "rope_theta": 1e6,
                                                                 "factor": 8.0, "original_max_position_embeddings": 64,
                                                                 "truncate": False, "beta_fast": 16.0})),
    "qwen3_tied_attention_bias": ("qwen3", dict(tie_word_embeddings=True, attention_bias=True, head_dim=8,
                                                rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}


@pytest.mark.skipif(not HAS_TORCH, reason="live transformers parity needs torch (pip install '.[test]')")
@pytest.mark.parametrize("name", sorted(LIVE_VARIANTS))
def test_live_parity_with_transformers(tmp_path, name):
    import torch
    import transformers

    from tests.hf_reference import hf_logits, make_model, padded_batch

    arch, extra = LIVE_VARIANTS[name]
    hf_kwargs = dict(vocab_size=80, hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)
    hf_kwargs.update(extra)
    model = make_model(arch, hf_kwargs, seed=7)
    model.save_pretrained(tmp_path / "hf")
    cfg, params = load_pretrained(tmp_path / "hf")
    tokens, mask, positions = padded_batch(hf_kwargs["vocab_size"], seed=3, offset=40)
    want = hf_logits(model, tokens, mask, positions)
    got = _forward_fixture(cfg, params, dict(tokens=tokens, attention_mask=mask, position_ids=positions))
    real = mask.astype(bool)
    assert np.abs(got[real] - want[real]).max() <= 1e-4

    # Our save_pretrained output loads in transformers and computes the same logits.
    save_pretrained(tmp_path / "ours", cfg, params)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    assert type(back).__name__ == type(model).__name__
    back.config._attn_implementation = "eager"
    np.testing.assert_allclose(hf_logits(back, tokens, mask, positions)[real], want[real], atol=1e-5)


@pytest.mark.skipif(not HAS_TORCH, reason="live transformers parity needs torch (pip install '.[test]')")
def test_live_rope_tables_match_transformers():
    import torch  # noqa: F401
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from jaxagent.models import QwenConfig
    from jaxagent.models.config import rope_inv_freq

    for params in (
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 3.0},
        {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768},
        {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 4096,
         "attention_factor": 1.3, "beta_fast": 24, "beta_slow": 2},
    ):
        hf_cfg = transformers.Qwen2Config(hidden_size=256, num_attention_heads=2, num_key_value_heads=2,
                                          max_position_embeddings=131072,
                                          rope_parameters=dict(params))
        inv_t, af_t = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_cfg)
        ours = QwenConfig.from_hf_dict(dict(hf_cfg.to_dict(), architectures=["Qwen2ForCausalLM"]))
        inv, af = rope_inv_freq(ours)
        np.testing.assert_allclose(inv, inv_t.numpy(), rtol=1e-6)
        assert af == pytest.approx(af_t)

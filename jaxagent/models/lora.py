"""LoRA adapters for the Qwen decoder: a low-rank update beside the frozen base, applied inside the forward.

The adapter is a pytree at ``params["lora"]``, its matrices stacked on the layer axis like the base
layers (and scanned alongside them), in the layouts our einsums use (inputs and outputs with
heads split out, as the base matrices are), float32 storage whatever the base's dtype:

    lora/layers/q     a [Ly, D, r]      b [Ly, r, N, H]
    lora/layers/k, v  a [Ly, D, r]      b [Ly, r, K, H]
    lora/layers/o     a [Ly, N, H, r]   b [Ly, r, D]
    lora/layers/gate, up  a [Ly, D, r]  b [Ly, r, F]
    lora/layers/down  a [Ly, F, r]      b [Ly, r, D]

Only the projections in ``config.lora.targets`` are present. A target's output becomes
``x W (+ bias) + (alpha / r) * dropout(x) A B`` (PEFT's ``lora.Linear`` without rsLoRA or DoRA);
merged weights are never formed during training: the update costs two thin matmuls per target.
`init_lora` initialises as PEFT does (A kaiming-uniform with a = sqrt(5), torch ``nn.Linear``'s
default, i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)); B = 0), so a fresh adapter changes nothing.
`merge_lora` folds an adapter into the base weights (for export and fast decoding).

The spec (`LoraSpec`, rank / alpha / dropout / targets) is the static ``QwenConfig.lora`` field;
it never reaches the HF ``config.json``. Pure code: no I/O (`jaxagent.models.lora_hf` reads and
writes PEFT's adapter format).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from jaxagent.models.config import LORA_TARGETS, ConfigError, LoraSpec

if TYPE_CHECKING:  # pragma: no cover
    from jaxagent.models.config import QwenConfig

Params = dict[str, Any]

# Logical axes of each target's input and output (one layer, without the rank).
_IO_AXES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "q": (("embed",), ("q_heads", "head_dim")),
    "k": (("embed",), ("kv_heads", "head_dim")),
    "v": (("embed",), ("kv_heads", "head_dim")),
    "o": (("q_heads", "head_dim"), ("embed",)),
    "gate": (("embed",), ("mlp",)),
    "up": (("embed",), ("mlp",)),
    "down": (("mlp",), ("embed",)),
}


def _sizes(config: QwenConfig) -> dict[str, int]:
    return {
        "layers": config.num_hidden_layers, "embed": config.hidden_size, "q_heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads, "head_dim": config.head_dim, "mlp": config.intermediate_size,
    }


def _spec(config: QwenConfig) -> LoraSpec:
    if config.lora is None:
        raise ConfigError("config.lora=None: expected a LoraSpec (this config has no LoRA adapter)")
    return config.lora


def target_io_shapes(config: QwenConfig, target: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input dims, output dims) of one layer's ``target`` projection, e.g. q: ((D,), (N, H))."""
    sizes = _sizes(config)
    ins, outs = _IO_AXES[target]
    return tuple(sizes[a] for a in ins), tuple(sizes[a] for a in outs)


def lora_logical_axes(config: QwenConfig) -> Params:
    """Logical axis names of the adapter, ``{"layers": {target: {"a": ..., "b": ...}}}`` (the rank
    axis is None: replicated)."""
    spec = _spec(config)
    return {"layers": {
        t: {"a": ("layers", *_IO_AXES[t][0], None), "b": ("layers", None, *_IO_AXES[t][1])} for t in spec.targets
    }}


def lora_shapes(config: QwenConfig) -> Params:
    """Shapes of the adapter, a pytree like `lora_logical_axes`."""
    spec = _spec(config)
    Ly, r = config.num_hidden_layers, spec.rank
    out = {}
    for t in spec.targets:
        ins, outs = target_io_shapes(config, t)
        out[t] = {"a": (Ly, *ins, r), "b": (Ly, r, *outs)}
    return {"layers": out}


def num_lora_params(config: QwenConfig) -> int:
    """Number of adapter parameters (what LoRA trains)."""
    leaves = jax.tree.leaves(lora_shapes(config), is_leaf=lambda x: isinstance(x, tuple))
    return sum(math.prod(s) for s in leaves)


def init_lora(key: jax.Array, config: QwenConfig) -> Params:
    """A fresh adapter (float32): A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as PEFT's
    ``kaiming_uniform_(a=sqrt(5))`` of torch's ``lora_A`` (fan_in: the target's input size), B = 0."""
    shapes = lora_shapes(config)["layers"]
    keys = jax.random.split(key, len(shapes))
    out = {}
    for k, (t, s) in zip(keys, shapes.items()):
        fan_in = math.prod(s["a"][1:-1])
        bound = 1.0 / math.sqrt(fan_in)
        out[t] = {"a": jax.random.uniform(k, s["a"], jnp.float32, -bound, bound), "b": jnp.zeros(s["b"], jnp.float32)}
    return {"layers": out}


def check_lora(params: Params, config: QwenConfig) -> None:
    """Raises `ConfigError` when ``params["lora"]`` and ``config.lora`` disagree: an adapter without a
    spec (it would be ignored), a spec without an adapter, other targets or another rank."""
    has = isinstance(params, dict) and "lora" in params
    if config.lora is None:
        if has:
            raise ConfigError(
                "params['lora'] is present but config.lora=None: expected the adapter's LoraSpec in "
                "config.lora (or fold it in with merge_lora)")
        return
    spec = config.lora
    if not has:
        raise ConfigError(
            f"config.lora={spec}: params has no 'lora' entry; expected an adapter (init_lora, "
            "load_peft_adapter) at params['lora']")
    layers = params["lora"].get("layers") if isinstance(params["lora"], dict) else None
    if not isinstance(layers, dict) or set(layers) != set(spec.targets):
        got = sorted(layers) if isinstance(layers, dict) else layers
        raise ConfigError(f"params['lora']['layers'] targets {got}: expected {list(spec.targets)} (config.lora.targets)")
    for t in spec.targets:
        a, b = layers[t]["a"], layers[t]["b"]
        if a.shape[-1] != spec.rank or b.shape[1] != spec.rank:
            raise ConfigError(
                f"params['lora']['layers']['{t}']: a {tuple(a.shape)}, b {tuple(b.shape)}; expected rank "
                f"{spec.rank} (config.lora.rank)")


def layer_inputs(params: Params, config: QwenConfig) -> Params:
    """What the layer scan runs over: ``params["layers"]`` and, with an adapter, its stacked
    matrices under the key ``"lora"`` (so every layer gets ``lp["lora"][target]["a"/"b"]``)."""
    check_lora(params, config)
    if config.lora is None:
        return params["layers"]
    return {**params["layers"], "lora": params["lora"]["layers"]}


def layer_dropout_keys(dropout_key: jax.Array | None, config: QwenConfig) -> jax.Array | None:
    """One dropout key per layer [Ly] to scan alongside the layers, or None when no dropout applies
    (no key, no adapter, or ``dropout`` 0)."""
    if dropout_key is None or config.lora is None or config.lora.dropout == 0:
        return None
    return jax.random.split(dropout_key, config.num_hidden_layers)


def lora_delta(x: jax.Array, lp: Params, target: str, *, config: QwenConfig,
               dropout_key: jax.Array | None = None) -> jax.Array | None:
    """``(alpha / r) * dropout(x) A B`` for one layer's ``target`` (None when the layer params
    ``lp`` hold no adapter for it). ``x`` [B, L, in...] (the projection's input) -> [B, L, out...]
    in the dtype of ``x``. ``dropout_key`` (one layer's key) draws the target's own mask (PEFT has
    one dropout module per adapted projection); None: no dropout."""
    ab = lp.get("lora", {}).get(target) if isinstance(lp, dict) else None
    if ab is None:
        return None
    spec = config.lora
    dt = x.dtype
    a, b = ab["a"].astype(dt), ab["b"].astype(dt)
    n_in = a.ndim - 1
    if dropout_key is not None and spec.dropout > 0:
        k = jax.random.fold_in(dropout_key, list(LORA_TARGETS).index(target))
        keep = jax.random.bernoulli(k, 1.0 - spec.dropout, x.shape)
        x = jnp.where(keep, x / jnp.asarray(1.0 - spec.dropout, dt), jnp.zeros((), dt))
    xa = jnp.tensordot(x, a, axes=n_in)  # [B, L, r]
    return (jnp.tensordot(xa, b, axes=1) * jnp.asarray(spec.scale, dt)).astype(dt)


def lora_weight_delta(adapter: Params, target: str, scale: float) -> jax.Array:
    """``scale * A B`` for every layer, float32, in the base matrix's layout [Ly, in..., out...]."""
    a = adapter["layers"][target]["a"].astype(jnp.float32)
    b = adapter["layers"][target]["b"].astype(jnp.float32)
    Ly, r = a.shape[0], a.shape[-1]
    ins, outs = a.shape[1:-1], b.shape[2:]
    w = jnp.einsum("lir,lro->lio", a.reshape(Ly, -1, r), b.reshape(Ly, r, -1))
    return scale * w.reshape(Ly, *ins, *outs)


def merge_lora(params: Params, config: QwenConfig) -> tuple[Params, QwenConfig]:
    """Folds the adapter into the base: ``W + (alpha / r) A B`` for each target (computed in float32,
    stored in the base's dtype). Returns ``(params without "lora", config with lora=None)``, a
    plain model (`jaxagent.models.hf.save_pretrained` writes it as an HF checkpoint)."""
    check_lora(params, config)
    spec = _spec(config)
    layers = dict(params["layers"])
    for t in spec.targets:
        w = layers[t]
        layers[t] = (w.astype(jnp.float32) + lora_weight_delta(params["lora"], t, spec.scale)).astype(w.dtype)
    merged = {k: v for k, v in params.items() if k != "lora"}
    merged["layers"] = layers
    return merged, config.replace(lora=None)


def base_params(params: Params) -> Params:
    """``params`` without the adapter (the frozen base)."""
    return {k: v for k, v in params.items() if k != "lora"}


__all__ = ["LORA_TARGETS", "LoraSpec", "base_params", "check_lora", "init_lora", "layer_dropout_keys", "layer_inputs",
           "lora_delta", "lora_logical_axes", "lora_shapes", "lora_weight_delta", "merge_lora", "num_lora_params",
           "target_io_shapes"]

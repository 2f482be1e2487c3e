"""PEFT adapter directories in and out: ``adapter_config.json`` + ``adapter_model.safetensors`` <-> ``params["lora"]``.

`save_peft_adapter` writes what ``peft.PeftModel.from_pretrained(base_model, path)`` loads onto a
transformers Qwen2/Qwen3 model (tensor names
``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`` [r, in] and ``...lora_B.weight``
[out, r], ``mlp.gate_proj`` etc.); `load_peft_adapter` reads one back, refusing what our forward
does not compute (rsLoRA, DoRA, trained biases, per-module ranks, other modules, ...) with an
error naming the field, its value and what is expected. A merged plain checkpoint is
`jaxagent.models.hf.save_pretrained` of `jaxagent.models.lora.merge_lora`'s result.

Shapes: r rank, Ly layers; ours per layer ``a [in..., r]``, ``b [r, out...]`` (`jaxagent.models.lora`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxagent.models.config import LORA_TARGETS, DTypePolicy, LoraSpec, QwenConfig
from jaxagent.models.hf import CheckpointError, to_host, write_directory_atomically
from jaxagent.models.lora import base_params, check_lora, lora_logical_axes, target_io_shapes
from jaxagent.models.qwen import Params
from jaxagent.models.sharding import LogicalRules

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_MODULE = {t: ("self_attn." if t in ("q", "k", "v", "o") else "mlp.") + name for t, name in LORA_TARGETS.items()}
_HF_TO_TARGET = {name: t for t, name in LORA_TARGETS.items()}


def peft_tensor_name(target: str, layer: int, which: str) -> str:
    """PEFT's name of layer ``layer``'s ``target`` matrix ``which`` ("A" or "B")."""
    return f"{_PREFIX}model.layers.{layer}.{_MODULE[target]}.lora_{which}.weight"


def _peft_shapes(config: QwenConfig, target: str, rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
    ins, outs = target_io_shapes(config, target)
    return (rank, math.prod(ins)), (math.prod(outs), rank)


def peft_adapter_config(spec: LoraSpec, *, base_model_name_or_path: str | None = None) -> dict[str, Any]:
    """The ``adapter_config.json`` contents of a LoRA adapter with ``spec`` (peft's ``LoraConfig``
    fields; plain LoRA: no rsLoRA, DoRA, biases or per-module patterns)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "revision": None,
        "inference_mode": True,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": sorted(LORA_TARGETS[t] for t in spec.targets),
        "exclude_modules": None,
        "fan_in_fan_out": False,
        "bias": "none",
        "lora_bias": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def save_peft_adapter(
    path: str | os.PathLike,
    params: Params,
    config: QwenConfig,
    *,
    base_model_name_or_path: str | None = None,
    dtype: str | None = None,
) -> Path:
    """Writes ``params["lora"]`` (with ``config.lora``) as a PEFT LoRA adapter directory, atomically
    (as `jaxagent.models.hf.save_pretrained`). ``dtype`` (default float32, the adapter's storage):
    the stored precision. ``base_model_name_or_path`` is recorded for PEFT (the base checkpoint's
    directory or hub name). In multi-host runs every process must call this; process 0 writes."""
    check_lora(params, config)
    spec = config.lora
    if spec is None:
        raise CheckpointError("config.lora=None: expected a LoraSpec (there is no adapter to save)")
    store = DTypePolicy(dtype, dtype).param if dtype is not None else np.float32
    tensors: dict[str, np.ndarray] = {}
    for t in spec.targets:
        a = to_host(params["lora"]["layers"][t]["a"]).astype(store)  # [Ly, in..., r]
        b = to_host(params["lora"]["layers"][t]["b"]).astype(store)  # [Ly, r, out...]
        for i in range(config.num_hidden_layers):
            tensors[peft_tensor_name(t, i, "A")] = np.ascontiguousarray(a[i].reshape(-1, spec.rank).T)
            tensors[peft_tensor_name(t, i, "B")] = np.ascontiguousarray(b[i].reshape(spec.rank, -1).T)
    if jax.process_index() != 0:
        return Path(path)
    adapter_config = peft_adapter_config(spec, base_model_name_or_path=base_model_name_or_path)

    def fill(tmp: Path) -> None:
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})

    return write_directory_atomically(path, fill)


# ---------------------------------------------------------------------------- loading
def _refuse(path: Path, field: str, value: Any, expected: str) -> CheckpointError:
    return CheckpointError(f"adapter {str(path)!r}: {ADAPTER_CONFIG} {field}={value!r}: expected {expected}")


def read_peft_spec(path: str | os.PathLike) -> LoraSpec:
    """The `LoraSpec` of a PEFT adapter directory's ``adapter_config.json``; raises
    `CheckpointError` for what our forward does not compute (naming the field, value, expected)."""
    path = Path(path)
    cfile = path / ADAPTER_CONFIG
    if not cfile.exists():
        raise CheckpointError(f"adapter {str(path)!r}: {ADAPTER_CONFIG} is missing")
    try:
        c = json.loads(cfile.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"adapter {str(path)!r}: {ADAPTER_CONFIG} is not JSON ({e})") from None
    if not isinstance(c, dict):
        raise CheckpointError(f"adapter {str(path)!r}: {ADAPTER_CONFIG}: expected a JSON object")
    if c.get("peft_type") != "LORA":
        raise _refuse(path, "peft_type", c.get("peft_type"), "'LORA'")
    if c.get("task_type") not in (None, "CAUSAL_LM"):
        raise _refuse(path, "task_type", c.get("task_type"), "'CAUSAL_LM'")
    if c.get("bias", "none") != "none":
        raise _refuse(path, "bias", c.get("bias"), "'none' (trained biases are not supported)")
    flags = {
        "use_rslora": "false (rsLoRA's alpha / sqrt(r) scaling is not supported)",
        "use_dora": "false (DoRA is not supported)",
        "lora_bias": "false (a bias on lora_B is not supported)",
        "fan_in_fan_out": "false (Conv1D-style weights are not used by Qwen)",
        "use_qalora": "false (QA-LoRA is not supported)",
        "use_bdlora": "null (BD-LoRA is not supported)",
    }
    for field, expected in flags.items():
        if c.get(field):
            raise _refuse(path, field, c.get(field), expected)
    empty = {
        "rank_pattern": "{} (one rank for every module)",
        "alpha_pattern": "{} (one alpha for every module)",
        "layers_to_transform": "null (every layer adapted)",
        "layers_pattern": "null (every layer adapted)",
        "modules_to_save": "null (only LoRA matrices are trained)",
        "exclude_modules": "null",
        "target_parameters": "null (only nn.Linear modules adapted)",
        "layer_replication": "null",
        "trainable_token_indices": "null",
        "alora_invocation_tokens": "null (activated LoRA is not supported)",
        "megatron_config": "null",
    }
    for field, expected in empty.items():
        if c.get(field):
            raise _refuse(path, field, c.get(field), expected)
    modules = c.get("target_modules")
    if modules == "all-linear":
        targets = tuple(LORA_TARGETS)
    elif isinstance(modules, (list, tuple)) and modules:
        unknown = sorted(str(m) for m in modules if m not in _HF_TO_TARGET)
        if unknown:
            raise _refuse(path, "target_modules", modules,
                          f"names among {sorted(_HF_TO_TARGET)} (unknown: {unknown})")
        targets = tuple(_HF_TO_TARGET[m] for m in modules)
    else:
        raise _refuse(path, "target_modules", modules,
                      f"a non-empty list of module names among {sorted(_HF_TO_TARGET)} or 'all-linear' "
                      "(a regular expression is not supported)")
    r = c.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise _refuse(path, "r", r, "a positive integer")
    alpha = c.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise _refuse(path, "lora_alpha", alpha, "a number > 0")
    dropout = c.get("lora_dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise _refuse(path, "lora_dropout", dropout, "a number in [0, 1)")
    return LoraSpec(rank=r, alpha=float(alpha), dropout=float(dropout), targets=targets)


def load_peft_adapter(
    path: str | os.PathLike,
    params: Params,
    config: QwenConfig,
    *,
    rules: LogicalRules | None = None,
) -> tuple[Params, QwenConfig]:
    """Reads a PEFT LoRA adapter directory onto a base model: returns ``(params with "lora" = the
    adapter (float32), config with lora = its spec)`` (an adapter already in ``params`` is
    replaced). When ``config.lora`` is set, the file's rank, alpha and targets must equal it (its
    dropout, a training setting, is kept). With ``rules``, the adapter is placed with the
    parameter shardings (`jaxagent.models.lora.lora_logical_axes`).

    Raises `CheckpointError` naming the field / tensor, the value and what was expected: an
    unsupported adapter config (`read_peft_spec`), a missing or unexpected tensor, a wrong shape."""
    path = Path(path)
    spec = read_peft_spec(path)
    if config.lora is not None:
        for field in ("rank", "alpha", "targets"):
            got, want = getattr(spec, field), getattr(config.lora, field)
            if got != want:
                raise CheckpointError(
                    f"adapter {str(path)!r}: lora.{field}={got!r} in {ADAPTER_CONFIG}, expected {want!r} "
                    f"(config.lora.{field})")
        spec = config.lora
    wfile = path / ADAPTER_WEIGHTS
    if not wfile.exists():
        other = sorted(p.name for p in path.glob("adapter_model*"))
        raise CheckpointError(
            f"adapter {str(path)!r}: {ADAPTER_WEIGHTS} is missing (found {other}); expected the safetensors "
            "file PEFT writes (a pickled .bin is not read)")
    config = config.replace(lora=spec)
    expected: dict[str, tuple[int, int]] = {}
    for t in spec.targets:
        a_shape, b_shape = _peft_shapes(config, t, spec.rank)
        for i in range(config.num_hidden_layers):
            expected[peft_tensor_name(t, i, "A")] = a_shape
            expected[peft_tensor_name(t, i, "B")] = b_shape
    try:
        handle = safe_open(str(wfile), framework="numpy")
    except Exception as e:  # safetensors' SafetensorError, OSError
        raise CheckpointError(
            f"adapter {str(path)!r}: {ADAPTER_WEIGHTS} cannot be read as safetensors ({type(e).__name__}: {e})"
        ) from None
    with handle:
        names = set(handle.keys())
        missing = sorted(set(expected) - names)
        if missing:
            raise CheckpointError(
                f"adapter {str(path)!r}: tensor {missing[0]!r} is missing ({len(missing)} missing; expected one "
                f"lora_A and lora_B per layer for target_modules {sorted(LORA_TARGETS[t] for t in spec.targets)})")
        extra = sorted(names - set(expected))
        if extra:
            raise CheckpointError(
                f"adapter {str(path)!r}: unexpected tensor(s) {extra[:4]} ({len(extra)} in all); expected only "
                "the lora_A / lora_B matrices of the target modules")
        for name, want in expected.items():
            got = tuple(handle.get_slice(name).get_shape())
            if got != want:
                raise CheckpointError(
                    f"adapter {str(path)!r}: tensor {name!r} has shape {list(got)}, expected {list(want)} "
                    f"(r={spec.rank} and the base model's config)")
        layers = {}
        for t in spec.targets:
            ins, outs = target_io_shapes(config, t)
            a = np.stack([handle.get_tensor(peft_tensor_name(t, i, "A")).astype(np.float32).T.reshape(*ins, spec.rank)
                          for i in range(config.num_hidden_layers)])
            b = np.stack([handle.get_tensor(peft_tensor_name(t, i, "B")).astype(np.float32).T.reshape(spec.rank, *outs)
                          for i in range(config.num_hidden_layers)])
            layers[t] = {"a": a, "b": b}
    adapter = {"layers": layers}
    if rules is None:
        adapter = jax.tree.map(jnp.asarray, adapter)
    else:
        axes = lora_logical_axes(config)
        adapter = jax.tree.map(lambda ax, x: jax.device_put(x, rules.sharding(ax, x.shape)), axes, adapter,
                               is_leaf=lambda x: isinstance(x, tuple))
    return {**base_params(params), "lora": adapter}, config


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "load_peft_adapter", "peft_adapter_config", "peft_tensor_name",
           "read_peft_spec", "save_peft_adapter"]

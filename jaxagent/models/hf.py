"""Hugging Face checkpoints in and out: ``config.json`` + ``*.safetensors`` <-> (QwenConfig, params).

`load_pretrained` reads with safetensors (no torch), one tensor slice at a time: with sharding
rules each device's shard is read straight from the memory-mapped file into that device, so the
whole model is never gathered on one device or held twice in host memory. `save_pretrained`
writes a directory that ``transformers.AutoModelForCausalLM.from_pretrained`` loads, atomically
(a crash leaves the previous directory, or none, never a half-written one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxagent.models.config import DTypePolicy, QwenConfig
from jaxagent.models.qwen import Params, param_shapes
from jaxagent.models.sharding import LogicalRules
from jaxagent.models.placement import param_shardings

SAFE_INDEX = "model.safetensors.index.json"
SAFE_SINGLE = "model.safetensors"
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")


class CheckpointError(ValueError):
    """A checkpoint directory is missing a file or tensor, or holds one of the wrong shape."""


# ---------------------------------------------------------------------------- name mapping
@dataclasses.dataclass(frozen=True)
class _Leaf:
    """How one of our parameters is built from HF tensors.

    kind: ``copy`` (same layout), ``T`` (2-D transpose), ``proj`` (HF [X*H, D] -> ours [D, X, H]),
    ``proj_bias`` (HF [X*H] -> ours [X, H]), ``out`` (HF [D, N*H] -> ours [N, H, D]).
    """

    path: tuple[str, ...]
    hf_name: str  # may hold "{i}" for the layer index
    kind: str
    stacked: bool


def _leaves(config: QwenConfig) -> list[_Leaf]:
    L = "model.layers.{i}."
    out = [
        _Leaf(("embed",), "model.embed_tokens.weight", "copy", False),
        _Leaf(("final_norm",), "model.norm.weight", "copy", False),
        _Leaf(("layers", "attn_norm"), L + "input_layernorm.weight", "copy", True),
        _Leaf(("layers", "mlp_norm"), L + "post_attention_layernorm.weight", "copy", True),
        _Leaf(("layers", "q"), L + "self_attn.q_proj.weight", "proj", True),
        _Leaf(("layers", "k"), L + "self_attn.k_proj.weight", "proj", True),
        _Leaf(("layers", "v"), L + "self_attn.v_proj.weight", "proj", True),
        _Leaf(("layers", "o"), L + "self_attn.o_proj.weight", "out", True),
        _Leaf(("layers", "gate"), L + "mlp.gate_proj.weight", "T", True),
        _Leaf(("layers", "up"), L + "mlp.up_proj.weight", "T", True),
        _Leaf(("layers", "down"), L + "mlp.down_proj.weight", "T", True),
    ]
    if config.qkv_bias:
        out += [
            _Leaf(("layers", "q_bias"), L + "self_attn.q_proj.bias", "proj_bias", True),
            _Leaf(("layers", "k_bias"), L + "self_attn.k_proj.bias", "proj_bias", True),
            _Leaf(("layers", "v_bias"), L + "self_attn.v_proj.bias", "proj_bias", True),
        ]
    if config.o_bias:
        out.append(_Leaf(("layers", "o_bias"), L + "self_attn.o_proj.bias", "copy", True))
    if config.qk_norm:
        out += [
            _Leaf(("layers", "q_norm"), L + "self_attn.q_norm.weight", "copy", True),
            _Leaf(("layers", "k_norm"), L + "self_attn.k_norm.weight", "copy", True),
        ]
    if not config.tie_word_embeddings:
        out.append(_Leaf(("lm_head",), "lm_head.weight", "T", False))
    return out


def _hf_shape(kind: str, ours: tuple[int, ...]) -> tuple[int, ...]:
    """HF tensor shape for one layer given our (unstacked) shape."""
    if kind == "copy":
        return ours
    if kind == "T":
        return (ours[1], ours[0])
    if kind == "proj":  # ours [D, X, H]
        return (ours[1] * ours[2], ours[0])
    if kind == "proj_bias":  # ours [X, H]
        return (ours[0] * ours[1],)
    if kind == "out":  # ours [N, H, D]
        return (ours[2], ours[0] * ours[1])
    raise AssertionError(kind)


def _read_slice(handle, name: str, kind: str, ours_shape: tuple[int, ...], idx: tuple[slice, ...]) -> np.ndarray:
    """Reads the part of HF tensor ``name`` that lands in ``ours[idx]`` (one layer, unstacked)."""
    idx = tuple(slice(*s.indices(n)) for s, n in zip(idx, ours_shape))
    sl = handle.get_slice(name)
    if kind == "copy":
        return sl[idx]
    if kind == "T":
        return sl[idx[1], idx[0]].T
    if kind == "proj":
        d, x, h = idx
        H = ours_shape[2]
        block = sl[x.start * H : x.stop * H, d]  # [nx*H, nd]
        block = block.reshape(x.stop - x.start, H, -1).transpose(2, 0, 1)
        return block[:, :, h]
    if kind == "proj_bias":
        x, h = idx
        H = ours_shape[1]
        return sl[x.start * H : x.stop * H].reshape(x.stop - x.start, H)[:, h]
    if kind == "out":
        n, h, d = idx
        H = ours_shape[1]
        block = sl[d, n.start * H : n.stop * H]  # [nd, nn*H]
        return block.reshape(d.stop - d.start, n.stop - n.start, H).transpose(1, 2, 0)[:, h, :]
    raise AssertionError(kind)


def _to_hf(kind: str, ours: np.ndarray) -> np.ndarray:
    """Our (unstacked) array -> the HF tensor."""
    if kind == "copy":
        return ours
    if kind == "T":
        return ours.T
    if kind == "proj":
        D, X, H = ours.shape
        return ours.transpose(1, 2, 0).reshape(X * H, D)
    if kind == "proj_bias":
        return ours.reshape(-1)
    if kind == "out":
        N, H, D = ours.shape
        return ours.transpose(2, 0, 1).reshape(D, N * H)
    raise AssertionError(kind)


def _get(tree: Params, path: tuple[str, ...]):
    for p in path:
        tree = tree[p]
    return tree


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


# ---------------------------------------------------------------------------- loading
class _Checkpoint:
    """The tensors of a checkpoint directory: name -> file, with open handles."""

    def __init__(self, path: Path):
        self.path = path
        index = path / SAFE_INDEX
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: expected a JSON object with a 'weight_map' ({e})") from None
            missing = sorted({f for f in weight_map.values() if not (path / f).exists()})
            if missing:
                raise CheckpointError(
                    f"checkpoint {str(path)!r}: shard file(s) {missing} named in {SAFE_INDEX} do not exist"
                )
            self.files = sorted(set(weight_map.values()))
        elif (path / SAFE_SINGLE).exists():
            self.files = [SAFE_SINGLE]
        else:
            found = sorted(p.name for p in path.glob("*.safetensors"))
            if not found:
                raise CheckpointError(
                    f"checkpoint {str(path)!r}: no {SAFE_INDEX} or {SAFE_SINGLE} (and no *.safetensors file)"
                )
            self.files = found
        self._stack = contextlib.ExitStack()
        self.where: dict[str, Any] = {}
        for f in self.files:
            try:
                handle = self._stack.enter_context(safe_open(str(path / f), framework="numpy"))
            except Exception as e:  # safetensors' SafetensorError (truncated / not a safetensors file), OSError
                self._stack.close()
                size = (path / f).stat().st_size if (path / f).exists() else None
                raise CheckpointError(
                    f"checkpoint {str(path)!r}: file {f!r} ({size} bytes) cannot be read as safetensors "
                    f"({type(e).__name__}: {e}); a truncated download? expected a complete .safetensors file"
                ) from None
            for name in handle.keys():
                self.where[name] = handle

    def close(self):
        self._stack.close()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.where[name].get_slice(name).get_shape())


def _default_policy(hf: dict) -> DTypePolicy:
    dt = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    dt = dt if dt in ("float32", "bfloat16", "float16") else "float32"
    return DTypePolicy(param_dtype=dt, compute_dtype=dt)


def load_pretrained(
    path: str | os.PathLike,
    *,
    dtype: DTypePolicy | None = None,
    rules: LogicalRules | None = None,
    **config_overrides,
) -> tuple[QwenConfig, Params]:
    """Loads a local HF Qwen2/2.5/3 checkpoint directory.

    Returns ``(config, params)`` with params in ``dtype.param_dtype`` (default: the checkpoint's
    dtype for both storage and compute). A ``lora=LoraSpec(...)`` override gives a config with
    that spec but params of the base only: add the adapter with `jaxagent.models.lora.init_lora`
    or `jaxagent.models.lora_hf.load_peft_adapter`. With ``rules`` each parameter is created with its
    sharding (`param_shardings`) and each device reads only its own slice of the file.
    Raises `ConfigError` / `CheckpointError` naming the offending file, tensor and shape.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r}: not a directory")
    hf = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else None
    if hf is None:
        raise CheckpointError(f"checkpoint {str(path)!r}: config.json is missing")
    config = QwenConfig.from_hf_dict(hf, dtype=dtype or _default_policy(hf), **config_overrides)
    ckpt = _Checkpoint(path)
    try:
        leaves = _leaves(config)
        shapes = param_shapes(config)
        # Validate every tensor before reading any: names and shapes.
        expected_names = set()
        for leaf in leaves:
            ours = _get(shapes, leaf.path)
            per_layer = ours[1:] if leaf.stacked else ours
            want = _hf_shape(leaf.kind, per_layer)
            layers = range(config.num_hidden_layers) if leaf.stacked else [None]
            for i in layers:
                name = leaf.hf_name.format(i=i)
                expected_names.add(name)
                if name not in ckpt.where:
                    raise CheckpointError(
                        f"checkpoint {str(path)!r}: tensor {name!r} is missing (files: {ckpt.files})"
                    )
                got = ckpt.shape(name)
                if got != want:
                    raise CheckpointError(
                        f"checkpoint {str(path)!r}: tensor {name!r} has shape {list(got)}, expected "
                        f"{list(want)} from config.json"
                    )
        extra = sorted(
            n
            for n in ckpt.where
            if n not in expected_names
            and not _IGNORED.search(n)
            and not (n == "lm_head.weight" and config.tie_word_embeddings)
        )
        if extra:
            warnings.warn(f"checkpoint {str(path)!r}: ignoring unexpected tensors {extra[:8]}", stacklevel=2)

        target = config.dtype.param
        shardings = param_shardings(config, rules) if rules is not None else None
        params: dict = {}
        for leaf in leaves:
            shape = _get(shapes, leaf.path)
            handles = ckpt.where

            def read(index, leaf=leaf, shape=shape, handles=handles) -> np.ndarray:
                index = tuple(slice(None) for _ in shape) if index is None else tuple(index)
                if not leaf.stacked:
                    return _read_slice(handles[leaf.hf_name], leaf.hf_name, leaf.kind, shape, index).astype(target)
                layers = range(*index[0].indices(shape[0]))
                parts = [
                    _read_slice(
                        handles[leaf.hf_name.format(i=i)], leaf.hf_name.format(i=i), leaf.kind, shape[1:], index[1:]
                    )
                    for i in layers
                ]
                return np.stack(parts).astype(target)

            if shardings is None:
                value = jnp.asarray(read(None))
            else:
                value = jax.make_array_from_callback(shape, _get(shardings, leaf.path), read, dtype=target)
            _set(params, leaf.path, value)
        return config, params
    finally:
        ckpt.close()


# ---------------------------------------------------------------------------- saving
def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B)\s*", str(size).upper())
    if not m:
        raise ValueError(f"max_shard_size={size!r}: expected bytes as an int or a string like '2GB'")
    return int(float(m.group(1)) * {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}[m.group(2)])


def to_host(x: jax.Array) -> np.ndarray:
    """``x`` as a host numpy array (gathered from every process when it is not fully addressable)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def save_pretrained(
    path: str | os.PathLike,
    config: QwenConfig,
    params: Params,
    *,
    dtype: str | None = None,
    max_shard_size: int | str = "2GB",
) -> Path:
    """Writes ``config.json`` and safetensors shards (with an index when there are several) that
    transformers loads as ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``.

    ``dtype`` (default: the parameters' dtype) is the stored precision. The directory is written
    to a temporary sibling and renamed into place, so readers never see a partial checkpoint.
    In multi-host runs every process must call this (parameters are gathered); process 0 writes.
    """
    path = Path(path)
    if config.lora is not None:
        raise CheckpointError(
            f"config.lora={config.lora}: expected None; an HF checkpoint holds a plain model: fold the adapter "
            "in first (jaxagent.models.lora.merge_lora) or write it as a PEFT adapter "
            "(jaxagent.models.lora_hf.save_peft_adapter)")
    shapes = param_shapes(config)
    for leaf in _leaves(config):
        got = tuple(_get(params, leaf.path).shape)
        want = _get(shapes, leaf.path)
        if got != want:
            raise CheckpointError(f"params{list(leaf.path)}: shape {list(got)}, expected {list(want)} for this config")
    tensors: dict[str, np.ndarray] = {}
    for leaf in _leaves(config):
        arr = to_host(_get(params, leaf.path))
        if dtype is not None:
            arr = arr.astype(DTypePolicy(dtype, dtype).param)
        if leaf.stacked:
            for i in range(config.num_hidden_layers):
                tensors[leaf.hf_name.format(i=i)] = np.ascontiguousarray(_to_hf(leaf.kind, arr[i]))
        else:
            tensors[leaf.hf_name] = np.ascontiguousarray(_to_hf(leaf.kind, arr))
    if jax.process_index() != 0:
        return path

    stored = dtype or str(np.dtype(next(iter(tensors.values())).dtype).name)
    hf_config = config.to_hf_dict()
    hf_config["torch_dtype"] = hf_config["dtype"] = stored

    limit = _parse_size(max_shard_size)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, arr in tensors.items():
        if shards[-1] and size + arr.nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = arr
        size += arr.nbytes

    def fill(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        if len(shards) == 1:
            save_file(shards[0], str(tmp / SAFE_SINGLE), metadata={"format": "pt"})
        else:
            weight_map = {}
            for k, shard in enumerate(shards):
                fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / fname), metadata={"format": "pt"})
                weight_map.update({name: fname for name in shard})
            total = sum(a.nbytes for a in tensors.values())
            (tmp / SAFE_INDEX).write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
            )

    return write_directory_atomically(path, fill)


def write_directory_atomically(path: str | os.PathLike, fill) -> Path:
    """Creates directory ``path`` by ``fill(tmp)`` writing into a temporary sibling that is then
    renamed into place (replacing an existing ``path``): readers see the old directory, or the new
    one, never a partial one; a failed ``fill`` leaves the old directory untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        fill(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path

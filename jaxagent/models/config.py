"""Model configuration: a frozen, hashable description of a Qwen-style decoder.

`QwenConfig` is what every pure model function takes as a static argument. It is built from a
Hugging Face ``config.json`` (`QwenConfig.from_hf_dict`) for ``Qwen2ForCausalLM`` (Qwen2, Qwen2.5)
and ``Qwen3ForCausalLM`` (dense Qwen3), or from a named preset (`preset`), and written back with
`QwenConfig.to_hf_dict`.

Errors for bad input name the field, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import jax.numpy as jnp
import numpy as np

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
RopeType = Literal["default", "linear", "yarn"]
RematPolicy = Literal["none", "full", "dots"]
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type, or not supported."""


def _require(cond: bool, field: str, value: Any, expected: str) -> None:
    if not cond:
        raise ConfigError(f"{field}={value!r}: expected {expected}")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as Qwen checkpoints use it.

    ``rope_type``: ``default`` (none), ``linear`` (positions divided by ``factor``) or ``yarn``
    (NTK-by-parts interpolation with an attention factor, as in transformers'
    ``_compute_yarn_parameters``).
    """

    rope_type: RopeType = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


@dataclasses.dataclass(frozen=True)
class DTypePolicy:
    """Where each precision is used.

    ``param_dtype``: storage of the parameter pytree. ``compute_dtype``: activations and matmul
    inputs. Attention softmax, RMSNorm statistics, RoPE tables and log-probs are always float32.
    """

    param_dtype: str = "float32"
    compute_dtype: str = "float32"

    def __post_init__(self):
        for name in ("param_dtype", "compute_dtype"):
            value = getattr(self, name)
            _require(value in _DTYPES, f"dtype.{name}", value, f"one of {sorted(_DTYPES)}")

    @property
    def param(self):
        return _DTYPES[self.param_dtype]

    @property
    def compute(self):
        return _DTYPES[self.compute_dtype]


#: The projections a LoRA adapter may target, in canonical order, with their Hugging Face module names.
LORA_TARGETS: dict[str, str] = {
    "q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
    "gate": "gate_proj", "up": "up_proj", "down": "down_proj",
}


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter's hyper-parameters (static under jit; hashable): ``y = x W + (alpha / rank)
    * dropout(x) A B`` on each projection in ``targets`` (a subset of `LORA_TARGETS`' keys, kept in
    canonical order; a list is accepted). ``dropout`` is applied to the adapter's input only and
    only when a dropout key is given (training). The adapter's arrays live at ``params["lora"]``
    (`jaxagent.models.lora`)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = tuple(LORA_TARGETS)

    def __post_init__(self):
        _require(
            isinstance(self.rank, (int, np.integer)) and not isinstance(self.rank, bool) and self.rank > 0,
            "lora.rank", self.rank, "a positive integer",
        )
        _require(
            isinstance(self.alpha, (int, float, np.number)) and not isinstance(self.alpha, bool)
            and math.isfinite(self.alpha) and self.alpha > 0,
            "lora.alpha", self.alpha, "a finite number > 0",
        )
        _require(
            isinstance(self.dropout, (int, float, np.number)) and not isinstance(self.dropout, bool)
            and 0 <= self.dropout < 1,
            "lora.dropout", self.dropout, "a number in [0, 1)",
        )
        targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
        unknown = [t for t in targets if t not in LORA_TARGETS]
        _require(not unknown and len(targets) > 0, "lora.targets", list(targets),
                 f"a non-empty subset of {list(LORA_TARGETS)}")
        _require(len(set(targets)) == len(targets), "lora.targets", list(targets), "no repeated projection")
        object.__setattr__(self, "rank", int(self.rank))
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "dropout", float(self.dropout))
        object.__setattr__(self, "targets", tuple(t for t in LORA_TARGETS if t in targets))

    @property
    def scale(self) -> float:
        """``alpha / rank``, the factor on ``x A B`` (PEFT's ``scaling`` without rsLoRA)."""
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class QwenConfig:
    """Hyper-parameters of a Qwen2/2.5/3 dense decoder (static under jit; hashable).

    Shapes used in docstrings: D = hidden_size, N = num_attention_heads, K = num_key_value_heads,
    H = head_dim, F = intermediate_size, V = vocab_size, Ly = num_hidden_layers.
    """

    family: Literal["qwen2", "qwen3"] = "qwen2"
    vocab_size: int = 151936
    hidden_size: int = 1536
    intermediate_size: int = 8960
    num_hidden_layers: int = 28
    num_attention_heads: int = 12
    num_key_value_heads: int = 2
    head_dim: int = 128
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = True
    qkv_bias: bool = True  # Qwen2: always; Qwen3: attention_bias
    o_bias: bool = False  # Qwen3 with attention_bias
    qk_norm: bool = False  # Qwen3
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    dtype: DTypePolicy = DTypePolicy()
    remat: RematPolicy = "none"
    # The attention implementation when a call does not name one (`jaxagent.models.attention`):
    # "xla", "cudnn", "blockwise" or "auto". A compute choice, not part of the HF config.json.
    attn_impl: str = "xla"
    # A LoRA adapter at params["lora"] (None: none). Not part of the HF config.json (`to_hf_dict`).
    lora: LoraSpec | None = None

    def __post_init__(self):
        _require(self.family in ("qwen2", "qwen3"), "family", self.family, "'qwen2' or 'qwen3'")
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            _require(
                isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0,
                name,
                value,
                "a positive integer",
            )
        _require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_key_value_heads",
            self.num_key_value_heads,
            f"a divisor of num_attention_heads={self.num_attention_heads}",
        )
        _require(self.head_dim % 2 == 0, "head_dim", self.head_dim, "an even integer (RoPE)")
        _require(self.rope_theta > 0, "rope_theta", self.rope_theta, "a positive number")
        _require(self.rms_norm_eps > 0, "rms_norm_eps", self.rms_norm_eps, "a positive number")
        _require(self.remat in ("none", "full", "dots"), "remat", self.remat, "'none', 'full' or 'dots'")
        _require(self.attn_impl in ("xla", "cudnn", "blockwise", "splash", "auto"), "attn_impl", self.attn_impl,
                 "'xla', 'cudnn', 'blockwise', 'splash' or 'auto'")
        _require(self.lora is None or isinstance(self.lora, LoraSpec), "lora", self.lora, "a LoraSpec or None")
        rs = self.rope_scaling
        _require(
            rs.rope_type in ("default", "linear", "yarn"),
            "rope_scaling.rope_type",
            rs.rope_type,
            "'default', 'linear' or 'yarn'",
        )
        if rs.rope_type != "default":
            _require(rs.factor > 0, "rope_scaling.factor", rs.factor, "a positive number")

    # ------------------------------------------------------------------ derived
    @property
    def architecture(self) -> str:
        return {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.family]

    def replace(self, **changes) -> "QwenConfig":
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Number of parameters of the base model (tied embeddings counted once; a LoRA adapter's:
        `jaxagent.models.lora.num_lora_params`)."""
        D, N, K, H, F, V, Ly = (
            self.hidden_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.intermediate_size,
            self.vocab_size,
            self.num_hidden_layers,
        )
        per_layer = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F + 2 * D
        if self.qkv_bias:
            per_layer += N * H + 2 * K * H
        if self.o_bias:
            per_layer += D
        if self.qk_norm:
            per_layer += 2 * H
        total = V * D + Ly * per_layer + D
        if not self.tie_word_embeddings:
            total += D * V
        return total

    # ------------------------------------------------------------------ HF interop
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], **overrides) -> "QwenConfig":
        """Builds a config from the contents of a Hugging Face ``config.json``.

        Accepts both the legacy ``rope_theta``/``rope_scaling`` keys and transformers 5's
        ``rope_parameters``. Raises `ConfigError` for other architectures or unsupported features.
        """
        if not isinstance(hf, dict):
            raise ConfigError(f"config.json: expected a JSON object, got {type(hf).__name__}")
        archs = hf.get("architectures") or []
        model_type = hf.get("model_type")
        family = None
        for arch in archs:
            family = ARCHITECTURES.get(arch, family)
        if family is None and not archs and model_type in ("qwen2", "qwen3"):
            family = model_type
        if family is None:
            raise ConfigError(
                f"architectures={archs!r} (model_type={model_type!r}): expected one of "
                f"{sorted(ARCHITECTURES)} (dense Qwen2/2.5/3 causal LMs)"
            )
        if hf.get("use_sliding_window", False):
            raise ConfigError(
                "use_sliding_window=True: expected False; sliding-window attention is not "
                "supported (no released Qwen2/2.5/3 dense checkpoint enables it)"
            )
        layer_types = hf.get("layer_types") or []
        other = sorted({t for t in layer_types if t != "full_attention"})
        if other:
            raise ConfigError(f"layer_types contains {other}: expected only 'full_attention' layers")
        act = hf.get("hidden_act", "silu")
        _require(act == "silu", "hidden_act", act, "'silu'")

        def get(key, default=None, required=False):
            if key not in hf or hf[key] is None:
                if required:
                    raise ConfigError(f"config.json: missing required key {key!r}")
                return default
            return hf[key]

        hidden = get("hidden_size", required=True)
        heads = get("num_attention_heads", required=True)
        head_dim = get("head_dim")
        if head_dim is None:
            if family == "qwen3":
                head_dim = 128  # Qwen3Config's default
            else:
                _require(hidden % heads == 0, "hidden_size", hidden, f"a multiple of num_attention_heads={heads}")
                head_dim = hidden // heads
        rope_theta, rope_scaling = _parse_rope(hf, family)
        eos = get("eos_token_id")
        if isinstance(eos, list):
            eos = tuple(eos)
        attention_bias = bool(get("attention_bias", False))
        kwargs = dict(
            family=family,
            vocab_size=get("vocab_size", required=True),
            hidden_size=hidden,
            intermediate_size=get("intermediate_size", required=True),
            num_hidden_layers=get("num_hidden_layers", required=True),
            num_attention_heads=heads,
            num_key_value_heads=get("num_key_value_heads", heads),
            head_dim=head_dim,
            max_position_embeddings=get("max_position_embeddings", 32768),
            rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            qkv_bias=True if family == "qwen2" else attention_bias,
            o_bias=False if family == "qwen2" else attention_bias,
            qk_norm=family == "qwen3",
            initializer_range=float(get("initializer_range", 0.02)),
            bos_token_id=get("bos_token_id"),
            eos_token_id=eos,
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` contents that transformers loads as this architecture."""
        rs = self.rope_scaling
        if rs.rope_type == "default":
            rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        else:
            rope_parameters = {"rope_type": rs.rope_type, "rope_theta": self.rope_theta, "factor": rs.factor}
            if rs.rope_type == "yarn":
                rope_parameters.update(
                    original_max_position_embeddings=rs.original_max_position_embeddings
                    or self.max_position_embeddings,
                    beta_fast=rs.beta_fast,
                    beta_slow=rs.beta_slow,
                    truncate=rs.truncate,
                )
                for k in ("attention_factor", "mscale", "mscale_all_dim"):
                    if getattr(rs, k) is not None:
                        rope_parameters[k] = getattr(rs, k)
        out: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            # Both spellings: transformers >= 5 reads rope_parameters, 4.x reads rope_theta/rope_scaling.
            "rope_theta": self.rope_theta,
            "rope_parameters": rope_parameters,
            "rope_scaling": None if rs.rope_type == "default" else dict(rope_parameters, type=rs.rope_type),
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "use_sliding_window": False,
            "use_cache": True,
            "torch_dtype": self.dtype.param_dtype,
            "dtype": self.dtype.param_dtype,
        }
        if self.family == "qwen3":
            out["attention_bias"] = self.qkv_bias
        elif not self.qkv_bias or self.o_bias or self.qk_norm:
            raise ConfigError(
                "family='qwen2' with qkv_bias=False, o_bias=True or qk_norm=True has no "
                "Qwen2ForCausalLM equivalent: expected qkv_bias=True, o_bias=False, qk_norm=False"
            )
        if self.bos_token_id is not None:
            out["bos_token_id"] = self.bos_token_id
        if self.eos_token_id is not None:
            out["eos_token_id"] = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        return out


def _parse_rope(hf: dict[str, Any], family: str) -> tuple[float, RopeScaling]:
    params = hf.get("rope_parameters")
    legacy = hf.get("rope_scaling")
    theta = hf.get("rope_theta")
    if isinstance(params, dict) and params:
        if any(isinstance(v, dict) for v in params.values()):
            raise ConfigError(
                f"rope_parameters={params!r}: expected one global RoPE dict (per-layer RoPE is not used by Qwen2/3)"
            )
        source = dict(params)
    elif isinstance(legacy, dict) and legacy:
        source = dict(legacy)
    else:
        source = {}
    theta = source.get("rope_theta", theta)
    if theta is None:
        theta = 1_000_000.0 if family == "qwen3" else 10_000.0
    rope_type = source.get("rope_type", source.get("type", "default")) or "default"
    if rope_type not in ("default", "linear", "yarn"):
        raise ConfigError(f"rope_scaling.rope_type={rope_type!r}: expected 'default', 'linear' or 'yarn'")
    if rope_type == "default":
        return theta, RopeScaling()
    factor = source.get("factor")
    if factor is None and rope_type == "linear":
        raise ConfigError("rope_scaling.factor: missing; expected a positive number for rope_type='linear'")
    omax = source.get("original_max_position_embeddings", hf.get("original_max_position_embeddings"))
    if factor is None:  # yarn without a factor: transformers infers it from the two lengths
        if omax is None:
            raise ConfigError("rope_scaling.factor: missing and original_max_position_embeddings missing")
        factor = hf.get("max_position_embeddings", 32768) / omax

    def opt_float(key):
        v = source.get(key)
        return None if v is None else float(v)

    return theta, RopeScaling(
        rope_type=rope_type,
        factor=float(factor),
        original_max_position_embeddings=None if omax is None else int(omax),
        beta_fast=float(source.get("beta_fast") or 32.0),
        beta_slow=float(source.get("beta_slow") or 1.0),
        attention_factor=opt_float("attention_factor"),
        mscale=opt_float("mscale"),
        mscale_all_dim=opt_float("mscale_all_dim"),
        truncate=bool(source.get("truncate", True)),
    )


# ---------------------------------------------------------------------- presets
_PRESETS: dict[str, dict[str, Any]] = {
    # Architectures of public checkpoints (weights are not shipped; shapes only).
    "qwen2.5-0.5b": dict(
        family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
        max_position_embeddings=32768, rope_theta=1_000_000.0, eos_token_id=151643,
    ),
    "qwen2.5-1.5b": dict(
        family="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, head_dim=128, tie_word_embeddings=True,
        max_position_embeddings=32768, rope_theta=1_000_000.0, eos_token_id=151643,
    ),
    "qwen2.5-7b": dict(
        family="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, head_dim=128, tie_word_embeddings=False,
        max_position_embeddings=32768, rope_theta=1_000_000.0, eos_token_id=151643,
    ),
    "qwen3-0.6b": dict(
        family="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        max_position_embeddings=40960, rope_theta=1_000_000.0, qkv_bias=False, qk_norm=True, eos_token_id=151645,
    ),
    "qwen3-8b": dict(
        family="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
        max_position_embeddings=40960, rope_theta=1_000_000.0, qkv_bias=False, qk_norm=True, eos_token_id=151645,
    ),
    # Tiny shapes for tests, CPU benchmarks and the laptop demo.
    "tiny-qwen2": dict(
        family="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        max_position_embeddings=512, rope_theta=10_000.0,
    ),
    "tiny-qwen3": dict(
        family="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
        max_position_embeddings=512, rope_theta=1_000_000.0, qkv_bias=False, qk_norm=True,
    ),
    "small-qwen2": dict(
        family="qwen2", vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
        max_position_embeddings=4096, rope_theta=1_000_000.0,
    ),
}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def preset(name: str, **overrides) -> QwenConfig:
    """A named architecture (`preset_names()`), optionally with fields overridden."""
    if name not in _PRESETS:
        raise ConfigError(f"model preset {name!r}: expected one of {preset_names()}")
    return QwenConfig(**{**_PRESETS[name], **overrides})


def rope_inv_freq(config: QwenConfig) -> tuple[np.ndarray, float]:
    """Inverse RoPE frequencies [H/2] (float32) and the cos/sin attention factor.

    Matches transformers' ``default``, ``linear`` and ``yarn`` RoPE initialisers.
    """
    dim = config.head_dim
    base = config.rope_theta
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    inv_freq = (1.0 / pos_freqs).astype(np.float32)
    rs = config.rope_scaling
    if rs.rope_type == "default":
        return inv_freq, 1.0
    if rs.rope_type == "linear":
        return (inv_freq / np.float32(rs.factor)).astype(np.float32), 1.0
    # yarn
    factor = rs.factor
    omax = rs.original_max_position_embeddings or config.max_position_embeddings

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rs.attention_factor
    if attention_factor is None:
        if rs.mscale and rs.mscale_all_dim:
            attention_factor = float(get_mscale(factor, rs.mscale) / get_mscale(factor, rs.mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(num_rotations):
        return (dim * math.log(omax / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rs.beta_fast), correction_dim(rs.beta_slow)
    if rs.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    extrapolation_factor = (1 - ramp).astype(np.float32)
    inv_interp = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    inv = inv_interp * (1 - extrapolation_factor) + inv_freq * extrapolation_factor
    return inv.astype(np.float32), float(attention_factor)

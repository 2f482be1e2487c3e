"""Pure-functional Qwen2/2.5/3 decoder: parameters, forward pass and teacher-forced log-probs.

Parameters are a plain dict pytree with the decoder layers stacked on a leading axis (run by
`jax.lax.scan`); matrices are stored input-major (``x @ W``) with heads split out:

    embed        [V, D]            lm_head      [D, V]   (absent when embeddings are tied)
    final_norm   [D]
    layers/attn_norm [Ly, D]       layers/mlp_norm [Ly, D]
    layers/q     [Ly, D, N, H]     layers/q_bias [Ly, N, H]     (qkv_bias)
    layers/k     [Ly, D, K, H]     layers/k_bias [Ly, K, H]     (qkv_bias)
    layers/v     [Ly, D, K, H]     layers/v_bias [Ly, K, H]     (qkv_bias)
    layers/o     [Ly, N, H, D]     layers/o_bias [Ly, D]        (o_bias)
    layers/q_norm [Ly, H]          layers/k_norm [Ly, H]        (qk_norm, Qwen3)
    layers/gate  [Ly, D, F]        layers/up [Ly, D, F]         layers/down [Ly, F, D]
    lora/layers/<target>/a, b      a LoRA adapter (``config.lora``; `jaxagent.models.lora`)

Everything here is pure: no I/O, no global state, jit-able with ``config`` static.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxagent.models.attention import AttnImpl, attention
from jaxagent.models.config import QwenConfig, rope_inv_freq
from jaxagent.models.lora import init_lora, layer_dropout_keys, layer_inputs, lora_delta, lora_logical_axes, lora_shapes
from jaxagent.models.sharding import LogicalRules, constrain

Params = dict[str, Any]


# ---------------------------------------------------------------------------- parameters
def param_logical_axes(config: QwenConfig) -> Params:
    """Logical axis names for every parameter, a pytree with the structure of `init_params` (with
    ``config.lora``, the adapter's under ``"lora"``: `jaxagent.models.lora.lora_logical_axes`)."""
    axes = _base_logical_axes(config)
    if config.lora is not None:
        axes["lora"] = lora_logical_axes(config)
    return axes


def _base_logical_axes(config: QwenConfig) -> Params:
    layers = {
        "attn_norm": ("layers", "norm"),
        "mlp_norm": ("layers", "norm"),
        "q": ("layers", "embed", "q_heads", "head_dim"),
        "k": ("layers", "embed", "kv_heads", "head_dim"),
        "v": ("layers", "embed", "kv_heads", "head_dim"),
        "o": ("layers", "q_heads", "head_dim", "embed"),
        "gate": ("layers", "embed", "mlp"),
        "up": ("layers", "embed", "mlp"),
        "down": ("layers", "mlp", "embed"),
    }
    if config.qkv_bias:
        layers.update(
            q_bias=("layers", "q_heads", "head_dim"),
            k_bias=("layers", "kv_heads", "head_dim"),
            v_bias=("layers", "kv_heads", "head_dim"),
        )
    if config.o_bias:
        layers["o_bias"] = ("layers", "norm")
    if config.qk_norm:
        layers.update(q_norm=("layers", "head_dim"), k_norm=("layers", "head_dim"))
    axes: Params = {"embed": ("vocab", "embed"), "final_norm": ("norm",), "layers": layers}
    if not config.tie_word_embeddings:
        axes["lm_head"] = ("embed", "vocab")
    return axes


def param_shapes(config: QwenConfig) -> Params:
    """Shape of every parameter, a pytree with the structure of `init_params`."""
    shapes = _base_shapes(config)
    if config.lora is not None:
        shapes["lora"] = lora_shapes(config)
    return shapes


def _base_shapes(config: QwenConfig) -> Params:
    D, N, K, H, F, V, Ly = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.intermediate_size,
        config.vocab_size,
        config.num_hidden_layers,
    )
    sizes = {"layers": Ly, "embed": D, "norm": D, "q_heads": N, "kv_heads": K, "head_dim": H, "mlp": F, "vocab": V}
    return jax.tree.map(
        lambda axes: tuple(sizes[a] for a in axes),
        _base_logical_axes(config),
        is_leaf=lambda x: isinstance(x, tuple),
    )


def init_params(key: jax.Array, config: QwenConfig) -> Params:
    """Random parameters as transformers initialises them: matrices and embeddings
    ~ N(0, initializer_range), norms 1, biases 0; stored in ``config.dtype.param``. With
    ``config.lora``, also a fresh adapter (`jaxagent.models.lora.init_lora`, float32, B = 0) at
    ``"lora"``; the base is the same as without it."""
    shapes = _base_shapes(config)
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
        shapes, is_leaf=lambda x: isinstance(x, tuple))[0]]
    keys = jax.random.split(key, len(leaves))
    dtype = config.dtype.param
    out = []
    for path, shape, k in zip(paths, leaves, keys):
        if "norm" in path:
            out.append(jnp.ones(shape, dtype))
        elif "bias" in path:
            out.append(jnp.zeros(shape, dtype))
        else:
            out.append((config.initializer_range * jax.random.normal(k, shape, jnp.float32)).astype(dtype))
    params = jax.tree.unflatten(treedef, out)
    if config.lora is not None:
        params["lora"] = init_lora(jax.random.fold_in(key, 0x10A), config)
    return params


# ---------------------------------------------------------------------------- building blocks
def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis with float32 statistics, as transformers' Qwen2RMSNorm:
    ``weight * (x / rms(x)).astype(x.dtype)``. Returns the dtype of ``x``."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * y.astype(x.dtype)


def rope_tables(positions_BL: jax.Array, config: QwenConfig, dtype) -> tuple[jax.Array, jax.Array]:
    """cos, sin tables [B, L, H] for integer positions, computed in float32 (times the yarn
    attention factor) and cast to ``dtype``."""
    inv_freq, attn_factor = rope_inv_freq(config)
    freqs = positions_BL.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return (jnp.cos(emb) * attn_factor).astype(dtype), (jnp.sin(emb) * attn_factor).astype(dtype)


def apply_rope(x_BLnH: jax.Array, cos_BLH: jax.Array, sin_BLH: jax.Array) -> jax.Array:
    """Rotate-half RoPE (the Hugging Face layout) on [B, L, heads, H]."""
    half = x_BLnH.shape[-1] // 2
    rotated = jnp.concatenate([-x_BLnH[..., half:], x_BLnH[..., :half]], axis=-1)
    return x_BLnH * cos_BLH[:, :, None, :] + rotated * sin_BLH[:, :, None, :]


def _lora_add(y, x, lp: Params, target: str, config: QwenConfig, dropout_key):
    """``y`` plus the adapter's update of ``target`` on input ``x`` (``y`` when there is none)."""
    delta = lora_delta(x, lp, target, config=config, dropout_key=dropout_key)
    return y if delta is None else y + delta


def attention_inputs(
    x_BLD: jax.Array,
    lp: Params,
    cos_BLH: jax.Array,
    sin_BLH: jax.Array,
    *,
    config: QwenConfig,
    rules: LogicalRules | None = None,
    dropout_key: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer's pre-attention half: RMSNorm, q/k/v projections (+bias, + a LoRA update when
    ``lp["lora"]`` holds one, its dropout drawn from ``dropout_key``), q/k norm (Qwen3) and
    RoPE. Returns q [B, L, N, H], k and v [B, L, K, H] in the dtype of ``x``."""
    dt = x_BLD.dtype
    eps = config.rms_norm_eps
    h = rms_norm(x_BLD, lp["attn_norm"], eps)
    q = _lora_add(jnp.einsum("bld,dnh->blnh", h, lp["q"].astype(dt)), h, lp, "q", config, dropout_key)
    k = _lora_add(jnp.einsum("bld,dkh->blkh", h, lp["k"].astype(dt)), h, lp, "k", config, dropout_key)
    v = _lora_add(jnp.einsum("bld,dkh->blkh", h, lp["v"].astype(dt)), h, lp, "v", config, dropout_key)
    if config.qkv_bias:
        q = q + lp["q_bias"].astype(dt)
        k = k + lp["k_bias"].astype(dt)
        v = v + lp["v_bias"].astype(dt)
    if config.qk_norm:
        q = rms_norm(q, lp["q_norm"], eps)
        k = rms_norm(k, lp["k_norm"], eps)
    q = constrain(apply_rope(q, cos_BLH, sin_BLH), ("batch", "seq", "act_q_heads", None), rules)
    k = constrain(apply_rope(k, cos_BLH, sin_BLH), ("batch", "seq", "act_kv_heads", None), rules)
    v = constrain(v, ("batch", "seq", "act_kv_heads", None), rules)
    return q, k, v


def attention_output_and_mlp(
    x_BLD: jax.Array,
    attn_BLNH: jax.Array,
    lp: Params,
    *,
    config: QwenConfig,
    rules: LogicalRules | None = None,
    dropout_key: jax.Array | None = None,
) -> jax.Array:
    """One layer's post-attention half: output projection, residual, RMSNorm, SwiGLU MLP,
    residual (each projection with its LoRA update when ``lp["lora"]`` holds one). Returns the new
    residual stream [B, L, D]."""
    dt = x_BLD.dtype
    out = _lora_add(jnp.einsum("blnh,nhd->bld", attn_BLNH, lp["o"].astype(dt)), attn_BLNH, lp, "o", config,
                    dropout_key)
    if config.o_bias:
        out = out + lp["o_bias"].astype(dt)
    x_BLD = constrain(x_BLD + out, ("batch", "seq", "act_embed"), rules)
    h = rms_norm(x_BLD, lp["mlp_norm"], config.rms_norm_eps)
    g = _lora_add(jnp.einsum("bld,df->blf", h, lp["gate"].astype(dt)), h, lp, "gate", config, dropout_key)
    u = _lora_add(jnp.einsum("bld,df->blf", h, lp["up"].astype(dt)), h, lp, "up", config, dropout_key)
    hidden = constrain(jax.nn.silu(g) * u, ("batch", "seq", "act_mlp"), rules)
    down = _lora_add(jnp.einsum("blf,fd->bld", hidden, lp["down"].astype(dt)), hidden, lp, "down", config,
                     dropout_key)
    x_BLD = x_BLD + down
    return constrain(x_BLD, ("batch", "seq", "act_embed"), rules)


def _decoder_layer(
    x_BLD: jax.Array,
    lp: Params,
    cos_BLH: jax.Array,
    sin_BLH: jax.Array,
    segment_ids_BL: jax.Array | None,
    mask_BLS: jax.Array | None,
    dropout_key: jax.Array | None,
    *,
    config: QwenConfig,
    causal: bool,
    attn_impl: AttnImpl,
    rules: LogicalRules | None,
) -> jax.Array:
    q, k, v = attention_inputs(x_BLD, lp, cos_BLH, sin_BLH, config=config, rules=rules, dropout_key=dropout_key)
    a = attention(
        q,
        k,
        v,
        scale=config.head_dim**-0.5,
        causal=causal,
        segment_ids_BL=segment_ids_BL,
        mask_BLS=mask_BLS,
        impl=attn_impl,
    )
    return attention_output_and_mlp(x_BLD, a, lp, config=config, rules=rules, dropout_key=dropout_key)


def _check_inputs(tokens_BL, config: QwenConfig, positions_BL, segment_ids_BL, mask_BLS):
    if tokens_BL.ndim != 2:
        raise ValueError(f"tokens: shape {tuple(tokens_BL.shape)}, expected [batch, length]")
    if not jnp.issubdtype(tokens_BL.dtype, jnp.integer):
        raise ValueError(f"tokens: dtype {tokens_BL.dtype}, expected an integer dtype")
    B, L = tokens_BL.shape
    # Without positions a row's tokens sit at 0..L-1. With them (packed sequences: the shared-prefix
    # info gain packs a trajectory and its counterfactual suffixes, whose positions restart inside
    # it) the positions, not the length, are what the rotary embedding sees; they are data.
    if positions_BL is None and L > config.max_position_embeddings:
        raise ValueError(
            f"tokens: length {L} exceeds the model's max_position_embeddings="
            f"{config.max_position_embeddings} (pass positions_BL for a packed sequence whose positions stay below it)"
        )
    for name, arr, shape in (
        ("positions", positions_BL, (B, L)),
        ("segment_ids", segment_ids_BL, (B, L)),
        ("mask", mask_BLS, (B, L, L)),
    ):
        if arr is not None and tuple(arr.shape) != shape and not (
            name == "mask" and arr.ndim == 3 and arr.shape[0] == 1 and tuple(arr.shape[1:]) == (L, L)
        ):
            raise ValueError(f"{name}: shape {tuple(arr.shape)}, expected {shape} to match tokens {(B, L)}")


def embed_tokens(params: Params, tokens_BL: jax.Array, *, config: QwenConfig, rules: LogicalRules | None = None):
    """Token embeddings [B, L, D] in the compute dtype."""
    # Gather the (vocab x fsdp)-sharded table before the lookup, as FSDP does for every weight;
    # a gather from a sharded table would otherwise be replicated implicitly by the partitioner.
    table = constrain(params["embed"], (None, None), rules)
    x = jnp.take(table, tokens_BL, axis=0).astype(config.dtype.compute)
    return constrain(x, ("batch", "seq", "act_embed"), rules)


def hidden_states(
    params: Params,
    tokens_BL: jax.Array,
    *,
    config: QwenConfig,
    positions_BL: jax.Array | None = None,
    segment_ids_BL: jax.Array | None = None,
    mask_BLS: jax.Array | None = None,
    causal: bool = True,
    attn_impl: AttnImpl | None = None,
    rules: LogicalRules | None = None,
    dropout_key: jax.Array | None = None,
) -> jax.Array:
    """Final-norm hidden states [B, L, D] in the compute dtype.

    ``positions_BL`` default to 0..L-1 per row; see `jaxagent.models.attention` for the
    attention structure (``causal``, ``segment_ids_BL`` with 0 = padding, ``mask_BLS``) and its
    implementations (``attn_impl``; None: ``config.attn_impl``).
    With ``config.lora`` the adapter at ``params["lora"]`` is applied inside every layer;
    ``dropout_key`` (training) draws its dropout (None: no dropout, evaluation).
    """
    _check_inputs(tokens_BL, config, positions_BL, segment_ids_BL, mask_BLS)
    xs = layer_inputs(params, config)
    keys = layer_dropout_keys(dropout_key, config)
    B, L = tokens_BL.shape
    dt = config.dtype.compute
    if positions_BL is None:
        positions_BL = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
    x = embed_tokens(params, tokens_BL, config=config, rules=rules)
    cos, sin = rope_tables(positions_BL, config, dt)

    layer = functools.partial(
        _decoder_layer, config=config, causal=causal, attn_impl=config.attn_impl if attn_impl is None else attn_impl,
        rules=rules
    )
    if config.remat == "full":
        layer = jax.checkpoint(layer)
    elif config.remat == "dots":
        layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)

    def body(carry, lp_key):
        lp, key = lp_key
        return layer(carry, lp, cos, sin, segment_ids_BL, mask_BLS, key), None

    x, _ = jax.lax.scan(body, x, (xs, keys))
    return rms_norm(x, params["final_norm"], config.rms_norm_eps)


def unembed_matrix(params: Params, config: QwenConfig) -> jax.Array:
    """The output projection [D, V] (the transposed embedding when tied)."""
    return params["embed"].T if config.tie_word_embeddings else params["lm_head"]


def forward(
    params: Params,
    tokens_BL: jax.Array,
    *,
    config: QwenConfig,
    positions_BL: jax.Array | None = None,
    segment_ids_BL: jax.Array | None = None,
    mask_BLS: jax.Array | None = None,
    causal: bool = True,
    attn_impl: AttnImpl | None = None,
    rules: LogicalRules | None = None,
    dropout_key: jax.Array | None = None,
) -> jax.Array:
    """Logits [B, L, V] in the compute dtype (accumulated in float32).

    Materialises the full logits; for training and scoring use `token_logprobs`, which never holds
    float32 logits for the whole batch. Arguments as in `hidden_states`.
    """
    h = hidden_states(
        params,
        tokens_BL,
        config=config,
        positions_BL=positions_BL,
        segment_ids_BL=segment_ids_BL,
        mask_BLS=mask_BLS,
        causal=causal,
        attn_impl=attn_impl,
        rules=rules,
        dropout_key=dropout_key,
    )
    w = unembed_matrix(params, config).astype(h.dtype)
    logits = jnp.einsum("bld,dv->blv", h, w, preferred_element_type=jnp.float32).astype(h.dtype)
    return constrain(logits, ("batch", "seq", "act_vocab"), rules)


def logprobs_from_hidden(
    hidden_BLD: jax.Array,
    unembed_DV: jax.Array,
    targets_BL: jax.Array,
    *,
    chunk_size: int = 512,
    return_entropy: bool = False,
    temperature: float = 1.0,
    vocab_limit: int | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """log softmax(hidden @ unembed / temperature)[target] per position, [B, L] float32, computed
    over sequence chunks of ``chunk_size`` so that float32 logits exist for at most
    [B, chunk_size, V] at a time (also under `jax.grad`: each chunk is rematerialised).

    ``temperature`` (> 0, static) and ``vocab_limit`` (ids >= it get probability 0) give the
    distribution a sampler draws from at that temperature with that limit (`generate.sample`
    without top-k / top-p): the RL trainer scores its samples under the distribution that drew
    them. With ``return_entropy`` also returns the entropy of each position's distribution [B, L].
    """
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}: expected a number > 0 (a greedy sampler has no log-probs)")
    B, L, D = hidden_BLD.shape
    C = max(1, min(chunk_size, L))
    n = -(-L // C)
    pad = n * C - L
    h = jnp.pad(hidden_BLD, ((0, 0), (0, pad), (0, 0))).reshape(B, n, C, D).swapaxes(0, 1)
    t = jnp.pad(targets_BL, ((0, 0), (0, pad))).reshape(B, n, C).swapaxes(0, 1)
    w = unembed_DV.astype(hidden_BLD.dtype)

    @jax.checkpoint
    def chunk(args):
        h_BCD, t_BC = args
        logits = jnp.einsum("bcd,dv->bcv", h_BCD, w, preferred_element_type=jnp.float32)
        if temperature != 1.0:
            logits = logits / temperature
        allowed = None
        if vocab_limit is not None and vocab_limit < logits.shape[-1]:
            allowed = jnp.arange(logits.shape[-1]) < vocab_limit
            logits = jnp.where(allowed, logits, -jnp.inf)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, t_BC[..., None], axis=-1)[..., 0]
        logp = picked - lse
        if not return_entropy:
            return logp, jnp.zeros_like(logp)
        probs = jnp.exp(logits - lse[..., None])
        # excluded ids: probability 0, and a finite logit here (0 * -inf would be nan, in the
        # gradient too, which a where() around the product does not stop)
        finite_logits = logits if allowed is None else jnp.where(allowed, logits, 0.0)
        entropy = lse - jnp.sum(probs * finite_logits, axis=-1)
        return logp, entropy

    logp, ent = jax.lax.map(chunk, (h, t))
    logp = logp.swapaxes(0, 1).reshape(B, n * C)[:, :L]
    if not return_entropy:
        return logp
    return logp, ent.swapaxes(0, 1).reshape(B, n * C)[:, :L]


def next_token_targets(tokens_BL: jax.Array) -> jax.Array:
    """targets[:, t] = tokens[:, t + 1]; the last column is 0 (it has no next token)."""
    return jnp.concatenate([tokens_BL[:, 1:], jnp.zeros_like(tokens_BL[:, :1])], axis=1)


def map_row_chunks(fn, rows: int, x_B, **per_row):
    """``fn(x_B, **per_row)`` computed ``rows`` rows at a time in a `jax.lax.map`; the result is
    the same pytree of ``[B, ...]`` arrays. ``x_B`` is an array or a pytree of arrays with leading
    axis B; keyword arrays whose leading axis is B are split too, others (and None) are passed
    whole. Chunk k holds the rows k, k + n, k + 2n, ... (n chunks), so a batch axis sharded over
    devices stays sharded inside each chunk; B is padded with zero rows to a multiple of
    ``rows`` (their results are dropped)."""
    B = jax.tree.leaves(x_B)[0].shape[0]
    n = -(-B // rows)
    pad = n * rows - B
    split_keys = [k for k, v in per_row.items() if v is not None and v.ndim >= 1 and v.shape[0] == B]

    def split(x):
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) if pad else x
        return x.reshape(rows, n, *x.shape[1:]).swapaxes(0, 1)

    def merge(y):
        return y.swapaxes(0, 1).reshape(n * rows, *y.shape[2:])[:B]

    fixed = {k: v for k, v in per_row.items() if k not in split_keys}
    parts = (jax.tree.map(split, x_B), {k: split(per_row[k]) for k in split_keys})
    out = jax.lax.map(lambda a: fn(a[0], **a[1], **fixed), parts)
    return jax.tree.map(merge, out)


def token_logprobs(
    params: Params,
    tokens_BL: jax.Array,
    *,
    config: QwenConfig,
    targets_BL: jax.Array | None = None,
    positions_BL: jax.Array | None = None,
    segment_ids_BL: jax.Array | None = None,
    mask_BLS: jax.Array | None = None,
    causal: bool = True,
    attn_impl: AttnImpl | None = None,
    rules: LogicalRules | None = None,
    chunk_size: int = 512,
    return_entropy: bool = False,
    row_chunk: int | None = None,
    temperature: float = 1.0,
    vocab_limit: int | None = None,
    dropout_key: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Teacher-forced log-probs [B, L] float32: entry t is log pi(targets[t] | what query t sees).
    ``temperature`` and ``vocab_limit``: the policy as a sampler at that temperature with that
    limit draws from it (`logprobs_from_hidden`; defaults: the raw policy).

    ``targets_BL`` defaults to the next token (`next_token_targets`), whose last column is a
    dummy 0 that callers mask. Packed layouts pass explicit targets. Float32 logits are only ever
    held for one chunk of ``chunk_size`` positions (see `logprobs_from_hidden`).

    ``row_chunk``: run the rows ``row_chunk`` at a time (`map_row_chunks`), so the attention's
    float32 scores exist for that many rows only. Per-row results are the same computation (equal
    up to float32 rounding); on a CPU, where attention over long rows is memory-bound, scoring 8
    rows at a time instead of 40 was 1.8x faster (docs/BENCHMARKS.md, RL step).

    ``dropout_key``: the LoRA adapter's dropout (`hidden_states`); with ``row_chunk`` each chunk
    draws from its own key (``fold_in(dropout_key, the chunk's first row)``).
    """
    if row_chunk is not None and 0 < row_chunk < tokens_BL.shape[0]:
        one = functools.partial(_token_logprobs_chunk, params, config=config, causal=causal, attn_impl=attn_impl,
                                rules=rules, chunk_size=chunk_size, return_entropy=return_entropy,
                                temperature=temperature, vocab_limit=vocab_limit, chunk_dropout_key=dropout_key)
        row_ids = None if dropout_key is None else jnp.arange(tokens_BL.shape[0], dtype=jnp.int32)
        return map_row_chunks(one, row_chunk, tokens_BL, targets_BL=targets_BL, positions_BL=positions_BL,
                              segment_ids_BL=segment_ids_BL, mask_BLS=mask_BLS, row_ids=row_ids)
    h = hidden_states(
        params,
        tokens_BL,
        config=config,
        positions_BL=positions_BL,
        segment_ids_BL=segment_ids_BL,
        mask_BLS=mask_BLS,
        causal=causal,
        attn_impl=attn_impl,
        rules=rules,
        dropout_key=dropout_key,
    )
    if targets_BL is None:
        targets_BL = next_token_targets(tokens_BL)
    elif tuple(targets_BL.shape) != tuple(tokens_BL.shape):
        raise ValueError(f"targets: shape {tuple(targets_BL.shape)}, expected {tuple(tokens_BL.shape)}")
    return logprobs_from_hidden(
        h, unembed_matrix(params, config), targets_BL, chunk_size=chunk_size, return_entropy=return_entropy,
        temperature=temperature, vocab_limit=vocab_limit,
    )


def _token_logprobs_chunk(params, tokens_BL, *, chunk_dropout_key=None, row_ids=None, **kwargs):
    """`token_logprobs` of one row chunk; its dropout key is ``fold_in(chunk_dropout_key, first row id)``."""
    key = None if chunk_dropout_key is None else jax.random.fold_in(chunk_dropout_key, row_ids[0])
    return token_logprobs(params, tokens_BL, dropout_key=key, **kwargs)

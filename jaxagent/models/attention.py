"""Attention: the "which keys may each query see" structure and four implementations (plain
XLA, cuDNN's fused kernel, `jaxagent.models.blockwise`: memory linear in L, and on a TPU the Pallas
splash kernel, `jaxagent.models.splash`).

Shapes: B batch, L query length, S key length, N query heads, K key/value heads (GQA: N % K == 0),
G = N // K, H head dim.

The structure is the AND of three optional parts:

* ``causal`` (static bool): query i sees key j only if j <= i (token order, not position ids);
* ``segment_ids_BL`` (int32): query and key must share a segment id, and id 0 marks padding keys,
  which no query sees. Packed sequences get ids 1, 2, ...; a padded batch gets 1 on real tokens;
* ``mask_BLS`` (bool): an arbitrary extra structure, e.g. counterfactual suffixes packed after a
  trajectory that see only the shared prefix before the replaced observation.

A query that sees no key (padding) yields an average over all keys instead of NaN: its output is
finite and meaningless, and callers mask it out of losses.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from jaxagent.models.blockwise import attention_blockwise
from jaxagent.models.splash import attention_splash, splash_applies

AttnImpl = Literal["xla", "cudnn", "blockwise", "splash", "auto"]
IMPLS = ("xla", "cudnn", "blockwise", "splash", "auto")
_NEG = -1e30  # finite, so fully-masked rows stay finite
# The XLA path's causal key skipping: query blocks of at least this size, at most this many
# blocks (each block is a separately shaped matmul, unrolled in the compiled program).
XLA_CAUSAL_MIN_BLOCK = 64
XLA_CAUSAL_MAX_BLOCKS = 16


def attention_structure(
    q_len: int,
    kv_len: int | None = None,
    *,
    batch: int | None = None,
    segment_ids_BL: jax.Array | None = None,
    kv_segment_ids_BS: jax.Array | None = None,
    mask_BLS: jax.Array | None = None,
    causal: bool = True,
) -> jax.Array | None:
    """Boolean ``allowed_BLS`` (True = query may attend to key), or None for "see everything".

    ``kv_segment_ids_BS`` defaults to ``segment_ids_BL`` (self-attention). With ``causal`` and
    S > L, the queries are taken to be the last L positions of the S keys (a cache extension).
    """
    kv_len = q_len if kv_len is None else kv_len
    allowed = None
    if causal:
        q_idx = jnp.arange(q_len)[:, None] + (kv_len - q_len)
        k_idx = jnp.arange(kv_len)[None, :]
        allowed = (k_idx <= q_idx)[None]
    if segment_ids_BL is not None:
        kv_seg = segment_ids_BL if kv_segment_ids_BS is None else kv_segment_ids_BS
        seg = (segment_ids_BL[:, :, None] == kv_seg[:, None, :]) & (kv_seg[:, None, :] > 0)
        allowed = seg if allowed is None else allowed & seg
    if mask_BLS is not None:
        m = mask_BLS.astype(bool)
        allowed = m if allowed is None else allowed & m
    if allowed is not None and batch is not None and allowed.shape[0] != batch:
        allowed = jnp.broadcast_to(allowed, (batch,) + allowed.shape[1:])
    return allowed


def attention_xla(
    q_BLNH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    allowed_BLS: jax.Array | None,
    *,
    scale: float,
) -> jax.Array:
    """Reference attention in plain XLA ops. Scores and softmax in float32; output [B, L, N, H]
    in the dtype of ``q``. Works on every backend; memory O(B N L S).

    Heads are moved in front once ([B, K, G*L, H] queries against [B, K, S, H] keys) so both
    matmuls are plain batched GEMMs and the float32 scores are never transposed.
    """
    B, L, N, H = q_BLNH.shape
    S, K = k_BSKH.shape[1], k_BSKH.shape[2]
    G = N // K
    q = q_BLNH.reshape(B, L, K, G, H).transpose(0, 2, 3, 1, 4).reshape(B, K, G * L, H)
    k = k_BSKH.transpose(0, 2, 1, 3)  # [B, K, S, H]
    v = v_BSKH.transpose(0, 2, 1, 3)
    scores = jnp.einsum("bkqh,bksh->bkqs", q, k, preferred_element_type=jnp.float32) * scale
    if allowed_BLS is not None:
        scores = scores.reshape(B, K, G, L, S)
        scores = jnp.where(allowed_BLS[:, None, None, :, :], scores, _NEG).reshape(B, K, G * L, S)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkqs,bksh->bkqh", probs, v)  # [B, K, G*L, H]
    return out.reshape(B, K, G, L, H).transpose(0, 3, 1, 2, 4).reshape(B, L, N, H)


def attention_xla_causal_blocks(
    q_BLNH: jax.Array,
    k_BLKH: jax.Array,
    v_BLKH: jax.Array,
    allowed_BLL: jax.Array,
    *,
    scale: float,
    block: int,
) -> jax.Array:
    """`attention_xla` for causal self-attention, skipping the key blocks above the diagonal:
    query block i attends only to keys [0, (i + 1) * block). Same result, about half the work
    for long sequences. ``allowed_BLL`` must already include the causal structure."""
    L = q_BLNH.shape[1]
    outs = []
    for start in range(0, L, block):
        end = min(start + block, L)
        outs.append(
            attention_xla(
                q_BLNH[:, start:end], k_BLKH[:, :end], v_BLKH[:, :end], allowed_BLL[:, start:end, :end], scale=scale
            )
        )
    return jnp.concatenate(outs, axis=1)


def resolve_impl(impl: AttnImpl, dtype) -> Literal["xla", "cudnn", "blockwise", "splash"]:
    """``auto`` picks cudnn on a GPU for 16-bit compute, blockwise on a CPU (less memory and
    faster than XLA from 1k tokens up, docs/BENCHMARKS.md), splash on a TPU (where its structure
    applies, else XLA: see `attention`), else XLA."""
    if impl not in IMPLS:
        raise ValueError(f"attn_impl={impl!r}: expected one of {', '.join(map(repr, IMPLS))}")
    if impl != "auto":
        return impl
    backend = jax.default_backend()
    if backend == "cpu":
        return "blockwise"
    if backend == "tpu":
        return "splash"
    is_16bit = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return "cudnn" if backend == "gpu" and is_16bit else "xla"


def attention(
    q_BLNH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    *,
    scale: float,
    causal: bool = True,
    segment_ids_BL: jax.Array | None = None,
    mask_BLS: jax.Array | None = None,
    impl: AttnImpl = "xla",
) -> jax.Array:
    """Multi-head GQA attention over the structure described in the module docstring.

    ``impl="cudnn"`` calls `jax.nn.dot_product_attention` with the fused cuDNN kernel (GPU,
    fp16/bf16 only): a pure causal structure uses its built-in causal mask, anything else passes
    the boolean structure as ``mask``. ``impl="blockwise"`` walks [512, 512] query x key blocks
    with an online softmax and a recomputing backward (`attention_blockwise`): no L x S scores,
    any backend. ``impl="splash"`` runs the Pallas splash kernel (`attention_splash`; Pallas's
    interpreter off a TPU) where it applies (self-attention, no ``mask_BLS``, L a multiple of
    128) and the blockwise path elsewhere (``auto`` on a TPU: XLA elsewhere, as before).
    Returns [B, L, N, H] in the dtype of ``q``.
    """
    B, L = q_BLNH.shape[:2]
    S = k_BSKH.shape[1]
    requested, impl = impl, resolve_impl(impl, q_BLNH.dtype)
    if impl == "splash":
        if splash_applies(L, S, mask_BLS):
            return attention_splash(q_BLNH, k_BSKH, v_BSKH, scale=scale, causal=causal, segment_ids_BL=segment_ids_BL)
        impl = "blockwise" if requested == "splash" else "xla"
    if impl == "blockwise":
        return attention_blockwise(
            q_BLNH, k_BSKH, v_BSKH, scale=scale, causal=causal, segment_ids_BL=segment_ids_BL, mask_BLS=mask_BLS
        )
    if impl == "cudnn":
        if segment_ids_BL is None and mask_BLS is None and L == S:
            return jax.nn.dot_product_attention(
                q_BLNH, k_BSKH, v_BSKH, is_causal=causal, scale=scale, implementation="cudnn"
            )
        allowed = attention_structure(
            L, S, batch=B, segment_ids_BL=segment_ids_BL, mask_BLS=mask_BLS, causal=causal
        )
        return jax.nn.dot_product_attention(
            q_BLNH, k_BSKH, v_BSKH, mask=allowed[:, None], scale=scale, implementation="cudnn"
        )
    allowed = attention_structure(L, S, segment_ids_BL=segment_ids_BL, mask_BLS=mask_BLS, causal=causal)
    if causal and L == S and L > XLA_CAUSAL_MIN_BLOCK:
        block = max(XLA_CAUSAL_MIN_BLOCK, -(-L // XLA_CAUSAL_MAX_BLOCKS))
        return attention_xla_causal_blocks(q_BLNH, k_BSKH, v_BSKH, allowed, scale=scale, block=block)
    return attention_xla(q_BLNH, k_BSKH, v_BSKH, allowed, scale=scale)

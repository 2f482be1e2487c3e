"""TPU attention through the Pallas splash-attention kernel
(``jax.experimental.pallas.ops.tpu.splash_attention``): block-sparse, memory linear in L, its own
backward kernels.

It serves the structures it can express: self-attention (L == S), causal or not, with segment
ids, L a multiple of 128. An arbitrary ``mask_BLS`` (the info-gain layout) or a cache extension
(S > L) goes to `jaxagent.models.blockwise` instead (`splash_applies` decides). Off a TPU the
kernel runs in Pallas's interpreter (slow: for the parity tests only).

GQA: the kernel's MQA form serves each key/value head with its G query heads, vmapped over the
batch and the K key/value heads. Segment ids are passed as they are on both sides: a real token
sees its own segment only, and a padding query (id 0) sees padding keys (at least itself when
causal), so no row is empty (the kernel requires that); those rows are meaningless, as in
`jaxagent.models.attention`, and callers mask them out.

Shapes: B batch, L length, N query heads, K key/value heads, G = N // K, H head dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

SPLASH_BLOCKS = (512, 256, 128)  # the largest that divides L is used for every kernel block


@functools.cache
def _modules():
    """The kernel and mask modules (imported on first use: ~0.2 s that a run without splash
    need not pay), or None when this jax build lacks them."""
    try:
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    except ImportError:  # pragma: no cover - every jax this project supports has them
        return None
    return sk, sm


def splash_available() -> bool:
    return _modules() is not None


def splash_applies(q_len: int, kv_len: int, mask_BLS) -> bool:
    """Whether `attention_splash` can serve this structure (see the module docstring)."""
    return splash_available() and q_len == kv_len and mask_BLS is None and q_len % SPLASH_BLOCKS[-1] == 0


@functools.lru_cache(maxsize=64)
def _kernel(L: int, G: int, causal: bool, interpret: bool):
    _sk, _sm = _modules()
    block = next(b for b in SPLASH_BLOCKS if L % b == 0)
    sizes = _sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                           block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    one = _sm.CausalMask((L, L)) if causal else _sm.FullMask((L, L))
    # Concrete mask tables even when first built inside a trace: the kernel is cached across traces.
    with jax.ensure_compile_time_eval():
        return _sk.make_splash_mqa_single_device(_sm.MultiHeadMask([one] * G), block_sizes=sizes, interpret=interpret)


def attention_splash(
    q_BLNH: jax.Array,
    k_BLKH: jax.Array,
    v_BLKH: jax.Array,
    *,
    scale: float,
    causal: bool = True,
    segment_ids_BL: jax.Array | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """GQA self-attention [B, L, N, H] x [B, L, K, H] -> [B, L, N, H] (dtype of ``q``) with the
    splash kernel. ``interpret`` None: Pallas's interpreter off a TPU."""
    B, L, N, H = q_BLNH.shape
    K = k_BLKH.shape[2]
    G = N // K
    if not splash_applies(L, k_BLKH.shape[1], None):
        raise ValueError(f"attention_splash: q length {L}, kv length {k_BLKH.shape[1]}; expected equal lengths, "
                         f"a multiple of {SPLASH_BLOCKS[-1]}")
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    kernel = _kernel(L, G, causal, interpret)
    q = (q_BLNH * jnp.asarray(scale, q_BLNH.dtype)).reshape(B, L, K, G, H).transpose(0, 2, 3, 1, 4)  # [B,K,G,L,H]
    k = k_BLKH.transpose(0, 2, 1, 3)  # [B, K, L, H]
    v = v_BLKH.transpose(0, 2, 1, 3)
    if segment_ids_BL is None:
        out = jax.vmap(jax.vmap(kernel))(q, k, v)
    else:
        seg = segment_ids_BL.astype(jnp.int32)
        segment_ids = _modules()[0].SegmentIds

        def one_example(q_KGLH, k_KLH, v_KLH, seg_L):
            ids = segment_ids(q=seg_L, kv=seg_L)
            return jax.vmap(lambda a, b, c: kernel(a, b, c, segment_ids=ids))(q_KGLH, k_KLH, v_KLH)

        out = jax.vmap(one_example)(q, k, v, seg)
    return out.transpose(0, 3, 1, 2, 4).reshape(B, L, N, H).astype(q_BLNH.dtype)

"""Blockwise attention with an online softmax: memory linear in the sequence length.

Shapes as in `jaxagent.models.attention`: B batch, L query length, S key length, N query heads,
K key/value heads (G = N // K), H head dim; blocks of ``bq`` queries and ``bk`` keys.

The forward walks query blocks (``lax.map``) and, inside each, key blocks (a ``fori_loop``),
keeping per query a running max ``m``, a running sum ``l`` and an unnormalised output; the
float32 scores of one [bq, bk] block per head are all it holds at a time. Under ``causal`` a query
block stops at the last key block its last query may see, so about half of the blocks of a long
self-attention are never computed. The backward is written out (`jax.custom_vjp`): it keeps the
output and the per-query log-sum-exp from the forward and recomputes each block's probabilities,
walking key blocks (accumulating their dK, dV) and, inside, the query blocks that see them
(accumulating dQ): the FlashAttention-2 recurrence, nothing of size L x S stored.

The structure (which keys a query may see) is the same AND as `attention_structure`: causal token
order with queries the last L of S keys, segment ids (id 0 = a padding key), an arbitrary boolean
mask. A query that sees no key gets an average over the keys of the blocks it visits (finite,
meaningless, as in the XLA path; callers mask it out of losses); its gradients to Q and K are zero.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

_NEG = -1e30  # a masked score: finite, so a query that sees nothing stays finite
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512


class _Spec(NamedTuple):
    """Static layout of one call (hashable: a ``nondiff_argnums`` of the custom VJP)."""

    scale: float
    causal: bool
    L: int  # queries before padding
    S: int  # keys before padding
    bq: int
    bk: int


def _ceil_div(a, b):
    return -((-a) // b)


def _block_allowed(spec: _Spec, i, j, offset, seg_q, seg_k, mask):
    """Boolean [B or 1, bq, bk]: which keys of key block ``j`` the queries of block ``i`` see
    (keys past S excluded separately). ``offset`` [B]: query t of row b is key ``offset[b] + t``
    (causal); ``seg_q`` [B, Lp], ``seg_k`` [B, Sp], ``mask`` [B or 1, Lp, Sp] or None."""
    q_pos = i * spec.bq + jnp.arange(spec.bq)
    k_pos = j * spec.bk + jnp.arange(spec.bk)
    allowed = jnp.ones((1, spec.bq, spec.bk), bool)
    if spec.causal:
        allowed = allowed & (k_pos[None, None, :] <= q_pos[None, :, None] + offset[:, None, None])
    if seg_q is not None:
        sq = jax.lax.dynamic_slice_in_dim(seg_q, i * spec.bq, spec.bq, axis=1)
        sk = jax.lax.dynamic_slice_in_dim(seg_k, j * spec.bk, spec.bk, axis=1)
        allowed = allowed & (sq[:, :, None] == sk[:, None, :]) & (sk[:, None, :] > 0)
    if mask is not None:
        m = jax.lax.dynamic_slice_in_dim(mask, i * spec.bq, spec.bq, axis=1)
        allowed = allowed & jax.lax.dynamic_slice_in_dim(m, j * spec.bk, spec.bk, axis=2)
    return allowed


def _scores(spec: _Spec, q_i, k_j, i, j, offset, seg_q, seg_k, mask):
    """Masked float32 scores [B, K, G, bq, bk] and the structure [B or 1, 1, 1, bq, bk]: a masked
    key scores ``_NEG``, a key past S scores -inf (it never counts, not even for a query that sees
    nothing)."""
    s = jnp.einsum("bkgqh,bksh->bkgqs", q_i, k_j, preferred_element_type=jnp.float32) * spec.scale
    allowed = _block_allowed(spec, i, j, offset, seg_q, seg_k, mask)[:, None, None]
    s = jnp.where(allowed, s, _NEG)
    k_real = (j * spec.bk + jnp.arange(spec.bk)) < spec.S
    return jnp.where(k_real, s, -jnp.inf), allowed


def _kv_blocks(spec: _Spec, i, offset):
    """Key blocks query block ``i`` visits: all, or under ``causal`` up to the last one its last
    query may see in any row."""
    nk = _ceil_div(spec.S, spec.bk)
    if not spec.causal:
        return nk
    return jnp.clip(_ceil_div((i + 1) * spec.bq + jnp.max(offset), spec.bk), 1, nk)


def _first_q_block(spec: _Spec, j, offset):
    """The first query block that visits key block ``j`` (inverse of `_kv_blocks`)."""
    if not spec.causal:
        return 0
    return jnp.maximum(0, _ceil_div(j * spec.bk - jnp.max(offset) - spec.bq + 1, spec.bq))


def _forward(spec: _Spec, q, k, v, offset, seg_q, seg_k, mask):
    """q [B, K, G, Lp, H], k/v [B, K, Sp, H] -> out [B, K, G, Lp, H] (q's dtype), lse [B, K, G, Lp]
    (float32)."""
    B, K, G, Lp, H = q.shape

    def one_query_block(i):
        q_i = jax.lax.dynamic_slice_in_dim(q, i * spec.bq, spec.bq, axis=3)

        def body(j, carry):
            m, l, acc = carry
            k_j = jax.lax.dynamic_slice_in_dim(k, j * spec.bk, spec.bk, axis=2)
            v_j = jax.lax.dynamic_slice_in_dim(v, j * spec.bk, spec.bk, axis=2)
            s, _ = _scores(spec, q_i, k_j, i, j, offset, seg_q, seg_k, mask)
            m_new = jnp.maximum(m, s.max(axis=-1))
            p = jnp.exp(s - m_new[..., None])
            corr = jnp.exp(m - m_new)
            l = l * corr + p.sum(axis=-1)
            pv = jnp.einsum("bkgqs,bksh->bkgqh", p.astype(v.dtype), v_j, preferred_element_type=jnp.float32)
            return m_new, l, acc * corr[..., None] + pv

        init = (jnp.full((B, K, G, spec.bq), -jnp.inf, jnp.float32), jnp.zeros((B, K, G, spec.bq), jnp.float32),
                jnp.zeros((B, K, G, spec.bq, H), jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, _kv_blocks(spec, i, offset), body, init)
        return (acc / l[..., None]).astype(q.dtype), m + jnp.log(l)

    out, lse = jax.lax.map(one_query_block, jnp.arange(Lp // spec.bq))  # [nq, B, K, G, bq, (H)]
    out = jnp.moveaxis(out, 0, 3).reshape(B, K, G, Lp, H)
    lse = jnp.moveaxis(lse, 0, 3).reshape(B, K, G, Lp)
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blockwise(spec: _Spec, q, k, v, offset, seg_q, seg_k, mask):
    return _forward(spec, q, k, v, offset, seg_q, seg_k, mask)[0]


def _blockwise_fwd(spec, q, k, v, offset, seg_q, seg_k, mask):
    out, lse = _forward(spec, q, k, v, offset, seg_q, seg_k, mask)
    return out, (q, k, v, offset, seg_q, seg_k, mask, out, lse)


def _blockwise_bwd(spec, residuals, d_out):
    q, k, v, offset, seg_q, seg_k, mask, out, lse = residuals
    B, K, G, Lp, H = q.shape
    Sp = k.shape[2]
    nq = Lp // spec.bq
    d_out = d_out.astype(jnp.float32)
    delta = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)  # [B, K, G, Lp]

    def one_key_block(dq, j):
        k_j = jax.lax.dynamic_slice_in_dim(k, j * spec.bk, spec.bk, axis=2)
        v_j = jax.lax.dynamic_slice_in_dim(v, j * spec.bk, spec.bk, axis=2)

        def body(i, carry):
            dq, dk_j, dv_j = carry
            sl = functools.partial(jax.lax.dynamic_slice_in_dim, start_index=i * spec.bq, slice_size=spec.bq, axis=3)
            q_i, do_i, lse_i, delta_i = sl(q), sl(d_out), sl(lse), sl(delta)
            s, allowed = _scores(spec, q_i, k_j, i, j, offset, seg_q, seg_k, mask)
            p = jnp.exp(s - lse_i[..., None])  # the forward's probabilities, recomputed
            dv_j = dv_j + jnp.einsum("bkgqs,bkgqh->bksh", p, do_i)
            dp = jnp.einsum("bkgqh,bksh->bkgqs", do_i, v_j.astype(jnp.float32))
            ds = jnp.where(allowed, p * (dp - delta_i[..., None]), 0.0) * spec.scale
            dq_i = sl(dq) + jnp.einsum("bkgqs,bksh->bkgqh", ds, k_j.astype(jnp.float32))
            dq = jax.lax.dynamic_update_slice_in_dim(dq, dq_i, i * spec.bq, axis=3)
            dk_j = dk_j + jnp.einsum("bkgqs,bkgqh->bksh", ds, q_i.astype(jnp.float32))
            return dq, dk_j, dv_j

        zeros = jnp.zeros((B, K, spec.bk, H), jnp.float32)
        dq, dk_j, dv_j = jax.lax.fori_loop(_first_q_block(spec, j, offset), nq, body, (dq, zeros, zeros))
        return dq, (dk_j, dv_j)

    dq, (dk, dv) = jax.lax.scan(one_key_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(Sp // spec.bk))
    dk = jnp.moveaxis(dk, 0, 2).reshape(B, K, Sp, H)  # [nk, B, K, bk, H] -> [B, K, Sp, H]
    dv = jnp.moveaxis(dv, 0, 2).reshape(B, K, Sp, H)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def attention_blockwise(
    q_BLNH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    *,
    scale: float,
    causal: bool = True,
    segment_ids_BL: jax.Array | None = None,
    kv_segment_ids_BS: jax.Array | None = None,
    mask_BLS: jax.Array | None = None,
    query_offset_B: jax.Array | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> jax.Array:
    """GQA attention [B, L, N, H] over the structure of `attention_structure`, computed block by
    block: memory O(B N (L + S) H) plus one [bq, bk] float32 score block per head, never L x S.
    Equal to `attention_xla` up to float32 rounding for every query that sees at least one key;
    differentiable (a written-out backward that recomputes the blocks). ``mask_BLS`` may have a
    leading 1 (one structure for the batch). ``query_offset_B`` (int [B], causal only): query t of
    row b is key ``query_offset_B[b] + t`` (a cache extension whose rows hold different lengths; the
    default S - L for every row). Blocks are balanced: the fewest blocks of at most
    ``block_q`` x ``block_k`` that cover L x S, of equal size up to the padding of the last.
    """
    B, L, N, H = q_BLNH.shape
    S, K = k_BSKH.shape[1], k_BSKH.shape[2]
    if N % K:
        raise ValueError(f"attention_blockwise: {N} query heads are not a multiple of {K} key/value heads")
    if block_q < 1 or block_k < 1:
        raise ValueError(f"attention_blockwise: block_q={block_q}, block_k={block_k}: expected >= 1")
    if causal and S < L and query_offset_B is None:
        raise ValueError(f"attention_blockwise: causal with {L} queries over {S} < {L} keys")
    G = N // K
    # balanced blocks of at most block_q / block_k: L = 600 is two blocks of 300, not 512 + 88 padded to 1024
    bq, bk = _ceil_div(L, _ceil_div(L, block_q)), _ceil_div(S, _ceil_div(S, block_k))
    Lp, Sp = _ceil_div(L, bq) * bq, _ceil_div(S, bk) * bk
    q = q_BLNH.reshape(B, L, K, G, H).transpose(0, 2, 3, 1, 4)  # [B, K, G, L, H]
    q = jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, Lp - L), (0, 0)))
    k = jnp.pad(k_BSKH.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, Sp - S), (0, 0)))  # [B, K, Sp, H]
    v = jnp.pad(v_BSKH.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, Sp - S), (0, 0)))
    seg_q = seg_k = None
    if segment_ids_BL is not None:
        kv = segment_ids_BL if kv_segment_ids_BS is None else kv_segment_ids_BS
        seg_q = jnp.pad(segment_ids_BL.astype(jnp.int32), ((0, 0), (0, Lp - L)))
        seg_k = jnp.pad(kv.astype(jnp.int32), ((0, 0), (0, Sp - S)))  # 0: padding, seen by no query
    mask = None
    if mask_BLS is not None:
        mask = jnp.pad(mask_BLS.astype(bool), ((0, 0), (0, Lp - L), (0, Sp - S)))
    spec = _Spec(scale=float(scale), causal=bool(causal), L=L, S=S, bq=bq, bk=bk)
    offset = jnp.full((B,), S - L, jnp.int32) if query_offset_B is None else query_offset_B.astype(jnp.int32)
    out = _blockwise(spec, q, k, v, offset, seg_q, seg_k, mask)  # [B, K, G, Lp, H]
    return out[:, :, :, :L].transpose(0, 3, 1, 2, 4).reshape(B, L, N, H)

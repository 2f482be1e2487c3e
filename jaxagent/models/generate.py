"""Generation over a preallocated KV cache: prefill / extend, sampling, and a fused decode loop.

The cache holds, per layer, the keys and values of every position written so far:

    KVCache.k, KVCache.v   [Ly, B, S, K, H]  compute dtype (S = cache capacity)
    KVCache.lengths        [B] int32         valid positions per row (row b uses [0, lengths[b]))

Position ids are cache indices: a conversation starts at position 0 in slot 0 and each row
grows independently, so rows of different lengths share one batch without padding gaps.

All functions here are pure. The jitted entry points (`jit_extend`, `jit_generate`) donate the
cache, and every write is a scatter into the scanned-over cache carry, so the cache is updated
in place: no step copies it. Writes that would land outside the cache are dropped, never
clamped onto valid entries; host-side checks (`check_fits`, `SamplingParams.validate`) turn
bad input into clear errors before anything is traced.

Shapes: B batch, T new tokens per row in one extend, S cache capacity, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models.attention import attention_xla, resolve_impl
from jaxagent.models.blockwise import attention_blockwise
from jaxagent.models.config import QwenConfig
from jaxagent.models.lora import layer_inputs
from jaxagent.models.qwen import (
    Params,
    attention_inputs,
    attention_output_and_mlp,
    embed_tokens,
    rms_norm,
    rope_tables,
    unembed_matrix,
)
from jaxagent.models.sharding import LogicalRules, constrain

CACHE_AXES = ("layers", "batch", None, "act_kv_heads", None)


class KVCache(NamedTuple):
    k: jax.Array  # [Ly, B, S, K, H]
    v: jax.Array  # [Ly, B, S, K, H]
    lengths: jax.Array  # [B] int32

    @property
    def capacity(self) -> int:
        return self.k.shape[2]


def init_cache(config: QwenConfig, batch: int, capacity: int) -> KVCache:
    """An empty cache for ``batch`` rows of up to ``capacity`` positions (compute dtype)."""
    if capacity < 1 or capacity > config.max_position_embeddings:
        raise ValueError(
            f"cache capacity={capacity}: expected 1..max_position_embeddings={config.max_position_embeddings}"
        )
    shape = (config.num_hidden_layers, batch, capacity, config.num_key_value_heads, config.head_dim)
    dt = config.dtype.compute
    return KVCache(jnp.zeros(shape, dt), jnp.zeros(shape, dt), jnp.zeros((batch,), jnp.int32))


def cache_shardings(rules: LogicalRules, config: QwenConfig, batch: int, capacity: int) -> KVCache:
    """NamedShardings for a cache (layers replicated, batch over data x fsdp, KV heads over tensor)."""
    shape = (config.num_hidden_layers, batch, capacity, config.num_key_value_heads, config.head_dim)
    kv = rules.sharding(CACHE_AXES, shape)
    return KVCache(kv, kv, rules.sharding(("batch",), (batch,)))


def check_fits(cache_lengths, n_new, capacity: int) -> None:
    """Host-side check that ``lengths + n_new`` fits in the cache, naming the first row that
    does not (a prompt longer than the cache)."""
    total = np.asarray(cache_lengths) + np.asarray(n_new)
    over = np.nonzero(total > capacity)[0]
    if over.size:
        b = int(over[0])
        raise ValueError(
            f"row {b}: {int(np.asarray(cache_lengths)[b])} cached + {int(np.asarray(n_new)[b])} new tokens = "
            f"{int(total[b])} exceeds the cache capacity {capacity}"
        )


# ---------------------------------------------------------------------------- extend (prefill)
def extend(
    params: Params,
    cache: KVCache,
    tokens_BT: jax.Array,
    n_new_B: jax.Array,
    *,
    config: QwenConfig,
    rules: LogicalRules | None = None,
    scan_unroll: int = 1,
    window: int | None = None,
    layers: Sequence[Params] | None = None,
) -> tuple[jax.Array, KVCache]:
    """Appends ``tokens_BT[b, :n_new_B[b]]`` to row b of the cache (a prefill when the cache is
    empty) and returns the logits of each row's last new token [B, V] (float32) and the cache.

    New token t of row b sits at position ``lengths[b] + t`` and attends to every cached position
    of its row up to itself. Rows with ``n_new == 0`` are left unchanged (their logits are
    meaningless). Padding columns (t >= n_new) are never written. New tokens beyond the cache
    capacity are dropped and not counted in ``lengths`` (a jitted function cannot raise: call
    `check_fits` on the host first).

    With ``config.attn_impl`` blockwise (``auto`` on a CPU) a prefill (T > 1) attends block by
    block (`attention_blockwise`), so a long prompt needs no [T, window] scores per head; a
    one-token step uses the plain XLA attention either way.

    ``window`` (static, <= capacity) limits attention to the first ``window`` cache positions,
    so a step costs what the rows hold rather than what the cache could hold. The caller
    guarantees ``lengths[b] + n_new[b] <= window`` for every row whose logits it uses.

    With ``config.lora`` the adapter at ``params["lora"]`` is applied in every layer (no dropout:
    decoding is evaluation); `jaxagent.models.lora.merge_lora` first makes each step cheaper.

    ``layers`` (`split_layers` of ``params``, made outside the decode loop) runs the layers as an
    unrolled Python loop over separate per-layer weights instead of a `jax.lax.scan` over the
    stacked ones: inside a scan XLA copies each layer's weight slices out of the stacked arrays
    on every call (on a CPU, a decode step's largest cost after the matmuls themselves). Same
    computation, equal up to float32 rounding.
    """
    B, T = tokens_BT.shape
    S = cache.capacity
    W = S if window is None else window
    if not 1 <= W <= S:
        raise ValueError(f"window={window}: expected 1..cache capacity {S}")
    dt = config.dtype.compute
    start_B = cache.lengths
    # Tokens that do not fit are not written and not counted (hosts check with `check_fits`
    # first; `generate` ends a row as truncated before its cache is full).
    n_new_B = jnp.clip(n_new_B.astype(jnp.int32), 0, S - start_B)
    t_idx = jnp.arange(T, dtype=jnp.int32)
    pos_BT = start_B[:, None] + t_idx[None, :]
    valid_BT = t_idx[None, :] < n_new_B[:, None]
    write_BT = jnp.where(valid_BT, pos_BT, S)  # S is out of bounds: the write is dropped
    b_idx = jnp.arange(B)[:, None]
    blockwise = T > 1 and resolve_impl(config.attn_impl, dt) == "blockwise"
    # the XLA path's structure; the blockwise one builds it per block from the rows' offsets
    allowed_BTW = None if blockwise else jnp.arange(W, dtype=jnp.int32)[None, None, :] <= pos_BT[:, :, None]

    x = embed_tokens(params, tokens_BT, config=config, rules=rules)
    cos, sin = rope_tables(pos_BT, config, dt)

    def body(carry, lp_and_layer):
        x, k_all, v_all = carry
        lp, layer = lp_and_layer
        q, k, v = attention_inputs(x, lp, cos, sin, config=config, rules=rules)
        k_all = k_all.at[layer, b_idx, write_BT].set(k.astype(k_all.dtype), mode="drop")
        v_all = v_all.at[layer, b_idx, write_BT].set(v.astype(v_all.dtype), mode="drop")
        k_l, v_l = k_all[layer], v_all[layer]
        if W < S:
            k_l, v_l = k_l[:, :W], v_l[:, :W]
        if blockwise:  # a long prefill: no [T, W] float32 scores per head
            a = attention_blockwise(q, k_l, v_l, scale=config.head_dim**-0.5, causal=True, query_offset_B=start_B)
        else:
            a = attention_xla(q, k_l, v_l, allowed_BTW, scale=config.head_dim**-0.5)
        x = attention_output_and_mlp(x, a, lp, config=config, rules=rules)
        return (x, k_all, v_all), None

    if layers is None:
        layer_ids = jnp.arange(config.num_hidden_layers, dtype=jnp.int32)
        (x, k_all, v_all), _ = jax.lax.scan(
            body, (x, cache.k, cache.v), (layer_inputs(params, config), layer_ids), unroll=scan_unroll
        )
    else:
        if len(layers) != config.num_hidden_layers:
            raise ValueError(f"layers: {len(layers)} given, expected num_hidden_layers={config.num_hidden_layers}")
        carry = (x, cache.k, cache.v)
        for layer, lp in enumerate(layers):  # static layer index: the cache slices are static too
            carry, _ = body(carry, (lp, layer))
        x, k_all, v_all = carry
    last = jnp.clip(n_new_B - 1, 0, T - 1)
    h_last = jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]  # [B, D]
    h_last = rms_norm(h_last, params["final_norm"], config.rms_norm_eps)
    w = unembed_matrix(params, config).astype(h_last.dtype)
    logits = jnp.einsum("bd,dv->bv", h_last, w, preferred_element_type=jnp.float32)
    logits = constrain(logits, ("batch", "act_vocab"), rules)
    new_cache = KVCache(
        constrain(k_all, CACHE_AXES, rules), constrain(v_all, CACHE_AXES, rules), start_B + n_new_B.astype(jnp.int32)
    )
    return logits, new_cache


def split_layers(params: Params, config: QwenConfig) -> list[Params]:
    """The per-layer weights (and LoRA adapter) of ``params`` as a list of ``num_hidden_layers``
    pytrees, for `extend`'s ``layers``. Inside a jitted function, made once before a decode loop,
    this is one copy of the layer weights; XLA keeps each slice as its own buffer, so the loop's
    matmuls read them in place."""
    xs = layer_inputs(params, config)
    return [jax.tree.map(lambda a, i=i: a[i], xs) for i in range(config.num_hidden_layers)]


# ---------------------------------------------------------------------------- sampling
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-call sampling settings (each may also be given per row as a [B] array to `sample`).

    ``temperature`` 0 means greedy. ``top_k`` 0 and ``top_p`` 1 disable those filters.
    ``stop_tokens``: ids that end a sequence (the stop token is kept in the output).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop_tokens: tuple[int, ...] = ()

    def validate(self, vocab_size: int) -> SamplingParams:
        if not self.temperature >= 0:
            raise ValueError(f"temperature={self.temperature!r}: expected >= 0 (0 = greedy)")
        if not (isinstance(self.top_k, int) and 0 <= self.top_k <= vocab_size):
            raise ValueError(f"top_k={self.top_k!r}: expected an integer in [0, vocab_size={vocab_size}] (0 = off)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r}: expected 0 < top_p <= 1")
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}: expected a positive integer")
        check_stop_tokens(self.stop_tokens, vocab_size)
        return self


def check_stop_tokens(stop_tokens, vocab_size: int) -> None:
    """Every stop token id must be a token of the vocabulary (padding entries are -1)."""
    arr = np.asarray(stop_tokens, dtype=np.int64).reshape(-1)
    bad = arr[(arr != -1) & ((arr < 0) | (arr >= vocab_size))]
    if bad.size:
        raise ValueError(f"stop token {int(bad[0])}: outside the vocabulary [0, {vocab_size})")


def filter_logits(logits_BV: jax.Array, temperature_B, top_k_B, top_p_B) -> jax.Array:
    """Temperature-scaled logits with top-k then top-p (nucleus) filtering applied as -inf.

    top-p keeps the smallest set of most likely tokens whose probability reaches ``top_p``
    (ties at the threshold are kept). Greedy rows (temperature 0) are returned unscaled. Each row
    is filtered by its own settings only: a row with top_k=0 and top_p=1 is never changed.
    """
    V = logits_BV.shape[-1]
    t = jnp.where(temperature_B > 0, temperature_B, 1.0)[:, None]
    scaled = logits_BV / t
    needs_sort = jnp.any((top_k_B > 0) & (top_k_B < V)) | jnp.any(top_p_B < 1.0)

    def filtered(scaled):
        sorted_desc = -jnp.sort(-scaled, axis=-1)
        k = jnp.where((top_k_B > 0) & (top_k_B < V), top_k_B, V)
        kth = jnp.take_along_axis(sorted_desc, (k - 1)[:, None], axis=-1)
        sorted_k = jnp.where(jnp.arange(V)[None, :] < k[:, None], sorted_desc, -jnp.inf)
        probs = jax.nn.softmax(sorted_k, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each sorted token
        in_p = (before < top_p_B[:, None]) | (top_p_B[:, None] >= 1.0)  # top_p=1: no filter, exactly
        keep_sorted = in_p & (jnp.arange(V)[None, :] < k[:, None])
        n_keep = jnp.maximum(jnp.sum(keep_sorted, axis=-1), 1)
        pth = jnp.take_along_axis(sorted_desc, (n_keep - 1)[:, None], axis=-1)
        threshold = jnp.maximum(kth, pth)
        return jnp.where(scaled >= threshold, scaled, -jnp.inf)

    return jax.lax.cond(needs_sort, filtered, lambda s: s, scaled)


def sample(
    logits_BV: jax.Array,
    keys_B: jax.Array,
    temperature_B: jax.Array,
    top_k_B: jax.Array,
    top_p_B: jax.Array,
    *,
    vocab_limit: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draws one token per row (never an id >= ``vocab_limit`` when given). Returns (token [B] int32, log-prob under the sampling
    distribution [B], log-prob under the raw policy softmax(logits) [B]), both float32.

    Greedy rows take the argmax; their sampling log-prob is 0 (a point mass). Other rows draw
    from the filtered distribution with `draw_categorical` (two uniforms per row). When every row
    is greedy, no random numbers are drawn and no filter runs (a `jax.lax.cond`).
    """
    return jax.lax.cond(
        jnp.all(jnp.asarray(temperature_B) <= 0),
        lambda: _sample_greedy(logits_BV, vocab_limit=vocab_limit),
        lambda: _sample_any(logits_BV, keys_B, temperature_B, top_k_B, top_p_B, vocab_limit=vocab_limit),
    )


def sample_folded(logits_BV: jax.Array, keys_B: jax.Array, fold_B: jax.Array, temperature_B: jax.Array,
                  top_k_B: jax.Array, top_p_B: jax.Array, *, vocab_limit: int | None = None
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`sample` with row b's key ``fold_in(keys_B[b], fold_B[b])`` (a decode loop's step keys).
    When every row is greedy the keys are not derived either (one `jax.lax.cond` for both), which
    is what `sample`'s own skip cannot save: the per-row key derivation comes before it."""
    def any_row(logits):
        keys = jax.vmap(jax.random.fold_in)(keys_B, fold_B)
        return _sample_any(logits, keys, temperature_B, top_k_B, top_p_B, vocab_limit=vocab_limit)

    return jax.lax.cond(jnp.all(jnp.asarray(temperature_B) <= 0),
                        functools.partial(_sample_greedy, vocab_limit=vocab_limit), any_row, logits_BV)


def _allowed_logits(logits_BV: jax.Array, vocab_limit: int | None) -> tuple[jax.Array, jax.Array]:
    """(float32 logits, the same with ids >= ``vocab_limit`` at -inf)."""
    logits_BV = logits_BV.astype(jnp.float32)
    allowed = logits_BV
    if vocab_limit is not None and vocab_limit < logits_BV.shape[-1]:
        allowed = jnp.where(jnp.arange(logits_BV.shape[-1]) < vocab_limit, logits_BV, -jnp.inf)
    return logits_BV, allowed


def _policy_logp(logits_BV: jax.Array, token_B: jax.Array) -> jax.Array:
    """log softmax(logits_BV)[b, token_B[b]] [B], without writing the [B, V] log-softmax."""
    picked = jnp.take_along_axis(logits_BV, token_B[:, None], axis=-1)[:, 0]
    return picked - jax.nn.logsumexp(logits_BV, axis=-1)


def argmax_first(x_BV: jax.Array) -> jax.Array:
    """`jnp.argmax` over the last axis [B] int32: the first index of the maximum, or of the first
    NaN when a row has one. Computed as a max, then a min over the indices that hold it: two plain
    reductions, where XLA's CPU argmax (a variadic reduce over value-index pairs) costs ~4x as much
    at a 152k vocabulary (`scripts/bench_sampling.py`)."""
    V = x_BV.shape[-1]
    m = jnp.max(x_BV, axis=-1, keepdims=True)
    hit = (x_BV == m) | jnp.isnan(x_BV)
    return jnp.min(jnp.where(hit, jnp.arange(V, dtype=jnp.int32), V - 1), axis=-1)


def _first_above(c_BN: jax.Array, x_B: jax.Array, positive_BN: jax.Array) -> jax.Array:
    """The first n with ``c_BN[b, n] > x_B[b]`` for a non-decreasing ``c_BN`` (an inclusive cumsum
    of non-negative masses, ``positive_BN`` where a mass is > 0) [B] int32. When float rounding
    leaves no such n, the last n with a positive mass. The n found always has a positive mass:
    ``c[n] > x >= c[n - 1]`` (or ``>= 0``) means ``c`` grew at n."""
    N = c_BN.shape[-1]
    n = jnp.sum(c_BN <= x_B[:, None], axis=-1, dtype=jnp.int32)
    last = jnp.max(jnp.where(positive_BN, jnp.arange(N, dtype=jnp.int32), 0), axis=-1)
    return jnp.minimum(n, last)


DRAW_BLOCK = 256


def draw_categorical(keys_B: jax.Array, logits_BV: jax.Array, *, block: int = DRAW_BLOCK
                     ) -> tuple[jax.Array, jax.Array]:
    """One draw per row from softmax(``logits_BV[b]``) (float32; -inf ids are never drawn) with
    row b's key. Returns (token [B] int32, logsumexp of the row [B] float32).

    Two-level inverse CDF: the ids are cut into blocks of ``block``; a block is chosen with
    probability its mass (the first uniform against the cumulative block masses), then an id
    within it with probability its mass within the block (the second uniform). The product is the
    id's probability, so the draw has the softmax's distribution, as `jax.random.categorical`'s
    Gumbel-max has, up to float32 rounding; but it takes two random numbers per row where
    Gumbel-max takes V, and two short cumulative sums where a flat inverse CDF would scan V. On a
    CPU at a 152k vocabulary this is ~20x faster than `jax.random.categorical`
    (`scripts/bench_sampling.py`); a row's draw depends on its key and logits only.
    """
    B, V = logits_BV.shape
    nb = -(-V // block)
    m = jnp.max(logits_BV, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(logits_BV - m)  # 0 for -inf ids
    e = jnp.pad(e, ((0, 0), (0, nb * block - V))).reshape(B, nb, block)
    mass = jnp.sum(e, axis=-1)  # [B, nb]
    cmass = jnp.cumsum(mass, axis=-1)
    u = jax.vmap(lambda k: jax.random.uniform(k, (2,)))(keys_B)  # [B, 2] in [0, 1)
    j = _first_above(cmass, u[:, 0] * cmass[:, -1], mass > 0)
    inner = jnp.take_along_axis(e, j[:, None, None], axis=1)[:, 0]  # [B, block]
    cinner = jnp.cumsum(inner, axis=-1)
    i = _first_above(cinner, u[:, 1] * cinner[:, -1], inner > 0)
    token = jnp.minimum(j * block + i, V - 1)
    return token, m[:, 0] + jnp.log(cmass[:, -1])


def _sample_greedy(logits_BV, *, vocab_limit=None):
    """`sample` when every row is greedy (same results, nothing drawn)."""
    logits_BV, allowed = _allowed_logits(logits_BV, vocab_limit)
    token = argmax_first(allowed)
    return token, jnp.zeros(token.shape, jnp.float32), _policy_logp(logits_BV, token)


def _sample_any(logits_BV, keys_B, temperature_B, top_k_B, top_p_B, *, vocab_limit=None):
    logits_BV, allowed = _allowed_logits(logits_BV, vocab_limit)
    filt = filter_logits(allowed, temperature_B, top_k_B, top_p_B)
    drawn, logz = draw_categorical(keys_B, filt)
    is_greedy = temperature_B <= 0
    token = jnp.where(is_greedy, argmax_first(allowed), drawn)
    logp_sample = jnp.take_along_axis(filt, token[:, None], axis=-1)[:, 0] - logz
    logp_sample = jnp.where(is_greedy, 0.0, logp_sample)
    return token, logp_sample, _policy_logp(logits_BV, token)


# ---------------------------------------------------------------------------- decode loop
class GenerateOutput(NamedTuple):
    tokens: jax.Array  # [B, N] int32 generated tokens (pad_id after the end)
    logp_sample: jax.Array  # [B, N] float32 log-prob under the sampling distribution (0 after the end)
    logp_policy: jax.Array  # [B, N] float32 log-prob under the raw policy (0 after the end)
    num_tokens: jax.Array  # [B] int32 tokens generated, the stop token included
    stopped: jax.Array  # [B] bool: ended on a stop token
    truncated: jax.Array  # [B] bool: ended because the cache was full (else: a stop or max new tokens)
    cache: KVCache  # holds the prompt and every generated token except the last one


def _per_row(x, B, dtype):
    return jnp.broadcast_to(jnp.asarray(x, dtype), (B,))


def generate(
    params: Params,
    cache: KVCache,
    logits_BV: jax.Array,
    keys_B: jax.Array,
    *,
    config: QwenConfig,
    max_new_tokens: int,
    max_new_B: jax.Array | None = None,
    temperature_B=1.0,
    top_k_B=0,
    top_p_B=1.0,
    stop_tokens_BS: jax.Array | None = None,
    pad_id: int = 0,
    vocab_limit: int | None = None,
    rules: LogicalRules | None = None,
    scan_unroll: int = 1,
    unroll_layers: bool | None = None,
) -> GenerateOutput:
    """Samples up to ``max_new_tokens`` tokens per row after a prefill/extend that returned
    ``logits_BV``, inside one `jax.lax.while_loop` (stops early once every row is done).

    Row b stops after a token in ``stop_tokens_BS[b]`` (-1 = padding), after ``max_new_B[b]``
    tokens (default ``max_new_tokens``), or, marked ``truncated``, when its next token would not
    fit in the cache. Every row must have real logits (a non-empty prompt). Sampling of row b uses ``fold_in(keys_B[b], step)``, so a
    row's tokens do not depend on the other rows of the batch. Each sampled token except the
    last is written to the cache (the last is never needed to score what came before it).
    ``vocab_limit`` (static) forbids sampling ids >= it: real Qwen tokenizers have fewer tokens
    than the embedding has rows. The policy log-prob stays the full softmax, as teacher forcing.

    ``unroll_layers`` (static; None: on a CPU backend) splits the layer weights once before the
    loop (`split_layers`, one copy of them for the duration of the call) and runs each step's
    layers unrolled over them, instead of a layer scan that slices (copies) every layer's weights
    on every step. Same results up to float32 rounding; greedy tokens agree.
    """
    B = logits_BV.shape[0]
    N = max_new_tokens
    max_new_B = _per_row(N if max_new_B is None else max_new_B, B, jnp.int32)
    max_new_B = jnp.minimum(max_new_B, N)
    temperature_B = _per_row(temperature_B, B, jnp.float32)
    top_k_B = _per_row(top_k_B, B, jnp.int32)
    top_p_B = _per_row(top_p_B, B, jnp.float32)
    if stop_tokens_BS is None:
        stop_tokens_BS = jnp.full((B, 1), -1, jnp.int32)

    tokens = jnp.full((B, N), pad_id, jnp.int32)
    zeros = jnp.zeros((B, N), jnp.float32)

    S = cache.capacity
    if unroll_layers is None:
        unroll_layers = jax.default_backend() == "cpu"
    layers = split_layers(params, config) if unroll_layers else None

    def draw(logits, step):
        return sample_folded(logits, keys_B, jnp.full((B,), step, jnp.int32), temperature_B, top_k_B, top_p_B,
                             vocab_limit=vocab_limit)

    def cond(state):
        step, _, _, _, _, done, _, _, _ = state
        return (step < N) & ~jnp.all(done)

    def body(state):
        step, logits, tokens, lps, lpp, done, count, cache, truncated = state
        tok, lp_s, lp_p = draw(logits, step)
        active = ~done
        tokens = tokens.at[:, step].set(jnp.where(active, tok, pad_id))
        lps = lps.at[:, step].set(jnp.where(active, lp_s, 0.0))
        lpp = lpp.at[:, step].set(jnp.where(active, lp_p, 0.0))
        count = count + active.astype(jnp.int32)
        hit_stop = jnp.any(tok[:, None] == stop_tokens_BS, axis=-1)
        ended = active & (hit_stop | (count >= max_new_B))
        # A row that would continue but whose cache is full ends as truncated.
        full = active & ~ended & (cache.lengths >= S)
        done = done | ended | full
        truncated = truncated | full
        # Feed the token to the model only for rows that continue.
        logits, cache = extend(
            params, cache, tok[:, None], (~done).astype(jnp.int32), config=config, rules=rules, scan_unroll=scan_unroll,
            layers=layers,
        )
        return step + 1, logits, tokens, lps, lpp, done, count, cache, truncated

    done0 = max_new_B <= 0
    no = jnp.zeros((B,), bool)
    state = (jnp.int32(0), logits_BV, tokens, zeros, zeros, done0, jnp.zeros((B,), jnp.int32), cache, no)
    _, _, tokens, lps, lpp, _, count, cache, truncated = jax.lax.while_loop(cond, body, state)
    last = jnp.take_along_axis(tokens, jnp.clip(count - 1, 0, N - 1)[:, None], axis=1)[:, 0]
    stopped = (count > 0) & jnp.any(last[:, None] == stop_tokens_BS, axis=-1)
    return GenerateOutput(tokens, lps, lpp, count, stopped, truncated, cache)


# ---------------------------------------------------------------------------- jitted entry points
@functools.lru_cache(maxsize=64)
def jit_extend(config: QwenConfig, rules: LogicalRules | None = None, scan_unroll: int = 1):
    """``extend`` jitted for a config, with the cache donated (updated in place)."""
    return jax.jit(
        functools.partial(extend, config=config, rules=rules, scan_unroll=scan_unroll), donate_argnums=(1,)
    )


@functools.lru_cache(maxsize=64)
def jit_generate(config: QwenConfig, max_new_tokens: int, rules: LogicalRules | None = None, pad_id: int = 0,
                 scan_unroll: int = 1, vocab_limit: int | None = None, unroll_layers: bool | None = None):
    """``generate`` jitted for a config and a static max_new_tokens, with the cache donated."""
    fn = functools.partial(
        generate, config=config, max_new_tokens=max_new_tokens, rules=rules, pad_id=pad_id, scan_unroll=scan_unroll,
        vocab_limit=vocab_limit, unroll_layers=unroll_layers,
    )
    return jax.jit(fn, donate_argnums=(1,))


def row_keys(key: jax.Array, batch: int) -> jax.Array:
    """Per-row keys ``fold_in(key, row)``: row b's samples do not depend on the batch size."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(batch))


def pad_prompts(prompts: list[list[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads token lists into ([B, T] int32, lengths [B] int32) for `extend`."""
    if not prompts:
        raise ValueError("prompts: expected at least one prompt")
    T = max(1, max(len(p) for p in prompts))
    out = np.full((len(prompts), T), pad_id, np.int32)
    for i, p in enumerate(prompts):
        out[i, : len(p)] = p
    return out, np.asarray([len(p) for p in prompts], np.int32)


def generate_from_prompts(
    params: Params,
    prompts: list[list[int]],
    *,
    config: QwenConfig,
    sampling: SamplingParams,
    key: jax.Array,
    capacity: int | None = None,
    pad_id: int = 0,
    rules: LogicalRules | None = None,
) -> tuple[GenerateOutput, np.ndarray]:
    """Host convenience: validates input, prefills ``prompts`` into a fresh cache and samples.

    Returns the output and the prompt lengths. Raises ValueError for a stop token outside the
    vocabulary, an empty prompt, a token id outside the vocabulary, or a prompt that with
    ``max_new_tokens`` does not fit in the cache (default capacity: just enough). Row b samples
    with ``fold_in(key, b)``.
    """
    sampling.validate(config.vocab_size)
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompts[{i}]: empty; expected at least one token")
        bad = [t for t in prompt if not 0 <= int(t) < config.vocab_size]
        if bad:
            raise ValueError(f"prompts[{i}]: token id {bad[0]} outside the vocabulary [0, {config.vocab_size})")
    tokens, lengths = pad_prompts(prompts, pad_id)
    B = len(prompts)
    # The last sampled token is never written: a prompt of P tokens needs P + max_new - 1 slots.
    needed = lengths + sampling.max_new_tokens - 1
    capacity = capacity or int(needed.max())
    over = np.nonzero(needed > capacity)[0]
    if over.size:
        i = int(over[0])
        raise ValueError(
            f"prompts[{i}]: {int(lengths[i])} tokens + max_new_tokens={sampling.max_new_tokens} need "
            f"{int(needed[i])} cache slots, more than the capacity {capacity}"
        )
    cache = init_cache(config, B, capacity)
    if rules is not None:
        cache = jax.device_put(cache, cache_shardings(rules, config, B, capacity))
    logits, cache = jit_extend(config, rules)(params, cache, jnp.asarray(tokens), jnp.asarray(lengths))
    stop = np.full((B, max(1, len(sampling.stop_tokens))), -1, np.int32)
    stop[:, : len(sampling.stop_tokens)] = sampling.stop_tokens
    out = jit_generate(config, sampling.max_new_tokens, rules, pad_id)(
        params,
        cache,
        logits,
        row_keys(key, B),
        temperature_B=jnp.full((B,), sampling.temperature, jnp.float32),
        top_k_B=jnp.full((B,), sampling.top_k, jnp.int32),
        top_p_B=jnp.full((B,), sampling.top_p, jnp.float32),
        stop_tokens_BS=jnp.asarray(stop),
    )
    return out, lengths

"""InfoPO turn-level information gain, for every turn of every trajectory in one call.

For a valid turn t (feedback o_t non-empty, actions t and t+1 exist) of trajectory b:

    r_info(t) = (1/|a_{t+1}|) * sum_k [ log pi(y_k | h_t, o_t, y_<k) - log pi(y_k | h_t, PH, y_<k) ]

y = a_{t+1}'s tokens, teacher-forced. The counterfactual history is the trajectory up to o_t, then
the placeholder PH instead of o_t's content, then the trajectory's own tokens from the end of o_t
through a_{t+1} (the chat-template tokens between them are kept). Placeholder modes:

- ``replace`` (the paper): PH replaces o_t, so later positions shift by |PH| - |o_t|;
- ``overwrite`` (the reference code): PH is written over o_t at o_t's length, padded by repeating
  its last token or truncated; positions do not move.

Three modes with identical results (tested to 1e-5 in float32):

- ``naive`` (host code, `jaxagent.train.infogain.infogain_naive`): builds each turn's factual and
  counterfactual histories on the host and runs two teacher-forced forwards per turn, in
  mini-batches (what the InfoPO reference code does);
- ``vmapped``: gathers all counterfactual histories [B*T, L + |PH|] on the device and scores them
  in one teacher-forcing call; the factual term comes from the trajectory's own pass;
- ``shared_prefix``: the counterfactual shares the trajectory's tokens before o_t, so each turn's
  suffix [PH + template + a_{t+1}] is packed after the trajectory (right after its last real
  token, so a short row's padding holds suffixes rather than nothing), attends to the prefix before
  o_t with the positions it would have, and to itself causally; one pass of about the
  trajectory's length gives every counterfactual *and* the factual log-probs (the old log-probs
  of the PPO update) at once.

Shapes: B trajectories, L tokens, T turns, P placeholder tokens, Lp packed length.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct

from jaxagent.credit.batch import CreditBatch, infogain_valid_turns
from jaxagent.models.config import QwenConfig
from jaxagent.models.qwen import Params, map_row_chunks, token_logprobs
from jaxagent.models.sharding import LogicalRules

PlaceholderMode = Literal["replace", "overwrite"]
Mode = Literal["naive", "vmapped", "shared_prefix"]


@struct.dataclass
class InfoGainOutput:
    r_info_BT: jax.Array  # float32, 0 where invalid
    valid_BT: jax.Array  # bool
    factual_sum_BT: jax.Array  # sum of log pi(a_{t+1} | factual history)
    counterfactual_sum_BT: jax.Array  # sum of log pi(a_{t+1} | counterfactual history)
    action_len_BT: jax.Array  # |a_{t+1}|
    factual_logp_BL: jax.Array | None = None  # next-token log-probs of the trajectories (shared_prefix)
    tokens_processed: int = struct.field(pytree_node=False, default=0)  # tokens run through the model


def _next_action_span(batch: CreditBatch) -> jax.Array:
    """[B, T, 2]: the span of action t+1 (zeros after the last turn)."""
    a = batch.action_span_BT2
    return jnp.concatenate([a[:, 1:], jnp.zeros_like(a[:, :1])], axis=1)


def _replacement_len(batch: CreditBatch, P: int, placeholder_mode: PlaceholderMode) -> jax.Array:
    fb = batch.feedback_span_BT2
    if placeholder_mode == "replace":
        return jnp.full(fb.shape[:2], P, jnp.int32)
    return (fb[..., 1] - fb[..., 0]).astype(jnp.int32)


def _sum_over_action(logp_next_BL: jax.Array, span_BT2: jax.Array) -> jax.Array:
    """sum_{i in [s, e)} log pi(token i | < i) = sum of next-token entries i-1, per (b, t).

    A masked sum (``where``, so a non-finite value outside the span cannot leak in), not a
    difference of prefix sums, which would lose float32 precision to everything before the span."""
    L = logp_next_BL.shape[1]
    per_token = jnp.concatenate([jnp.zeros_like(logp_next_BL[:, :1]), logp_next_BL[:, :-1]], axis=1)
    i = jnp.arange(L, dtype=jnp.int32)[None, None, :]
    inside = (i >= span_BT2[..., 0:1]) & (i < span_BT2[..., 1:2])  # [B, T, L]
    return jnp.sum(jnp.where(inside, per_token[:, None, :], 0.0), axis=-1)  # NaN outside never leaks


def infogain_output(fact, cf, act_len, valid, **extra) -> InfoGainOutput:
    """r_info = (factual - counterfactual sum) / |a_{t+1}| on valid turns, 0 elsewhere; [B, T] each."""
    denom = jnp.maximum(act_len, 1).astype(jnp.float32)
    r = jnp.where(valid, (fact - cf) / denom, 0.0)
    return InfoGainOutput(r, valid, jnp.where(valid, fact, 0.0), jnp.where(valid, cf, 0.0), act_len, **extra)


# ---------------------------------------------------------------------------- vmapped
def counterfactual_histories(
    batch: CreditBatch, ph_P: jax.Array, placeholder_mode: PlaceholderMode
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """All counterfactual histories, gathered: tokens [B, T, Lc], valid-token mask [B, T, Lc] and
    the span of a_{t+1} inside each [B, T, 2]. Lc = L + P (replace) or L (overwrite)."""
    B, L = batch.tokens_BL.shape
    P = ph_P.shape[0]
    Lc = L + P if placeholder_mode == "replace" else L
    fb = batch.feedback_span_BT2
    nxt = _next_action_span(batch)
    r_len = _replacement_len(batch, P, placeholder_mode)
    fs, fe = fb[..., 0][..., None], fb[..., 1][..., None]
    rl = r_len[..., None]
    j = jnp.arange(Lc, dtype=jnp.int32)[None, None, :]
    src = jnp.clip(fe + (j - fs - rl), 0, L - 1)
    in_prefix = j < fs
    in_ph = (j >= fs) & (j < fs + rl)
    ph_tok = ph_P[jnp.clip(j - fs, 0, P - 1)]
    traj = jnp.take_along_axis(
        jnp.broadcast_to(batch.tokens_BL[:, None, :], (B, fb.shape[1], L)), jnp.where(in_prefix, jnp.clip(j, 0, L - 1), src),
        axis=2,
    )
    tokens = jnp.where(in_ph, ph_tok, traj)
    end = fs + rl + (nxt[..., 1][..., None] - fe)  # one past a_{t+1} in the counterfactual
    mask = j < end
    shift = (fs + rl - fe)[..., 0]
    span = jnp.stack([nxt[..., 0] + shift, nxt[..., 1] + shift], axis=-1)
    return jnp.where(mask, tokens, 0), mask, span


def infogain_vmapped(
    params: Params,
    batch: CreditBatch,
    ph_P: jax.Array,
    *,
    config: QwenConfig,
    factual_logp_BL: jax.Array | None = None,
    placeholder_mode: PlaceholderMode = "replace",
    attn_impl: str | None = None,
    chunk_size: int = 512,
    row_chunk: int | None = None,
    temperature: float = 1.0,
    vocab_limit: int | None = None,
    rules: LogicalRules | None = None,
) -> InfoGainOutput:
    """Every counterfactual history through one batched teacher-forcing call ([B*T, Lc]).

    ``factual_logp_BL``: the trajectories' next-token log-probs (the old-log-prob pass); computed
    here when not given. ``row_chunk``: rows scored at a time (see `token_logprobs`).
    ``temperature`` / ``vocab_limit``: the distribution scored, the sampler's (`token_logprobs`).
    ``rules``: the mesh's activation rules (`token_logprobs`): with the batch's rows split over its
    batch axes, each device then runs its own rows (None: the partitioner decides, and on an fsdp
    mesh it runs every row on every device).
    """
    B, L = batch.tokens_BL.shape
    T = batch.action_span_BT2.shape[1]
    valid = infogain_valid_turns(batch)
    if factual_logp_BL is None:
        factual_logp_BL = token_logprobs(
            params, batch.tokens_BL, config=config, segment_ids_BL=batch.pad_mask_BL.astype(jnp.int32),
            attn_impl=attn_impl, chunk_size=chunk_size, row_chunk=row_chunk, temperature=temperature,
            vocab_limit=vocab_limit, rules=rules,
        )
    nxt = _next_action_span(batch)
    fact = _sum_over_action(factual_logp_BL, nxt)
    cf_tokens, cf_mask, cf_span = counterfactual_histories(batch, ph_P, placeholder_mode)
    Lc = cf_tokens.shape[-1]
    lp = token_logprobs(
        params, cf_tokens.reshape(B * T, Lc), config=config,
        segment_ids_BL=cf_mask.reshape(B * T, Lc).astype(jnp.int32), attn_impl=attn_impl, chunk_size=chunk_size,
        row_chunk=row_chunk, temperature=temperature, vocab_limit=vocab_limit, rules=rules,
    )
    cf = _sum_over_action(lp, cf_span.reshape(B * T, 1, 2)).reshape(B, T)
    act_len = nxt[..., 1] - nxt[..., 0]
    return infogain_output(fact, cf, act_len, valid, tokens_processed=B * T * Lc)


# ---------------------------------------------------------------------------- shared prefix
def _row_ends(pad_mask_BL) -> jax.Array:
    """[B]: one past each row's last real token (0 for an empty row); its suffixes start there."""
    pad = jnp.asarray(pad_mask_BL) != 0
    return jnp.max(jnp.where(pad, jnp.arange(1, pad.shape[1] + 1, dtype=jnp.int32)[None, :], 0), axis=1)


def shared_prefix_layout(batch: CreditBatch, ph_P: jax.Array, packed_len: int, placeholder_mode: PlaceholderMode):
    """The packed sequences: tokens, positions and attention mask [B, Lp(, Lp)], the index in the
    packed sequence where each turn's a_{t+1} starts [B, T], and the number of used positions."""
    B, L = batch.tokens_BL.shape
    P = ph_P.shape[0]
    T = batch.action_span_BT2.shape[1]
    valid = infogain_valid_turns(batch)
    fb = batch.feedback_span_BT2
    fs, fe = fb[..., 0], fb[..., 1]
    nxt = _next_action_span(batch)
    r_len = _replacement_len(batch, P, placeholder_mode)
    suf_len = jnp.where(valid, r_len + nxt[..., 1] - fe, 0)  # [B, T]
    suf_end = jnp.cumsum(suf_len, axis=1)
    suf_start = suf_end - suf_len
    end_B1 = _row_ends(batch.pad_mask_BL)[:, None]  # each row's suffixes follow its own last token

    j = jnp.arange(packed_len, dtype=jnp.int32)[None, :]  # [1, Lp]
    rel = j - end_B1  # index inside the row's suffix area
    t_of = jax.vmap(lambda ends, r: jnp.searchsorted(ends, r, side="right"))(suf_end, jnp.broadcast_to(rel, (B, packed_len)))
    t_of = jnp.clip(t_of, 0, T - 1)
    take = lambda x: jnp.take_along_axis(x, t_of, axis=1)  # noqa: E731
    k = rel - take(suf_start)
    in_suffix = (rel >= 0) & (rel < suf_end[:, -1:])
    fs_j, fe_j, rl_j = take(fs), take(fe), take(r_len)
    ph_tok = ph_P[jnp.clip(k, 0, P - 1)]
    traj_src = jnp.clip(jnp.where(in_suffix, fe_j + (k - rl_j), j), 0, L - 1)
    traj_tok = jnp.take_along_axis(batch.tokens_BL, traj_src, axis=1)
    tokens = jnp.where(in_suffix & (k < rl_j), ph_tok, traj_tok)
    in_traj = j < end_B1
    real = jnp.where(in_traj, batch.pad_mask_BL.astype(bool).reshape(B, L)[:, jnp.clip(j[0], 0, L - 1)], in_suffix)
    tokens = jnp.where(real, tokens, 0)
    positions = jnp.where(in_suffix, fs_j + k, jnp.where(in_traj, j, 0)).astype(jnp.int32)

    # Which keys each query sees (causality is added by the attention).
    suffix_id = jnp.where(in_suffix, t_of, -1)
    limit = jnp.where(in_suffix, fs_j, packed_len)  # suffix queries see the trajectory before o_t
    key_traj = in_traj & real  # [B, Lp] real trajectory keys
    sees_traj = key_traj[:, None, :] & (j[:, None, :] < limit[:, :, None])
    sees_own = (suffix_id[:, :, None] >= 0) & (suffix_id[:, :, None] == suffix_id[:, None, :])
    mask = (sees_traj | sees_own) & real[:, :, None]
    act_start = end_B1 + suf_start + r_len + (nxt[..., 0] - fe)
    return tokens, positions, mask, act_start, real


def infogain_shared_prefix(
    params: Params,
    batch: CreditBatch,
    ph_P: jax.Array,
    *,
    config: QwenConfig,
    packed_len: int,
    placeholder_mode: PlaceholderMode = "replace",
    attn_impl: str | None = None,
    chunk_size: int = 512,
    row_chunk: int | None = None,
    temperature: float = 1.0,
    vocab_limit: int | None = None,
    rules: LogicalRules | None = None,
) -> InfoGainOutput:
    """One packed teacher-forcing pass per trajectory: the trajectory, then each valid turn's
    counterfactual suffix. Returns r_info and, as a by-product, the trajectories' next-token
    log-probs (``factual_logp_BL``). ``packed_len`` (static) from `jaxagent.train.batch.packed_length`.
    ``row_chunk``: packed rows scored at a time (see `token_logprobs`). ``rules``: as in
    `infogain_vmapped`."""
    B, L = batch.tokens_BL.shape
    if packed_len < L:
        raise ValueError(f"packed_len={packed_len}: expected >= the trajectory length {L} "
                         "(see jaxagent.train.batch.packed_length)")
    valid = infogain_valid_turns(batch)

    def packed_logprobs(rows: CreditBatch):  # layout and pass for some rows: their [b, Lp, Lp] masks only
        tokens, positions, mask, act_start, _ = shared_prefix_layout(rows, ph_P, packed_len, placeholder_mode)
        lp = token_logprobs(params, tokens, config=config, positions_BL=positions, mask_BLS=mask, attn_impl=attn_impl,
                            chunk_size=chunk_size, temperature=temperature, vocab_limit=vocab_limit, rules=rules)
        return lp, act_start

    if row_chunk is not None and 0 < row_chunk < B:
        lp, act_start = map_row_chunks(packed_logprobs, row_chunk, batch)
    else:
        lp, act_start = packed_logprobs(batch)
    nxt = _next_action_span(batch)
    act_len = nxt[..., 1] - nxt[..., 0]
    factual_lp = lp[:, :L]
    fact = _sum_over_action(factual_lp, nxt)
    cf = _sum_over_action(lp, jnp.stack([act_start, act_start + act_len], axis=-1))
    pad_last = jnp.concatenate([batch.pad_mask_BL[:, 1:], jnp.zeros_like(batch.pad_mask_BL[:, :1])], axis=1)
    factual_lp = jnp.where(pad_last > 0, factual_lp, 0.0)
    return infogain_output(fact, cf, act_len, valid, factual_logp_BL=factual_lp, tokens_processed=B * packed_len)


vmapped_jit = jax.jit(infogain_vmapped,
                       static_argnames=("config", "placeholder_mode", "attn_impl", "chunk_size", "row_chunk",
                                        "temperature", "vocab_limit", "rules"))
shared_prefix_jit = jax.jit(
    infogain_shared_prefix,
    static_argnames=("config", "packed_len", "placeholder_mode", "attn_impl", "chunk_size", "row_chunk",
                     "temperature", "vocab_limit", "rules"),
)


__all__ = [
    "InfoGainOutput",
    "counterfactual_histories",
    "infogain_output",
    "infogain_shared_prefix",
    "infogain_valid_turns",
    "infogain_vmapped",
    "shared_prefix_layout",
]

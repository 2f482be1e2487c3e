"""InfoPO's information gain from the host: the entry point that dispatches to a mode, and the
naive reference procedure (a Python loop over turns, the InfoPO reference code's method).

The jitted modes themselves (``vmapped``, ``shared_prefix``) are pure code in
`jaxagent.credit.infogain`; `compute_infogain` checks its arguments, sizes the shared-prefix
packing from the batch's spans on the host (`jaxagent.train.batch.packed_length`) and calls
them. ``naive`` builds each turn's two histories as token lists and scores them with a jitted
teacher-forcing call, ``minibatch`` histories at a time: slow, and the reference the fast modes
are tested against (to 1e-5 in float32).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.credit.batch import CreditBatch, infogain_valid_turns
from jaxagent.credit.infogain import (InfoGainOutput, Mode, PlaceholderMode, infogain_output, shared_prefix_jit,
                                      vmapped_jit)
from jaxagent.models.config import QwenConfig
from jaxagent.models.qwen import Params, token_logprobs
from jaxagent.train.batch import HostBatch, packed_length


@functools.lru_cache(maxsize=32)
def _naive_scorer(config: QwenConfig, attn_impl: str, temperature: float = 1.0):
    return jax.jit(lambda p, x, m: token_logprobs(p, x, config=config, segment_ids_BL=m, attn_impl=attn_impl,
                                                  temperature=temperature))




def infogain_naive(
    params: Params,
    batch: CreditBatch,
    ph_ids: list[int] | np.ndarray,
    *,
    config: QwenConfig,
    placeholder_mode: PlaceholderMode = "replace",
    minibatch: int = 8,
    attn_impl: str | None = None,
    temperature: float = 1.0,
) -> InfoGainOutput:
    """The reference procedure, on the host: for each valid turn, build the factual history
    (through a_{t+1}) and the counterfactual one as token lists, and run both through a jitted
    teacher-forcing call, ``minibatch`` histories at a time (padded to fixed lengths)."""
    toks = np.asarray(batch.tokens_BL)
    fb = np.asarray(batch.feedback_span_BT2)
    act = np.asarray(batch.action_span_BT2)
    valid = np.asarray(infogain_valid_turns(batch))
    ph = [int(x) for x in np.asarray(ph_ids)]
    B, L = toks.shape
    T = act.shape[1]
    jobs = []  # (b, t, factual tokens, counterfactual tokens, action start in each)
    for b in range(B):
        for t in range(T):
            if not valid[b, t]:
                continue
            fs, fe = fb[b, t]
            s, e = act[b, t + 1]
            if placeholder_mode == "replace":
                rep = ph
            else:
                n = fe - fs
                rep = (ph + [ph[-1]] * n)[:n]
            factual = toks[b, :e].tolist()
            counter = toks[b, :fs].tolist() + rep + toks[b, fe:e].tolist()
            jobs.append((b, t, factual, counter, s, s + len(rep) - (fe - fs)))
    fact = np.zeros((B, T), np.float32)
    cf = np.zeros((B, T), np.float32)
    width = L + len(ph)
    score = _naive_scorer(config, attn_impl, float(temperature))

    def run(seqs: list[list[int]]) -> np.ndarray:
        x = np.zeros((minibatch, width), np.int32)
        m = np.zeros((minibatch, width), np.int32)
        for i, s in enumerate(seqs):
            x[i, : len(s)] = s
            m[i, : len(s)] = 1
        return np.asarray(score(params, jnp.asarray(x), jnp.asarray(m)))

    processed = 0
    for i in range(0, len(jobs), minibatch):
        chunk = jobs[i : i + minibatch]
        lf = run([j[2] for j in chunk])
        lc = run([j[3] for j in chunk])
        processed += 2 * minibatch * width
        for r, (b, t, factual, counter, s_f, s_c) in enumerate(chunk):
            n = len(factual) - s_f
            fact[b, t] = lf[r, s_f - 1 : s_f - 1 + n].sum()
            cf[b, t] = lc[r, s_c - 1 : s_c - 1 + n].sum()
    act_len = np.concatenate([act[:, 1:, 1] - act[:, 1:, 0], np.zeros((B, 1), act.dtype)], axis=1)
    return infogain_output(jnp.asarray(fact), jnp.asarray(cf), jnp.asarray(act_len), jnp.asarray(valid),
                   tokens_processed=processed)




def compute_infogain(
    params: Params,
    batch: CreditBatch,
    ph_ids,
    *,
    config: QwenConfig,
    mode: Mode = "shared_prefix",
    placeholder_mode: PlaceholderMode = "replace",
    factual_logp_BL: jax.Array | None = None,
    packed_len: int | None = None,
    attn_impl: str | None = None,
    row_chunk: int | None = None,
    temperature: float = 1.0,
    host: HostBatch | None = None,
    packed_multiple: int = 64,
) -> InfoGainOutput:
    """Dispatches to one of the three modes (host entry point; the vmapped and shared-prefix
    modes are single jitted calls). ``mode`` and ``placeholder_mode`` are `InfoPOConfig`'s
    fields of the same names; ``ph_ids`` is its ``placeholder`` tokenised as the feedback's
    content would be (e.g. `ChatRenderer.encode_content`). ``row_chunk`` (vmapped and
    shared_prefix): rows run through the model at a time (None: all at once; see
    `token_logprobs`). ``temperature``: the log-probs are the policy's at the sampler's
    temperature (the distribution the RL trainer optimises; 1: the raw policy). ``host``: the
    same batch's host arrays (`jaxagent.train.batch.build_batch`), when the caller has them:
    the packed length is then computed from them, with no device round trip. Without
    ``packed_len``, the shared-prefix pass packs to the length its suffixes need rounded up to
    ``packed_multiple`` (a static shape)."""
    if mode not in ("naive", "vmapped", "shared_prefix"):
        raise ValueError(f"mode={mode!r}: expected 'naive', 'vmapped' or 'shared_prefix'")
    if placeholder_mode not in ("replace", "overwrite"):
        raise ValueError(f"placeholder_mode={placeholder_mode!r}: expected 'replace' or 'overwrite'")
    ph = np.asarray(ph_ids, np.int32).reshape(-1)
    if ph.size == 0:
        raise ValueError("placeholder token ids: empty; expected the tokenised placeholder (>= 1 token)")
    if mode == "naive":
        return infogain_naive(params, batch, ph, config=config, placeholder_mode=placeholder_mode, attn_impl=attn_impl,
                              temperature=temperature)
    if mode == "vmapped":
        return vmapped_jit(params, batch, jnp.asarray(ph), config=config, factual_logp_BL=factual_logp_BL,
                            placeholder_mode=placeholder_mode, attn_impl=attn_impl, row_chunk=row_chunk,
                            temperature=temperature)
    spans = host if host is not None else batch  # the packed length is host arithmetic over the spans
    need = packed_length(spans, int(ph.size), placeholder_mode, multiple=1)
    packed_len = packed_len or -(-need // packed_multiple) * packed_multiple
    if packed_len < need:
        raise ValueError(f"packed_len={packed_len}: expected >= {need}, the trajectories plus all their "
                         "counterfactual suffixes (see packed_length)")
    return shared_prefix_jit(params, batch, jnp.asarray(ph), config=config, packed_len=packed_len,
                              placeholder_mode=placeholder_mode, attn_impl=attn_impl, row_chunk=row_chunk,
                              temperature=temperature)


__all__ = ["compute_infogain", "infogain_naive"]

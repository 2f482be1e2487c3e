"""InfoPO's information gain from the host: the entry point that dispatches to a mode, the
naive reference procedure (a Python loop over turns, the InfoPO reference code's method), and
the marginal prior (`marginal_infogain`).

The jitted modes themselves (``vmapped``, ``shared_prefix``) are pure code in
`jaxagent.credit.infogain`; `compute_infogain` checks its arguments, sizes the shared-prefix
packing from the batch's spans on the host (`jaxagent.train.batch.packed_length`) and calls
them. ``naive`` builds each turn's two histories as token lists and scores them with a jitted
teacher-forcing call, ``minibatch`` histories at a time: slow, and the reference the fast modes
are tested against (to 1e-5 in float32).

`marginal_infogain` scores a_{t+1} after each reply the environment could have given (the
feedback's ``alternatives``, `jaxagent.train.batch.Alternatives`) as well as after the actual one,
and compares the actual history with their probability-weighted mixture:

    r_info(t) = (log pi(a | h, o_t) - log sum_k p_k pi(a | h, o_k)) / |a|,   a = a_{t+1}

A feedback without alternatives is deterministic given the history: its gain is exactly 0. All
histories of a batch (one factual and K per turn) are scored together, ``rows`` at a time, at
lengths rounded up to a multiple (few compiled shapes); `marginal_naive` scores them one by one
(the reference the test compares with).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.credit.batch import CreditBatch, infogain_valid_turns
from jaxagent.credit.infogain import (InfoGainOutput, Mode, PlaceholderMode, infogain_output, shared_prefix_jit,
                                      vmapped_jit)
from jaxagent.models.config import QwenConfig
from jaxagent.models.qwen import Params, token_logprobs
from jaxagent.models.sharding import LogicalRules, place_rows
from jaxagent.train.batch import HostBatch, packed_length


@functools.lru_cache(maxsize=32)
def _naive_scorer(config: QwenConfig, attn_impl: str, temperature: float = 1.0, vocab_limit: int | None = None):
    return jax.jit(lambda p, x, m: token_logprobs(p, x, config=config, segment_ids_BL=m, attn_impl=attn_impl,
                                                  temperature=temperature, vocab_limit=vocab_limit))




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
    vocab_limit: int | None = None,
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
    score = _naive_scorer(config, attn_impl, float(temperature), vocab_limit)

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
    vocab_limit: int | None = None,
    rules: LogicalRules | None = None,
) -> InfoGainOutput:
    """Dispatches to one of the three modes (host entry point; the vmapped and shared-prefix
    modes are single jitted calls). ``mode`` and ``placeholder_mode`` are `InfoPOConfig`'s
    fields of the same names; ``ph_ids`` is its ``placeholder`` tokenised as the feedback's
    content would be (e.g. `ChatRenderer.encode_content`). ``row_chunk`` (vmapped and
    shared_prefix): rows run through the model at a time (None: all at once; see
    `token_logprobs`). ``temperature`` / ``vocab_limit``: the log-probs are the policy's at the
    sampler's temperature and vocabulary limit (the distribution the RL trainer optimises; 1 and
    None: the raw policy). ``host``: the
    same batch's host arrays (`jaxagent.train.batch.build_batch`), when the caller has them:
    the packed length is then computed from them, with no device round trip. Without
    ``packed_len``, the shared-prefix pass packs to the length its suffixes need rounded up to
    ``packed_multiple`` (a static shape). ``rules`` (vmapped and shared_prefix; a mesh of several
    devices): the batch's rows are split over the mesh's batch axes (`place_rows`) and the pass's
    activations kept so, each device scoring its own rows (None: as the batch is placed)."""
    if mode not in ("naive", "vmapped", "shared_prefix"):
        raise ValueError(f"mode={mode!r}: expected 'naive', 'vmapped' or 'shared_prefix'")
    if placeholder_mode not in ("replace", "overwrite"):
        raise ValueError(f"placeholder_mode={placeholder_mode!r}: expected 'replace' or 'overwrite'")
    ph = np.asarray(ph_ids, np.int32).reshape(-1)
    if ph.size == 0:
        raise ValueError("placeholder token ids: empty; expected the tokenised placeholder (>= 1 token)")
    if mode == "naive":
        return infogain_naive(params, batch, ph, config=config, placeholder_mode=placeholder_mode, attn_impl=attn_impl,
                              temperature=temperature, vocab_limit=vocab_limit)
    if rules is not None:
        batch = place_rows(batch, rules)
    if mode == "vmapped":
        return vmapped_jit(params, batch, jnp.asarray(ph), config=config, factual_logp_BL=factual_logp_BL,
                            placeholder_mode=placeholder_mode, attn_impl=attn_impl, row_chunk=row_chunk,
                            temperature=temperature, vocab_limit=vocab_limit, rules=rules)
    spans = host if host is not None else batch  # the packed length is host arithmetic over the spans
    need = packed_length(spans, int(ph.size), placeholder_mode, multiple=1)
    packed_len = packed_len or -(-need // packed_multiple) * packed_multiple
    if packed_len < need:
        raise ValueError(f"packed_len={packed_len}: expected >= {need}, the trajectories plus all their "
                         "counterfactual suffixes (see packed_length)")
    return shared_prefix_jit(params, batch, jnp.asarray(ph), config=config, packed_len=packed_len,
                              placeholder_mode=placeholder_mode, attn_impl=attn_impl, row_chunk=row_chunk,
                              temperature=temperature, vocab_limit=vocab_limit, rules=rules)


# ---------------------------------------------------------------------------- marginal prior
def _valid_on_host(host: HostBatch) -> np.ndarray:
    with jax.default_device(jax.local_devices(backend="cpu")[0]):  # [B, T] spans only, on the host
        return np.asarray(infogain_valid_turns(host))


def marginal_histories(host: HostBatch, valid: np.ndarray | None = None
                       ) -> tuple[list[tuple[int, int, list[int], int, int]], list[float]]:
    """The histories `marginal_infogain` scores, as ``(b, t, tokens, start of a_{t+1}, k)`` with
    k = -1 for the factual history and 0.. for the alternatives, and each alternative's log
    probability (in job order, -inf-free; the factual entries hold 0). Only valid turns whose
    feedback has alternatives appear (the others' gain is 0). ``valid``: the batch's valid turns,
    when the caller has them."""
    toks = np.asarray(host.tokens_BL)
    act = np.asarray(host.action_span_BT2)
    valid = _valid_on_host(host) if valid is None else valid
    jobs, logw = [], []
    alts = host.alternatives or ()
    for b, row in enumerate(alts):
        for t, feedback in enumerate(row):
            if feedback is None or not valid[b, t]:
                continue
            s, e = (int(x) for x in act[b, t + 1])
            jobs.append((b, t, toks[b, :e].tolist(), s, -1))
            logw.append(0.0)
            spans = [span for span, _ in feedback]
            for k, combo in enumerate(itertools.product(*[replies for _, replies in feedback])):
                seq, prev, shift = [], 0, 0
                for (cs, ce), (ids, _) in zip(spans, combo):
                    seq += toks[b, prev:cs].tolist() + list(ids)
                    shift += len(ids) - (ce - cs)
                    prev = ce
                seq += toks[b, prev:e].tolist()
                jobs.append((b, t, seq, s + shift, k))
                logw.append(float(sum(np.log(p) for _, p in combo)))
    return jobs, logw


def _combine(jobs, sums, logw, B: int, T: int, act_len: np.ndarray, valid: np.ndarray, **extra) -> InfoGainOutput:
    """Per turn: factual sum and the log of the mixture, then `infogain_output`."""
    fact = np.zeros((B, T), np.float64)
    terms: dict[tuple[int, int], list[float]] = {}
    for (b, t, _, _, k), x, lw in zip(jobs, sums, logw):
        if k < 0:
            fact[b, t] = x
        else:
            terms.setdefault((b, t), []).append(lw + x)
    prior = fact.copy()  # deterministic feedback: the prior is the factual history itself (gain 0)
    for (b, t), vals in terms.items():
        m = max(vals)
        prior[b, t] = m + np.log(np.sum(np.exp(np.asarray(vals) - m)))
    return infogain_output(jnp.asarray(fact, jnp.float32), jnp.asarray(prior, jnp.float32), jnp.asarray(act_len),
                           jnp.asarray(valid), **extra)


def _next_len(host: HostBatch) -> np.ndarray:
    act = np.asarray(host.action_span_BT2)
    return np.concatenate([act[:, 1:, 1] - act[:, 1:, 0], np.zeros((act.shape[0], 1), act.dtype)], axis=1)


def marginal_infogain(
    params: Params,
    host: HostBatch,
    *,
    config: QwenConfig,
    rows: int = 8,
    multiple: int = 64,
    attn_impl: str | None = None,
    temperature: float = 1.0,
    vocab_limit: int | None = None,
) -> InfoGainOutput:
    """InfoPO's gain against the marginal prior (module docstring) for a host batch whose records
    carry alternatives (`HostBatch.alternatives`; None gives 0 on every turn). Every history is
    scored ``rows`` at a time at the sampler's ``temperature`` / ``vocab_limit``, padded to a
    multiple of ``multiple`` tokens. ``tokens_processed`` counts the padded positions scored."""
    valid = _valid_on_host(host)
    B, T = valid.shape
    jobs, logw = marginal_histories(host, valid)
    score = _naive_scorer(config, attn_impl, float(temperature), vocab_limit)
    sums = np.zeros(len(jobs), np.float64)
    processed = 0
    order = sorted(range(len(jobs)), key=lambda i: len(jobs[i][2]))  # similar lengths share a width
    for c in range(0, len(order), rows):
        chunk = order[c : c + rows]
        width = -(-max(len(jobs[i][2]) for i in chunk) // multiple) * multiple
        x = np.zeros((rows, width), np.int32)
        m = np.zeros((rows, width), np.int32)
        for r, i in enumerate(chunk):
            seq = jobs[i][2]
            x[r, : len(seq)] = seq
            m[r, : len(seq)] = 1
        lp = np.asarray(score(params, jnp.asarray(x), jnp.asarray(m)), np.float64)
        processed += rows * width
        for r, i in enumerate(chunk):
            seq, s = jobs[i][2], jobs[i][3]
            sums[i] = lp[r, s - 1 : len(seq) - 1].sum()
    return _combine(jobs, sums, logw, B, T, _next_len(host), valid, tokens_processed=processed)


def marginal_naive(params: Params, host: HostBatch, *, config: QwenConfig, temperature: float = 1.0,
                   vocab_limit: int | None = None) -> np.ndarray:
    """The reference of `marginal_infogain`: a Python loop over turns and over their replies, each
    history scored alone (unpadded) and the mixture summed in probability space. Returns r_info
    [B, T] (float64 numpy)."""
    valid = _valid_on_host(host)
    toks = np.asarray(host.tokens_BL)
    act = np.asarray(host.action_span_BT2)
    r = np.zeros(valid.shape, np.float64)

    def seq_logprob(seq: list[int], start: int) -> float:
        lp = token_logprobs(params, jnp.asarray([seq], jnp.int32), config=config, temperature=temperature,
                            vocab_limit=vocab_limit)
        return float(np.asarray(lp, np.float64)[0, start - 1 : len(seq) - 1].sum())

    for b, row in enumerate(host.alternatives or ()):
        for t, feedback in enumerate(row):
            if feedback is None or not valid[b, t]:
                continue
            s, e = (int(x) for x in act[b, t + 1])
            factual = seq_logprob(toks[b, :e].tolist(), s)
            mixture = 0.0
            for combo in itertools.product(*[replies for _, replies in feedback]):
                seq, prev, shift, p = [], 0, 0, 1.0
                for ((cs, ce), _), (ids, w) in zip(feedback, combo):
                    seq += toks[b, prev:cs].tolist() + list(ids)
                    shift += len(ids) - (ce - cs)
                    prev, p = ce, p * w
                seq += toks[b, prev:e].tolist()
                mixture += p * np.exp(seq_logprob(seq, s + shift))
            r[b, t] = (factual - np.log(mixture)) / (e - s)
    return r


__all__ = ["compute_infogain", "infogain_naive", "marginal_histories", "marginal_infogain", "marginal_naive"]

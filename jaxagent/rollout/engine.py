"""In-flight batched generation over a slot cache (host orchestration of pure jitted steps).

The engine owns one KV cache of ``slots`` rows. Each request (a session's prompt, token-in) is
admitted into a slot as soon as one is free; every engine step prefills the newly admitted rows
(one `extend` call, other rows untouched) and then decodes one token for every active row, so
finished rows free their slot at once and there is no whole-batch barrier. A session keeps its
slot between turns: the next prompt is compared with the tokens the slot holds, the row is rolled
back to their longest common prefix (``lengths`` only: stale entries beyond it are overwritten
before anything attends to them) and only the rest is prefilled. An evicted session (its slot
given to another while it waited for its user) falls back to a full prefill.

`GenerationEngine.generate` is the one async call (tokens in, tokens and log-probs out); the
device work runs in a worker thread so simulators' HTTP calls proceed meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models.config import QwenConfig
from jaxagent.models.generate import KVCache, SamplingParams, extend, init_cache, sample
from jaxagent.models.qwen import Params


@dataclasses.dataclass
class EngineResult:
    tokens: list[int]
    logp_policy: list[float]
    logp_sample: list[float]
    stopped: bool
    truncated: bool
    prefill_tokens: int  # tokens this request prefilled (the whole prompt without prefix reuse)


@dataclasses.dataclass
class _Request:
    session: str
    prompt: list[int]
    sampling: SamplingParams
    key: jax.Array
    future: asyncio.Future
    slot: int = -1
    out: list[int] = dataclasses.field(default_factory=list)
    lpp: list[float] = dataclasses.field(default_factory=list)
    lps: list[float] = dataclasses.field(default_factory=list)
    prefill_tokens: int = 0


@functools.partial(jax.jit, static_argnames=("config",), donate_argnums=(1,))
def _prefill(params, cache: KVCache, tokens_ST, n_new_S, rollback_S, logits_SV, *, config: QwenConfig):
    """Rolls admitted rows back to their reused prefix, appends their new tokens, and keeps the
    other rows' pending logits."""
    admitted = n_new_S > 0
    cache = cache._replace(lengths=jnp.where(admitted, rollback_S, cache.lengths))
    logits, cache = extend(params, cache, tokens_ST, n_new_S, config=config)
    return jnp.where(admitted[:, None], logits, logits_SV), cache


@functools.partial(jax.jit, static_argnames=("config", "vocab_limit"), donate_argnums=(1,))
def _decode(params, cache: KVCache, logits_SV, keys_S, steps_S, temp_S, topk_S, topp_S, active_S, feed_S, *,
            config: QwenConfig, vocab_limit):
    """Samples one token per row with ``fold_in(keys_S[s], steps_S[s])``; rows in ``feed_S``
    (continuing) write it to the cache."""
    keys = jax.vmap(jax.random.fold_in)(keys_S, steps_S)
    tok, lps, lpp = sample(logits_SV, keys, temp_S, topk_S, topp_S, vocab_limit=vocab_limit)
    tok = jnp.where(active_S, tok, 0)
    logits, cache = extend(params, cache, tok[:, None], feed_S.astype(jnp.int32), config=config)
    return tok, lps, lpp, jnp.where(feed_S[:, None], logits, logits_SV), cache


class GenerationEngine:
    """Slots of a shared KV cache, filled by requests from any number of sessions."""

    def __init__(self, params: Params, config: QwenConfig, *, slots: int, capacity: int,
                 vocab_limit: int | None = None):
        if slots < 1:
            raise ValueError(f"slots={slots}: expected a positive integer")
        self.params, self.config = params, config
        self.slots, self.capacity, self.vocab_limit = slots, capacity, vocab_limit
        self.cache = init_cache(config, slots, capacity)
        self.logits = jnp.zeros((slots, config.vocab_size), jnp.float32)
        self.keys = jax.random.split(jax.random.key(0), slots)  # each running row's request key
        self.held: list[list[int]] = [[] for _ in range(slots)]  # tokens each slot's cache holds
        self.owner: list[str | None] = [None] * slots
        self.lru: OrderedDict[str, int] = OrderedDict()  # idle sessions -> slot, in the order they went idle
        self.running: list[_Request | None] = [None] * slots
        self.pending: list[_Request] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.stats = {"prefill_tokens": 0, "decode_steps": 0, "device_s": 0.0}

    # ------------------------------------------------------------------ public
    async def generate(self, session: str, prompt: list[int], sampling: SamplingParams,
                       key: jax.Array) -> EngineResult:
        """Generates a continuation of ``prompt`` (the session's whole conversation so far)."""
        sampling.validate(self.config.vocab_size)
        if not prompt:
            raise ValueError(f"session {session!r}: empty prompt; expected at least one token")
        if len(prompt) + sampling.max_new_tokens - 1 > self.capacity:
            raise ValueError(f"session {session!r}: {len(prompt)} prompt tokens + max_new_tokens="
                             f"{sampling.max_new_tokens} exceed the slot capacity {self.capacity}")
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())
        req = _Request(session, list(prompt), sampling, key, loop.create_future())
        self.pending.append(req)
        self._wake.set()
        return await req.future

    def release(self, session: str) -> None:
        """Forgets a finished session's slot contents (its slot becomes free)."""
        slot = self.lru.pop(session, None)
        if slot is not None:
            self.owner[slot] = None

    # ------------------------------------------------------------------ scheduling
    def _admit(self) -> list[_Request]:
        admitted = []
        for req in list(self.pending):
            slot = next((s for s in range(self.slots) if self.owner[s] == req.session
                         and self.running[s] is None), None)
            if slot is None:
                slot = next((s for s in range(self.slots) if self.owner[s] is None), None)
            if slot is None and self.lru:
                # Evict the session that went idle last: idle sessions wait for their users about
                # equally long, so the one idle longest is the one coming back soonest.
                victim, slot = self.lru.popitem(last=True)
            if slot is None:
                continue
            self.lru.pop(req.session, None)
            if self.owner[slot] != req.session:
                self.held[slot] = []
            self.owner[slot] = req.session
            req.slot = slot
            self.running[slot] = req
            self.pending.remove(req)
            admitted.append(req)
        return admitted

    def _step(self, admitted: list[_Request]):
        """One device step (runs in a worker thread): prefill the admitted rows, decode all."""
        S = self.slots
        if admitted:
            rollback = np.zeros(S, np.int32)
            n_new = np.zeros(S, np.int32)
            news = {}
            for req in admitted:
                held = self.held[req.slot]
                lcp = 0
                while lcp < min(len(held), len(req.prompt)) and held[lcp] == req.prompt[lcp]:
                    lcp += 1
                lcp = min(lcp, len(req.prompt) - 1)  # prefill at least one token for its logits
                rollback[req.slot] = lcp
                news[req.slot] = req.prompt[lcp:]
                n_new[req.slot] = len(news[req.slot])
                req.prefill_tokens = int(n_new[req.slot])
            T = 1 << max(0, int(n_new.max()) - 1).bit_length()  # power-of-two buckets
            toks = np.zeros((S, T), np.int32)
            for s, new in news.items():
                toks[s, : len(new)] = new
            self.logits, self.cache = _prefill(self.params, self.cache, jnp.asarray(toks), jnp.asarray(n_new),
                                               jnp.asarray(rollback), self.logits, config=self.config)
            for req in admitted:
                self.held[req.slot] = list(req.prompt)
            self.stats["prefill_tokens"] += int(n_new.sum())
        active = np.array([r is not None for r in self.running])
        temp = np.array([r.sampling.temperature if r else 0.0 for r in self.running], np.float32)
        topk = np.array([r.sampling.top_k if r else 0 for r in self.running], np.int32)
        topp = np.array([r.sampling.top_p if r else 1.0 for r in self.running], np.float32)
        for s, r in enumerate(self.running):
            if r is not None and not r.out:
                self.keys = self.keys.at[s].set(r.key)  # once per request, not per step
        steps = np.array([len(r.out) if r else 0 for r in self.running], np.int32)
        # Rows whose next token cannot end them are fed; the rest are decided after sampling. The
        # cache of a running row holds its prompt and all its tokens but the next one.
        feed = np.array([r is not None and len(r.out) + 1 < r.sampling.max_new_tokens
                         and len(r.prompt) + len(r.out) < self.capacity for r in self.running])
        tok, lps, lpp, logits, cache = _decode(
            self.params, self.cache, self.logits, self.keys, jnp.asarray(steps), jnp.asarray(temp),
            jnp.asarray(topk), jnp.asarray(topp), jnp.asarray(active), jnp.asarray(feed), config=self.config,
            vocab_limit=self.vocab_limit)
        tok, lps, lpp = np.asarray(tok), np.asarray(lps), np.asarray(lpp)
        self.logits, self.cache = logits, cache
        self.stats["decode_steps"] += 1
        finished = []
        for s, req in enumerate(self.running):
            if req is None:
                continue
            t = int(tok[s])
            req.out.append(t)
            req.lps.append(float(lps[s]))
            req.lpp.append(float(lpp[s]))
            stop = t in req.sampling.stop_tokens
            if stop or not feed[s]:
                if feed[s]:  # it was written but the sequence ended on a stop token: roll it back
                    self.cache = self.cache._replace(lengths=self.cache.lengths.at[s].add(-1))
                truncated = not stop and len(req.out) < req.sampling.max_new_tokens
                self.held[s] = req.prompt + req.out[:-1]
                finished.append((req, stop, truncated))
                self.running[s] = None
            else:
                self.held[s] = req.prompt + req.out
        return finished

    async def _run(self):
        loop = asyncio.get_running_loop()
        while True:
            admitted = self._admit()
            if not admitted and not any(self.running):
                if not self.pending:
                    self._wake.clear()
                await self._wake.wait()
                continue
            t0 = loop.time()
            finished = await loop.run_in_executor(None, self._step, admitted)
            self.stats["device_s"] += loop.time() - t0
            for req, stop, truncated in finished:
                self.lru[req.session] = req.slot
                if not req.future.done():
                    req.future.set_result(EngineResult(req.out, req.lpp, req.lps, stop, truncated,
                                                       req.prefill_tokens))

"""In-flight batched generation over a slot cache (host orchestration of pure jitted steps).

The engine owns one KV cache of ``slots`` rows (decode lanes) and ``park_rows`` more rows that
are never decoded. Each request (a session's prompt, token-in) is admitted into a lane as soon
as one is free; every engine call prefills the newly admitted rows (one `extend` call, other
rows untouched) and then decodes ``decode_steps`` tokens for the running rows in one jitted
scan: those rows' first W positions (W a power-of-two window over the longest, not the capacity)
are gathered, decoded and written back, their count padded to a power of two, so a call costs
the lanes that run, not every lane. A row that
ends frees its lane when the call returns, so there is no whole-batch barrier. A session keeps
its lane between turns: the next prompt is compared with the tokens the lane holds, the row is
rolled back to their longest common prefix (``lengths`` only: stale entries beyond it are
overwritten before anything attends to them) and only the rest is prefilled. A session whose
lane is given to another while it waits for its user is parked (its prefix copied to a park
row) and copied back when it returns; without park rows it falls back to a full prefill.

`GenerationEngine.generate` is the one async call (tokens in, tokens and log-probs out); the
device work runs in a worker thread so simulators' HTTP calls proceed meanwhile. A failed call
fails the requests it held (they never hang) and resets the cache.

Which requests share an engine call changes the numbers (the attention window and the prefill
width are the batch's, and float rounding follows the shapes), so admission does not depend on
how long a call took. A session whose result came out of call n has call n+1 to come back with
its next turn; at the end of call n+1 the engine gives the event loop a bounded number of turns
for those still on their way (a scripted user answers within a few; one waiting on I/O is not
waited for), then admits them, and nothing that came back sooner (a request, or a release that
frees its lane) is seen before that point. With scripted users a rollout is thus replayed
exactly, whatever the machine's load; with users over HTTP the order of their answers decides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import heapq
from collections import Counter, OrderedDict
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models.config import QwenConfig
from jaxagent.models.generate import KVCache, SamplingParams, extend, init_cache, sample_folded, split_layers
from jaxagent.models.qwen import Params


@dataclasses.dataclass
class EngineResult:
    tokens: list[int]
    logp_policy: list[float]
    logp_sample: list[float]
    stopped: bool
    truncated: bool
    prefill_tokens: int  # tokens this request prefilled (the whole prompt without prefix reuse)
    version: int = 0  # the policy version (`GenerationEngine.version`) whose weights generated it


@dataclasses.dataclass
class _Request:
    session: str
    prompt: list[int]
    sampling: SamplingParams
    key: np.ndarray  # the request key's data [2] uint32
    future: asyncio.Future
    slot: int = -1
    own_lane: bool = False  # admitted into the lane its session already held
    evicts: str | None = None  # the idle session whose lane it took
    out: list[int] = dataclasses.field(default_factory=list)
    lpp: list[float] = dataclasses.field(default_factory=list)
    lps: list[float] = dataclasses.field(default_factory=list)
    prefill_tokens: int = 0
    ready: int = 0  # the first call boundary at which it may be admitted
    seq: int = 0  # arrival order
    on_tokens: Callable[[list[int], list[float]], None] | None = None  # each call's new tokens, log-probs
    told: int = 0  # tokens of ``out`` passed to on_tokens so far


# The fewest new tokens a prefill call is shaped for (a turn's few tokens pad to it: fewer shapes to compile).
_MIN_PREFILL = 16
# Event-loop turns the engine waits, between calls, for sessions that got a result one call ago.
_SETTLE_TURNS = 16


def _bucket(n: int, lo: int, hi: int) -> int:
    """The power of two >= n, clipped to [lo, hi] (few distinct shapes, few compilations)."""
    return min(hi, max(lo, 1 << max(0, n - 1).bit_length()))


#: Where the engine's caches live (`rollout.cache_sharding`): see `engine_cache_sharding`.
CACHE_SHARDINGS = ("replicated", "heads")


def engine_cache_sharding(params: Params, config: QwenConfig, how: str = "replicated"):
    """The sharding of the engine's K and V caches ([layers, rows, capacity, kv_heads, head_dim]),
    or None for the default placement. ``"replicated"``: None (on several devices each holds all of
    them). ``"heads"``: the KV heads split over every axis larger than 1 of the mesh the parameters
    live on, so each device holds kv_heads / devices of every row: the engine gathers and writes
    whole rows (admission, parking, decode lanes), which a split over heads leaves local. None when
    the parameters are on one device. ValueError (naming ``rollout.cache_sharding``) for another
    value, or when the device count does not divide the KV heads."""
    from jax.sharding import NamedSharding, PartitionSpec

    if how not in CACHE_SHARDINGS:
        raise ValueError(f"rollout.cache_sharding={how!r}: expected one of {', '.join(map(repr, CACHE_SHARDINGS))}")
    if how == "replicated":
        return None
    mesh = next((x.sharding.mesh for x in jax.tree.leaves(params) if isinstance(getattr(x, "sharding", None),
                                                                                 NamedSharding)), None)
    axes = tuple(a for a in mesh.axis_names if mesh.shape[a] > 1) if mesh is not None else ()
    n = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
    if n == 1:
        return None
    K = config.num_key_value_heads
    if K % n:
        raise ValueError(f"rollout.cache_sharding='heads': the model's {K} KV heads do not split over the "
                         f"{n} devices of the mesh {dict(mesh.shape)}; expected a device count that divides {K}, "
                         "or rollout.cache_sharding='replicated'")
    return NamedSharding(mesh, PartitionSpec(None, None, None, axes, None))


@functools.partial(jax.jit, static_argnames=("config", "window"), donate_argnums=(1,))
def _prefill(params, cache: KVCache, rows_A, tokens_AT, n_new_A, rollback_A, logits_SV, *, config: QwenConfig,
             window: int):
    """Prefills the admitted rows only: row ``rows_A[a]`` of the cache is rolled back to
    ``rollback_A[a]`` (its reused prefix) and ``tokens_AT[a, :n_new_A[a]]`` are appended, attending
    over the first ``window`` cache positions; its pending logits [V] become those of its last new
    token. Padding entries of ``rows_A`` hold an out-of-range row (>= S) with ``n_new == 0``: they
    read a clipped row, write nothing and change nothing. The other rows, and their pending
    logits, are untouched, so a call costs the admitted rows' tokens, not every lane's.

    Shapes: rows_A [A] int32, tokens_AT [A, T], n_new_A / rollback_A [A], logits_SV [S, V]."""
    sub = KVCache(cache.k.at[:, rows_A].get(mode="clip"), cache.v.at[:, rows_A].get(mode="clip"), rollback_A)
    logits_AV, sub = extend(params, sub, tokens_AT, n_new_A, config=config, window=window)
    rows = jnp.where(n_new_A > 0, rows_A, cache.lengths.shape[0])  # padding: out of range, dropped
    cache = KVCache(cache.k.at[:, rows].set(sub.k, mode="drop"), cache.v.at[:, rows].set(sub.v, mode="drop"),
                    cache.lengths.at[rows].set(sub.lengths, mode="drop"))
    return logits_SV.at[rows].set(logits_AV, mode="drop"), cache


@functools.partial(jax.jit, static_argnames=("config", "vocab_limit", "steps", "window"), donate_argnums=(1,))
def _decode(params, cache: KVCache, logits_SV, rows_B, keys_B2, count_B, budget_B, temp_B, topk_B, topp_B, stop_BX,
            alive_B, *, config: QwenConfig, vocab_limit, steps: int, window: int):
    """``steps`` decode steps on the device (one host round trip for all of them) for the rows
    ``rows_B`` of the cache only (the running lanes, padded with an out-of-range row >= S that is
    not alive and writes nothing): their first ``window`` positions are gathered, decoded and
    written back, so a call costs the running rows, not every lane.

    Row b samples its i-th token of the request with ``fold_in(key_b, count_B[b] + i)``. A live
    row emits one token per step; it ends after a stop token in ``stop_BX[b]`` (-1 = padding),
    after ``budget_B[b]`` more tokens, or (truncated) when its cache row is full. A token is fed
    to the cache only when the row goes on, so a stop token is never written.

    Returns (tokens [k, B], logp_sample [k, B], logp_policy [k, B], emitted [k, B] bool, the
    pending logits [S, V], the cache, alive [B]).
    """
    keys = jax.random.wrap_key_data(keys_B2)
    S, capacity = cache.lengths.shape[0], cache.capacity
    # on a CPU the layers run unrolled over weights split once per call (`split_layers`): a layer
    # scan copies every layer's weight slices out of the stacked arrays on every step
    layers = split_layers(params, config) if jax.default_backend() == "cpu" else None
    sub = KVCache(cache.k.at[:, rows_B, :window].get(mode="clip"), cache.v.at[:, rows_B, :window].get(mode="clip"),
                  cache.lengths.at[rows_B].get(mode="clip"))

    def body(carry, i):
        logits, sub, alive = carry
        tok, lps, lpp = sample_folded(logits, keys, count_B + i, temp_B, topk_B, topp_B, vocab_limit=vocab_limit)
        tok = jnp.where(alive, tok, 0)
        hit = jnp.any(tok[:, None] == stop_BX, axis=-1)
        feed = alive & ~hit & (i + 1 < budget_B) & (sub.lengths < capacity)
        new_logits, sub = extend(params, sub, tok[:, None], feed.astype(jnp.int32), config=config, layers=layers)
        logits = jnp.where(feed[:, None], new_logits, logits)
        return (logits, sub, feed), (tok, lps, lpp, alive)

    (logits, sub, alive), (tok, lps, lpp, emitted) = jax.lax.scan(
        body, (logits_SV.at[rows_B].get(mode="clip"), sub, alive_B), jnp.arange(steps, dtype=jnp.int32))
    rows = jnp.where(rows_B < S, rows_B, S)  # padding: out of range, dropped
    cache = KVCache(cache.k.at[:, rows, :window].set(sub.k, mode="drop"),
                    cache.v.at[:, rows, :window].set(sub.v, mode="drop"),
                    cache.lengths.at[rows].set(sub.lengths, mode="drop"))
    return tok, lps, lpp, emitted, logits_SV.at[rows].set(logits, mode="drop"), cache, alive


@functools.partial(jax.jit, static_argnames=("length",), donate_argnums=(0, 1))
def _copy_row(dst_k, dst_v, src_k, src_v, src_row, dst_row, *, length: int):
    """Copies positions [0, length) of row ``src_row`` of (src_k, src_v) into row ``dst_row`` of
    (dst_k, dst_v) (all [Ly, rows, C, K, H]); the destinations are updated in place."""
    Ly, _, _, K, H = src_k.shape
    out = []
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        piece = jax.lax.dynamic_slice(src, (0, src_row, 0, 0, 0), (Ly, 1, length, K, H))
        out.append(jax.lax.dynamic_update_slice(dst, piece, (0, dst_row, 0, 0, 0)))
    return tuple(out)


class GenerationEngine:
    """Decode lanes over a shared KV cache, filled by requests from any number of sessions.

    ``slots`` lanes decode together; ``park_rows`` more cache rows (device memory, not decoded)
    keep the prefixes of sessions that lost their lane while they waited for their user, so
    that sessions > slots still reuse their prefix: a parked row is copied back into a lane
    (a copy of its length, no model work) instead of being prefilled again. ``decode_steps``
    tokens are decoded per host round trip (rows that end on the way idle until the next).
    ``cache_sharding``: where the caches live on several devices (`engine_cache_sharding`).
    """

    def __init__(self, params: Params, config: QwenConfig, *, slots: int, capacity: int,
                 park_rows: int = 0, decode_steps: int = 8, vocab_limit: int | None = None,
                 place: Callable[[Params], Params] | None = None, cache_sharding: str = "replicated"):
        for name, value, lo in (("slots", slots, 1), ("park_rows", park_rows, 0), ("decode_steps", decode_steps, 1)):
            if not isinstance(value, int) or value < lo:
                raise ValueError(f"{name}={value!r}: expected an integer >= {lo}")
        # where the engine's copy of the weights lives: as given, or on this process's devices in a
        # multi-process run (`jaxagent.rollout.processes.ProcessGroup.local_params`)
        self.place = place or (lambda p: p)
        self.params, self.config = self.place(params), config
        self.slots, self.capacity, self.vocab_limit = slots, capacity, vocab_limit
        self.decode_steps = decode_steps
        self.kv_sharding = engine_cache_sharding(self.params, config, cache_sharding)
        self.cache = self._empty_cache(slots)
        self.logits = jnp.zeros((slots, config.vocab_size), jnp.float32)
        self.keys = np.zeros((slots, 2), np.uint32)  # each running row's request key data
        self.held: list[list[int]] = [[] for _ in range(slots)]  # tokens each lane's cache holds
        self.owner: list[str | None] = [None] * slots
        self.lru: OrderedDict[str, int] = OrderedDict()  # idle sessions -> lane, in the order they went idle
        self.running: list[_Request | None] = [None] * slots
        self.pending: list[_Request] = []
        # One more row than parked prefixes: the spare one through which two prefixes trade places.
        self.park = self._empty_cache(park_rows + 1) if park_rows else None
        self.spare = park_rows
        self.parked: OrderedDict[str, tuple[int, list[int]]] = OrderedDict()  # session -> (row, tokens)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        # Admission bookkeeping (see the module docstring): engine calls completed, the call after
        # which each session that has not come back got its result, releases not applied yet.
        self._boundary = 0
        self._delivered: dict[str, int] = {}
        self._awaited: Counter[int] = Counter()  # boundary -> sessions in _delivered with it (the settle's test)
        self._deferred: list[tuple[str, int]] = []
        self._seq = 0
        self._stepping = False
        self._cancelled = False  # a request was cancelled since the last boundary
        self.version = 0  # the policy version of ``params`` (`set_params`, `publish`)
        self._next: tuple[Params, int] | None = None  # weights `publish`ed, applied at a call boundary
        self.reset_stats()

    def reset_stats(self) -> None:
        self.stats = {"prefill_tokens": 0, "decode_steps": 0, "device_s": 0.0, "engine_calls": 0,
                      "parked": 0, "restored": 0}

    def _empty_cache(self, rows: int) -> KVCache:
        """An empty cache of ``rows`` rows, made where it lives (no full copy on one device first)."""
        if self.kv_sharding is None:
            return init_cache(self.config, rows, self.capacity)
        from jax.sharding import NamedSharding, PartitionSpec

        kv, rep = self.kv_sharding, NamedSharding(self.kv_sharding.mesh, PartitionSpec())
        make = functools.partial(init_cache, self.config, rows, self.capacity)
        return jax.jit(make, out_shardings=KVCache(kv, kv, rep))()

    # ------------------------------------------------------------------ public
    def warmup(self) -> None:
        """Compiles every shape the engine can meet (prefill lengths, attention windows, row
        copies) before any session uses it, so that no compilation lands inside a timed run.
        The calls are no-ops on the engine's state (no row is admitted or alive)."""
        if any(self.owner) or self.parked:
            raise RuntimeError("warmup: expected an engine no session has used yet")
        S = self.slots
        sizes = sorted({_bucket(1 << i, _MIN_PREFILL, self.capacity) for i in range(self.capacity.bit_length())})
        windows = sorted({_bucket(n, 64, self.capacity) for n in sizes})
        for A in sorted({_bucket(n, 1, S) for n in range(1, S + 1)}):
            rows = np.full(A, S, np.int32)  # all padding: nothing is written
            for T in sizes:
                for W in (w for w in windows if w >= T):
                    self.logits, self.cache = _prefill(
                        self.params, self.cache, rows, np.zeros((A, T), np.int32), np.zeros(A, np.int32),
                        np.zeros(A, np.int32), self.logits, config=self.config, window=W)
        for B in sorted({_bucket(n, 1, S) for n in range(1, S + 1)}):
            z, stop = np.zeros(B, np.int32), np.full((B, 4), -1, np.int32)
            for W in windows:
                out = _decode(self.params, self.cache, self.logits, np.full(B, S, np.int32), self.keys[:B], z, z,
                              np.zeros(B, np.float32), z, np.ones(B, np.float32), stop, np.zeros(B, bool),
                              config=self.config, vocab_limit=self.vocab_limit, steps=self.decode_steps, window=W)
                self.logits, self.cache = out[4], out[5]
        if self.park is not None:
            for n in sorted({_bucket(n, 16, self.capacity) for n in sizes}):
                k, v = _copy_row(self.park.k, self.park.v, self.cache.k, self.cache.v, 0, 0, length=n)
                self.park = self.park._replace(k=k, v=v)
                k, v = _copy_row(self.cache.k, self.cache.v, self.park.k, self.park.v, 0, 0, length=n)
                self.cache = self.cache._replace(k=k, v=v)
        jax.block_until_ready(self.cache)

    async def generate(self, session: str, prompt: list[int], sampling: SamplingParams,
                       key: jax.Array | np.ndarray, *, on_tokens: Callable[[list[int], list[float]], None] | None = None) -> EngineResult:
        """Generates a continuation of ``prompt`` (the session's whole conversation so far),
        sampling with ``key`` (a typed key, or its `jax.random.key_data` as a [2] uint32 array).

        ``on_tokens`` (streaming) is called on the event loop after every engine call that gave
        the request new tokens, with those tokens and their log-probabilities under the policy
        (``logp_policy``), before the result is set. Cancelling the
        awaiting task cancels the request: at the next call boundary its lane is freed (its
        session keeps the prefix it reached, for a later turn) and nothing more is decoded for it."""
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
        data = key if isinstance(key, np.ndarray) else jax.random.key_data(key)  # raw data: no device call
        req = _Request(session, list(prompt), sampling, np.asarray(data, np.uint32),
                       loop.create_future(), ready=self._take_delivered(session) + 1, seq=self._seq,
                       on_tokens=on_tokens)
        self._seq += 1
        self.pending.append(req)
        self._wake.set()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.future.cancel()  # the engine drops it at the next call boundary (`_drop_cancelled`)
            self._cancelled = True
            if self._wake is not None:
                self._wake.set()
            raise

    def set_params(self, params: Params, version: int = 0) -> None:
        """New policy weights (after an update): every cached prefix was computed with the old
        ones, so all lanes and park rows are forgotten. Only between batches of requests (for an
        update while episodes run, `publish`). ``version``: the policy version results are tagged
        with from now on (`EngineResult.version`; RL passes the number of updates made, so a
        resumed run tags its turns as the uninterrupted one did)."""
        if any(r is not None for r in self.running) or self.pending:
            raise RuntimeError("set_params: requests are in flight; call it between rollout batches")
        self._next = None
        self._apply_params(params, int(version))

    def publish(self, params: Params, version: int) -> None:
        """New weights while requests run (asynchronous RL's partial rollouts; call it on the
        engine's event loop): no request is admitted until the running ones have finished their
        turn with the weights that began it, then the weights change at that call boundary, every
        cached prefix is forgotten (a session's next turn is prefilled under the new weights) and
        the requests that waited are admitted. So each result comes from one version. A later
        `publish` before the change replaces the weights it waits to apply."""
        self._next = (params, int(version))
        if self._task is None or self._task.done():
            if not any(r is not None for r in self.running) and not self.pending:
                self._apply_params(*self._next)
                self._next = None
        elif self._wake is not None:
            self._wake.set()

    def _apply_params(self, params: Params, version: int) -> None:
        self.params = self.place(params)
        self.version = version
        self.owner = [None] * self.slots
        self.held = [[] for _ in range(self.slots)]
        self.lru.clear()
        self.parked.clear()
        self._delivered.clear()
        self._awaited.clear()
        self._deferred.clear()

    def release(self, session: str) -> None:
        """Forgets a finished session's cache contents (its lane or parked row becomes free): at
        once, or, while an engine call runs or before the session has had one call to come back
        in, when the next call starts (see the module docstring)."""
        delivered = self._take_delivered(session)
        serving = self._task is not None and not self._task.done()
        if self._stepping or (serving and delivered >= self._boundary):
            self._deferred.append((session, delivered))
        else:
            self._forget(session)

    def _forget(self, session: str) -> None:
        slot = self.lru.pop(session, None)
        if slot is not None:
            self.owner[slot] = None
        self.parked.pop(session, None)

    # ------------------------------------------------------------------ scheduling
    def _deliver(self, session: str) -> None:
        """Notes that ``session`` got its result at the current boundary."""
        self._take_delivered(session)
        self._delivered[session] = self._boundary
        self._awaited[self._boundary] += 1

    def _take_delivered(self, session: str) -> int:
        """The boundary at which ``session`` got its last result (-1: none since it came back)."""
        b = self._delivered.pop(session, None)
        if b is None:
            return -1
        self._awaited[b] -= 1
        if not self._awaited[b]:
            del self._awaited[b]
        return b

    async def _settle(self) -> None:
        """Gives the sessions that got their result one call ago a bounded number of event-loop
        turns to come back (a next request or a release) before the next admission."""
        for _ in range(_SETTLE_TURNS):
            if not self._awaited.get(self._boundary - 1):  # O(1): a count, not a scan of every session
                return
            await asyncio.sleep(0)

    def _drop_cancelled(self) -> None:
        """Requests whose caller went away (a cancelled future, or a failed ``on_tokens``): a pending one is forgotten; a
        running one frees its lane, which keeps the tokens its cache holds (the prompt and every
        token decoded so far were all written: the row was still alive), so the session's next
        turn reuses them."""
        if self._cancelled:  # only a cancelled caller ends a pending request's future (no scan otherwise)
            self.pending = [r for r in self.pending if not r.future.done()]
            self._cancelled = False
        for s, req in enumerate(self.running):
            if req is not None and req.future.done():  # cancelled, or its on_tokens failed
                self.held[s] = req.prompt + req.out
                self.running[s] = None
                self.lru[req.session] = s

    def _apply_releases(self) -> None:
        due = [s for s, b in self._deferred if b < self._boundary]
        self._deferred = [(s, b) for s, b in self._deferred if b >= self._boundary]
        for session in due:
            self._forget(session)

    def _admit(self) -> list[_Request]:
        """Assigns lanes to pending requests that may be admitted at this boundary, in the order
        (boundary they became admissible, arrival) (host bookkeeping only; copies happen in
        `_step`)."""
        admitted = []
        idle = sum(r is None for r in self.running)  # every way in below takes a lane that runs nothing
        if not idle:
            return admitted
        # the first few in order, without sorting every request that waits (seq is unique: no ties)
        due = [(r.ready, r.seq, r) for r in self.pending if r.ready <= self._boundary]
        heapq.heapify(due)
        while due and idle:
            req = heapq.heappop(due)[2]
            slot = next((s for s in range(self.slots) if self.owner[s] == req.session
                         and self.running[s] is None), None)
            if slot is None:
                slot = next((s for s in range(self.slots) if self.owner[s] is None), None)
            if slot is None and self.lru:
                # Take the lane of the session that went idle last: idle sessions wait for their
                # users about equally long, so the one idle longest is the one coming back soonest.
                victim, slot = self.lru.popitem(last=True)
                req.evicts = victim
            if slot is None:
                continue
            self.lru.pop(req.session, None)
            req.own_lane = self.owner[slot] == req.session
            self.owner[slot] = req.session
            req.slot = slot
            self.running[slot] = req
            self.pending.remove(req)
            admitted.append(req)
            idle -= 1
        return admitted

    def _swap(self, req: _Request) -> None:
        """Before an admitted request's prefill: parks the prefix of the session whose lane it
        took, and brings back its own parked prefix (device copies, no model work)."""
        if req.own_lane:
            return
        slot = req.slot
        restore = self.parked.pop(req.session, None)
        victim = self.held[slot] if req.evicts is not None and self.park is not None else []
        self.held[slot] = []
        if victim and restore is not None:
            # Trade places through the spare row: the victim goes to the spare row, the restored
            # prefix comes into the lane, and its old park row becomes the spare one.
            row, tokens = restore
            n = _bucket(len(victim), 16, self.capacity)
            k, v = _copy_row(self.park.k, self.park.v, self.cache.k, self.cache.v, slot, self.spare, length=n)
            self.park = self.park._replace(k=k, v=v)
            self.parked[req.evicts] = (self.spare, victim)
            self.spare = row
            self.stats["parked"] += 1
            victim = []
        if victim:
            rows = self.park.k.shape[1]
            if len(self.parked) >= rows - 1:
                self.parked.popitem(last=False)  # drop the oldest parked prefix
            used = {r for r, _ in self.parked.values()} | {self.spare}
            row = next(r for r in range(rows) if r not in used)
            n = _bucket(len(victim), 16, self.capacity)
            k, v = _copy_row(self.park.k, self.park.v, self.cache.k, self.cache.v, slot, row, length=n)
            self.park = self.park._replace(k=k, v=v)
            self.parked[req.evicts] = (row, victim)
            self.stats["parked"] += 1
        if restore is not None:
            row, tokens = restore
            n = _bucket(len(tokens), 16, self.capacity)
            k, v = _copy_row(self.cache.k, self.cache.v, self.park.k, self.park.v, row, slot, length=n)
            self.cache = self.cache._replace(k=k, v=v)
            self.held[slot] = tokens
            self.stats["restored"] += 1

    def _step(self, admitted: list[_Request]):
        """One engine call (runs in a worker thread): prefill the admitted rows, then decode
        ``decode_steps`` tokens for every running row."""
        S = self.slots
        if admitted:
            for req in admitted:
                self._swap(req)
            A = _bucket(len(admitted), 1, S)
            rows = np.full(A, S, np.int32)  # padding rows: out of range (see `_prefill`)
            rollback = np.zeros(A, np.int32)
            n_new = np.zeros(A, np.int32)
            news = []
            for a, req in enumerate(admitted):
                held = self.held[req.slot]
                lcp = 0
                for x, y in zip(held, req.prompt):
                    if x != y:
                        break
                    lcp += 1
                lcp = min(lcp, len(req.prompt) - 1)  # prefill at least one token for its logits
                rows[a], rollback[a] = req.slot, lcp
                news.append(req.prompt[lcp:])
                n_new[a] = len(news[-1])
                req.prefill_tokens = int(n_new[a])
                self.keys[req.slot] = req.key
            T = _bucket(int(n_new.max()), _MIN_PREFILL, self.capacity)
            window = _bucket(int((rollback + n_new).max()), 64, self.capacity)
            toks = np.zeros((A, T), np.int32)
            for a, new in enumerate(news):
                toks[a, : len(new)] = new
            # numpy in: jit transfers it with the call (jnp.asarray would compile a staging op per new shape)
            self.logits, self.cache = _prefill(self.params, self.cache, rows, toks, n_new, rollback, self.logits,
                                               config=self.config, window=window)
            self.stats["prefill_tokens"] += int(n_new.sum())
        run = [(s, r) for s, r in enumerate(self.running) if r is not None]
        k = self.decode_steps  # fixed: rows that end on the way idle until the call returns
        longest = max(len(r.prompt) + len(r.out) for _, r in run)
        window = _bucket(longest + k, 64, self.capacity)
        X = max(len(r.sampling.stop_tokens) for _, r in run)
        B = _bucket(len(run), 1, S)  # the running rows only, padded to a power of two (few shapes)
        rows = np.full(B, S, np.int32)
        keys = np.zeros((B, 2), np.uint32)
        stop = np.full((B, _bucket(max(X, 1), 4, 1 << 20)), -1, np.int32)
        count = np.zeros(B, np.int32)
        budget = np.zeros(B, np.int32)
        temp = np.zeros(B, np.float32)
        topk = np.zeros(B, np.int32)
        topp = np.ones(B, np.float32)
        alive = np.zeros(B, bool)
        for b, (s, r) in enumerate(run):
            sp = r.sampling
            rows[b], keys[b] = s, self.keys[s]
            stop[b, : len(sp.stop_tokens)] = sp.stop_tokens
            count[b], budget[b] = len(r.out), sp.max_new_tokens - len(r.out)
            temp[b], topk[b], topp[b], alive[b] = sp.temperature, sp.top_k, sp.top_p, True
        tok, lps, lpp, emitted, self.logits, self.cache, still = _decode(
            self.params, self.cache, self.logits, rows, keys, count, budget, temp, topk, topp, stop, alive,
            config=self.config, vocab_limit=self.vocab_limit, steps=k, window=window)
        tok, lps, lpp, emitted, still = (np.asarray(x) for x in (tok, lps, lpp, emitted, still))
        self.stats["decode_steps"] += k
        self.stats["engine_calls"] += 1
        finished = []
        for b, (s, req) in enumerate(run):
            n = int(emitted[:, b].sum())
            req.out.extend(tok[:n, b].tolist())
            req.lps.extend(lps[:n, b].tolist())
            req.lpp.extend(lpp[:n, b].tolist())
            if not still[b]:
                stop_hit = req.out[-1] in req.sampling.stop_tokens
                truncated = not stop_hit and len(req.out) < req.sampling.max_new_tokens
                self.held[s] = req.prompt + req.out[:-1]  # the last token is never written
                finished.append((req, stop_hit, truncated))
                self.running[s] = None
        return finished

    def _tell(self, finished: list[_Request]) -> None:
        """Streaming: passes each request's tokens decoded by the call that just returned to its
        ``on_tokens`` (running and just finished requests alike; a callback's error fails only its
        own request)."""
        for req in list(self.running) + finished:
            if req is None or req.on_tokens is None or req.told >= len(req.out) or req.future.done():
                continue
            new, lpp, req.told = req.out[req.told:], req.lpp[req.told:], len(req.out)
            try:
                req.on_tokens(new, lpp)
            except Exception as e:
                req.future.set_exception(e)

    async def _run(self):
        try:
            await self._serve()
        except BaseException as e:  # a failed step fails every request it holds, never hangs them
            for req in [r for r in self.running if r is not None] + self.pending:
                if not req.future.done():
                    req.future.set_exception(RuntimeError(f"generation engine failed: {type(e).__name__}: {e}"))
            self.running = [None] * self.slots
            self.pending = []
            self.owner = [None] * self.slots
            self.lru.clear()
            self.parked.clear()
            self._delivered.clear()
            self._awaited.clear()
            self._deferred.clear()
            self._stepping = False
            self.held = [[] for _ in range(self.slots)]
            self.cache = self._empty_cache(self.slots)  # a failed call may have consumed it
            self.logits = jnp.zeros((self.slots, self.config.vocab_size), jnp.float32)
            if not isinstance(e, Exception):
                raise

    async def _serve(self):
        loop = asyncio.get_running_loop()
        while True:
            await self._settle()
            self._drop_cancelled()
            self._apply_releases()
            if self._next is not None and not any(r is not None for r in self.running):
                self._apply_params(*self._next)  # `publish`: the running turns have all finished
                self._next = None
            admitted = self._admit() if self._next is None else []
            if not admitted and not any(self.running):
                if self.pending:  # nothing runs and what waits is due at the next boundary: it is now
                    self._boundary += 1
                    continue
                self._wake.clear()
                await self._wake.wait()
                continue
            t0 = loop.time()
            self._stepping = True
            try:
                finished = await loop.run_in_executor(None, self._step, admitted)
            finally:
                self._stepping = False
            self.stats["device_s"] += loop.time() - t0
            self._boundary += 1
            self._tell([req for req, _, _ in finished])
            for req, stop, truncated in finished:
                self.lru[req.session] = req.slot
                self._deliver(req.session)
                if not req.future.done():
                    req.future.set_result(EngineResult(req.out, req.lpp, req.lps, stop, truncated,
                                                       req.prefill_tokens, self.version))

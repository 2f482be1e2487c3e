"""An OpenAI-compatible HTTP server over the in-flight `GenerationEngine` (host code).

`PolicyServer` turns validated requests (`jaxagent.serve.protocol`) into engine requests and
engine tokens into OpenAI responses; `make_app` puts it behind Starlette routes
(``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``)
with server-sent events for ``stream: true`` (sse-starlette); `serve` runs it under uvicorn.

- **Batching.** Every choice of every request is one engine request: concurrent clients decode
  together in the engine's lanes (continuous batching), not one after another.
- **Prefix reuse.** A finished choice leaves its session's tokens in the engine's cache; a later
  request whose prompt shares at least `MIN_REUSE` leading tokens with an idle session's takes
  that session (the longest shared prefix wins), so the next turn of a conversation prefills only
  its new messages (`SessionIndex`).
- **Rendering.** Chats are rendered with the tokenizer's chat template and the request's tools
  (`jaxagent.text.chat.ChatRenderer`, as rollouts render them); Qwen ``<tool_call>`` blocks come
  back as OpenAI ``tool_calls`` and a ``<think>`` block as ``reasoning_content``, never in
  ``content``.
- **Limits.** A body over ``max_body_bytes`` gets 413 (by its Content-Length before anything is
  read, else as soon as the bytes read pass it). At most ``slots + max_queue`` choices are in
  flight: past that a request gets 429 with ``Retry-After`` (400 when the request alone holds more
  choices than that: it could never be admitted); a request that runs past ``request_timeout_s``
  is cancelled and answered 504 (an ``error`` event when streaming); with an API key every ``/v1``
  route wants ``Authorization: Bearer <key>`` (401 otherwise).
- **A free event loop.** The engine is only touched from the event loop; the body's JSON, the
  request's validation, the chat template and the tokenisation run in a small thread pool
  (`PolicyServer.offload`; a Hugging Face tokenizer encodes through its GIL-releasing batch call),
  so ``/health`` and other clients are answered while a large prompt is prepared. A prompt whose
  UTF-8 bytes alone prove it cannot fit the context (more than ``capacity`` times the longest
  token's bytes, times the most the tokenizer's normaliser can shrink a text) is refused 400
  before it is tokenised.
- **Hang-ups.** A non-streamed request whose client disconnects is cancelled in the engine (its
  lanes freed at the next engine call), as a stream's is when its client goes.
- **Shutdown.** `uvicorn_server` drains: on SIGINT/SIGTERM it stops accepting, new requests get
  503, and in-flight ones get ``shutdown_timeout_s`` to finish (counted ``drained``); then every
  remaining one is aborted by the server itself (`PolicyServer.abort_all`, counted ``aborted``): a
  stream ends with an ``error`` event (``code: server_shutdown``) and ``[DONE]``, a non-streamed
  request gets a JSON 503. uvicorn's own deadline (and sse-starlette's grace) is
  `DRAIN_MARGIN_S` later, a backstop that cancels nothing in a normal drain.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hmac
import inspect
import json
import os
import socket
import sys
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.serve.protocol import APIError, ChatRequest, CompletionRequest, Sampling, parse_chat, parse_completion
from jaxagent.serve.streaming import TextStream, visible
from jaxagent.text.chat import ChatInputError, ChatRenderer, ChatTemplateError
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.text.toolcalls import THINK_START, parse_assistant

__all__ = ["DRAIN_MARGIN_S", "MIN_REUSE", "PolicyServer", "ServeSettings", "ServerThread", "SessionIndex", "bind",
           "make_app", "request_key_data", "serve", "splitmix64", "uvicorn_server"]

#: the fewest shared leading tokens for which a request takes over an idle session's cache
MIN_REUSE = 16
#: seconds past ``shutdown_timeout_s`` that uvicorn (and sse-starlette) wait before cancelling
#: handler tasks themselves: the server's own drain ends every request before then
DRAIN_MARGIN_S = 5.0


_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment


def splitmix64(state: int, i: int) -> int:
    """The ``i``-th output (i >= 1) of SplitMix64 started at ``state`` (both taken mod 2**64)."""
    z = (state + i * _GAMMA) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def request_key_data(seed: int, n: int) -> np.ndarray:
    """[n, 2] uint32: the key data (`jax.random.key_data` layout) of a request's ``n`` choices,
    SplitMix64's outputs 1..n from ``seed`` split into high and low words. On the host: microseconds
    a request, where deriving them with eager `jax.random` ops (key, fold_in, split, key_data) cost
    ~0.7 ms on a CPU; the engine folds each token's index into its key with threefry, on the device."""
    out = np.empty((n, 2), np.uint32)
    for j in range(n):
        z = splitmix64(seed, j + 1)
        out[j] = z >> 32, z & 0xFFFFFFFF
    return out


# ----------------------------------------------------------------------------- tokenizer facts
#: the most a Unicode normaliser (NFC, NFKC, NFD, NFKD) can shrink a text's UTF-8 bytes: a
#: composition takes at most 4 code points into one (Hangul L+V+T, 9 bytes -> 3; a base and its
#: marks) and a compatibility mapping at most 4 bytes into 1 ("\U0001d400" -> "A")
NORMALISER_SHRINK = 4
_NORMALISERS = frozenset({"NFC", "NFKC", "NFD", "NFKD"})
_PRE_TOKENIZERS = frozenset({"ByteLevel", "Split", "Digits", "Punctuation"})  # none of them drops text


@dataclasses.dataclass(frozen=True)
class TokenFacts:
    """What the server needs to know of a tokenizer to prepare prompts off the event loop.

    ``encode``: `Tokenizer.encode`, or the same ids through the Hugging Face backend's batch call,
    which releases the GIL (the single-text call holds it: a 4 MB text froze every other thread
    for ~5 s). ``bytes_per_token``: a sound bound, the most UTF-8 bytes any one token stands for
    times what the normaliser can shrink a text, so that a text of ``B`` bytes is at least
    ``B / bytes_per_token`` tokens; None where no such bound is known (a normaliser or
    pre-tokenizer that may drop text, a tokenizer that is not a byte-level BPE)."""

    encode: Callable[[str], list[int]]
    bytes_per_token: int | None
    releases_gil: bool = False  # ``encode`` is the backend's batch call


_FACTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_facts(tok: Tokenizer) -> TokenFacts:
    """`TokenFacts` of ``tok`` (computed once per tokenizer: one batched decode of the vocabulary)."""
    try:
        facts = _FACTS.get(tok)
    except TypeError:  # not weakly referable: not cached
        return _token_facts(tok)
    if facts is None:
        facts = _FACTS[tok] = _token_facts(tok)
    return facts


def _token_facts(tok: Tokenizer) -> TokenFacts:
    bt = getattr(getattr(tok, "backend", None), "backend_tokenizer", None)
    if getattr(tok, "kind", None) != "hf" or bt is None or not hasattr(bt, "encode_batch"):
        return TokenFacts(tok.encode, None, False)

    def batched(text: str) -> list[int]:
        if not isinstance(text, str):
            return tok.encode(text)  # its error
        return bt.encode_batch([text], add_special_tokens=False)[0].ids if text else []

    probes = ["a", "\na", " hello  world\n\n", "caf\u00e9 \u00fc\u00df \U0001f600", "<|im_start|>user\nhi<|im_end|>\n"]
    try:
        same = all(batched(t) == tok.encode(t) for t in probes)  # false: tok.encode rewrites (a prefix space)
    except Exception:
        same = False
    encode = batched if same else tok.encode
    try:
        decoder = json.loads(bt.decoder.__getstate__()) if bt.decoder is not None else {}
        normaliser = json.loads(bt.normalizer.__getstate__()) if bt.normalizer is not None else None
        pre = json.loads(bt.pre_tokenizer.__getstate__()) if bt.pre_tokenizer is not None else None
    except Exception:
        return TokenFacts(encode, None, same)

    def parts(spec, key):
        return [] if spec is None else spec.get(key, []) if spec.get("type") == "Sequence" else [spec]

    norms = [n.get("type") for n in parts(normaliser, "normalizers")]
    pres = parts(pre, "pretokenizers")
    if decoder.get("type") != "ByteLevel" or not set(norms) <= _NORMALISERS \
            or not all(x.get("type") in _PRE_TOKENIZERS and x.get("behavior") != "Removed" for x in pres):
        return TokenFacts(encode, None, same)
    texts = bt.decode_batch([[i] for i in range(tok.vocab_size)], skip_special_tokens=False)
    # a token ending inside a character decodes to U+FFFD (3 bytes): never fewer bytes than it holds
    longest = max((len(t.encode("utf-8", "surrogatepass")) for t in texts), default=1)
    return TokenFacts(encode, max(longest, 1) * (NORMALISER_SHRINK if norms else 1), same)


class _EncodeVia:
    """``tok`` with another ``encode`` (the same ids, another call): what the chat renderer reads."""

    def __init__(self, tok: Tokenizer, encode: Callable[[str], list[int]]):
        self._tok, self._encode = tok, encode

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._encode(text)]

    def __getattr__(self, name: str):
        return getattr(self._tok, name)


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """What the server answers with (the job builds it from ``serve.*``)."""

    model_name: str
    max_tokens: int = 512  # a request without max_tokens: this, or the room left in its cache row
    max_n: int = 8
    max_queue: int = 64  # choices waiting for a lane beyond the engine's slots, before 429
    retry_after_s: int = 1
    request_timeout_s: float = 600.0
    api_key: str | None = None
    seed: int = 0  # the key stream of requests without a seed
    max_body_bytes: int = 4 * 2**20  # a larger request body is answered 413

    def __post_init__(self):
        for name, lo in (("max_tokens", 1), ("max_n", 1), ("max_queue", 0), ("retry_after_s", 0),
                         ("max_body_bytes", 1024)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise ValueError(f"ServeSettings.{name}={value!r}: expected an integer >= {lo}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"ServeSettings.request_timeout_s={self.request_timeout_s!r}: expected a number > 0")
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError(f"ServeSettings.model_name={self.model_name!r}: expected a non-empty name")


class SessionIndex:
    """The engine sessions the server has used, and the tokens each one's cache holds.

    ``acquire(prompt)`` returns the idle session sharing the longest prefix with ``prompt`` (at
    least `MIN_REUSE` tokens, or the whole of a shorter prompt), else a new one; ``release``
    records what a session's cache now holds. At most ``capacity`` idle sessions are kept (the
    engine's lanes and park rows); the oldest beyond that are forgotten and ``forget`` is called
    so that the engine frees them too."""

    def __init__(self, capacity: int, forget: Callable[[str], None]):
        self.capacity, self.forget = capacity, forget
        self.idle: OrderedDict[str, np.ndarray] = OrderedDict()  # oldest first
        self.count = 0
        self.reused = 0

    @staticmethod
    def shared(a: np.ndarray, b: np.ndarray) -> int:
        m = min(len(a), len(b))
        diff = np.flatnonzero(a[:m] != b[:m])
        return int(diff[0]) if diff.size else m

    def acquire(self, prompt: list[int]) -> str:
        p = np.asarray(prompt, np.int64)
        best, best_n = None, 0
        for session, held in self.idle.items():
            n = self.shared(held, p)
            if n > best_n:
                best, best_n = session, n
        if best is not None and best_n >= min(MIN_REUSE, len(p)):
            del self.idle[best]
            self.reused += 1
            return best
        self.count += 1
        return f"serve-{self.count}"

    def release(self, session: str, tokens: list[int]) -> None:
        self.idle[session] = np.asarray(tokens, np.int64)
        self.idle.move_to_end(session)
        while len(self.idle) > self.capacity:
            old, _ = self.idle.popitem(last=False)
            self.forget(old)


@dataclasses.dataclass
class _Choice:
    """One choice's outcome."""

    index: int
    tokens: list[int]
    logps: list[float]
    text: str  # the generation's text (stop token dropped, cut at a stop string)
    finish_reason: str


class PolicyServer:
    """Requests in, OpenAI responses out, over one `GenerationEngine` (all on one event loop)."""

    def __init__(self, engine: GenerationEngine, tokenizer: Tokenizer, settings: ServeSettings, *,
                 template: str | None = None):
        self.engine, self.tok, self.settings, self.template = engine, tokenizer, settings, template
        park = engine.park.k.shape[1] - 1 if engine.park is not None else 0
        self.sessions = SessionIndex(engine.slots + park, engine.release)
        self.inflight = 0  # choices admitted and not finished
        self.preparing = 0  # requests whose body is being received or prompt prepared (not admitted yet)
        self.closing = False  # draining: new requests get 503
        self.aborting = False  # the drain's deadline passed: what is in flight is being ended
        self.requests = 0
        # requests (admitted) = served + drained + aborted + disconnected + timeouts + errors
        self.stats = {"requests": 0, "choices": 0, "prompt_tokens": 0, "completion_tokens": 0, "rejected_429": 0,
                      "rejected_413": 0, "timeouts": 0, "errors": 0, "served": 0, "drained": 0, "aborted": 0,
                      "disconnected": 0}
        self._stop_ids = frozenset(tokenizer.eos_token_ids)
        facts = token_facts(tokenizer)
        self._encode = facts.encode
        self._render_tok = _EncodeVia(tokenizer, facts.encode) if facts.releases_gil else tokenizer
        # a text with more UTF-8 bytes than this cannot fit a lane (None: no sound bound known)
        self._text_bytes_limit = engine.capacity * facts.bytes_per_token if facts.bytes_per_token else None
        self._runs: set[asyncio.Future] = set()  # the choices of every admitted request, gathered
        self._aborted: asyncio.Future | None = None  # set by `abort_all`: what is still being prepared ends
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.drain_s = 30.0  # set by `uvicorn_server`: the drain's deadline

    # ------------------------------------------------------------------ checks
    def authorize(self, header: str | None) -> None:
        key = self.settings.api_key
        if key is None:
            return
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(401, "missing or wrong API key: expected the header 'Authorization: Bearer <key>'",
                           type="invalid_request_error", code="invalid_api_key")

    def check_model(self, model: str) -> None:
        if model != self.settings.model_name:
            raise APIError(404, f"model={model!r}: this server serves {self.settings.model_name!r}", param="model",
                           code="model_not_found")

    def _admit(self, prompts: int, n: int) -> None:
        """Refuses a request of ``prompts`` prompts with ``n`` choices each that cannot be admitted:
        503 while shutting down, 400 when it alone holds more choices than the server ever holds,
        429 (retry later) when the queue is full now."""
        if self.closing:
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        room = self.engine.slots + self.settings.max_queue
        if prompts * n > room:
            field = "prompt" if prompts > 1 and (n == 1 or prompts > room) else "n"
            what = f"{prompts} prompts x n={n}" if prompts > 1 else f"n={n}"
            raise APIError(400, f"{field}: {what} = {prompts * n} choices; expected at most {room} (the server holds "
                           f"{self.engine.slots} decoding + {self.settings.max_queue} waiting), so this request "
                           "could never be admitted", param=field, code="too_many_choices")
        if self.inflight + prompts * n > room:
            self.stats["rejected_429"] += 1
            raise APIError(429, f"the queue is full ({self.inflight} choices in flight, room for "
                           f"{self.engine.slots} decoding + {self.settings.max_queue} waiting); retry later",
                           type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(self.settings.retry_after_s)})

    # ------------------------------------------------------------------ prompts
    def check_text_fits(self, texts, field: str) -> None:
        """400 ``context_length_exceeded`` when ``texts`` (pieces of one prompt, each tokenised on
        its own) hold more UTF-8 bytes than a lane's tokens can: refused before any tokenising."""
        limit = self._text_bytes_limit
        if limit is None:
            return
        chars = sum(len(t) for t in texts)
        if 4 * chars <= limit:  # at most 4 bytes a character: cannot be over
            return
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        if size > limit:
            raise APIError(400, f"{field}: {size:,} bytes of text, more than a context of {self.engine.capacity} "
                           f"tokens can hold (rollout.capacity={self.engine.capacity}; a token of this tokenizer is "
                           f"at most {limit // self.engine.capacity} bytes of text); expected a shorter prompt",
                           param=field, code="context_length_exceeded")

    def render_chat(self, req: ChatRequest) -> tuple[list[int], bool]:
        """(prompt ids, whether the prompt leaves a thinking block open)."""
        # the contents a template writes as they are (an assistant's may be rewritten: thinking dropped)
        self.check_text_fits([m["content"] for m in req.messages if m.get("role") in ("system", "user", "tool")
                              and isinstance(m.get("content"), str)], "messages")
        try:
            r = ChatRenderer(self._render_tok, self.template, tools=list(req.tools) or None,
                             template_kwargs=req.template_kwargs)
            r.add(*req.messages)
            prompt = r.start_generation()
        except ChatTemplateError as e:
            raise APIError(400, f"the chat could not be rendered with the model's chat template: {e}",
                           param="tools" if req.tools and "tools" in str(e) else "messages") from None
        except ChatInputError as e:
            raise APIError(400, f"messages: {e}", param="messages") from None
        tail = self.tok.decode(prompt[-4:]).rstrip()
        return prompt, tail.endswith(THINK_START)

    def _max_new(self, prompt: list[int], s: Sampling, field: str) -> int:
        room = self.engine.capacity - len(prompt) + 1
        if room < 1:
            raise APIError(400, f"{field}: {len(prompt)} prompt tokens; expected at most {self.engine.capacity - 1} "
                           f"(the server's context, rollout.capacity={self.engine.capacity})", param=field,
                           code="context_length_exceeded")
        if s.max_tokens is None:
            return min(self.settings.max_tokens, room)
        if s.max_tokens > room:
            raise APIError(400, f"max_tokens={s.max_tokens}: expected at most {room} ({len(prompt)} prompt tokens in a "
                           f"context of {self.engine.capacity})", param="max_tokens", code="context_length_exceeded")
        return s.max_tokens

    def _keys(self, s: Sampling) -> np.ndarray:
        """[n, 2] uint32: the request's choices' key data, from its seed or, without one, from the
        server's ``seed`` and the request's number."""
        if s.seed is None:
            self.requests += 1
            return request_key_data(splitmix64(self.settings.seed, self.requests), s.n)
        return request_key_data(s.seed, s.n)

    # ------------------------------------------------------------------ generation
    async def _generate(self, index: int, prompt: list[int], sampling: SamplingParams, key, stream: TextStream,
                        on_delta: Callable[[int, str, str], None] | None) -> _Choice:
        """One choice: an engine request whose tokens go through ``stream`` (a stop string
        cancels it at the next engine call)."""
        tokens: list[int] = []
        logps: list[float] = []
        task: asyncio.Future | None = None

        def on_tokens(new: list[int], lpp: list[float]) -> None:
            tokens.extend(new)
            logps.extend(lpp)
            body = tokens[:-1] if tokens and tokens[-1] in self._stop_ids else tokens
            r, c = stream.feed(self.tok.decode(body))
            if on_delta is not None and (r or c):
                on_delta(index, r, c)
            if stream.stopped and task is not None:
                task.cancel()

        session = self.sessions.acquire(prompt)
        task = asyncio.ensure_future(self.engine.generate(session, prompt, sampling, key, on_tokens=on_tokens))
        try:
            result = await task
            finish = "stop" if result.stopped else "length"
        except asyncio.CancelledError:
            if not stream.stopped or asyncio.current_task().cancelling():
                raise
            finish = "stop"  # a stop string
        finally:
            if not task.done():
                task.cancel()
            self.sessions.release(session, prompt + tokens)
        if not stream.stopped:  # the whole text: what was held back (a partial marker) is shown now
            body = tokens[:-1] if tokens and tokens[-1] in self._stop_ids else tokens
            r, c = stream.feed(self.tok.decode(body), final=True)
            if on_delta is not None and (r or c):
                on_delta(index, r, c)
            if stream.stopped:
                finish = "stop"
        return _Choice(index, tokens, logps, stream.text, finish)

    async def _run(self, prompts: list[tuple[list[int], bool]], s: Sampling, *, tools: bool, thinking: bool,
                   field: str, on_delta=None) -> list[_Choice]:
        """Every choice of every prompt (``n`` each), run together; the request's timeout holds."""
        n_total = len(prompts) * s.n
        self._admit(len(prompts), s.n)
        jobs = []
        for p, (prompt, opened) in enumerate(prompts):
            max_new = self._max_new(prompt, s, field)
            sp = SamplingParams(temperature=s.temperature, top_p=s.top_p, max_new_tokens=max_new,
                                stop_tokens=tuple(self.tok.eos_token_ids))
            for j, key in enumerate(self._keys(s)):
                stream = TextStream(s.stop, thinking=thinking, opened=opened, tools=tools)
                jobs.append((p * s.n + j, prompt, sp, key, stream))
        self.inflight += n_total
        self.stats["requests"] += 1
        self.stats["choices"] += n_total
        tasks = [asyncio.ensure_future(self._generate(i, prompt, sp, key, stream, on_delta))
                 for i, prompt, sp, key, stream in jobs]
        runs = asyncio.gather(*tasks)
        self._runs.add(runs)
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                choices = list(await runs)
        except TimeoutError:
            self.stats["timeouts"] += 1
            raise APIError(504, f"the request ran past the server's request_timeout_s={self.settings.request_timeout_s:g}"
                           " and was cancelled", type="timeout", code="request_timeout") from None
        except asyncio.CancelledError:
            if self.aborting and not asyncio.current_task().cancelling():  # `abort_all`, not our caller
                self.stats["aborted"] += 1
                raise APIError(503, f"the server shut down before this request finished (it had "
                               f"serve.shutdown_timeout_s={self.drain_s:g} s to finish)", type="server_error",
                               code="server_shutdown") from None
            self.stats["disconnected"] += 1  # the client went away (a closed stream, a hang-up)
            raise
        except BaseException:  # a failed choice (the engine's error): its siblings stop too
            for t in tasks:
                t.cancel()
            raise
        finally:
            self._runs.discard(runs)
            self.inflight -= n_total
        self.stats["drained" if self.closing else "served"] += 1
        return choices

    # ------------------------------------------------------------------ shutdown
    def abort_all(self) -> int:
        """Ends every admitted request now (its engine requests cancelled, lanes freed at the next
        engine call): each answers 503 ``server_shutdown`` (a stream: that error event, then
        ``[DONE]``); so does a request whose body is still being received or whose prompt is
        still being prepared. Returns how many admitted requests were ended."""
        self.closing = self.aborting = True
        if self._aborted is not None and not self._aborted.done():
            self._aborted.set_result(None)
        runs = [r for r in self._runs if not r.done()]
        for r in runs:
            r.cancel()
        return len(runs)

    def aborted(self) -> asyncio.Future:
        """A future of the running loop that `abort_all` completes."""
        loop = asyncio.get_running_loop()
        if self._aborted is None or self._aborted.get_loop() is not loop:
            self._aborted = loop.create_future()
            if self.aborting:
                self._aborted.set_result(None)
        return self._aborted

    async def drain(self, timeout_s: float) -> None:
        """Stops admitting (503), gives what is in flight (admitted, or still being received or
        prepared) ``timeout_s`` to finish, then `abort_all` and waits (a bounded while) until the
        aborted requests have answered."""
        self.closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (self.inflight or self.preparing) and loop.time() < deadline:
            await asyncio.sleep(min(0.05, max(deadline - loop.time(), 0)))
        if self.inflight or self.preparing:
            self.abort_all()
            end = loop.time() + DRAIN_MARGIN_S / 2
            while (self.inflight or self.preparing) and loop.time() < end:
                await asyncio.sleep(0.01)

    # ------------------------------------------------------------------ threads
    def offload(self, fn: Callable[..., Any], *args) -> asyncio.Future:
        """``fn(*args)`` in the server's worker threads (parsing, rendering, tokenising: never
        the engine, which only the event loop touches)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 1)),
                                                               thread_name_prefix="jaxagent-serve-prep")
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def prepare(self, kind: str, raw: bytes):
        """A request body (bytes) -> (request, prompts): JSON, validation, rendering and
        tokenisation, run by `offload`. ``kind``: ``"chat"`` or ``"completion"``."""
        try:
            body = parse_body(raw)
            return self.parse_chat(body) if kind == "chat" else self.parse_completion(body)
        except RecursionError:
            raise APIError(400, "the request body is nested too deeply", param=None) from None
        except UnicodeError as e:  # a lone surrogate the validation let through
            raise APIError(400, f"the request holds text that is not valid Unicode ({getattr(e, 'reason', e)})",
                           param=None) from None

    def _usage(self, prompts: list[tuple[list[int], bool]], choices: list[_Choice]) -> dict[str, int]:
        p = sum(len(prompt) for prompt, _ in prompts)
        c = sum(len(ch.tokens) for ch in choices)
        self.stats["prompt_tokens"] += p
        self.stats["completion_tokens"] += c
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _message(self, ch: _Choice, *, tools: bool, opened: bool) -> tuple[dict[str, Any], str]:
        """The assistant message and finish reason of a chat choice."""
        msg: dict[str, Any] = {"role": "assistant"}
        finish = ch.finish_reason
        if tools:
            parsed = parse_assistant(ch.text if not opened or "</think>" in ch.text else ch.text + "</think>")
            v = visible(ch.text, thinking=True, opened=opened, tools=False, final=True)
            if parsed.tool_calls and parsed.ok:
                msg["content"] = parsed.content or None
                msg["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                      "function": {"name": c.name,
                                                   "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                                     for c in parsed.tool_calls]
                finish = "tool_calls" if finish == "stop" else finish
            else:  # no call, or a malformed one: the text as it came (the client sees what the model wrote)
                msg["content"] = v.content
            reasoning = v.reasoning
        else:
            v = visible(ch.text, thinking=True, opened=opened, tools=False, final=True)
            msg["content"], reasoning = v.content, v.reasoning
        if reasoning:
            msg["reasoning_content"] = reasoning
        return msg, finish

    def _token_logprobs(self, ch: _Choice) -> list[tuple[str, float]]:
        return [(self.tok.decode([t]), float(lp)) for t, lp in zip(ch.tokens, ch.logps)]

    # ------------------------------------------------------------------ endpoints
    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "jaxagent"}]}

    def health(self) -> dict[str, Any]:
        lanes = sum(r is not None for r in self.engine.running)
        return {"status": "shutting_down" if self.closing else "ok", "model": self.settings.model_name,
                "inflight": self.inflight, **self.stats, "prefix_reuses": self.sessions.reused,
                "engine": {**self.engine.stats, "lanes_busy": lanes, "waiting": len(self.engine.pending)}}

    def parse_chat(self, body: Any) -> tuple[ChatRequest, list[tuple[list[int], bool]]]:
        req = parse_chat(body, max_n=self.settings.max_n)
        self.check_model(req.model)
        return req, [self.render_chat(req)]

    async def chat(self, req: ChatRequest, prompts) -> dict[str, Any]:
        choices = await self._run(prompts, req.sampling, tools=req.parse_tools, thinking=True, field="messages")
        out = []
        for ch in choices:
            msg, finish = self._message(ch, tools=req.parse_tools, opened=prompts[0][1])
            lp = None
            if req.sampling.logprobs:
                lp = {"content": [{"token": t, "logprob": v, "bytes": list(t.encode()), "top_logprobs": []}
                                  for t, v in self._token_logprobs(ch)]}
            out.append({"index": ch.index, "message": msg, "logprobs": lp, "finish_reason": finish})
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.settings.model_name, "choices": out, "usage": self._usage(prompts, choices)}

    async def chat_stream(self, req: ChatRequest, prompts) -> AsyncIterator[dict[str, Any]]:
        """The chunks of a streamed chat (each a JSON object; the caller adds ``[DONE]``)."""
        s = req.sampling
        cid, created, name = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), self.settings.model_name

        def chunk(index: int, delta: dict, finish: str | None = None) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                    "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}

        queue: asyncio.Queue = asyncio.Queue()
        sent: dict[int, list[str]] = {}

        def on_delta(index: int, r: str, c: str) -> None:
            parts = sent.setdefault(index, ["", ""])
            parts[0] += r
            parts[1] += c
            delta = {}
            if r:
                delta["reasoning_content"] = r
            if c:
                delta["content"] = c
            queue.put_nowait(chunk(index, delta))

        for i in range(s.n):
            yield chunk(i, {"role": "assistant", "content": ""})
        run = asyncio.ensure_future(self._run(prompts, s, tools=req.parse_tools, thinking=True, field="messages",
                                              on_delta=on_delta))
        async for c in _drain(run, queue):
            yield c
        choices = run.result()  # an APIError (a timeout) propagates to the caller
        for ch in choices:
            msg, finish = self._message(ch, tools=req.parse_tools, opened=prompts[0][1])
            _, c_sent = sent.get(ch.index, ["", ""])
            delta: dict[str, Any] = {}
            if (msg.get("content") or "").startswith(c_sent) and len(msg.get("content") or "") > len(c_sent):
                delta["content"] = msg["content"][len(c_sent):]
            if msg.get("tool_calls"):
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(msg["tool_calls"])]
            if delta:
                yield chunk(ch.index, delta)
            yield chunk(ch.index, {}, finish)
        if s.include_usage:
            yield {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [],
                   "usage": self._usage(prompts, choices)}

    def parse_completion(self, body: Any) -> tuple[CompletionRequest, list[tuple[list[int], bool]]]:
        req = parse_completion(body, max_n=self.settings.max_n, vocab_size=self.tok.vocab_size)
        self.check_model(req.model)
        for p in req.prompts:
            if isinstance(p, str):
                self.check_text_fits([p], "prompt")
        prompts = [(list(p) if isinstance(p, tuple) else self._encode(p), False) for p in req.prompts]
        return req, prompts

    async def completion(self, req: CompletionRequest, prompts) -> dict[str, Any]:
        choices = await self._run(prompts, req.sampling, tools=False, thinking=False, field="prompt")
        out = []
        for ch in choices:
            lp = None
            if req.sampling.logprobs:
                pairs = self._token_logprobs(ch)
                offsets = np.cumsum([0] + [len(t) for t, _ in pairs[:-1]]).tolist() if pairs else []
                lp = {"tokens": [t for t, _ in pairs], "token_logprobs": [v for _, v in pairs], "top_logprobs": None,
                      "text_offset": offsets}
            out.append({"index": ch.index, "text": ch.text, "logprobs": lp, "finish_reason": ch.finish_reason})
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.settings.model_name, "choices": out, "usage": self._usage(prompts, choices)}

    async def completion_stream(self, req: CompletionRequest, prompts) -> AsyncIterator[dict[str, Any]]:
        s = req.sampling
        cid, created, name = f"cmpl-{uuid.uuid4().hex}", int(time.time()), self.settings.model_name

        def chunk(index: int, text: str, finish: str | None = None) -> dict[str, Any]:
            return {"id": cid, "object": "text_completion", "created": created, "model": name,
                    "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}]}

        queue: asyncio.Queue = asyncio.Queue()
        run = asyncio.ensure_future(self._run(prompts, s, tools=False, thinking=False, field="prompt",
                                              on_delta=lambda i, r, c: queue.put_nowait(chunk(i, c))))
        async for c in _drain(run, queue):
            yield c
        choices = run.result()
        for ch in choices:
            yield chunk(ch.index, "", ch.finish_reason)
        if s.include_usage:
            yield {"id": cid, "object": "text_completion", "created": created, "model": name, "choices": [],
                   "usage": self._usage(prompts, choices)}


def parse_body(raw: bytes) -> Any:
    """A request body's JSON (400 for what is not UTF-8 JSON, nested too deeply included)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {e.start}: {e.reason}); expected UTF-8 JSON",
                       param=None) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply to be parsed", param=None) from None
    except ValueError:
        raise APIError(400, "the request body is not valid JSON", param=None) from None


async def _drain(run: asyncio.Future, queue: asyncio.Queue) -> AsyncIterator[dict[str, Any]]:
    """The chunks ``run`` queues, as they come, until it is done and the queue is empty (its error
    is left in ``run``); a consumer that stops early (a client gone) cancels ``run``."""
    getter: asyncio.Future | None = None
    try:
        while not (run.done() and queue.empty()):
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, run}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
    finally:
        if getter is not None and not getter.done():  # cancelled while waiting: never left pending
            getter.cancel()
        if not run.done():
            run.cancel()


# ----------------------------------------------------------------------------- HTTP
async def _hung_up(receive) -> None:
    """Returns when the client disconnects (ASGI ``receive`` after the body was read whole: the
    next message is ``http.disconnect``, when the client goes or the response is sent)."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a receive that fails: the connection is gone
        return


async def _unless(work, *stops: asyncio.Future):
    """``await work``, unless one of ``stops`` (the client's hang-up, the server's abort) comes
    first: then ``work`` is cancelled (its engine requests with it), awaited to its end, and the
    first stop that came is returned in a `_Stopped`."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task, *stops}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: nobody is told
    raise _Stopped(next(f for f in stops if f.done()))


class _Stopped(Exception):
    def __init__(self, by: asyncio.Future):
        super().__init__()
        self.by = by


def make_app(server: PolicyServer):
    """The Starlette application: routes, OpenAI-shaped errors, SSE streaming, shutdown."""
    import contextlib

    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    # sse-starlette (>= 3.3) cancels every stream at once when uvicorn is told to exit, unless given
    # a grace: the server's drain ends them first (an error event and [DONE]), the grace is a backstop
    graceful = "shutdown_grace_period" in inspect.signature(EventSourceResponse.__init__).parameters

    def error_response(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    async def read_body(request: Request) -> bytes:
        """The body, refused with 413 as soon as it is known to pass ``max_body_bytes``: by its
        Content-Length before a byte is read, else while it is read (chunked)."""
        limit = server.settings.max_body_bytes

        def too_large(size: str) -> APIError:
            server.stats["rejected_413"] += 1
            return APIError(413, f"the request body is {size} bytes; expected at most {limit} (serve.max_body_bytes)",
                            param=None, code="request_too_large", headers={"Connection": "close"})

        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large(declared)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(f"more than {limit}")
            chunks.append(chunk)
        return b"".join(chunks)

    def sse(chunks: AsyncIterator[dict[str, Any]]) -> EventSourceResponse:
        async def events():
            try:
                async for c in chunks:
                    yield {"data": json.dumps(c, ensure_ascii=False)}
            except APIError as e:  # headers are sent: the error travels as an event, as OpenAI's does
                yield {"data": json.dumps(e.body())}
            except Exception as e:  # a failed engine call: this stream ends with an error, the server goes on
                server.stats["errors"] += 1
                print(f"jaxagent serve: request failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                err = APIError(500, f"generation failed: {type(e).__name__}: {e}", type="server_error")
                yield {"data": json.dumps(err.body())}
            yield {"data": "[DONE]"}

        grace = {"shutdown_grace_period": server.drain_s + DRAIN_MARGIN_S} if graceful else {}
        return EventSourceResponse(events(), ping=15, **grace)

    def endpoint(kind: str, answer, stream_answer):
        async def handle(request: Request):
            gone: asyncio.Future | None = None
            try:
                server.authorize(request.headers.get("authorization"))
                aborted = server.aborted()
                server.preparing += 1
                try:
                    raw = await _unless(read_body(request), aborted)
                    gone = asyncio.ensure_future(_hung_up(request.receive))
                    # JSON, validation, template and tokens in a worker thread: the event loop goes on
                    req, prompts = await _unless(server.offload(server.prepare, kind, raw), gone, aborted)
                finally:
                    server.preparing -= 1
                if req.sampling.stream:  # refuse what cannot run before the stream opens (a 400, not an event)
                    server._admit(len(prompts), req.sampling.n)
                    for prompt, _ in prompts:
                        server._max_new(prompt, req.sampling, "messages" if kind == "chat" else "prompt")
                    gone.cancel()  # from here sse-starlette watches for the hang-up
                    return sse(stream_answer(req, prompts))
                return JSONResponse(await _unless(answer(req, prompts), gone))
            except APIError as e:
                return error_response(e)
            except _Stopped as e:
                if e.by is gone:  # nobody to answer: the engine's work for it was cancelled
                    return Response(status_code=499)
                return error_response(APIError(503, "the server shut down before this request was admitted",
                                               type="server_error", code="server_shutdown",
                                               headers={"Connection": "close"}))
            except ClientDisconnect:  # gone while its body was read
                return Response(status_code=499)
            except Exception as e:  # a failed engine call: the request fails, the server goes on
                server.stats["errors"] += 1
                print(f"jaxagent serve: request failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                return error_response(APIError(500, f"generation failed: {type(e).__name__}: {e}", type="server_error"))
            finally:
                if gone is not None and not gone.done():
                    gone.cancel()
        return handle

    async def models(request: Request):
        try:
            server.authorize(request.headers.get("authorization"))
        except APIError as e:
            return error_response(e)
        return JSONResponse(server.models())

    async def health(request: Request):
        return JSONResponse(server.health(), status_code=503 if server.closing else 200)

    async def http_error(request: Request, exc: HTTPException):
        return error_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                       type="invalid_request_error"))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.closing = True  # uvicorn stopped accepting and its connections are closed
        server.close_pool()

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/v1/chat/completions", endpoint("chat", server.chat, server.chat_stream), methods=["POST"]),
              Route("/v1/completions", endpoint("completion", server.completion, server.completion_stream),
                    methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.policy_server = server  # `uvicorn_server` drains it on shutdown
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free port, read back with ``getsockname()``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio switches Nagle's algorithm off (TCP_NODELAY) only on sockets whose proto
    # is IPPROTO_TCP; with proto 0 every small streamed write waited for the client's delayed ACK
    # (~40 ms a response on Linux: bench_serve.py's figures before and after in docs/BENCHMARKS.md)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)  # clients that connect before the server runs wait in the backlog, not refused
    return sock


def uvicorn_server(app, *, shutdown_timeout_s: float = 30.0):
    """A uvicorn server for ``app`` whose shutdown (SIGINT/SIGTERM, ``should_exit``) drains the
    app's `PolicyServer` (`PolicyServer.drain`): no new connections, new requests 503, in-flight
    ones get ``shutdown_timeout_s`` to finish, then are ended with a 503 / an error event and
    ``[DONE]``. uvicorn's own deadline, at which it cancels handler tasks, is `DRAIN_MARGIN_S`
    later: a backstop a normal drain never reaches."""
    import uvicorn

    policy = getattr(getattr(app, "state", None), "policy_server", None)
    if policy is not None:
        policy.drain_s = shutdown_timeout_s

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            drain = None
            if policy is not None:
                policy.closing = True  # before uvicorn's first await: a request now gets 503
                drain = asyncio.ensure_future(policy.drain(shutdown_timeout_s))
            try:
                await super().shutdown(sockets=sockets)
            finally:
                if drain is not None:
                    if not drain.done():
                        drain.cancel()
                    await asyncio.gather(drain, return_exceptions=True)

    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=shutdown_timeout_s + DRAIN_MARGIN_S,
                            lifespan="on")
    return DrainingServer(config)


async def serve(app, sock: socket.socket, *, shutdown_timeout_s: float = 30.0) -> None:
    """Serves ``app`` on ``sock`` until SIGINT/SIGTERM (then drains, `uvicorn_server`)."""
    await uvicorn_server(app, shutdown_timeout_s=shutdown_timeout_s).serve(sockets=[sock])


class ServerThread:
    """``app`` served on a free port of ``host`` from a background thread (its own event loop):
    for notebooks, tests and benchmarks. ``url`` is the API's base (``.../v1``); ``stop()``
    shuts it down gracefully and waits."""

    def __init__(self, app, host: str = "127.0.0.1", *, shutdown_timeout_s: float = 10.0):
        import threading

        self._sock = bind(host, 0)
        self.url = f"http://{host}:{self._sock.getsockname()[1]}/v1"
        self._server = uvicorn_server(app, shutdown_timeout_s=shutdown_timeout_s)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])),
                                        daemon=True, name="jaxagent-serve")
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=60)

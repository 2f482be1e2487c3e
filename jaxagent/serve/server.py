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
- **Limits.** At most ``slots + max_queue`` choices are in flight: past that a request gets 429
  with ``Retry-After``; a request that runs past ``request_timeout_s`` is cancelled and answered
  504 (an ``error`` event when streaming); with an API key every ``/v1`` route wants
  ``Authorization: Bearer <key>`` (401 otherwise). While shutting down new requests get 503.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import socket
import sys
import time
import uuid
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

__all__ = ["MIN_REUSE", "PolicyServer", "ServeSettings", "ServerThread", "SessionIndex", "bind", "make_app",
           "request_key_data", "serve", "splitmix64"]

#: the fewest shared leading tokens for which a request takes over an idle session's cache
MIN_REUSE = 16


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

    def __post_init__(self):
        for name, lo in (("max_tokens", 1), ("max_n", 1), ("max_queue", 0), ("retry_after_s", 0)):
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
        self.closing = False
        self.requests = 0
        self.stats = {"requests": 0, "choices": 0, "prompt_tokens": 0, "completion_tokens": 0, "rejected_429": 0,
                      "timeouts": 0, "errors": 0}
        self._stop_ids = frozenset(tokenizer.eos_token_ids)

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

    def _admit(self, n: int) -> None:
        if self.closing:
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        if self.inflight + n > self.engine.slots + self.settings.max_queue:
            self.stats["rejected_429"] += 1
            raise APIError(429, f"the queue is full ({self.inflight} choices in flight, room for "
                           f"{self.engine.slots} decoding + {self.settings.max_queue} waiting); retry later",
                           type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(self.settings.retry_after_s)})

    # ------------------------------------------------------------------ prompts
    def render_chat(self, req: ChatRequest) -> tuple[list[int], bool]:
        """(prompt ids, whether the prompt leaves a thinking block open)."""
        try:
            r = ChatRenderer(self.tok, self.template, tools=list(req.tools) or None, template_kwargs=req.template_kwargs)
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
        self._admit(n_total)
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
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                return list(await asyncio.gather(*(self._generate(i, prompt, sp, key, stream, on_delta)
                                                   for i, prompt, sp, key, stream in jobs)))
        except TimeoutError:
            self.stats["timeouts"] += 1
            raise APIError(504, f"the request ran past the server's request_timeout_s={self.settings.request_timeout_s:g}"
                           " and was cancelled", type="timeout", code="request_timeout") from None
        finally:
            self.inflight -= n_total

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
        return {"status": "shutting_down" if self.closing else "ok", "model": self.settings.model_name,
                "inflight": self.inflight, **self.stats, "prefix_reuses": self.sessions.reused,
                "engine": dict(self.engine.stats)}

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
        prompts = [(list(p) if isinstance(p, tuple) else self.tok.encode(p), False) for p in req.prompts]
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


async def _drain(run: asyncio.Future, queue: asyncio.Queue) -> AsyncIterator[dict[str, Any]]:
    """The chunks ``run`` queues, as they come, until it is done and the queue is empty (its error
    is left in ``run``); a consumer that stops early (a client gone) cancels ``run``."""
    try:
        while not (run.done() and queue.empty()):
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, run}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
    finally:
        if not run.done():
            run.cancel()


# ----------------------------------------------------------------------------- HTTP
def make_app(server: PolicyServer):
    """The Starlette application: routes, OpenAI-shaped errors, SSE streaming, shutdown."""
    import contextlib

    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def error_response(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    async def body_of(request: Request) -> Any:
        try:
            return await request.json()
        except (ValueError, UnicodeDecodeError):
            raise APIError(400, "the request body is not valid JSON", param=None) from None

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

        return EventSourceResponse(events(), ping=15)

    def endpoint(parse, answer, stream_answer):
        async def handle(request: Request):
            try:
                server.authorize(request.headers.get("authorization"))
                req, prompts = parse(await body_of(request))
                if req.sampling.stream:
                    server._admit(len(prompts) * req.sampling.n)  # refuse before the stream opens
                    return sse(stream_answer(req, prompts))
                return JSONResponse(await answer(req, prompts))
            except APIError as e:
                return error_response(e)
            except Exception as e:  # a failed engine call: the request fails, the server goes on
                server.stats["errors"] += 1
                print(f"jaxagent serve: request failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                return error_response(APIError(500, f"generation failed: {type(e).__name__}: {e}", type="server_error"))
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
        server.closing = True  # uvicorn stopped accepting; what is in flight finishes or is cancelled

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/v1/chat/completions", endpoint(server.parse_chat, server.chat, server.chat_stream),
                    methods=["POST"]),
              Route("/v1/completions", endpoint(server.parse_completion, server.completion, server.completion_stream),
                    methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)


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
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=shutdown_timeout_s, lifespan="on")
    return uvicorn.Server(config)


async def serve(app, sock: socket.socket, *, shutdown_timeout_s: float = 30.0) -> None:
    """Serves ``app`` on ``sock`` until SIGINT/SIGTERM (uvicorn's graceful shutdown: no new
    connections, in-flight requests get ``shutdown_timeout_s`` to finish, then are cancelled)."""
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

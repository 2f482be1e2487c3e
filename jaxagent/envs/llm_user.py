"""An LLM user simulator over HTTP: an OpenAI-compatible chat-completions client (vLLM, SGLang,
OpenAI, ...) that plays the user of a task from its hidden profile.

    config = LLMUserConfig(base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen2.5-7B-Instruct",
                           api_key_env="OPENAI_API_KEY")
    async with LLMUserClient(config) as user:
        reply = await user.respond(conversation, profile)   # UserReply
        reply.utterance, reply.strategy, reply.stop, reply.parse_error, reply.attempts, reply.latency_s

- **Request.** ``POST {base_url}/chat/completions`` with ``{model, messages, temperature}`` (plus
  ``max_tokens`` and ``response_format`` when configured); the reply is
  ``choices[0].message.content``.
- **Roles flipped** and the **system prompt**: `jaxagent.envs.user_prompt`.
- **Reply format** and **stop markers**: `jaxagent.envs.user_reply` (`parse_reply` never raises).
- **Failures.** Retried, with full-jitter exponential backoff
  (``uniform(0, min(backoff_max_s, backoff_base_s * 2**k))``) or at least the server's
  ``Retry-After`` (seconds or an HTTP date, capped at ``retry_after_max_s``): HTTP 408, 429 and
  5xx, timeouts, connection errors, and bodies that are not a complete chat-completions JSON
  (truncated, non-JSON, no ``choices[0].message.content``). Other statuses (401, 403 and the
  other 4xx) raise :class:`SimulatorError` at once with ``retryable=False`` (status and a body
  excerpt): the rollout loop does not retry those either. After ``max_retries + 1`` attempts
  :class:`SimulatorError` is raised; the rollout loop counts it and ends the episode as a
  simulator failure. ``max_concurrency`` bounds the HTTP requests in flight per client (a
  backoff sleep does not hold a slot).
- **Counters.** Every call and every failed attempt is counted by cause (:data:`FAILURE_KINDS`:
  ``timeout`` (incl. HTTP 408), ``connection``, ``429``, ``5xx``, ``bad_json``,
  ``empty_choices`` (no ``choices[0].message`` or no string content), ``401``, ``403``,
  ``other_status``; `jaxagent.envs.base`) in the client's own `CallStats` (``client.stats``) and in
  every `CallStats` the calling task collects with `jaxagent.envs.base.collect_call_stats` (the
  episode runner collects one per episode, so a record carries its simulator's attempts, retries and
  failures).
- **Time budget.** One call takes at most about :meth:`LLMUserConfig.call_budget_s`:
  ``(max_retries + 1) * (connect_timeout_s + read_timeout_s)`` plus the backoff sleeps, each at
  most ``max(min(backoff_max_s, backoff_base_s * 2**k), retry_after_max_s)`` (the wait in the
  ``max_concurrency`` queue not included; a server that trickles bytes can exceed it, since the
  read timeout bounds each read). A caller's own timeout on the call (the rollout loop's
  ``rollout.timeout_s``) must be at least that, or it cuts the client's retries short:
  `jaxagent.jobs.config` checks it and derives the loop's timeout from it by default.
- **The API key** is read from the environment variable *named* by ``api_key_env`` when the
  client is created and sent as ``Authorization: Bearer ...``. It is never logged, never in the
  repr/str of any object here, never in an error message (a server that echoes it back has it
  replaced by ``***`` in body excerpts), and nothing here writes to disk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import json
import logging
import math
import os
import random
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncGenerator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Self

import aiohttp

from jaxagent.envs.base import CallStats, active_call_stats
from jaxagent.envs.user_config import LLMUserConfig
from jaxagent.envs.user_prompt import flip_roles, render_system_prompt
from jaxagent.envs.user_reply import parse_reply

logger = logging.getLogger(__name__)

__all__ = ["LLMUserClient", "LLMUserConfig", "SimulatorError", "UserReply", "env_proxy", "failure_kind",
           "parse_retry_after"]

_RETRYABLE_STATUS = frozenset({408, 429})
_EXCERPT_CHARS = 300




def failure_kind(status: int | None) -> str:
    """The `FAILURE_KINDS` entry of a failed response with HTTP ``status`` (None: no response,
    counted as ``connection``; timeouts and bad bodies are classified where they are seen)."""
    if status is None:
        return "connection"
    if status == 408:
        return "timeout"
    if status in (401, 403, 429):
        return str(status)
    if 500 <= status < 600:
        return "5xx"
    return "other_status"


class SimulatorError(RuntimeError):
    """The user simulator could not produce a reply: a non-retryable HTTP status, or every attempt
    failed. ``status`` is the last HTTP status (None for timeouts/connection errors/bad bodies),
    ``attempts`` the HTTP attempts made, ``reason`` the last failure, ``body_excerpt`` the start
    of the last error body (API key redacted), ``kind`` the last failure's cause (a
    `FAILURE_KINDS` entry), ``retryable`` False when retrying cannot help (401, 403 and the other
    non-retried statuses: callers such as the rollout loop must not retry it)."""

    def __init__(self, message: str, *, status: int | None, attempts: int, reason: str, body_excerpt: str = "",
                 kind: str = "other_status", retryable: bool = True):
        super().__init__(message)
        self.status = status
        self.attempts = attempts
        self.reason = reason
        self.body_excerpt = body_excerpt
        self.kind = kind
        self.retryable = retryable


@dataclasses.dataclass(frozen=True)
class UserReply:
    """One simulated-user turn. ``strategy`` is the private reaction label (kept off the agent's
    tokens); ``stop`` is True when the model emitted a stop marker; ``parse_error`` is None when the
    model's JSON was well formed; ``attempts`` counts HTTP attempts; ``latency_s`` is the wall time
    of the whole call, retries included; ``raw`` is the model's text as received."""

    utterance: str
    strategy: str | None
    stop: bool
    parse_error: str | None
    attempts: int
    latency_s: float
    raw: str = ""


# ----------------------------------------------------------------------------- HTTP client


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delay-seconds or an HTTP date (past dates
    give 0). None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        now = now or datetime.now(UTC)
        return max(0.0, (when - now).total_seconds())
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class _Secret:
    """Holds the API key; its repr/str never show it."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "_Secret('***')"

    __str__ = __repr__


class _BadBody(Exception):
    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTP_PROXY`` / ``HTTPS_PROXY`` by its scheme,
    lower or upper case), or None when there is none or ``NO_PROXY`` exempts its host."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or urllib.request.proxy_bypass_environment(parts.hostname):
        return None
    return urllib.request.getproxies_environment().get(parts.scheme) or None


async def _closed_with_loop(http: aiohttp.ClientSession) -> AsyncGenerator[None, None]:
    """Yields once; closes ``http`` when finalised (see `LLMUserClient._bind`)."""
    try:
        yield
    finally:
        await http.close()


class LLMUserClient:
    """Async OpenAI-compatible user-simulator client (see the module docstring). Use as
    ``async with LLMUserClient(config) as user:`` or call :meth:`aclose`. Usable from successive event
    loops (each ``asyncio.run`` gets its own connection pool)."""

    def __init__(self, config: LLMUserConfig, *, rng: random.Random | None = None):
        if not isinstance(config, LLMUserConfig):
            raise ValueError(f"config: got {type(config).__name__}; expected an LLMUserConfig")
        self.config = config
        self._key: _Secret | None = None
        if config.api_key_env is not None:
            value = os.environ.get(config.api_key_env, "")
            if not value.strip():
                raise ValueError(f"LLMUserConfig.api_key_env={config.api_key_env!r}: the environment variable is "
                                 "unset or empty; expected it to hold the API key (or api_key_env=None for no key)")
            self._key = _Secret(value.strip())
        self._rng = rng if rng is not None else random.Random(config.seed)
        self._closed = False
        self.stats = CallStats()  # every call of this client (see collect_call_stats for a task's own)
        # The HTTP session (aiohttp: a third of httpx's CPU per request at 8 in flight, a
        # twenty-eighth at 64: scripts/bench_sim_client.py, docs/BENCHMARKS.md) and the concurrency
        # semaphore belong to one event loop: they are made for the loop that first uses them and
        # made again when another loop calls (a job that runs each evaluation in its own
        # ``asyncio.run``), and closed when their loop ends (`_bind`).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._closer: AsyncGenerator[None, None] | None = None
        self._proxy: str | None = None

    async def _bind(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._http is None:
            await self._drop_http()
            c = self.config
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=c.max_concurrency, limit_per_host=c.max_concurrency),
                # no bound on the whole call (a slow but steady answer is fine); each connect and
                # each read is bounded
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=c.connect_timeout_s, sock_read=c.read_timeout_s),
                # aiohttp's own trust_env looks the proxy and ~/.netrc up in a worker thread on
                # every request (two thread hops, more CPU than the request itself): the proxy is
                # looked up here, once per session
                trust_env=False,
            )
            self._proxy = env_proxy(c.url) if c.trust_env else None
            self._semaphore = asyncio.Semaphore(c.max_concurrency)
            self._loop = loop
            # An open async generator is finalised by ``asyncio.run`` before it closes the loop
            # (``loop.shutdown_asyncgens``): this one's ``finally`` then closes the session's sockets
            # in their own loop, where a later loop could only drop them.
            self._closer = _closed_with_loop(self._http)
            await anext(self._closer)
        return self._http, self._semaphore

    def __repr__(self) -> str:
        c = self.config
        return (f"LLMUserClient(url={c.url!r}, model={c.model!r}, api_key_env={c.api_key_env!r}, "
                f"max_concurrency={c.max_concurrency}, closed={self._closed})")

    __str__ = __repr__

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _drop_http(self) -> None:
        """Closes the current HTTP session through its closer (`_bind`): a no-op when the end of
        the session's event loop has closed it already."""
        closer = self._closer
        self._http, self._semaphore, self._loop, self._closer = None, None, None, None
        if closer is not None:
            await closer.aclose()

    async def aclose(self) -> None:
        self._closed = True
        await self._drop_http()

    def build_messages(self, conversation: Sequence[Mapping[str, Any]], profile: Mapping[str, Any]
                       ) -> list[dict[str, str]]:
        """The simulator's messages: the system prompt from the profile, then the flipped conversation."""
        system = render_system_prompt(self.config.system_prompt, profile, self.config.stop_markers)
        return [{"role": "system", "content": system}, *flip_roles(conversation, self.config.opening_message)]

    def _redact(self, text: str) -> str:
        if self._key is not None:
            text = text.replace(self._key.get(), "***")
        return text

    def _excerpt(self, body: bytes) -> str:
        text = body[: _EXCERPT_CHARS * 4].decode("utf-8", errors="replace")
        text = self._redact(text)
        return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."

    def backoff_delay(self, retry_index: int, retry_after: float | None = None) -> float:
        """Seconds before retry ``retry_index`` (0-based): full jitter, at least ``Retry-After``."""
        c = self.config
        cap = min(c.backoff_max_s, c.backoff_base_s * (2.0 ** min(retry_index, 60)))
        delay = self._rng.uniform(0.0, cap)
        if retry_after is not None:
            delay = max(delay, min(retry_after, c.retry_after_max_s))
        return delay

    @staticmethod
    def _message(body: bytes, require_content: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """The reply's ``choices[0].message`` and its ``usage`` (``{}`` when the server sends none)."""
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise _BadBody("response body is not JSON (non-JSON or truncated)", "bad_json") from None
        try:
            message = data["choices"][0]["message"]
            content = message.get("content")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise _BadBody("response JSON has no choices[0].message", "empty_choices") from None
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        calls = message.get("tool_calls")
        if not isinstance(content, str) and (require_content or not isinstance(calls, list) or not calls):
            raise _BadBody(f"choices[0].message.content is {type(content).__name__}; expected a string"
                           + ("" if require_content else " or tool_calls"), "empty_choices")
        usage = data.get("usage") if isinstance(data, dict) else None
        return dict(message, content=content if isinstance(content, str) else None), (
            usage if isinstance(usage, dict) else {})

    async def respond(self, conversation: Sequence[Mapping[str, Any]], profile: Mapping[str, Any]) -> UserReply:
        """The simulated user's next turn. Raises ValueError/ProfileError for a bad conversation or
        profile (before any request) and :class:`SimulatorError` when the server fails."""
        messages = self.build_messages(conversation, profile)
        extra = {"response_format": {"type": "json_object"}} if self.config.json_mode else {}
        message, attempts, latency = await self.chat(messages, extra=extra)
        return self._reply(message["content"], attempts, latency)

    async def complete(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, int]:
        """Plain chat completion (``messages`` sent as given): the reply's text and the HTTP
        attempts it took. Used by the judges and customers built on this client."""
        message, attempts, _ = await self.chat(messages)
        return message["content"], attempts

    async def complete_usage(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, int]]:
        """Plain chat completion: the reply's text and the server's token counts
        (``prompt_tokens``, ``completion_tokens``; 0 for a count the server does not send)."""
        message, usage, _, _ = await self._chat(messages)
        counts = {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens")}
        return message["content"], {k: int(v) if isinstance(v, int) else 0 for k, v in counts.items()}

    async def chat(self, messages: Sequence[Mapping[str, Any]], *, extra: Mapping[str, Any] | None = None,
                   require_content: bool = True) -> tuple[dict[str, Any], int, float]:
        """One chat-completions call with the retry policy of the module docstring: the reply's
        ``choices[0].message`` (``content`` None when it holds only ``tool_calls`` and
        ``require_content`` is False), the HTTP attempts and the wall time. ``extra`` adds request
        fields (``tools``, ``response_format``, ...). Raises :class:`SimulatorError`. Counted in
        ``self.stats`` and in the collectors of `collect_call_stats`."""
        message, _, attempts, latency = await self._chat(messages, extra=extra, require_content=require_content)
        return message, attempts, latency

    async def _chat(self, messages: Sequence[Mapping[str, Any]], *, extra: Mapping[str, Any] | None = None,
                    require_content: bool = True) -> tuple[dict[str, Any], dict[str, Any], int, float]:
        c = self.config
        if self._closed:
            raise RuntimeError("LLMUserClient: the client is closed; expected an open client")
        http, semaphore = await self._bind()
        payload: dict[str, Any] = {"model": c.model, "messages": list(messages), "temperature": c.temperature,
                                   "stream": False}
        if c.max_tokens is not None:
            payload["max_tokens"] = c.max_tokens
        payload.update(extra or {})
        data = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode()  # once, for every attempt
        headers = {"Content-Type": "application/json"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key.get()}"

        start = time.monotonic()
        counters = (self.stats, *active_call_stats())
        for st in counters:
            st.calls += 1
        attempts, status, reason, excerpt, kind = 0, None, "", "", "other_status"
        for retry in range(c.max_retries + 1):
            attempts += 1
            for st in counters:
                st.attempts += 1
            retry_after = None
            try:
                async with semaphore, http.post(c.url, data=data, headers=headers, proxy=self._proxy) as response:
                    status, body, retry_header = response.status, await response.read(), response.headers.get("retry-after")
            except TimeoutError as e:  # connect or read timeouts (aiohttp's are TimeoutErrors too)
                status, excerpt, reason, kind = None, "", f"timeout ({type(e).__name__})", "timeout"
            except aiohttp.ClientError as e:  # connection errors, truncated bodies, decoding errors
                status, excerpt, reason, kind = None, "", self._redact(f"{type(e).__name__}: {e}"), "connection"
            else:
                if 200 <= status < 300:
                    try:
                        message, usage = self._message(body, require_content)
                    except _BadBody as e:
                        excerpt, reason, kind = self._excerpt(body), f"HTTP {status}: {e}", e.kind
                    else:
                        return message, usage, attempts, time.monotonic() - start
                elif status in _RETRYABLE_STATUS or 500 <= status < 600:
                    excerpt, kind = self._excerpt(body), failure_kind(status)
                    reason = f"HTTP {status}: {excerpt!r}"
                    retry_after = parse_retry_after(retry_header)
                else:
                    excerpt, kind = self._excerpt(body), failure_kind(status)
                    for st in counters:
                        st.fail(kind)
                        st.failed_calls += 1
                    raise SimulatorError(
                        f"user simulator: POST {c.url} returned HTTP {status} (not retried); body: {excerpt!r}",
                        status=status, attempts=attempts, reason=f"HTTP {status}", body_excerpt=excerpt,
                        kind=kind, retryable=False)
            for st in counters:
                st.fail(kind)
            if retry == c.max_retries:
                break
            delay = self.backoff_delay(retry, retry_after)
            logger.warning("user simulator: attempt %d/%d failed (%s); retrying in %.2fs%s", attempts,
                           c.max_retries + 1, reason, delay,
                           f" (Retry-After {retry_after:.2f}s)" if retry_after is not None else "")
            await asyncio.sleep(delay)
        for st in counters:
            st.failed_calls += 1
        raise SimulatorError(f"user simulator: POST {c.url} failed after {attempts} attempts; last: {reason}",
                             status=status, attempts=attempts, reason=reason, body_excerpt=excerpt, kind=kind)

    def parse_turn(self, raw: str, attempts: int = 1, latency_s: float = 0.0) -> UserReply:
        """A simulator's reply text (from `chat`) as a `UserReply`, as `respond` reads it: the JSON
        utterance and strategy, the stop markers found and removed."""
        return self._reply(raw, attempts, latency_s)

    def _reply(self, raw: str, attempts: int, latency_s: float) -> UserReply:
        parsed = parse_reply(raw)
        markers = self.config.stop_markers
        stop = any(m in raw for m in markers)
        utterance = parsed.utterance
        for m in markers:
            utterance = utterance.replace(m, "")
        utterance = utterance.strip() if stop else utterance
        if parsed.parse_error is not None:
            logger.debug("user simulator: reply not in the JSON format (%s)", parsed.parse_error)
        return UserReply(utterance=utterance, strategy=parsed.strategy, stop=stop, parse_error=parsed.parse_error,
                         attempts=attempts, latency_s=latency_s, raw=raw)

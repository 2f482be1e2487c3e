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
- **Roles flipped.** ``conversation`` is the agent's view (OpenAI messages). The simulator sees a
  system prompt built from the profile, the agent's texts as ``user`` turns and the simulated
  user's own past utterances as ``assistant`` turns (as JSON with their strategy when the message
  carries a ``"strategy"`` or ``"reaction"`` key, so the model sees its own format). The agent's system prompt, tool
  calls, tool results and ``<think>`` blocks are never shown to the user. Consecutive turns of one
  role are merged (some servers require alternation); if the simulator's first turn would be its
  own, ``config.opening_message`` is put before it as the agent's greeting.
- **Reply format.** The model is asked for ``{"utterance": ..., "strategy": ...}``;
  :func:`parse_reply` finds JSON anywhere in the text (code fences, prose around it, single
  quotes, trailing commas, Python literals) and never raises: when no well-formed object is found
  the utterance is the text stripped of JSON debris (or the partial ``utterance`` value of a
  truncated object), ``strategy`` is None and ``parse_error`` says why. Only the first 100,000
  characters are looked at (a longer reply's fallback utterance is cut there).
- **Stop markers** (``"###STOP###"``) anywhere in the model's text set ``stop=True``; they are
  removed from the utterance.
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
  ``other_status``) in the client's own :class:`CallStats` (``client.stats``) and in every
  :class:`CallStats` the calling task collects with :func:`collect_call_stats` (the rollout loop
  collects one per episode, so a record carries its simulator's attempts, retries and failures).
- **Time budget.** One call takes at most about :meth:`LLMUserConfig.call_budget_s`:
  ``(max_retries + 1) * (connect_timeout_s + read_timeout_s)`` plus the backoff sleeps, each at
  most ``max(min(backoff_max_s, backoff_base_s * 2**k), retry_after_max_s)`` (the wait in the
  ``max_concurrency`` queue not included; a server that trickles bytes can exceed it, since the
  read timeout bounds each read). A caller's own timeout on the call (the rollout loop's
  ``rollout.timeout_s``) must be at least that, or it cuts the client's retries short:
  `jaxagent.config` checks it and derives the loop's timeout from it by default.
- **The API key** is read from the environment variable *named* by ``api_key_env`` when the
  client is created and sent as ``Authorization: Bearer ...``. It is never logged, never in the
  repr/str of any object here, never in an error message (a server that echoes it back has it
  replaced by ``***`` in body excerpts), and nothing here writes to disk.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import contextvars
import dataclasses
import email.utils
import json
import logging
import math
import os
import random
import re
import string
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Self

import httpx

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "FAILURE_KINDS",
    "CallStats",
    "LLMUserClient",
    "LLMUserConfig",
    "ParsedReply",
    "ProfileError",
    "SimulatorError",
    "UserReply",
    "collect_call_stats",
    "failure_kind",
    "flip_roles",
    "parse_reply",
    "parse_retry_after",
    "render_system_prompt",
]

#: Template fields the client fills itself (a profile key of the same name is ignored).
RESERVED_FIELDS = ("stop_marker",)

DEFAULT_SYSTEM_PROMPT = """\
You are playing a human user who is talking to an AI assistant (the agent) to get something done.
Stay in character: you are the user, never the assistant. Your hidden goal and profile are below.
Do not reveal everything at once; share a detail only when the agent asks for it or needs it, and
keep each message short and natural.

Your goal and profile:
{instructions}

When your goal is met, or the conversation cannot go anywhere, your utterance is exactly \
{stop_marker}

Answer with one JSON object and nothing else:
{{"utterance": "<what you say to the agent>", "strategy": "<one short label for how you react, \
e.g. inform, clarify, correct, reject, accept>"}}"""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RETRYABLE_STATUS = frozenset({408, 429})
_EXCERPT_CHARS = 300
_MAX_PARSE_CHARS = 100_000
_MAX_CANDIDATES = 64
_UTTERANCE_KEYS = ("utterance", "message", "response", "text")
_STRATEGY_KEYS = ("strategy", "reaction", "label")
_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)


#: Causes of a failed HTTP attempt, as counted in `CallStats.failures` (see the module docstring).
FAILURE_KINDS = ("timeout", "connection", "429", "5xx", "bad_json", "empty_choices", "401", "403", "other_status")


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


class CallStats:
    """Counters of simulator calls: ``calls`` (chat-completions calls started), ``attempts`` (HTTP
    attempts), ``failed_calls`` (calls that raised `SimulatorError`), ``failures`` (failed
    attempts by cause, keys from `FAILURE_KINDS`). ``retries`` is ``attempts - calls``."""

    __slots__ = ("attempts", "calls", "failed_calls", "failures")

    def __init__(self):
        self.calls = self.attempts = self.failed_calls = 0
        self.failures: dict[str, int] = {}

    @property
    def retries(self) -> int:
        return self.attempts - self.calls

    def fail(self, kind: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "attempts": self.attempts, "retries": self.retries,
                "failed_calls": self.failed_calls, "failures": dict(self.failures)}

    def __repr__(self) -> str:
        return f"CallStats({self.as_dict()})"


_COLLECTORS: contextvars.ContextVar[tuple[CallStats, ...]] = contextvars.ContextVar("jaxagent_sim_call_stats",
                                                                                     default=())


@contextlib.contextmanager
def collect_call_stats(stats: CallStats | None = None) -> Iterator[CallStats]:
    """Counts, into ``stats`` (a new `CallStats` by default), the simulator calls made by the
    current task and the tasks it starts from here on (context variables are copied into new
    tasks: ``asyncio.wait_for``, ``gather``), through any `LLMUserClient`. Nests."""
    stats = CallStats() if stats is None else stats
    token = _COLLECTORS.set((*_COLLECTORS.get(), stats))
    try:
        yield stats
    finally:
        _COLLECTORS.reset(token)


class ProfileError(ValueError):
    """The system-prompt template needs a field the task's user profile does not have."""


def _check_number(name: str, value: Any, *, lo: float, lo_open: bool = False, hi: float = math.inf) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        bound = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if hi != math.inf else "")
        raise ValueError(f"LLMUserConfig.{name}={value!r}: expected a finite number {bound}")
    return float(value)


def _check_int(name: str, value: Any, *, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"LLMUserConfig.{name}={value!r}: expected an int >= {lo}")
    return value


def template_fields(template: str) -> tuple[str, ...]:
    """The named fields of a ``str.format`` template, in order of first use. Raises ValueError
    for a malformed template, positional fields and attribute/index access (``{a.b}``, ``{a[0]}``)."""
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"LLMUserConfig.system_prompt: not a valid str.format template ({e}); "
                         "expected named fields like {instructions} and literal braces doubled ({{ }})") from None
    for _, field, spec, _ in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            raise ValueError(f"LLMUserConfig.system_prompt: field {{{field}}}: expected a plain name "
                             "(no positional fields, attribute or index access)")
        if spec and "{" in spec:
            raise ValueError(f"LLMUserConfig.system_prompt: field {{{field}}} has a nested field in its format spec; "
                             "expected a plain format spec")
        if field not in fields:
            fields.append(field)
    return tuple(fields)


@dataclasses.dataclass(frozen=True)
class LLMUserConfig:
    """Settings of the HTTP user simulator; validated on construction (errors name the field, the
    value and what was expected). ``api_key_env`` is the NAME of an environment variable (None:
    no Authorization header, as for a local vLLM/SGLang server)."""

    base_url: str
    model: str
    temperature: float = 0.7
    api_key_env: str | None = None
    max_concurrency: int = 16
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    max_retries: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 120.0
    stop_markers: tuple[str, ...] = ("###STOP###",)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    opening_message: str = "Hi! How can I help you today?"
    max_tokens: int | None = 512
    json_mode: bool = False  # also send response_format={"type": "json_object"} (not every server has it)
    trust_env: bool = True  # httpx: honour HTTP(S)_PROXY / NO_PROXY / SSL_CERT_FILE from the environment
    seed: int | None = None  # the backoff jitter's RNG

    def __post_init__(self):
        url = self.base_url
        if not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url):
            raise ValueError(f"LLMUserConfig.base_url={url!r}: expected an http:// or https:// URL "
                             "such as 'http://127.0.0.1:8000/v1'")
        object.__setattr__(self, "base_url", url.rstrip("/"))
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"LLMUserConfig.model={self.model!r}: expected a non-empty model name")
        _check_number("temperature", self.temperature, lo=0.0, hi=2.0)
        env = self.api_key_env
        if env is not None and (not isinstance(env, str) or not _ENV_NAME.match(env)):
            # Never echo the value: a key pasted here by mistake must not reach logs or tracebacks.
            raise ValueError("LLMUserConfig.api_key_env=<not shown>: expected None or the NAME of an environment "
                             "variable holding the key ([A-Za-z_][A-Za-z0-9_]*), not the key itself")
        _check_int("max_concurrency", self.max_concurrency, lo=1)
        _check_number("connect_timeout_s", self.connect_timeout_s, lo=0.0, lo_open=True)
        _check_number("read_timeout_s", self.read_timeout_s, lo=0.0, lo_open=True)
        _check_int("max_retries", self.max_retries, lo=0)
        _check_number("backoff_base_s", self.backoff_base_s, lo=0.0)
        _check_number("backoff_max_s", self.backoff_max_s, lo=self.backoff_base_s)
        _check_number("retry_after_max_s", self.retry_after_max_s, lo=0.0)
        markers = self.stop_markers
        if isinstance(markers, str) or not isinstance(markers, Sequence) or not all(
                isinstance(m, str) and m.strip() for m in markers):
            raise ValueError(f"LLMUserConfig.stop_markers={markers!r}: expected a sequence of non-empty strings")
        object.__setattr__(self, "stop_markers", tuple(markers))
        if not isinstance(self.system_prompt, str) or not self.system_prompt.strip():
            raise ValueError(f"LLMUserConfig.system_prompt={self.system_prompt!r}: expected a non-empty template")
        if "stop_marker" in template_fields(self.system_prompt) and not self.stop_markers:
            raise ValueError("LLMUserConfig.system_prompt uses {stop_marker} but stop_markers=(); "
                             "expected at least one stop marker")
        if not isinstance(self.opening_message, str) or not self.opening_message.strip():
            raise ValueError(f"LLMUserConfig.opening_message={self.opening_message!r}: expected a non-empty string")
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, lo=1)
        for name in ("json_mode", "trust_env"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LLMUserConfig.{name}={getattr(self, name)!r}: expected a bool")
        if self.seed is not None:
            _check_int("seed", self.seed, lo=0)

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def call_budget_s(self) -> float:
        """The most seconds one call (every attempt and backoff sleep) takes, about (module
        docstring, "Time budget"): ``(max_retries + 1) * (connect_timeout_s + read_timeout_s)``
        plus, for each retry k, ``max(min(backoff_max_s, backoff_base_s * 2**k), retry_after_max_s)``."""
        sleeps = sum(max(min(self.backoff_max_s, self.backoff_base_s * 2.0 ** min(k, 60)), self.retry_after_max_s)
                     for k in range(self.max_retries))
        return (self.max_retries + 1) * (self.connect_timeout_s + self.read_timeout_s) + sleeps


@dataclasses.dataclass(frozen=True)
class ParsedReply:
    utterance: str
    strategy: str | None
    parse_error: str | None


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


# ----------------------------------------------------------------------------- prompt and roles


def render_system_prompt(template: str, profile: Mapping[str, Any], stop_markers: Sequence[str] = ("###STOP###",)) -> str:
    """Fill ``template``'s named fields from the profile (non-string values as JSON) and
    ``{stop_marker}`` with the first stop marker. A missing field raises :class:`ProfileError`."""
    if not isinstance(profile, Mapping):
        raise ProfileError(f"profile: got {type(profile).__name__}; expected a dict (the task's hidden user profile)")
    values: dict[str, Any] = {}
    for field in template_fields(template):
        if field == "stop_marker" and stop_markers:
            values[field] = stop_markers[0]
        elif field in profile:
            v = profile[field]
            values[field] = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, indent=2, default=str)
        else:
            have = sorted(str(k) for k in profile)
            raise ProfileError(f"profile: the system prompt template needs field {field!r}, which the profile lacks "
                               f"(profile keys: {have}); expected a profile with keys "
                               f"{[f for f in template_fields(template) if f not in RESERVED_FIELDS]}")
    return template.format_map(values)


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    raise ValueError(f"{where}.content: got {type(content).__name__}; expected a str, a list of content parts or None")


def flip_roles(conversation: Sequence[Mapping[str, Any]], opening_message: str = "Hi! How can I help you today?"
               ) -> list[dict[str, str]]:
    """The agent's conversation as the simulator sees it (without the system prompt): agent
    ``assistant`` texts become ``user`` turns, simulated-user ``user`` turns become ``assistant``
    turns; system messages, tool calls, tool results and ``<think>`` blocks are dropped; runs of
    one role are merged; the agent's ``opening_message`` goes first when the user would open."""
    if isinstance(conversation, (str, bytes)) or not isinstance(conversation, Sequence):
        raise ValueError(f"conversation: got {type(conversation).__name__}; expected a list of message dicts")
    out: list[dict[str, str]] = []
    for i, m in enumerate(conversation):
        where = f"conversation[{i}]"
        if not isinstance(m, Mapping) or "role" not in m:
            raise ValueError(f"{where}: got {type(m).__name__}; expected a dict with 'role' and 'content'")
        role = m["role"]
        if role in ("system", "tool"):
            continue
        if role == "assistant":
            text = _THINK.sub("", _text_of(m.get("content"), where)).strip()
            new_role = "user"
        elif role == "user":
            text = _text_of(m.get("content"), where).strip()
            label = m.get("strategy", m.get("reaction"))  # envs.base.EnvMessage calls it ``reaction``
            if label is not None:
                text = json.dumps({"utterance": text, "strategy": label}, ensure_ascii=False)
            new_role = "assistant"
        else:
            raise ValueError(f"{where}.role: got {role!r}; expected one of system, user, assistant, tool")
        if not text:
            continue  # an agent turn with only tool calls
        if out and out[-1]["role"] == new_role:
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": new_role, "content": text})
    if not out or out[0]["role"] == "assistant":
        out.insert(0, {"role": "user", "content": opening_message})
    if out[-1]["role"] != "user":
        raise ValueError("conversation: the simulated user spoke last (no agent text after its last message); "
                         "expected an agent message to respond to")
    return out


# ----------------------------------------------------------------------------- reply parsing


def _split_strings(text: str) -> list[tuple[bool, str]]:
    """Split text into (inside_a_quoted_string, chunk) pieces, for '...' and "..." with escapes."""
    pieces: list[tuple[bool, str]] = []
    i, start, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            if i > start:
                pieces.append((False, text[start:i]))
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            pieces.append((True, text[i:j]))
            i = start = j
        else:
            i += 1
    if start < n:
        pieces.append((False, text[start:]))
    return pieces


def _balanced_objects(text: str):
    """Yield balanced ``{...}`` substrings (string-aware, both quote kinds), outermost first, from
    each of the first ``_MAX_CANDIDATES`` opening braces."""
    starts = [m.start() for m in re.finditer(r"\{", text)][:_MAX_CANDIDATES]
    for s in starts:
        depth, i, n, quote = 0, s, len(text), None
        while i < n:
            c = text[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = None
            elif c in "\"'":
                # an apostrophe inside a word ("I'm") is not a quote outside strings
                if c == "'" and i > 0 and text[i - 1].isalnum():
                    pass
                else:
                    quote = c
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    yield text[s:i + 1]
                    break
            i += 1


def _loads_lenient(candidate: str) -> Any:
    try:
        return json.loads(candidate, strict=False)
    except ValueError:
        pass
    pieces = _split_strings(candidate)
    no_trailing = "".join(c if q else re.sub(r",(\s*[}\]])", r"\1", c) for q, c in pieces)
    try:
        return json.loads(no_trailing, strict=False)
    except ValueError:
        pass
    words = {"true": "True", "false": "False", "null": "None"}
    pythonic = "".join(c if q else re.sub(r"\b(true|false|null)\b", lambda m: words[m.group(1)], c) for q, c in pieces)
    return ast.literal_eval(pythonic)


def _field(obj: Mapping, keys: Sequence[str]) -> tuple[str | None, Any]:
    for k in keys:
        if k in obj and obj[k] is not None:
            return k, obj[k]
    return None, None


def _as_text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)


def _strip_debris(text: str) -> str:
    """The user's words in a reply whose JSON is malformed: the (possibly unterminated) value of an
    utterance key if there is one, else the text without fences, braces and quoted keys."""
    m = re.search(r"""["']?(?:utterance|message|response|text)["']?\s*:\s*(["'])""", text)
    if m:
        quote, j, n, out = m.group(1), m.end(), len(text), []
        while j < n and text[j] != quote:
            if text[j] == "\\" and j + 1 < n:
                nxt = text[j + 1]
                out.append({"n": "\n", "t": "\t", "r": ""}.get(nxt, nxt))
                j += 2
            else:
                out.append(text[j])
                j += 1
        value = "".join(out).strip()
        if value:
            return value
    t = re.sub(r"```[A-Za-z0-9_-]*", " ", text)
    t = re.sub(r"""["'][A-Za-z_][\w ]*["']\s*:""", " ", t)
    t = re.sub(r"[{}]", " ", t)
    t = "\n".join(" ".join(line.split()) for line in t.splitlines())
    return t.strip().strip(",\"' \n").strip()


def parse_reply(text: str) -> ParsedReply:
    """Parse the simulator's ``{"utterance": ..., "strategy": ...}`` reply from model text. Never
    raises. Well-formed JSON (anywhere in the text) round-trips exactly; see the module docstring
    for what is tolerated and the fallback."""
    try:
        return _parse_reply(text)
    except Exception as e:  # noqa: BLE001 - the parser must never raise on model text
        raw = text if isinstance(text, str) else str(text)
        return ParsedReply(raw.strip(), None, f"parser failure ({type(e).__name__})")


def _parse_reply(text: str) -> ParsedReply:
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    if not text.strip():
        return ParsedReply("", None, "empty reply")
    clipped = text[:_MAX_PARSE_CHARS]
    candidates = [clipped.strip()] if clipped.strip().startswith("{") else []
    found_object = False
    for candidate in [*candidates, *_balanced_objects(clipped)]:
        try:
            obj = _loads_lenient(candidate)
        except Exception:  # noqa: BLE001, S112 - ValueError, SyntaxError, RecursionError, MemoryError ...
            continue
        if not isinstance(obj, Mapping):
            continue
        found_object = True
        key, utterance = _field(obj, _UTTERANCE_KEYS)
        if key is None:
            continue
        _, strategy = _field(obj, _STRATEGY_KEYS)
        error = None if strategy is not None else "JSON reply has no 'strategy' field"
        return ParsedReply(_as_text(utterance), None if strategy is None else _as_text(strategy), error)
    reason = ("JSON object without an 'utterance' field" if found_object
              else "malformed JSON reply" if "{" in clipped else "no JSON object in reply")
    return ParsedReply(_strip_debris(clipped), None, reason)


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
        # The HTTP connection pool and the concurrency semaphore belong to one event loop: they are
        # made for the loop that first uses them and made again when another loop calls (a job that
        # runs each evaluation in its own ``asyncio.run``); the old loop's connections died with it.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None

    async def _bind(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._http is None:
            await self._drop_http()
            c = self.config
            self._http = httpx.AsyncClient(
                timeout=httpx.Timeout(c.read_timeout_s, connect=c.connect_timeout_s,
                                      pool=c.connect_timeout_s + c.read_timeout_s),
                limits=httpx.Limits(max_connections=c.max_concurrency, max_keepalive_connections=c.max_concurrency),
                trust_env=c.trust_env,
            )
            self._semaphore = asyncio.Semaphore(c.max_concurrency)
            self._loop = loop
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
        """Closes the current connection pool; one made in an event loop that has ended can only
        be dropped (its sockets went with the loop), so a failure to close it is ignored."""
        http, self._http, self._semaphore, self._loop = self._http, None, None, None
        if http is not None:
            try:
                await http.aclose()
            except Exception:  # noqa: BLE001 - the old loop's transports are gone already
                logger.debug("user simulator: dropped an HTTP pool of an ended event loop")

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
    def _message(body: bytes, require_content: bool) -> dict[str, Any]:
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
        return dict(message, content=content if isinstance(content, str) else None)

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

    async def chat(self, messages: Sequence[Mapping[str, Any]], *, extra: Mapping[str, Any] | None = None,
                   require_content: bool = True) -> tuple[dict[str, Any], int, float]:
        """One chat-completions call with the retry policy of the module docstring: the reply's
        ``choices[0].message`` (``content`` None when it holds only ``tool_calls`` and
        ``require_content`` is False), the HTTP attempts and the wall time. ``extra`` adds request
        fields (``tools``, ``response_format``, ...). Raises :class:`SimulatorError`. Counted in
        ``self.stats`` and in the collectors of `collect_call_stats`."""
        c = self.config
        if self._closed:
            raise RuntimeError("LLMUserClient: the client is closed; expected an open client")
        http, semaphore = await self._bind()
        payload: dict[str, Any] = {"model": c.model, "messages": list(messages), "temperature": c.temperature,
                                   "stream": False}
        if c.max_tokens is not None:
            payload["max_tokens"] = c.max_tokens
        payload.update(extra or {})
        headers = {"Content-Type": "application/json"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key.get()}"

        start = time.monotonic()
        counters = (self.stats, *_COLLECTORS.get())
        for st in counters:
            st.calls += 1
        attempts, status, reason, excerpt, kind = 0, None, "", "", "other_status"
        for retry in range(c.max_retries + 1):
            attempts += 1
            for st in counters:
                st.attempts += 1
            retry_after = None
            try:
                async with semaphore:
                    response = await http.post(c.url, json=payload, headers=headers)
            except httpx.TimeoutException as e:
                status, excerpt, reason, kind = None, "", f"timeout ({type(e).__name__})", "timeout"
            except httpx.RequestError as e:  # connection errors, truncated bodies, decoding errors
                status, excerpt, reason, kind = None, "", self._redact(f"{type(e).__name__}: {e}"), "connection"
            else:
                status, body = response.status_code, response.content
                if 200 <= status < 300:
                    try:
                        message = self._message(body, require_content)
                    except _BadBody as e:
                        excerpt, reason, kind = self._excerpt(body), f"HTTP {status}: {e}", e.kind
                    else:
                        return message, attempts, time.monotonic() - start
                elif status in _RETRYABLE_STATUS or 500 <= status < 600:
                    excerpt, kind = self._excerpt(body), failure_kind(status)
                    reason = f"HTTP {status}: {excerpt!r}"
                    retry_after = parse_retry_after(response.headers.get("retry-after"))
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

"""The OpenAI wire format: request bodies validated into typed requests, and the errors a server
answers with (host code, no I/O, no JAX).

Every refusal is an `APIError` whose JSON body is OpenAI's
``{"error": {"message", "type", "param", "code"}}``; ``param`` names the offending field and the
message says the value and what was expected. Fields the server does not read (``user``,
``metadata``, ``store``, ``parallel_tool_calls``, ...) are ignored, as OpenAI-compatible servers
do; fields that would change the output in a way it cannot honour (``tool_choice="required"``, a
``response_format`` other than text, penalties, ``logit_bias``, ``top_logprobs``) are refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["APIError", "ChatRequest", "CompletionRequest", "Sampling", "parse_chat", "parse_completion"]

#: roles a chat message may have (``developer`` is OpenAI's newer name for ``system``)
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4


class APIError(Exception):
    """A request the server answers with ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, type: str = "invalid_request_error",
                 code: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Sampling:
    """What both endpoints sample with: ``max_tokens`` None = the server's default (bounded by
    the room left in a cache row); ``seed`` None = the server's own stream of keys."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]
    parse_tools: bool  # tool_choice "auto" with tools: Qwen <tool_call> blocks become tool_calls
    template_kwargs: dict[str, Any]
    sampling: Sampling


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: tuple[str | tuple[int, ...], ...]  # each a text or token ids
    sampling: Sampling


# ----------------------------------------------------------------------------- field checks
def _bad(param: str, value: Any, expected: str) -> APIError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return APIError(400, f"{param}={shown}: expected {expected}", param=param)


def _number(body: Mapping, name: str, default: float, *, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        return_range = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise _bad(name, value, f"a number in {return_range}")
    return float(value)


def _int(body: Mapping, name: str, default: int | None, *, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        raise _bad(name, value, f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""))
    return value


def _bool(body: Mapping, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(name, value, "true or false")
    return value


def _model(body: Mapping) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", model, "the served model's name (GET /v1/models lists it)")
    return model


def _stop(body: Mapping) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or len(items) > MAX_STOP or not all(isinstance(s, str) and s for s in items):
        raise _bad("stop", stop, f"a non-empty string or a list of at most {MAX_STOP} non-empty strings")
    return tuple(items)


def _refuse_unsupported(body: Mapping) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise _bad(name, body[name], "0 or absent (penalties are not supported by this server)")
    if body.get("logit_bias"):
        raise _bad("logit_bias", body["logit_bias"], "absent (not supported by this server)")


def _sampling(body: Mapping, *, max_tokens_keys: tuple[str, ...], max_n: int, logprobs: bool) -> Sampling:
    _refuse_unsupported(body)
    max_tokens = None
    for key in max_tokens_keys:
        got = _int(body, key, None, lo=1)
        if got is not None:
            max_tokens = got if max_tokens is None else min(max_tokens, got)
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise _bad("stream_options", options, 'an object such as {"include_usage": true}')
    include_usage = _bool(options or {}, "include_usage", False)
    if include_usage and not stream:
        raise _bad("stream_options", options, "stream_options only with stream=true")
    if logprobs and stream:
        raise _bad("logprobs", True, "logprobs without stream=true (streamed log-probabilities are not supported)")
    return Sampling(temperature=_number(body, "temperature", 1.0, lo=0.0, hi=2.0),
                    top_p=_number(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),
                    max_tokens=max_tokens, stop=_stop(body), n=_int(body, "n", 1, lo=1, hi=max_n),
                    seed=_int(body, "seed", None, lo=-(2 ** 63), hi=2 ** 64 - 1), stream=stream,
                    include_usage=include_usage, logprobs=logprobs)


def _content(value: Any, where: str) -> str:
    """A message content: a string, null, or a list of text parts (joined)."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}.content[{j}]", part, 'a text part {"type": "text", "text": "..."} (this server '
                           "reads text only)")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(f"{where}.content", value, "a string, null or a list of text parts")


def _message(value: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(value, Mapping):
        raise _bad(where, value, "an object with role and content")
    role = value.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role", role, f"one of {', '.join(ROLES)}")
    msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": _content(value.get("content"), where)}
    if role == "assistant":
        calls = value.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list) or not all(isinstance(c, Mapping) for c in calls):
                raise _bad(f"{where}.tool_calls", calls, "a list of tool call objects")
            if calls:
                msg["tool_calls"] = [dict(c) for c in calls]
        if isinstance(value.get("reasoning_content"), str):
            msg["reasoning_content"] = value["reasoning_content"]
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if isinstance(value.get(key), str):
                msg[key] = value[key]
    return msg


def _tools(body: Mapping) -> tuple[dict[str, Any], ...]:
    tools = body.get("tools")
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise _bad("tools", tools, 'a list of {"type": "function", "function": {name, description, parameters}}')
    for j, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" or not isinstance(fn, Mapping) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools[{j}]", tool, 'a function tool {"type": "function", "function": {"name": ..., '
                       '"parameters": {...}}}')
    return tuple(dict(t) for t in tools)


# ----------------------------------------------------------------------------- requests
def parse_chat(body: Any, *, max_n: int) -> ChatRequest:
    """``POST /v1/chat/completions``'s body, validated (raises `APIError` 400 naming the field)."""
    if not isinstance(body, Mapping):
        raise APIError(400, "the request body must be a JSON object", param=None)
    model = _model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", messages, "a non-empty list of messages")
    msgs = tuple(_message(m, i) for i, m in enumerate(messages))
    tools = _tools(body)
    choice = body.get("tool_choice")
    if choice is None or choice == "auto":
        parse_tools = bool(tools)
    elif choice == "none":
        tools, parse_tools = (), False  # the model is not shown the tools, and its text is returned as text
    else:
        raise _bad("tool_choice", choice, "'auto' or 'none' (forcing a call is not supported by this server)")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        raise _bad("response_format", fmt, '{"type": "text"} or absent (constrained JSON output is not supported)')
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise _bad("chat_template_kwargs", kwargs, 'an object of template variables, e.g. {"enable_thinking": false}')
    logprobs = _bool(body, "logprobs", False)
    if body.get("top_logprobs") not in (None, 0):
        raise _bad("top_logprobs", body["top_logprobs"], "0 or absent (only the sampled token's log-probability is "
                   "returned)")
    sampling = _sampling(body, max_tokens_keys=("max_tokens", "max_completion_tokens"), max_n=max_n,
                         logprobs=logprobs)
    return ChatRequest(model, msgs, tools, parse_tools, dict(kwargs or {}), sampling)


def parse_completion(body: Any, *, max_n: int, vocab_size: int) -> CompletionRequest:
    """``POST /v1/completions``'s body: ``prompt`` a string, a list of strings, token ids, or a
    list of token-id lists (raises `APIError` 400 naming the field)."""
    if not isinstance(body, Mapping):
        raise APIError(400, "the request body must be a JSON object", param=None)
    model = _model(body)
    prompt = body.get("prompt")

    def ids(x) -> bool:
        return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(prompt, str):
        prompts: tuple = (prompt,)
    elif ids(prompt):
        prompts = (tuple(prompt),)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = tuple(prompt)
    elif isinstance(prompt, list) and prompt and all(ids(p) for p in prompt):
        prompts = tuple(tuple(p) for p in prompt)
    else:
        raise _bad("prompt", prompt, "a string, a list of strings, a list of token ids or a list of such lists")
    for p in prompts:
        if isinstance(p, str) and not p:
            raise _bad("prompt", p, "a non-empty prompt")
        if isinstance(p, tuple) and not all(0 <= t < vocab_size for t in p):
            raise _bad("prompt", list(p)[:8], f"token ids in [0, {vocab_size})")
    if _bool(body, "echo", False):
        raise _bad("echo", True, "false or absent (echo is not supported)")
    if body.get("suffix") not in (None, ""):
        raise _bad("suffix", body["suffix"], "absent (suffix is not supported)")
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0):
        raise _bad("logprobs", logprobs, "0 (the sampled token's log-probability) or absent; top alternatives are not "
                   "returned")
    sampling = _sampling(body, max_tokens_keys=("max_tokens",), max_n=max_n, logprobs=logprobs == 0)
    if body.get("max_tokens") is None:  # OpenAI's default for the legacy completions endpoint
        sampling = dataclasses.replace(sampling, max_tokens=16)
    return CompletionRequest(model, prompts, sampling)

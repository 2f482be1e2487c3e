"""The OpenAI wire format: request bodies validated into typed requests, and the errors a server
answers with (host code, no I/O, no JAX).

Every refusal is an `APIError` whose JSON body is OpenAI's
``{"error": {"message", "type", "param", "code"}}``; ``param`` names the offending field and the
message says the value and what was expected. Fields the server does not read (``user``,
``metadata``, ``store``, ``parallel_tool_calls``, ...) are ignored, as OpenAI-compatible servers
do; fields that would change the output in a way it cannot honour (``tool_choice="required"``, a
``response_format`` other than text, penalties, ``logit_bias``, ``top_logprobs``) are refused.

Before any field is read, the whole body is checked for structure (`check_structure`): at most
`MAX_DEPTH` nested arrays/objects, no lone UTF-16 surrogate (``"\\ud800"`` parses in Python's
``json`` but cannot be encoded) in any string or key, no NaN or Infinity; a refusal names the path
(``messages[0].content``). A chat's tool schemas must be JSON Schemas (checked with ``jsonschema``
against the draft their ``$schema`` names, 2020-12 without one) of ``"type": "object"`` (or
``{}``, no parameters), at most `MAX_SCHEMA_NODES` objects and arrays in all, tool names OpenAI's
``^[a-zA-Z0-9_-]{1,64}$``, and a ``tool`` message must answer a call of the assistant message its
run of tool messages follows (`_check_order`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_SCHEMA_NODES", "MAX_TOOLS", "APIError", "ChatRequest", "CompletionRequest", "Sampling",
           "check_structure", "parse_chat", "parse_completion"]

#: roles a chat message may have (``developer`` is OpenAI's newer name for ``system``)
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4
#: the most arrays/objects nested in one another that a body may hold (the body itself is 1);
#: a tool schema or call arguments need a handful, and Python's recursion (the chat template's
#: ``tojson``, ``jsonschema``) stays far from its limit
MAX_DEPTH = 64
#: OpenAI's rule for a function tool's name, and its most tools in a request
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
MAX_TOOLS = 128
#: the most objects and arrays that a request's tool schemas hold together (a tau2 domain's tools
#: hold 90-170): checking a schema against Draft 2020-12's metaschema costs ~0.25 ms for each (its
#: vocabularies are $ref/$dynamicRef chains), so fresh schemas cost at most ~0.5 s a request
MAX_SCHEMA_NODES = 2048
#: template variables a request may not set: what the renderer passes itself, and the Jinja
#: environment's globals (a string in place of ``namespace`` or ``raise_exception`` is a TypeError
#: in the template, not a refusal)
RESERVED_TEMPLATE_VARS = frozenset({"messages", "tools", "documents", "add_generation_prompt", "special_tokens",
                                    "ignore_raise_exception", "raise_exception", "strftime_now", "range", "dict",
                                    "lipsum", "cycler", "joiner", "namespace", "loop", "self", "caller", "varargs",
                                    "kwargs"})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SURROGATE = re.compile("[\ud800-\udfff]")


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


# ----------------------------------------------------------------------------- structure
def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if _IDENT.fullmatch(key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{json.dumps(key)}]"  # ASCII: a lone surrogate in a key is shown escaped


def _leaf(v: Any, path: str) -> None:
    """A value that is not an array or object: refused unless it is a JSON scalar Python can encode."""
    if isinstance(v, str):
        if _SURROGATE.search(v):
            raise _bad(path or "body", v, "a string of Unicode characters (a lone UTF-16 surrogate such as \\ud800 is "
                       "not one)")
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise _bad(path or "body", v, "a finite number (NaN and Infinity are not JSON)")
    elif not (v is None or isinstance(v, (bool, int))):
        raise _bad(path or "body", v, "a JSON value")


def check_structure(value: Any, where: str = "", *, depth: int = 0) -> None:
    """Raises `APIError` 400 naming the path of the first place where ``value`` nests
    arrays/objects more than `MAX_DEPTH` deep, holds a string or key with a lone surrogate, a NaN or
    an Infinity, or a value that is not JSON. ``where`` is ``value``'s own path ("" for a body) and
    ``depth`` the number of arrays/objects enclosing it. Iterative (a deep value costs no
    recursion); a path is spelled out only for a nested array/object or an error."""
    if not isinstance(value, (list, Mapping)):
        _leaf(value, where)
        return
    stack: list[tuple[Any, str, int]] = [(value, where, depth + 1)]
    while stack:
        v, path, d = stack.pop()
        if d > MAX_DEPTH:
            raise APIError(400, f"{path or 'body'}: arrays and objects nested more than {MAX_DEPTH} deep; expected at "
                           f"most {MAX_DEPTH} levels", param=path or None)
        if isinstance(v, list):
            items: Any = enumerate(v)
        else:
            for k in v:
                if not isinstance(k, str) or _SURROGATE.search(k):
                    raise _bad(_path(path, k) if isinstance(k, str) else path or "body", k,
                               "an object key of Unicode characters (a lone UTF-16 surrogate is not one)")
            items = v.items()
        nested = []
        for k, x in items:
            t = type(x)
            if t is int or t is bool or x is None or (t is str and x.isascii()):
                continue  # the common case, settled without a call
            if isinstance(x, (list, Mapping)):
                nested.append((x, _path(path, k), d + 1))
            else:
                _leaf(x, _path(path, k))
        stack.extend(reversed(nested))


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


def _bool(body: Mapping, name: str, default: bool, *, where: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(where + name, value, "true or false")
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
    include_usage = _bool(options or {}, "include_usage", False, where="stream_options.")
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


def _optional_str(value: Mapping, key: str, where: str) -> str | None:
    v = value.get(key)
    if v is not None and not isinstance(v, str):
        raise _bad(f"{where}.{key}", v, "a string or null")
    return v


#: how many arrays/objects enclose a call's ``function.arguments``: the body, messages, the message,
#: its tool_calls, the call, its function
_ARGUMENTS_DEPTH = 6


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` in OpenAI's form, each checked: ``id`` a string,
    ``type`` function, ``function.name`` a non-empty string, ``function.arguments`` a JSON object
    or a string holding one (a blank string counts as ``{}``, as some servers send for a call
    without arguments). Returned with the arguments parsed (the renderer's form)."""
    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls", calls, "a list of tool call objects")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, Mapping):
            raise _bad(at, call, 'a tool call {"id": ..., "type": "function", "function": {"name": ..., '
                       '"arguments": "{...}"}}')
        call_id = _optional_str(call, "id", at)
        if call.get("type") not in (None, "function"):
            raise _bad(f"{at}.type", call["type"], "'function'")
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            raise _bad(f"{at}.function", fn, 'an object {"name": ..., "arguments": "{...}"}')
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{at}.function.name", name, "the called tool's name (a non-empty string)")
        raw = fn.get("arguments")
        args = raw
        if isinstance(raw, str):
            try:
                args = json.loads(raw) if raw.strip() else {}
            except (ValueError, RecursionError):
                args = None
        if not isinstance(args, Mapping):
            raise _bad(f"{at}.function.arguments", raw, "a JSON object, or a string holding one")
        if isinstance(raw, str):  # what the string held is checked as the body was
            check_structure(args, f"{at}.function.arguments", depth=_ARGUMENTS_DEPTH)
        out.append({**({"id": call_id} if call_id is not None else {}), "type": "function",
                    "function": {"name": name, "arguments": args}})
    return out


def _message(value: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(value, Mapping):
        raise _bad(where, value, "an object with role and content")
    role = value.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role", role, f"one of {', '.join(ROLES)}")
    msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": _content(value.get("content"), where)}
    name = _optional_str(value, "name", where)
    if role == "assistant":
        calls = value.get("tool_calls")
        if calls is not None:
            calls = _tool_calls(calls, where)
            if calls:
                msg["tool_calls"] = calls
        reasoning = _optional_str(value, "reasoning_content", where)
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
    if role == "tool":
        call_id = _optional_str(value, "tool_call_id", where)
        if call_id is not None:
            msg["tool_call_id"] = call_id
        if name is not None:
            msg["name"] = name
    return msg


def _ids(ids: list[str | None]) -> str:
    shown = [repr(c if len(c) <= 40 else c[:37] + "...") for c in ids if c is not None][:8]
    return ", ".join(shown) + (", ..." if len([c for c in ids if c is not None]) > 8 else "") or "none"


def _check_order(msgs: tuple[dict[str, Any], ...]) -> None:
    """Every ``tool`` message answers a call of the assistant message its run of tool messages
    follows (only tool messages between them): the call whose ``id`` its ``tool_call_id`` is, or,
    without a ``tool_call_id`` (a leniency: the chat template pairs results with calls in order),
    the first call not answered yet. Refused: a tool message that follows no assistant message with
    calls, an id that names no call of it (or one answered already), a result beyond its calls.
    Calls left unanswered are not refused (the template renders them as they are)."""
    open_at: int | None = None
    waiting: list[str | None] = []  # the ids of the open message's calls not answered yet
    for i, m in enumerate(msgs):
        role = m["role"]
        if role == "tool":
            where, call_id = f"messages[{i}].tool_call_id", m.get("tool_call_id")
            if open_at is None:
                raise _bad(where, call_id, "the id of a call of the assistant message before (a tool message answers "
                           "a tool call; this one follows no assistant message with tool_calls)")
            if call_id is None:
                if not waiting:
                    raise _bad(where, call_id, f"a result for a call of messages[{open_at}], whose "
                               f"{len(msgs[open_at]['tool_calls'])} call(s) are all answered")
                waiting.pop(0)
            elif call_id in waiting:
                waiting.remove(call_id)
            else:
                raise _bad(where, call_id, f"the id of a call of messages[{open_at}] not answered yet "
                           f"({_ids(waiting)})")
        elif role == "assistant" and m.get("tool_calls"):
            open_at, waiting = i, [c.get("id") for c in m["tool_calls"]]
        else:
            open_at, waiting = None, []


_FUNCTION_TOOL = 'a function tool {"type": "function", "function": {"name": ..., "parameters": {...}}}'


def _tools(body: Mapping) -> tuple[dict[str, Any], ...]:
    tools = body.get("tools")
    if tools is None:
        return ()
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise _bad("tools", tools, f"a list of at most {MAX_TOOLS}, each {_FUNCTION_TOOL}")
    nodes = 0
    for j, tool in enumerate(tools):
        at = f"tools[{j}]"
        if not isinstance(tool, Mapping):
            raise _bad(at, tool, _FUNCTION_TOOL)
        if tool.get("type") not in (None, "function"):
            raise _bad(f"{at}.type", tool["type"], "'function' (the only kind of tool)")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise _bad(f"{at}.function", fn, 'an object {"name": ..., "description": ..., "parameters": {...}}')
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise _bad(f"{at}.function.name", name, "1 to 64 letters, digits, underscores or dashes (OpenAI's "
                       "^[a-zA-Z0-9_-]{1,64}$)")
        _optional_str(fn, "description", f"{at}.function")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise _bad(f"{at}.function.strict", fn["strict"], "true, false or null")
        if fn.get("parameters") is not None:
            nodes += _containers(fn["parameters"], MAX_SCHEMA_NODES - nodes + 1)
            if nodes > MAX_SCHEMA_NODES:
                raise APIError(400, f"{at}.function.parameters: the tools' parameters hold more than "
                               f"{MAX_SCHEMA_NODES} objects and arrays together; expected at most {MAX_SCHEMA_NODES}",
                               param=f"{at}.function.parameters")
            _parameters(fn["parameters"], f"{at}.function.parameters")
    return tuple(dict(t) for t in tools)


def _containers(value: Any, limit: int) -> int:
    """How many objects and arrays ``value`` holds, itself included (counting stops past ``limit``)."""
    n, stack = 0, [value]
    while stack and n <= limit:
        v = stack.pop()
        if isinstance(v, Mapping):
            n += 1
            stack.extend(x for x in v.values() if isinstance(x, (list, Mapping)))
        elif isinstance(v, list):
            n += 1
            stack.extend(x for x in v if isinstance(x, (list, Mapping)))
    return n


def _parameters(schema: Any, at: str) -> None:
    """A function's ``parameters``: a JSON Schema object of ``"type": "object"``, or ``{}`` (no
    parameters), valid against the metaschema of the draft its ``$schema`` names (2020-12 without
    one). A schema is checked once: the verdicts on small schemas are cached (clients send the
    same tools with every turn)."""
    if not isinstance(schema, Mapping):
        raise _bad(at, schema, 'a JSON Schema object such as {"type": "object", "properties": {...}}')
    if not schema:
        return
    if schema.get("type") != "object":
        raise _bad(f"{at}.type", schema.get("type"), "'object' (a function's parameters are a JSON Schema of type "
                   "object)")
    canonical = json.dumps(schema, sort_keys=True, ensure_ascii=False)
    problem = _schema_problem(canonical) if len(canonical) <= _CACHED_SCHEMA_CHARS else \
        _schema_problem.__wrapped__(canonical)
    if problem is not None:
        where, message = problem
        raise APIError(400, f"{at}{where}: not a valid JSON Schema: {message}", param=at + where)


#: schemas up to this size (canonical JSON) have their verdict cached
_CACHED_SCHEMA_CHARS = 1 << 16


@functools.lru_cache(maxsize=256)
def _schema_problem(canonical: str) -> tuple[str, str] | None:
    """None for a valid schema, else (the path inside it, what is wrong); thread-safe (lru_cache)."""
    import jsonschema
    from jsonschema.validators import validator_for

    schema = json.loads(canonical)
    meta = schema.get("$schema")
    cls = jsonschema.Draft202012Validator
    if meta is not None:
        try:
            cls = validator_for(schema, default=None) if isinstance(meta, str) else None
        except Exception:  # noqa: BLE001 - a $schema that is no URI (urllib's ValueError)
            cls = None
        if cls is None:
            shown = repr(meta) if len(repr(meta)) <= 80 else repr(meta)[:77] + "..."
            return '["$schema"]', (f"{shown}: expected the URI of a JSON Schema draft (draft-04, -06, -07, 2019-09, "
                                   "2020-12) or no $schema (2020-12)")
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = ""
        for key in e.path:
            where = _path(where, key)
        where = where if not where or where.startswith("[") else "." + where
        message = e.message if len(e.message) <= 300 else e.message[:297] + "..."
        return where, message
    except Exception as e:  # noqa: BLE001 - a checker that fails on the schema (a pattern re cannot compile, ...)
        return "", f"{type(e).__name__}: {str(e)[:200]}"
    return None


# ----------------------------------------------------------------------------- requests
def parse_chat(body: Any, *, max_n: int) -> ChatRequest:
    """``POST /v1/chat/completions``'s body, validated (raises `APIError` 400 naming the field)."""
    if not isinstance(body, Mapping):
        raise APIError(400, "the request body must be a JSON object", param=None)
    check_structure(body)
    model = _model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", messages, "a non-empty list of messages")
    msgs = tuple(_message(m, i) for i, m in enumerate(messages))
    _check_order(msgs)
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
    for key in kwargs or {}:
        if not _IDENT.fullmatch(key) or key in RESERVED_TEMPLATE_VARS:
            raise _bad(_path("chat_template_kwargs", key), key, "a template variable's name: an identifier, and not "
                       "one the server sets (messages, tools, add_generation_prompt, raise_exception, namespace, ...)")
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
    check_structure(body)
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

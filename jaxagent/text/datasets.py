"""Chat training data in the conventions of transformers / TRL: each JSONL row's format detected,
every field validated, the row located on error (host code; docs/DATA.md has the JSON schemas and
example files).

Formats (one JSON object a line; blank lines are skipped; keys a format does not name are
ignored, as TRL ignores a dataset's extra columns):

- **messages** (SFT; TRL's conversational language modeling): ``{"messages": [message, ...],
  "tools": [schema, ...]?}``. Every assistant message is trained on, nothing else (TRL's
  ``assistant_only_loss``); at least one assistant message.
- **prompt-completion** (SFT): standard ``{"prompt": str, "completion": str}``, or conversational
  ``{"prompt": [message, ...], "completion": [assistant message, ...], "tools"?}``: the completion
  trained on (TRL's ``completion_only_loss``).
- **preference** (DPO): standard ``{"prompt": str, "chosen": str, "rejected": str}``, or
  conversational ``{"prompt": [message, ...], "chosen": [assistant message, ...], "rejected":
  [assistant message, ...], "tools"?}``. Chosen and rejected differ.

A message is OpenAI's chat message: ``{"role": "system" | "user" | "assistant" | "tool",
"content": str, ...}``; an assistant message may carry ``tool_calls`` (``[{"id"?, "type"?:
"function", "function": {"name": str, "arguments": <JSON object, or a string holding one>}}]``;
``content`` may then be null or absent) and ``reasoning_content``; a tool message
``tool_call_id`` and ``name``; any message ``name``. Other message keys must be absent or null. A
conversation opens with a system or user message; a system message only comes first; a tool
message only follows an assistant message with tool calls (at most one result per call, its
``tool_call_id`` one of those calls' ids when they have ids); an assistant message has a
non-blank content or a tool call. ``tools`` are OpenAI function schemas (``{"type"?: "function",
"function": {"name": str, "description"?: str, "parameters"?: object}}``, names distinct); with
``tools`` every tool call names one of them. The standard (string) forms take no ``tools``.

Parsed records (the messages normalised to what `jaxagent.text.chat.ChatRenderer` and
`jaxagent.envs.base.Demo` take: ``content`` a string, tool calls as
``{"type": "function", "function": {"name", "arguments": dict}}``, null keys dropped, a tool
message's missing ``name`` filled in from its call):

- `TextExample` (prompt, completion: str) and `ChatExample` (messages [M], train [M] bool, tools);
- `TextPair` (prompt, chosen, rejected: str) and `ChatPair` (prompt [P], chosen [C], rejected
  [R] messages, tools).

Each has a ``kind`` (its format, for counts). `parse_sft_row` / `parse_pair_row` turn one decoded
row into a record or raise `FieldError` (the field's path, e.g. ``messages[2].role``, its value and
what was expected); `read_jsonl` reads a file through such a parser into `Located` records and
raises `DataError`, the same located: ``data.jsonl:17: messages[2].role='bot': expected one of
system, user, assistant, tool``. Rendering to tokens is the jobs' (`jaxagent.jobs.datasets`, with
the rollout's `render_demo`): nothing here tokenises.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from jaxagent.text.spans import ROLES
from jaxagent.text.toolcalls import ToolCall


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


#: the value of a field the row does not have
MISSING: Any = _Missing()


def _shown(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= 120 else s[:117] + "..."


class FieldError(ValueError):
    """A row's field holding what it must not: ``field`` (its path in the row, e.g.
    ``messages[2].tool_calls[0].function.arguments``), the ``value`` found (`MISSING` when absent) and
    what was ``expected``."""

    def __init__(self, field: str, value: Any, expected: str):
        self.field, self.value, self.expected = field, value, expected
        found = " missing" if value is MISSING else f"={_shown(value)}"
        super().__init__(f"{field}{found}: expected {expected}")


class DataError(FieldError):
    """A `FieldError` located in its file: ``path:line: field=value: expected ...``."""

    def __init__(self, path: str | os.PathLike, line: int, field: str, value: Any, expected: str):
        super().__init__(field, value, expected)
        self.path, self.line = str(path), line
        self.args = (f"{self.path}:{line}: {self.args[0]}",)


class Located(NamedTuple):
    """A parsed row and where it was read: ``path`` and 1-based ``line``."""

    path: str
    line: int
    record: Any


# ----------------------------------------------------------------------------- records
@dataclasses.dataclass(frozen=True)
class TextExample:
    """A standard prompt-completion SFT row: the completion is trained on."""

    prompt: str
    completion: str
    kind: str = "prompt_completion"


@dataclasses.dataclass(frozen=True)
class ChatExample:
    """A conversation to imitate: the normalised ``messages``, per message whether it is trained on
    (``train``: assistant messages only), the tool schemas the system turn lists."""

    messages: tuple[dict, ...]
    train: tuple[bool, ...]
    tools: tuple[dict, ...] = ()
    kind: str = "messages"


@dataclasses.dataclass(frozen=True)
class TextPair:
    """A standard preference pair: one prompt, the chosen and the rejected completion."""

    prompt: str
    chosen: str
    rejected: str
    kind: str = "standard"


@dataclasses.dataclass(frozen=True)
class ChatPair:
    """A conversational preference pair: the prompt's messages, the chosen and the rejected
    assistant message(s), the tool schemas."""

    prompt: tuple[dict, ...]
    chosen: tuple[dict, ...]
    rejected: tuple[dict, ...]
    tools: tuple[dict, ...] = ()
    kind: str = "conversational"


# ----------------------------------------------------------------------------- fields
def _fail(field: str, value: Any, expected: str) -> None:
    raise FieldError(field, value, expected)


def _nonblank(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _row(obj: Any) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        _fail("row", obj, "a JSON object")
    return obj


_KEYS = {"system": ("role", "content", "name"), "user": ("role", "content", "name"),
         "assistant": ("role", "content", "name", "tool_calls", "reasoning_content"),
         "tool": ("role", "content", "name", "tool_call_id")}
_CALL = "a tool call {'id'?: str, 'type'?: 'function', 'function': {'name': str, 'arguments': {...}}}"


def _only(obj: Mapping[str, Any], where: str, allowed: Sequence[str], what: str) -> None:
    """Every key of ``obj`` outside ``allowed`` absent or null."""
    for k, v in obj.items():
        if k not in allowed and v is not None:
            _fail(f"{where}.{k}", v, f"absent or null ({what} holds {', '.join(allowed)})")


def _tools(value: Any) -> tuple[tuple[dict, ...], frozenset[str] | None]:
    """(the schemas, their names; None without tools)."""
    if value is None:
        return (), None
    if not isinstance(value, list):
        _fail("tools", value, "a list of OpenAI function schemas [{'type': 'function', 'function': {'name': ...}}]")
    names: list[str] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            _fail(where, tool, "a function schema {'type': 'function', 'function': {'name': ..., 'parameters': ...}}")
        if tool.get("type") is not None and tool.get("type") != "function":
            _fail(f"{where}.type", tool["type"], "'function'")
        fn = tool.get("function", MISSING)
        if not isinstance(fn, Mapping):
            _fail(f"{where}.function", fn, "an object {'name': str, 'description'?: str, 'parameters'?: {...}}")
        if not _nonblank(fn.get("name")):
            _fail(f"{where}.function.name", fn.get("name", MISSING), "a non-empty string")
        if fn["name"] in names:
            _fail(f"{where}.function.name", fn["name"], "a name no other tool of the row has")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            _fail(f"{where}.function.description", fn["description"], "a string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], Mapping):
            _fail(f"{where}.function.parameters", fn["parameters"], "a JSON schema object")
        names.append(fn["name"])
    return tuple(json.loads(json.dumps(t)) for t in value), frozenset(names)


def _tool_call(call: Any, where: str, names: frozenset[str] | None) -> tuple[ToolCall, str | None]:
    """(the call, its id)."""
    if not isinstance(call, Mapping):
        _fail(where, call, _CALL)
    _only(call, where, ("id", "type", "function"), "a tool call")
    cid = call.get("id")
    if cid is not None and not _nonblank(cid):
        _fail(f"{where}.id", cid, "a non-empty string (or null)")
    if call.get("type") is not None and call["type"] != "function":
        _fail(f"{where}.type", call["type"], "'function'")
    fn = call.get("function", MISSING)
    if not isinstance(fn, Mapping):
        _fail(f"{where}.function", fn, "an object {'name': str, 'arguments': <JSON object, or a string holding one>}")
    _only(fn, f"{where}.function", ("name", "arguments"), "a tool call's function")
    name = fn.get("name", MISSING)
    if not _nonblank(name):
        _fail(f"{where}.function.name", name, "a non-empty string")
    if names is not None and name not in names:
        _fail(f"{where}.function.name", name, f"one of the row's tools ({', '.join(sorted(names))})")
    args = fn.get("arguments", MISSING)
    parsed = args
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except (ValueError, RecursionError) as e:
            _fail(f"{where}.function.arguments", args, f"a JSON object, or a string holding one (invalid JSON: {e})")
    if not isinstance(parsed, dict):
        _fail(f"{where}.function.arguments", args, "a JSON object, or a string holding one")
    return ToolCall(name, parsed), cid


def _message(m: Any, where: str, names: frozenset[str] | None) -> tuple[dict, list[tuple[str | None, str]]]:
    """(the normalised message, its calls' (id, name))."""
    if not isinstance(m, Mapping):
        _fail(where, m, "a message {'role': ..., 'content': ...}")
    role = m.get("role", MISSING)
    if role not in ROLES:
        _fail(f"{where}.role", role, f"one of {', '.join(ROLES)}")
    _only(m, where, _KEYS[role], f"a {role} message")
    out: dict[str, Any] = {"role": role}
    calls: list[tuple[str | None, str]] = []
    raw_calls = m.get("tool_calls")
    if raw_calls is not None and not isinstance(raw_calls, list):
        _fail(f"{where}.tool_calls", raw_calls, "a list of tool calls (OpenAI form)")
    parsed = [_tool_call(c, f"{where}.tool_calls[{j}]", names) for j, c in enumerate(raw_calls or [])]
    content = m.get("content", MISSING)
    if (content is None or content is MISSING) and parsed:
        content = ""
    if not isinstance(content, str):
        _fail(f"{where}.content", content, "a string" + (" (or null beside tool_calls)" if role == "assistant" else ""))
    if role == "assistant" and not content.strip() and not parsed:
        _fail(f"{where}.content", content, "a non-blank string, or tool_calls (an assistant turn says or calls "
                                           "something)")
    out["content"] = content
    for key in ("name", "tool_call_id", "reasoning_content"):
        v = m.get(key)
        if v is None:
            continue
        if not isinstance(v, str) or (key != "reasoning_content" and not v.strip()):
            _fail(f"{where}.{key}", v, "a string" if key == "reasoning_content" else "a non-empty string")
        out[key] = v
    if parsed:
        out["tool_calls"] = [c.to_dict() for c, _ in parsed]
        calls = [(cid, c.name) for c, cid in parsed]
    return out, calls


def _conversation(items: Sequence[tuple[str, Any]], names: frozenset[str] | None) -> list[dict]:
    """The messages ``items`` ((field path, message) in order), validated as one conversation."""
    out: list[dict] = []
    open_calls: list[tuple[str | None, str]] | None = None
    results = 0
    for i, (where, m) in enumerate(items):
        msg, calls = _message(m, where, names)
        role = msg["role"]
        if role == "system" and i:
            _fail(f"{where}.role", role, "'system' only as the conversation's first message")
        if role == "assistant" and not i:
            _fail(f"{where}.role", role, "a system or user message first (an assistant turn answers one)")
        if role == "tool":
            if open_calls is None:
                _fail(f"{where}.role", role, "'tool' only after an assistant message with tool_calls (or another "
                                             "tool result)")
            if results >= len(open_calls):
                _fail(f"{where}.role", role, f"at most {len(open_calls)} tool result(s) after an assistant message "
                                             f"with {len(open_calls)} tool call(s)")
            ids = [c for c, _ in open_calls if c is not None]
            tcid = msg.get("tool_call_id")
            if tcid is not None and ids and tcid not in ids:
                _fail(f"{where}.tool_call_id", tcid, f"the id of a tool call of the assistant message before "
                                                     f"({', '.join(ids)})")
            if "name" not in msg:
                by_id = [n for c, n in open_calls if c is not None and c == tcid]
                msg["name"] = by_id[0] if by_id else open_calls[results][1]
            results += 1
        elif role == "assistant" and calls:
            open_calls, results = calls, 0
        else:
            open_calls = None
        out.append(msg)
    return out


def _messages_list(value: Any, field: str) -> list:
    if not isinstance(value, list) or not value:
        _fail(field, value, "a non-empty list of messages")
    return value


def _completion(prompt: list, value: Any, field: str, names: frozenset[str] | None) -> tuple[list[dict], list[dict]]:
    """The completion ``value`` (assistant messages) after ``prompt``, validated with it as one
    conversation: (the prompt's messages, the completion's)."""
    msgs = _messages_list(value, field)
    items = [(f"prompt[{i}]", m) for i, m in enumerate(prompt)] + [(f"{field}[{j}]", m) for j, m in enumerate(msgs)]
    conv = _conversation(items, names)
    for j, m in enumerate(conv[len(prompt):]):
        if m["role"] != "assistant":
            _fail(f"{field}[{j}].role", m["role"], f"'assistant' ({field} holds the assistant's message(s))")
    return conv[:len(prompt)], conv[len(prompt):]


def _no_tools(obj: Mapping[str, Any]) -> None:
    if obj.get("tools") is not None:
        _fail("tools", obj["tools"], "absent or null in the standard (string) form (tools render in conversational "
                                     "rows: give prompt as a list of messages)")


def _text(obj: Mapping[str, Any], field: str, prompt_form: str) -> str:
    v = obj.get(field, MISSING)
    if not isinstance(v, str):
        _fail(field, v, f"a string, as prompt is (the {prompt_form} form)")
    if not v.strip():
        _fail(field, v, "a non-blank string")
    return v


_FORM = "a string (the standard form) or a non-empty list of messages (the conversational form)"


# ----------------------------------------------------------------------------- rows
def parse_sft_row(obj: Any) -> TextExample | ChatExample:
    """One SFT row (decoded JSON) as a record: a ``messages`` row, else a prompt-completion row
    (module docstring); `FieldError` on a bad field."""
    obj = _row(obj)
    if "messages" in obj:
        tools, names = _tools(obj.get("tools"))
        msgs = _messages_list(obj["messages"], "messages")
        conv = _conversation([(f"messages[{i}]", m) for i, m in enumerate(msgs)], names)
        if not any(m["role"] == "assistant" for m in conv):
            _fail("messages", [m["role"] for m in conv], "at least one assistant message (the turns trained on)")
        return ChatExample(tuple(conv), tuple(m["role"] == "assistant" for m in conv), tools)
    if "prompt" not in obj and "completion" not in obj:
        _fail("row", sorted(obj), "the keys 'messages', or 'prompt' and 'completion' (docs/DATA.md)")
    prompt = obj.get("prompt", MISSING)
    if isinstance(prompt, str):
        _no_tools(obj)
        return TextExample(_text(obj, "prompt", "standard"), _text(obj, "completion", "standard"))
    if not isinstance(prompt, list) or not prompt:
        _fail("prompt", prompt, _FORM)
    tools, names = _tools(obj.get("tools"))
    head, completion = _completion(prompt, obj.get("completion", MISSING), "completion", names)
    return ChatExample(tuple(head + completion), tuple([False] * len(head) + [True] * len(completion)), tools,
                       kind="prompt_completion_chat")


def parse_pair_row(obj: Any) -> TextPair | ChatPair:
    """One preference row (decoded JSON) as a record (module docstring); `FieldError` on a bad field."""
    obj = _row(obj)
    if not any(k in obj for k in ("prompt", "chosen", "rejected")):
        _fail("row", sorted(obj), "the keys 'prompt', 'chosen' and 'rejected' (docs/DATA.md)")
    prompt = obj.get("prompt", MISSING)
    if isinstance(prompt, str):
        _no_tools(obj)
        pair = TextPair(_text(obj, "prompt", "standard"), _text(obj, "chosen", "standard"),
                        _text(obj, "rejected", "standard"))
    elif isinstance(prompt, list) and prompt:
        tools, names = _tools(obj.get("tools"))
        head, chosen = _completion(prompt, obj.get("chosen", MISSING), "chosen", names)
        _, rejected = _completion(prompt, obj.get("rejected", MISSING), "rejected", names)
        pair = ChatPair(tuple(head), tuple(chosen), tuple(rejected), tools)
    else:
        _fail("prompt", prompt, _FORM + " (the implicit-prompt form, whole conversations in chosen and rejected, is "
                                        "not read: put the shared prompt in 'prompt')")
    if pair.chosen == pair.rejected:
        _fail("rejected", obj.get("rejected"), "a completion other than the chosen one")
    return pair


def read_jsonl(path: str | os.PathLike, parse: Callable[[Any], Any]) -> list[Located]:
    """Every row of the JSONL file ``path`` through ``parse`` (e.g. `parse_sft_row`), located;
    blank lines skipped. Raises `DataError` (file, line, field, value, expectation) on a line that is
    not UTF-8, not one JSON object, or that ``parse`` refuses with a `FieldError`; `OSError` when the
    file cannot be read."""
    out: list[Located] = []
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(path, i, "row", raw[max(0, e.start - 20):e.start + 20],
                                f"UTF-8 text ({e.reason} at byte {e.start})") from None
            if i == 1:
                text = text.removeprefix("\ufeff")
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as e:
                raise DataError(path, i, "row", text.strip(), f"one JSON object a line (invalid JSON: {e})") from None
            try:
                out.append(Located(str(path), i, parse(obj)))
            except FieldError as e:
                raise DataError(path, i, e.field, e.value, e.expected) from None
    return out


__all__ = ["MISSING", "ChatExample", "ChatPair", "DataError", "FieldError", "Located", "TextExample", "TextPair",
           "parse_pair_row", "parse_sft_row", "read_jsonl"]

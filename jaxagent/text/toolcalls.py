"""Parse generated assistant text into thinking, content and structured tool calls (host code).

The format is Qwen's (Hermes-style): an optional leading ``<think>...</think>`` block, free text,
and tool calls written as::

    <tool_call>
    {"name": "get_order", "arguments": {"order_id": "W123"}}
    </tool_call>

``parse_assistant`` never raises on text: every malformed call becomes a :class:`ToolCallError`
value (with a reason code and the raw text) in ``ParsedAssistant.errors``, so a rollout can feed the
error back to the model or score it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["ParsedAssistant", "ToolCall", "ToolCallError", "format_tool_call", "parse_assistant",
           "tool_call_from_dict"]

THINK_START, THINK_END = "<think>", "</think>"
CALL_START, CALL_END = "<tool_call>", "</tool_call>"


@dataclasses.dataclass(frozen=True, eq=True)
class ToolCall:
    """One function call: ``name`` and its JSON-object ``arguments``.

    Equal when the names and the arguments are equal (Python equality of the decoded JSON, so
    ``{"n": 1}`` equals ``{"n": 1.0}``). Hashable, with a hash consistent with that equality (of a
    frozen copy of the arguments: objects as frozensets of items, arrays as tuples), so calls can be
    set members and dict keys, e.g. to cache tool results. Do not mutate the ``arguments`` of a call
    that is in a set or a dict.
    """

    name: str
    arguments: dict[str, Any]

    def __hash__(self) -> int:
        return hash((self.name, _frozen(self.arguments)))

    def to_dict(self) -> dict[str, Any]:
        """OpenAI / transformers message form: ``{"type": "function", "function": {...}}``."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass(frozen=True)
class ToolCallError:
    """A tool call that could not be parsed.

    ``reason`` is one of ``"unclosed"`` (``<tool_call>`` without ``</tool_call>``),
    ``"invalid_json"``, ``"not_an_object"``, ``"missing_name"`` (absent or not a non-empty string),
    ``"missing_arguments"``, ``"bad_arguments"`` (not a JSON object, nor a string holding one).
    ``message`` says what was found and expected; ``raw`` is the text between the tags (or after
    an unclosed tag); ``index`` counts the ``<tool_call>`` blocks in the text from 0.
    """

    reason: str
    message: str
    raw: str
    index: int


@dataclasses.dataclass(frozen=True)
class ParsedAssistant:
    """What a generated assistant message says.

    Attributes:
      content: the text outside the thinking block and the tool-call blocks, stripped of
        surrounding whitespace.
      tool_calls: the well-formed calls, in order.
      thinking: the text of the leading thinking block (newlines at its ends stripped, as Qwen3's
        template does), or ``None`` if there is none.
      thinking_closed: ``False`` when a ``<think>`` block is never closed (a generation cut off
        while thinking); everything after ``<think>`` is then thinking.
      errors: one :class:`ToolCallError` per malformed call.
    """

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    thinking: str | None = None
    thinking_closed: bool = True
    errors: tuple[ToolCallError, ...] = ()

    @property
    def ok(self) -> bool:
        """No malformed tool call and no unclosed thinking block."""
        return not self.errors and self.thinking_closed


def _frozen(value: Any) -> Any:
    """A hashable copy of a JSON value whose hash agrees with Python equality of the original."""
    if isinstance(value, Mapping):
        return frozenset((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def format_tool_call(call: ToolCall) -> str:
    """Qwen's text for one call: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
    (``json.dumps`` with non-ASCII kept, as the chat templates' ``tojson`` does)."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{CALL_START}\n{body}\n{CALL_END}"


def tool_call_from_dict(value: Mapping[str, Any], *, index: int = 0) -> ToolCall | ToolCallError:
    """A call from its JSON object (``{"name", "arguments"}``, or the OpenAI form with ``function``);
    ``arguments`` may be an object or a string holding a JSON object."""
    raw = json.dumps(value, ensure_ascii=False) if isinstance(value, Mapping) else repr(value)
    if not isinstance(value, Mapping):
        return ToolCallError("not_an_object", f"tool call {index}: expected a JSON object, got "
                             f"{type(value).__name__}", raw, index)
    if isinstance(value.get("function"), Mapping):
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError("missing_name", f"tool call {index}: 'name' must be a non-empty string, got "
                             f"{name!r}", raw, index)
    if "arguments" not in value:
        return ToolCallError("missing_arguments", f"tool call {index} ({name}): no 'arguments' field; expected "
                             f"a JSON object", raw, index)
    args = value["arguments"]
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            pass
    if not isinstance(args, dict):
        return ToolCallError("bad_arguments", f"tool call {index} ({name}): 'arguments' must be a JSON object, "
                             f"got {type(value['arguments']).__name__} {value['arguments']!r:.60}", raw, index)
    return ToolCall(name, args)


def _split_thinking(text: str) -> tuple[str | None, bool, str]:
    """(thinking, closed, rest). A block counts when the text starts (after whitespace) with
    ``<think>``, or when ``</think>`` comes before any ``<tool_call>`` (the prompt opened it)."""
    stripped = text.lstrip()
    if stripped.startswith(THINK_START):
        body = stripped[len(THINK_START):]
        end = body.find(THINK_END)
        if end < 0:
            return body.strip("\n"), False, ""
        return body[:end].strip("\n"), True, body[end + len(THINK_END):].lstrip("\n")
    end = text.find(THINK_END)
    call = text.find(CALL_START)
    if end >= 0 and (call < 0 or end < call):
        return text[:end].strip("\n"), True, text[end + len(THINK_END):].lstrip("\n")
    return None, True, text


def parse_assistant(text: str) -> ParsedAssistant:
    """Parse generated assistant text (decoded, stop token excluded) into a ParsedAssistant.

    Never raises for any ``str``: malformed calls (invalid JSON, not an object, missing or
    non-string name, missing or non-object arguments, ``<tool_call>`` never closed) are reported in
    ``errors`` and left out of ``tool_calls``; text after an unclosed ``<tool_call>`` is not content.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_assistant: text must be a str, got {type(text).__name__}")
    thinking, closed, rest = _split_thinking(text)
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    content_parts: list[str] = []
    pos, index = 0, 0
    while True:
        start = rest.find(CALL_START, pos)
        if start < 0:
            content_parts.append(rest[pos:])
            break
        content_parts.append(rest[pos:start])
        body_start = start + len(CALL_START)
        end = rest.find(CALL_END, body_start)
        if end < 0:
            raw = rest[body_start:]
            errors.append(ToolCallError("unclosed", f"tool call {index}: <tool_call> is never closed by "
                                        f"</tool_call>", raw, index))
            break
        raw = rest[body_start:end]
        try:
            value = json.loads(raw.strip())
        except (ValueError, RecursionError) as e:  # JSONDecodeError, or ints too long to convert
            errors.append(ToolCallError("invalid_json", f"tool call {index}: invalid JSON ({e})", raw, index))
        else:
            result = tool_call_from_dict(value, index=index)
            if isinstance(result, ToolCallError):
                errors.append(dataclasses.replace(result, raw=raw))
            else:
                calls.append(result)
        index += 1
        pos = end + len(CALL_END)
    content = "".join(content_parts).strip()
    return ParsedAssistant(content=content, tool_calls=tuple(calls), thinking=thinking, thinking_closed=closed,
                           errors=tuple(errors))

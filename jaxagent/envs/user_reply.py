"""The simulated user's reply, parsed (pure host code: never raises on text).

**Reply format.** The model is asked for ``{"utterance": ..., "strategy": ...}``;
  :func:`parse_reply` finds JSON anywhere in the text (code fences, prose around it, single
  quotes, trailing commas, Python literals) and never raises: when no well-formed object is found
  the utterance is the text stripped of JSON debris (or the partial ``utterance`` value of a
  truncated object), ``strategy`` is None and ``parse_error`` says why. Only the first 100,000
  characters are looked at (a longer reply's fallback utterance is cut there).
**Stop markers** (``"###STOP###"``) anywhere in the model's text set ``stop=True``; they are
  removed from the utterance.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_MAX_PARSE_CHARS = 100_000
_MAX_CANDIDATES = 64
_UTTERANCE_KEYS = ("utterance", "message", "response", "text")
_STRATEGY_KEYS = ("strategy", "reaction", "label")


@dataclasses.dataclass(frozen=True)
class ParsedReply:
    utterance: str
    strategy: str | None
    parse_error: str | None


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


__all__ = ["ParsedReply", "parse_reply"]

"""Generated text as it grows, split the way the Qwen templates and OpenAI clients expect (pure
host code): thinking apart from the content, tool calls apart from both, stop strings cut.

`visible` is the one rule; `TextStream` applies it to the text decoded so far after every engine
call and hands out what is new, so the deltas a streaming client concatenates are what
`visible` gives for the final text (and, up to whitespace at the ends, what
`jaxagent.text.toolcalls.parse_assistant` gives a non-streaming one).
"""

from __future__ import annotations

import dataclasses

from jaxagent.text.toolcalls import CALL_START, THINK_END, THINK_START

__all__ = ["TextStream", "Visible", "cut_at_stop", "visible"]


@dataclasses.dataclass(frozen=True)
class Visible:
    reasoning: str  # the thinking block's text so far (leading newlines and trailing whitespace held back)
    content: str  # the text after it, up to the first <tool_call> (trailing whitespace held back)
    in_calls: bool  # a <tool_call> has begun: nothing more is content until the text is parsed whole


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to the earliest occurrence of any stop string (which is dropped), and whether
    one occurred."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[:min(cuts)], True) if cuts else (text, False)


def _held_tail(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a marker (it may
    become that marker with the next token, so it is not shown yet)."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


def visible(text: str, *, thinking: bool, opened: bool, tools: bool, final: bool = False) -> Visible:
    """What may be shown of ``text`` (a generation so far, stop strings already cut).

    ``thinking``: a leading ``<think>`` block (or, with ``opened`` = the prompt ended inside one,
    everything before ``</think>``) is reasoning, not content. ``tools``: from the first
    ``<tool_call>`` on, the text is held for the parser. Unless ``final``, a tail that may be the
    start of one of those markers is held back."""
    if not final:
        markers = ((THINK_START, THINK_END) if thinking else ()) + ((CALL_START,) if tools else ())
        text = text[: len(text) - _held_tail(text, markers)] if markers else text
    reasoning, rest = "", text
    if thinking:
        stripped = text.lstrip()
        if stripped.startswith(THINK_START) or opened:
            body = stripped[len(THINK_START):] if stripped.startswith(THINK_START) else text
            end = body.find(THINK_END)
            if end < 0:
                return Visible(body.lstrip("\n").rstrip(), "", False)
            reasoning, rest = body[:end].strip("\n").rstrip(), body[end + len(THINK_END):]
        elif not stripped and not final:
            return Visible("", "", False)  # whitespace only: a <think> may still open
    in_calls = False
    if tools:
        call = rest.find(CALL_START)
        if call >= 0:
            rest, in_calls = rest[:call], True
    return Visible(reasoning, rest.strip(), in_calls)


class TextStream:
    """Feeds the text decoded so far, returns what is new to show (reasoning, content)."""

    def __init__(self, stop: tuple[str, ...], *, thinking: bool, opened: bool, tools: bool):
        self.stop, self.thinking, self.opened, self.tools = stop, thinking, opened, tools
        self.sent = Visible("", "", False)
        self.stopped = False  # a stop string was met: the generation should end
        self.text = ""  # the generation's text, cut at the stop string when one was met

    def feed(self, text: str, *, final: bool = False) -> tuple[str, str]:
        """``text``: every token's text so far (a trailing replacement character, half a UTF-8
        sequence, is held back unless ``final``). Returns the new reasoning and content."""
        if not final:
            text = text.rstrip("\ufffd")
        if self.stop:
            text, hit = cut_at_stop(text, self.stop)
            if hit:
                self.stopped = final = True
            elif not final:
                text = text[: len(text) - _held_tail(text, self.stop)]
        self.text = text
        now = visible(text, thinking=self.thinking, opened=self.opened, tools=self.tools, final=final)
        new_r = _extension(self.sent.reasoning, now.reasoning)
        new_c = _extension(self.sent.content, now.content)
        self.sent = Visible(self.sent.reasoning + new_r, self.sent.content + new_c, now.in_calls)
        return new_r, new_c


def _extension(sent: str, now: str) -> str:
    """What ``now`` adds after what was sent (when a re-decoding changed earlier characters,
    which a byte-level tokenizer can do at a character boundary, only what lies past the sent
    length)."""
    return now[len(sent):] if len(now) > len(sent) else ""

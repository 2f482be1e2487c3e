"""The spans of a rendered chat: what rollout, credit and training read (host code).

A `jaxagent.text.chat.ChatRenderer` produces them; nothing here renders.

Spans
-----
A message's span is its template prefix (``<|im_start|>user\\n``), its content and its closing
(``<|im_end|>\\n``). The generation prompt opens the generated assistant turn's span; the stop
token and the template's text after it (``\\n``) close it. Consecutive tool results that the
template writes into one user turn are split after each ``</tool_response>``. A template preamble
(a default system prompt, the tools section) belongs to the first message's prefix.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

ROLES = ("system", "user", "assistant", "tool")
THINKING_MODES = ("keep", "strip", "disabled")


class ChatInputError(ValueError):
    """A message, tool schema or call sequence is invalid; the message names field, value, expected."""


@dataclasses.dataclass(frozen=True)
class MessageSpan:
    """Where one message lies in a token list (half-open ranges of token indices).

    Attributes:
      index: the message's position in the conversation.
      role: ``system``, ``user``, ``assistant`` or ``tool``.
      start, end: all the message's tokens: template prefix, content, closing template text.
      content_start, content_end: the content alone (for a generated message: every generated
        token except a final stop token).
      generated: whether the content was appended as model output (``append_generated``).
      generated_end: end of the model's tokens (``content_end`` plus the stop token if there was
        one); equals ``content_start`` for messages that were not generated.
    """

    index: int
    role: str
    start: int
    end: int
    content_start: int
    content_end: int
    generated: bool = False
    generated_end: int = -1

    def __post_init__(self):
        if self.generated_end < 0:
            object.__setattr__(self, "generated_end", self.content_end if self.generated else self.content_start)

    @property
    def prefix(self) -> tuple[int, int]:
        """Template tokens before the content: ``(start, content_start)``."""
        return self.start, self.content_start

    @property
    def suffix(self) -> tuple[int, int]:
        """Tokens after the content: ``(content_end, end)`` (stop token and closing template text)."""
        return self.content_end, self.end

    def shifted(self, offset: int) -> MessageSpan:
        """The same span moved by ``offset`` tokens."""
        return dataclasses.replace(self, start=self.start + offset, end=self.end + offset,
                                   content_start=self.content_start + offset,
                                   content_end=self.content_end + offset, generated_end=self.generated_end + offset)


@dataclasses.dataclass(frozen=True)
class PrefixBreak:
    """A place where the template's render of the longer conversation does not extend the committed
    text; the committed tokens were kept. Recorded once per first-difference position (later
    renders that differ at the same place are not recorded again).

    Attributes:
      message_index: the first message being added (or the assistant turn a generation prompt
        opens, or ``len(messages)`` at ``finish``).
      position: character offset, in the committed text, of the start of the committed token that
        holds the first difference (so it never falls inside a special token's text such as
        ``<think>``); the two texts agree before it.
      committed, template: up to 80 characters of each text from that offset.
    """

    message_index: int
    position: int
    committed: str
    template: str


@dataclasses.dataclass(frozen=True)
class RenderedChat:
    """A token list with its message spans: the record of a conversation, or a view of it.

    Attributes:
      tokens: token ids ``[L]``.
      spans: one MessageSpan per message, ordered, tiling ``[0, spans[-1].end)``; while a
        generation is pending, the tokens after the last span are the generation prompt.
      scored: indices of the messages whose generated tokens this sequence trains (loss mask).
    """

    tokens: tuple[int, ...]
    spans: tuple[MessageSpan, ...]
    scored: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    def span(self, index: int) -> MessageSpan:
        """The span of message ``index`` (its position in the conversation)."""
        for s in self.spans:
            if s.index == index:
                return s
        raise ChatInputError(f"span: message index {index} is not in this chat (indices "
                             f"{[s.index for s in self.spans]})")

    def content_tokens(self, index: int) -> tuple[int, ...]:
        """The content tokens of message ``index``."""
        s = self.span(index)
        return self.tokens[s.content_start:s.content_end]

    def loss_mask(self) -> np.ndarray:
        """``[L]`` int32: 1 on the generated tokens (stop token included) of the messages in
        ``scored``, 0 elsewhere (template tokens, prompts, feedback, other turns)."""
        mask = np.zeros(len(self.tokens), np.int32)
        scored = set(self.scored)
        for s in self.spans:
            if s.index in scored:
                mask[s.content_start:s.generated_end] = 1
        return mask


@dataclasses.dataclass
class CommittedMessage:
    """Internal per-message state: the template-form message and its span bookkeeping."""

    data: dict[str, Any]
    role: str
    start: int
    end: int
    content_start: int
    content_end: int
    generated: bool = False
    generated_end: int = -1
    text_content_end: int = 0  # committed-text offset where the content ends
    closed: bool = False  # its closing text has been committed

    def span(self, index: int) -> MessageSpan:
        return MessageSpan(index, self.role, self.start, self.end, self.content_start, self.content_end,
                           self.generated, self.generated_end if self.generated else self.content_start)


__all__ = ["ROLES", "THINKING_MODES", "ChatInputError", "CommittedMessage", "MessageSpan", "PrefixBreak",
           "RenderedChat"]

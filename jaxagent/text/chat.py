"""Token-in/token-out chat rendering with per-message token spans (host code).

A :class:`ChatRenderer` turns a conversation into one growing token list, message by message, with
the checkpoint's chat template, and reports for every message a :class:`MessageSpan`: its tokens
(template tokens included) and the tokens of its content alone. Model output is appended as the
model produced it.

How a message is appended
-------------------------
The template renders the conversation with the new message(s) (``N``). When ``N`` starts with the
text already committed (``C``), the new text is ``N[len(C):]``: the previous message's closing
template text, then for each new message its template prefix, its content and (between new
messages) its closing. Each piece is tokenised on its own and appended, so message and content
boundaries are token boundaries and earlier tokens are never touched. The content's position is
found by rendering the same messages with each content replaced by a unique sentinel string, so a
content that also occurs in the template text (``"user"``) is placed correctly.

*Lazy closing.* The template text after a message's content (``<|im_end|>\\n``, or the
``\\n</tool_response>`` that Qwen writes between consecutive tool results) often depends on what
follows. So the committed tokens end at the last message's content; its closing is committed by
the next :meth:`~ChatRenderer.add`, :meth:`~ChatRenderer.start_generation` or
:meth:`~ChatRenderer.finish`, with the text the template gives it in that context. This keeps
Qwen2.5/Qwen3's merging of consecutive tool results into one user turn prefix-stable.

*Closing boundaries.* A message's closing is the text the template writes after its content when
it is the last message, cut where the new render continues differently: it is found from a render
of the conversation up to that message. Such a render is only used to locate text, so the
template's ``raise_exception(...)`` does not abort it: real Qwen3 templates reject a conversation
without a user query ("No user query found in messages."), and ``add(system, user)`` must not fail
because ``[system]`` alone would be rejected. (A conversation the template rejects as a whole is
still an error: ``add(system)`` alone raises there; add the system message with the first user
query.) Where the template cannot render the prefix at all (e.g. an undefined value), the closing
is the part of the text after the content that the template also writes after the last message of
the whole conversation, else empty (the template text then opens the next message's span). Content
spans never depend on where a closing ends.

*Where the template is not prefix-stable.* Some templates re-render earlier text when a message
arrives: Qwen3 drops the thinking of assistant turns before the latest user query, and renders an
empty ``<think>\\n\\n</think>\\n\\n`` only on the last assistant turn. Then the committed tokens are
kept (token-in/token-out wins over the template), and the new text is what the template writes
after the previous message's content in the new render (found with a sentinel in that message's
content), minus what is already committed after it (e.g. the generated stop token). Each such
event is recorded as a :class:`PrefixBreak` in ``renderer.breaks``, naming the message and both
texts at the first difference. If that position cannot be found, a ChatTemplateError is raised.

Spans
-----
A message's span is its template prefix (``<|im_start|>user\\n``), its content and its closing
(``<|im_end|>\\n``). The generation prompt opens the generated assistant turn's span; the stop
token and the template's text after it (``\\n``) close it. Consecutive tool results that the
template writes into one user turn are split after each ``</tool_response>``. A template preamble
(a default system prompt, the tools section) belongs to the first message's prefix.

Guarantees (tested on a Qwen2.5-style and a Qwen3-style template)
----------------------------------------------------------------
- Spans are ordered, never overlap, and tile ``[0, len(tokens))`` (while a generation is pending,
  the prompt tokens after the last span excepted): ``spans[i].end == spans[i+1].start``;
  ``start <= content_start <= content_end <= end``.
- Token-in/token-out: every add / start_generation / append_generated / finish only appends to
  the token list; generated tokens are kept verbatim, stop token included, even when decoding
  and re-encoding them would give other ids.
- ``decode(tokens[content_start:content_end]) == content`` exactly, whenever the template writes
  the content verbatim and the tokenizer round-trips it (``Tokenizer.round_trips``; always for a
  byte-level BPE without a normaliser; Qwen's real tokenizer NFC-normalises). Where the template
  rewrites a content (trims it, reformats a thinking block), the content span covers what it wrote
  in its place.
- Text level: where no PrefixBreak was recorded, ``decode(tokens)`` after ``finish()`` equals the
  template's one-shot render of the same messages (generated messages taken as their decoded
  text), whenever the tokenizer round-trips the texts.
- Token level: the one-shot ``encode(render)`` may merge characters across a template/content
  boundary differently (Qwen's pre-tokenizer keeps ``"}\\n"`` together, or ``"\\n\\n"`` when a
  content starts with a newline); the incremental tokens equal it whenever every content starts
  and ends at a pre-tokenizer boundary of the one-shot text (e.g. starts with a letter or digit and
  ends with a letter or digit), and special tokens separate the turns.

Not guaranteed: control-token strings inside a content (a tool result containing
``<|im_end|>``) are encoded as those tokens, as ``apply_chat_template`` does by default (no
sanitising); a template whose later renders cannot be re-anchored (e.g. one writing messages
newest-first) raises ChatTemplateError.

Thinking (Qwen3 ``<think>`` blocks)
----------------------------------
The record (:meth:`~ChatRenderer.record`, :meth:`~ChatRenderer.finish`) always keeps every token:
generated thinking, and the empty ``<think>\\n\\n</think>\\n\\n`` that a generation prompt or
Qwen3's render of a last assistant turn wrote. What differs between the modes is the history the
model is *shown* (:meth:`~ChatRenderer.view`, returned by :meth:`~ChatRenderer.start_generation`)
and the sequences to train on (:meth:`~ChatRenderer.scoring_views`).

- ``"keep"`` (``enable_thinking=True``): the model is shown the record. Prefix-stable: each prompt
  extends the previous prompt plus the generated tokens (a KV cache is extended with the new
  tokens only), and the record is the one training sequence. Qwen3's own template would drop
  earlier turns' thinking: those differences are PrefixBreaks.
- ``"strip"`` (``enable_thinking=True``) and ``"disabled"`` (``enable_thinking=False``, so the
  generation prompt ends with an empty think block): the model is shown what Qwen3's template
  shows. Rendering messages ``[0, j)`` for the generation of message ``j``, it writes an assistant
  turn's thinking block only when the turn comes after the latest user query (a user message that
  is not a wrapped ``<tool_response>``) and its reasoning is non-empty or it is the last message;
  every other block is dropped from the view (a generated block from the content, the rest of the
  generated tokens kept verbatim where the block ends at a token boundary; a block at the end of
  the turn's template prefix from the prefix). With thinking, that drops the thinking of turns
  before the latest query (and empty blocks); with thinking disabled it drops the generation
  prompt's empty block from *every* earlier assistant turn, so each prompt re-renders the previous
  assistant turn and is not an extension of the previous prompt plus the generated tokens (a KV
  cache must be re-extended from the first differing token). The record is then not what the
  model saw; train on :meth:`~ChatRenderer.scoring_views`: the generated turns grouped into runs
  whose generation contexts extend one another, one sequence per run, scoring only that run's
  turns — exactly the contexts the model generated them in (one sequence per user query with
  thinking; one per generated turn of a tool-calling episode with thinking disabled).
  Why show the template's history: it is the history format the checkpoint's chat template
  defines, and what a server applying that template would send. For a prefix-stable conversation without thinking
  in which the model keeps seeing the empty blocks, use ``thinking="keep"`` with
  ``template_kwargs={"enable_thinking": False}``.

The rule is Qwen3's, applied to the committed tokens (not read from the template); the tests check
it against the Qwen3-style fixture template. When no turn holds a ``<think>`` block (a template and
model without thinking), every mode shows the record and ``scoring_views()`` is one sequence.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxagent.text.template import ChatTemplateError, render_template, template_variables
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.text.toolcalls import THINK_END, THINK_START, ToolCall, ToolCallError, tool_call_from_dict

__all__ = ["ROLES", "THINKING_MODES", "ChatInputError", "ChatRenderer", "MessageSpan", "PrefixBreak",
           "RenderedChat"]

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
class _Msg:
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


@dataclasses.dataclass(frozen=True)
class _Thinking:
    """An assistant message's thinking block: its reasoning (newlines at the ends stripped), the
    message's prefix text without the block when the block ends the prefix (the generation prompt's
    ``<think>\\n\\n</think>\\n\\n`` with thinking disabled), and whether the block is in the content."""

    reasoning: str
    bare_prefix: str | None
    in_content: bool


_PREFIX_THINKING = re.compile(re.escape(THINK_START) + r"(.*?)" + re.escape(THINK_END) + r"\s*", re.DOTALL)


def _lcp(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search on slice equality)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _excerpt(text: str, at: int, width: int = 80) -> str:
    return text[at:at + width]


class ChatRenderer:
    """Incremental, token-in/token-out rendering of one conversation (host code, not thread-safe).

    Args:
      tokenizer: the checkpoint's Tokenizer.
      template: Jinja chat template source; default ``tokenizer.chat_template``.
      tools: OpenAI function schemas (``{"type": "function", "function": {"name", "description",
        "parameters"}}``) rendered into the system turn through the template's ``tools`` variable.
      thinking: ``"keep"``, ``"strip"`` or ``"disabled"`` (see the module docstring).
      stop_token_ids: ids that end a generated turn; default ``tokenizer.eos_token_ids``.
      template_kwargs: extra template variables (``enable_thinking`` is set from ``thinking``).

    Typical rollout::

        r = ChatRenderer(tok, tools=schemas)
        r.add({"role": "system", "content": policy}, {"role": "user", "content": request})
        prompt = r.start_generation()          # ids the model conditions on
        span = r.append_generated(model_ids)   # verbatim, stop token included
        r.add({"role": "tool", "content": result_1}, {"role": "tool", "content": result_2})
        ...
        chat = r.finish()                      # RenderedChat: tokens, spans; chat.loss_mask()

    Raises:
      ChatTemplateError: no template; tools given to a template that never reads ``tools``; a
        render fails or cannot be continued token-in/token-out.
      ChatInputError: bad thinking mode, message, tool schema or call order.
    """

    def __init__(self, tokenizer: Tokenizer, template: str | None = None, *,
                 tools: Sequence[Mapping[str, Any]] | None = None, thinking: str = "keep",
                 stop_token_ids: Iterable[int] | None = None, template_kwargs: Mapping[str, Any] | None = None):
        if thinking not in THINKING_MODES:
            raise ChatInputError(f"thinking: got {thinking!r}; expected one of {', '.join(THINKING_MODES)}")
        template = template if template is not None else tokenizer.chat_template
        if not template:
            raise ChatTemplateError(f"template: tokenizer {tokenizer.name_or_path!r} has no chat_template and none "
                                    f"was given; expected a Jinja chat template source string")
        variables = template_variables(template)
        if "messages" not in variables:
            raise ChatTemplateError("template: the chat template never reads `messages`; expected a chat template")
        self._tools = self._check_tools(tools)
        if self._tools and "tools" not in variables:
            raise ChatTemplateError(
                f"tools: {len(self._tools)} tool schema(s) given, but the chat template never reads the `tools` "
                f"variable, so it cannot render them; expected a template with tool support (e.g. Qwen2.5's) "
                f"or no tools")
        self.tokenizer = tokenizer
        self.template = template
        self.thinking = thinking
        self.stop_token_ids = frozenset(int(i) for i in (tokenizer.eos_token_ids if stop_token_ids is None
                                                         else stop_token_ids))
        kwargs = dict(template_kwargs or {})
        kwargs.setdefault("enable_thinking", thinking != "disabled")
        self._kwargs = kwargs
        self._msgs: list[_Msg] = []
        self._tokens: list[int] = []
        self._text = ""
        self._pending: dict[str, int] | None = None
        self._finished = False
        self._piece_cache: dict[str, tuple[int, ...]] = {}
        self._think_end_id = tokenizer.token_to_id(THINK_END)
        self._think_start_id = tokenizer.token_to_id(THINK_START)
        self._thinking_cache: dict[int, _Thinking | None] = {}
        self.breaks: list[PrefixBreak] = []
        self._break_at: set[int] = set()  # first-difference offsets already recorded

    # ------------------------------------------------------------------ public state
    @property
    def tokens(self) -> list[int]:
        """The committed token ids (a copy). The closing template tokens of the last message come
        with the next add / start_generation / finish."""
        return list(self._tokens)

    @property
    def spans(self) -> tuple[MessageSpan, ...]:
        """One span per message so far (the last one's ``end`` grows when its closing is committed)."""
        return tuple(m.span(i) for i, m in enumerate(self._msgs))

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The messages as given to the template (copies); a generated turn is
        ``{"role": "assistant", "content": <decoded generated text, stop token excluded>}``."""
        return [dict(m.data) for m in self._msgs]

    @property
    def finished(self) -> bool:
        """Whether finish() was called (the conversation is closed; see :meth:`finish`)."""
        return self._finished

    @property
    def generating(self) -> bool:
        """Whether start_generation() was called and append_generated() has not followed yet."""
        return self._pending is not None

    def fork(self) -> ChatRenderer:
        """An independent copy of the conversation so far (sharing the tokenizer and template), to
        branch a rollout; appending to either leaves the other unchanged."""
        other = copy.copy(self)
        other._msgs = [dataclasses.replace(m, data=dict(m.data)) for m in self._msgs]
        other._tokens = list(self._tokens)
        other._pending = dict(self._pending) if self._pending is not None else None
        other.breaks = list(self.breaks)
        other._break_at = set(self._break_at)
        other._piece_cache = dict(self._piece_cache)
        other._thinking_cache = dict(self._thinking_cache)
        return other

    def encode_content(self, text: str) -> list[int]:
        """Token ids of ``text`` as a message content (tokenised on its own, as every content is)."""
        return self.tokenizer.encode(text)

    def render_text(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False) -> str:
        """The template's one-shot render of ``messages`` with this renderer's tools and variables
        (the reference the incremental render is compared with)."""
        msgs = [self._normalise(m, i) for i, m in enumerate(messages)]
        return self._render(msgs, add_generation_prompt)

    # ------------------------------------------------------------------ appending
    def add(self, *messages: Mapping[str, Any]) -> tuple[MessageSpan, ...]:
        """Append one or more messages; returns their spans.

        Each message is a dict with ``role`` (system/user/assistant/tool) and ``content`` (str;
        ``None`` counts as ``""``); an assistant message may carry ``tool_calls`` (ToolCall or
        OpenAI dicts) and ``reasoning_content``; a tool message ``tool_call_id`` / ``name``. Other
        keys pass to the template unchanged. Messages added in one call are rendered together.
        """
        self._check_open("add")
        if self._pending is not None:
            raise ChatInputError("add: a generation is pending (start_generation was called); call "
                                 "append_generated(token_ids) first")
        if not messages:
            raise ChatInputError("add: no messages given; expected at least one message dict")
        first = len(self._msgs)
        new = [self._normalise(m, first + i) for i, m in enumerate(messages)]
        self._advance(new, gen=False)
        return tuple(self._msgs[i].span(i) for i in range(first, len(self._msgs)))

    def start_generation(self) -> list[int]:
        """Commit the previous message's closing and the template's generation prompt (e.g.
        ``<|im_start|>assistant\\n``); return the ids the model should condition on, prompt included:
        :meth:`view` (the record in ``"keep"`` mode; what the template shows in ``"strip"`` and
        ``"disabled"`` mode, which need not extend the previous prompt)."""
        self._check_open("start_generation")
        if self._pending is not None:
            raise ChatInputError("start_generation: a generation is already pending; call append_generated first")
        self._advance([], gen=True)
        return list(self.view().tokens)

    def append_generated(self, token_ids: Sequence[int]) -> MessageSpan:
        """Append the model's tokens verbatim as the assistant turn the pending prompt opened.

        A final token in ``stop_token_ids`` is the stop token: part of the message and of the loss
        mask, not of the content. Without one (a cut-off generation) the template's closing text
        comes with the next add / start_generation / finish, as template tokens.
        """
        if self._pending is None:
            raise ChatInputError("append_generated: no generation is pending; call start_generation() first")
        ids = [int(t) for t in token_ids]
        bad = [t for t in ids if not 0 <= t < self.tokenizer.vocab_size]
        if bad:
            raise ChatInputError(f"append_generated: token ids {bad[:5]} outside [0, vocab_size="
                                 f"{self.tokenizer.vocab_size})")
        stopped = bool(ids) and ids[-1] in self.stop_token_ids
        content_ids = ids[:-1] if stopped else ids
        full_text = self.tokenizer.decode(ids)
        content_text = self.tokenizer.decode(content_ids)
        if not full_text.startswith(content_text):
            # The stop token completes a character that the content's last tokens began (a stop id that
            # is a byte token, not a special token): the content's text is the full text cut at the
            # content's decoded length, so the committed text stays the decoded tokens.
            content_text = full_text[:len(content_text)]
        start, prompt_end = self._pending["start"], self._pending["prompt_end"]
        text_start = len(self._text)
        self._tokens.extend(ids)
        self._text += full_text
        msg = _Msg(data={"role": "assistant", "content": content_text}, role="assistant", start=start,
                   end=len(self._tokens), content_start=prompt_end, content_end=prompt_end + len(content_ids),
                   generated=True, generated_end=prompt_end + len(ids),
                   text_content_end=text_start + len(content_text))
        self._msgs.append(msg)
        self._pending = None
        return msg.span(len(self._msgs) - 1)

    def finish(self) -> RenderedChat:
        """Close the conversation: commit the last message's closing text (the text the template
        writes after it as the last message) and return the record (all generated turns scored).

        The renderer is then finished: :meth:`add` and :meth:`start_generation` raise
        ChatInputError, because the committed closing may not be what the template writes before a
        further message (Qwen writes ``<|im_end|>\\n`` after the last tool result but
        ``\\n</tool_response>`` before another one). :meth:`record`, :meth:`view`,
        :meth:`scoring_views` and :meth:`fork` still work, and calling finish() again returns the
        same record. To take a finished record of a conversation that goes on, finish a fork:
        ``r.fork().finish()``.
        """
        if self._pending is not None:
            raise ChatInputError("finish: a generation is pending; call append_generated first")
        if not self._finished and self._msgs and not self._msgs[-1].closed:
            self._advance([], gen=False, final=True)
        self._finished = True
        return self.record()

    def _check_open(self, method: str) -> None:
        if self._finished:
            raise ChatInputError(
                f"{method}: the conversation is finished (finish() committed the closing of message "
                f"{len(self._msgs) - 1}, which may differ from the template's text before a further message); "
                f"expected calls before finish(). To continue a conversation and also take a finished record "
                f"of it, call finish() on a fork(): r.fork().finish()")

    # ------------------------------------------------------------------ views
    def record(self) -> RenderedChat:
        """The committed tokens and spans, every generated turn scored (the training sequence in
        ``"keep"`` and ``"disabled"`` mode)."""
        spans = self.spans
        return RenderedChat(tuple(self._tokens), spans, tuple(s.index for s in spans if s.generated))

    def view(self) -> RenderedChat:
        """What the model is shown at the next turn: the record in ``"keep"`` mode; in ``"strip"``
        and ``"disabled"`` mode what the template shows, i.e. the record with the thinking block of
        each earlier assistant turn that Qwen3's template renders without one removed (see the
        module docstring), the pending generation prompt included. ``scored`` lists the generated
        turns this sequence is the generation context of."""
        if self.thinking == "keep":
            return self.record()
        shown = self._bare_in_context(len(self._msgs))
        scored = tuple(i for i, m in enumerate(self._msgs)
                       if m.generated and i not in shown and self._bare_in_context(i) == shown & set(range(i)))
        return self._shown(len(self._msgs), shown, scored, include_pending=True)

    def scoring_views(self) -> list[RenderedChat]:
        """The sequences to teacher-force for training, each with its loss mask.

        ``"keep"``: ``[record()]``. ``"strip"``/``"disabled"``: generated turns are grouped into runs
        of consecutive turns whose generation contexts extend one another (the template showed the
        same earlier turns without thinking to each of them); one sequence per run: the conversation
        up to the next user query or the next run, with those turns stripped, scoring only the
        run's turns. So each scored turn sits in exactly the context it was generated in. Qwen3
        with thinking: one run per user query. Qwen3 with thinking disabled: one run per generated
        turn of a tool-calling episode (each prompt drops the previous turn's empty think block).
        """
        if self.thinking == "keep":
            return [self.record()]
        runs: list[tuple[list[int], frozenset[int]]] = []
        for j, m in enumerate(self._msgs):
            if not m.generated:
                continue
            stripped = self._bare_in_context(j)
            if runs and runs[-1][1] == stripped:
                runs[-1][0].append(j)
            else:
                runs.append(([j], stripped))
        queries = self._query_indices()
        views = []
        for k, (members, stripped) in enumerate(runs):
            upto = runs[k + 1][0][0] if k + 1 < len(runs) else len(self._msgs)
            upto = min([upto, *(q for q in queries if q > members[-1])])
            views.append(self._shown(upto, stripped, tuple(members), include_pending=False))
        return views

    def _query_indices(self) -> list[int]:
        """Indices of user queries: user messages that are not a wrapped ``<tool_response>``."""
        out = []
        for i, m in enumerate(self._msgs):
            c = m.data["content"]
            if m.role == "user" and not (c.startswith("<tool_response>") and c.endswith("</tool_response>")):
                out.append(i)
        return out

    def _thinking_of(self, i: int) -> _Thinking | None:
        """Where assistant message ``i``'s thinking block lies in its tokens (the generation prompt's
        block in its prefix, or a generated block in its content), or ``None`` if it has none."""
        if i in self._thinking_cache:
            return self._thinking_cache[i]
        m = self._msgs[i]
        info = None
        if m.role == "assistant":
            prefix = self.tokenizer.decode(self._tokens[m.start:m.content_start])
            content = self.tokenizer.decode(self._tokens[m.content_start:m.content_end])
            k = prefix.rfind(THINK_START)
            block = _PREFIX_THINKING.fullmatch(prefix, k) if k >= 0 else None
            if THINK_END in content:
                reasoning = content.split(THINK_END)[0].split(THINK_START)[-1].strip("\n")
                info = _Thinking(reasoning, prefix[:block.start()] if block else None, True)
            elif block:
                info = _Thinking(block.group(1).strip("\n"), prefix[:block.start()], False)
        self._thinking_cache[i] = info
        return info

    def _bare_in_context(self, j: int) -> frozenset[int]:
        """The assistant messages before ``j`` that Qwen3's template shows without their thinking
        block when it renders messages ``[0, j)`` (for the generation of message ``j``): those before
        the latest user query, and those with an empty reasoning other than the last message (the
        template writes a block only for turns after the latest query that have a reasoning or are
        last)."""
        queries = [q for q in self._query_indices() if q < j]
        latest = queries[-1] if queries else -1
        out = set()
        for i in range(j):
            info = self._thinking_of(i)
            if info is not None and (i < latest or (not info.reasoning and i != j - 1)):
                out.add(i)
        return frozenset(out)

    def _strip_content(self, m: _Msg) -> list[int]:
        """Content tokens of an assistant turn without its thinking block: the generated tokens after
        ``</think>`` (and the newlines after it) verbatim when they decode to the visible text, else
        the visible text encoded."""
        ids = self._tokens[m.content_start:m.content_end]
        text = self.tokenizer.decode(ids)
        visible = text.split(THINK_END)[-1].lstrip("\n")
        if self._think_end_id is not None and self._think_end_id in ids:
            j0 = len(ids) - ids[::-1].index(self._think_end_id)
            for j in range(j0, min(len(ids), j0 + 8) + 1):
                if self.tokenizer.decode(ids[j:]) == visible:
                    return ids[j:]
        return self.tokenizer.encode(visible)

    def _strip_prefix(self, m: _Msg, bare: str) -> list[int]:
        """Prefix tokens of an assistant turn without the thinking block that ends its prefix: the
        tokens before ``<think>`` verbatim when they decode to ``bare``, else ``bare`` encoded."""
        ids = self._tokens[m.start:m.content_start]
        if self._think_start_id is not None and self._think_start_id in ids:
            k = len(ids) - 1 - ids[::-1].index(self._think_start_id)
            if self.tokenizer.decode(ids[:k]) == bare:
                return ids[:k]
        return self._encode_piece(bare, template=True)

    def _shown(self, upto: int, stripped: frozenset[int], scored: tuple[int, ...], *,
               include_pending: bool) -> RenderedChat:
        """Messages ``[0, upto)`` with the thinking blocks of the messages in ``stripped`` removed."""
        tokens: list[int] = []
        spans: list[MessageSpan] = []
        for i, m in enumerate(self._msgs[:upto]):
            at = len(tokens)
            info = self._thinking_of(i) if i in stripped else None
            if info is None:
                tokens.extend(self._tokens[m.start:m.end])
                spans.append(m.span(i).shifted(at - m.start))
                continue
            prefix = self._tokens[m.start:m.content_start] if info.bare_prefix is None else \
                self._strip_prefix(m, info.bare_prefix)
            content = self._strip_content(m) if info.in_content else self._tokens[m.content_start:m.content_end]
            tokens.extend(prefix + content + self._tokens[m.content_end:m.end])
            cs, ce = at + len(prefix), at + len(prefix) + len(content)
            spans.append(MessageSpan(i, m.role, at, len(tokens), cs, ce, m.generated,
                                     ce + (m.generated_end - m.content_end) if m.generated else cs))
        if include_pending and upto == len(self._msgs) and self._pending is not None:
            tokens.extend(self._tokens[self._pending["start"]:])
        return RenderedChat(tuple(tokens), tuple(spans), scored)

    # ------------------------------------------------------------------ internals: input checks
    @staticmethod
    def _check_tools(tools):
        if tools is None:
            return None
        if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
            raise ChatInputError(f"tools: expected a list of OpenAI function schemas, got {type(tools).__name__}")
        out = []
        for i, tool in enumerate(tools):
            fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn.get("name"):
                raise ChatInputError(f"tools[{i}]: expected a function schema with a non-empty 'name' "
                                     f"(e.g. {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}),"
                                     f" got {tool!r:.100}")
            out.append(dict(tool))
        return out

    def _normalise(self, message: Mapping[str, Any], index: int) -> dict[str, Any]:
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise ChatInputError(f"{where}: expected a dict with 'role' and 'content', got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise ChatInputError(f"{where}.role: got {role!r}; expected one of {', '.join(ROLES)}")
        content = message.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ChatInputError(f"{where}.content: got {type(content).__name__}; expected a str (or None)")
        out = {k: v for k, v in message.items() if v is not None}
        out["role"], out["content"] = role, content
        calls = message.get("tool_calls")
        if calls:
            if role != "assistant":
                raise ChatInputError(f"{where}.tool_calls: only assistant messages carry tool calls, got role "
                                     f"{role!r}")
            if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
                raise ChatInputError(f"{where}.tool_calls: expected a list, got {type(calls).__name__}")
            norm = []
            for j, call in enumerate(calls):
                if isinstance(call, ToolCall):
                    parsed = call
                elif isinstance(call, Mapping):
                    parsed = tool_call_from_dict(call, index=j)
                else:
                    parsed = ToolCallError("not_an_object", f"expected a ToolCall or a dict, got "
                                                            f"{type(call).__name__}", repr(call), j)
                if isinstance(parsed, ToolCallError):
                    raise ChatInputError(f"{where}.tool_calls[{j}]: {parsed.message}")
                norm.append(parsed.to_dict())
            out["tool_calls"] = norm
        else:
            out.pop("tool_calls", None)
        return out

    # ------------------------------------------------------------------ internals: rendering
    def _render(self, msgs: Sequence[Mapping[str, Any]], gen: bool, *, partial: bool = False) -> str:
        """The template's text for ``msgs``. ``partial``: an auxiliary render of a prefix of the
        conversation, used only to locate text; the template's ``raise_exception`` does not abort it
        (see ``_closing_end``)."""
        try:
            return render_template(self.template, msgs, tools=self._tools, add_generation_prompt=gen,
                                   special_tokens=self.tokenizer.special_tokens, ignore_raise_exception=partial,
                                   **self._kwargs)
        except ChatTemplateError as e:
            roles = [m["role"] for m in msgs]
            raise ChatTemplateError(f"rendering messages with roles {roles}"
                                    f"{' + generation prompt' if gen else ''}: {e}") from e

    def _sentinel(self, i: int, avoid: str) -> str:
        for salt in range(100):
            s = f"\ue000jxa{salt}:{i}\ue001"
            if s not in avoid:
                return s
        raise ChatTemplateError("could not choose a sentinel string absent from the conversation")

    def _token_boundary(self, at: int) -> int:
        """The start, in the committed text, of the committed token that holds character ``at``: the
        longest decoded token prefix no longer than ``at`` (binary search), or ``at`` itself where
        that decoded prefix is not a prefix of the committed text."""
        lo, hi = 0, len(self._tokens)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(self.tokenizer.decode(self._tokens[:mid])) <= at:
                lo = mid
            else:
                hi = mid - 1
        text = self.tokenizer.decode(self._tokens[:lo])
        return len(text) if self._text.startswith(text) else at

    def _encode_piece(self, text: str, template: bool) -> list[int]:
        if not template:
            return self.tokenizer.encode(text)
        ids = self._piece_cache.get(text)
        if ids is None:
            ids = tuple(self.tokenizer.encode(text))
            if len(self._piece_cache) < 4096:
                self._piece_cache[text] = ids
        return list(ids)

    def _reanchor(self, N: str, new: list[dict], gen: bool, event_index: int) -> tuple[int, int, PrefixBreak]:
        """When ``N`` does not extend the committed text: return ``(x, base, break)``, where ``x`` is
        the end of the last message's content in ``N`` and ``base`` the point of ``N`` the committed
        text corresponds to (after what is already committed past that content)."""
        last = self._msgs[-1]
        C = self._text
        d = _lcp(C, N)
        content = last.data["content"]
        s = self._sentinel(len(self._msgs) - 1, N + C)
        data_s = [m.data for m in self._msgs[:-1]] + [{**last.data, "content": s}]
        Ns = self._render(data_s + new, gen)
        if Ns.count(s) != 1:
            raise self._not_stable(event_index, d, C, N, "the sentinel test of the previous message failed")
        pre, tail = Ns[:Ns.index(s)], Ns[Ns.index(s) + len(s):]
        x = None
        if not content and N.startswith(pre):
            # An empty content's slot: where the sentinel stood (the template may write a separator
            # before a non-empty content only, so the text after it is not reliable).
            x = len(pre)
        else:
            skip = len(tail) - len(tail.lstrip()) if not content else 0
            for k in range(skip + 1):
                if N.endswith(tail[k:]):
                    x = len(N) - len(tail[k:])
                    break
        if x is None:
            raise self._not_stable(event_index, d, C, N, "the previous message's content end cannot be found in "
                                                         "the new render")
        committed_after = C[last.text_content_end:]
        if N.startswith(committed_after, x):
            base = x + len(committed_after)
        elif last.generated and not last.closed:  # e.g. another stop token: keep it, then the closing
            base = x
        else:
            raise self._not_stable(event_index, d, C, N, "the previous message's committed closing text differs "
                                                         "from the template's")
        return x, base, PrefixBreak(event_index, d, _excerpt(C, d), _excerpt(N, d))

    @staticmethod
    def _not_stable(event_index, d, C, N, why) -> ChatTemplateError:
        return ChatTemplateError(
            f"message {event_index}: the template is not prefix-stable here and the committed tokens cannot be "
            f"continued token-in/token-out ({why}). Committed text from offset {d}: {_excerpt(C, d)!r}; "
            f"template's text: {_excerpt(N, d)!r}. If it merges consecutive messages (e.g. tool results), add "
            f"them in one add() call")

    def _locate(self, N: str, new: list[dict], gen: bool, base: int) -> list[tuple[int | None, int | None]]:
        """Content ranges ``(p, q)`` of the new messages in ``N`` (``(None, None)`` for an empty
        content whose slot cannot be told)."""
        H = [m.data for m in self._msgs]
        idx = [i for i, m in enumerate(new) if m["content"]]
        out = self._locate_together(N, new, gen, base, idx) if idx else None
        if out is None:  # the template rewrites a content, or reads it: one message at a time
            out = [self._locate_one(N, new, gen, i, base, transformed_ok=True) if i in idx else (None, None)
                   for i in range(len(new))]
        for i, m in enumerate(new):
            if not m["content"]:
                out[i] = self._locate_one(N, new, gen, i, base, transformed_ok=False)
        previous_end = base
        for i, (p, q) in enumerate(out):
            if p is None:
                continue
            if p < previous_end or q < p:
                raise ChatTemplateError(f"messages[{len(H) + i}] ({new[i]['role']}): its content is not placed after "
                                        f"the previous message's in the template's output; cannot split the render")
            previous_end = q
        return out

    def _locate_together(self, N, new, gen, base, idx):
        """One render with every non-empty new content replaced by its own sentinel: if ``N`` is that
        render with the contents put back verbatim, the content positions follow; else ``None``."""
        H = [m.data for m in self._msgs]
        sent = {i: self._sentinel(len(H) + i, N) for i in idx}
        Ns = self._render(H + [{**m, "content": sent[i]} if i in sent else m for i, m in enumerate(new)], gen)
        if not all(Ns.count(s) == 1 for s in sent.values()):
            return None
        rest = Ns[Ns.index(sent[idx[0]]):]
        expected = rest
        for i in idx:
            expected = expected.replace(sent[i], new[i]["content"], 1)
        pos = len(N) - len(expected)
        if not N.endswith(expected) or pos < base:
            return None
        out: list[tuple[int | None, int | None]] = [(None, None)] * len(new)
        for i in idx:  # walk the sentinel render, mapping its offsets to N's
            off = rest.index(sent[i])
            pos += off
            out[i] = (pos, pos + len(new[i]["content"]))
            pos += len(new[i]["content"])
            rest = rest[off + len(sent[i]):]
        return out

    def _locate_one(self, N, new, gen, i, base, transformed_ok):
        H = [m.data for m in self._msgs]
        s = self._sentinel(len(H) + i, N)
        Ns = self._render(H + [({**m, "content": s} if j == i else m) for j, m in enumerate(new)], gen)
        if Ns.count(s) != 1:
            if transformed_ok:
                raise ChatTemplateError(f"messages[{len(H) + i}] ({new[i]['role']}): the template does not write "
                                        f"the content once; cannot locate the content span")
            return None, None
        pre, post = Ns[:Ns.index(s)], Ns[Ns.index(s) + len(s):]
        if not transformed_ok:  # empty content: its slot is where the sentinel stood, if the prefix agrees
            return (len(pre), len(pre)) if N.startswith(pre) and len(pre) >= base else (None, None)
        if N.startswith(pre) and N.endswith(post) and len(pre) >= base and len(pre) + len(post) <= len(N):
            return len(pre), len(N) - len(post)
        # The template rewrites the text around the content too (e.g. moves a thinking block): the
        # content span is the region where the render differs from the sentinel render.
        p = _lcp(N, Ns)
        q = len(N) - _lcp(N[p:][::-1], Ns[p:][::-1])
        if base <= p <= q:
            return p, q
        raise ChatTemplateError(
            f"messages[{len(H) + i}] ({new[i]['role']}): cannot locate its content in the template's output (the "
            f"template changes the text around it depending on the content). Content starts {new[i]['content']!r:.60}")

    def _closing_end(self, N: str, msgs_upto: list[dict], content_end: int, limit: int,
                     content: str, sentinel_index: int, full: list[dict]) -> int:
        """End in ``N`` of the closing text of the last message of ``msgs_upto``, a prefix of ``full``
        (the messages ``N`` renders); that message's content ends at ``content_end`` in ``N``. Bounded
        by ``limit`` (the next content's start).

        The closing is the text the template writes after the content when the message is last: the
        common prefix of ``N`` with the render of ``msgs_upto``. That render is auxiliary, so the
        template's ``raise_exception`` does not abort it: a check of the whole conversation (Qwen3's
        "No user query found in messages.") must not reject one of its prefixes. Where the template
        still cannot render the prefix (another error), the closing is the common prefix of the text
        after the content with the closing the template gives the last message of ``full`` (a
        sentinel render of the whole list); failing that, it is empty and the template text goes to
        the next message's prefix. Content boundaries never depend on this.
        """
        try:
            R = self._render(msgs_upto, False, partial=True)
        except ChatTemplateError:
            R = None
        if R is not None:
            lcp = _lcp(R, N)
            if lcp >= content_end:
                return max(content_end, min(lcp, limit))
            if content:  # the render differs earlier (the template re-rendered history): use a sentinel
                s = self._sentinel(sentinel_index, N)
                try:
                    Rs = self._render(msgs_upto[:-1] + [{**msgs_upto[-1], "content": s}], False, partial=True)
                except ChatTemplateError:
                    Rs = ""
                if Rs.count(s) == 1:
                    closing = Rs[Rs.index(s) + len(s):]
                    return max(content_end, min(content_end + _lcp(closing, N[content_end:]), limit))
            return content_end
        s = self._sentinel(len(full) - 1, N)
        try:
            Rs = self._render(full[:-1] + [{**full[-1], "content": s}], False, partial=True)
        except ChatTemplateError:
            return content_end
        if Rs.count(s) != 1:
            return content_end
        closing = Rs[Rs.index(s) + len(s):]
        return max(content_end, min(content_end + _lcp(closing, N[content_end:]), limit))

    def _advance(self, new: list[dict], *, gen: bool, final: bool = False) -> None:
        """Render with ``new`` appended (and the generation prompt if ``gen``) and commit the pieces."""
        H = [m.data for m in self._msgs]
        event_index = len(H)
        try:
            N = self._render(H + new, gen)
        except ChatTemplateError as e:
            if not new:
                raise
            raise ChatTemplateError(f"{e} (add() renders the conversation after each call; if the template only "
                                    f"accepts a complete conversation, add the messages that complete it, e.g. "
                                    f"the first user query with the system message, in the same add() call)") from e
        last = self._msgs[-1] if self._msgs else None
        brk = None
        if N.startswith(self._text):
            base = len(self._text)
            x = last.text_content_end if last is not None else 0
        else:  # (the empty text of an empty conversation prefixes every render, so last is not None)
            x, base, brk = self._reanchor(N, new, gen, event_index)
        ranges = self._locate(N, new, gen, base) if new else []

        # Boundaries: the end of each message's text in N.
        def first_content_after(k):
            for p, _ in ranges[k:]:
                if p is not None:
                    return p
            return len(N)

        pieces: list[tuple[str, int, str]] = []  # (text, message index, kind)
        if last is not None and not last.closed:
            limit = first_content_after(0) if new else len(N)
            if final:
                b_last = len(N)
            else:
                b_last = self._closing_end(N, H, x, limit, last.data["content"], event_index - 1, H + new)
            b_last = max(b_last, base)
            pieces.append((N[base:b_last], event_index - 1, "closing"))
            cursor = b_last
        else:
            cursor = base
        n = len(new)
        for i, m in enumerate(new):
            p, q = ranges[i]
            if p is None:
                p = q = cursor
            pieces.append((N[cursor:p], event_index + i, "prefix"))
            pieces.append((N[p:q], event_index + i, "content"))
            cursor = q
            if i < n - 1:
                b = self._closing_end(N, H + new[:i + 1], q, first_content_after(i + 1), m["content"],
                                      event_index + i, H + new)
                pieces.append((N[q:b], event_index + i, "closing"))
                cursor = b
        if gen:
            prompt = N[cursor:]
            if not prompt:
                raise ChatTemplateError("add_generation_prompt: the template renders no generation prompt "
                                        "(its text is the same with add_generation_prompt=True)")
            pieces.append((prompt, event_index, "gen_prompt"))
            cursor = len(N)

        # Commit (nothing above changed any state).
        if brk is not None and brk.position not in self._break_at:
            # A difference already recorded persists in later renders: record it once.
            self._break_at.add(brk.position)
            at = self._token_boundary(brk.position)
            self.breaks.append(PrefixBreak(brk.message_index, at, _excerpt(self._text, at), _excerpt(N, at)))
        for text, owner, kind in pieces:
            ids = self._encode_piece(text, template=(kind != "content"))
            t0 = len(self._tokens)
            self._tokens.extend(ids)
            t1 = len(self._tokens)
            if kind == "closing":
                msg = self._msgs[owner]
                msg.end = t1
                msg.closed = True
            elif kind == "prefix":
                k = owner - event_index
                self._msgs.append(_Msg(data=new[k], role=new[k]["role"], start=t0, end=t1, content_start=t1,
                                       content_end=t1))
            elif kind == "content":
                msg = self._msgs[owner]
                msg.content_start, msg.content_end, msg.end = t0, t1, t1
                msg.text_content_end = len(self._text) + len(text)
            elif kind == "gen_prompt":
                self._pending = {"start": t0, "prompt_end": t1}
            self._text += text

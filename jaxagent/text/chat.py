"""A :class:`ChatRenderer` turns a conversation into one growing token list, message by message, with
the checkpoint's chat template, and reports for every message a :class:`MessageSpan`: its tokens
(template tokens included) and the tokens of its content alone. Model output is appended as the
model produced it.

The pieces: `jaxagent.text.spans` (the spans and records this produces),
`jaxagent.text.anchoring` (how each message is located in the template's output, and the
prefix-stability rules), `jaxagent.text.thinking` (Qwen3's thinking views).

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
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jaxagent.text.anchoring import TemplateAnchoring
from jaxagent.text.spans import (ROLES, THINKING_MODES, ChatInputError, CommittedMessage, MessageSpan, PrefixBreak,
                                 RenderedChat)
from jaxagent.text.template import ChatTemplateError, render_template, template_variables
from jaxagent.text.thinking import Thinking, ThinkingViews
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.text.toolcalls import THINK_END, THINK_START, ToolCall, ToolCallError, tool_call_from_dict

__all__ = ["ROLES", "THINKING_MODES", "ChatInputError", "ChatRenderer", "MessageSpan", "PrefixBreak",
           "RenderedChat"]


class ChatRenderer(ThinkingViews, TemplateAnchoring):
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
        self._msgs: list[CommittedMessage] = []
        self._tokens: list[int] = []
        self._text = ""
        self._pending: dict[str, int] | None = None
        self._finished = False
        self._piece_cache: dict[str, tuple[int, ...]] = {}
        self._think_end_id = tokenizer.token_to_id(THINK_END)
        self._think_start_id = tokenizer.token_to_id(THINK_START)
        self._thinking_cache: dict[int, Thinking | None] = {}
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
        msg = CommittedMessage(data={"role": "assistant", "content": content_text}, role="assistant", start=start,
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

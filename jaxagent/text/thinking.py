"""Qwen3 thinking views of a chat: what the model is shown, and the sequences to train on
(host code; a mixin of `jaxagent.text.chat.ChatRenderer`).

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

import dataclasses
import re

from jaxagent.text.spans import CommittedMessage, MessageSpan, RenderedChat
from jaxagent.text.toolcalls import THINK_END, THINK_START


@dataclasses.dataclass(frozen=True)
class Thinking:
    """An assistant message's thinking block: its reasoning (newlines at the ends stripped), the
    message's prefix text without the block when the block ends the prefix (the generation prompt's
    ``<think>\\n\\n</think>\\n\\n`` with thinking disabled), and whether the block is in the content."""

    reasoning: str
    bare_prefix: str | None
    in_content: bool


_PREFIX_THINKING = re.compile(re.escape(THINK_START) + r"(.*?)" + re.escape(THINK_END) + r"\s*", re.DOTALL)


class ThinkingViews:
    """The renderer's views (`record`, `view`, `scoring_views`) and Qwen3's thinking rule."""

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

    def _thinking_of(self, i: int) -> Thinking | None:
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
                info = Thinking(reasoning, prefix[:block.start()] if block else None, True)
            elif block:
                info = Thinking(block.group(1).strip("\n"), prefix[:block.start()], False)
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

    def _strip_content(self, m: CommittedMessage) -> list[int]:
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

    def _strip_prefix(self, m: CommittedMessage, bare: str) -> list[int]:
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


__all__ = ["Thinking", "ThinkingViews"]

"""Locating each message's tokens in the chat template's output, incrementally (host code; a
mixin of `jaxagent.text.chat.ChatRenderer`).

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
"""

from __future__ import annotations

from jaxagent.text.spans import CommittedMessage, PrefixBreak
from jaxagent.text.template import ChatTemplateError


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


class TemplateAnchoring:
    """How new messages' text is cut into template and content pieces and committed as tokens."""

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
                self._msgs.append(CommittedMessage(data=new[k], role=new[k]["role"], start=t0, end=t1, content_start=t1,
                                       content_end=t1))
            elif kind == "content":
                msg = self._msgs[owner]
                msg.content_start, msg.content_end, msg.end = t0, t1, t1
                msg.text_content_end = len(self._text) + len(text)
            elif kind == "gen_prompt":
                self._pending = {"start": t0, "prompt_end": t1}
            self._text += text


__all__ = ["TemplateAnchoring"]

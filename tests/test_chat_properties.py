"""Property tests on random conversations: spans tile the tokens, the text equals the template's
one-shot render, token-level differences are only merges, and the Qwen3 views."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxagent.text import (
    ChatRenderer,
    ToolCall,
    format_tool_call,
)

from tests.text_helpers import PROPS, TOOLS, check_spans, end_id, qwen3_guarded, tok, tok3  # noqa: F401 (fixtures)


# ============================================================================ property tests: random conversations
_ALPHABET = list("abcxyz AB01 \n\t{}\":,.é中🙂") + ["<|im_end|>", "<tool_call>", "</tool_response>"]
_texts = st.lists(st.sampled_from(_ALPHABET), max_size=12).map("".join)
_safe = st.from_regex(r"[A-Za-z0-9]([a-z0-9 ,.:{}\"é中\n]{0,14}[A-Za-z0-9])?", fullmatch=True)


@st.composite
def _episodes(draw, texts, canonical=False):
    """Events: ("add", [messages]) / ("gen", text, stop, char_split). Tool results follow calls,
    added in one call or one by one."""
    events = []
    if draw(st.booleans()):
        events.append(("add", [{"role": "system", "content": draw(texts)}]))
    for _ in range(draw(st.integers(1, 3))):
        events.append(("add", [{"role": "user", "content": draw(texts)}]))
        for _ in range(draw(st.integers(1, 3))):
            n_calls = draw(st.integers(0, 2))
            calls = [ToolCall(draw(st.sampled_from(["get_order", "search"])), {"q": draw(texts)})
                     for _ in range(n_calls)]
            content = draw(texts)
            if draw(st.booleans()):
                text = "\n".join([content, *map(format_tool_call, calls)]) if calls else content
                stop = True if canonical else draw(st.booleans())
                events.append(("gen", text, stop, False if canonical else draw(st.booleans())))
            else:
                events.append(("add", [{"role": "assistant", "content": content, "tool_calls": calls}]))
            if not calls:
                break
            results = [{"role": "tool", "content": draw(texts)} for _ in calls]
            if draw(st.booleans()):
                events.append(("add", results))
            else:
                events.extend(("add", [m]) for m in results)
        if draw(st.booleans()) and not canonical:
            events.append(("add", [{"role": "system", "content": draw(texts)}]))
    return events


def _run(tok, events, **kw):
    """Play the events; check token-in/token-out at every step; return (renderer, chat, generated)."""
    r = ChatRenderer(tok, tools=TOOLS if kw.pop("tools", True) else None, **kw)
    generated = {}
    before = []
    for ev in events:
        if ev[0] == "add":
            r.add(*ev[1])
        else:
            _, text, stop, split = ev
            prompt = r.start_generation()
            if r.thinking != "strip":  # (a stripped view is not an extension of the record)
                assert prompt[:len(before)] == before == prompt[:len(r.tokens)][:len(before)]
            ids = [i for ch in text for i in tok.encode(ch)] if split else tok.encode(text)
            ids = ids + [end_id(tok)] if stop else ids
            generated[len(r.messages)] = ids
            r.append_generated(ids)
        assert r.tokens[:len(before)] == before  # never re-tokenises: the token list only grows
        before = r.tokens
    chat = r.finish()
    assert list(chat.tokens[:len(before)]) == before
    return r, chat, generated


@PROPS
@given(_episodes(_texts))
def test_random_conversations_spans_and_text(tok, events):
    r, chat, generated = _run(tok, events)
    assert check_spans(chat) == len(chat.tokens)
    for s, m in zip(chat.spans, r.messages):
        assert s.role == m["role"]
        assert tok.decode(chat.tokens[s.content_start:s.content_end]) == m["content"]
        if s.index in generated:
            assert list(chat.tokens[s.content_start:s.generated_end]) == generated[s.index]
    assert chat.scored == tuple(sorted(generated))
    mask = chat.loss_mask()
    assert mask.sum() == sum(len(g) for g in generated.values())
    # Incremental == one-shot wherever the template is prefix-stable (the Qwen2.5-style one always is).
    assert r.breaks == []
    assert tok.decode(chat.tokens) == r.render_text(r.messages)


@PROPS
@given(_episodes(_safe, canonical=True))
def test_random_conversations_token_level_one_shot(tok, events):
    """Contents that start and end with a letter or digit sit at pre-tokenizer boundaries, and
    generations are canonical encodings: then the incremental tokens equal the one-shot
    tokenisation of the template's render."""
    r, chat, _ = _run(tok, events)
    assert list(chat.tokens) == tok.encode(r.render_text(r.messages))


def test_token_level_difference_is_only_a_merge(tok):
    """The documented non-guarantee: a tool result ending in "}" is tokenised on its own, the one-shot
    text merges "}\\n" into one token; the texts agree."""
    r = ChatRenderer(tok)
    r.add({"role": "user", "content": "q"})
    r.start_generation()
    r.append_generated(tok.encode(format_tool_call(ToolCall("search", {"query": "x"}))) + [end_id(tok)])
    r.add({"role": "tool", "content": '{"a": 1}'})
    chat = r.finish()
    one_shot = tok.encode(r.render_text(r.messages))
    assert list(chat.tokens) != one_shot and tok.decode(chat.tokens) == tok.decode(one_shot)
    assert tok.token_to_id("}\u010a") in one_shot  # the merged "}\n" token


@st.composite
def _qwen3_episodes(draw, thinking=True):
    """Events as in _episodes, Qwen3-style: the first user query possibly with a system message in the same
    add; generated turns with a thinking block (possibly empty) or none, calls, then their results."""
    events = []
    for k in range(draw(st.integers(1, 3))):
        user = [{"role": "user", "content": draw(_safe)}]
        if k == 0 and draw(st.booleans()):
            user.insert(0, {"role": "system", "content": draw(_safe)})
        events.append(("add", user))
        for _ in range(draw(st.integers(1, 3))):
            calls = [ToolCall("search", {"q": draw(_safe)}) for _ in range(draw(st.integers(0, 2)))]
            body = "\n".join([draw(_safe), *map(format_tool_call, calls)])
            think = draw(st.one_of(st.none(), st.just(""), _safe)) if thinking else None
            text = body if think is None else f"<think>\n{think}\n</think>\n\n{body}"
            events.append(("gen", text, True, False))
            if not calls:
                break
            events.append(("add", [{"role": "tool", "content": draw(_safe)} for _ in calls]))
    return events


@PROPS
@given(st.data())
@pytest.mark.parametrize("thinking", ["strip", "disabled"])
def test_random_qwen3_views(tok3, thinking, data):
    """Strip and disabled modes: every prompt the model is shown is the template's one-shot render of
    the conversation so far, and the scoring views hold every scored turn in its generation context;
    under the Qwen3-style template with or without Qwen3's "No user query found" check."""
    events = data.draw(_qwen3_episodes(thinking=thinking == "strip"))
    template = data.draw(st.sampled_from([None, qwen3_guarded(tok3)]))
    r = ChatRenderer(tok3, template, thinking=thinking, tools=TOOLS)
    prompts, generated = {}, {}
    for ev in events:
        if ev[0] == "add":
            r.add(*ev[1])
            continue
        i = len(r.messages)
        prompts[i] = r.start_generation()
        assert tok3.decode(prompts[i]) == r.render_text(r.messages, add_generation_prompt=True)
        generated[i] = tok3.encode(ev[1]) + [end_id(tok3)]
        r.append_generated(generated[i])
    r.finish()
    covered = []
    for v in r.scoring_views():
        check_spans(v)
        for i in v.scored:
            s = v.span(i)
            assert list(v.tokens[:s.content_start]) == prompts[i]
            assert list(v.tokens[s.content_start:s.generated_end]) == generated[i]
        assert v.loss_mask().sum() == sum(len(generated[i]) for i in v.scored)
        covered += v.scored
    assert covered == sorted(generated)

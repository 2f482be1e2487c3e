"""Qwen3 thinking modes: what the model is shown (keep / strip / disabled) and the sequences to
train on."""



from jaxagent.text import (
    ChatRenderer,
    ToolCall,
    format_tool_call,
)

from tests.text_helpers import TOOLS, check_spans, end_id, tok3  # noqa: F401 (fixtures)


# ============================================================================ Qwen3 thinking modes
def _qwen3_episode(tok3, thinking):
    """user, think+call, tool, think+answer, user, think+answer; returns (renderer, prompts, generated)."""
    end = end_id(tok3)
    r = ChatRenderer(tok3, thinking=thinking, tools=TOOLS)
    prompts, generated = {}, {}

    def gen(body, think):
        text = body if thinking == "disabled" else f"<think>\n{think}\n</think>\n\n{body}"
        ids = tok3.encode(text) + [end]
        prompts[len(r.messages)] = r.start_generation()
        generated[len(r.messages)] = ids
        r.append_generated(ids)

    r.add({"role": "user", "content": "Where is W1?"})
    gen(format_tool_call(ToolCall("get_order", {"order_id": "W1"})), "look it up")
    r.add({"role": "tool", "content": '{"status": "shipped"}'})
    gen("It shipped.", "answer")
    r.add({"role": "user", "content": "Thanks. And W2?"})
    gen("Let me check W2.", "new question")
    return r, prompts, generated


def test_qwen3_keep(tok3):
    r, prompts, generated = _qwen3_episode(tok3, "keep")
    chat = r.finish()
    check_spans(chat)
    text = tok3.decode(chat.tokens)
    assert text.count("<think>") == 3  # every generated thinking block stays in the record
    # Qwen3's one-shot render drops thinking before the latest user query: a recorded PrefixBreak.
    one_shot = r.render_text(r.messages)
    assert one_shot.count("<think>") == 1 and text != one_shot
    assert r.breaks and r.breaks[0].message_index == 4 and "look it up" in r.breaks[0].committed
    for i, ids in generated.items():  # token-in/token-out: each prompt is a prefix of the record
        assert list(chat.tokens[:len(prompts[i])]) == prompts[i]
        s = chat.span(i)
        assert list(chat.tokens[s.content_start:s.generated_end]) == ids
    assert r.scoring_views() == [r.record()]


def test_qwen3_strip(tok3):
    r, prompts, generated = _qwen3_episode(tok3, "strip")
    # What the model is shown at the last turn is Qwen3's own render (thinking before the query dropped).
    msgs = r.messages[:-1]
    assert tok3.decode(prompts[5]) == r.render_text(msgs, add_generation_prompt=True)
    view_text = tok3.decode(prompts[5])
    assert "look it up" not in view_text and "answer" not in view_text and "It shipped." in view_text
    chat = r.finish()
    assert tok3.decode(chat.tokens).count("<think>") == 3  # the record keeps everything
    views = r.scoring_views()
    assert [v.scored for v in views] == [(1, 3), (5,)]
    for v in views:  # each scored turn sits in exactly the context it was generated in
        check_spans(v)
        for i in v.scored:
            s = v.span(i)
            assert list(v.tokens[:s.content_start]) == prompts[i]
            assert list(v.tokens[s.content_start:s.generated_end]) == generated[i]
            assert v.loss_mask()[s.content_start:s.generated_end].all()
        assert v.loss_mask().sum() == sum(len(generated[i]) for i in v.scored)
    # The stripped turn keeps its generated tokens after </think> verbatim.
    s1 = views[1].span(3)
    stripped = list(views[1].tokens[s1.content_start:s1.generated_end])
    assert generated[3][-len(stripped):] == stripped and tok3.decode(stripped) == "It shipped.<|im_end|>"


def test_qwen3_disabled(tok3):
    """Thinking disabled: each generation prompt ends with an empty think block, kept in the record;
    what the model is shown is what Qwen3's template shows, which drops that block from every
    earlier assistant turn (its reasoning is empty), so each turn is scored in its own context."""
    r, prompts, generated = _qwen3_episode(tok3, "disabled")
    empty = "<think>\n\n</think>\n\n"
    for i, prompt in prompts.items():  # each prompt is the template's one-shot render
        text = tok3.decode(prompt)
        assert text == r.render_text(r.messages[:i], add_generation_prompt=True)
        assert text.endswith("<|im_start|>assistant\n" + empty) and text.count("<think>") == 1
    # Earlier turns are shown with their generated tokens verbatim, only the prompt's block dropped.
    s1 = r.view().span(1)
    assert r.view().tokens[s1.content_start:s1.generated_end] == tuple(generated[1])
    assert tok3.decode(r.view().tokens[s1.start:s1.content_start]) == "<|im_start|>assistant\n"
    chat = r.finish()
    check_spans(chat)
    for i, ids in generated.items():  # the record keeps every block, as generated
        s = chat.span(i)
        assert list(chat.tokens[s.content_start:s.generated_end]) == ids
        assert tok3.decode(chat.tokens[s.start:s.content_start]) == "<|im_start|>assistant\n" + empty
    assert tok3.decode(chat.tokens).count("<think>") == 3
    # The template drops turn 1's block from the render once message 2 arrives: a PrefixBreak, recorded
    # at its first event (later renders differ from the record first at the same place).
    assert [b.message_index for b in r.breaks] == [2]
    b = r.breaks[0]  # reported from the start of the committed <think> token, not from inside its text
    assert b.committed.startswith(empty + "<tool_call>") and b.template.startswith("<tool_call>\n")
    assert any(len(tok3.decode(chat.tokens[:k])) == b.position for k in range(len(chat.tokens)))
    assert tok3.decode(chat.tokens)[b.position:].startswith(b.committed)
    # After finish the view is the template's render of the whole conversation (the last turn keeps
    # its block: Qwen3 writes one on the last assistant turn).
    assert tok3.decode(r.view().tokens) == r.render_text(r.messages) and r.view().scored == (5,)
    views = r.scoring_views()
    assert [v.scored for v in views] == [(1,), (3,), (5,)]
    for v in views:
        check_spans(v)
        (i,) = v.scored
        s = v.span(i)
        assert list(v.tokens[:s.content_start]) == prompts[i]
        assert list(v.tokens[s.content_start:s.generated_end]) == generated[i]
        assert v.loss_mask().sum() == len(generated[i]) and v.loss_mask()[s.content_start:s.generated_end].all()
    assert len(views[0].spans) == 3 and len(views[1].spans) == 4  # each up to the next generated turn or query
    # The prefix-stable alternative: the record is shown (empty blocks stay in the history).
    keep = ChatRenderer(tok3, thinking="keep", template_kwargs={"enable_thinking": False})
    keep.add({"role": "user", "content": "Where is W1?"})
    p1 = keep.start_generation()
    keep.append_generated(generated[1])
    keep.add({"role": "tool", "content": '{"status": "shipped"}'})
    p3 = keep.start_generation()
    assert p3[:len(p1) + len(generated[1])] == p1 + generated[1] and keep.scoring_views() == [keep.record()]


def test_qwen3_assistant_dicts_reanchor(tok3):
    """Assistant messages given as dicts (SFT-style) under a template that re-renders them."""
    r = ChatRenderer(tok3)
    r.add({"role": "user", "content": "Q"})
    r.add({"role": "assistant", "content": "A", "tool_calls": [ToolCall("search", {"query": "q"})]})
    r.add({"role": "tool", "content": "R"})
    r.add({"role": "assistant", "content": ""})
    r.add({"role": "user", "content": "Q2"})
    chat = r.finish()
    check_spans(chat)
    for i, m in enumerate(r.messages):
        assert tok3.decode(chat.content_tokens(i)) == m["content"]
    assert len(r.breaks) >= 1

"""Token-in/token-out chat rendering: hand-checked spans, generated tokens verbatim, tools and
tool results, templates that reject partial conversations, and named errors for bad input."""

import json

import numpy as np
import pytest

from jaxagent.text import (
    ChatInputError,
    ChatRenderer,
    ChatTemplateError,
    MessageSpan,
    ToolCall,
    format_tool_call,
    load_tokenizer,
    parse_assistant,
    render_template,
)

from tests.text_helpers import TOOLS, check_spans, end_id, qwen3_guarded, tok, tok3  # noqa: F401 (fixtures)


# ============================================================================ rendering: hand-checked
def test_hand_checked_render(tok):
    """A small conversation with exact token boundaries: every piece is tokenised on its own."""
    e, end = tok.encode, end_id(tok)
    r = ChatRenderer(tok)
    s0, s1 = r.add({"role": "system", "content": "Be brief."}, {"role": "user", "content": "user"})
    # Lazy closing: the committed tokens stop at the last content.
    expect = e("<|im_start|>system\n") + e("Be brief.") + e("<|im_end|>\n") + e("<|im_start|>user\n") + e("user")
    assert r.tokens == expect
    a, b, c, d = (len(e(x)) for x in ["<|im_start|>system\n", "Be brief.", "<|im_end|>\n", "<|im_start|>user\n"])
    assert s0 == MessageSpan(0, "system", 0, a + b + c, a, a + b)
    # "user" also occurs in the template text; the content span is the content, not the role name.
    assert s1 == MessageSpan(1, "user", a + b + c, len(expect), a + b + c + d, len(expect))
    prompt = r.start_generation()
    gen_prompt = e("<|im_start|>assistant\n")
    assert prompt == expect + e("<|im_end|>\n") + gen_prompt
    generated = e("Sure.") + [end]
    span = r.append_generated(generated)
    n = len(prompt)
    assert span == MessageSpan(2, "assistant", n - len(gen_prompt), n + len(generated), n,
                               n + len(generated) - 1, True, n + len(generated))
    chat = r.finish()
    assert chat.tokens == tuple(prompt + generated + e("\n"))
    assert chat.spans[2].end == len(chat.tokens)  # the "\n" after the stop token closes the turn
    assert tok.decode(chat.tokens) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nuser<|im_end|>\n"
                                       "<|im_start|>assistant\nSure.<|im_end|>\n")
    assert chat.scored == (2,)
    np.testing.assert_array_equal(np.flatnonzero(chat.loss_mask()), np.arange(n, n + len(generated)))
    assert r.breaks == []


def test_generated_tokens_kept_verbatim(tok):
    """Ids that decode to a text whose own encoding differs are kept as generated."""
    text = "Hello world, order 12."
    odd = [i for ch in text for i in tok.encode(ch)]  # one character at a time
    assert odd != tok.encode(text) and tok.decode(odd) == text
    r = ChatRenderer(tok)
    r.add({"role": "user", "content": "hi"})
    r.start_generation()
    span = r.append_generated(odd + [end_id(tok)])
    r.add({"role": "user", "content": "and?"})
    chat = r.finish()
    assert list(chat.tokens[span.content_start:span.generated_end]) == odd + [end_id(tok)]
    assert r.messages[1] == {"role": "assistant", "content": text}
    assert tok.decode(chat.tokens) == r.render_text(r.messages) and r.breaks == []


def test_stop_token_completing_a_character(tok):
    """A stop id that is a byte token, completing the character the content's last token began: the
    tokens are kept verbatim, the message's content is the decoded text cut at the content's decoded
    length, and the conversation renders as the template renders it."""
    lead, trail = tok.token_to_id("\u00c3"), tok.token_to_id("\u00a9")  # the bytes of "é" (C3 A9)
    assert tok.decode([lead]) == "\ufffd" and tok.decode([lead, trail]) == "é"
    r = ChatRenderer(tok, stop_token_ids=[trail, end_id(tok)])
    r.add({"role": "user", "content": "hi"})
    r.start_generation()
    ids = tok.encode("caf") + [lead, trail]
    span = r.append_generated(ids)
    assert span.generated_end == span.content_end + 1 and r.messages[1] == {"role": "assistant", "content": "café"}
    r.add({"role": "user", "content": "ok"})
    chat = r.finish()
    assert list(chat.tokens[span.content_start:span.generated_end]) == ids and r.breaks == []
    assert tok.decode(chat.tokens) == r.render_text(r.messages)
    check_spans(chat)


def test_truncated_generation_is_closed_by_template_tokens(tok):
    r = ChatRenderer(tok)
    r.add({"role": "user", "content": "hi"})
    r.start_generation()
    span = r.append_generated(tok.encode("cut off mid"))
    assert span.generated_end == span.content_end == span.end
    chat = r.finish()
    s = chat.spans[1]
    assert tok.decode(chat.tokens[s.content_end:s.end]) == "<|im_end|>\n"
    assert chat.loss_mask()[s.content_end:].sum() == 0 and chat.loss_mask().sum() == s.content_end - s.content_start


def test_tools_tool_calls_and_results(tok):
    r = ChatRenderer(tok, tools=TOOLS)
    r.add({"role": "user", "content": "Where is W1?"})
    r.start_generation()
    calls = [ToolCall("get_order", {"order_id": "W1"}), ToolCall("search", {"query": "café", "limit": 2})]
    text = "Checking.\n" + "\n".join(format_tool_call(c) for c in calls)
    span = r.append_generated(tok.encode(text) + [end_id(tok)])
    parsed = parse_assistant(tok.decode(r.tokens[span.content_start:span.content_end]))
    assert parsed.content == "Checking." and parsed.tool_calls == tuple(calls) and parsed.ok
    t1, t2 = r.add({"role": "tool", "content": '{"status": "shipped"}'}, {"role": "tool", "content": "[]"})
    assert t2.end == t2.content_end == len(r.tokens)  # its closing comes with the next message
    r.add({"role": "assistant", "content": "", "tool_calls": [ToolCall("get_order", {"order_id": "W2"})]})
    r.add({"role": "tool", "content": "{}"})
    chat = r.finish()
    check_spans(chat)
    d = tok.decode
    system = d(chat.tokens[:chat.spans[0].content_start])
    assert system.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert json.dumps(TOOLS[0], ensure_ascii=False) in system and "</tools>" in system
    # Consecutive tool results share one user turn; each content span is the result alone.
    t1, t2 = chat.span(2), chat.span(3)
    assert d(chat.tokens[t1.start:t1.end]) == '<|im_start|>user\n<tool_response>\n{"status": "shipped"}\n</tool_response>'
    assert d(chat.tokens[t2.start:t2.end]) == "\n<tool_response>\n[]\n</tool_response><|im_end|>\n"
    assert d(chat.content_tokens(2)) == '{"status": "shipped"}' and d(chat.content_tokens(3)) == "[]"
    s4 = chat.spans[4]  # assistant dict with a tool call and no content: an empty content slot
    assert s4.content_start == s4.content_end and d(chat.tokens[s4.start:s4.content_start]) == "<|im_start|>assistant\n"
    assert d(chat.tokens[s4.content_end:s4.end]) == (
        '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "W2"}}\n</tool_call><|im_end|>\n')
    assert d(chat.tokens) == r.render_text(r.messages) and r.breaks == []


def test_tool_results_added_one_by_one_equal_batched(tok):
    def run(batched):
        r = ChatRenderer(tok, tools=TOOLS)
        r.add({"role": "user", "content": "go"})
        r.start_generation()
        r.append_generated(tok.encode(format_tool_call(ToolCall("search", {"query": "x"}))) + [end_id(tok)])
        results = [{"role": "tool", "content": c} for c in ["a", "b", "c"]]
        if batched:
            r.add(*results)
        else:
            for m in results:
                r.add(m)
        r.start_generation()
        return r.record()

    one, batch = run(False), run(True)
    assert one == batch
    check_spans(one)


def test_fork_branches_independently(tok):
    r = ChatRenderer(tok)
    r.add({"role": "user", "content": "hi"})
    r.start_generation()
    f = r.fork()
    r.append_generated(tok.encode("one") + [end_id(tok)])
    f.append_generated(tok.encode("two") + [end_id(tok)])
    f.add({"role": "user", "content": "more"})
    a, b = r.finish(), f.finish()
    assert [m["content"] for m in r.messages] == ["hi", "one"]
    assert [m["content"] for m in f.messages] == ["hi", "two", "more"]
    n = a.span(1).content_start
    assert a.tokens[:n] == b.tokens[:n] and tok.decode(b.tokens).endswith("two<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n")


def test_finish_closes_the_conversation(tok):
    """finish() commits the closing the template gives the last message; after a tool result that is
    <|im_end|>, which another tool result would have replaced: further messages are a clear error,
    finish() again returns the same record, and a fork taken before finish() goes on."""
    r = ChatRenderer(tok, tools=TOOLS)
    r.add({"role": "user", "content": "go"})
    r.start_generation()
    r.append_generated(tok.encode(format_tool_call(ToolCall("search", {"query": "x"}))) + [end_id(tok)])
    r.add({"role": "tool", "content": "a"})
    branch = r.fork()
    assert not r.finished
    chat = r.finish()
    assert r.finished and tok.decode(chat.tokens).endswith("\n<tool_response>\na\n</tool_response><|im_end|>\n")
    for call in [lambda: r.add({"role": "tool", "content": "b"}), lambda: r.add({"role": "user", "content": "b"}),
                 r.start_generation]:
        with pytest.raises(ChatInputError, match=r"the conversation is finished \(finish\(\) committed the closing "
                                                 r"of message 2.*expected calls before finish\(\).*r\.fork\(\)\.finish"):
            call()
    assert r.finish() == chat == r.record() and r.fork().finish() == chat
    # The fork continues; its record equals adding both results at once.
    branch.add({"role": "tool", "content": "b"})
    both = ChatRenderer(tok, tools=TOOLS)
    both.add({"role": "user", "content": "go"})
    both.start_generation()
    both.append_generated(tok.encode(format_tool_call(ToolCall("search", {"query": "x"}))) + [end_id(tok)])
    both.add({"role": "tool", "content": "a"}, {"role": "tool", "content": "b"})
    assert branch.finish() == both.finish()
    assert tok.decode(branch.record().tokens) == branch.render_text(branch.messages)

# ============================================================================ templates that reject partial conversations
def _batched_flow(tok, template, thinking, tools=TOOLS):
    """system + user in one add, a generated turn with two calls, both results in one add, an answer, an
    assistant dict, a new user query and its answer. Returns (renderer, prompts)."""
    end = end_id(tok)
    r = ChatRenderer(tok, template, thinking=thinking, tools=tools)
    prompts = []

    def gen(body, think):
        prompts.append(r.start_generation())
        text = body if thinking == "disabled" or think is None else f"<think>\n{think}\n</think>\n\n{body}"
        r.append_generated(tok.encode(text) + [end])

    r.add({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where are W1 and W2?"})
    gen("\n".join(format_tool_call(ToolCall("get_order", {"order_id": w})) for w in ["W1", "W2"]), "look up both")
    r.add({"role": "tool", "content": '{"status": "shipped"}'}, {"role": "tool", "content": '{"status": "lost"}'})
    gen("W1 shipped; W2 is lost.", "summarise")
    r.add({"role": "assistant", "content": "Anything else?"})
    r.add({"role": "user", "content": "No, thanks."})
    gen("Bye.", None)
    return r, prompts


@pytest.mark.parametrize("thinking", ["keep", "strip", "disabled"])
def test_template_rejecting_partial_conversations(tok3, thinking):
    """Closing boundaries never need a render the template rejects: a template that raises on a
    conversation without a user query (as Qwen3's does) renders exactly as without the check."""
    guarded = qwen3_guarded(tok3)
    system, user = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}
    with pytest.raises(ChatTemplateError, match="No user query found"):
        render_template(guarded, [system])
    assert render_template(guarded, [system, user]) == render_template(tok3.chat_template, [system, user])
    # Adding the system message alone is rejected by the template itself, with a hint.
    with pytest.raises(ChatTemplateError, match=r"roles \['system'\].*No user query found in messages.*same "
                                                r"add\(\) call"):
        ChatRenderer(tok3, guarded).add(system)
    plain, prompts = _batched_flow(tok3, None, thinking)
    r, prompts_guarded = _batched_flow(tok3, guarded, thinking)
    assert prompts_guarded == prompts
    chat = r.finish()
    assert chat == plain.finish() and r.breaks == plain.breaks and r.scoring_views() == plain.scoring_views()
    check_spans(chat)
    s0, s3 = chat.span(0), chat.span(3)
    closing = tok3.decode(chat.tokens[s0.content_end:s0.end])  # the system turn's: the tools section
    assert closing.startswith("\n\n# Tools") and closing.endswith("</tool_call><|im_end|>\n")
    assert tok3.decode(chat.tokens[s3.content_end:s3.end]) == "\n</tool_response>"  # merged tool results
    for i, m in enumerate(r.messages):
        assert tok3.decode(chat.content_tokens(i)) == m["content"]


def test_template_failing_on_partial_conversations_falls_back(tok):
    """A template that cannot render a conversation without a user message at all (an undefined value,
    not raise_exception): the closing between two messages added together is then found from the whole
    conversation's render (the text after a content that the template also writes after the last one)."""
    first_query = "{%- set topic = (messages | selectattr('role', 'equalto', 'user') | first).content -%}\n"
    failing = first_query + tok.chat_template
    with pytest.raises(ChatTemplateError, match="UndefinedError"):
        render_template(failing, [{"role": "system", "content": "x"}])
    for tools in [None, TOOLS]:
        plain, prompts = _batched_flow(tok, None, "keep", tools)
        r, prompts_failing = _batched_flow(tok, failing, "keep", tools)
        chat, expected = r.finish(), plain.finish()
        assert prompts_failing == prompts and chat.tokens == expected.tokens and r.breaks == []
        check_spans(chat)
        for i, m in enumerate(r.messages):
            assert tok.decode(chat.content_tokens(i)) == m["content"]
        assert tok.decode(chat.tokens) == r.render_text(r.messages)
        s0, s1 = chat.span(0), chat.span(1)
        if tools is None:  # the system turn's closing is the user turn's: found, spans as with the plain template
            assert chat == expected and tok.decode(chat.tokens[s0.content_end:s0.end]) == "<|im_end|>\n"
        else:  # the tools section after the system prompt is not a closing any last message gets: the user's prefix
            assert s0.end == s0.content_end and tok.decode(chat.tokens[s1.start:s1.content_start]).startswith(
                "\n\n# Tools")
            assert chat.spans[2:] == expected.spans[2:]


# ============================================================================ errors
def test_errors_name_field_value_expected(tok, fixtures_dir):
    no_tools = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="tools: 2 tool schema.*never reads the `tools` variable"):
        ChatRenderer(tok, no_tools, tools=TOOLS)
    ChatRenderer(tok, no_tools)  # fine without tools
    with pytest.raises(ChatInputError, match=r"thinking: got 'sometimes'; expected one of keep, strip, disabled"):
        ChatRenderer(tok, thinking="sometimes")
    with pytest.raises(ChatInputError, match=r"tools\[0\]: expected a function schema"):
        ChatRenderer(tok, tools=[{"type": "function"}])
    with pytest.raises(ChatInputError, match="tools: expected a list"):
        ChatRenderer(tok, tools={"name": "x"})
    bare = load_tokenizer(fixtures_dir / "tokenizer_qwen")
    bare.chat_template = None
    with pytest.raises(ChatTemplateError, match="has no chat_template and none was given"):
        ChatRenderer(bare)
    r = ChatRenderer(tok)
    with pytest.raises(ChatInputError, match=r"messages\[1\]\.role: got 'robot'; expected one of system, user, "
                                             r"assistant, tool"):
        r.add({"role": "user", "content": "a"}, {"role": "robot", "content": "b"})
    assert r.tokens == [] and r.messages == []  # nothing committed by a rejected add
    with pytest.raises(ChatInputError, match=r"messages\[0\]\.content: got int; expected a str"):
        r.add({"role": "user", "content": 3})
    with pytest.raises(ChatInputError, match=r"messages\[0\]\.tool_calls\[0\]: tool call 0: 'name' must be"):
        r.add({"role": "assistant", "content": "", "tool_calls": [{"arguments": {}}]})
    with pytest.raises(ChatInputError, match=r"messages\[0\]\.tool_calls\[1\]: expected a ToolCall or a dict, got str"):
        r.add({"role": "assistant", "content": "", "tool_calls": [ToolCall("a", {}), "get_order"]})
    with pytest.raises(ChatInputError, match=r"messages\[0\]\.tool_calls: only assistant"):
        r.add({"role": "user", "content": "", "tool_calls": [ToolCall("a", {})]})
    with pytest.raises(ChatInputError, match="no generation is pending"):
        r.append_generated([1])
    r.add({"role": "user", "content": "a"})
    r.start_generation()
    with pytest.raises(ChatInputError, match="a generation is pending"):
        r.add({"role": "user", "content": "b"})
    with pytest.raises(ChatInputError, match="already pending"):
        r.start_generation()
    with pytest.raises(ChatInputError, match=r"outside \[0, vocab_size=1024\)"):
        r.append_generated([5000])
    with pytest.raises(ChatInputError, match="no messages given"):
        ChatRenderer(tok).add()


def test_template_that_cannot_continue_token_in_token_out(tok):
    """A template rendering messages newest-first can never be extended: a clear error."""
    reverse = "{% for m in messages|reverse %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    r = ChatRenderer(tok, reverse)
    r.add({"role": "user", "content": "first"})
    with pytest.raises(ChatTemplateError, match=r"messages\[1\] \(user\)"):
        r.add({"role": "user", "content": "second"})
    no_prompt = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    r = ChatRenderer(tok, no_prompt)
    r.add({"role": "user", "content": "x"})
    with pytest.raises(ChatTemplateError, match="renders no generation prompt"):
        r.start_generation()

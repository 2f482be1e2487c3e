"""Text layer: tokenizer loading (HF directory, SentencePiece), chat-template parity with
transformers, token-in/token-out chat rendering (hand-checked spans, generated tokens verbatim,
tools and tool results, Qwen3 thinking modes, counterfactual content replacement), tool-call
parsing, property tests on random conversations, and named errors for bad input.

Fixtures: tests/fixtures/tokenizer_qwen{,3} (scripts/make_tokenizer_fixture.py); a tiny
SentencePiece model is trained in a temporary directory."""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxagent.text import (
    ChatInputError,
    ChatRenderer,
    ChatTemplateError,
    MessageSpan,
    TokenizerError,
    ToolCall,
    format_tool_call,
    load_tokenizer,
    parse_assistant,
    render_template,
)

FIXTURES = Path(__file__).parent / "fixtures"
PROPS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOOLS = [
    {"type": "function", "function": {
        "name": "get_order", "description": "Look up an order by id.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the catalogue.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}},
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(FIXTURES / "tokenizer_qwen")


@pytest.fixture(scope="module")
def tok3():
    return load_tokenizer(FIXTURES / "tokenizer_qwen3")


def _end(tok):
    return tok.token_to_id("<|im_end|>")


def _check_spans(chat):
    """Spans tile [0, last end), are ordered, and hold their content spans."""
    at = 0
    for i, s in enumerate(chat.spans):
        assert s.index == i
        assert s.start == at, (s, at)
        assert s.start <= s.content_start <= s.content_end <= s.end, s
        assert s.content_end <= s.generated_end <= s.end if s.generated else s.generated_end == s.content_start
        at = s.end
    return at


# ============================================================================ tokenizer
def test_load_hf_fixture(tok, fixtures_dir):
    assert tok.kind == "hf" and tok.vocab_size == 1024  # <= 2048: fits preset("tiny-qwen2", vocab_size=...)
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert tok.eos_token_ids == (im_end, eot)  # tokenizer EOS, then generation_config.json's list
    assert tok.pad_token_id == eot and tok.bos_token_id is None
    assert tok.chat_template == (fixtures_dir / "tokenizer_qwen" / "chat_template.jinja").read_text()
    for t in ["<|im_start|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
              "</think>"]:
        i = tok.token_to_id(t)
        assert i is not None and tok.encode(t) == [i] and tok.id_to_token(i) == t
    assert tok.token_to_id("<nope>") is None and tok.id_to_token(5000) is None
    assert tok.encode("") == [] and tok.decode([]) == ""
    text = '<|im_start|>user\nNaïve café 中文 🙂 {"a": [1, 2]}<|im_end|>\n'
    assert tok.decode(tok.encode(text)) == text and tok.round_trips(text)
    with pytest.raises(TokenizerError, match=r"outside \[0, vocab_size=1024\)"):
        tok.decode([1, 1024])
    with pytest.raises(TokenizerError, match="must be a str"):
        tok.encode(b"bytes")


@PROPS
@given(st.text(max_size=40), st.text(max_size=40))
def test_encode_pieces_concatenate(tok, a, b):
    """Byte-level BPE: pieces encoded separately decode to the concatenated text."""
    assert tok.decode(tok.encode(a) + tok.encode(b)) == a + b


def _train_sentencepiece(dirpath, **options):
    import sentencepiece as spm

    rng = random.Random(0)
    words = ["order", "item", "the", "status", "user", "assistant", "hello", "world", "price", "return", "café"]
    lines = [" ".join(rng.choice(words) for _ in range(8)) + rng.choice([".", "?", " 12", ' {"a": 1}'])
             for _ in range(400)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(dirpath / "tokenizer"), vocab_size=400, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, minloglevel=2,
        user_defined_symbols=["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
                              "</tool_response>", "<think>", "</think>"], **options)
    (dirpath / "tokenizer.vocab").unlink()


def test_sentencepiece_tokenizer_and_chat(tmp_path, fixtures_dir):
    """A SentencePiece model trained with its default dummy prefix: pieces still concatenate
    (the prefix is switched off), special symbols are single ids, the template comes from
    chat_template.jinja, and chat spans decode to their contents."""
    _train_sentencepiece(tmp_path, normalization_rule_name="identity", remove_extra_whitespaces=False)
    shutil.copy(fixtures_dir / "tokenizer_qwen" / "chat_template.jinja", tmp_path / "chat_template.jinja")
    sp = load_tokenizer(tmp_path)
    assert sp.kind == "sentencepiece" and sp.vocab_size == 400 and sp.eos_token_ids == (2,)
    assert sp.special_tokens == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    assert sp.chat_template.startswith("{#- Qwen2.5-style")
    im_end = sp.token_to_id("<|im_end|>")
    assert sp.encode("<|im_end|>") == [im_end] and sp.token_to_id("<nope>") is None
    for a, b in [("hello", " world"), ("<|im_start|>user\n", "hello  world"), ("naïve 中文 🙂", "\n\n x ")]:
        assert sp.decode(sp.encode(a) + sp.encode(b)) == a + b
    r = ChatRenderer(sp, stop_token_ids=[im_end])
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello world"}]
    r.add(*msgs)
    r.start_generation()
    span = r.append_generated(sp.encode("the status 12.") + [im_end])
    assert span.generated_end == span.content_end + 1
    chat = r.finish()
    _check_spans(chat)
    contents = [m["content"] for m in r.messages]
    assert [sp.decode(chat.content_tokens(i)) for i in range(3)] == contents
    assert sp.decode(chat.tokens) == r.render_text(r.messages)


def test_metaspace_tokenizer_pieces_have_no_prefix_space():
    """A SentencePiece-style (Metaspace, prepend "first") fast tokenizer: a piece encoded in the
    middle of a chat gets no prefix space, so pieces concatenate."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from jaxagent.text import Tokenizer

    raw = RawTokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    raw.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    raw.train_from_iterator(["hello world the order is here\n"] * 20, trainers.BpeTrainer(
        vocab_size=60, special_tokens=["<unk>", "<|im_end|>"], show_progress=False,
        initial_alphabet=list("abcdefghijklmnopqrstuvwxyz\n \u2581")))
    t = Tokenizer.from_hf(PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>"))
    assert raw.encode("hello").tokens[0].startswith("\u2581")  # the raw tokenizer adds one
    for a, b in [("hello", " world"), ("hello", "world"), ("<|im_end|>", "hello"), ("order\n", "the here")]:
        assert t.decode(t.encode(a) + t.encode(b)) == a + b
    assert t.eos_token_ids == (raw.token_to_id("<|im_end|>"),)
    assert not t.round_trips(" world")  # its decoder drops a leading space: spans decode without it


def test_load_errors(tmp_path):
    with pytest.raises(TokenizerError, match="not a directory"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "weights.bin").write_text("x")
    with pytest.raises(TokenizerError, match=r"looked for tokenizer.json or tokenizer_config.json .* tokenizer.model"
                                             r".*'weights.bin'"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="AutoTokenizer could not load it"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "bad_gen"
    bad.mkdir()
    (bad / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(TokenizerError, match="eos_token_id must be an int or a list of ints"):
        load_tokenizer(bad)


@pytest.mark.parametrize("kind", ["hf", "sentencepiece"])
def test_malformed_chat_template_json(tmp_path, fixtures_dir, kind):
    """chat_template.json next to the tokenizer: a bad file is a TokenizerError naming the file, the
    problem and the expected form; a good one gives the template."""
    if kind == "hf":
        for name in ["tokenizer.json", "tokenizer_config.json"]:
            shutil.copy(fixtures_dir / "tokenizer_qwen" / name, tmp_path / name)
    else:
        _train_sentencepiece(tmp_path)
    js = tmp_path / "chat_template.json"
    expected = r'expected a JSON object \{"chat_template": "<Jinja source string>"\}'
    js.write_text('{"chat_template": "{{ x }}",\n')
    with pytest.raises(TokenizerError, match=rf"chat_template.json: invalid JSON \(Expecting property name .* at line 2"
                                             rf" column 1\); {expected}"):
        load_tokenizer(tmp_path)
    js.write_text('["{{ x }}"]')
    with pytest.raises(TokenizerError, match=rf"chat_template.json: got a JSON list; {expected}"):
        load_tokenizer(tmp_path)
    js.write_text('{"template": "{{ x }}"}')
    with pytest.raises(TokenizerError, match=rf"chat_template.json: chat_template is None \(NoneType\); {expected}"):
        load_tokenizer(tmp_path)
    js.write_text('{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}')
    assert load_tokenizer(tmp_path).chat_template == "{% for m in messages %}{{ m.content }}{% endfor %}"


# ============================================================================ templates
def _sample_conversation():
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is order W1?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"type": "function", "function": {"name": "get_order", "arguments": {"order_id": "W1"}}},
            {"type": "function", "function": {"name": "search", "arguments": {"query": "W1", "limit": 2}}}]},
        {"role": "tool", "content": '{"status": "shipped"}'},
        {"role": "tool", "content": "[]"},
        {"role": "assistant", "content": "<think>\nok\n</think>\n\nIt shipped."},
        {"role": "user", "content": "Thanks"},
    ]


@pytest.mark.parametrize("name", ["tokenizer_qwen", "tokenizer_qwen3"])
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("gen,thinking", [(False, True), (True, True), (True, False)])
def test_render_template_matches_transformers(fixtures_dir, name, tools, gen, thinking):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(fixtures_dir / name), local_files_only=True)
    for msgs in [_sample_conversation(), _sample_conversation()[1:3]]:
        ours = render_template(hf.chat_template, msgs, tools=tools, add_generation_prompt=gen,
                               enable_thinking=thinking)
        theirs = hf.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen,
                                        enable_thinking=thinking)
        assert ours == theirs


_SPECIAL_TOKEN_TEMPLATE = (
    "{{ bos_token | default('[no bos]') }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}[{{ pad_token }}|{{ unk_token | default('-') }}]")


def test_special_tokens_are_template_variables(tok, fixtures_dir):
    """As apply_chat_template passes {**special_tokens_map, **kwargs}: a template reading {{ eos_token }}
    renders as transformers renders it, in render_template and in the ChatRenderer."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(fixtures_dir / "tokenizer_qwen"), local_files_only=True)
    assert tok.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"} == hf.special_tokens_map
    msgs = _sample_conversation()[:2]
    for gen in (False, True):
        theirs = hf.apply_chat_template(msgs, chat_template=_SPECIAL_TOKEN_TEMPLATE, tokenize=False,
                                        add_generation_prompt=gen)
        assert "Be brief.<|im_end|>" in theirs and "[<|endoftext|>|-]" in theirs
        assert render_template(_SPECIAL_TOKEN_TEMPLATE, msgs, special_tokens=tok.special_tokens,
                               add_generation_prompt=gen) == theirs
    # Template variables override special tokens, as in transformers.
    assert render_template(_SPECIAL_TOKEN_TEMPLATE, msgs, special_tokens=tok.special_tokens, eos_token="</s>") == \
        hf.apply_chat_template(msgs, chat_template=_SPECIAL_TOKEN_TEMPLATE, tokenize=False, eos_token="</s>")
    r = ChatRenderer(tok, _SPECIAL_TOKEN_TEMPLATE)
    r.add(*msgs)
    assert tok.decode(r.finish().tokens) == hf.apply_chat_template(msgs, chat_template=_SPECIAL_TOKEN_TEMPLATE,
                                                                   tokenize=False)


def test_generation_blocks_render_their_body():
    source = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    assert render_template(source, [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]) == \
        "[a][b]"


def test_template_errors(tok):
    with pytest.raises(ChatTemplateError, match="Jinja syntax error at line 1"):
        render_template("{% if %}", [])
    with pytest.raises(ChatTemplateError, match="unknown role: robot"):
        render_template(tok.chat_template, [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])


# ============================================================================ rendering: hand-checked
def test_hand_checked_render(tok):
    """A small conversation with exact token boundaries: every piece is tokenised on its own."""
    e, end = tok.encode, _end(tok)
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
    span = r.append_generated(odd + [_end(tok)])
    r.add({"role": "user", "content": "and?"})
    chat = r.finish()
    assert list(chat.tokens[span.content_start:span.generated_end]) == odd + [_end(tok)]
    assert r.messages[1] == {"role": "assistant", "content": text}
    assert tok.decode(chat.tokens) == r.render_text(r.messages) and r.breaks == []


def test_stop_token_completing_a_character(tok):
    """A stop id that is a byte token, completing the character the content's last token began: the
    tokens are kept verbatim, the message's content is the decoded text cut at the content's decoded
    length, and the conversation renders as the template renders it."""
    lead, trail = tok.token_to_id("\u00c3"), tok.token_to_id("\u00a9")  # the bytes of "é" (C3 A9)
    assert tok.decode([lead]) == "\ufffd" and tok.decode([lead, trail]) == "é"
    r = ChatRenderer(tok, stop_token_ids=[trail, _end(tok)])
    r.add({"role": "user", "content": "hi"})
    r.start_generation()
    ids = tok.encode("caf") + [lead, trail]
    span = r.append_generated(ids)
    assert span.generated_end == span.content_end + 1 and r.messages[1] == {"role": "assistant", "content": "café"}
    r.add({"role": "user", "content": "ok"})
    chat = r.finish()
    assert list(chat.tokens[span.content_start:span.generated_end]) == ids and r.breaks == []
    assert tok.decode(chat.tokens) == r.render_text(r.messages)
    _check_spans(chat)


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
    span = r.append_generated(tok.encode(text) + [_end(tok)])
    parsed = parse_assistant(tok.decode(r.tokens[span.content_start:span.content_end]))
    assert parsed.content == "Checking." and parsed.tool_calls == tuple(calls) and parsed.ok
    t1, t2 = r.add({"role": "tool", "content": '{"status": "shipped"}'}, {"role": "tool", "content": "[]"})
    assert t2.end == t2.content_end == len(r.tokens)  # its closing comes with the next message
    r.add({"role": "assistant", "content": "", "tool_calls": [ToolCall("get_order", {"order_id": "W2"})]})
    r.add({"role": "tool", "content": "{}"})
    chat = r.finish()
    _check_spans(chat)
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
        r.append_generated(tok.encode(format_tool_call(ToolCall("search", {"query": "x"}))) + [_end(tok)])
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
    _check_spans(one)


def test_fork_branches_independently(tok):
    r = ChatRenderer(tok)
    r.add({"role": "user", "content": "hi"})
    r.start_generation()
    f = r.fork()
    r.append_generated(tok.encode("one") + [_end(tok)])
    f.append_generated(tok.encode("two") + [_end(tok)])
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
    r.append_generated(tok.encode(format_tool_call(ToolCall("search", {"query": "x"}))) + [_end(tok)])
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
    both.append_generated(tok.encode(format_tool_call(ToolCall("search", {"query": "x"}))) + [_end(tok)])
    both.add({"role": "tool", "content": "a"}, {"role": "tool", "content": "b"})
    assert branch.finish() == both.finish()
    assert tok.decode(branch.record().tokens) == branch.render_text(branch.messages)


# ============================================================================ Qwen3 thinking modes
def _qwen3_episode(tok3, thinking):
    """user, think+call, tool, think+answer, user, think+answer; returns (renderer, prompts, generated)."""
    end = _end(tok3)
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
    _check_spans(chat)
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
        _check_spans(v)
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
    _check_spans(chat)
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
        _check_spans(v)
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
    _check_spans(chat)
    for i, m in enumerate(r.messages):
        assert tok3.decode(chat.content_tokens(i)) == m["content"]
    assert len(r.breaks) >= 1


# ============================================================================ templates that reject partial conversations
def _qwen3_guarded(tok3):
    """The Qwen3-style fixture template with real Qwen3's check: raise_exception("No user query found in
    messages.") when the conversation holds no user query."""
    main_loop = "{%- for message in messages -%}\n    {%- if message.role == 'system' -%}"
    assert tok3.chat_template.count(main_loop) == 1
    guard = "{%- if ns.last_query < 0 -%}{{- raise_exception('No user query found in messages.') -}}{%- endif -%}\n"
    return tok3.chat_template.replace(main_loop, guard + main_loop)


def _batched_flow(tok, template, thinking, tools=TOOLS):
    """system + user in one add, a generated turn with two calls, both results in one add, an answer, an
    assistant dict, a new user query and its answer. Returns (renderer, prompts)."""
    end = _end(tok)
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
    guarded = _qwen3_guarded(tok3)
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
    _check_spans(chat)
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
        _check_spans(chat)
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


# ============================================================================ tool-call parsing
def test_parse_assistant_cases():
    p = parse_assistant("Plain answer.")
    assert p.content == "Plain answer." and p.tool_calls == () and p.thinking is None and p.ok
    p = parse_assistant('<think>\nplan\n</think>\n\nok\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n'
                        '</tool_call>\n<tool_call>\n{"name": "b", "arguments": "{\\"y\\": [2]}"}\n</tool_call>')
    assert p.thinking == "plan" and p.content == "ok" and p.ok
    assert p.tool_calls == (ToolCall("a", {"x": 1}), ToolCall("b", {"y": [2]}))
    assert parse_assistant("reasoning opened by the prompt</think>\n\nDone").thinking == \
        "reasoning opened by the prompt"
    cut = parse_assistant("<think>\nstill thinking")
    assert cut.thinking == "still thinking" and not cut.thinking_closed and not cut.ok and cut.content == ""
    cases = {
        "invalid_json": '<tool_call>\n{"name": "a", "arguments": {</tool_call>',
        "not_an_object": "<tool_call>\n[1, 2]\n</tool_call>",
        "missing_name": '<tool_call>\n{"arguments": {}}\n</tool_call>',
        "missing_arguments": '<tool_call>\n{"name": "a"}\n</tool_call>',
        "bad_arguments": '<tool_call>\n{"name": "a", "arguments": [1]}\n</tool_call>',
        "unclosed": 'Sure <tool_call>\n{"name": "a", "arguments": {}}',
    }
    for reason, text in cases.items():
        p = parse_assistant(text)
        assert p.tool_calls == () and len(p.errors) == 1 and not p.ok, reason
        err = p.errors[0]
        assert err.reason == reason and err.index == 0 and err.raw in text and "tool call 0" in err.message
    p = parse_assistant('<tool_call>{"name": 1, "arguments": {}}</tool_call><tool_call>{"name": "ok", '
                        '"arguments": {}}</tool_call>')
    assert [e.reason for e in p.errors] == ["missing_name"] and p.tool_calls == (ToolCall("ok", {}),)
    assert p.errors[0].raw == '{"name": 1, "arguments": {}}'
    with pytest.raises(TypeError):
        parse_assistant(None)


def test_tool_calls_are_hashable():
    """Equal calls (dict equality of the arguments, key order and 1 == 1.0 included) hash equally, so
    calls dedupe in sets and key a cache of tool results."""
    a = ToolCall("search", {"query": "x", "filters": [{"in_stock": True}, None], "limit": 2})
    b = ToolCall("search", {"limit": 2.0, "filters": [{"in_stock": True}, None], "query": "x"})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != ToolCall("search", {"query": "y"}) and len({a, ToolCall("search", {"query": "y"})}) == 2
    cache = {a: "3 results"}
    parsed = parse_assistant(format_tool_call(b)).tool_calls[0]
    assert parsed is not b and cache[parsed] == "3 results"


_TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", '"name"', '"arguments"', ":", "\n", "[", "]"]


@PROPS
@given(st.lists(st.one_of(st.text(max_size=8), st.sampled_from(_TAGS)), max_size=12))
def test_parse_assistant_never_raises(parts):
    p = parse_assistant("".join(parts))
    assert isinstance(p.content, str)
    for e in p.errors:
        assert e.reason in {"unclosed", "invalid_json", "not_an_object", "missing_name", "missing_arguments",
                            "bad_arguments"}


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8))
_json = st.recursive(_json_leaf, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c,
                                                                                           max_size=3)), max_leaves=6)
_calls = st.lists(st.builds(ToolCall, st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
                            st.dictionaries(st.text(max_size=6), _json, max_size=3)), max_size=3)
_plain_text = st.text(st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), max_size=20)


@PROPS
@given(_plain_text, _calls, st.one_of(st.none(), _plain_text))
def test_parse_assistant_round_trip(content, calls, thinking):
    text = "\n".join([content.strip(), *map(format_tool_call, calls)])
    if thinking is not None:
        text = f"<think>\n{thinking}\n</think>\n\n{text}"
    p = parse_assistant(text)
    assert p.tool_calls == tuple(calls) and p.errors == () and p.content == content.strip()
    assert hash(p.tool_calls) == hash(tuple(calls))
    assert p.thinking == (None if thinking is None else thinking.strip("\n"))


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
            ids = ids + [_end(tok)] if stop else ids
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
    assert _check_spans(chat) == len(chat.tokens)
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
    r.append_generated(tok.encode(format_tool_call(ToolCall("search", {"query": "x"}))) + [_end(tok)])
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
    template = data.draw(st.sampled_from([None, _qwen3_guarded(tok3)]))
    r = ChatRenderer(tok3, template, thinking=thinking, tools=TOOLS)
    prompts, generated = {}, {}
    for ev in events:
        if ev[0] == "add":
            r.add(*ev[1])
            continue
        i = len(r.messages)
        prompts[i] = r.start_generation()
        assert tok3.decode(prompts[i]) == r.render_text(r.messages, add_generation_prompt=True)
        generated[i] = tok3.encode(ev[1]) + [_end(tok3)]
        r.append_generated(generated[i])
    r.finish()
    covered = []
    for v in r.scoring_views():
        _check_spans(v)
        for i in v.scored:
            s = v.span(i)
            assert list(v.tokens[:s.content_start]) == prompts[i]
            assert list(v.tokens[s.content_start:s.generated_end]) == generated[i]
        assert v.loss_mask().sum() == sum(len(generated[i]) for i in v.scored)
        covered += v.scored
    assert covered == sorted(generated)

"""Tokenizer loading (HF directory, SentencePiece, metaspace), chat-template rendering with
transformers' Jinja environment, and the loaders' errors."""

import json
import random
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxagent.text import (
    ChatRenderer,
    ChatTemplateError,
    TokenizerError,
    load_tokenizer,
    render_template,
)

from tests.text_helpers import PROPS, TOOLS, check_spans, tok  # noqa: F401 (fixtures)


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
    check_spans(chat)
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

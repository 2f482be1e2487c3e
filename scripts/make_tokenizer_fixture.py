"""Writes the tiny Qwen-style tokenizer fixtures under tests/fixtures/ (no network, no torch).

    python scripts/make_tokenizer_fixture.py [--out tests/fixtures]

Trains a byte-level BPE with the ``tokenizers`` library on a generated corpus (English-like words,
JSON tool calls and results, digits, a little non-ASCII text), with Qwen2's pre-tokenizer regex,
and saves it twice as a Hugging Face tokenizer directory:

- ``tokenizer_qwen/``: a Qwen2.5-style chat template (ChatML turns, a ``# Tools`` section with
  ``<tools></tools>`` in the system turn, ``<tool_call>`` JSON for assistant calls, tool results as
  ``<tool_response>`` blocks inside user turns, consecutive results sharing one turn);
- ``tokenizer_qwen3/``: the same tokenizer with a Qwen3-style template (``<think>`` blocks,
  thinking dropped from assistant turns before the latest user query, ``enable_thinking``).

The templates are written for this project; they produce the same turn format as Qwen's
templates, with different wording in the default system prompt and the tools instructions.

Vocabulary: 1,018 trained entries (256 bytes, merges, and ``<|endoftext|>``, ``<|im_start|>``,
``<|im_end|>`` as special tokens with ids 0-2) plus the six added tool/think tokens, 1,024 in all,
so a test can pair it with ``preset("tiny-qwen2", vocab_size=1024)``. ``generation_config.json``
lists ``<|im_end|>`` and ``<|endoftext|>`` as stop tokens, as Qwen instruct checkpoints do.
Deterministic: the same corpus and the same files on every run.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

# Qwen2's pre-tokenizer split (contractions, letters, single digits, punctuation runs with their
# trailing newlines, newline runs, other whitespace).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
VOCAB_TOTAL = 1024

QWEN25_TEMPLATE = r"""{#- Qwen2.5-style chat template written for the jaxagent test fixtures. -#}
{%- set default_system = 'You are a helpful assistant.' -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0].role == 'system' -%}
        {{- messages[0].content -}}
    {%- else -%}
        {{- default_system -}}
    {%- endif -%}
    {{- '\n\n# Tools\n\nThese functions are available to help with the request.\n\nTheir JSON signatures are listed inside <tools></tools> tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nTo call a function, reply with a JSON object holding its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- else -%}
    {{- '<|im_start|>system\n' + default_system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' -%}
        {%- if not loop.first -%}
            {{- '<|im_start|>system\n' + message.content + '<|im_end|>\n' -}}
        {%- endif -%}
    {%- elif message.role == 'user' -%}
        {{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' and not message.tool_calls -%}
        {{- '<|im_start|>assistant\n' + message.content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant' -}}
        {%- if message.content -%}
            {{- '\n' + message.content -}}
        {%- endif -%}
        {%- for call in message.tool_calls -%}
            {%- if call.function is defined -%}
                {%- set call = call.function -%}
            {%- endif -%}
            {{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' -}}
            {%- if call.arguments is string -%}
                {{- call.arguments -}}
            {%- else -%}
                {{- call.arguments | tojson -}}
            {%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- raise_exception('unknown role: ' + message.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

QWEN3_TEMPLATE = r"""{#- Qwen3-style chat template (thinking) written for the jaxagent test fixtures. -#}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0].role == 'system' -%}
        {{- messages[0].content + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nThese functions are available to help with the request.\n\nTheir JSON signatures are listed inside <tools></tools> tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nTo call a function, reply with a JSON object holding its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{#- The latest user query: a user turn that is not a wrapped tool response. Assistant turns before
    it lose their thinking; turns after it (the current tool-calling episode) keep it. -#}
{%- set ns = namespace(last_query=-1) -%}
{%- for message in messages -%}
    {%- if message.role == 'user' and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) -%}
        {%- set ns.last_query = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {%- if message.role == 'system' -%}
        {%- if not loop.first -%}
            {{- '<|im_start|>system\n' + message.content + '<|im_end|>\n' -}}
        {%- endif -%}
    {%- elif message.role == 'user' -%}
        {{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = message.content if message.content is string else '' -%}
        {%- set reasoning = '' -%}
        {%- if message.reasoning_content is string -%}
            {%- set reasoning = message.reasoning_content -%}
        {%- elif '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
        {%- else -%}
            {{- '<|im_start|>assistant\n' + content -}}
        {%- endif -%}
        {%- if message.tool_calls -%}
            {%- for call in message.tool_calls -%}
                {%- if (loop.first and content) or not loop.first -%}
                    {{- '\n' -}}
                {%- endif -%}
                {%- if call.function is defined -%}
                    {%- set call = call.function -%}
                {%- endif -%}
                {{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' -}}
                {%- if call.arguments is string -%}
                    {{- call.arguments -}}
                {%- else -%}
                    {{- call.arguments | tojson -}}
                {%- endif -%}
                {{- '}\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- raise_exception('unknown role: ' + message.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
"""

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "ch",
           "sh", "th", "pl", "gr"]
_VOWELS = ["a", "e", "i", "o", "u", "ea", "ou", "ai", "ie"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck"]
_COMMON = ["the", "a", "to", "of", "and", "is", "in", "for", "you", "your", "order", "item", "please", "user",
           "assistant", "tool", "name", "arguments", "result", "status", "price", "id", "true", "false", "null",
           "what", "which", "can", "I", "help", "with", "find", "search", "return", "cancel", "address"]
_UNICODE = ["café", "naïve", "Grüße", "日本語", "中文", "🙂", "Ελληνικά", "русский", "€", "—"]


def _word(rng: random.Random) -> str:
    if rng.random() < 0.45:
        return rng.choice(_COMMON)
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(rng.randint(1, 3)))


def _sentence(rng: random.Random) -> str:
    words = [_word(rng) for _ in range(rng.randint(3, 12))]
    if rng.random() < 0.1:
        words.insert(rng.randrange(len(words)), rng.choice(_UNICODE))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", "?", "!", ":", ","])


def _value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if r < 0.3:
        return _word(rng)
    if r < 0.5:
        return rng.randint(0, 99999)
    if r < 0.6:
        return round(rng.uniform(0, 1000), 2)
    if r < 0.7:
        return rng.choice([True, False, None])
    if depth < 2 and r < 0.85:
        return {_word(rng): _value(rng, depth + 1) for _ in range(rng.randint(1, 3))}
    if depth < 2:
        return [_value(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    return _word(rng)


def corpus(n_docs: int = 4000, seed: int = 0) -> list[str]:
    """Generated training documents: prose, JSON objects, tool calls and results, digits."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        kind = rng.random()
        if kind < 0.4:
            docs.append(" ".join(_sentence(rng) for _ in range(rng.randint(1, 4))))
        elif kind < 0.6:
            obj = {_word(rng): _value(rng) for _ in range(rng.randint(1, 4))}
            docs.append(json.dumps(obj, ensure_ascii=False))
        elif kind < 0.8:
            call = {"name": "_".join(_word(rng) for _ in range(2)), "arguments": {_word(rng): _value(rng)}}
            docs.append("<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>")
        elif kind < 0.9:
            docs.append("<tool_response>\n" + json.dumps(_value(rng), ensure_ascii=False) + "\n</tool_response>")
        else:
            docs.append(f"{_sentence(rng)}\n\n{rng.randint(0, 10**6)} {_sentence(rng)}\n")
    return docs


def train_byte_level_bpe(texts, vocab_total: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` with Qwen2's pre-tokenizer trained on ``texts``:
    the special tokens first (ids 0-2), the added tool/think markers last, ``vocab_total`` ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_total - len(ADDED), min_frequency=2, special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Qwen's tool and think markers are added (not special) tokens placed after the trained vocabulary.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    assert tok.get_vocab_size() == vocab_total, tok.get_vocab_size()
    return tok


def train_tokenizer(seed: int = 0):
    """The fixture's BPE: 1,024 ids in all."""
    return train_byte_level_bpe(corpus(seed=seed), VOCAB_TOTAL)


def write_fixture(out: Path, tok, template: str) -> None:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
        model_max_length=32768, clean_up_tokenization_spaces=False,
    )
    hf.chat_template = template
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    (out / "chat_template.jinja").write_text(template)
    # Name the class every transformers version knows (5.x saves its internal "TokenizersBackend").
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen = {"eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
           "pad_token_id": tok.token_to_id("<|endoftext|>")}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "fixtures")
    args = ap.parse_args(argv)
    tok = train_tokenizer()
    for name, template in [("tokenizer_qwen", QWEN25_TEMPLATE), ("tokenizer_qwen3", QWEN3_TEMPLATE)]:
        write_fixture(args.out / name, tok, template)
        files = sorted(p.name for p in (args.out / name).iterdir())
        size = sum(p.stat().st_size for p in (args.out / name).iterdir())
        print(json.dumps({"fixture": name, "files": files, "bytes": size, "vocab_size": tok.get_vocab_size()}), flush=True)
    print(f"make_tokenizer_fixture: wrote tokenizer_qwen, tokenizer_qwen3 under {args.out}/", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

"""Shared by the text-layer tests: the fixture tokenizers, tool schemas, hypothesis settings and
the span-tiling check."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from jaxagent.text import (
    load_tokenizer,
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


def end_id(tok):
    return tok.token_to_id("<|im_end|>")


def check_spans(chat):
    """Spans tile [0, last end), are ordered, and hold their content spans."""
    at = 0
    for i, s in enumerate(chat.spans):
        assert s.index == i
        assert s.start == at, (s, at)
        assert s.start <= s.content_start <= s.content_end <= s.end, s
        assert s.content_end <= s.generated_end <= s.end if s.generated else s.generated_end == s.content_start
        at = s.end
    return at


def qwen3_guarded(tok3):
    """The Qwen3-style fixture template with real Qwen3's check: raise_exception("No user query found in
    messages.") when the conversation holds no user query."""
    main_loop = "{%- for message in messages -%}\n    {%- if message.role == 'system' -%}"
    assert tok3.chat_template.count(main_loop) == 1
    guard = "{%- if ns.last_query < 0 -%}{{- raise_exception('No user query found in messages.') -}}{%- endif -%}\n"
    return tok3.chat_template.replace(main_loop, guard + main_loop)

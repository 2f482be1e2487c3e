"""Parsing generated assistant text: thinking, content and Qwen <tool_call> JSON; never raises
(property tests) and round-trips."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxagent.text import (
    ToolCall,
    format_tool_call,
    parse_assistant,
)

from tests.text_helpers import PROPS


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

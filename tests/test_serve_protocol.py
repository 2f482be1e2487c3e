"""The server's pure parts: request validation (every refusal names its field: structure, types,
tool schemas as JSON Schema, the order of tool calls and results), the streamed text split (deltas
add up to the final split, whatever the chunking), stop strings, the session index, the requests'
keys."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.serve.protocol import (
    MAX_DEPTH,
    MAX_SCHEMA_NODES,
    MAX_TOOLS,
    APIError,
    _schema_problem,
    parse_chat,
    parse_completion,
)
from jaxagent.serve.server import MIN_REUSE, SessionIndex, request_key_data, splitmix64
from jaxagent.serve.streaming import TextStream, _held_tail, cut_at_stop, visible
from jaxagent.text.toolcalls import parse_assistant

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def refused(body, param, *, completion=False, status=400):
    with pytest.raises(APIError) as e:
        if completion:
            parse_completion(body, max_n=4, vocab_size=100)
        else:
            parse_chat(body, max_n=4)
    assert e.value.status == status
    assert e.value.param == param, e.value.message
    assert e.value.body()["error"]["param"] == param and e.value.body()["error"]["type"] == "invalid_request_error"
    return e.value.message


def test_a_chat_request_is_read_with_openai_defaults():
    req = parse_chat(CHAT, max_n=4)
    s = req.sampling
    assert (s.temperature, s.top_p, s.max_tokens, s.n, s.stop, s.seed, s.stream) == (1.0, 1.0, None, 1, (), None, False)
    assert req.messages == ({"role": "user", "content": "hi"},) and req.tools == () and not req.parse_tools
    body = {**CHAT, "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "text", "text": "b"}]},
                                 {"role": "assistant", "content": None, "tool_calls": [
                                     {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                                 {"role": "tool", "tool_call_id": "c", "content": "ok"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "temperature": 0,
            "max_completion_tokens": 7, "max_tokens": 9, "stop": "x", "n": 2, "seed": 3, "stream": True,
            "stream_options": {"include_usage": True}, "user": "ignored", "parallel_tool_calls": True}
    req = parse_chat(body, max_n=4)
    assert req.messages[0] == {"role": "system", "content": "ab"}
    assert req.messages[1]["tool_calls"][0]["function"]["name"] == "f" and req.messages[2]["tool_call_id"] == "c"
    assert req.parse_tools and len(req.tools) == 1
    s = req.sampling
    assert (s.temperature, s.max_tokens, s.stop, s.n, s.seed, s.stream, s.include_usage) == (0.0, 7, ("x",), 2, 3,
                                                                                               True, True)
    assert parse_chat({**body, "tool_choice": "none"}, max_n=4).tools == ()


@pytest.mark.parametrize("change, param", [
    ({"model": ""}, "model"), ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content[0]"),
    ({"temperature": 2.5}, "temperature"), ({"temperature": "hot"}, "temperature"), ({"temperature": True},
                                                                                      "temperature"),
    ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": 1.5},
                                                                 "max_completion_tokens"),
    ({"n": 5}, "n"), ({"n": 0}, "n"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": [""]}, "stop"),
    ({"seed": "s"}, "seed"), ({"stream": "yes"}, "stream"), ({"stream_options": {"include_usage": True}},
                                                              "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": [1]}}, "stream_options.include_usage"),
    ({"tools": {"name": "f"}}, "tools"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"presence_penalty": 0.5}, "presence_penalty"), ({"logit_bias": {"1": 5}}, "logit_bias"),
    ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"), ({"logprobs": True, "stream": True}, "logprobs"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
])
def test_a_bad_chat_field_is_refused_by_name(change, param):
    message = refused({**CHAT, **change}, param)
    assert message.startswith(param) and "expected" in message


def test_a_body_that_is_not_an_object_is_refused():
    with pytest.raises(APIError, match="JSON object"):
        parse_chat([1, 2], max_n=4)


def test_completion_prompts_in_every_openai_form():
    ask = {"model": "m"}
    assert parse_completion({**ask, "prompt": "a"}, max_n=4, vocab_size=100).prompts == ("a",)
    assert parse_completion({**ask, "prompt": ["a", "b"]}, max_n=4, vocab_size=100).prompts == ("a", "b")
    assert parse_completion({**ask, "prompt": [1, 2]}, max_n=4, vocab_size=100).prompts == ((1, 2),)
    got = parse_completion({**ask, "prompt": [[1], [2, 3]], "logprobs": 0}, max_n=4, vocab_size=100)
    assert got.prompts == ((1,), (2, 3)) and got.sampling.logprobs
    assert got.sampling.max_tokens == 16  # OpenAI's default for /v1/completions
    for prompt in ([], "", [1, "a"], [[]], {"p": 1}, None):
        refused({**ask, "prompt": prompt}, "prompt", completion=True)
    refused({**ask, "prompt": [100]}, "prompt", completion=True)  # outside the vocabulary
    refused({**ask, "prompt": "a", "echo": True}, "echo", completion=True)
    refused({**ask, "prompt": "a", "logprobs": 5}, "logprobs", completion=True)
    refused({**ask, "prompt": "a", "suffix": "z"}, "suffix", completion=True)


# ----------------------------------------------------------------------------- structure, tools, order
def test_a_lone_surrogate_anywhere_is_refused_by_its_path():
    """``"a\ud800b"`` parses in Python's json but cannot be encoded (it was a 500): refused where it is,
    in a field the server reads, one it ignores, a key, a completion prompt or call arguments."""
    bad = "a\ud800b"
    refused({**CHAT, "messages": [{"role": "user", "content": bad}]}, "messages[0].content")
    refused({**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": bad}]}]},
            "messages[0].content[0].text")
    refused({**CHAT, "user": bad}, "user")
    refused({**CHAT, "stop": ["x", bad]}, "stop[1]")
    refused({**CHAT, "metadata": {"a\udc00": 1}}, 'metadata["a\\udc00"]')
    refused({"model": "m", "prompt": ["ok", bad]}, "prompt[1]", completion=True)
    message = refused({**CHAT, "model": bad}, "model")
    message.encode()  # the error itself is sendable (the value shown escaped)
    # inside a call's arguments string, escaped as JSON: what it holds is checked too
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": ["\\ud800"]}'}}]}]
    refused({**CHAT, "messages": msgs}, "messages[1].tool_calls[0].function.arguments.x[0]")
    # a valid pair is one character, not a surrogate
    assert parse_chat({**CHAT, "messages": [{"role": "user", "content": json.loads('"\\ud83d\\ude00"')}]},
                      max_n=4).messages[0]["content"] == "\U0001F600"


def nest(depth: int, leaf=1):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_deeper_than_the_limit_is_refused_by_its_path():
    assert MAX_DEPTH == 64
    parse_chat({**CHAT, "metadata": nest(MAX_DEPTH - 1)}, max_n=4)  # the body is level 1
    # the path of the first array/object past the limit: metadata's list is level 2
    message = refused({**CHAT, "metadata": nest(MAX_DEPTH)}, "metadata" + "[0]" * (MAX_DEPTH - 1))
    assert f"more than {MAX_DEPTH} deep" in message
    refused({**CHAT, "metadata": nest(100_000)}, "metadata" + "[0]" * (MAX_DEPTH - 1))  # no RecursionError
    refused({"model": "m", "prompt": "a", "x": {"y": nest(200)}}, "x.y" + "[0]" * (MAX_DEPTH - 2), completion=True)
    deep_args = json.dumps(nest(MAX_DEPTH))  # fits in its string, not where it lands
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": f'{{"a": {deep_args}}}'}}]}]
    with pytest.raises(APIError) as e:
        parse_chat({**CHAT, "messages": msgs}, max_n=4)
    # the body, messages, the message, tool_calls, the call and function enclose the arguments' object
    assert e.value.param == "messages[1].tool_calls[0].function.arguments.a" + "[0]" * (MAX_DEPTH - 7)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_infinity_are_not_json(value):
    refused({**CHAT, "temperature": value}, "temperature")
    refused({**CHAT, "extra": {"v": [value]}}, "extra.v[0]")


def tool(parameters=None, name="f", **function):
    fn = {"name": name, **function}
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


@pytest.mark.parametrize("tools, param", [
    ([tool("garbage")], "tools[0].function.parameters"),
    ([tool([1, 2])], "tools[0].function.parameters"),
    ([tool(True)], "tools[0].function.parameters"),
    ([tool({"properties": {}})], "tools[0].function.parameters.type"),  # OpenAI: type "object" at the top
    ([tool({"type": "string"})], "tools[0].function.parameters.type"),
    ([tool({"type": "object", "properties": {"a": {"type": 5}}})], "tools[0].function.parameters.properties.a.type"),
    ([tool({"type": "object", "properties": {"a": {"type": "strin"}}})],
     "tools[0].function.parameters.properties.a.type"),
    ([tool({"type": "object", "required": "a"})], "tools[0].function.parameters.required"),
    ([tool({"type": "object", "properties": []})], "tools[0].function.parameters.properties"),
    ([tool({"type": "object", "properties": {"a": {"pattern": "("}}})],
     "tools[0].function.parameters.properties.a.pattern"),
    ([tool({"type": "object", "$schema": "http://example.com/no-such-draft"})],
     'tools[0].function.parameters["$schema"]'),
    ([tool({"type": "object", "$schema": "http://["})], 'tools[0].function.parameters["$schema"]'),
    ([tool({"type": "object", "$schema": 7})], 'tools[0].function.parameters["$schema"]'),
    ([tool(name="x" * 10_000)], "tools[0].function.name"),  # was reported against messages
    ([tool(name="x" * 65)], "tools[0].function.name"),
    ([tool(name="get weather")], "tools[0].function.name"),
    ([tool(name="a.b")], "tools[0].function.name"),
    ([tool(name="")], "tools[0].function.name"),
    ([tool(), tool(name=5)], "tools[1].function.name"),
    ([tool(description=["d"])], "tools[0].function.description"),
    ([tool(strict="yes")], "tools[0].function.strict"),
    ([{"type": "retrieval", "function": {"name": "f"}}], "tools[0].type"),
    ([{"type": "function"}], "tools[0].function"),
    (["f"], "tools[0]"),
])
def test_a_bad_tool_is_refused_by_its_field(tools, param):
    message = refused({**CHAT, "tools": tools}, param)
    assert message.startswith(param)
    message.encode()


def test_the_tools_are_bounded_in_number_and_schema_size():
    assert (MAX_TOOLS, MAX_SCHEMA_NODES) == (128, 2048)
    refused({**CHAT, "tools": [tool(name=f"f{i}") for i in range(MAX_TOOLS + 1)]}, "tools")
    props = lambda n: {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}
    parse_chat({**CHAT, "tools": [tool(props(MAX_SCHEMA_NODES - 2))]}, max_n=4)  # 2 + n objects: just at the limit
    # together: the second tool's schema takes the count past the limit (and is not checked: cheap to refuse)
    message = refused({**CHAT, "tools": [tool(props(MAX_SCHEMA_NODES // 2)), tool(props(MAX_SCHEMA_NODES // 2), "g")]},
                      "tools[1].function.parameters")
    assert f"more than {MAX_SCHEMA_NODES} objects and arrays" in message


def test_good_tool_schemas_pass():
    from jaxagent.envs.gyms.common import TOOL_SCHEMA
    from jaxagent.envs.tau2 import DOMAINS, get_domain

    ok = [tool(), tool({}), tool({"type": "object"}, name="A-b_9" + "x" * 59),
          tool({"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}},
                "$defs": {"d": {"type": "integer"}}, "additionalProperties": False}, description="d", strict=True),
          tool({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                "definitions": {"d": {"type": "integer"}}, "properties": {"x": {"$ref": "#/definitions/d"}}}),
          {"function": {"name": "no_type_field", "parameters": {"type": "object"}}}, TOOL_SCHEMA]
    for name in DOMAINS:  # the repo's own tools, as its clients send them
        domain = get_domain(name)
        ok += list(domain.tool_schemas()) + list(domain.user_tool_schemas())
    req = parse_chat({**CHAT, "tools": ok}, max_n=4)
    assert len(req.tools) == len(ok) and req.parse_tools
    hits = _schema_problem.cache_info().hits
    assert parse_chat({**CHAT, "tools": ok}, max_n=4).tools == req.tools
    checked = sum(bool(t["function"].get("parameters")) for t in ok)  # no parameters, or {}: nothing to check
    assert _schema_problem.cache_info().hits - hits == checked  # the second time, every verdict comes from the cache


def calls(*ids, name="f"):
    return {"role": "assistant", "content": None, "tool_calls": [
        {**({"id": i} if i is not None else {}), "type": "function", "function": {"name": name, "arguments": "{}"}}
        for i in ids]}


def result(call_id=None, content="ok"):
    return {"role": "tool", "content": content, **({"tool_call_id": call_id} if call_id is not None else {})}


USER = {"role": "user", "content": "go"}


@pytest.mark.parametrize("messages, param", [
    ([result("c")], "messages[0].tool_call_id"),  # a tool message first
    ([USER, result("c")], "messages[1].tool_call_id"),  # after no call
    ([USER, calls("a"), result("b")], "messages[2].tool_call_id"),  # an id that answers no call
    ([USER, calls("a"), result("a"), result("a")], "messages[3].tool_call_id"),  # answered already
    ([USER, calls("a"), USER, result("a")], "messages[3].tool_call_id"),  # not in the run after the call
    ([USER, calls("a"), result("a"), {"role": "assistant", "content": "x"}, result("a")],
     "messages[4].tool_call_id"),
    ([USER, calls("a", "b"), result(), result(), result()], "messages[4].tool_call_id"),  # beyond the calls
    ([USER, calls(None), result("x")], "messages[2].tool_call_id"),  # the call has no id to answer
    ([USER, {**result("a"), "tool_call_id": 5}], "messages[1].tool_call_id"),
])
def test_a_tool_message_must_answer_a_call_before_it(messages, param):
    message = refused({**CHAT, "messages": messages}, param)
    assert "call" in message


def test_tool_messages_that_answer_their_calls_pass():
    for messages in (
            [USER, calls("a", "b"), result("b"), result("a"), {"role": "assistant", "content": "done"}],
            [USER, calls("a", "b"), result(), result()],  # without ids: in order (the template pairs them so)
            [USER, calls("a", "b"), result("b"), result()],  # the first call not answered: a
            [USER, calls(None, None), result(), result()],
            [USER, calls("a", "b"), result("a")],  # a call left unanswered is not refused
            [USER, calls("a"), result("a"), calls("a"), result("a")],  # ids may repeat across turns
            [USER, calls("a", "a"), result("a"), result("a")],
    ):
        parse_chat({**CHAT, "messages": messages}, max_n=4)


def test_the_endpoint_agents_history_passes():
    """The repo's own client (tau2's EndpointAgent) numbers its tool messages with the ids of the
    calls they answer, including the error results of calls it could not parse."""
    from jaxagent.envs.base import EnvMessage
    from jaxagent.envs.tau2.agents import EndpointAgent

    agent = EndpointAgent(client=None)
    agent.observe([EnvMessage("system", "policy"), EnvMessage("user", "hi")], {})
    agent.history.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": "x1", "type": "function", "function": {"name": "find", "arguments": '{"q": 1}'}},
        {"id": "x2", "type": "function", "function": {"name": "unknown", "arguments": "{}"}}]})
    agent.observe([EnvMessage("tool", "found", tool_call_id="call_0", name="find"),
                   EnvMessage("tool", "Error: the tool call could not be parsed (bad_arguments)")], {})
    req = parse_chat({**CHAT, "messages": agent.history}, max_n=4)
    assert [m.get("tool_call_id") for m in req.messages] == [None, None, None, "x1", "x2"]


@pytest.mark.parametrize("message, param", [
    ({"role": "tool", "content": "r", "tool_call_id": "a", "name": 3}, "messages[2].name"),
    ({"role": "assistant", "content": "x", "reasoning_content": 3}, "messages[2].reasoning_content"),
    ({"role": "assistant", "content": None, "tool_calls": ["f"]}, "messages[2].tool_calls[0]"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": 1, "function": {"name": "f", "arguments": "{}"}}]},
     "messages[2].tool_calls[0].id"),
    ({"role": "assistant", "content": None, "tool_calls": [{"type": "x", "function": {"name": "f", "arguments": "{}"}}]},
     "messages[2].tool_calls[0].type"),
    ({"role": "assistant", "content": None, "tool_calls": [{"name": "f", "arguments": "{}"}]},
     "messages[2].tool_calls[0].function"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]},
     "messages[2].tool_calls[0].function.name"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]},
     "messages[2].tool_calls[0].function.arguments"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
     "messages[2].tool_calls[0].function.arguments"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "[" * 100_000}}]},
     "messages[2].tool_calls[0].function.arguments"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]},
     "messages[2].tool_calls[0].function.arguments"),
])
def test_a_wrong_type_in_a_message_is_refused_by_its_field(message, param):
    prior = [USER, calls("a")] if message["role"] == "tool" else [USER, {"role": "assistant", "content": "x"}]
    refused({**CHAT, "messages": [*prior, message]}, param)


def test_call_arguments_reach_the_renderer_parsed():
    msgs = [USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": [1, "y"]}'}},
        {"id": "b", "function": {"name": "g", "arguments": {"z": None}}},
        {"id": "c", "function": {"name": "h", "arguments": "  "}}]}]  # blank: no arguments (some servers send "")
    got = parse_chat({**CHAT, "messages": msgs}, max_n=4).messages[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in got] == [{"x": [1, "y"]}, {"z": None}, {}]
    assert [c["id"] for c in got] == ["a", "b", "c"]


@pytest.mark.parametrize("key", ["tools", "messages", "add_generation_prompt", "raise_exception", "namespace",
                                 "a b", "1x", ""])
def test_template_kwargs_may_not_replace_what_the_server_sets(key):
    param = "chat_template_kwargs" + (f".{key}" if key.isidentifier() else f"[{json.dumps(key)}]")
    refused({**CHAT, "chat_template_kwargs": {key: "x"}}, param)


def test_template_kwargs_pass():
    req = parse_chat({**CHAT, "chat_template_kwargs": {"enable_thinking": False, "custom_var": [1]}}, max_n=4)
    assert req.template_kwargs == {"enable_thinking": False, "custom_var": [1]}


# ----------------------------------------------------------------------------- the streamed split
def test_visible_by_hand():
    text = "<think>\nplan\n</think>\n\nHello <tool_call>\n{}\n</tool_call>"
    assert visible(text, thinking=True, opened=False, tools=True, final=True) == \
        type(visible("", thinking=False, opened=False, tools=False))("plan", "Hello", True)
    # a tail that may become a marker is held back until the next token decides it
    assert visible("Hi <tool_", thinking=True, opened=False, tools=True).content == "Hi"
    assert visible("Hi <tool_", thinking=True, opened=False, tools=True, final=True).content == "Hi <tool_"
    assert visible("<thi", thinking=True, opened=False, tools=False) == visible("", thinking=True, opened=False,
                                                                                  tools=False)
    # the prompt opened the thinking block: everything before </think> is reasoning
    assert visible("plan\n</think>\n\nok", thinking=True, opened=True, tools=False).reasoning == "plan"
    assert visible("still planning", thinking=True, opened=True, tools=False).content == ""
    # without tools, a <tool_call> is content like any text
    assert visible("a <tool_call>x", thinking=False, opened=False, tools=False, final=True).content == "a <tool_call>x"


def test_held_tail_against_a_naive_scan():
    markers = ("<think>", "</think>", "<tool_call>", "STOP")
    for text in ["", "abc<", "abc</th", "x<tool_cal", "STO", "<think>", "a</think", "S"]:
        naive = max([k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])], default=0)
        assert _held_tail(text, markers) == naive


@given(st.text(alphabet="ab <>/\nthinkoolcaSTOP", max_size=40), st.lists(st.sampled_from(["ST", "ab", "<"]), max_size=2))
def test_cut_at_stop_is_the_earliest_occurrence(text, stop):
    cut, hit = cut_at_stop(text, tuple(stop))
    positions = [text.find(s) for s in stop if s in text]
    assert hit == bool(positions)
    assert cut == (text[:min(positions)] if positions else text)


PIECES = ["<think>", "\n", "plan", " it", "</think>", "\n\n", "Hello", " world", " ", "<tool_call>", '{"name": "f", '
          '"arguments": {}}', "</tool_call>", "STOP", "<", "tool", "_call>", "</", "think>", "x"]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14), st.booleans(), st.booleans(), st.booleans(),
       st.lists(st.integers(1, 6), min_size=1, max_size=14))
def test_streamed_deltas_add_up_to_the_final_split(pieces, opened, tools, with_stop, cuts):
    """Whatever the chunking, the concatenated deltas equal `visible` of the final text (cut at a
    stop string), and the final content/reasoning agree with `parse_assistant` up to whitespace
    (where it need not guess whether the prompt opened a thinking block)."""
    text = "".join(pieces)
    stop = ("STOP",) if with_stop else ()
    stream = TextStream(stop, thinking=True, opened=opened, tools=tools)
    got_r, got_c, pos = "", "", 0
    for k in cuts:
        pos = min(len(text), pos + k)
        r, c = stream.feed(text[:pos])
        got_r, got_c = got_r + r, got_c + c
        if stream.stopped:
            break
    if not stream.stopped:
        r, c = stream.feed(text, final=True)
        got_r, got_c = got_r + r, got_c + c
    final, _ = cut_at_stop(text, stop)
    assert stream.text == final
    want = visible(final, thinking=True, opened=opened, tools=tools, final=True)
    assert (got_r, got_c) == (want.reasoning, want.content)
    # parse_assistant, which does not see the prompt, also takes a bare "</think>" as the end of a
    # thinking block the prompt opened; the server knows whether it did (``opened``), so the two
    # are compared where that guess does not arise
    guessed = "</think>" in final and not final.lstrip().startswith("<think>")
    if tools and not opened and not guessed:
        parsed = parse_assistant(final)
        if parsed.ok and final.find("<tool_call>") == final.rfind("<tool_call>"):
            assert (parsed.thinking or "").strip() == want.reasoning.strip()
            assert parsed.content.startswith(want.content)


def test_a_half_decoded_character_is_held_back():
    stream = TextStream((), thinking=False, opened=False, tools=False)
    assert stream.feed("caf\ufffd") == ("", "caf")
    assert stream.feed("café") == ("", "é")


# ----------------------------------------------------------------------------- sessions
def test_the_session_index_reuses_the_longest_shared_prefix():
    forgotten = []
    idx = SessionIndex(2, forgotten.append)
    base = list(range(100))
    a = idx.acquire(base)
    idx.release(a, base + [7, 8])
    b = idx.acquire([5] * 40)  # shares nothing: a new session
    assert b != a
    idx.release(b, [5] * 40)
    assert idx.acquire(base[:60] + [1000]) == a and idx.reused == 1  # a's cache holds 60 of its tokens
    idx.release(a, base)
    c = idx.acquire(base[: MIN_REUSE - 1] + [999] * 50)  # under MIN_REUSE shared tokens: not worth a lane
    assert c not in (a, b)
    idx.release(c, [1, 2, 3])
    assert forgotten == [b]  # capacity 2: the oldest idle session is forgotten (and the engine told)
    short = idx.acquire([1, 2])  # a prompt shorter than MIN_REUSE reuses a session holding all of it
    assert short == c


@given(st.lists(st.integers(0, 3), max_size=30), st.lists(st.integers(0, 3), max_size=30))
def test_shared_prefix_against_a_loop(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert SessionIndex.shared(np.asarray(a, np.int64), np.asarray(b, np.int64)) == n


def test_the_listening_socket_is_tcp_without_nagle():
    """asyncio turns Nagle's algorithm off only on sockets whose proto is IPPROTO_TCP; a socket made
    with proto 0 made every streamed response wait for the client's delayed ACK (~40 ms)."""
    import socket

    from jaxagent.serve.server import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        client = socket.create_connection(sock.getsockname())  # listening already: the backlog takes it
        accepted, _ = sock.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        client.close()
        accepted.close()
    finally:
        sock.close()


def test_splitmix64_gives_the_published_sequence():
    # SplitMix64 from seed 1234567: the reference outputs of Vigna's splitmix64.c
    assert [splitmix64(1234567, i) for i in range(1, 6)] == [
        6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821]


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2 ** 70), 2 ** 70), st.integers(1, 8))
def test_request_keys_are_the_sequence_split_into_words(seed, n):
    data = request_key_data(seed, n)
    assert data.shape == (n, 2) and data.dtype == np.uint32
    for j in range(n):
        z = splitmix64(seed % 2 ** 64, j + 1)
        assert (int(data[j, 0]) << 32) | int(data[j, 1]) == z
    assert len({tuple(r) for r in data.tolist()}) == n  # the choices of one request differ
    assert (request_key_data(seed, n) == data).all()  # the same seed, the same keys


def test_request_keys_differ_across_seeds():
    rows = {tuple(request_key_data(s, 1)[0]) for s in range(10_000)}
    assert len(rows) == 10_000

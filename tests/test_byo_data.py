"""Bring your own data (docs/DATA.md): the SFT ``messages`` / prompt-completion rows and the DPO
prompt / chosen / rejected rows of transformers / TRL, beside job=qd_label's rows. Every bad field
is refused with its file, line, field and expectation (a catalogue and a property over files); the
loss mask covers exactly the assistant turns (the masked tokens decoded); tool calls in OpenAI form
round-trip through the project's tool-call format; the example files under tests/fixtures/data
validate against DATA.md's JSON Schema; and job=sft / job=dpo run on them end to end."""

import asyncio
import copy
import json
import re
import string
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxagent.envs.base import Demo
from jaxagent.jobs.datasets import pair_tokens, read_pair_data, read_sft_data, sft_tokens
from jaxagent.launch import main
from jaxagent.qd import labels
from jaxagent.qd.agents import completion_ids, decision_prompt_ids
from jaxagent.rollout.demos import render_demo
from jaxagent.text.chat import ChatRenderer
from jaxagent.text.datasets import (ChatExample, ChatPair, DataError, FieldError, TextExample, TextPair, parse_pair_row,
                                    parse_sft_row)
from jaxagent.text.tokenizer import load_tokenizer
from jaxagent.text.toolcalls import ToolCall, format_tool_call, parse_assistant, tool_call_from_dict
from jaxagent.train.rows import RowTokens, row_batch
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
DATA = FIXTURES / "data"
DOC = ROOT / "docs" / "DATA.md"
TOK = load_tokenizer(FIXTURES / "tokenizer_qwen")
END = "<|im_end|>"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def call(name="get_weather", args='{"city": "Oslo"}', cid="call_1"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def chat_row():
    """A valid messages row: system, user, a tool call, its result, the answer."""
    return {"messages": [{"role": "system", "content": "You check the weather."},
                         {"role": "user", "content": "Weather in Oslo?"},
                         {"role": "assistant", "content": None, "tool_calls": [call()]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "5 C"},
                         {"role": "assistant", "content": "It is 5 C."}],
            "tools": [WEATHER]}


def conv_pair():
    return {"prompt": [{"role": "user", "content": "Weather in Oslo?"}],
            "chosen": [{"role": "assistant", "content": "", "tool_calls": [call()]}],
            "rejected": [{"role": "assistant", "content": "Sunny, surely."}], "tools": [WEATHER]}


GOOD_SFT = [chat_row(), {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            {"prompt": "2 + 2?", "completion": "4"},
            {"prompt": [{"role": "user", "content": "2 + 2?"}], "completion": [{"role": "assistant", "content": "4"}]},
            json.loads((DATA / "qd_sft_rows.jsonl").read_text().splitlines()[0])]
GOOD_PAIRS = [{"prompt": "2 + 2?", "chosen": "4", "rejected": "5"}, conv_pair(),
              json.loads((DATA / "qd_pairs.jsonl").read_text().splitlines()[0])]


def edit(row, path, value):
    """``row`` with the field at ``path`` (keys / indices) set to ``value`` (deleted for `DEL`)."""
    row = copy.deepcopy(row)
    obj = row
    for k in path[:-1]:
        obj = obj[k]
    if value is DEL:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return row


DEL = object()
M = "messages"
# (job, bad row, the field named, a piece of the expectation)
BAD = [
    ("sft", ["not", "an object"], "row", "a JSON object"),
    ("sft", {"id": 3, "text": "hi"}, "row", "'messages', or 'prompt' and 'completion'"),
    ("sft", edit(chat_row(), [M], "hi"), "messages", "a non-empty list of messages"),
    ("sft", edit(chat_row(), [M], []), "messages", "a non-empty list of messages"),
    ("sft", edit(chat_row(), [M, 1], "hi"), "messages[1]", "a message"),
    ("sft", edit(chat_row(), [M, 1, "role"], "bot"), "messages[1].role", "one of system, user, assistant, tool"),
    ("sft", edit(chat_row(), [M, 1, "role"], DEL), "messages[1].role", "one of system, user, assistant, tool"),
    ("sft", edit(chat_row(), [M, 1, "content"], DEL), "messages[1].content", "a string"),
    ("sft", edit(chat_row(), [M, 1, "content"], [{"type": "text", "text": "x"}]), "messages[1].content", "a string"),
    ("sft", edit(chat_row(), [M, 4, "content"], "  "), "messages[4].content", "a non-blank string, or tool_calls"),
    ("sft", edit(chat_row(), [M, 1, "contents"], "x"), "messages[1].contents", "absent or null"),
    ("sft", edit(chat_row(), [M, 1, "tool_calls"], [call()]), "messages[1].tool_calls", "absent or null"),
    ("sft", edit(chat_row(), [M, 2, "tool_calls"], call()), "messages[2].tool_calls", "a list of tool calls"),
    ("sft", edit(chat_row(), [M, 2, "tool_calls", 0, "function"], DEL), "messages[2].tool_calls[0].function",
     "an object"),
    ("sft", edit(chat_row(), [M, 2, "tool_calls", 0, "type"], "code"), "messages[2].tool_calls[0].type", "'function'"),
    ("sft", edit(chat_row(), [M, 2, "tool_calls", 0, "id"], 7), "messages[2].tool_calls[0].id", "a non-empty string"),
    ("sft", edit(chat_row(), [M, 2, "tool_calls", 0, "function", "name"], ""),
     "messages[2].tool_calls[0].function.name", "a non-empty string"),
    ("sft", edit(chat_row(), [M, 2, "tool_calls", 0, "function", "name"], "get_time"),
     "messages[2].tool_calls[0].function.name", "one of the row's tools (get_weather)"),
    ("sft", edit(chat_row(), [M, 2, "tool_calls", 0, "function", "arguments"], '{"city": '),
     "messages[2].tool_calls[0].function.arguments", "invalid JSON"),
    ("sft", edit(chat_row(), [M, 2, "tool_calls", 0, "function", "arguments"], "[1, 2]"),
     "messages[2].tool_calls[0].function.arguments", "a JSON object, or a string holding one"),
    ("sft", edit(chat_row(), [M, 2, "tool_calls", 0, "function", "arguments"], DEL),
     "messages[2].tool_calls[0].function.arguments", "a JSON object"),
    ("sft", edit(chat_row(), [M, 2, "tool_calls", 0, "function", "description"], "x"),
     "messages[2].tool_calls[0].function.description", "absent or null"),
    ("sft", edit(chat_row(), [M, 3, "tool_call_id"], "call_9"), "messages[3].tool_call_id", "(call_1)"),
    ("sft", edit(chat_row(), [M, 2], {"role": "assistant", "content": "Let me look."}), "messages[3].role",
     "'tool' only after an assistant message with tool_calls"),
    ("sft", edit(chat_row(), [M, 4], {"role": "tool", "content": "again"}), "messages[4].role",
     "at most 1 tool result(s)"),
    ("sft", edit(chat_row(), [M, 1, "role"], "system"), "messages[1].role",
     "'system' only as the conversation's first"),
    ("sft", edit(chat_row(), [M, 1, "name"], ""), "messages[1].name", "a non-empty string"),
    ("sft", {M: [{"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "hi"},
                 {"role": "assistant", "content": "How can I help?"}]},
     "messages[0].role", "a system or user message first"),
    ("sft", edit(chat_row(), [M, 4, "reasoning_content"], 3), "messages[4].reasoning_content", "a string"),
    ("sft", {M: [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}, "messages",
     "at least one assistant message"),
    ("sft", edit(chat_row(), ["tools"], WEATHER), "tools", "a list of OpenAI function schemas"),
    ("sft", edit(chat_row(), ["tools", 0, "function", "name"], DEL), "tools[0].function.name", "a non-empty string"),
    ("sft", edit(chat_row(), ["tools", 0, "type"], "retrieval"), "tools[0].type", "'function'"),
    ("sft", edit(chat_row(), ["tools"], [WEATHER, WEATHER]), "tools[1].function.name", "a name no other tool"),
    ("sft", edit(chat_row(), ["tools", 0, "function", "parameters"], "city"), "tools[0].function.parameters",
     "a JSON schema object"),
    ("sft", {"prompt": "2 + 2?"}, "completion", "a string, as prompt is"),
    ("sft", {"prompt": "2 + 2?", "completion": " "}, "completion", "a non-blank string"),
    ("sft", {"prompt": 4, "completion": "4"}, "prompt", "a string (the standard form) or a non-empty list"),
    ("sft", {"prompt": "2 + 2?", "completion": "4", "tools": [WEATHER]}, "tools", "absent or null in the standard"),
    ("sft", {"prompt": [{"role": "user", "content": "2 + 2?"}], "completion": "4"}, "completion",
     "a non-empty list of messages"),
    ("sft", {"prompt": [{"role": "user", "content": "2 + 2?"}], "completion": [{"role": "user", "content": "4"}]},
     "completion[0].role", "'assistant' (completion holds the assistant's message(s))"),
    ("sft", edit(GOOD_SFT[4], ["kind"], "MAYBE"), "kind", "'ASK' or 'STOP'"),
    ("sft", edit(GOOD_SFT[4], ["weight"], -1), "weight", "a finite number > 0"),
    ("sft", edit(GOOD_SFT[4], ["prompt"], DEL), "prompt", "a required field of SFTRow"),
    ("dpo", {"chosen": "4", "rejected": "5"}, "prompt", "the implicit-prompt form"),
    ("dpo", {"id": 1}, "row", "'prompt', 'chosen' and 'rejected'"),
    ("dpo", {"prompt": "2 + 2?", "rejected": "5"}, "chosen", "a string, as prompt is"),
    ("dpo", {"prompt": "2 + 2?", "chosen": "4", "rejected": "4"}, "rejected", "a completion other than the chosen"),
    ("dpo", {"prompt": "2 + 2?", "chosen": "", "rejected": "5"}, "chosen", "a non-blank string"),
    ("dpo", {"prompt": "2 + 2?", "chosen": [{"role": "assistant", "content": "4"}], "rejected": "5"}, "chosen",
     "a string, as prompt is"),
    ("dpo", {"prompt": [], "chosen": "4", "rejected": "5"}, "prompt", "a non-empty list of messages"),
    ("dpo", edit(conv_pair(), ["chosen", 0], {"role": "user", "content": "x"}), "chosen[0].role",
     "'assistant' (chosen holds"),
    ("dpo", edit(conv_pair(), ["chosen", 0, "role"], "user"), "chosen[0].tool_calls", "absent or null"),
    ("dpo", edit(conv_pair(), ["rejected"], []), "rejected", "a non-empty list of messages"),
    ("dpo", edit(conv_pair(), ["rejected"], conv_pair()["chosen"]), "rejected", "a completion other than the chosen"),
    ("dpo", edit(conv_pair(), ["prompt", 0, "role"], "human"), "prompt[0].role", "one of system, user"),
    ("dpo", edit(conv_pair(), ["chosen", 0, "tool_calls", 0, "function", "name"], "get_time"),
     "chosen[0].tool_calls[0].function.name", "one of the row's tools"),
    ("dpo", edit(conv_pair(), ["tools"], "get_weather"), "tools", "a list of OpenAI function schemas"),
    ("dpo", edit(GOOD_PAIRS[2], ["margin"], -0.5), "margin", "a finite number >= 0"),
    ("dpo", edit(GOOD_PAIRS[2], ["colour"], "red"), "colour", "no such field in Pair"),
]
READ = {"sft": read_sft_data, "dpo": read_pair_data}
GOOD = {"sft": GOOD_SFT, "dpo": GOOD_PAIRS}


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def dumps(row):
    return json.dumps(row, ensure_ascii=False)


# ----------------------------------------------------------------------------- parsing
def test_the_good_rows_parse_to_their_formats(tmp_path):
    rows = read_sft_data(write_lines(tmp_path / "s.jsonl", [dumps(r) for r in GOOD_SFT]))
    assert [type(r.record) for r in rows] == [ChatExample, ChatExample, TextExample, ChatExample, labels.SFTRow]
    assert [r.line for r in rows] == [1, 2, 3, 4, 5] and {r.path for r in rows} == {str(tmp_path / "s.jsonl")}
    assert rows[0].record.train == (False, False, True, False, True)
    assert rows[3].record.train == (False, True) and rows[3].record.kind == "prompt_completion_chat"
    pairs = read_pair_data(write_lines(tmp_path / "p.jsonl", [dumps(r) for r in GOOD_PAIRS]))
    assert [type(p.record) for p in pairs] == [TextPair, ChatPair, labels.Pair]
    assert [p.record.kind for p in pairs[:2]] == ["standard", "conversational"]


@pytest.mark.parametrize("job,row,field,expected", BAD, ids=[f"{b[0]}:{b[2]}:{i}" for i, b in enumerate(BAD)])
def test_every_bad_field_is_refused_with_its_line(tmp_path, job, row, field, expected):
    path = write_lines(tmp_path / "data.jsonl", [dumps(GOOD[job][0]), "", dumps(GOOD[job][1]), dumps(row)])
    with pytest.raises(DataError) as info:
        READ[job](path)
    e = info.value
    assert (e.path, e.line, e.field) == (str(path), 4, field)
    assert str(e).startswith(f"{path}:4: {field}") and expected in e.expected, str(e)
    assert ": expected " in str(e)


def test_the_documented_error_reads_as_documented(tmp_path):
    rows = [dumps(GOOD_SFT[1])] * 16 + [dumps(edit(GOOD_SFT[1], [M, 1, "role"], "bot"))]
    path = write_lines(tmp_path / "data.jsonl", rows)
    with pytest.raises(DataError) as info:
        read_sft_data(path)
    assert str(info.value) == f"{path}:17: messages[1].role='bot': expected one of system, user, assistant, tool"
    doc = DOC.read_text()
    assert "data.jsonl:17: messages[2].role='bot': expected one of system, user, assistant, tool" in doc
    pair = edit(conv_pair(), ["chosen", 0], {"role": "user", "content": "x"})
    path = write_lines(tmp_path / "p.jsonl", [dumps(GOOD_PAIRS[0])] * 3 + [dumps(pair)])
    with pytest.raises(DataError) as info:
        read_pair_data(path)
    assert f"p.jsonl:4: {str(info.value).split(': ', 1)[1]}" in doc


def test_lines_that_are_not_json_objects_are_refused(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [dumps(GOOD_SFT[1]), '{"messages": [}'])
    with pytest.raises(DataError, match=r"d.jsonl:2: row=.*expected one JSON object a line \(invalid JSON"):
        read_sft_data(path)
    (tmp_path / "b.jsonl").write_bytes(dumps(GOOD_SFT[1]).encode() + b"\n" + b'{"prompt": "\xff"}\n')
    with pytest.raises(DataError, match=r"b.jsonl:2: row=.*expected UTF-8 text"):
        read_sft_data(tmp_path / "b.jsonl")
    # a BOM, blank lines and a last line without a newline are fine
    (tmp_path / "ok.jsonl").write_text("\ufeff" + dumps(GOOD_SFT[1]) + "\n\n  \n" + dumps(GOOD_SFT[2]), "utf-8")
    assert [r.line for r in read_sft_data(tmp_path / "ok.jsonl")] == [1, 4]


def test_nulls_and_extra_columns_are_accepted_as_a_datasets_export_writes_them():
    row = {"id": "r1", "source": "ultrachat", "score": 7, "tools": None,
           M: [{"role": "user", "content": "hi", "tool_calls": None, "tool_call_id": None, "weird": None},
               {"role": "assistant", "content": "hello", "tool_calls": [], "name": None}]}
    ex = parse_sft_row(row)
    assert ex.messages == ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"})
    assert ex.tools == ()


BAD_BY_JOB = {job: [(row, field) for j, row, field, _ in BAD if j == job] for job in READ}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), job=st.sampled_from(sorted(READ)))
def test_a_bad_row_anywhere_in_a_file_is_refused_at_its_line(tmp_path, data, job):
    good = data.draw(st.lists(st.sampled_from(GOOD[job]), min_size=0, max_size=6), label="good rows")
    bad, field = data.draw(st.sampled_from(BAD_BY_JOB[job]), label="bad row")
    at = data.draw(st.integers(0, len(good)), label="its position")
    blanks = data.draw(st.lists(st.booleans(), min_size=len(good) + 1, max_size=len(good) + 1), label="blank lines")
    rows = good[:at] + [bad] + good[at:]
    lines, bad_line = [], None
    for i, row in enumerate(rows):
        if blanks[min(i, len(blanks) - 1)]:
            lines.append("   ")
        lines.append(dumps(row))
        if i == at:
            bad_line = len(lines)
    path = write_lines(tmp_path / f"{job}.jsonl", lines)
    with pytest.raises(DataError) as info:
        READ[job](path)
    assert (info.value.line, info.value.field) == (bad_line, field)
    # and without the bad row the file reads, every row at its line
    lines.pop(bad_line - 1)
    read = READ[job](write_lines(path, lines))
    assert [r.line for r in read] == [i + 1 for i, line in enumerate(lines) if line.strip()]


# ----------------------------------------------------------------------------- rendering
def runs(mask):
    """(start, end) of each run of True in ``mask``."""
    m = np.concatenate([[0], np.asarray(mask, np.int8), [0]])
    d = np.diff(m)
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist()))


def turn_text(message) -> str:
    """What the policy generates for an assistant turn: its content, its calls in the project's
    format, the end-of-turn token."""
    calls = [tool_call_from_dict(c) for c in message.get("tool_calls") or []]
    parts = ([message["content"]] if message.get("content") else []) + [format_tool_call(c) for c in calls]
    return "\n".join(parts) + END


def check_assistant_mask(row_tokens: RowTokens, example: ChatExample):
    tokens = [*row_tokens.prompt, *row_tokens.completion]
    mask = [False] * len(row_tokens.prompt) + list(row_tokens.mask)
    trained = [m for m, t in zip(example.messages, example.train) if t]
    spans = runs(mask)
    assert [TOK.decode(tokens[a:b]) for a, b in spans] == [turn_text(m) for m in trained]
    # the decoded trained tokens are the assistant turns; everything else is the rest of the render
    ids, full_mask = render_demo(Demo("x", example.messages, example.train, 0.0, example.tools), TOK)
    assert ids[:len(tokens)] == tokens and full_mask[:len(mask)] == mask and not any(full_mask[len(mask):])
    unmasked = TOK.decode([t for t, m in zip(tokens, mask) if not m])
    assert all(m["content"] in unmasked for m in example.messages if m["role"] != "assistant")
    # tool calls round-trip: the trained text of each turn parses back into the row's calls
    for (a, b), m in zip(spans, trained):
        text = TOK.decode(tokens[a:b - 1])
        parsed = parse_assistant(text)
        assert parsed.ok and parsed.content == (m["content"] or "").strip()
        want = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", [])]
        assert list(parsed.tool_calls) == want


def test_the_loss_mask_covers_exactly_the_assistant_turns_of_the_example_files():
    n = 0
    for path in ("sft_messages.jsonl", "sft_prompt_completion.jsonl"):
        raw = [json.loads(x) for x in (DATA / path).read_text().splitlines()]
        for located, row in zip(read_sft_data(DATA / path), raw):
            rt = sft_tokens(located, TOK)
            if isinstance(located.record, ChatExample):
                check_assistant_mask(rt, located.record)
                n += 1
            else:  # a standard row: rendered as the Q&D rows are
                assert rt == RowTokens(decision_prompt_ids(TOK, row["prompt"]), completion_ids(TOK, row["completion"]))
    assert n == 5
    # the OpenAI string arguments of the fixture's calls came back as objects
    tool_row = read_sft_data(DATA / "sft_messages.jsonl")[2].record
    assert tool_row.messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Lisbon", "unit": "C"}


def test_row_batch_takes_a_rows_mask():
    b = row_batch([RowTokens([1, 2], [3, 4, 5, 6], 1.0, (True, False, False, True)), RowTokens([7], [8])], [0, 1],
                  multiple=8)
    assert b["loss_mask"][0].tolist() == [False, False, True, False, False, True, False, False]
    assert b["loss_mask"][1].tolist() == [False, True] + [False] * 6
    with pytest.raises(ValueError, match="RowTokens.mask: 1 flags for 2 completion tokens"):
        row_batch([RowTokens([1], [2, 3], 1.0, (True,))], [0])


WORD = st.text(alphabet=string.ascii_letters + string.digits + " .,?!'", min_size=1, max_size=16).filter(
    lambda s: s.strip())
ARGS = st.dictionaries(st.sampled_from(["city", "unit", "n", "ok"]),
                       st.one_of(WORD, st.integers(-9, 99), st.booleans(), st.lists(st.integers(0, 9), max_size=2)),
                       max_size=3)


@st.composite
def conversations(draw):
    """A valid messages row: an optional system turn, then user turns each answered by an
    assistant, some through tool calls (OpenAI form, string or object arguments) and their results."""
    tools = draw(st.booleans())
    msgs = [{"role": "system", "content": draw(WORD)}] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 3))):
        msgs.append({"role": "user", "content": draw(WORD)})
        for _ in range(draw(st.integers(0, 2))):
            calls = [{"id": f"c{len(msgs)}_{j}", "type": "function",
                      "function": {"name": draw(st.sampled_from(["get_weather", "get_time"])),
                                   "arguments": (json.dumps(a) if draw(st.booleans()) else a)}}
                     for j, a in enumerate(draw(st.lists(ARGS, min_size=1, max_size=2)))]
            msgs.append({"role": "assistant", "content": draw(st.one_of(st.none(), WORD)), "tool_calls": calls})
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": draw(WORD)} for c in calls]
        msgs.append({"role": "assistant", "content": draw(WORD)})
    return {M: msgs, "tools": [WEATHER, TIME] if tools else None}


@settings(max_examples=25, deadline=None)
@given(row=conversations())
def test_any_conversation_trains_exactly_its_assistant_turns_and_its_calls_round_trip(row):
    ex = parse_sft_row(row)
    rt = sft_tokens(ex, TOK)
    check_assistant_mask(rt, ex)
    # arguments given as a JSON string or as an object render the same
    objects = copy.deepcopy(row)
    for m in objects[M]:
        for c in m.get("tool_calls") or []:
            if isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    assert sft_tokens(parse_sft_row(objects), TOK) == rt


def test_pairs_tokenise_as_the_policy_conditions_and_generates():
    standard, conv = parse_pair_row({"prompt": "2 + 2?", "chosen": "4", "rejected": "5"}), parse_pair_row(conv_pair())
    p = pair_tokens(standard, TOK)
    assert (p.prompt, p.chosen, p.rejected) == (decision_prompt_ids(TOK, "2 + 2?"), completion_ids(TOK, "4"),
                                                completion_ids(TOK, "5"))
    # with a Qwen2.5-style template, the conversational twin of a standard pair is the same tokens
    twin = parse_pair_row({"prompt": [{"role": "user", "content": "2 + 2?"}],
                           "chosen": [{"role": "assistant", "content": "4"}],
                           "rejected": [{"role": "assistant", "content": "5"}]})
    assert pair_tokens(twin, TOK) == p
    c = pair_tokens(conv, TOK)
    chat = ChatRenderer(TOK, tools=[WEATHER])
    chat.add(*conv.prompt)
    assert c.prompt == chat.start_generation()
    assert TOK.decode(c.chosen) == turn_text(conv_pair()["chosen"][0]) and c.chosen[-1] in chat.stop_token_ids
    assert TOK.decode(c.rejected) == "Sunny, surely." + END
    assert parse_assistant(TOK.decode(c.chosen[:-1])).tool_calls == (ToolCall("get_weather", {"city": "Oslo"}),)
    # a completion of two assistant messages scores the template's tokens between them too
    two = edit(conv_pair(), ["rejected"], [{"role": "assistant", "content": "Hm."},
                                           {"role": "assistant", "content": "Sunny."}])
    r = pair_tokens(parse_pair_row(two), TOK)
    assert r.prompt == c.prompt and TOK.decode(r.rejected) == f"Hm.{END}\n<|im_start|>assistant\nSunny.{END}"


def test_qd_rows_read_and_tokenise_as_before():
    rows = read_sft_data(DATA / "qd_sft_rows.jsonl")
    assert [r.record for r in rows] == labels.read_sft_rows(DATA / "qd_sft_rows.jsonl")
    for r in rows:
        want = RowTokens(decision_prompt_ids(TOK, r.record.prompt), completion_ids(TOK, r.record.completion),
                         r.record.weight)
        assert sft_tokens(r, TOK) == want
    pairs = read_pair_data(DATA / "qd_pairs.jsonl")
    assert [p.record for p in pairs] == labels.read_pairs(DATA / "qd_pairs.jsonl")
    p = pairs[0].record
    assert pair_tokens(pairs[0], TOK) == (decision_prompt_ids(TOK, p.prompt), completion_ids(TOK, p.chosen),
                                          completion_ids(TOK, p.rejected), 1.0)


def test_a_template_that_cannot_render_a_row_is_named_with_its_line(tmp_path):
    tok = copy.copy(TOK)  # the fixture tokenizer with a template that never reads `tools`
    tok.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    rows = read_sft_data(write_lines(tmp_path / "t.jsonl", [dumps(GOOD_SFT[1]), dumps(chat_row())]))
    with pytest.raises(DataError, match=r"t.jsonl:2: messages=.*expected a conversation the chat template renders "
                                        r"\(tools: 1 tool schema"):
        sft_tokens(rows[1], tok)


# ----------------------------------------------------------------------------- the example files and DATA.md
def _schema():
    block = DOC.read_text().split("## JSON Schema", 1)[1].split("```json\n", 1)[1].split("\n```", 1)[0]
    return json.loads(block)


SCHEMA_OF = {"sft_messages.jsonl": "sft_row", "sft_prompt_completion.jsonl": "sft_row", "qd_sft_rows.jsonl": "sft_row",
             "dpo_pairs.jsonl": "pair_row", "qd_pairs.jsonl": "pair_row", "user_tasks.json": "user_tasks"}


def test_data_md_names_every_example_file_and_they_read():
    doc = DOC.read_text()
    named = set(re.findall(r"tests/fixtures/data/([\w.]+)", doc))
    assert named == set(SCHEMA_OF) == {p.name for p in DATA.iterdir()}
    assert [type(r.record) for r in read_sft_data(DATA / "sft_messages.jsonl")] == [ChatExample] * 4
    assert [r.record.kind for r in read_sft_data(DATA / "sft_prompt_completion.jsonl")] == [
        "prompt_completion", "prompt_completion_chat"]
    assert [p.record.kind for p in read_pair_data(DATA / "dpo_pairs.jsonl")] == [
        "standard", "standard", "conversational", "conversational"]


def test_the_example_files_validate_against_the_documented_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = _schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for name, ref in SCHEMA_OF.items():
        v = jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{ref}"})
        text = (DATA / name).read_text()
        docs = [json.loads(text)] if name.endswith(".json") else [json.loads(x) for x in text.splitlines()]
        for i, d in enumerate(docs):
            errors = [e.message for e in v.iter_errors(d)]
            assert not errors, (name, i + 1, errors)
    # and it refuses what the readers refuse of a single field (the rules between fields are the readers')
    rows = jsonschema.Draft202012Validator({**schema, "$ref": "#/$defs/sft_row"})
    pairs = jsonschema.Draft202012Validator({**schema, "$ref": "#/$defs/pair_row"})
    between = ("only", "at most", "one of the row's tools", "(call_1)", "other than the chosen", "no other tool",
               "invalid JSON", "a JSON object, or a string holding one", "a non-empty string or", "'ASK' or")
    checked = 0
    for job, row, field, expected in BAD:
        if not any(b in expected for b in between):
            assert not (rows if job == "sft" else pairs).is_valid(row), (job, field, expected)
            checked += 1
    assert checked > 40


def test_the_user_task_file_is_what_the_llm_user_environment_reads():
    from jaxagent.envs.user_env import LLMUserEnv
    from jaxagent.envs.user_prompt import DEFAULT_SYSTEM_PROMPT, render_system_prompt

    tasks = json.loads((DATA / "user_tasks.json").read_text())
    env = LLMUserEnv(client=None, tasks=tasks)
    for task_id, task in tasks.items():
        reset = asyncio.run(env.reset(task_id, 0))
        assert [m.role for m in reset.messages] == ["system", "user"] and reset.messages[1].content == task["opening"]
        assert task["profile"]["instructions"] in render_system_prompt(DEFAULT_SYSTEM_PROMPT, task["profile"])


def test_field_error_without_a_location_names_field_value_and_expectation():
    with pytest.raises(FieldError, match=r"^messages\[0\]\.role='bot': expected one of system, user, assistant, tool$"):
        parse_sft_row({M: [{"role": "bot", "content": "x"}]})
    with pytest.raises(FieldError, match=r"^chosen missing: expected a string, as prompt is"):
        parse_pair_row({"prompt": "p", "rejected": "r"})


# ----------------------------------------------------------------------------- the jobs, end to end
COMMON = ["progress=false", f"tokenizer={FIXTURES / 'tokenizer_qwen'}", "model.preset=tiny-qwen2",
          "checkpoint.export_hf=false"]


def test_job_sft_on_chat_messages_end_to_end(tmp_path):
    args = ["job=sft", *COMMON, f"runs_dir={tmp_path}", "name=sft", f"sft.data={DATA / 'sft_messages.jsonl'}",
            "sft.batch_size=2", "sft.steps=3", "sft.warmup_steps=0"]
    assert main(args) == 0
    s = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert s["rows"] == s["rows_trained"] == 4 and s["rows_by_kind"] == {"messages": 4} and s["steps"] == 3
    assert np.isfinite(s["final"]["loss"])
    bad = write_lines(tmp_path / "bad.jsonl", [dumps(GOOD_SFT[1]), dumps(edit(GOOD_SFT[1], [M, 0, "role"], "bot"))])
    with pytest.raises(SystemExit, match=r"sft.data=.*bad.jsonl:2: messages\[0\].role='bot': expected one of"):
        main([*args[:-5], "name=bad", f"sft.data={bad}"])


def test_job_dpo_on_trl_pairs_end_to_end(tmp_path):
    args = ["job=dpo", *COMMON, f"runs_dir={tmp_path}", "name=dpo", f"dpo.data={DATA / 'dpo_pairs.jsonl'}",
            "dpo.batch_size=2", "dpo.epochs=1", "dpo.warmup_ratio=0"]
    assert main(args) == 0
    s = json.loads((tmp_path / "dpo" / "summary.json").read_text())
    assert s["pairs_in_file"] == s["pairs_trained"] == 4 and s["steps"] == 2
    assert s["pairs_by_kind"] == {"standard": 2, "conversational": 2}
    assert np.isfinite(s["final"]["loss"])

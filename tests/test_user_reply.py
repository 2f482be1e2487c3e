"""The simulated user's reply parser: never raises on any text, and reads back well-formed JSON
wherever it sits (property tests); a few malformed replies by hand."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.envs.user_reply import ParsedReply, parse_reply


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parser_never_raises(text):
    parsed = parse_reply(text)
    assert isinstance(parsed.utterance, str)
    assert parsed.strategy is None or isinstance(parsed.strategy, str)
    assert parsed.parse_error is None or isinstance(parsed.parse_error, str)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(), max_size=200).filter(lambda s: s.count("{") < 20))
def test_parser_never_raises_on_json_like_text(suffix):
    for prefix in ('{"utterance": "', "{'utterance': '", "```json\n{", "{{[", '{"a": {"b": '):
        assert isinstance(parse_reply(prefix + suffix).utterance, str)


prose = st.text(alphabet="abcdefghij .,!?\n", max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(), prose, prose, st.booleans(), st.booleans(), st.booleans())
def test_parser_round_trips_well_formed_json(utterance, strategy, before, after, fence, ascii_only, indent):
    obj = json.dumps({"utterance": utterance, "strategy": strategy}, ensure_ascii=ascii_only,
                     indent=2 if indent else None)
    text = f"{before}```json\n{obj}\n```{after}" if fence else f"{before}{obj}{after}"
    assert parse_reply(text) == (parse_reply(text).__class__)(utterance, strategy, None)


def test_malformed_replies_by_hand():
    # JSON anywhere in the text; single quotes and trailing commas read leniently; no object: the
    # text itself, without a strategy, with the reason
    assert parse_reply('Sure. {"utterance": "ok", "strategy": "confirm"}') == ParsedReply("ok", "confirm", None)
    assert parse_reply("{'utterance': 'fine', 'strategy': 'accept',}") == ParsedReply("fine", "accept", None)
    plain = parse_reply("just words")
    assert (plain.utterance, plain.strategy) == ("just words", None) and plain.parse_error

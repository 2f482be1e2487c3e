"""The simulator protocol's message types."""

import pytest

from jaxagent.envs import EnvMessage


def test_env_message_to_chat_hides_the_reaction():
    m = EnvMessage("user", "at noon", reaction="provide_info")
    assert m.to_chat() == {"role": "user", "content": "at noon"}
    t = EnvMessage("tool", "{}", tool_call_id="c1", name="lookup")
    assert t.to_chat() == {"role": "tool", "content": "{}", "name": "lookup", "tool_call_id": "c1"}


def test_env_message_errors_name_the_field():
    with pytest.raises(ValueError, match="EnvMessage.role='assistant'"):
        EnvMessage("assistant", "hi")
    with pytest.raises(ValueError, match="EnvMessage.reaction='confirm' on a 'tool' message"):
        EnvMessage("tool", "x", reaction="confirm")

"""The simulated user's view: its system prompt from a profile, and the conversation with the
roles flipped."""

import pytest

from jaxagent.envs.user_prompt import ProfileError, flip_roles, render_system_prompt


def test_flip_roles_agent_first_and_errors():
    conv = [{"role": "assistant", "content": "Hello, how can I help?"}]
    assert flip_roles(conv) == [{"role": "user", "content": "Hello, how can I help?"}]
    assert flip_roles([]) == [{"role": "user", "content": "Hi! How can I help you today?"}]
    with pytest.raises(ValueError, match="spoke last"):
        flip_roles([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match=r"conversation\[0\]\.role: got 'bot'"):
        flip_roles([{"role": "bot", "content": "x"}])
    with pytest.raises(ValueError, match=r"conversation\[0\]"):
        flip_roles(["hello"])


def test_system_prompt_profile_fields():
    tmpl = "You are {name}, age {age}. Goal: {goal}. Stop with {stop_marker}. Data: {{literal}}"
    out = render_system_prompt(tmpl, {"name": "Ann", "age": 31, "goal": {"item": "shoes"}}, ("<END>",))
    assert out.startswith("You are Ann, age 31. Goal: {") and '"item": "shoes"' in out
    assert "Stop with <END>" in out and "{literal}" in out
    with pytest.raises(ProfileError, match=r"needs field 'goal'.*profile keys: \['age', 'name'\]"):
        render_system_prompt(tmpl, {"name": "Ann", "age": 31})
    with pytest.raises(ProfileError, match="expected a dict"):
        render_system_prompt(tmpl, ["not", "a", "dict"])

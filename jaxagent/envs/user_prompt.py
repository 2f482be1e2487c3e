"""What the simulated user is shown: its system prompt from the task's profile, and the
conversation with the roles flipped (pure host code).

**Roles flipped.** ``conversation`` is the agent's view (OpenAI messages). The simulator sees a
  system prompt built from the profile, the agent's texts as ``user`` turns and the simulated
  user's own past utterances as ``assistant`` turns (as JSON with their strategy when the message
  carries a ``"strategy"`` or ``"reaction"`` key, so the model sees its own format). The agent's system prompt, tool
  calls, tool results and ``<think>`` blocks are never shown to the user. Consecutive turns of one
  role are merged (some servers require alternation); if the simulator's first turn would be its
  own, ``config.opening_message`` is put before it as the agent's greeting.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)

#: Template fields the client fills itself (a profile key of the same name is ignored).
RESERVED_FIELDS = ("stop_marker",)

DEFAULT_SYSTEM_PROMPT = """\
You are playing a human user who is talking to an AI assistant (the agent) to get something done.
Stay in character: you are the user, never the assistant. Your hidden goal and profile are below.
Do not reveal everything at once; share a detail only when the agent asks for it or needs it, and
keep each message short and natural.

Your goal and profile:
{instructions}

When your goal is met, or the conversation cannot go anywhere, your utterance is exactly \
{stop_marker}

Answer with one JSON object and nothing else:
{{"utterance": "<what you say to the agent>", "strategy": "<one short label for how you react, \
e.g. inform, clarify, correct, reject, accept>"}}"""


class ProfileError(ValueError):
    """The system-prompt template needs a field the task's user profile does not have."""


def template_fields(template: str) -> tuple[str, ...]:
    """The named fields of a ``str.format`` template, in order of first use. Raises ValueError
    for a malformed template, positional fields and attribute/index access (``{a.b}``, ``{a[0]}``)."""
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"LLMUserConfig.system_prompt: not a valid str.format template ({e}); "
                         "expected named fields like {instructions} and literal braces doubled ({{ }})") from None
    for _, field, spec, _ in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            raise ValueError(f"LLMUserConfig.system_prompt: field {{{field}}}: expected a plain name "
                             "(no positional fields, attribute or index access)")
        if spec and "{" in spec:
            raise ValueError(f"LLMUserConfig.system_prompt: field {{{field}}} has a nested field in its format spec; "
                             "expected a plain format spec")
        if field not in fields:
            fields.append(field)
    return tuple(fields)


def render_system_prompt(template: str, profile: Mapping[str, Any], stop_markers: Sequence[str] = ("###STOP###",)) -> str:
    """Fill ``template``'s named fields from the profile (non-string values as JSON) and
    ``{stop_marker}`` with the first stop marker. A missing field raises :class:`ProfileError`."""
    if not isinstance(profile, Mapping):
        raise ProfileError(f"profile: got {type(profile).__name__}; expected a dict (the task's hidden user profile)")
    values: dict[str, Any] = {}
    for field in template_fields(template):
        if field == "stop_marker" and stop_markers:
            values[field] = stop_markers[0]
        elif field in profile:
            v = profile[field]
            values[field] = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, indent=2, default=str)
        else:
            have = sorted(str(k) for k in profile)
            raise ProfileError(f"profile: the system prompt template needs field {field!r}, which the profile lacks "
                               f"(profile keys: {have}); expected a profile with keys "
                               f"{[f for f in template_fields(template) if f not in RESERVED_FIELDS]}")
    return template.format_map(values)


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    raise ValueError(f"{where}.content: got {type(content).__name__}; expected a str, a list of content parts or None")


def flip_roles(conversation: Sequence[Mapping[str, Any]], opening_message: str = "Hi! How can I help you today?"
               ) -> list[dict[str, str]]:
    """The agent's conversation as the simulator sees it (without the system prompt): agent
    ``assistant`` texts become ``user`` turns, simulated-user ``user`` turns become ``assistant``
    turns; system messages, tool calls, tool results and ``<think>`` blocks are dropped; runs of
    one role are merged; the agent's ``opening_message`` goes first when the user would open."""
    if isinstance(conversation, (str, bytes)) or not isinstance(conversation, Sequence):
        raise ValueError(f"conversation: got {type(conversation).__name__}; expected a list of message dicts")
    out: list[dict[str, str]] = []
    for i, m in enumerate(conversation):
        where = f"conversation[{i}]"
        if not isinstance(m, Mapping) or "role" not in m:
            raise ValueError(f"{where}: got {type(m).__name__}; expected a dict with 'role' and 'content'")
        role = m["role"]
        if role in ("system", "tool"):
            continue
        if role == "assistant":
            text = _THINK.sub("", _text_of(m.get("content"), where)).strip()
            new_role = "user"
        elif role == "user":
            text = _text_of(m.get("content"), where).strip()
            label = m.get("strategy", m.get("reaction"))  # envs.base.EnvMessage calls it ``reaction``
            if label is not None:
                text = json.dumps({"utterance": text, "strategy": label}, ensure_ascii=False)
            new_role = "assistant"
        else:
            raise ValueError(f"{where}.role: got {role!r}; expected one of system, user, assistant, tool")
        if not text:
            continue  # an agent turn with only tool calls
        if out and out[-1]["role"] == new_role:
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": new_role, "content": text})
    if not out or out[0]["role"] == "assistant":
        out.insert(0, {"role": "user", "content": opening_message})
    if out[-1]["role"] != "user":
        raise ValueError("conversation: the simulated user spoke last (no agent text after its last message); "
                         "expected an agent message to respond to")
    return out


__all__ = ["DEFAULT_SYSTEM_PROMPT", "RESERVED_FIELDS", "ProfileError", "flip_roles", "render_system_prompt",
           "template_fields"]

"""Demonstrations: played through the episode runner, rendered as the rollout loop renders an episode.

`play_demos` plays a `jaxagent.envs.registry.DemoPlan` (an expert agent's episodes: a gym's expert,
tau2's oracle, a user environment's) through `jaxagent.rollout.runner.run_episode` and keeps each
as a `Demo`: the reset's messages, each agent turn and the environment's answers, without the
answers of the step that ended the episode (the rollout loop never appends those), the agent's
turns trained on unless its ``train_turns`` says otherwise.

`render_demo` turns a `jaxagent.envs.base.Demo` (chat messages with per-message train flags) into
token ids and a loss mask, token-in/token-out with the `ChatRenderer` calls `jaxagent.rollout.loop`
makes: the reset's messages in one ``add``, each assistant turn appended as generated tokens (the
template's text for the turn, end-of-turn token included), each step's answers in one ``add``. So
a demo's tokens are the record a rollout of a policy generating exactly those tokens would
produce, and its loss mask is that record's loss mask restricted to the ``train=True`` turns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxagent.envs.base import AgentMessage, Demo, agent_message_to_chat
from jaxagent.envs.registry import DemoPlan
from jaxagent.rollout.runner import HOST, Episode, run_episode
from jaxagent.text.chat import ChatRenderer
from jaxagent.text.template import ChatTemplateError
from jaxagent.text.tokenizer import Tokenizer


def _generated_ids(chat: ChatRenderer, message: dict[str, Any]) -> list[int]:
    """The tokens a policy generates for ``message`` after ``chat``'s generation prompt: the
    template's text for the turn after the prompt, up to and including the end-of-turn token."""
    history = chat.messages
    prompt = chat.render_text(history, add_generation_prompt=True)
    full = chat.render_text(history + [message])
    if not full.startswith(prompt):
        raise ChatTemplateError("render_demo: the template's text of an assistant turn does not extend its "
                                "generation prompt; cannot turn the message into generated tokens")
    rest = full[len(prompt):]
    stops = [chat.tokenizer.id_to_token(i) for i in sorted(chat.stop_token_ids)]
    ends = [rest.index(s) + len(s) for s in stops if s and s in rest]
    if not ends:
        raise ChatTemplateError(f"render_demo: the template writes no stop token ({stops}) after an assistant "
                                f"turn: {rest[-80:]!r}")
    ids = chat.tokenizer.encode(rest[:min(ends)])
    if not ids or ids[-1] not in chat.stop_token_ids:
        raise ChatTemplateError("render_demo: the assistant turn's text does not encode to a final stop token")
    return ids


def render_demo(demo: Demo, tokenizer: Tokenizer, *, tool_schemas_in_prompt: bool = True,
                ) -> tuple[list[int], list[bool]]:
    """Token ids of ``demo`` and a per-token loss mask: True exactly on the generated tokens
    (content and end-of-turn token) of the assistant turns with ``train=True``.
    ``tool_schemas_in_prompt=False`` leaves the tool schemas out of the system prompt, as
    `EpisodeConfig.tool_schemas_in_prompt` does for rollouts.

    Rendered token-in/token-out with :class:`~jaxagent.text.chat.ChatRenderer` as the rollout loop
    renders an episode: the reset's messages in one ``add``, each assistant turn appended with
    ``start_generation`` / ``append_generated`` (its template text encoded), each step's answers in
    one ``add``, then ``finish``.
    """
    chat = ChatRenderer(tokenizer, tools=(list(demo.tools) or None) if tool_schemas_in_prompt else None)
    scored: list[int] = []
    pending: list[dict] = []
    for i, (message, train) in enumerate(zip(demo.messages, demo.train)):
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if pending:
            chat.add(*pending)
            pending = []
        ids = _generated_ids(chat, message)
        chat.start_generation()
        span = chat.append_generated(ids)
        assert span.index == i, (span.index, i)
        if train:
            scored.append(i)
    if pending:
        chat.add(*pending)
    record = chat.finish()
    mask = dataclasses.replace(record, scored=tuple(scored)).loss_mask()
    return list(record.tokens), [bool(x) for x in mask]


def demo_of(episode: Episode, train_turns: list[bool] | None = None) -> Demo:
    """``episode`` as a `Demo` (module docstring); ``train_turns``: per agent turn, whether it is
    trained on (default all)."""
    messages, train, turn = [], [], 0
    for m in episode.transcript:
        if isinstance(m, AgentMessage):
            messages.append(agent_message_to_chat(m))
            train.append(True if train_turns is None else bool(train_turns[turn]))
            turn += 1
        else:
            messages.append(m.to_chat())
            train.append(False)
    return Demo(episode.task_id, tuple(messages), tuple(train), episode.outcome, episode.tools)


async def play_demos_async(plan: DemoPlan) -> list[Demo]:
    """`play_demos`, from async code."""
    out = []
    for task_id, seed in plan.episodes:
        agent = plan.agent(task_id, seed)
        turns = plan.max_turns(task_id) if callable(plan.max_turns) else plan.max_turns
        episode = await run_episode(plan.make_env(), agent, task_id=task_id, seed=seed,
                                    config=dataclasses.replace(HOST, max_turns=int(turns)))
        out.append(demo_of(episode, getattr(agent, "train_turns", None)))
    return out


def play_demos(plan: DemoPlan) -> list[Demo]:
    """The plan's episodes, one after the other (deterministic), as demonstrations. Synchronous
    (``asyncio.run``); from async code await `play_demos_async`."""
    import asyncio

    return asyncio.run(play_demos_async(plan))


__all__ = ["demo_of", "play_demos", "play_demos_async", "render_demo"]

"""Expert demonstrations of the scripted gyms for supervised fine-tuning (host code, no jax).

A :class:`Demo` is one episode of a gym's expert policy as the agent's chat: the reset's messages
(system prompt first, then the user's opening), then each agent turn as an assistant message with
its ``interact_with_env`` tool call, followed by the environment's answers (tool messages, user
messages without their reaction labels). ``train`` marks, per message, the assistant turns an SFT
loss should train on.

Noise (``noise=p``): each agent turn is taken by the gym's random policy with probability ``p``
instead of the expert; the environment answers it as usual and the expert continues from the state
it left, so the demo shows recovery. Noisy turns have ``train=False``. With ``noise=0`` every demo
reaches the gym's maximum reward; with noise the demo is kept whatever its reward (``reward``).

Same context as the RL rollouts (``jaxagent.rollout.loop.run_episode``): the chat starts from
``env.reset(task_id, seed)``'s messages and tools; each step's messages are added in one
``ChatRenderer.add`` call; the messages of the final step (the answer's acknowledgement and the
user's verdict) are not added, as the loop does not add them. :func:`render_demo` renders a demo
token-in/token-out with the same renderer calls, appending each assistant turn as generated
tokens (the template's text for the turn, end-of-turn token included), so its tokens are the
record a rollout of a policy generating exactly those tokens would produce, and its loss mask is
that record's ``RenderedChat.loss_mask`` restricted to the ``train=True`` turns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

from jaxagent.envs.base import AgentMessage, EnvMessage
from jaxagent.envs.gyms import GYMS, TOOL_SCHEMA, parse_task_id
from jaxagent.text.chat import ChatRenderer
from jaxagent.text.template import ChatTemplateError
from jaxagent.text.tokenizer import Tokenizer

__all__ = ["Demo", "agent_message_to_chat", "expert_demos", "expert_episode", "render_demo",
           "transcript_to_chat"]

MAX_TURNS = 32
"""Safety bound on agent turns per demo (every gym ends an episode after ``max_steps`` <= 16)."""


@dataclasses.dataclass(frozen=True)
class Demo:
    """One demonstration episode.

    Attributes:
      task_id: the gym task (``"<gym>:<split>:<seed>:<index>"``).
      messages: OpenAI-style chat dicts, system prompt first: ``{"role", "content"}``; assistant
        turns carry ``tool_calls`` (``[{"type": "function", "function": {"name", "arguments"}}]``,
        arguments as a dict); tool messages carry ``name``. Ends with the last assistant turn (the
        final step's answers are not part of the agent's context, as in the rollout loop).
      train: per message, True for the assistant turns an SFT loss trains on (expert turns);
        False for every other message and for noisy (random-policy) turns.
      reward: the episode's outcome reward (``MAX_REWARD`` = 1.0 is the maximum).
      tools: the tool schemas of the reset (what the system turn lists).
    """

    task_id: str
    messages: tuple[dict, ...]
    train: tuple[bool, ...]
    reward: float
    tools: tuple[dict, ...] = (TOOL_SCHEMA,)

    def __post_init__(self):
        if len(self.train) != len(self.messages):
            raise ValueError(f"train: length {len(self.train)}, expected one flag per message "
                             f"({len(self.messages)})")
        bad = [i for i, (m, t) in enumerate(zip(self.messages, self.train)) if t and m.get("role") != "assistant"]
        if bad:
            raise ValueError(f"train: messages {bad} are not assistant messages; only assistant turns train")


def agent_message_to_chat(message: AgentMessage) -> dict[str, Any]:
    """An agent turn as an OpenAI-style assistant message (tool calls with dict arguments)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [call.to_dict() for call in message.tool_calls]
    return out


def transcript_to_chat(transcript: Sequence[EnvMessage | AgentMessage]) -> list[dict[str, Any]]:
    """A ``run_episode`` transcript as chat dicts (reaction labels dropped)."""
    return [agent_message_to_chat(m) if isinstance(m, AgentMessage) else m.to_chat() for m in transcript]


async def expert_episode(gym: str, task_id: str, seed: int = 0, *, noise: float = 0.0,
                         rng: random.Random | int | None = None, policy: str = "expert") -> Demo:
    """One demo of ``gym``'s expert on ``task_id`` (``seed``: the reset's seed).

    ``policy``: ``"expert"`` (the gym's expert, which may use privileged knowledge of the task) or
    ``"imitable"`` (`GymSpec.demo_policy`: an expert that uses only what the agent sees, where the
    gym has one; else the expert).

    ``noise``: probability that a turn is taken by the gym's random policy instead (``train=False``).
    ``rng``: a ``random.Random`` (or a seed) for the coin flips and the random policy; default a
    generator seeded from ``(task_id, seed)``, so a demo is a function of its arguments.
    """
    if gym not in GYMS:
        raise ValueError(f"gym={gym!r}: expected one of {sorted(GYMS)}")
    if parse_task_id(task_id)[0] != gym:
        raise ValueError(f"task_id={task_id!r}: belongs to gym {parse_task_id(task_id)[0]!r}, not {gym!r}")
    if not 0.0 <= float(noise) <= 1.0:
        raise ValueError(f"noise={noise!r}: expected a probability in [0, 1]")
    if not isinstance(rng, random.Random):
        rng = random.Random(f"demos|{task_id}|{int(seed)}" if rng is None else rng)
    if policy not in ("expert", "imitable"):
        raise ValueError(f"policy={policy!r}: expected 'expert' or 'imitable'")
    spec = GYMS[gym]
    teacher = spec.expert_policy if policy == "expert" else spec.demo_policy
    env = spec.env()
    explore = spec.random_policy(rng) if noise > 0 else None
    reset = await env.reset(task_id, int(seed))
    messages = [m.to_chat() for m in reset.messages]
    train = [False] * len(messages)
    rewards = []
    try:
        for _ in range(MAX_TURNS):
            noisy = explore is not None and rng.random() < noise
            msg = explore(env) if noisy else teacher(env)
            messages.append(agent_message_to_chat(msg))
            train.append(not noisy)
            step = await env.step(msg)
            rewards.append(float(step.reward))
            if step.done:
                break
            messages.extend(m.to_chat() for m in step.messages)
            train.extend([False] * len(step.messages))
        outcome = env.outcome_reward()
    finally:
        await env.aclose()
    reward = sum(rewards) if math.isnan(outcome) else float(outcome)  # NaN: not done: the step rewards
    return Demo(task_id, tuple(messages), tuple(train), reward, tuple(reset.tools))


def expert_demos(gym: str, split: str, n: int, seed: int = 0, *, noise: float = 0.0,
                 policy: str = "expert") -> list[Demo]:
    """Demos on ``make_tasks(gym, split, n, seed)``: the i-th task is reset with seed ``i`` (which
    picks the user's paraphrases), and its noise draws come from a generator seeded by the task id
    and ``i``. Deterministic. Synchronous (``asyncio.run``); from async code await
    :func:`expert_episode` instead."""
    tasks = GYMS[gym].make_tasks(split, n, seed) if gym in GYMS else None
    if tasks is None:
        raise ValueError(f"gym={gym!r}: expected one of {sorted(GYMS)}")

    async def _all():
        return [await expert_episode(gym, t, i, noise=noise, policy=policy) for i, t in enumerate(tasks)]

    return asyncio.run(_all())


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

"""Expert demonstrations of the scripted gyms for supervised fine-tuning (host code, no jax).

A `jaxagent.envs.base.Demo` is one episode of a gym's expert policy as the agent's chat: the reset's messages
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
user's verdict) are not added, as the loop does not add them. `jaxagent.rollout.demos.render_demo`
renders a demo
token-in/token-out with the same renderer calls, appending each assistant turn as generated
tokens (the template's text for the turn, end-of-turn token included), so its tokens are the
record a rollout of a policy generating exactly those tokens would produce, and its loss mask is
that record's ``RenderedChat.loss_mask`` restricted to the ``train=True`` turns.
"""

from __future__ import annotations

import asyncio
import math
import random

from jaxagent.envs.base import Demo, agent_message_to_chat
from jaxagent.envs.gyms import GYMS, parse_task_id

__all__ = ["expert_demos", "expert_episode"]

MAX_TURNS = 32
"""Safety bound on agent turns per demo (every gym ends an episode after ``max_steps`` <= 16)."""


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

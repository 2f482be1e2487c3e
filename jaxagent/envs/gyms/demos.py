"""Expert demonstrations of the scripted gyms for supervised fine-tuning (host code, no jax).

`expert_plan` says which episodes to play and with which agent (`ExpertAgent`, the gym's expert);
`jaxagent.rollout.demos.play_demos` plays them through the episode runner, each as a
`jaxagent.envs.base.Demo`: the reset's messages (system prompt first, then the user's opening),
then each agent turn as an assistant message with its ``interact_with_env`` tool call, followed by
the environment's answers (tool messages, user messages without their reaction labels); ``train``
marks, per message, the assistant turns an SFT loss should train on.

    demos = play_demos(expert_plan("intention", "train", 512, seed=0, noise=0.05))

Noise (``noise=p``): each agent turn is taken by the gym's random policy with probability ``p``
instead of the expert; the environment answers it as usual and the expert continues from the state
it left, so the demo shows recovery. Noisy turns have ``train=False``. With ``noise=0`` every demo
reaches the gym's maximum reward; with noise the demo is kept whatever its reward (``reward``).

Same context as the RL rollouts: the chat starts from ``env.reset(task_id, seed)``'s messages and
tools; each step's messages follow in order; the messages of the final step (the answer's
acknowledgement and the user's verdict) are not kept, as the rollout loop does not add them.
`jaxagent.rollout.demos.render_demo` renders a demo token-in/token-out with the same renderer calls,
appending each assistant turn as generated tokens (the template's text for the turn, end-of-turn
token included), so its tokens are the record a rollout of a policy generating exactly those tokens
would produce, and its loss mask is that record's ``RenderedChat.loss_mask`` restricted to the
``train=True`` turns.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from jaxagent.envs.base import Agent, AgentMessage, CallableEnvFactory, Environment, Reset
from jaxagent.envs.gyms import GYMS, parse_task_id
from jaxagent.envs.registry import DemoPlan

__all__ = ["MAX_TURNS", "ExpertAgent", "expert_plan"]

MAX_TURNS = 32
"""Safety bound on agent turns per demo (every gym ends an episode after ``max_steps`` <= 16)."""


class ExpertAgent(Agent):
    """``gym``'s expert (``policy="expert"``: it may use privileged knowledge of the task) or
    imitable expert (``"imitable"``: `GymSpec.demo_policy`, using only what the agent sees, where the
    gym has one), each turn taken by the gym's random policy instead with probability ``noise``.
    ``rng``: a ``random.Random`` (or a seed) for the coin flips and the random policy (`expert_plan`
    seeds it from the episode's task id and seed, so a demo is a function of its episode).
    ``train_turns`` records, per turn, whether the expert took it."""

    def __init__(self, gym: str, *, noise: float = 0.0, policy: str = "expert", rng: random.Random | int | str = 0):
        check_expert(gym, noise, policy)
        spec = GYMS[gym]
        self.gym, self.noise, self.rng_arg = gym, float(noise), rng
        self.teacher = spec.expert_policy if policy == "expert" else spec.demo_policy
        self.env: Environment | None = None
        self.train_turns: list[bool] = []

    def start(self, task_id: str, reset: Reset, env: Environment) -> None:
        rng = self.rng_arg if isinstance(self.rng_arg, random.Random) else random.Random(self.rng_arg)
        self.rng, self.env, self.train_turns = rng, env, []
        self.explore = GYMS[self.gym].random_policy(rng) if self.noise > 0 else None

    async def act(self, turn: int) -> AgentMessage:
        noisy = self.explore is not None and self.rng.random() < self.noise
        self.train_turns.append(not noisy)
        return self.explore(self.env) if noisy else self.teacher(self.env)


def check_expert(gym: str, noise: float, policy: str) -> None:
    """ValueError naming a gym that does not exist, a noise outside [0, 1] or an unknown policy."""
    if gym not in GYMS:
        raise ValueError(f"gym={gym!r}: expected one of {sorted(GYMS)}")
    if not 0.0 <= float(noise) <= 1.0:
        raise ValueError(f"noise={noise!r}: expected a probability in [0, 1]")
    if policy not in ("expert", "imitable"):
        raise ValueError(f"policy={policy!r}: expected 'expert' or 'imitable'")


def expert_plan(gym: str, split: str = "train", n: int = 0, seed: int = 0, *, noise: float = 0.0,
                policy: str = "expert", episodes: Sequence[tuple[str, int]] | None = None,
                rng: random.Random | int | None = None) -> DemoPlan:
    """The expert's demos on ``make_tasks(gym, split, n, seed)``, the i-th task reset with seed ``i``
    (which picks the user's paraphrases) and its noise drawn from a generator seeded by the task id
    and ``i``; or on the given ``episodes`` ((task_id, seed) pairs of ``gym``). Deterministic."""
    check_expert(gym, noise, policy)
    spec = GYMS[gym]
    if episodes is None:
        episodes = [(t, i) for i, t in enumerate(spec.make_tasks(split, n, seed))]
    for task_id, _ in episodes:
        if parse_task_id(task_id)[0] != gym:
            raise ValueError(f"task_id={task_id!r}: belongs to gym {parse_task_id(task_id)[0]!r}, not {gym!r}")

    def agent(task_id: str, s: int) -> ExpertAgent:
        return ExpertAgent(gym, noise=noise, policy=policy, rng=f"demos|{task_id}|{int(s)}" if rng is None else rng)

    return DemoPlan(make_env=CallableEnvFactory(spec.env), episodes=list(episodes), agent=agent, max_turns=MAX_TURNS)

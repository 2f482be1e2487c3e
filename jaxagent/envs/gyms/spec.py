"""The scripted gyms as one registered family (``env.kind=gym``, the gym chosen by ``env.gym``).

Settings are the run's ``env`` section: ``gym`` (a name of `GYMS`), ``max_steps`` (null: the gym's
default), ``outcome`` (``graded`` or ``binary``), ``train_tasks`` / ``test_tasks`` / ``task_seed``.
Intention and telepathy enumerate their replies (InfoPO's marginal prior); function and
preference do not. Demonstrations are the gym's expert (or imitable expert) episodes with random-policy noise
(`jaxagent.envs.gyms.demos.expert_plan`, played through the episode runner).
"""

from __future__ import annotations

from typing import Any

from jaxagent.envs.base import CallableEnvFactory
from jaxagent.envs.gyms import GYMS
from jaxagent.envs.gyms.common import LABELS, MAX_REWARD, OUTCOMES
from jaxagent.envs.registry import DemoPlan, DemoRequest, EnvContext, EnvSetup, EnvSpec


def _check(env: Any) -> None:
    if env.gym not in GYMS:
        raise ValueError(f"gym={env.gym!r}: expected one of {', '.join(map(repr, GYMS))}")
    if env.outcome not in OUTCOMES:
        raise ValueError(f"outcome={env.outcome!r}: expected one of {', '.join(map(repr, OUTCOMES))}")
    if env.max_steps is not None and env.max_steps < 1:
        raise ValueError(f"max_steps={env.max_steps}: expected an integer >= 1 or null (the gym's default)")


def _build(ctx: EnvContext) -> EnvSetup:
    env = ctx.settings
    spec = GYMS[env.gym]
    return EnvSetup(CallableEnvFactory(lambda: spec.env(max_steps=env.max_steps, outcome=env.outcome)),
                    spec.make_tasks("train", ctx.train_tasks, ctx.task_seed),
                    spec.make_tasks("test", ctx.test_tasks, ctx.task_seed))


def _demos(ctx: EnvContext, setup: EnvSetup, request: DemoRequest) -> DemoPlan:
    from jaxagent.envs.gyms.demos import expert_plan

    return expert_plan(ctx.settings.gym, "train", request.n, seed=ctx.task_seed, noise=request.noise,
                       policy=request.policy)


GYM = EnvSpec(
    name="gym", build=_build, description="scripted user gyms (env.gym: " + ", ".join(GYMS) + "); no LLM",
    max_reward=MAX_REWARD, reaction_labels=LABELS, reply_alternatives=lambda env: GYMS[env.gym].env_cls.enumerates_replies, demonstrations=_demos, check=_check,
    label=lambda env: env.gym)

__all__ = ["GYM"]

"""Scripted user gyms: procedurally generated tasks, rule-based users with reaction labels, no LLM.

``GYMS[name]`` is a :class:`GymSpec`: the environment class (``spec.env()`` makes one episode's
environment), ``make_tasks(split, n, seed)`` (task ids), ``vocabulary()`` (the closed word list),
``expert_policy`` (reaches ``MAX_REWARD`` on every task) and ``random_policy(rng)``. Policies map
the running gym to the next :class:`~jaxagent.envs.base.AgentMessage`;
`jaxagent.rollout.runner.play_policy` plays one.
See ``common.py`` for the tool, task ids, splits, rewards and error handling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jaxagent.envs.gyms import function, intention, preference, telepathy
from jaxagent.envs.gyms.common import (CHOICES, LABELS, MAX_REWARD, SPLITS, TOOL_NAME, TOOL_SCHEMA, Policy,
                                       ScriptedGym, act, answer, parse_task_id, search, tokenize)
from jaxagent.envs.gyms.function import FunctionGym
from jaxagent.envs.gyms.intention import IntentionGym
from jaxagent.envs.gyms.preference import PreferenceGym
from jaxagent.envs.gyms.telepathy import TelepathyGym


@dataclasses.dataclass(frozen=True)
class GymSpec:
    name: str
    env_cls: type[ScriptedGym]
    expert_policy: Policy
    random_policy: Callable[..., Policy]
    imitable_policy: Policy | None = None  # an expert that uses only what the agent sees

    @property
    def demo_policy(self) -> Policy:
        """The policy demonstrations imitate: the imitable expert where the gym has one."""
        return self.imitable_policy or self.expert_policy

    def env(self, **kwargs) -> ScriptedGym:
        return self.env_cls(**kwargs)

    def make_tasks(self, split: str, n: int, seed: int = 0) -> list[str]:
        return self.env_cls.make_tasks(split, n, seed)

    def vocabulary(self) -> list[str]:
        return self.env_cls.vocabulary()


GYMS: dict[str, GymSpec] = {
    m.__name__.rsplit(".", 1)[1]: GymSpec(cls.name, cls, m.expert_policy, m.random_policy,
                                          getattr(m, "imitable_policy", None))
    for m, cls in ((intention, IntentionGym), (telepathy, TelepathyGym), (function, FunctionGym),
                   (preference, PreferenceGym))
}


def make_tasks(gym: str, split: str, n: int, seed: int = 0) -> list[str]:
    """``n`` task ids of ``gym``'s ``split`` (``"train"`` or ``"test"``); ``seed`` picks the set."""
    return GYMS[gym].make_tasks(split, n, seed)


def make_env(task_id: str, **kwargs) -> ScriptedGym:
    """The environment for a task id (its gym is the id's first field)."""
    return GYMS[parse_task_id(task_id)[0]].env(**kwargs)


def vocabulary(gym: str) -> list[str]:
    return GYMS[gym].vocabulary()


__all__ = ["CHOICES", "GYMS", "LABELS", "MAX_REWARD", "SPLITS", "TOOL_NAME", "TOOL_SCHEMA", "FunctionGym",
           "GymSpec", "IntentionGym", "Policy", "PreferenceGym", "ScriptedGym", "TelepathyGym", "act", "answer",
           "make_env", "make_tasks", "parse_task_id", "search", "tokenize", "vocabulary"]

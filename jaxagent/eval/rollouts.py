"""Evaluation: success and reward averaged over k runs per task (avg@k), turns and lengths.

`evaluate` plays ``k`` episodes of every task with the given policy weights through the engine
(sampled with ``sampling``; temperature 0 makes the k runs identical) and returns
`episode_metrics` over all of them plus ``success_at_k_any`` (the share of tasks solved by at
least one of the k runs, pass@k) and the per-task success rates and mean rewards
(``success_by_task``, ``reward_by_task``: the units paired comparisons resample). With several
``processes``, each plays its share of the tasks and all return the same figures
(`jaxagent.rollout.processes.play_episodes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxagent.envs.base import Environment
from jaxagent.eval.progress import EpisodeProgress
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.metrics import episode_metrics
from jaxagent.rollout.processes import ProcessGroup, play_episodes
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.text.tokenizer import Tokenizer


def evaluate(params: Any, engine: GenerationEngine, make_env: Callable[[], Environment], tokenizer: Tokenizer,
             tasks: Sequence[str], *, k: int, sampling: SamplingParams, key: jax.Array,
             episode: EpisodeConfig = EpisodeConfig(), success_threshold: float = 1.0,
             processes: ProcessGroup | None = None, progress: EpisodeProgress | None = None
             ) -> tuple[dict[str, Any], list[Trajectory]]:
    """``k`` episodes of every task under ``params`` (see the module docstring): the metrics and the
    trajectories, task-major. ``progress`` hears of each episode as it ends (its success)."""
    if k < 1:
        raise ValueError(f"k={k}: expected an integer >= 1")
    if not tasks:
        raise ValueError("tasks: empty; expected at least one task id")
    engine.set_params(params)
    hook = None if progress is None else (
        lambda t: progress.done(t.outcome_reward >= success_threshold - 1e-9))
    trajs = play_episodes(engine, make_env, tokenizer, tasks, group_size=k, sampling=sampling, key=key,
                          config=episode, processes=processes, on_episode=hook)
    metrics = episode_metrics(trajs, success_threshold)
    ok = np.asarray([t.outcome_reward >= success_threshold - 1e-9 for t in trajs]).reshape(len(tasks), k)
    metrics["k"] = k
    metrics["tasks"] = len(tasks)
    metrics["success_at_k_any"] = float(ok.any(axis=1).mean())
    metrics["success_by_task"] = {task: float(row.mean()) for task, row in zip(tasks, ok)}
    rewards = np.asarray([t.outcome_reward for t in trajs], np.float64).reshape(len(tasks), k)
    metrics["reward_by_task"] = {task: float(row.mean()) for task, row in zip(tasks, rewards)}
    return metrics, trajs


__all__ = ["evaluate"]

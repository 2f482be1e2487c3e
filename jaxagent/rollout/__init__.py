"""Rollouts (host code): the in-flight generation engine, the one episode runner (any agent, any
environment), the policy as an agent, and trajectory records built token-in/token-out. Rollout
emits trajectories; `jaxagent.train` turns them into arrays."""

from jaxagent.rollout.engine import EngineResult, GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.loop import run_episode, run_episodes
from jaxagent.rollout.trajectory import TERMINATIONS, Trajectory, from_jsonl, to_jsonl

__all__ = ["TERMINATIONS", "EngineResult", "EpisodeConfig", "GenerationEngine", "Trajectory",
           "from_jsonl", "run_episode", "run_episodes", "to_jsonl"]

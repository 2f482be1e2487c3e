"""Rollouts (host code): the in-flight generation engine, episodes as coroutines, trajectory
records built token-in/token-out, and the collator to the credit batch."""

from jaxagent.rollout.engine import EngineResult, GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.loop import run_episode, run_episodes
from jaxagent.rollout.trajectory import TERMINATIONS, Trajectory, collate, from_jsonl, to_jsonl

__all__ = ["TERMINATIONS", "EngineResult", "EpisodeConfig", "GenerationEngine", "Trajectory", "collate",
           "from_jsonl", "run_episode", "run_episodes", "to_jsonl"]

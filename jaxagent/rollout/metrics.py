"""Figures over a list of episodes (host code): success, reward, turns, lengths, terminations, and
the simulator's calls and failures. Used by RL iterations and evaluations alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxagent.envs.base import FAILURE_KINDS
from jaxagent.rollout.trajectory import Trajectory


def episode_metrics(trajs: Sequence[Trajectory], success_threshold: float = 1.0) -> dict[str, Any]:
    """Success rate, reward, turns, response lengths and terminations of a list of episodes (failed
    ones included, as outcome 0), the simulator's calls (`sim_metrics`) and, where the environment
    marks its feedback, the kinds of feedback (`feedback_metrics`)."""
    rewards = np.asarray([t.outcome_reward for t in trajs], np.float64)
    turns = np.asarray([len(t.action_spans()) for t in trajs], np.float64)
    gen = np.asarray([sum(e - s for s, e in t.action_spans()) for t in trajs], np.float64)
    per_turn = gen / np.maximum(turns, 1)
    out: dict[str, Any] = {
        "episodes": len(trajs),
        "success": float(np.mean(rewards >= success_threshold - 1e-9)),
        "reward": float(rewards.mean()),
        "turns": float(turns.mean()),
        "response_tokens": float(per_turn.mean()),
        "episode_tokens": float(np.mean([len(t.tokens) for t in trajs])),
        "simulator_failures": int(sum(t.termination == "simulator_failure" for t in trajs)),
        "format_errors": int(sum(t.info.get("format_errors", 0) for t in trajs)),
        "tool_errors": int(sum(t.info.get("tool_errors", 0) for t in trajs)),
    }
    for term in sorted({t.termination for t in trajs}):
        out[f"termination/{term}"] = int(sum(t.termination == term for t in trajs))
    out.update(sim_metrics(trajs))
    out.update(feedback_metrics(trajs))
    # InfoPO's length-reward correlation diagnostic (0 when either side is constant)
    if len(trajs) > 1 and gen.std() > 0 and rewards.std() > 0:
        out["length_reward_corr"] = float(np.corrcoef(gen, rewards)[0, 1])
    else:
        out["length_reward_corr"] = 0.0
    return out


def feedback_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """The kinds of the feedback the episodes' actions drew (`Trajectory.feedback_kinds`), over
    the turns followed by feedback the environment marked: ``feedback/information_share``,
    ``feedback/correction_share`` and ``feedback/marked_turns``; nothing when no record has marks."""
    kinds = [k for t in trajs if getattr(t, "message_kinds", None) for k in t.feedback_kinds() if k]
    if not kinds:
        return {}
    n = len(kinds)
    return {"feedback/information_share": sum(k == 1 for k in kinds) / n,
            "feedback/correction_share": sum(k == 2 for k in kinds) / n, "feedback/marked_turns": float(n)}


def sim_metrics(trajs: Sequence[Trajectory]) -> dict[str, int]:
    """The simulator's side of a list of episodes, from their records' ``info``
    (`jaxagent.rollout.loop`): ``sim/calls``, ``sim/attempts`` (HTTP attempts), ``sim/retries``
    (the clients' own), ``sim/failed_calls`` (calls that raised), ``sim/fail/<kind>`` (failed
    attempts by cause, every `FAILURE_KINDS` entry), ``sim/loop_errors`` (failed reset/step calls
    in the loop) and ``sim/loop_timeouts`` (those past ``rollout.timeout_s``),
    ``sim/failed_episodes`` and ``sim/truncated_replies``."""
    def total(key: str) -> int:
        return int(sum(int(t.info.get(key, 0) or 0) for t in trajs))

    out = {"sim/calls": total("sim_calls"), "sim/attempts": total("sim_attempts"),
           "sim/retries": total("sim_retries"), "sim/failed_calls": total("sim_failed_calls"),
           "sim/loop_errors": total("simulator_errors"), "sim/loop_timeouts": total("simulator_timeouts"),
           "sim/failed_episodes": int(sum(t.termination == "simulator_failure" for t in trajs)),
           "sim/truncated_replies": total("truncated_replies")}
    kinds = {**dict.fromkeys(FAILURE_KINDS, 0), **failures_by_kind(trajs)}
    out.update({f"sim/fail/{k}": v for k, v in kinds.items()})
    return out


def failures_by_kind(trajs: Sequence[Trajectory]) -> dict[str, int]:
    """Failed HTTP attempts by cause, summed over the records' ``info["sim_failures"]``."""
    kinds: dict[str, int] = {}
    for t in trajs:
        for kind, n in (t.info.get("sim_failures") or {}).items():
            kinds[kind] = kinds.get(kind, 0) + int(n)
    return kinds


def failure_causes(trajs: Sequence[Trajectory]) -> str:
    """The causes of the failed episodes among ``trajs``, for a message: failed HTTP attempts by
    cause (``401 x 8, connection x 2``), loop timeouts, and the last error seen."""
    failed = [t for t in trajs if t.termination == "simulator_failure"]
    kinds = failures_by_kind(failed)
    parts = [f"{k} x {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]) if n]
    timeouts = sum(int(t.info.get("simulator_timeouts", 0) or 0) for t in failed)
    if timeouts:
        parts.append(f"rollout.timeout_s exceeded x {timeouts}")
    last = next((t.info["last_error"] for t in reversed(failed) if t.info.get("last_error")), None)
    text = "failed attempts by cause: " + (", ".join(parts) if parts else "none recorded")
    if last:
        text += f"; last error: {last}"
    return " ".join(text.split())  # one line


__all__ = ["episode_metrics", "failure_causes", "failures_by_kind", "feedback_metrics", "sim_metrics"]

"""Evaluations: the policy on a run's held-out tasks (logged and checked), and the host agents an
environment offers (``job=eval agent=oracle|endpoint`` on tau2: `run_host_eval`)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from jaxagent.eval.progress import EpisodeProgress
from jaxagent.jobs.build import Run, episode_config, sampling_params, step_key
from jaxagent.rollout.metrics import failure_causes
from jaxagent.train.rl import SimulatorFailureBudget


def run_eval(run: Run, params, label: str, step: int, *, sampled: bool = True) -> dict[str, Any]:
    """Evaluates ``params`` on the held-out tasks (greedy, and with ``sampled`` also
    ``eval.sampled_k`` runs per task at the training temperature) and logs the record."""
    from jaxagent.eval.rollouts import evaluate

    cfg = run.cfg
    tasks = run.test_tasks[: cfg.eval.tasks]
    k = cfg.eval.runs_per_task(cfg.env.spec)  # eval.k, or the environment's default (tau2: 4)
    t0 = time.perf_counter()
    envs = run.make_env
    envs.record(True)  # families with per-episode reports (tau2 retail) keep this evaluation's
    show = cfg.progress and run.processes.is_main
    progress = EpisodeProgress(f"eval {label} (greedy)" if cfg.eval.temperature == 0 else f"eval {label}",
                               len(tasks) * k, enabled=show)
    try:
        m, trajs = evaluate(params, run.engine, envs, run.tok, tasks, k=k,
                            sampling=sampling_params(cfg, run.tok, temperature=cfg.eval.temperature),
                            key=step_key(cfg.seed, "eval", step), episode=episode_config(cfg),
                            success_threshold=cfg.rl.success_threshold, processes=run.processes, progress=progress)
    finally:
        envs.record(False)
        progress.close()
    # each process's reports are of its own episodes; in process order they are in episode order
    reports = [r for part in run.processes.gather(envs.drain()) for r in part]
    if reports:
        if len(reports) == len(trajs):  # both in episode-creation order (task-major, then the k runs)
            for r, t in zip(reports, trajs):
                r["rollout_termination"] = t.termination  # e.g. max_turns, simulator_failure
        if run.processes.is_main:
            write_jsonl(run.run_dir / f"episodes_{label}_{step}.jsonl", reports)
            write_jsonl(run.run_dir / f"tasks_{label}_{step}.jsonl", envs.per_task(reports))
        m.update(envs.summarize(reports, k=k))
    if sampled and cfg.eval.sampled_k and cfg.eval.agent == "policy" and cfg.env.spec.sampled_eval:
        # the distribution RL trains (rollout.temperature), beside the greedy figure: what RL fixes first
        progress = EpisodeProgress(f"eval {label} (sampled, T={cfg.rollout.temperature:g})",
                                   len(tasks) * cfg.eval.sampled_k, enabled=show)
        try:
            ms, strajs = evaluate(params, run.engine, run.make_env, run.tok, tasks, k=cfg.eval.sampled_k,
                                  sampling=sampling_params(cfg, run.tok),
                                  key=jax.random.fold_in(step_key(cfg.seed, "eval", step), 1),
                                  episode=episode_config(cfg), success_threshold=cfg.rl.success_threshold,
                                  processes=run.processes, progress=progress)
        finally:
            progress.close()
        m.update({f"sampled/{key}": ms[key] for key in ("success", "reward", "turns", "success_at_k_any", "k",
                                                         "success_by_task", "reward_by_task", "simulator_failures")})
        m["sampled/temperature"] = cfg.rollout.temperature
        trajs = trajs + strajs
    m["wall_s"] = time.perf_counter() - t0
    run.log.log("eval", step, dict(m, label=label), show=("success", "sampled/success", "reward", "turns",
                                                          "sim/failed_episodes", "label"))
    try:
        _check_eval_failures(trajs, label, step)
    except SimulatorFailureBudget as e:
        run.log.event("failure", step, {"of": "eval", "reason": str(e)})
        raise
    return m


def _check_eval_failures(trajs, label: str, step: int) -> None:
    """An evaluation whose every episode ended in ``simulator_failure`` measured nothing: before
    training (``label="before"``, also job=eval's only one) the run stops (`SimulatorFailureBudget`);
    later ones (during, after) say so on stderr and the run goes on (its checkpoints are kept)."""
    if not trajs or any(t.termination != "simulator_failure" for t in trajs):
        return
    msg = (f"eval {label} (step {step}): all {len(trajs)} episodes ended in simulator_failure; "
           f"{failure_causes(trajs)}")
    if label == "before":
        raise SimulatorFailureBudget(msg + "; stopping before any training")
    print(f"WARNING: {msg}", file=sys.stderr, flush=True)


def run_host_eval(cfg) -> dict[str, Any]:
    """``job=eval`` with a host agent ``eval.agent`` that ``env.kind`` offers (`EnvSpec.host_eval`: on
    tau2 the oracle or an endpoint), each task played ``eval.k`` times (null: the environment's
    default, `EnvSpec.eval_k`): writes ``runs/<name>/{config.yaml, episodes.jsonl, tasks.jsonl,
    summary.json}``, prints a few lines (the spec's text, with ``progress``) and returns the summary
    without its per-task figures (``success_by_task``, in summary.json) and with the files' paths
    (``files``)."""
    from jaxagent.envs.registry import EnvSetup, HostEvalRequest
    from jaxagent.jobs.build import build_env
    from jaxagent.jobs.config import env_context
    from jaxagent.rollout.runner import play_tasks
    from jaxagent.jobs.resume import checked_run_dir, record_config

    t0 = time.perf_counter()
    run_dir = checked_run_dir(cfg)  # never into another job's run directory (the key name)
    record_config(cfg, run_dir)
    e = cfg.eval
    k = e.runs_per_task(cfg.env.spec)
    ctx = env_context(cfg)
    setup = EnvSetup(*build_env(cfg))
    host = cfg.env.spec.host_eval(ctx, HostEvalRequest(agent=e.agent, k=k, concurrency=e.concurrency,
                                                       temperature=e.temperature, endpoint=e.endpoint), setup)

    progress = EpisodeProgress(f"eval {e.agent}", len(host.task_ids) * k, enabled=cfg.progress)

    async def main():
        try:
            return await play_tasks(setup.factory, host.agent, host.task_ids, k=k, concurrency=e.concurrency,
                                    max_turns=host.max_turns,
                                    on_report=lambda agent, r: progress.done(_solved(r)))
        finally:
            progress.close()
            if host.aclose is not None:
                await host.aclose()

    reports = asyncio.run(main())
    result = host.summarize(reports)
    write_jsonl(run_dir / "episodes.jsonl", reports)
    write_jsonl(run_dir / "tasks.jsonl", result.rows)
    summary = {"name": cfg.name, "job": "eval", "env": cfg.env.kind, "agent": e.agent, "agent_temperature": e.temperature,
               **result.summary, "wall_seconds": time.perf_counter() - t0}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    # The per-task figures stay in the files (summary.json's success_by_task, tasks.jsonl); what is
    # returned (and printed by the launcher) is the summary without them, plus where the files are.
    shown = {k: v for k, v in summary.items() if k != "success_by_task"}
    shown["files"] = {name: str(run_dir / name) for name in ("summary.json", "tasks.jsonl", "episodes.jsonl")}
    if cfg.progress and result.text is not None:
        print(result.text(shown), file=sys.stderr, flush=True)
    return shown


def _solved(report: Mapping[str, Any]) -> bool:
    """A host episode's report counts as solved (reward 1 within 1e-6, tau2's ``is_success``)."""
    return float((report.get("score") or {}).get("reward", 0.0)) >= 1.0 - 1e-6


def write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """One JSON line per row (episode reports with their transcripts, per-task rows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)

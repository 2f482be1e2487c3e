"""The jobs behind ``python -m jaxagent.launch``: build everything from a `RunConfig` and run it.

Host orchestration only; the math lives in `jaxagent.train.step`, `jaxagent.train.rl` and
`jaxagent.credit`. A run writes to ``runs/<name>/``:

- ``config.yaml``: the resolved configuration (of the first launch; each resume adds
  ``config.resume-<n>.yaml``: `jaxagent.jobs.resume`, which also refuses a resume with a changed
  config unless ``resume_overrides`` names the keys, and a launch into another job's run);
- ``metrics.jsonl``: one JSON object per SFT log step, RL iteration and evaluation
  (``{"phase": "sft" | "rl" | "eval", "step": ..., ...}``), appended and flushed as it goes; a
  resume cuts it back to the restored checkpoint first and adds a ``{"phase": "resume", ...}``
  record (the checkpoint it restored, damaged ones it moved aside); a run stopped by
  `TrainingFailed` or `SimulatorFailureBudget` adds a ``{"phase": "failure", ...}`` record;
- ``trajectories/iter_<i>.jsonl``: a sample of each RL iteration's episodes (re-scorable);
- ``checkpoints/{sft,rl}/``: orbax checkpoints (see `jaxagent.train.checkpoint`);
- ``hf/``: the final policy as a Hugging Face checkpoint (with the tokenizer's files);
- ``tb/``: TensorBoard scalars, written as the run goes;
- ``wandb/``, ``wandb_run_id``: with ``log.wandb=true``, the Weights & Biases run (the same scalars,
  a table of sampled episodes per RL iteration, the plots: `jaxagent.jobs.wandb_log`);
- ``plots/``: reward and success, turns and response length, info gain by turn index (heatmap),
  SFT loss (`jaxagent.eval.report`);
- ``summary.json``: ``success_before``, ``success_after``, ``wall_seconds``, ``steps``, ``credit``,
  the InfoPO diagnostics, ... (the values this launch ran with: a resume's ``eval_tasks`` are its own,
  ``config_file`` names its config); job=eval's holds the evaluation's figures only (``success``,
  ``reward``, ``turns``, ``eval_tasks``, ``eval_k``, ``sampled_*``).

Determinism: every random draw of step i (SFT batch, RL tasks, sampling keys) derives from
``(seed, phase, i)``, so a resumed run replays exactly what the uninterrupted run would have done.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import jax

from jaxagent.jobs.build import Run, param_count, prepare, write_export
from jaxagent.jobs.config import RunConfig
from jaxagent.jobs.evaluate import run_eval, run_host_eval
from jaxagent.jobs.phases import run_rl, run_sft
from jaxagent.jobs.registry import job_spec
from jaxagent.jobs.runlog import json_default
from jaxagent.train.step import TrainingFailed


def run_job(cfg: RunConfig) -> dict[str, Any]:
    """Runs ``cfg.job`` (its `JobSpec`'s function, `jaxagent.jobs.registry`) and returns (and
    writes) the summary."""
    return job_spec(cfg.job).function()(cfg)


def run_sft_job(cfg: RunConfig) -> dict[str, Any]:
    """``job=sft``: on ``sft.data`` rows (exported by job=qd_label, no environment) or on the
    environment's demonstrations (`run_policy_job`)."""
    if cfg.sft.data is not None:
        from jaxagent.jobs.offline import run_sft_rows

        return run_sft_rows(cfg)
    return run_policy_job(cfg)


def run_eval_job(cfg: RunConfig) -> dict[str, Any]:
    """``job=eval``: a host agent the environment offers (``eval.agent``: `run_host_eval`), or the
    policy (`run_policy_job`)."""
    if cfg.eval.agent != "policy":
        return run_host_eval(cfg)
    return run_policy_job(cfg)


def run_policy_job(cfg: RunConfig) -> dict[str, Any]:
    """The policy's jobs (sft, rl, sft+rl, eval): evaluated before, trained (SFT, RL), evaluated
    after SFT and after; the summary attributes the gains to the stages."""
    t0 = time.perf_counter()
    run = prepare(cfg)
    before = _previous_eval(run, "before") if cfg.resume else None
    if before is None:  # a random initialisation is not worth sampling (its episodes run to the limits)
        before = run_eval(run, run.params, "before", 0, sampled=cfg.model.path is not None)
    params, steps = run.params, 0
    after_sft = None
    if cfg.job in ("sft", "sft+rl"):
        params = run_sft(run, params)
        steps += cfg.sft.steps
    if cfg.job == "sft+rl":  # the SFT policy alone: the summary attributes gains to SFT and to RL
        after_sft = _previous_eval(run, "after_sft") if cfg.resume else None
        if after_sft is None:
            after_sft = run_eval(run, params, "after_sft", steps)
    if cfg.job in ("rl", "sft+rl"):
        params, rl_steps = run_rl(run, params)
        steps += cfg.steps
    after = run_eval(run, params, "after", steps) if cfg.job != "eval" else before
    if cfg.checkpoint.export_hf and cfg.job != "eval":
        _export(run, params)
    summary = {"name": cfg.name, "job": cfg.job, "gym": cfg.env.gym if cfg.env.kind == "gym" else None,
               "env": cfg.env.kind, "model_params": param_count(params)}
    if cfg.job == "eval":  # an evaluation: its own figures only
        summary.update(evaluation_fields(after))
    else:
        summary.update({"credit": cfg.rl.credit if cfg.job in ("rl", "sft+rl") else None,
                        "success_before": before["success"], "success_after": after["success"],
                        "reward_before": before["reward"], "reward_after": after["reward"],
                        "turns_before": before["turns"], "turns_after": after["turns"],
                        "eval_tasks": after["tasks"], "eval_k": after["k"], "steps": steps})
        if (before["tasks"], before["k"]) != (after["tasks"], after["k"]):  # a resume that changed eval.*
            summary.update(eval_tasks_before=before["tasks"], eval_k_before=before["k"])
        summary.update(attribution(before, after_sft, after, cfg))
    summary.update(wall_seconds=time.perf_counter() - t0, devices=[str(d) for d in jax.devices()])
    if cfg.resume:  # what this launch ran with: the run's newest config file
        from jaxagent.jobs.resume import config_history

        summary["config_file"] = config_history(run.run_dir)[-1].name
    run.log.close(keep_wandb=True)  # log.wandb=true: the W&B run finishes after the plots
    asyncio.run(run.make_env.aclose())  # tau2 retail, LLM users: the HTTP clients
    run.processes.barrier("jaxagent-log-closed")  # a multi-process run: process 0's metrics.jsonl is complete
    from jaxagent.eval import report

    metrics = report.read_metrics(run.run_dir / "metrics.jsonl")
    diag = report.infopo_diagnostics(metrics)
    if cfg.job != "eval":  # training's diagnostics and plots
        summary["diagnostics"] = diag
        if run.processes.is_main:  # process 0 alone writes the plots and the summary
            plots = report.plot_run(metrics, run.run_dir / "plots")
            summary["plots"] = [str(p.relative_to(run.run_dir)) for p in plots]
            run.log.finish_wandb(plots)
    run.log.finish_wandb()  # log.wandb=true: ends the W&B run where no plots did (job=eval); else nothing
    failure = None
    if cfg.job in ("rl", "sft+rl") and cfg.rl.fail_on_collapse and diag.get("collapse"):
        failure = (f"{run.run_dir}: RL collapsed ({'; '.join(diag.get('collapse_reasons') or [])}); the results are "
                   "in summary.json (set rl.fail_on_collapse=false to exit 0 on a collapse)")
        summary["failure"] = failure
    if run.processes.is_main:
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=json_default) + "\n")
    if cfg.progress and run.processes.is_main:
        table = report.eval_table(after) if cfg.job == "eval" else report.summary_table(before, after, after_sft=after_sft)
        print(table, file=sys.stderr, flush=True)
    if failure is not None:
        raise TrainingFailed(failure)
    return summary


def attribution(before: dict[str, Any], after_sft: dict[str, Any] | None, after: dict[str, Any],
                cfg: RunConfig) -> dict[str, Any]:
    """The summary's per-stage figures: success (greedy, and ``sampled_*`` at the training
    temperature when evaluated) after SFT alone, and the gain each stage made: ``gain_sft`` =
    after SFT - before, ``gain_rl`` = after - after SFT (sft+rl), or after - before for the one
    stage of an sft or rl job."""
    out: dict[str, Any] = {}
    stages = {"sft": "sft", "rl": "rl", "sft+rl": None}.get(cfg.job)
    for prefix, key in (("", "success"), ("sampled_", "sampled/success")):
        if key not in after:
            continue
        if prefix:
            out[f"{prefix}success_before"] = before.get(key)
            out[f"{prefix}success_after"] = after[key]
        if after_sft is not None:
            out[f"{prefix}success_after_sft"] = after_sft.get(key)
            out[f"{prefix}gain_sft"] = _diff(after_sft.get(key), before.get(key))
            out[f"{prefix}gain_rl"] = _diff(after[key], after_sft.get(key))
        elif stages is not None:
            out[f"{prefix}gain_{stages}"] = _diff(after[key], before.get(key))
    return out


def evaluation_fields(result: dict[str, Any]) -> dict[str, Any]:
    """A policy evaluation's figures for job=eval's summary: greedy success, reward and turns on
    ``eval_tasks`` tasks, and (when sampled) ``sampled_*`` over ``eval_k`` episodes per task."""
    out = {"success": result["success"], "reward": result["reward"], "turns": result["turns"],
           "eval_tasks": result["tasks"], "eval_k": result["k"]}
    out.update({f"sampled_{k.split('/', 1)[1]}": v for k, v in result.items()
                if k.startswith("sampled/") and not k.endswith("_by_task")})
    return out


def _diff(a, b):
    return None if a is None or b is None else float(a) - float(b)


def _previous_eval(run: Run, label: str) -> dict[str, Any] | None:
    for rec in run.log.read():
        if rec.get("phase") == "eval" and rec.get("label") == label:
            return rec
    return None


def _export(run: Run, params) -> None:
    """The policy as an HF checkpoint in ``hf/``: gathered from every process (a collective in a
    multi-process run), written by process 0."""
    if run.processes.multi:
        from jax.experimental import multihost_utils

        host = multihost_utils.process_allgather(params, tiled=True)
    else:
        host = jax.device_get(params)
    if not run.processes.is_main:
        return
    write_export(run.run_dir, run.cfg, run.qcfg, host)


__all__ = ["attribution", "evaluation_fields", "run_eval_job", "run_job", "run_policy_job", "run_sft_job"]

"""``job=qd_eval``: questioners on a retrieval QA suite, measured from their transcripts (docs/QD.md).

    python -m jaxagent.launch job=qd_eval qd.benchmark=musique qd.questioner=scripted qd.baseline=never_ask

Runs every (task, seed) of ``qd.tasks`` held-out tasks from ``qd.first_task`` under ``qd.seeds``
rollout seeds for the arm ``qd.questioner`` (and, with ``qd.baseline``, for a second arm on the
same tasks and seeds), with the drafter and answerer ``qd.drafter`` / ``qd.answerer`` (the
extractive offline stand-ins by default, named as such in every report). Writes to
``runs/<name>/``:

- ``config.yaml``; ``runs_<arm>.jsonl``: the transcripts (`jaxagent.qd.transcript.QDRun`);
- ``tasks_<arm>.jsonl``: per task (seeds averaged) the readings at its own stop;
- ``summary.json``: per arm the readings of the spec's §5.3 rows (own stop), the stop 2x2 and
  the budget frontier; with a baseline the paired comparison (equal spend, symmetric; own stop)
  with BCa intervals over tasks, the "decided" verdict, the sign-flip p and the minimum
  detectable effect; failed runs counted (and left out);
- ``plots/``: the budget frontier and coverage by depth.

A run whose drafter or answerer kept failing is marked failed, counted and kept out of every
figure; past ``qd.max_failed_share`` of an arm's runs the job stops with a non-zero exit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxagent import configlib
from jaxagent.jobs.config import RunConfig
from jaxagent.qd import agents
from jaxagent.qd.graphs import build_graphs
from jaxagent.qd.loop import LoopConfig, run_suite
from jaxagent.qd.transcript import QDRun, write_runs
from jaxagent.train.step import TrainingFailed


# ----------------------------------------------------------------------------- building the arms
class LocalPolicy:
    """The local policy, built once for every arm that needs it."""

    def __init__(self, cfg: RunConfig):
        from jaxagent.jobs.build import build_engine, build_model, build_tokenizer
        from jaxagent.models import LogicalRules, make_mesh

        self.tok = build_tokenizer(cfg)
        rules = LogicalRules(make_mesh(cfg.mesh))
        self.qcfg, params = build_model(cfg, self.tok, rules)
        self.engine = build_engine(cfg, params, self.qcfg, park_rows=0, vocab_limit=self.tok.vocab_size)
        self.name = f"local:{cfg.model.path}" if cfg.model.path else f"local:{cfg.model.preset} (random init)"


def _arm_models(cfg: RunConfig, arms) -> dict[str, LocalPolicy]:
    """The local policy of each arm that plays one: ``model.*`` for the treatment, and for a
    policy baseline the checkpoint ``qd.baseline_model`` (default: the treatment's own model)."""
    out: dict[str, LocalPolicy] = {}
    for arm, kind, _ in arms:
        if kind != "policy":
            continue
        if arm == "baseline" and cfg.qd.baseline_model is not None:
            out[arm] = LocalPolicy(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=cfg.qd.baseline_model)))
        else:
            out[arm] = out.get("treatment") or LocalPolicy(cfg)
    return out


def make_questioner(cfg: RunConfig, kind: str, endpoint, model: LocalPolicy | None, clients: list):
    """The questioner of an arm: ``kind`` scripted, never_ask, endpoint (a client on ``endpoint``,
    added to ``clients`` for closing) or policy (``model`` through its engine at ``qd.temperature``)."""
    if kind == "scripted":
        return agents.ScriptedQuestioner()
    if kind == "never_ask":
        return agents.NeverAsk()
    if kind == "endpoint":
        from jaxagent.envs.llm_user import LLMUserClient

        clients.append(LLMUserClient(endpoint))
        return agents.EndpointQuestioner(clients[-1])
    from jaxagent.models.generate import SamplingParams

    sampling = SamplingParams(temperature=cfg.qd.temperature, max_new_tokens=cfg.qd.max_new_tokens,
                              stop_tokens=tuple(model.tok.eos_token_ids))
    return agents.PolicyQuestioner(model.engine, model.tok, sampling, name=model.name)


def make_role(kind: str, endpoint, offline, online, clients: list):
    """A drafter or answerer: ``offline()`` for ``kind`` extractive, else ``online(client)`` over a
    client on ``endpoint`` (added to ``clients`` for closing)."""
    if kind == "extractive":
        return offline()
    from jaxagent.envs.llm_user import LLMUserClient

    clients.append(LLMUserClient(endpoint))
    return online(clients[-1])


# ----------------------------------------------------------------------------- the job
def run_qd_eval(cfg: RunConfig) -> dict[str, Any]:
    from jaxagent.eval import qd_report
    from jaxagent.jobs.resume import checked_run_dir, record_config

    t0 = time.perf_counter()
    q = cfg.qd
    run_dir = checked_run_dir(cfg)
    try:
        pairs = build_graphs(q.benchmark, q.file, q.paragraphs)
    except ValueError as e:
        raise configlib.ConfigError(f"qd.file={q.file!r} (qd.benchmark={q.benchmark!r}): {e}") from None
    pairs = pairs[q.first_task : q.first_task + q.tasks]
    if not pairs:
        raise configlib.ConfigError(f"qd.first_task={q.first_task}: past the suite's end; expected a smaller "
                                    "first_task (or another qd.file)")
    record_config(cfg, run_dir)
    tasks = [t for t, _ in pairs]
    graphs = {t.task_id: g for t, g in pairs}
    by_id = {t.task_id: t for t in tasks}
    arms = [("treatment", q.questioner, q.questioner_endpoint)]
    if q.baseline != "none":
        arms.append(("baseline", q.baseline, q.baseline_endpoint))
    models = _arm_models(cfg, arms)
    tok = next(iter(models.values())).tok if models else None
    count = (lambda s: len(tok.encode(s))) if tok is not None else None  # question tokens, one tokenizer
    clients: list = []
    drafter = make_role(q.drafter, q.drafter_endpoint, agents.ExtractiveDrafter, agents.EndpointDrafter, clients)
    answerer = make_role(q.answerer, q.answerer_endpoint, agents.ExtractiveAnswerer, agents.EndpointAnswerer, clients)
    loop_cfg = LoopConfig(cap=q.cap, max_turns=q.max_turns, retries=q.retries)
    seeds = list(range(q.seeds))
    summary: dict[str, Any] = {
        "name": cfg.name, "job": "qd_eval", "benchmark": q.benchmark, "file": q.file or "(shipped)",
        "tasks": len(tasks), "first_task": q.first_task, "seeds": seeds, "cap": q.cap, "max_turns": q.max_turns,
        "depth_rule": q.depth_rule, "drafter": agents.describe(drafter), "answerer": agents.describe(answerer),
        "unscorable_tasks": sum(not g.scorable for g in graphs.values()), "arms": {}}
    all_runs: dict[str, list[QDRun]] = {}
    try:
        for arm, kind, endpoint in arms:
            questioner = make_questioner(cfg, kind, endpoint, models.get(arm), clients)
            runs = _play(cfg, arm, questioner, tasks, drafter, answerer, seeds, loop_cfg, count)
            write_runs(runs, run_dir / f"runs_{arm}.jsonl")
            failed = [r for r in runs if r.failed]
            kept = [r for r in runs if not r.failed]
            all_runs[arm] = kept
            readings = qd_report.arm_summary(kept, graphs, tasks=by_id, depth_rule=q.depth_rule,
                                              frontier_caps=q.frontier_caps)
            readings.update(questioner=agents.describe(questioner), runs=len(runs), failed_runs=len(failed),
                            failure_examples=[r.error for r in failed[:3]])
            summary["arms"][arm] = readings
            write_finite_jsonl(run_dir / f"tasks_{arm}.jsonl",
                         qd_report.per_task(kept, graphs, tasks=by_id, depth_rule=q.depth_rule))
            if runs and len(failed) > q.max_failed_share * len(runs):
                summary["failure"] = (f"arm {arm}: {len(failed)} of {len(runs)} runs failed (questioner, drafter or "
                                      f"answerer calls after qd.retries={q.retries}), over qd.max_failed_share="
                                      f"{q.max_failed_share}; first: {failed[0].error}")
                break
    finally:
        async def close():
            for c in clients:
                await c.aclose()

        asyncio.run(close())
    if "baseline" in all_runs and "failure" not in summary:
        summary["comparison"] = qd_report.compare(all_runs["treatment"], all_runs["baseline"], graphs, tasks=by_id,
                                                  depth_rule=q.depth_rule, resamples=q.bootstrap, seed=cfg.seed,
                                                  variant=q.equal_spend)
    summary["plots"] = [str(p.relative_to(run_dir)) for p in qd_report.plot(summary, run_dir / "plots")]
    summary["wall_seconds"] = time.perf_counter() - t0
    (run_dir / "summary.json").write_text(json.dumps(_finite(summary), indent=2, default=_json) + "\n")
    # the results table and where the files are, also with progress=false (only the live lines go)
    print(qd_report.summary_table(summary), file=sys.stderr, flush=True)
    print(f"qd_eval: results in {run_dir} (summary.json, tasks_<arm>.jsonl, runs_<arm>.jsonl, plots/)",
          file=sys.stderr, flush=True)
    if "failure" in summary:
        raise TrainingFailed(summary["failure"])
    return summary


def _play(cfg: RunConfig, arm: str, questioner, tasks, drafter, answerer, seeds: Sequence[int], loop_cfg: LoopConfig,
          count) -> list[QDRun]:
    total = len(tasks) * len(seeds)
    done = {"n": 0}
    bar = None
    if cfg.progress and sys.stderr.isatty():
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=f"qd {arm} ({agents.describe(questioner)})", file=sys.stderr, dynamic_ncols=True)

    def on_done(run: QDRun) -> None:
        done["n"] += 1
        if bar is not None:
            bar.update(1)
        elif cfg.progress and (done["n"] % max(1, total // 10) == 0 or done["n"] == total):
            print(f"[qd {arm}] {done['n']}/{total} runs", file=sys.stderr, flush=True)

    try:
        return asyncio.run(run_suite(tasks, questioner, drafter, answerer, seeds=seeds,
                                     key=jax.random.key(cfg.seed), config=loop_cfg,
                                     concurrency=cfg.qd.concurrency, count_tokens=count, on_done=on_done))
    finally:
        if bar is not None:
            bar.close()


def write_finite_jsonl(path: Path, rows) -> None:
    """One JSON line per row, non-finite floats as null, numpy scalars and dataclasses converted."""
    with path.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(_finite(r), default=_json) + "\n" for r in rows)


def _finite(x):
    """``x`` with every non-finite float as None (JSON has no NaN; an undefined reading is null)."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def _json(x):
    if isinstance(x, np.generic):
        return x.item()
    if dataclasses.is_dataclass(x):
        return dataclasses.asdict(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


__all__ = ["LocalPolicy", "make_questioner", "make_role", "run_qd_eval", "write_finite_jsonl"]

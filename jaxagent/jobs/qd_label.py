"""``job=qd_label``: fork the policy's runs on training tasks and label each candidate by its
consequences (the Q&D spec's §4.1-§4.5; docs/QD.md).

    python -m jaxagent.launch job=qd_label qd.benchmark=synthetic qd.file=tasks.json qd.questioner=policy \\
        model.path=runs/warm/hf qd.first_task=0 qd.tasks=64

Plays the parents (``qd.questioner`` on ``qd.tasks`` tasks from ``qd.first_task``, ``qd.seeds``
rollout seeds, the evaluation caps), forks every decision point where a parent asked into
``qd.forks`` candidates continued to the end (`jaxagent.qd.forks`), and labels the states
(`jaxagent.qd.labels`). Writes to ``runs/<name>/``:

- ``parents.jsonl`` (the parents' transcripts), ``states.jsonl`` (every forked state with its
  candidates' actions, values and episode labels), ``candidates.jsonl`` (every candidate's run);
- ``sft.jsonl`` (stage-1 rows, §4.3), ``pairs.jsonl`` (every kept pair, §4.4-§4.5; the stage
  filters pick from it), ``decisions.jsonl`` (every decision of the parents as a row, unfiltered:
  a warm start that teaches the action format);
- ``summary.json``: counts of rows and pairs by kind and reason, of dropped states and pairs by
  reason, of parents and states (failed, unscorable), and the stage-2 / stage-3 pair counts.

A labelling that yields no row and no pair cannot train anything: the job stops with a non-zero
exit naming the counts. Parents or candidates whose role calls kept failing are counted and left
out; past ``qd.max_failed_share`` of the parents the job stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections import Counter
from typing import Any

import jax

from jaxagent import configlib
from jaxagent.jobs.config import RunConfig
from jaxagent.jobs.qd_eval import LocalPolicy, make_questioner, make_role, write_finite_jsonl
from jaxagent.qd import agents, labels
from jaxagent.qd.forks import fork_suite
from jaxagent.qd.graphs import build_graphs
from jaxagent.qd.loop import LoopConfig, decision_prompts, run_suite
from jaxagent.qd.prompts import parse_action
from jaxagent.qd.transcript import QDRun, write_runs
from jaxagent.train.step import TrainingFailed


def _counts(c: Counter) -> dict[str, int]:
    return {("/".join(map(str, k)) if isinstance(k, tuple) else str(k)): v for k, v in sorted(c.items(), key=str)}


def decision_rows(runs: list[QDRun], tasks: dict[str, Any]) -> list[labels.SFTRow]:
    """Every decision of ``runs`` as an SFT row (its canonical target), weight 1, reason
    ``parent``: what the questioner did, unfiltered (a warm start for the action format)."""
    out = []
    for run in runs:
        if run.failed:
            continue
        task = tasks[run.task_id]
        for t, (prompt, raw) in enumerate(decision_prompts(run, task)):
            a = parse_action(raw)
            cand = labels.Candidate(index=0, seed=run.seed, action="ask" if a.kind == "ask" else "stop",
                                    question=a.question, rationale=a.rationale, raw=raw, malformed=a.malformed)
            out.append(labels.SFTRow(state_id=f"{run.benchmark}/{run.task_id}/seed{run.seed}/t{t}",
                                     benchmark=run.benchmark, task_id=run.task_id,
                                     kind="ASK" if cand.action == "ask" else "STOP", reason="parent", prompt=prompt,
                                     completion=labels.canonical_target(cand), weight=1.0, value=0.0, phi_gain=0.0))
    return out


def run_qd_label(cfg: RunConfig) -> dict[str, Any]:
    from jaxagent.jobs.resume import checked_run_dir, record_config

    t0 = time.perf_counter()
    q = cfg.qd
    run_dir = checked_run_dir(cfg)
    try:
        suite = build_graphs(q.benchmark, q.file, q.paragraphs)
    except ValueError as e:
        raise configlib.ConfigError(f"qd.file={q.file!r} (qd.benchmark={q.benchmark!r}): {e}") from None
    suite = suite[q.first_task : q.first_task + q.tasks]
    if not suite:
        raise configlib.ConfigError(f"qd.first_task={q.first_task}: past the suite's end; expected a smaller "
                                    "first_task (or another qd.file)")
    record_config(cfg, run_dir)
    tasks = {t.task_id: t for t, _ in suite}
    graphs = {t.task_id: g for t, g in suite}
    model = LocalPolicy(cfg) if q.questioner == "policy" else None
    count = (lambda s: len(model.tok.encode(s))) if model is not None else None
    clients: list = []
    drafter = make_role(q.drafter, q.drafter_endpoint, agents.ExtractiveDrafter, agents.EndpointDrafter, clients)
    answerer = make_role(q.answerer, q.answerer_endpoint, agents.ExtractiveAnswerer, agents.EndpointAnswerer, clients)
    questioner = make_questioner(cfg, q.questioner, q.questioner_endpoint, model, clients)
    loop_cfg = LoopConfig(cap=q.cap, max_turns=q.max_turns, retries=q.retries)
    key = jax.random.key(cfg.seed)  # the parents' key: candidate 0 of every fork replays its parent
    progress = {"states": 0}

    def on_state(state, runs) -> None:
        progress["states"] += 1
        if cfg.progress and progress["states"] % 25 == 0:
            print(f"[qd_label] {progress['states']} states forked", file=sys.stderr, flush=True)

    async def play():
        try:
            parents = await run_suite(list(tasks.values()), questioner, drafter, answerer, seeds=list(range(q.seeds)),
                                      key=key, config=loop_cfg, concurrency=q.concurrency, count_tokens=count)
            failed = sum(r.failed for r in parents)
            if parents and failed > q.max_failed_share * len(parents):
                first = next(r.error for r in parents if r.failed)
                raise TrainingFailed(f"{failed} of {len(parents)} parent runs failed (role calls after qd.retries="
                                     f"{q.retries}), over qd.max_failed_share={q.max_failed_share}; first: {first}")
            cand_runs: list[QDRun] = []

            def keep(state, runs):
                cand_runs.extend(runs)
                on_state(state, runs)

            states, counts = await fork_suite(parents, tasks, graphs, questioner, drafter, answerer, key=key,
                                              config=loop_cfg, n=q.forks, concurrency=q.concurrency,
                                              count_tokens=count, on_state=keep)
            return parents, states, counts, cand_runs
        finally:
            for c in clients:
                await c.aclose()

    parents, states, fork_counts, cand_runs = asyncio.run(play())
    rows, row_counts = labels.sft_rows(states, floor=q.floor)
    pairs, pair_counts = labels.pairs(states, floor=q.floor, max_pairs=q.max_pairs, max_len_delta=q.max_len_delta)
    warm = decision_rows(parents, tasks)
    write_runs(parents, run_dir / "parents.jsonl")
    write_runs(cand_runs, run_dir / "candidates.jsonl")
    write_finite_jsonl(run_dir / "states.jsonl", [dataclasses.asdict(s) | {"state_id": s.state_id} for s in states])
    labels.write_jsonl(run_dir / "sft.jsonl", rows)
    labels.write_jsonl(run_dir / "pairs.jsonl", pairs)
    labels.write_jsonl(run_dir / "decisions.jsonl", warm)
    summary: dict[str, Any] = {
        "name": cfg.name, "job": "qd_label", "benchmark": q.benchmark, "file": q.file or "(shipped)",
        "tasks": len(tasks), "first_task": q.first_task, "seeds": q.seeds, "forks": q.forks, "floor": q.floor,
        "questioner": agents.describe(questioner), "drafter": agents.describe(drafter),
        "answerer": agents.describe(answerer), "cap": q.cap, "max_turns": q.max_turns,
        "forking": _counts(fork_counts), "sft_rows": len(rows), "sft": _counts(row_counts), "pairs": len(pairs),
        "pair_counts": _counts(pair_counts),
        "stage2_pairs": len(labels.stage_pairs(pairs, 2)), "stage3_pairs": len(labels.stage_pairs(pairs, 3)),
        "decision_rows": len(warm), "wall_seconds": time.perf_counter() - t0,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.progress:
        print(label_table(summary), file=sys.stderr, flush=True)
    if not rows and not pairs:
        raise TrainingFailed(f"{run_dir}: the labelling kept no SFT row and no pair (forking {summary['forking']}; "
                             f"rows {summary['sft']}; pairs {summary['pair_counts']}): nothing to train on; a "
                             "questioner whose candidates all act alike (greedy, or the scripted one) makes no pairs, "
                             "and states below qd.floor make no rows")
    return summary


def label_table(summary: dict[str, Any]) -> str:
    """The counts of a labelling as printed lines (kind and reason, dropped ones included)."""
    lines = [f"qd_label {summary['benchmark']}: {summary['tasks']} tasks x {summary['seeds']} seeds, "
             f"{summary['forks']} candidates per state, floor {summary['floor']}"]
    lines.append("  forking: " + ", ".join(f"{k} {v}" for k, v in summary["forking"].items()))
    lines.append(f"  sft rows {summary['sft_rows']}: " + ", ".join(f"{k} {v}" for k, v in summary["sft"].items()))
    lines.append(f"  pairs {summary['pairs']} (stage 2: {summary['stage2_pairs']}, stage 3: {summary['stage3_pairs']}): "
                 + ", ".join(f"{k} {v}" for k, v in summary["pair_counts"].items()))
    lines.append(f"  decision rows (warm start) {summary['decision_rows']}")
    return "\n".join(lines)


__all__ = ["decision_rows", "label_table", "run_qd_label"]

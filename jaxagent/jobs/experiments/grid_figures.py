"""The credit grid's figures and paired statistics: `run_figures` reads one RL run's figures from its
metrics records (training and held-out success, the final per-task success, steps to threshold), `collect`
gathers them for the finished runs of the grid, and `compare` sets each condition against the baseline
(paired bootstrap intervals of the difference in final held-out success over (seed, task) pairs,
`success_pairs`, and in steps to threshold over seeds, a censored run counted as `censored_steps`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxagent.eval.stats import paired_bootstrap, steps_to_threshold
from jaxagent.jobs.experiments.grid_runs import BASELINE, CONDITIONS, rl_name


# ----------------------------------------------------------------------------- reading a run
def _last_per_key(records: Sequence[Mapping[str, Any]], phase: str) -> list[Mapping[str, Any]]:
    """A phase's records, the last one per step (per (step, label) for evaluations), by step."""
    last: dict[Any, Mapping[str, Any]] = {}
    for rec in records:
        if rec.get("phase") == phase:
            last[(rec.get("step"), rec.get("label")) if phase == "eval" else rec.get("step")] = rec
    return sorted(last.values(), key=lambda r: (r.get("step", 0), r.get("label") == "after"))


def run_figures(records: Sequence[Mapping[str, Any]], *, threshold: float, threshold_on: str = "eval",
                rl_steps: int | None = None) -> dict[str, Any]:
    """The figures of one RL run from its metrics records (`jaxagent.eval.report.read_metrics`):
    ``train_success`` [(iteration, success)], ``eval_success`` [(iterations done, success, label)],
    ``before``/``final`` held-out success, ``final_by_task`` {task: success}, ``steps`` (RL
    iterations: ``rl_steps`` or the final evaluation's step), ``steps_to_threshold`` (None:
    censored)."""
    rl = _last_per_key(records, "rl")
    ev = _last_per_key(records, "eval")
    after = [r for r in ev if r.get("label") == "after"]
    before = [r for r in ev if r.get("label") == "before"]
    final = after[-1] if after else None
    steps = rl_steps if rl_steps is not None else (int(final["step"]) if final else len(rl))
    train = [(int(r["step"]), r.get("success")) for r in rl]
    evals = [(int(r["step"]), r.get("success"), r.get("label")) for r in ev]
    if threshold_on == "eval":
        hit = steps_to_threshold([(s, v) for s, v, _ in evals], threshold)
    elif threshold_on == "train":
        hit = steps_to_threshold(train, threshold)
    else:
        raise ValueError(f"threshold_on={threshold_on!r}: expected 'eval' or 'train'")
    return {
        "steps": steps,
        "train_success": train,
        "eval_success": evals,
        "before": before[-1].get("success") if before else None,
        "final": final.get("success") if final else None,
        "final_reward": final.get("reward") if final else None,
        "final_by_task": dict(final.get("success_by_task") or {}) if final else {},
        "steps_to_threshold": hit,
    }


# ----------------------------------------------------------------------------- comparisons
def success_pairs(runs: Mapping[int, Mapping[str, Any]], base: Mapping[int, Mapping[str, Any]]
                  ) -> tuple[list[float], list[float], str]:
    """Paired final successes of a condition (``runs``: seed -> figures) and the baseline over the
    seeds both have: per (seed, held-out task) when every run logged ``success_by_task``, else per
    seed. Returns (a, b, unit)."""
    seeds = sorted(set(runs) & set(base))
    if seeds and all(runs[s]["final_by_task"] and base[s]["final_by_task"] for s in seeds):
        a, b = [], []
        for s in seeds:
            for task in sorted(set(runs[s]["final_by_task"]) & set(base[s]["final_by_task"])):
                a.append(runs[s]["final_by_task"][task])
                b.append(base[s]["final_by_task"][task])
        return a, b, "(seed, task)"
    return [runs[s]["final"] for s in seeds], [base[s]["final"] for s in seeds], "seed"


def censored_steps(fig: Mapping[str, Any]) -> int:
    """Steps to threshold with a censored run counted as ``steps + 1``."""
    return fig["steps"] + 1 if fig["steps_to_threshold"] is None else fig["steps_to_threshold"]


def compare(by_cond: Mapping[str, Mapping[int, Mapping[str, Any]]], *, n_boot: int = 10_000, seed: int = 0,
            baseline: str = BASELINE) -> dict[str, dict[str, Any]]:
    """Each condition vs ``baseline`` (``by_cond``: condition -> seed -> `run_figures`)."""
    out: dict[str, dict[str, Any]] = {}
    base = by_cond.get(baseline, {})
    for i, (cond, runs) in enumerate(by_cond.items()):
        if cond == baseline or not runs or not base:
            continue
        # a condition's resamples do not depend on which other conditions are in the grid
        rng = np.random.default_rng([seed, list(CONDITIONS).index(cond) if cond in CONDITIONS else 100 + i])
        seeds = sorted(set(runs) & set(base))
        if not seeds:
            continue
        a, b, unit = success_pairs(runs, base)
        diff, lo, hi = paired_bootstrap(a, b, n=n_boot, rng=rng)
        sa = [censored_steps(runs[s]) for s in seeds]
        sb = [censored_steps(base[s]) for s in seeds]
        n_cens = sum(runs[s]["steps_to_threshold"] is None for s in seeds)
        n_cens_b = sum(base[s]["steps_to_threshold"] is None for s in seeds)
        if n_cens == n_cens_b == len(seeds):
            steps = None  # nothing to compare: no run of either reached the threshold
        else:
            steps = dict(zip(("diff", "lo", "hi"), paired_bootstrap(sa, sb, n=n_boot, rng=rng)),
                         censored=n_cens + n_cens_b)
        out[cond] = {"success": {"diff": diff, "lo": lo, "hi": hi, "unit": unit, "pairs": len(a)},
                     "steps": steps, "seeds": seeds}
    return out


# ----------------------------------------------------------------------------- the finished runs
def collect(*, gyms, seeds, conditions, runs_dir: str, prefix: str, threshold: float, threshold_on: str
            ) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    """gym -> condition -> seed -> figures (+ name, wall_seconds), for the runs that finished."""
    from jaxagent.eval.report import read_metrics

    out: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for g in gyms:
        for c in conditions:
            for s in seeds:
                run_dir = Path(runs_dir) / rl_name(prefix, g, s, c)
                if not (run_dir / "summary.json").exists():
                    continue
                summary = json.loads((run_dir / "summary.json").read_text())
                fig = run_figures(read_metrics(run_dir / "metrics.jsonl"), threshold=threshold,
                                  threshold_on=threshold_on, rl_steps=int(summary["steps"]))
                fig.update(name=run_dir.name, wall_seconds=summary.get("wall_seconds"))
                out.setdefault(g, {}).setdefault(c, {})[s] = fig
    return out

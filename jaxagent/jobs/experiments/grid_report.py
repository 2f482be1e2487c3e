"""The credit grid's results document: one table per gym (`gym_table`), the "what we see" sentences stated
from the numbers alone (`what_we_see`), the machine the grid ran on (`machine`: platform, CPUs, Python, jax
and its backend, the git commit) and `write_results`, which writes the Markdown report (docs/RESULTS.md by
default) with the command, the design and the intervals it used: between two markers, so that
the hand-written sections around them survive a rerun (`replace_generated`).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxagent.jobs.experiments.grid_runs import BASELINE, ROOT


def _f(v: float | None, spec: str = ".2f", sign: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, ("+" if sign else "") + spec)


def _interval(d: Mapping[str, Any] | None, spec: str) -> str:
    if d is None:
        return "n/a (no run reached it)"
    s = f"{_f(d['diff'], spec, True)} [{_f(d['lo'], spec, True)}, {_f(d['hi'], spec, True)}]"
    return s + (" *" if d.get("censored") else "")


def gym_table(by_cond: Mapping[str, Mapping[int, Mapping[str, Any]]], comps: Mapping[str, Mapping[str, Any]],
              threshold: float) -> str:
    seeds = sorted({s for runs in by_cond.values() for s in runs})
    rows = ["| condition | final success (mean) | per seed (" + ", ".join(f"s{s}" for s in seeds) + ") "
            f"| Δ final vs grpo [95% CI] | steps to ≥{threshold:g} per seed "
            "| Δ steps vs grpo [95% CI] | wall s (mean) |",
            "|---|---:|---|---|---|---|---:|"]
    for cond, runs in by_cond.items():
        finals = [runs[s]["final"] for s in seeds if s in runs]
        walls = [runs[s]["wall_seconds"] for s in seeds if s in runs and runs[s].get("wall_seconds") is not None]
        per_seed = ", ".join(_f(runs[s]["final"]) if s in runs else "-" for s in seeds)
        hits = ", ".join(("-" if s not in runs else str(runs[s]["steps_to_threshold"])
                          if runs[s]["steps_to_threshold"] is not None else f">{runs[s]['steps']}") for s in seeds)
        c = comps.get(cond)
        d_succ = "(baseline)" if cond == BASELINE else (_interval(c["success"], ".3f") if c else "-")
        d_steps = "(baseline)" if cond == BASELINE else (_interval(c["steps"], ".1f") if c else "-")
        rows.append(f"| {cond} | {_f(float(np.mean(finals)) if finals else None, '.3f')} | {per_seed} | {d_succ} "
                    f"| {hits} | {d_steps} | {_f(float(np.mean(walls)) if walls else None, '.0f')} |")
    return "\n".join(rows)


def what_we_see(gym: str, by_cond, comps, threshold: float) -> str:
    """A few sentences stated from the numbers only (no judgement beyond the intervals)."""
    if not by_cond:
        return f"{gym}: no finished runs."
    starts = [f["before"] for runs in by_cond.values() for f in runs.values() if f["before"] is not None]
    parts = []
    if starts:
        span = _f(min(starts), ".3f") + ("" if min(starts) == max(starts) else f"-{_f(max(starts), '.3f')}")
        parts.append(f"the SFT warm start{'s score' if len(set(starts)) > 1 else ' scores'} {span} held-out success "
                     "before RL")
    base = by_cond.get(BASELINE)
    if base:
        parts.append(f"GRPO ends at {_f(float(np.mean([f['final'] for f in base.values()])), '.3f')} "
                     f"(mean of {len(base)} seeds)")
    above = [c for c, d in comps.items() if d["success"]["lo"] > 0]
    below = [c for c, d in comps.items() if d["success"]["hi"] < 0]
    span = [c for c in comps if c not in above and c not in below]
    if comps:
        parts.append("final success above GRPO with the 95% interval excluding 0: "
                     + (", ".join(above) or "none"))
        parts.append("below GRPO likewise: " + (", ".join(below) or "none"))
        parts.append("interval includes 0: " + (", ".join(span) or "none"))
    n_runs = sum(len(r) for r in by_cond.values())
    n_hit = sum(f["steps_to_threshold"] is not None for r in by_cond.values() for f in r.values())
    parts.append(f"{n_hit} of {n_runs} runs reached success ≥ {threshold:g}")
    return f"**{gym}**: " + "; ".join(parts) + "."


def machine() -> dict[str, Any]:
    import jax

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10,
                                  check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(), "jax": jax.__version__,
            "backend": jax.default_backend(), "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def write_results(path: Path, *, command: str, info: Mapping[str, Any], overrides: Sequence[str],
                  args: argparse.Namespace, data, comps, failed: Sequence[str]) -> None:
    dirty = " (with uncommitted changes)" if info["dirty"] else ""
    config = ("the quickstart defaults (`jaxagent/jobs/config.py`)"
              + (f", `--config {args.config}`" if args.config else ""))
    config += (", overrides `" + " ".join(overrides) + "`") if overrides else ", no overrides"
    wall = ("; with a shared JAX compilation cache, so runs after the first of a shape skip compiling"
            if args.compile_cache else "; every run compiles its own programs")
    lines = [
        "# Results: credit assignment compared",
        "",
        ("Written by `scripts/compare_credit.py` (see its docstring for the design); regenerate with the "
         "command below. Every number here comes from the runs it names."),
        "",
        "```bash", command, "```",
        "",
        f"- Date: {info['date']}",
        (f"- Machine: {info['platform']}, {info['processor']}, {info['cpu_count']} CPUs; Python {info['python']}, "
         f"jax {info['jax']} ({info['backend']}); commit {info['commit']}{dirty}"),
        (f"- Gyms: {', '.join(args.gyms)}; seeds: {', '.join(map(str, args.seeds))}; "
         f"conditions: {', '.join(args.conditions)}"),
        f"- Config: {config}",
        ("- Design: per (gym, seed) one SFT warm start (`job=sft`, evaluated on 1 task) shared by every condition "
         "(`job=rl` from its HF export, same seed: same RL tasks, sampling keys and held-out tasks)"),
        (f"- Steps to threshold: RL iterations done when the {args.threshold_on} success first reached "
         f"{args.threshold:g} (`>N`: not within the N iterations run); differences count such a run as N+1 "
         "(marked *: a bound, not an estimate)"),
        (f"- Intervals: paired percentile bootstrap, {args.bootstrap} resamples, 95%; final success resamples "
         "(seed, held-out task) pairs, steps resample seeds; Δ = condition - grpo (negative steps: faster)"),
        f"- Wall: `summary.json` wall_seconds of each RL run (its process start-up excluded){wall}",
        "",
    ]
    for g in args.gyms:
        by_cond = data.get(g, {})
        lines += [f"## {g}", "", gym_table(by_cond, comps.get(g, {}), args.threshold) if by_cond else "(no runs)", ""]
    lines += ["## What we see", "", "Generated from the tables above, nothing else:", ""]
    lines += [what_we_see(g, data.get(g, {}), comps.get(g, {}), args.threshold) for g in args.gyms]
    if failed:
        lines += ["", "Runs that did not finish (left out of the tables): " + ", ".join(failed) + "."]
    replace_generated(path, "\n".join(lines) + "\n")


#: The markers around the generated part of a report that also holds hand-written sections.
BEGIN, END = "<!-- compare_credit: generated from here -->", "<!-- compare_credit: generated up to here -->"


def replace_generated(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` between `BEGIN` and `END`: where the file exists and holds both
    markers, only what lies between them is replaced (the hand-written sections around it stay);
    otherwise the file is written whole, with the markers."""
    block = f"{BEGIN}\n{text}{END}\n"
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    i, j = old.find(BEGIN), old.find(END)
    if 0 <= i < j:
        block = old[:i] + block + old[j + len(END):].removeprefix("\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block, encoding="utf-8")

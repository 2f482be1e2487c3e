"""The credit methods compared where their mechanisms are active (``scripts/bench_credit.py``).

A *setting* is a config file (``configs/<setting>.yaml``: the gym, a binary outcome, the episode
limits, the SFT warm start and the RL settings) and the conditions compared there. For every seed
one SFT warm start is shared by the setting's conditions (`credit_grid`'s machinery: one process
per job, finished runs reused, a changed config refused), so every difference is paired per
(seed, held-out task):

- ``infopo_telepathy``: telepathy, where the answers are the information (a question halves the
  candidates; success needs all 7 answers). Conditions: ``grpo``, ``control`` (lr = 0),
  ``infopo`` (as the paper defines it), ``infopo/reference`` (as its reference code runs it),
  ``infopo/marginal`` (the marginal prior), ``infopo/no-ext`` (the info term alone); with
  ``--all`` also ``infopo/in-vocab``, ``infopo/no-corrections``, ``infopo/no-gate``,
  ``infopo/no-std``.
- ``faca_intention``: intention with a binary outcome, where the user's reactions differ inside
  failing groups. Conditions: ``grpo``, ``control``, ``faca``, ``faca/random``, ``faca/reversed``;
  with ``--all`` also ``faca/shifted``.

    python3 scripts/bench_credit.py --setting infopo_telepathy            # seeds 0,1,2
    python3 scripts/bench_credit.py --setting faca_intention --seeds 0 steps=4   # a quick look
    python3 scripts/bench_credit.py --setting infopo_telepathy --report-only --markdown table.md

Output: progress on stderr, then one JSON line: the setting, ``all_zero_group_share`` (GRPO's
groups whose outcomes are all 0, at the warm start: the first iteration's rollouts), with Faca
``nonconstant_reaction_cell_share`` (the first iteration's share of (group, segment) cells whose
reactions differ), and per condition c (its name with ``/`` and ``+`` as ``_``):
``<c>_minus_grpo`` and ``<c>_minus_grpo_ci95`` (held-out success at the training temperature,
paired BCa over (seed, task)), the same against ``control``, and ``conditions``: per condition
its success gains (sampled and greedy), steps to `Setting.threshold` (training success smoothed
over `rl_learns.SMOOTH` iterations; censored runs count as iterations + 1), and the run means of
the diagnostics in `DIAGNOSTIC_KEYS` (credit coverage, all-zero groups, the ``why/*`` figures of
`jaxagent.train.why`). ``--markdown PATH`` also writes the comparison as a Markdown table
(`markdown_table`, from the JSON line's figures alone: the table docs/RESULTS.md quotes).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxagent.eval.stats import percentile_interval
from jaxagent.jobs.experiments import credit_grid as cc
from jaxagent.jobs.experiments.rl_learns import paired, run_records, steps_to_threshold


@dataclasses.dataclass(frozen=True)
class Setting:
    """A comparison: its config file (relative to the repository), gym, conditions (``extra``: with
    ``--all``) and the training-success threshold of steps-to-threshold."""

    config: str
    gym: str
    conditions: tuple[str, ...]
    extra: tuple[str, ...] = ()
    threshold: float = 0.5


SETTINGS: dict[str, Setting] = {
    "infopo_telepathy": Setting("configs/infopo_telepathy.yaml", "telepathy",
                                ("grpo", "control", "infopo", "infopo/reference", "infopo/marginal", "infopo/no-ext"),
                                ("infopo/in-vocab", "infopo/no-corrections", "infopo/no-gate", "infopo/no-std"),
                                threshold=0.3),
    "faca_intention": Setting("configs/faca_intention.yaml", "intention",
                              ("grpo", "control", "faca", "faca/random", "faca/reversed"), ("faca/shifted",),
                              threshold=0.5),
}
#: Per-iteration metrics averaged over a run (NaN-free iterations only).
DIAGNOSTIC_KEYS = ("credit/all_zero_group_share", "credit/zero_adv_group_share", "credit/cover/ext",
                   "credit/cover/info", "credit/cover/proc", "faca/nonconstant_cell_share", "info/gain_mean",
                   "info/magnitude_ratio", "info/valid_turn_share", "feedback/correction_share",
                   "why/info_partial_corr", "why/proc_partial_corr", "why/r_info/information",
                   "why/r_info/correction", "why/A_info/information", "why/A_info/correction",
                   "why/A_info_pos_share/correction", "time/credit_s")


def log(msg: str) -> None:
    print(f"[bench_credit] {msg}", file=sys.stderr, flush=True)


def key_of(condition: str) -> str:
    return condition.replace("/", "_").replace("+", "_").replace("-", "_")


def run_mean(rl: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rl if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
    return float(np.mean(vals)) if vals else None


def first_iteration(runs: Mapping[int, Mapping[str, Any]], cond: str, key: str) -> float | None:
    """The mean over seeds of ``key`` in ``cond``'s first RL iteration (the warm start's rollouts)."""
    vals = [r[cond]["rl"][0].get(key) for r in runs.values() if cond in r and r[cond]["rl"]]
    vals = [float(v) for v in vals if isinstance(v, (int, float))]
    return float(np.mean(vals)) if vals else None


def _steps(rl: Sequence[Mapping[str, Any]], threshold: float) -> int:
    """Iterations to ``threshold`` (`steps_to_threshold`); a censored run counts as iterations + 1."""
    hit = steps_to_threshold(rl, threshold)
    return len(rl) + 1 if hit is None else hit


def condition_table(runs: Mapping[int, Mapping[str, Any]], conditions: Sequence[str], setting: Setting, *,
                    n_boot: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    steps = {c: {s: _steps(r[c]["rl"], setting.threshold) for s, r in runs.items() if c in r} for c in conditions}
    for c in conditions:
        row: dict[str, Any] = {"seeds": sorted(steps[c])}
        for base in ("grpo", "control"):
            if base == c:
                continue
            for name, key in (("success", "sampled/success_by_task"), ("greedy_success", "success_by_task")):
                p = paired(runs, key, n_boot=n_boot, cond=c, base=base)
                row[f"{name}_vs_{base}"] = p and {"gain": p["gain"], "ci95": p["ci95"], "pairs": p["pairs"],
                                                  "per_seed": p["per_seed"]}
        row["success_after"] = float(np.mean([(r[c]["after"] or {}).get("sampled/success", np.nan)
                                              for r in runs.values() if c in r])) if steps[c] else None
        row["steps_to_threshold"] = steps[c]
        common = [s for s in steps[c] if s in steps.get("grpo", {})]
        if c != "grpo" and common:
            d = [steps[c][s] - steps["grpo"][s] for s in common]
            row["steps_vs_grpo"] = {"gain": float(np.mean(d)), "per_seed": dict(zip(common, d)),
                                    "ci95": list(percentile_interval(d, n=n_boot)) if len(d) > 1 else [d[0], d[0]]}
        for k in DIAGNOSTIC_KEYS:
            vals = [run_mean(r[c]["rl"], k) for r in runs.values() if c in r]
            vals = [v for v in vals if v is not None]
            row[k] = float(np.mean(vals)) if vals else None
        out[c] = row
    return out


def summarize(runs: Mapping[int, Mapping[str, Any]], conditions: Sequence[str], setting: Setting, *,
              n_boot: int) -> dict[str, Any]:
    table = condition_table(runs, conditions, setting, n_boot=n_boot)
    out: dict[str, Any] = {"all_zero_group_share": first_iteration(runs, "grpo", "credit/all_zero_group_share"),
                           "warm_start_success": first_iteration(runs, "grpo", "success")}
    if any(c.startswith("faca") for c in conditions):
        out["nonconstant_reaction_cell_share"] = first_iteration(runs, "faca", "faca/nonconstant_cell_share")
    for c, row in table.items():
        for base in ("grpo", "control"):
            p = row.get(f"success_vs_{base}")
            if p is not None:
                out[f"{key_of(c)}_minus_{base}"] = p["gain"]
                out[f"{key_of(c)}_minus_{base}_ci95"] = p["ci95"]
    out["conditions"] = table
    return out


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _gain(p: Mapping[str, Any] | None) -> str:
    if not p:
        return "n/a"
    lo, hi = p["ci95"]
    return f"{p['gain']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def markdown_table(out: Mapping[str, Any]) -> str:
    """The JSON line ``out`` (`summarize` plus the run's facts) as a Markdown table, one row per
    condition: held-out success after RL at the training temperature, its paired difference to
    GRPO and to the lr = 0 control with the BCa 95% intervals, the same against GRPO greedy, the
    per-seed steps to the threshold, the all-zero group share, the credit terms' coverage, the
    ``why/*`` correlations and the credit's seconds per iteration (run means over seeds)."""
    cond = out["conditions"]
    head = ("| condition | success after (T = 1) | Δ vs grpo [95% CI] | Δ vs control [95% CI] | greedy Δ vs grpo "
            f"| iterations to {out.get('threshold', 0):g} per seed | all-zero groups | A_info / A_proc cover "
            "| why: info / proc corr | credit s/iter |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for c, row in cond.items():
        steps = ", ".join(str(v) for _, v in sorted(row["steps_to_threshold"].items(), key=lambda kv: int(kv[0])))
        cover = f"{_f(row.get('credit/cover/info'), '{:.2f}')} / {_f(row.get('credit/cover/proc'), '{:.2f}')}"
        why = f"{_f(row.get('why/info_partial_corr'), '{:+.2f}')} / {_f(row.get('why/proc_partial_corr'), '{:+.2f}')}"
        lines.append(f"| {c} | {_f(row.get('success_after'))} | "
                     f"{'(baseline)' if c == 'grpo' else _gain(row.get('success_vs_grpo'))} | "
                     f"{'(baseline)' if c == 'control' else _gain(row.get('success_vs_control'))} | "
                     f"{'(baseline)' if c == 'grpo' else _gain(row.get('greedy_success_vs_grpo'))} | {steps} | "
                     f"{_f(row.get('credit/all_zero_group_share'), '{:.2f}')} | {cover} | {why} | "
                     f"{_f(row.get('time/credit_s'), '{:.1f}')} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts/bench_credit.py", description=__doc__.split("\n\n")[0],
                                 epilog="A key=value argument is a jaxagent.launch override of every job of the "
                                        "setting (after its config file).")
    ap.add_argument("--setting", required=True, choices=sorted(SETTINGS))
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated integers")
    ap.add_argument("--conditions", default=None, help="comma-separated (default: the setting's)")
    ap.add_argument("--all", action="store_true", help="the setting's extra ablations too")
    ap.add_argument("--runs-dir", default="runs")
    ap.add_argument("--prefix", default=None, help="run-name prefix (default: the setting's name)")
    ap.add_argument("--bootstrap", type=int, default=10_000)
    ap.add_argument("--parallel", type=int, default=2, help="jobs run at once (each its own process)")
    ap.add_argument("--compile-cache", default=None, metavar="DIR", help="JAX persistent compilation cache")
    ap.add_argument("--report-only", action="store_true", help="no runs: the figures of the finished runs")
    ap.add_argument("--markdown", default=None, metavar="PATH", help="also write the comparison as a Markdown table")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        ap.error(f"argument {bad[0]!r}: expected key=value")
    own = [o for o in args.overrides if cc.override_key(o) in cc.OWN_KEYS]
    if own:
        ap.error(f"{own[0]!r}: set by the script")
    setting = SETTINGS[args.setting]
    conds = (args.conditions.split(",") if args.conditions
             else list(setting.conditions) + (list(setting.extra) if args.all else []))
    unknown = [c for c in conds if c not in cc.CONDITIONS]
    if unknown:
        ap.error(f"--conditions: {unknown[0]!r} is not one of {', '.join(cc.CONDITIONS)}")
    args.conditions = list(dict.fromkeys(["grpo", "control", *conds]))  # the baselines always run
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.prefix = args.prefix or args.setting
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    setting = SETTINGS[args.setting]
    config = str(cc.ROOT / setting.config)
    t0 = time.perf_counter()
    if args.compile_cache:
        cc.use_compile_cache(args.compile_cache)
    failed: list[str] = []
    if not args.report_only:
        jobs = cc.run_grid(gyms=[setting.gym], seeds=args.seeds, conditions=args.conditions, user=args.overrides,
                           config_file=config, runs_dir=args.runs_dir, prefix=args.prefix, parallel=args.parallel)
        failed = [j["name"] for j in jobs.values() if j.get("rc") != 0]
    runs: dict[int, dict[str, Any]] = {}
    for s in args.seeds:
        dirs = {c: Path(args.runs_dir) / cc.rl_name(args.prefix, setting.gym, s, c) for c in args.conditions}
        done = {c: run_records(d) for c, d in dirs.items() if (d / "summary.json").exists()}
        if "grpo" in done:
            runs[s] = done
    if not runs:
        log("no seed has its grpo run finished")
        return 1
    out = {"setting": args.setting, **summarize(runs, args.conditions, setting, n_boot=args.bootstrap)}
    out.update(command="python3 scripts/bench_credit.py" + (" " + " ".join(argv) if argv else ""), config=setting.config,
               threshold=setting.threshold, overrides=args.overrides, seeds=sorted(runs), failed=failed,
               runs_dir=args.runs_dir, wall_s=time.perf_counter() - t0,
               date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), machine=cc.machine())
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(out), encoding="utf-8")
        log(f"wrote {args.markdown}")
    log(f"runs in {args.runs_dir}/{args.prefix}_{setting.gym}_s*; the JSON line follows")
    print(json.dumps(out))
    return 1 if failed else 0


__all__ = ["DIAGNOSTIC_KEYS", "SETTINGS", "Setting", "condition_table", "main", "markdown_table", "summarize"]

"""RL that learns: GRPO from an SFT warm start against an lr = 0 control with identical rollouts.

For every seed one SFT warm start (``job=sft``, exported as a Hugging Face checkpoint; ``--sft``
overrides) and RL runs from it with that seed (``job=rl``, `LEARNING` settings, plain ``key=value``
overrides after): ``grpo`` at ``optim.lr`` and ``control`` at ``optim.lr=0``, plus any other
compare_credit condition named in ``--conditions`` (the credit grid at these settings). Same seed,
same tasks, same sampling keys: the runs' rollouts of the first iteration are identical token for
token (checked for grpo and control, and reported), and from then on differ only by what the
updates changed. All evaluate the same held-out tasks with the same keys, greedily and at the
training temperature (``eval.sampled_k`` runs per task), so every difference is paired per (seed,
held-out task).

    python3 scripts/bench_rl_learns.py                               # intention, seeds 0,1,2
    python3 scripts/bench_rl_learns.py --seeds 0 steps=4             # a quick look
    python3 scripts/bench_rl_learns.py --conditions grpo,control,infopo,faca,infopo+faca
    python3 scripts/bench_rl_learns.py --report-only                 # figures from finished runs

Runs go to ``<runs_dir>/<prefix>_<gym>_s<seed>_{sft,grpo,control,...}`` (`compare_credit`'s grid
machinery: one process per job, finished runs reused, a changed config refused).

Output, on stdout, one JSON object per line: per RL iteration the paired training figures (grpo
minus control, mean over seeds with a percentile-bootstrap interval over seeds, and per seed), then
one summary line whose keys include ``paired_success_gain`` (grpo - control, held-out success at
the training temperature, mean over (seed, task) pairs) with ``paired_success_gain_ci95`` (a paired
BCa bootstrap 95% interval), the same for reward and for greedy decoding, the warm start's and
both runs' figures, ``identical_first_rollouts``, ``warm_start`` (per seed: the SFT's final loss and
held-out success before RL) with ``warm_start_ok`` (every seed's greedy success at least 0.7: a
collapsed warm start is seen), and ``credit``: per condition its gains against
the control and against grpo, steps to threshold and the run-mean credit coverage. Progress goes
to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxagent.eval.stats import paired_bca, percentile_interval
from jaxagent.jobs.experiments import credit_grid as cc

#: The warm start: the quickstart's SFT (1000 steps on the imitable demonstrations with noise).
SFT_SETTINGS = ("sft.steps=1000", "eval.sampled_k=0")
#: The RL settings (docs/RESULTS.md, "RL that learns"): 32 iterations of 64 episodes (8 tasks x 8)
#: on training tasks drawn from 4096 (the warm start imitated the first 512: RL then trains where
#: the held-out tasks are, on tasks it has not memorised), two updates of 32 per iteration (each
#: accumulated over 2 microbatches, whose gradients' cosine is logged), Adam at lr 3e-4 without
#: warmup, positive advantages only (grpo.negative_weight=0: on this near-deterministic policy the
#: negative half's gradient is mostly noise; see RESULTS), episode limits matched to the
#: demonstrations (at most 6 turns and 512 tokens), evaluation before and after only on all 64
#: held-out tasks, greedy and at the training temperature (4 runs per task). The RL jobs' alone: a
#: change here reruns the RL runs, not the warm starts.
LEARNING = ("steps=32", "rl.credit=grpo", "grpo.negative_weight=0", "env.train_tasks=4096", "rl.tasks_per_step=8",
            "rl.group_size=8", "rl.minibatch_size=32", "rl.microbatches=2", "optim.lr=3e-4", "optim.warmup_steps=0",
            "rollout.max_turns=6", "rollout.max_tokens=512", "eval.every=0", "eval.tasks=64", "eval.sampled_k=4",
            "checkpoint.every=0")
CONDITIONS = ("grpo", "control")
#: Steps to threshold: the first RL iteration whose training success, averaged over it and the
#: `SMOOTH` - 1 before it (64 episodes each are noisy; full windows only), reaches `THRESHOLD`; not
#: reached: censored.
THRESHOLD = 0.85
SMOOTH = 4
#: Per-iteration diagnostics averaged over a run (credit coverage and all-equal groups, point 3).
COVERAGE_KEYS = ("credit/zero_adv_group_share", "credit/cover/ext", "credit/cover/info", "credit/cover/proc",
                 "credit/cover/total", "update/grad_cos_halves", "update/entropy")


def log(msg: str) -> None:
    print(f"[bench_rl_learns] {msg}", file=sys.stderr, flush=True)


def run_records(run_dir: Path) -> dict[str, Any]:
    """One RL run's figures: the training records by iteration and the before/after evaluations."""
    from jaxagent.eval.report import read_metrics

    recs = read_metrics(run_dir / "metrics.jsonl")
    rl = {int(r["step"]): r for r in recs if r.get("phase") == "rl"}
    ev = {r.get("label"): r for r in recs if r.get("phase") == "eval"}
    traj = sorted((run_dir / "trajectories").glob("iter_00000.jsonl"))
    first = [json.loads(line)["tokens"] for line in traj[0].read_text().splitlines()] if traj else None
    return {"rl": [rl[i] for i in sorted(rl)], "before": ev.get("before"), "after": ev.get("after"),
            "first_tokens": first}


def _units(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[list[float], list[float]]:
    keys = sorted(set(a) & set(b))
    return [a[k] for k in keys], [b[k] for k in keys]


def paired(runs: Mapping[int, Mapping[str, Any]], key: str, *, n_boot: int, cond: str = "grpo",
           base: str = "control") -> dict[str, Any] | None:
    """``cond`` - ``base`` over (seed, held-out task) pairs of the final evaluation's ``key`` (a
    ``*_by_task`` mapping): mean, BCa 95% interval, pairs, per-seed means. Seeds lacking either
    run are left out."""
    a, b, per_seed = [], [], {}
    for s, r in runs.items():
        if cond not in r or base not in r:
            continue
        ga = (r[cond]["after"] or {}).get(key)
        gb = (r[base]["after"] or {}).get(key)
        if not ga or not gb:
            continue
        x, y = _units(ga, gb)
        a += x
        b += y
        per_seed[s] = float(np.mean(np.subtract(x, y)))
    if not a:
        return None
    mean, lo, hi = paired_bca(a, b, n=n_boot)
    return {"gain": mean, "ci95": [lo, hi], "pairs": len(a), "per_seed": per_seed}


def curves(runs: Mapping[int, Mapping[str, Any]], *, n_boot: int) -> list[dict[str, Any]]:
    """Per RL iteration: grpo - control training success and reward (each iteration's rollouts, at
    the training temperature), mean over seeds with a percentile-bootstrap 95% interval over seeds."""
    steps = min((len(r["grpo"]["rl"]) for r in runs.values()), default=0)
    steps = min([steps] + [len(r["control"]["rl"]) for r in runs.values()])
    out = []
    for i in range(steps):
        row: dict[str, Any] = {"iteration": i}
        for k in ("success", "reward"):
            d = {s: float(r["grpo"]["rl"][i][k] - r["control"]["rl"][i][k]) for s, r in runs.items()}
            vals = list(d.values())
            lo, hi = percentile_interval(vals, n=n_boot) if len(vals) > 1 else (vals[0], vals[0])
            row[f"train_{k}_gain"] = float(np.mean(vals))
            row[f"train_{k}_gain_ci95"] = [lo, hi]
            row[f"train_{k}_gain_per_seed"] = d
            row[f"train_{k}_grpo"] = float(np.mean([r["grpo"]["rl"][i][k] for r in runs.values()]))
            row[f"train_{k}_control"] = float(np.mean([r["control"]["rl"][i][k] for r in runs.values()]))
        for k in ("update/grad_cos_halves", "update/approx_kl_k3", "update/kl_ref", "update/clip_frac",
                  "update/entropy", "credit/zero_adv_group_share"):
            vals = [r["grpo"]["rl"][i].get(k) for r in runs.values()]
            if all(v is not None for v in vals):
                row[f"grpo_{k.split('/', 1)[1]}"] = float(np.mean(vals))
        out.append(row)
    return out


def steps_to_threshold(rl: Sequence[Mapping[str, Any]], threshold: float = THRESHOLD,
                       smooth: int = SMOOTH) -> int | None:
    """The first iteration i (0-based, i >= smooth - 1) with mean(success[i - smooth + 1 : i + 1]) >=
    threshold (training success of each RL iteration's rollouts: full windows only); None when none
    reaches it (censored). `compare_credit.steps_to_threshold` on the moving means."""
    vals = [float(r["success"]) for r in rl]
    means = [(i, sum(vals[i - smooth + 1: i + 1]) / smooth) for i in range(smooth - 1, len(vals))]
    return cc.steps_to_threshold(means, threshold)


def _censored_steps(rl: Sequence[Mapping[str, Any]]) -> int:
    """Steps to threshold, a run that never reached it counted as its iterations + 1."""
    hit = steps_to_threshold(rl)
    return len(rl) + 1 if hit is None else hit


def credit_table(runs: Mapping[int, Mapping[str, Any]], conditions: Sequence[str], *, n_boot: int
                 ) -> dict[str, dict[str, Any]]:
    """Per condition: held-out gains against the control (what RL adds) and against grpo (what the
    credit method adds), paired per (seed, task) with BCa intervals, at the training temperature
    (``success``, ``reward``) and greedily; steps to threshold per seed (censored runs count as
    their iterations + 1) and the paired difference to grpo over seeds; the run-mean diagnostics
    of `COVERAGE_KEYS`."""
    out: dict[str, dict[str, Any]] = {}
    for c in conditions:
        if c == "control":
            continue
        row: dict[str, Any] = {}
        for base in ("control", "grpo"):
            if base == c:
                continue
            for name, key in (("success", "sampled/success_by_task"), ("reward", "sampled/reward_by_task"),
                              ("greedy_success", "success_by_task")):
                p = paired(runs, key, n_boot=n_boot, cond=c, base=base)
                row[f"{name}_vs_{base}"] = p and {"gain": p["gain"], "ci95": p["ci95"], "pairs": p["pairs"]}
        have = [s for s, r in runs.items() if c in r]
        steps = {s: _censored_steps(runs[s][c]["rl"]) for s in have}
        row["steps_to_threshold"] = steps
        row["censored"] = {s: steps_to_threshold(runs[s][c]["rl"]) is None for s in have}
        if c != "grpo":
            common = [s for s in have if "grpo" in runs[s]]
            d = [steps[s] - _censored_steps(runs[s]["grpo"]["rl"]) for s in common]
            row["steps_vs_grpo"] = ({"gain": float(np.mean(d)), "per_seed": dict(zip(common, d)),
                                     "ci95": list(percentile_interval(d, n=n_boot)) if len(d) > 1 else [d[0], d[0]]}
                                    if d else None)
        for k in COVERAGE_KEYS:
            vals = [float(np.mean([x[k] for x in r[c]["rl"] if x.get(k) is not None]))
                    for r in runs.values() if c in r and any(x.get(k) is not None for x in r[c]["rl"])]
            row[k] = float(np.mean(vals)) if vals else None
        out[c] = row
    return out


def _mean_of(runs, cond, label, key):
    vals = [(r[cond][label] or {}).get(key) for r in runs.values()]
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


#: A warm start below this held-out greedy success is reported as collapsed (``warm_start_ok`` false).
WARM_START_MIN_GREEDY = 0.7


def sft_final_loss(run_dir: Path) -> float | None:
    """The last logged SFT loss of a warm start's run (None when it has none)."""
    from jaxagent.eval.report import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    sft = [r for r in read_metrics(path) if r.get("phase") == "sft" and "loss" in r]
    return float(sft[-1]["loss"]) if sft else None


def warm_starts(runs: Mapping[int, Mapping[str, Any]], sft_loss: Mapping[int, float | None]) -> dict[str, Any]:
    """Per seed the warm start's figures: its final SFT loss and its held-out success before RL
    (the grpo run's ``before`` evaluation: greedy and at the training temperature); the smallest
    greedy success, and ``warm_start_ok`` (every seed at least `WARM_START_MIN_GREEDY`)."""
    per = {}
    for s, r in runs.items():
        before = r["grpo"].get("before") or {}
        per[s] = {"sft_final_loss": sft_loss.get(s), "greedy_success": before.get("success"),
                  "sampled_success": before.get("sampled/success")}
    greedy = [v["greedy_success"] for v in per.values() if v["greedy_success"] is not None]
    return {"warm_start": per, "warm_start_min_greedy_success": min(greedy) if greedy else None,
            "warm_start_ok": bool(greedy) and len(greedy) == len(per) and min(greedy) >= WARM_START_MIN_GREEDY}


def summarize(runs: Mapping[int, Mapping[str, Any]], *, n_boot: int) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": sorted(runs)}
    for name, key in (("success", "sampled/success_by_task"), ("reward", "sampled/reward_by_task"),
                      ("greedy_success", "success_by_task"), ("greedy_reward", "reward_by_task")):
        p = paired(runs, key, n_boot=n_boot)
        out[f"paired_{name}_gain"] = p and p["gain"]
        out[f"paired_{name}_gain_ci95"] = p and p["ci95"]
        out[f"paired_{name}_gain_per_seed"] = p and p["per_seed"]
        out[f"paired_{name}_pairs"] = p and p["pairs"]
    for label in ("before", "after"):
        for cond in CONDITIONS:
            for key, name in (("sampled/success", "success"), ("success", "greedy_success"),
                              ("sampled/reward", "reward")):
                out[f"{cond}_{name}_{label}"] = _mean_of(runs, cond, label, key)
    out["identical_first_rollouts"] = all(r["grpo"]["first_tokens"] is not None
                                          and r["grpo"]["first_tokens"] == r["control"]["first_tokens"]
                                          for r in runs.values())
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts/bench_rl_learns.py", description=__doc__.split("\n\n")[0],
                                 epilog="A key=value argument is a jaxagent.launch override of the RL runs "
                                        "(after LEARNING); --sft key=value one of the SFT warm starts "
                                        "(after SFT_SETTINGS), "
                                        "so a change of RL settings reuses the warm starts.")
    ap.add_argument("--gym", default="intention")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated integers")
    ap.add_argument("--runs-dir", default="runs")
    ap.add_argument("--prefix", default="rl_learns")
    ap.add_argument("--bootstrap", type=int, default=10_000, help="bootstrap resamples")
    ap.add_argument("--parallel", type=int, default=2, help="jobs run at once (each its own process)")
    ap.add_argument("--compile-cache", default=None, metavar="DIR", help="JAX persistent compilation cache")
    ap.add_argument("--report-only", action="store_true", help="no runs: the figures of the finished runs")
    ap.add_argument("--conditions", default=",".join(CONDITIONS),
                    help="comma-separated compare_credit conditions; grpo and control always run "
                         "(e.g. grpo,control,infopo,faca,infopo+faca: the credit grid at these settings)")
    ap.add_argument("--sft", action="append", default=[], metavar="key=value",
                    help="an override of the SFT warm starts (repeatable); "
                         "plain key=value arguments reach the RL runs only")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_args(argv)
    bad = [o for o in [*args.overrides, *args.sft] if "=" not in o]
    if bad:
        ap.error(f"argument {bad[0]!r}: expected key=value")
    own = [o for o in [*args.overrides, *args.sft] if cc.override_key(o) in cc.OWN_KEYS]
    if own:
        ap.error(f"{own[0]!r}: set by the script")
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    conds = [c for c in args.conditions.split(",") if c]
    unknown = [c for c in conds if c not in cc.CONDITIONS]
    if unknown:
        ap.error(f"--conditions: {unknown[0]!r} is not one of {', '.join(cc.CONDITIONS)}")
    args.conditions = [*CONDITIONS, *[c for c in dict.fromkeys(conds) if c not in CONDITIONS]]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    t0 = time.perf_counter()
    user = [*SFT_SETTINGS, *args.sft]
    if args.compile_cache:
        cc.use_compile_cache(args.compile_cache)
    failed: list[str] = []
    if not args.report_only:
        jobs = cc.run_grid(gyms=[args.gym], seeds=args.seeds, conditions=args.conditions, user=user,
                           config_file=None, runs_dir=args.runs_dir, prefix=args.prefix, parallel=args.parallel,
                           rl_only=[*LEARNING, *args.overrides])
        failed = [j["name"] for j in jobs.values() if j.get("rc") != 0]
    runs: dict[int, dict[str, Any]] = {}
    for s in args.seeds:
        dirs = {c: Path(args.runs_dir) / cc.rl_name(args.prefix, args.gym, s, c) for c in args.conditions}
        if all((dirs[c] / "summary.json").exists() for c in CONDITIONS):
            runs[s] = {c: run_records(d) for c, d in dirs.items() if (d / "summary.json").exists()}
    if not runs:
        log("no seed has both runs finished")
        return 1
    for row in curves(runs, n_boot=args.bootstrap):
        print(json.dumps(row))
    summary = summarize(runs, n_boot=args.bootstrap)
    summary.update(warm_starts(runs, {s: sft_final_loss(Path(args.runs_dir) / cc.sft_name(args.prefix, args.gym, s))
                                      for s in runs}))
    summary["credit"] = credit_table(runs, args.conditions, n_boot=args.bootstrap)
    summary.update(threshold=THRESHOLD, threshold_smooth=SMOOTH)
    summary.update(command="python3 scripts/bench_rl_learns.py" + (" " + " ".join(argv) if argv else ""),
                   gym=args.gym, sft_settings=user, rl_settings=[*LEARNING, *args.overrides], failed=failed,
                   wall_s=time.perf_counter() - t0,
                   date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), machine=cc.machine())
    print(json.dumps(summary), flush=True)
    log(f"done in {time.perf_counter() - t0:.0f} s; the per-iteration rows and the summary above (JSON on stdout); the "
        f"runs in {args.runs_dir}/{args.prefix}_{args.gym}_s*; record them in docs/RESULTS.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

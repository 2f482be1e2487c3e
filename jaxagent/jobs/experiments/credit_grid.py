"""Credit assignment compared: GRPO vs InfoPO vs Faca vs InfoPO+Faca, the InfoPO ablations and the
Faca controls, on scripted gyms, paired over seeds and held-out tasks.

For every (gym, seed) one SFT warm start (``job=sft``, the quickstart's SFT settings, exported as a
Hugging Face checkpoint) is shared by every condition: each condition runs ``job=rl`` from that
checkpoint (``model.path=<sft>/hf``, the builtin tokenizer) with the same seed, hence the same RL
tasks per iteration, the same sampling keys and the same held-out tasks. Differences between
conditions are therefore paired: per (seed, held-out task) for the final success, per seed for the
steps to reach a success threshold.

    python3 scripts/compare_credit.py                                   # the grid: 11 x 2 gyms x 3 seeds
    python3 scripts/compare_credit.py --quick --gyms intention          # a smoke run (minutes)
    python3 scripts/compare_credit.py --conditions grpo,infopo steps=16 rl.tasks_per_step=4

Conditions (``--conditions``, comma-separated; default all eleven): ``grpo``, ``infopo``, ``faca``,
``infopo+faca``; InfoPO ablations ``infopo/no-std`` (``infopo.normalize_std=false``),
``infopo/no-gate`` (``infopo.use_gate=false``), ``infopo/no-ext`` (``infopo.use_ext=false``); Faca
controls ``faca/shifted``, ``faca/random``, ``faca/reversed`` (``faca.ablation=shift|random|reverse``);
``control``: GRPO at ``optim.lr=0`` (the warm start itself, through identical rollouts: what RL adds).
Outside the default grid, diagnostics: ``infopo/pos-info`` (``infopo.negative_weight=0``: the info
term's negative entries dropped), ``infopo/by-turn`` (``infopo.normalize_by=group_turn``: each
turn's gain against the same turn of the group's other episodes, not against every turn), and
the variants `scripts/bench_credit.py` compares: ``infopo/reference`` (the InfoPO reference code's
choices together), ``infopo/marginal`` (the marginal prior), ``infopo/in-vocab`` (a placeholder in
the gyms' words), ``infopo/no-corrections`` (corrections out of the valid turns).

Every ``key=value`` argument is passed to every job (``python -m jaxagent.launch`` overrides); the
script sets ``job``, ``name``, ``runs_dir``, ``seed``, ``env.gym``, ``progress`` and the condition's
keys itself (they win). RL jobs drop ``model.*`` shape overrides (the shape comes from the SFT
checkpoint). The SFT job evaluates on one task only (the RL jobs' ``before`` evaluation is the SFT
policy on the full held-out set).

Each job runs in its own process (``python -m jaxagent.launch``): JAX's compilation caches and the
engine's buffers of one run are freed before the next, a crash costs one run, not the grid, and
every run starts from the same state, so run times are comparable. A run whose ``summary.json``
exists is skipped (an interrupted grid resumes; a run cut short resumes from its checkpoints with
``resume=true``); a run directory whose ``config.yaml`` differs from the one this invocation would
run is an error, not silently reused.

Figures per run (from ``metrics.jsonl``): the training success of every RL iteration, the held-out
success at each evaluation (``before`` = 0 iterations, ``during`` every ``eval.every``, ``after``),
the per-task held-out success of the final evaluation (``success_by_task``) and the steps to
threshold: the first number of RL iterations done at which an evaluation (``--threshold-on eval``,
the default) or the iteration's training rollouts (``--threshold-on train``) reached
``--threshold``; censored (shown ``>N``) when no evaluation did.

Statistics, each condition vs ``grpo``: the mean paired difference in final held-out success with a
paired bootstrap 95% interval (resampling (seed, held-out task) pairs), and the same for steps to
threshold (resampling seeds; a censored run counts as ``steps + 1``, so a difference involving one
is a bound, marked).

Output: ``docs/RESULTS.md`` (``--out``; with ``--quick`` the default is
``<runs_dir>/<prefix>_RESULTS.md``): the command, machine, date and overrides, one table per gym
and a "what we see" paragraph generated from the numbers alone; progress on stderr; the last line
of stdout is one JSON object with the raw per-run figures and the comparisons.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxagent.eval.stats import paired_bootstrap, steps_to_threshold
from jaxagent.jobs.experiments.grid_figures import censored_steps, collect, compare, run_figures, success_pairs
from jaxagent.jobs.experiments.grid_report import gym_table, machine, what_we_see, write_results
from jaxagent.jobs.experiments.grid_runs import (
    BASELINE,
    COMPILE_CACHE_ENV,
    CONDITIONS,
    DIAGNOSTICS,
    GRID,
    IGNORED_IN_CONFIG_CHECK,
    PRESET_ONLY,
    ROOT,
    SFT_UNREAD,
    check_existing,
    launch,
    launch_in_process,
    log,
    override_key,
    plain_config,
    rl_name,
    rl_overrides,
    run_grid,
    sft_name,
    sft_overrides,
    slug,
    use_compile_cache,
)

QUICK_CONDITIONS = ("grpo", "infopo")
# --quick: a smoke run of the whole pipeline in seconds per job (user overrides still win).
QUICK_OVERRIDES = ("sft.steps=2", "sft.demos=8", "sft.batch_size=4", "steps=1", "eval.tasks=2", "eval.every=1",
                   "rl.tasks_per_step=2", "rl.group_size=2", "rl.minibatch_size=4", "rollout.max_new_tokens=16",
                   "rollout.max_turns=3", "rollout.slots=4", "checkpoint.every=0")
# Keys the script sets itself; a pass-through override of one of them is an error.
OWN_KEYS = ("job", "name", "runs_dir", "seed", "env.gym", "model.path", "resume", "progress", "rl.credit",
            "infopo.normalize_std", "infopo.use_gate", "infopo.use_ext", "infopo.negative_weight",
            "infopo.normalize_by", "faca.ablation")

# The grid's pieces, here under the names scripts and other experiments use (`rl_learns`).
__all__ = ["BASELINE", "COMPILE_CACHE_ENV", "CONDITIONS", "DIAGNOSTICS", "GRID", "IGNORED_IN_CONFIG_CHECK",
           "OWN_KEYS", "PRESET_ONLY", "QUICK_CONDITIONS", "QUICK_OVERRIDES", "ROOT", "SFT_UNREAD", "censored_steps",
           "check_existing", "collect", "compare", "gym_table", "launch", "launch_in_process", "log", "machine",
           "main", "override_key", "paired_bootstrap", "parse_args", "plain_config", "rl_name", "rl_overrides",
           "run_figures", "run_grid", "sft_name", "sft_overrides", "slug", "steps_to_threshold", "success_pairs",
           "use_compile_cache", "what_we_see", "write_results"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts/compare_credit.py", description=__doc__.split("\n\n")[0],
                                 epilog="Any key=value argument is a jaxagent.launch override passed to every job.")
    ap.add_argument("--gyms", default="intention,telepathy", help="comma-separated (intention = the quickstart's)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated integers")
    ap.add_argument("--conditions", default=None, help="comma-separated, from: " + ", ".join(CONDITIONS))
    ap.add_argument("--threshold", type=float, default=0.9, help="success threshold for steps-to-threshold")
    ap.add_argument("--threshold-on", choices=("eval", "train"), default="eval",
                    help="held-out evaluations (every eval.every iterations) or each iteration's training rollouts")
    ap.add_argument("--bootstrap", type=int, default=10_000, help="bootstrap resamples")
    ap.add_argument("--runs-dir", default="runs")
    ap.add_argument("--prefix", default=None, help="run-name prefix (default: credit, or credit_quick with --quick)")
    ap.add_argument("--config", default=None, help="a YAML config file under every job (as jaxagent.launch --config)")
    ap.add_argument("--out", default=None, help="the Markdown report (default docs/RESULTS.md; "
                                                "with --quick <runs_dir>/<prefix>_RESULTS.md)")
    ap.add_argument("--parallel", type=int, default=1, help="jobs run at once (each its own process)")
    ap.add_argument("--compile-cache", default=None, metavar="DIR",
                    help="JAX persistent compilation cache shared by the jobs (later runs skip compiling; "
                         "their wall times then exclude compilation)")
    ap.add_argument("--in-process", action="store_true",
                    help="run the jobs in this process (smoke runs, tests) instead of one process each")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: first seed only, conditions grpo and infopo, tiny settings")
    ap.add_argument("--report-only", action="store_true", help="no runs: tables from the finished runs only")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        ap.error(f"argument {bad[0]!r}: expected key=value")
    own = [o for o in args.overrides if override_key(o) in OWN_KEYS]
    if own:
        ap.error(f"{own[0]!r}: set by the script (use --gyms, --seeds, --conditions, --runs-dir, --prefix)")
    args.gyms = [g for g in args.gyms.split(",") if g]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    conds = args.conditions.split(",") if args.conditions else list(QUICK_CONDITIONS if args.quick else GRID)
    unknown = [c for c in conds if c not in CONDITIONS]
    if unknown:
        ap.error(f"--conditions: {unknown[0]!r} is not one of {', '.join(CONDITIONS)}")
    # The baseline first: every comparison is against it.
    args.conditions = ([BASELINE] if BASELINE in conds else []) + [c for c in conds if c != BASELINE]
    if args.quick:
        args.seeds = args.seeds[:1]
        args.overrides = list(QUICK_OVERRIDES) + args.overrides
    args.prefix = args.prefix or ("credit_quick" if args.quick else "credit")
    if not args.prefix or "/" in args.prefix:
        ap.error(f"--prefix={args.prefix!r}: expected a directory-name prefix (no '/')")
    args.out = Path(args.out) if args.out else (Path(args.runs_dir) / f"{args.prefix}_RESULTS.md" if args.quick
                                                else ROOT / "docs" / "RESULTS.md")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    t0 = time.perf_counter()
    jobs: dict[Any, Any] = {}
    if args.compile_cache:
        use_compile_cache(args.compile_cache)
    if not args.report_only:
        jobs = run_grid(gyms=args.gyms, seeds=args.seeds, conditions=args.conditions, user=args.overrides,
                        config_file=args.config, runs_dir=args.runs_dir, prefix=args.prefix,
                        parallel=1 if args.in_process else args.parallel,
                        launcher=launch_in_process if args.in_process else launch)
    data = collect(gyms=args.gyms, seeds=args.seeds, conditions=args.conditions, runs_dir=args.runs_dir,
                   prefix=args.prefix, threshold=args.threshold, threshold_on=args.threshold_on)
    comps = {g: compare(by_cond, n_boot=args.bootstrap) for g, by_cond in data.items()}
    failed = [j["name"] for j in jobs.values() if j.get("rc") != 0]
    info = dict(machine(), date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))
    command = "python3 scripts/compare_credit.py" + (" " + shlex.join(argv) if argv else "")
    write_results(args.out, command=command, info=info, overrides=args.overrides, args=args, data=data,
                  comps=comps, failed=failed)
    log(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    runs = [{"gym": g, "condition": c, "seed": s, **fig} for g, by_cond in data.items()
            for c, by_seed in by_cond.items() for s, fig in by_seed.items()]
    process_s = {j["name"]: j.get("process_s") for j in jobs.values() if j.get("process_s") is not None}
    print(json.dumps({"command": command, "out": str(args.out), "threshold": args.threshold,
                      "threshold_on": args.threshold_on, "overrides": args.overrides, "machine": info,
                      "runs": runs, "comparisons": comps, "failed": failed, "process_s": process_s}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

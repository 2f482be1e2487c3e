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
term's negative entries dropped) and ``infopo/by-turn`` (``infopo.normalize_by=group_turn``: each
turn's gain against the same turn of the group's other episodes, not against every turn).

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
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from jaxagent.eval.stats import paired_bootstrap, steps_to_threshold

ROOT = Path(__file__).resolve().parents[2]  # the repository (a source checkout: docs/RESULTS.md, git)

CONDITIONS: dict[str, tuple[str, ...]] = {
    "grpo": ("rl.credit=grpo",),
    "infopo": ("rl.credit=infopo",),
    "faca": ("rl.credit=faca",),
    "infopo+faca": ("rl.credit=infopo+faca",),
    "infopo/no-std": ("rl.credit=infopo", "infopo.normalize_std=false"),
    "infopo/no-gate": ("rl.credit=infopo", "infopo.use_gate=false"),
    "infopo/no-ext": ("rl.credit=infopo", "infopo.use_ext=false"),
    "faca/shifted": ("rl.credit=faca", "faca.ablation=shift"),
    "faca/random": ("rl.credit=faca", "faca.ablation=random"),
    "faca/reversed": ("rl.credit=faca", "faca.ablation=reverse"),
    # no learning at all: the same rollouts, credit and updates of size 0 (what RL adds over the warm start)
    "control": ("rl.credit=grpo", "optim.lr=0"),
    # diagnostics, not in the default grid: InfoPO with its info term's negative entries dropped;
    # InfoPO with each turn normalised against the same turn of its group only
    "infopo/pos-info": ("rl.credit=infopo", "infopo.negative_weight=0"),
    "infopo/by-turn": ("rl.credit=infopo", "infopo.normalize_by=group_turn"),
}
DIAGNOSTICS = ("infopo/pos-info", "infopo/by-turn")
GRID = tuple(c for c in CONDITIONS if c not in DIAGNOSTICS)  # the default: the eleven conditions
BASELINE = "grpo"
QUICK_CONDITIONS = ("grpo", "infopo")
# --quick: a smoke run of the whole pipeline in seconds per job (user overrides still win).
QUICK_OVERRIDES = ("sft.steps=2", "sft.demos=8", "sft.batch_size=4", "steps=1", "eval.tasks=2", "eval.every=1",
                   "rl.tasks_per_step=2", "rl.group_size=2", "rl.minibatch_size=4", "rollout.max_new_tokens=16",
                   "rollout.max_turns=3", "rollout.slots=4", "checkpoint.every=0")
# Keys the script sets itself; a pass-through override of one of them is an error.
OWN_KEYS = ("job", "name", "runs_dir", "seed", "env.gym", "model.path", "resume", "progress", "rl.credit",
            "infopo.normalize_std", "infopo.use_gate", "infopo.use_ext", "infopo.negative_weight", "infopo.normalize_by", "faca.ablation")
# model.* keys that only apply to presets (ModelSection.validate rejects them next to model.path).
PRESET_ONLY = ("model.preset", "model.hidden_size", "model.num_hidden_layers", "model.intermediate_size",
               "model.num_attention_heads", "model.num_key_value_heads", "model.head_dim", "model.init_seed")
IGNORED_IN_CONFIG_CHECK = ("resume", "progress")


def log(msg: str) -> None:
    print(f"[compare_credit] {msg}", file=sys.stderr, flush=True)


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


# ----------------------------------------------------------------------------- the grid
def slug(condition: str) -> str:
    return condition.replace("+", "-").replace("/", "-")


def sft_name(prefix: str, gym: str, seed: int) -> str:
    return f"{prefix}_{gym}_s{seed}_sft"


def rl_name(prefix: str, gym: str, seed: int, condition: str) -> str:
    return f"{prefix}_{gym}_s{seed}_{slug(condition)}"


def _key(override: str) -> str:
    return override.split("=", 1)[0].strip()


def sft_overrides(user: Sequence[str], *, runs_dir: str, prefix: str, gym: str, seed: int) -> list[str]:
    return [*user, "job=sft", f"name={sft_name(prefix, gym, seed)}", f"runs_dir={runs_dir}", f"seed={seed}",
            f"env.gym={gym}", "eval.tasks=1", "checkpoint.export_hf=true", "progress=false"]


def rl_overrides(user: Sequence[str], *, runs_dir: str, prefix: str, gym: str, seed: int, condition: str,
                 rl_only: Sequence[str] = ()) -> list[str]:
    """The RL job's overrides: ``user`` (less preset-only model keys), then ``rl_only`` (settings
    that are the RL runs' alone, so the SFT warm starts do not depend on them), then the script's."""
    hf = Path(runs_dir) / sft_name(prefix, gym, seed) / "hf"
    kept = [o for o in [*user, *rl_only] if _key(o) not in PRESET_ONLY]
    # A collapse is a finding of the grid (its summary says so), not a reason to stop it.
    return ["rl.fail_on_collapse=false", *kept, "job=rl", f"name={rl_name(prefix, gym, seed, condition)}", f"runs_dir={runs_dir}", f"seed={seed}",
            f"env.gym={gym}", f"model.path={hf}", *CONDITIONS[condition], "progress=false"]


def _plain_config(config_file: str | None, overrides: Sequence[str]) -> dict[str, Any]:
    from jaxagent import configlib
    from jaxagent.jobs.config import load_config

    d = configlib.to_dict(load_config(config_file, overrides))
    for k in IGNORED_IN_CONFIG_CHECK:
        d.pop(k, None)
    return d


#: What an SFT warm start's config check skips: the RL phase's settings, which a job=sft run never
#: reads (rl.success_threshold, which scores its evaluation, is still compared). One warm start
#: serves RL runs of any RL settings, and a change of the RL defaults does not orphan it.
SFT_UNREAD = ("steps", "rl", "ppo", "grpo", "infopo", "faca")


def _unread_by_sft(key: str) -> bool:
    top = key.split(".", 1)[0]
    return top in SFT_UNREAD and key != "rl.success_threshold"


def check_existing(run_dir: Path, expected: Mapping[str, Any]) -> None:
    """Raises when ``run_dir`` holds a run of another configuration. Not differences: a key the
    stored config lacks (added to the schema after the run was made) whose expected value is its
    default (a new key defaults to the behaviour before it); for a ``job=sft`` run, the RL-only
    sections it never reads (``SFT_UNREAD``)."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return
    import yaml

    from jaxagent import configlib
    from jaxagent.jobs.config import RunConfig

    have = yaml.safe_load(path.read_text()) or {}
    for k in IGNORED_IN_CONFIG_CHECK:
        have.pop(k, None)
    defaults = configlib.to_dict(RunConfig())
    diff = []
    for key in _diff_keys(have, expected):
        if _lookup(have, key) is _MISSING and _lookup(expected, key) == _lookup(defaults, key):
            continue
        if expected.get("job") == "sft" and _unread_by_sft(key):
            continue
        diff.append(key)
    if diff:
        raise SystemExit(f"{run_dir}: holds a run with another configuration (differs in {', '.join(sorted(diff)[:8])}); "
                         "pick another --prefix or --runs-dir, or delete it")


_MISSING = object()


def _lookup(d: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(d, Mapping) or part not in d:
            return _MISSING
        d = d[part]
    return d


def _diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def _name(overrides: Sequence[str]) -> str:
    return next(o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("name="))


COMPILE_CACHE_ENV = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}


def use_compile_cache(path: str | Path) -> None:
    """JAX's persistent compilation cache in ``path`` for this process and the jobs it starts: a
    program compiled by one run (the engine, the update, the scoring passes: the same shapes in
    every condition) is read back by the next instead of compiled again. Same executables, same
    numbers; only the wall times of later runs drop."""
    os.environ.update(COMPILE_CACHE_ENV, JAX_COMPILATION_CACHE_DIR=str(Path(path).resolve()))
    import jax

    jax.config.update("jax_compilation_cache_dir", str(Path(path).resolve()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def launch(overrides: Sequence[str], config_file: str | None, run_dir: Path) -> dict[str, Any]:
    """Runs one job in a fresh ``python -m jaxagent.launch`` process (resuming a run cut short);
    its stdout and stderr go to ``<run_dir>/launch.log``. Returns {rc, process_s}."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "jaxagent.launch"] + (["--config", config_file] if config_file else [])
    argv += list(overrides) + (["resume=true"] if (run_dir / "metrics.jsonl").exists() else [])
    # The caller's working directory (relative runs_dir and model.path mean the same in both
    # processes); the repository on the path in case the package is not installed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    t0 = time.perf_counter()
    with open(run_dir / "launch.log", "a", encoding="utf-8") as f:
        f.write("$ " + shlex.join(argv) + "\n")
        f.flush()
        rc = subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    return {"rc": rc, "process_s": time.perf_counter() - t0}


def launch_in_process(overrides: Sequence[str], config_file: str | None, run_dir: Path) -> dict[str, Any]:
    """`launch` in this process (``run_job``): no interpreter start-up, and JAX's in-memory caches
    are shared between runs (faster for smoke runs; memory is not returned between runs). A
    failure's traceback goes to ``<run_dir>/launch.log``."""
    import traceback

    from jaxagent.jobs.config import load_config
    from jaxagent.jobs import run_job

    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = list(overrides) + (["resume=true"] if (run_dir / "metrics.jsonl").exists() else [])
    t0 = time.perf_counter()
    with open(run_dir / "launch.log", "a", encoding="utf-8") as f:
        f.write("(in process) " + shlex.join(overrides) + "\n")
        try:
            run_job(load_config(config_file, overrides))
            rc = 0
        except Exception:  # noqa: BLE001 - one failed run must not end the grid
            f.write(traceback.format_exc())
            rc = 1
    return {"rc": rc, "process_s": time.perf_counter() - t0}


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def run_grid(*, gyms: Sequence[str], seeds: Sequence[int], conditions: Sequence[str], user: Sequence[str],
             config_file: str | None, runs_dir: str, prefix: str, parallel: int = 1,
             launcher: Callable[[Sequence[str], str | None, Path], dict[str, Any]] = launch,
             rl_only: Sequence[str] = ()) -> dict[str, Any]:
    """Runs (or skips, when done) the SFT warm starts, then every RL run (``rl_only``: overrides of
    the RL jobs alone). Returns {(kind, gym, seed, condition): {name, rc, process_s, skipped}};
    failures are kept, not raised."""
    root = Path(runs_dir)
    jobs: dict[str, Any] = {}

    def one(key, overrides):
        name = _name(overrides)
        run_dir = root / name
        if (run_dir / "summary.json").exists():
            jobs[key] = {"name": name, "rc": 0, "skipped": True}
            log(f"{name}: done before, skipped")
            return
        log(f"{name}: running")
        res = launcher(overrides, config_file, run_dir)
        ok = res["rc"] == 0 and (run_dir / "summary.json").exists()
        jobs[key] = {"name": name, "skipped": False, **res, "rc": res["rc"] if res["rc"] else (0 if ok else 1)}
        status = "ok" if ok else f"FAILED (rc={res['rc']})"
        log(f"{name}: {status} in {res['process_s']:.1f} s"
            + ("" if ok else "\n" + _tail(run_dir / "launch.log")))

    def pool(items):
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as ex:
            for f in [ex.submit(one, k, o) for k, o in items]:
                f.result()

    # Every config is checked before anything runs (a config error costs nothing).
    sfts = [(("sft", g, s, None), sft_overrides(user, runs_dir=runs_dir, prefix=prefix, gym=g, seed=s))
            for g in gyms for s in seeds]
    rls = [(("rl", g, s, c), rl_overrides(user, runs_dir=runs_dir, prefix=prefix, gym=g, seed=s, condition=c,
                                          rl_only=rl_only))
           for g in gyms for s in seeds for c in conditions]
    for _, o in sfts + rls:
        check_existing(root / _name(o), _plain_config(config_file, o))
    pool(sfts)
    ready = [(k, o) for k, o in rls if jobs[("sft", k[1], k[2], None)]["rc"] == 0]
    for k, o in rls:
        if jobs[("sft", k[1], k[2], None)]["rc"] != 0:
            jobs[k] = {"name": rl_name(prefix, k[1], k[2], k[3]), "rc": None, "skipped": True,
                       "error": "its SFT warm start failed"}
    pool(ready)
    return jobs


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


# ----------------------------------------------------------------------------- report
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
            f"| Δ final vs grpo [95% CI] | steps to ≥{threshold:g} per seed | Δ steps vs grpo [95% CI] | wall s (mean) |",
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
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(), "jax": jax.__version__,
            "backend": jax.default_backend(), "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def write_results(path: Path, *, command: str, info: Mapping[str, Any], overrides: Sequence[str],
                  args: argparse.Namespace, data, comps, failed: Sequence[str]) -> None:
    dirty = " (with uncommitted changes)" if info["dirty"] else ""
    config = "the quickstart defaults (`jaxagent/jobs/config.py`)" + (f", `--config {args.config}`" if args.config else "")
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- CLI
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
    own = [o for o in args.overrides if _key(o) in OWN_KEYS]
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

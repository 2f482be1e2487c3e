"""The credit grid's conditions and how its runs are made: the conditions (`CONDITIONS`, the default
`GRID`, the `BASELINE`), the run names (`sft_name`, `rl_name`), each job's overrides (`sft_overrides`,
`rl_overrides`), the check that a run directory holds the configuration this invocation would run
(`plain_config`, `check_existing`), the JAX compilation cache shared by the jobs (`use_compile_cache`), the
launchers (`launch`: one process per job; `launch_in_process`) and `run_grid`, which runs the SFT warm starts,
then every RL run, skipping the finished ones. The options and the design are in `credit_grid`'s docstring.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # the repository (a source checkout: docs/RESULTS.md, git)

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
    # InfoPO as its reference code runs it (kfq20/InfoPO; every choice of credit.infopo's docstring)
    "infopo/reference": ("rl.credit=infopo", "infopo.stat_unit=token", "infopo.std_ddof=1",
                         "infopo.magnitude_ratio=true", "infopo.placeholder_mode=overwrite", "grpo.std_ddof=1",
                         "grpo.singleton=reward"),
    # the counterfactual as the paper's argument assumes it: the mixture over the replies the gym could give
    "infopo/marginal": ("rl.credit=infopo", "infopo.prior=marginal"),
    # a placeholder in the gyms' own words (the tool's acknowledgement without the user's reply)
    "infopo/in-vocab": ("rl.credit=infopo", "infopo.placeholder=sent ."),
    # turns whose feedback is a correction left out of InfoPO's valid turns
    "infopo/no-corrections": ("rl.credit=infopo", "infopo.exclude_corrections=true"),
}
DIAGNOSTICS = ("infopo/pos-info", "infopo/by-turn", "infopo/reference", "infopo/marginal", "infopo/in-vocab",
               "infopo/no-corrections")
GRID = tuple(c for c in CONDITIONS if c not in DIAGNOSTICS)  # the default: the eleven conditions
BASELINE = "grpo"
# model.* keys that only apply to presets (ModelSection.validate rejects them next to model.path).
PRESET_ONLY = ("model.preset", "model.hidden_size", "model.num_hidden_layers", "model.intermediate_size",
               "model.num_attention_heads", "model.num_key_value_heads", "model.head_dim", "model.init_seed")
IGNORED_IN_CONFIG_CHECK = ("resume", "progress")


def log(msg: str) -> None:
    """A progress line on stderr, prefixed with the script that runs the grid (``[bench_credit]``, ...)."""
    print(f"[{Path(sys.argv[0]).stem or 'grid'}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the grid
def slug(condition: str) -> str:
    return condition.replace("+", "-").replace("/", "-")


def sft_name(prefix: str, gym: str, seed: int) -> str:
    return f"{prefix}_{gym}_s{seed}_sft"


def rl_name(prefix: str, gym: str, seed: int, condition: str) -> str:
    return f"{prefix}_{gym}_s{seed}_{slug(condition)}"


def override_key(override: str) -> str:
    """The key of a ``key=value`` override."""
    return override.split("=", 1)[0].strip()


def sft_overrides(user: Sequence[str], *, runs_dir: str, prefix: str, gym: str, seed: int) -> list[str]:
    return [*user, "job=sft", f"name={sft_name(prefix, gym, seed)}", f"runs_dir={runs_dir}", f"seed={seed}",
            f"env.gym={gym}", "eval.tasks=1", "checkpoint.export_hf=true", "progress=false"]


def rl_overrides(user: Sequence[str], *, runs_dir: str, prefix: str, gym: str, seed: int, condition: str,
                 rl_only: Sequence[str] = ()) -> list[str]:
    """The RL job's overrides: ``user`` (less preset-only model keys), then ``rl_only`` (settings
    that are the RL runs' alone, so the SFT warm starts do not depend on them), then the script's."""
    hf = Path(runs_dir) / sft_name(prefix, gym, seed) / "hf"
    kept = [o for o in [*user, *rl_only] if override_key(o) not in PRESET_ONLY]
    # A collapse is a finding of the grid (its summary says so), not a reason to stop it.
    return ["rl.fail_on_collapse=false", *kept, "job=rl", f"name={rl_name(prefix, gym, seed, condition)}",
            f"runs_dir={runs_dir}", f"seed={seed}", f"env.gym={gym}", f"model.path={hf}", *CONDITIONS[condition],
            "progress=false"]


def plain_config(config_file: str | None, overrides: Sequence[str]) -> dict[str, Any]:
    """The configuration a job of ``overrides`` runs, as plain data, less `IGNORED_IN_CONFIG_CHECK`."""
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
        raise SystemExit(f"{run_dir}: holds a run with another configuration "
                         f"(differs in {', '.join(sorted(diff)[:8])}); "
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


COMPILE_CACHE_ENV = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                     "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}


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
    argv += list(overrides) + (["resume=true"] if (run_dir / "config.yaml").exists() else [])  # cut short
    # The caller's working directory (relative runs_dir and model.path mean the same in both
    # processes); the repository on the path in case the package is not installed.
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
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

    from jaxagent.jobs import run_job
    from jaxagent.jobs.config import load_config

    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = list(overrides) + (["resume=true"] if (run_dir / "config.yaml").exists() else [])
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
        log(f"{name}: running (its log: {run_dir / 'launch.log'})")
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
        check_existing(root / _name(o), plain_config(config_file, o))
    log(f"{len(sfts)} SFT warm starts, then {len(rls)} RL runs, {max(1, parallel)} at a time, under {root}/ "
        "(finished runs are skipped)")
    pool(sfts)
    ready = [(k, o) for k, o in rls if jobs[("sft", k[1], k[2], None)]["rc"] == 0]
    for k, o in rls:
        if jobs[("sft", k[1], k[2], None)]["rc"] != 0:
            jobs[k] = {"name": rl_name(prefix, k[1], k[2], k[3]), "rc": None, "skipped": True,
                       "error": "its SFT warm start failed"}
    pool(ready)
    return jobs

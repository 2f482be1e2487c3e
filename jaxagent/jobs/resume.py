"""Guards of a run directory: which run may write into ``runs/<name>/``, and what a resume may change.

`check_run_dir(cfg, run_dir)` runs before anything is built (`jaxagent.jobs.prepare`, and
the tau2 host evaluation):

- **Another job's results are never overwritten.** When ``runs/<name>/config.yaml`` exists and
  holds a different job (``job``, ``env.kind`` and, on the gyms, ``env.gym``), the launch is
  refused, naming the key ``name``.
- **A run is never overwritten silently.** A launch without ``resume=true`` into a directory that
  holds a run (its ``config.yaml``) is refused, naming ``name=`` (keep both), ``overwrite=true``
  (replace it: `record_config` empties the directory first) and ``resume=true``; a launch that did
  not name its run gets the next free numbered name instead (``quickstart-2``: `free_run_name`,
  chosen by the launcher).
- **``resume=true`` needs a run to resume**: a directory without ``config.yaml`` is an error
  that says how to start afresh (drop ``resume=true``, or pick the ``name=`` of an existing run).
- **A resume continues the same training.** The config is compared with the one the run last
  ran with (the newest file of its config history); every differing dotted key is listed
  (``old -> new``) and the resume refused, unless the key is named in ``resume_overrides``
  (a key or a whole section, e.g. ``resume_overrides=[eval.every,rollout]``) or is one of
  `ALWAYS_ALLOWED`: ``resume``, ``resume_overrides``, ``progress`` and ``log`` (how the run reports),
  ``runs_dir`` and ``name`` (where the directory lives, should it have moved) and ``steps`` (the
  RL iterations: a finished run can be extended; each iteration's draws depend on
  ``(seed, phase, i)`` only, so the iterations both runs share are the same; a resume cannot go
  below the iterations already checkpointed, see `check_not_shortened`).
- **Every config a run used is kept**: ``config.yaml`` is the first launch's and stays; each
  resume writes ``config.resume-<n>.yaml`` (n = 1, 2, ...; `record_config`).

A key the run's config file lacks (written before the key existed) counts as the key's
default. `truncate_metrics` rewrites ``metrics.jsonl`` without the records a resume will log
again (atomically: a temporary file, then ``os.replace``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from jaxagent import configlib

#: Dotted keys (and their sections) that may always differ on a resume.
ALWAYS_ALLOWED = ("resume", "resume_overrides", "progress", "log", "overwrite", "runs_dir", "name", "steps")
FIRST_CONFIG = "config.yaml"
_ABSENT = object()


class ResumeError(configlib.ConfigError):
    """The run directory does not accept this launch; the message names the keys and the way out."""


# ----------------------------------------------------------------------------- config history
def config_history(run_dir: Path) -> list[Path]:
    """The configs the run has used, oldest first: ``config.yaml`` then ``config.resume-<n>.yaml``."""
    first = run_dir / FIRST_CONFIG
    if not first.is_file():
        return []
    resumes = []
    for p in run_dir.glob("config.resume-*.yaml"):
        n = p.name[len("config.resume-"):-len(".yaml")]
        if n.isdigit():
            resumes.append((int(n), p))
    return [first] + [p for _, p in sorted(resumes)]


def record_config(cfg: Any, run_dir: Path) -> Path:
    """Writes the config this launch uses: ``config.yaml`` for a fresh run, the next
    ``config.resume-<n>.yaml`` for a resume (``config.yaml`` stays the first launch's). With
    ``overwrite=true`` the directory is emptied first (call it before anything else writes there)."""
    if getattr(cfg, "overwrite", False) and run_dir.is_dir():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    history = config_history(run_dir)
    if cfg.resume and history:
        path = run_dir / f"config.resume-{len(history)}.yaml"
    else:
        path = run_dir / FIRST_CONFIG
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(configlib.dump_yaml(cfg))
    os.replace(tmp, path)
    return path


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ResumeError(f"{path}: cannot read the run's config ({e})") from None
    if not isinstance(data, dict):
        raise ResumeError(f"{path}: expected a mapping of the run's config, got {type(data).__name__}")
    return data


# ----------------------------------------------------------------------------- comparison
def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def config_diff(old: dict[str, Any], new: dict[str, Any], defaults: dict[str, Any] | None = None,
                prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted key, old, new)`` for every leaf that differs; a section set on one side and null
    on the other is one entry. A key ``old`` lacks counts as its value in ``defaults``; a key
    ``new`` lacks (no longer in the schema) is ignored."""
    out: list[tuple[str, Any, Any]] = []
    defaults = defaults if isinstance(defaults, dict) else {}
    for k in list(new) + [k for k in old if k not in new]:
        key = f"{prefix}.{k}" if prefix else str(k)
        b = new.get(k, _ABSENT)
        if b is _ABSENT:
            continue
        a = old.get(k, _ABSENT)
        if a is _ABSENT:
            a = defaults.get(k, _ABSENT)
            if a is _ABSENT:
                continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, defaults.get(k), key)
        elif not _same(a, b):
            out.append((key, a, b))
    return out


def _covers(entry: str, key: str) -> bool:
    return key == entry or key.startswith(entry + ".")


def _show(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (dict, list)) else repr(v)


def schema_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of the config schema ``cls``, sections included."""
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        out.append(key)
        section = configlib._section(configlib._hints(cls)[f.name])
        if section is not None:
            out += schema_keys(section, key)
    return out


def check_overrides_known(cls: type, overrides: Sequence[str]) -> None:
    """``ValueError`` (-> ``resume_overrides: ...``) for an entry that is no key of ``cls``."""
    keys = schema_keys(cls)
    for entry in overrides:
        if entry not in keys:
            import difflib

            near = difflib.get_close_matches(entry, keys, n=1)
            raise ValueError(f"resume_overrides: {entry!r} is not a config key"
                             + (f" (did you mean {near[0]!r}?)" if near else "")
                             + "; expected dotted keys or sections, e.g. [eval.every,rollout]")


# ----------------------------------------------------------------------------- the guard
def run_identity(data: dict[str, Any]) -> dict[str, Any]:
    """What makes two launches the same kind of run: the job and the environment."""
    env = data.get("env") or {}
    ident = {"job": data.get("job"), "env.kind": env.get("kind")}
    if data.get("job") in ("qd_eval", "qd_label"):  # the suite, not the (unused) environment
        return {"job": data.get("job"), "qd.benchmark": (data.get("qd") or {}).get("benchmark")}
    if env.get("kind") == "gym":
        ident["env.gym"] = env.get("gym")
    return ident


def check_run_dir(cfg: Any, run_dir: Path) -> None:
    """Raises `ResumeError` when ``cfg`` may not write into ``run_dir`` (see the module docstring)."""
    history = config_history(run_dir)
    new = configlib.to_dict(cfg)
    if history and not cfg.overwrite:
        first = _read(history[0])
        had, has = run_identity(first), run_identity(new)
        if had != has:
            what = ", ".join(f"{k}={v!r}" for k, v in had.items())
            now = ", ".join(f"{k}={v!r}" for k, v in has.items() if had.get(k) != v)
            raise ResumeError(
                f"name={cfg.name!r}: {run_dir} holds the results of another run ({what}; {history[0].name}), "
                f"not this launch's {now}; pick another name= (its results are never overwritten by a "
                f"different job)")
    if not cfg.resume:
        if history and not cfg.overwrite:
            held = ", ".join(f for f in (FIRST_CONFIG, "summary.json", "checkpoints") if (run_dir / f).exists())
            raise ResumeError(
                f"name={cfg.name!r}: {run_dir} holds a run already ({held}); a launch never overwrites one silently: "
                f"set name= to another name to keep both, overwrite=true to replace it, or resume=true to continue it")
        return
    if not history:
        raise ResumeError(
            f"resume=true: {run_dir} holds no run to resume (no {FIRST_CONFIG}); drop resume=true to start it "
            f"afresh, or set name= to an existing run under runs_dir={cfg.runs_dir!r}")
    last = history[-1]
    defaults = configlib.to_dict(type(cfg)())
    diffs = config_diff(_read(last), new, defaults)
    allowed = tuple(ALWAYS_ALLOWED) + tuple(cfg.resume_overrides)
    refused = [(k, a, b) for k, a, b in diffs if not any(_covers(e, k) for e in allowed)]
    if refused:
        listing = "; ".join(f"{k}: {_show(a)} -> {_show(b)}" for k, a, b in refused)
        keys = ",".join(k for k, _, _ in refused)
        raise ResumeError(
            f"resume=true: the config differs from the one {run_dir} last ran with ({last.name}) in "
            f"{len(refused)} key(s): {listing}. A resume continues the same training; to change these keys "
            f"anyway, name them: resume_overrides=[{keys}] (or start afresh under another name=)")


def checked_run_dir(cfg: Any, *, refuse_checkpoints: bool = False) -> Path:
    """``runs_dir/name`` once `check_run_dir` allows this launch into it; with ``refuse_checkpoints``
    a run with checkpoints is refused unless ``resume=true`` (a training job must not start over it).
    Nothing is written: `record_config` creates the directory once the job's inputs are checked."""
    run_dir = Path(cfg.runs_dir) / cfg.name
    check_run_dir(cfg, run_dir)  # another job's results; resume=true with nothing; a changed config
    if refuse_checkpoints and run_dir.exists() and not (cfg.resume or cfg.overwrite) \
            and any((run_dir / "checkpoints").glob("*/*")):
        raise FileExistsError(f"{run_dir}: a run with checkpoints exists; set resume=true to continue it or pick "
                              "another name=")
    return run_dir


def free_run_name(runs_dir: str | Path, name: str) -> str:
    """``name`` when ``runs_dir/name`` holds no run (no ``config.yaml``), else the first of
    ``name-2``, ``name-3``, ... that holds none."""
    n, candidate = 1, name
    while config_history(Path(runs_dir) / candidate):
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def check_not_shortened(cfg: Any, phase: str, start: int, total: int, key: str) -> None:
    """A resume whose checkpoint is past the phase's end (``key`` lowered below it) is refused."""
    if start > total:
        raise ResumeError(f"{key}={total}: the run's {phase} checkpoint is at step {start} already; a resume "
                          f"can extend a run, not shorten it (expected {key} >= {start}, or start afresh under "
                          f"another name=)")


# ----------------------------------------------------------------------------- metrics
def truncate_metrics(path: Path, drop: Callable[[dict[str, Any]], bool]) -> int:
    """Rewrites ``path`` (metrics.jsonl) without the records ``drop`` selects and without lines
    that do not parse (a record cut short by a crash); atomically (a temporary file, then
    ``os.replace``). Returns the number of lines removed."""
    if not path.exists():
        return 0
    kept, removed = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            removed += 1
            continue
        if isinstance(rec, dict) and drop(rec):
            removed += 1
        else:
            kept.append(line)
    if removed:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return removed


def after_checkpoint(phase: str, start: int) -> Callable[[dict[str, Any]], bool]:
    """The records a resume of ``phase`` from its checkpoint ``start`` logs again: the phase's
    steps from ``start`` on, RL's evaluations after ``start``, the evaluation after SFT when SFT
    resumes before its end, and the final evaluation."""

    def drop(rec: dict[str, Any]) -> bool:
        p, step = rec.get("phase"), rec.get("step", 0)
        if p == phase and isinstance(step, int) and step >= start:
            return True
        if p == "eval" and rec.get("label") == "after":
            return True
        if phase == "sft" and p == "eval" and rec.get("label") == "after_sft" and isinstance(step, int) \
                and step > start:
            return True
        return phase == "rl" and p == "eval" and rec.get("label") == "during" and isinstance(step, int) \
            and step > start

    return drop


__all__ = ["ALWAYS_ALLOWED", "ResumeError", "after_checkpoint", "check_not_shortened", "check_overrides_known",
           "check_run_dir", "checked_run_dir", "config_diff", "config_history", "free_run_name", "record_config",
           "run_identity", "schema_keys", "truncate_metrics"]

"""Weights & Biases as an optional sink beside metrics.jsonl and TensorBoard (``log.wandb=true``).

``pip install 'jaxagent[wandb]'``; `wandb` is imported only when a run asks for it, and a launch
without the package is refused before anything is built (`check_wandb`). A run logs:

- **scalars**: the ones `RunLog.log` sends to TensorBoard, named as there (``<phase>/<key>``, every
  finite number, not ``step`` or ``time``). SFT, RL and evaluation each count their steps from 0,
  so no ``step=`` is passed to ``wandb.log`` (W&B drops a step lower than the last one it saw);
  every row carries its phase's own step, ``<phase>/step``, and each metric is defined with that
  as its x-axis (``define_metric(name, step_metric="<phase>/step")``);
- **the trajectory table** ``rl/trajectories``: one `wandb.Table` per RL iteration (a table is
  immutable once logged: each iteration logs a new one under the same key, at its ``rl/step``),
  the first ``log.wandb_table_rows`` episodes of ``trajectories/iter_<i>.jsonl`` with the columns
  of `TABLE_COLUMNS` (see `table_rows`);
- **the plots**: the PNGs `jaxagent.eval.report.plot_run` writes, as ``plots/<name>`` images.

A run's W&B id is kept in ``runs/<name>/wandb_run_id``: a resumed run (``resume=true``) continues
the same W&B run (``resume="allow"``); with ``log.wandb_mode=offline`` the files go to
``runs/<name>/wandb/offline-run-*`` (each launch its own folder, same id) for a later ``wandb sync``.
"""

from __future__ import annotations

import json
import math
import secrets
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxagent import configlib

RUN_ID_FILE = "wandb_run_id"
TABLE_KEY = "rl/trajectories"
TABLE_COLUMNS = ("iteration", "task", "group", "reward", "success", "turns", "termination", "turn_rewards",
                 "turn_advantage", "turn_credit", "turn_reactions", "turn_feedback", "final_reaction", "info",
                 "transcript")
_RECORD_KEYS = ("step", "time")
_FEEDBACK = {0: None, 1: "information", 2: "correction"}


class WandbMissing(configlib.ConfigError):
    """``log.wandb=true`` without the ``wandb`` package."""


def import_wandb():
    """The ``wandb`` module, or `WandbMissing` naming the key and the extra to install."""
    try:
        import wandb
    except ImportError as e:
        raise WandbMissing(f"log.wandb=true: the wandb package is not installed ({e}); install it with "
                           "pip install 'jaxagent[wandb]', or set log.wandb=false") from None
    return wandb


def check_wandb(cfg) -> None:
    """Before a run builds anything: with ``log.wandb=true`` the ``wandb`` package must import."""
    if cfg.log.wandb:
        import_wandb()


def open_wandb(cfg, run_dir: Path, decode: Callable[[Sequence[int]], str] | None = None) -> WandbSink | None:
    """The run's `WandbSink` when ``cfg.log.wandb`` (else None): ``wandb.init`` with the project,
    entity and mode of ``cfg.log``, ``dir=run_dir``, ``name=cfg.name``, the resolved config; on a
    resume (``cfg.resume``) the id in ``run_dir/wandb_run_id`` (the same W&B run continues).
    ``decode`` (token ids -> text) writes the table's transcripts."""
    if not cfg.log.wandb:
        return None
    wandb = import_wandb()
    log = cfg.log
    id_file = Path(run_dir) / RUN_ID_FILE
    known = id_file.read_text().strip() if cfg.resume and id_file.is_file() else ""
    run_id = known or "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=log.wandb_project, entity=log.wandb_entity, mode=log.wandb_mode, dir=str(run_dir),
                     name=cfg.name, config=configlib.to_dict(cfg), id=run_id, resume="allow",
                     reinit="create_new")  # (wandb>=0.19.10) neither returns nor finishes another active run
    if not known:
        id_file.write_text(run_id + "\n")
    return WandbSink(run, Path(run_dir), table_rows=log.wandb_table_rows, decode=decode,
                     success_threshold=cfg.rl.success_threshold)


class WandbSink:
    """What `RunLog` sends to one W&B run (``run``: what ``wandb.init`` returned); see the module
    docstring. `log` also logs the table of the RL iteration logged before, whose episodes
    ``trajectories/iter_<i>.jsonl`` holds by then (it is written just after its scalars); `finish`
    logs the last one."""

    def __init__(self, run, run_dir: Path, *, table_rows: int = 16, decode: Callable[[Sequence[int]], str] | None = None,
                 success_threshold: float = 1.0):
        self.run = run
        self.dir = Path(run_dir)
        self.table_rows = table_rows
        self.decode = decode
        self.success_threshold = success_threshold
        self._defined: set[str] = set()
        self._pending: int | None = None  # the RL iteration whose table is not logged yet
        self._finished = False

    # ------------------------------------------------------------------ scalars
    def _define(self, name: str, step_metric: str) -> None:
        if step_metric not in self._defined:
            self.run.define_metric(step_metric, hidden=True)
            self._defined.add(step_metric)
        if name not in self._defined:
            self.run.define_metric(name, step_metric=step_metric)
            self._defined.add(name)

    def scalars(self, phase: str, step: int, metrics: Mapping[str, Any]) -> int:
        """``<phase>/<key>`` for every finite number in ``metrics`` (as TensorBoard), with
        ``<phase>/step`` = ``step`` in the same row; returns how many scalars were logged."""
        step_key = f"{phase}/step"
        row: dict[str, Any] = {}
        for key, value in metrics.items():
            v = _finite(value)
            if v is None or key in _RECORD_KEYS:
                continue
            name = f"{phase}/{key}"
            self._define(name, step_key)
            row[name] = v
        if row:
            self.run.log({step_key: int(step), **row})
        return len(row)

    def log(self, phase: str, step: int, metrics: Mapping[str, Any]) -> int:
        """`scalars`, after the pending RL iteration's table; an RL step's table becomes pending."""
        self.flush_table()
        n = self.scalars(phase, step, metrics)
        if phase == "rl":
            self._pending = int(step)
        return n

    # ------------------------------------------------------------------ the trajectory table
    def flush_table(self) -> int:
        """Logs the pending RL iteration's table from its ``trajectories/iter_<i>.jsonl`` (when
        written); returns the rows logged."""
        i, self._pending = self._pending, None
        if i is None or self.table_rows <= 0:
            return 0
        path = self.dir / "trajectories" / f"iter_{i:05d}.jsonl"
        if not path.is_file():
            return 0
        records = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if len(records) >= self.table_rows:
                    break
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError:  # cut short (a crash mid-write): the rows before it
                        break
        return self.table(i, records)

    def table(self, iteration: int, records: Iterable[Mapping[str, Any]]) -> int:
        """Logs ``records`` (`Trajectory.to_dict` records; the first ``table_rows``) as a new
        ``rl/trajectories`` table at ``rl/step`` = ``iteration``; returns the rows logged."""
        rows = table_rows(iteration, list(records)[: self.table_rows], decode=self.decode,
                          success_threshold=self.success_threshold)
        if not rows:
            return 0
        wandb = import_wandb()
        self._define(TABLE_KEY, "rl/step")
        self.run.log({"rl/step": int(iteration), TABLE_KEY: wandb.Table(columns=list(TABLE_COLUMNS), data=rows)})
        return len(rows)

    # ------------------------------------------------------------------ plots, end
    def images(self, paths: Iterable[str | Path]) -> int:
        """The PNG files ``paths`` as images ``plots/<file stem>``; returns how many."""
        wandb = import_wandb()
        imgs = {f"plots/{Path(p).stem}": wandb.Image(str(p)) for p in paths}
        if imgs:
            self.run.log(imgs)
        return len(imgs)

    def finish(self) -> None:
        """Logs the pending table, then ends the W&B run (once)."""
        if self._finished:
            return
        self.flush_table()
        self._finished = True
        self.run.finish()


# ----------------------------------------------------------------------------- table rows
def table_rows(iteration: int, records: Sequence[Mapping[str, Any]], *,
               decode: Callable[[Sequence[int]], str] | None = None, success_threshold: float = 1.0) -> list[list]:
    """One row per record, in the order of `TABLE_COLUMNS`:

    iteration; task (``task_id``); group (``group_id``); reward (the outcome reward); success
    (reward >= ``success_threshold``, as `episode_metrics` counts it); turns (action turns);
    termination; per action turn, as JSON lists: turn_rewards (the environment's step rewards),
    turn_advantage (the fused advantage the update gave the turn's tokens, their mean: the record's
    ``info["credit"]["advantage"]``, `jaxagent.train.rl.record_turn_credit`), turn_credit (JSON: every
    per-turn credit input, e.g. ``r_info``, InfoPO's information gain), turn_reactions (the reaction label of the user message that ends the turn's user-to-user
    segment, null for a turn in no segment or an unlabelled one) and turn_feedback (what the
    feedback after the turn was: ``information``, ``correction`` or null); final_reaction; info
    (the record's ``info`` as JSON without the credit: the environment's counters ...); transcript
    (each message as ``[role] text``; with no ``decode``, its token ids)."""
    from jaxagent.rollout.trajectory import Trajectory

    rows = []
    for rec in records:
        t = Trajectory.from_dict(rec)
        n_turns = len(t.action_spans())
        reactions: list[str | None] = [None] * n_turns
        for turns, label in t.segments():
            for k in turns:
                reactions[k] = label
        reward = float(t.outcome_reward)
        info = dict(t.info)
        credit = dict(info.pop("credit", None) or {})
        advantage = credit.pop("advantage", [None] * n_turns)
        rows.append([int(iteration), str(t.task_id), int(t.group_id), reward,
                     bool(reward >= success_threshold - 1e-9), n_turns, str(t.termination),
                     json.dumps(list(t.turn_rewards)), json.dumps(advantage), json.dumps(credit, sort_keys=True),
                     json.dumps(reactions), json.dumps([_FEEDBACK[k] for k in t.feedback_kinds()]), t.final_reaction,
                     json.dumps(info, default=_json_default, sort_keys=True), transcript(t, decode)])
    return rows


def transcript(t, decode: Callable[[Sequence[int]], str] | None = None) -> str:
    """The episode's messages, one ``[role] content`` block each (a generated message's content
    with its stop token)."""
    out = []
    for s in t.spans:
        ids = t.tokens[s.content_start: s.generated_end if s.generated else s.content_end]
        text = decode(ids) if decode is not None else " ".join(map(str, ids))
        out.append(f"[{s.role}] {text}")
    return "\n".join(out)


def _finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite real number (bools as 0/1), else None (as TensorBoard's)."""
    if isinstance(v, (bool, int, float, np.integer, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    return None


def _json_default(x):
    if isinstance(x, np.generic):
        return x.tolist()
    return str(x)


__all__ = ["RUN_ID_FILE", "TABLE_COLUMNS", "TABLE_KEY", "WandbMissing", "WandbSink", "check_wandb", "import_wandb",
           "open_wandb", "table_rows", "transcript"]

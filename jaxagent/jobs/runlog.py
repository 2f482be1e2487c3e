"""The run directory's live record: metrics.jsonl, TensorBoard scalars (and, with ``log.wandb=true``,
Weights & Biases: `jaxagent.jobs.wandb_log`) and progress lines."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import numpy as np


# ----------------------------------------------------------------------------- run directory
class RunLog:
    """``runs/<name>/``: metrics.jsonl (appended, flushed), live TensorBoard scalars and progress.

    Progress (``progress=True``): on a terminal, one tqdm bar per phase (`start`) whose postfix holds
    the live figures each `log` call names in ``show``; elsewhere (CI logs, pipes) one line per
    logged step, so logs stay readable without carriage returns.

    ``write=False`` (the processes of a multi-process run other than process 0): nothing is
    written or shown, `read` still reads what process 0 wrote.

    ``wandb``: a `jaxagent.jobs.wandb_log.WandbSink` (`open_wandb`) that gets the scalars `log`
    sends to TensorBoard, the RL iterations' trajectory tables, and (`finish_wandb`) the plots;
    `close` finishes it unless told to keep it for the plots."""

    def __init__(self, run_dir: Path, progress: bool = True, *, tty: bool | None = None, write: bool = True,
                 wandb: Any = None):
        self.dir = run_dir
        self.write = write
        self.progress = progress and write
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._bars: dict[str, Any] = {}
        self._metrics = self._tb = None
        self.wandb = wandb if write else None
        if write:
            from jaxagent.eval.report import TensorBoardWriter

            self.dir.mkdir(parents=True, exist_ok=True)
            self._metrics = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")
            self._tb = TensorBoardWriter(self.dir / "tb")  # live scalars: tensorboard --logdir runs/

    def start(self, phase: str, total: int, initial: int = 0, desc: str | None = None) -> None:
        """Opens ``phase``'s progress bar (``total`` steps, ``initial`` already done), on a terminal."""
        if self.progress and self.tty and total > 0:
            from tqdm.auto import tqdm

            self._bars[phase] = tqdm(total=total, initial=initial, desc=desc or phase, file=sys.stderr,
                                     dynamic_ncols=True, leave=True)

    def end(self, phase: str) -> None:
        bar = self._bars.pop(phase, None)
        if bar is not None:
            bar.close()
        if self.wandb is not None:  # the phase's last RL iteration: its trajectories are written by now
            self.wandb.flush_table()

    def log(self, phase: str, step: int, metrics: dict[str, Any], show: tuple[str, ...] = ()) -> None:
        if not self.write:
            return
        rec = {"phase": phase, "step": step, "time": time.time(), **metrics}
        self._metrics.write(json.dumps(rec, default=json_default) + "\n")
        self._metrics.flush()
        self._tb.scalars(step, metrics, phase)
        if self.wandb is not None:
            self.wandb.log(phase, step, metrics)
        if not self.progress:
            return
        figures = {_short(k): _fmt(metrics[k]) for k in show if k in metrics}
        bar = self._bars.get(phase)
        if bar is not None:
            bar.set_postfix(figures, refresh=False)
            bar.update(max(0, step + 1 - bar.n))
        elif phase in self._bars or not self._bars:
            print(f"[{phase} {step}] " + " ".join(f"{k}={v}" for k, v in figures.items()), file=sys.stderr, flush=True)
        else:  # another phase's bar is open (an evaluation during RL): write above it
            from tqdm.auto import tqdm

            tqdm.write(f"[{phase} {step}] " + " ".join(f"{k}={v}" for k, v in figures.items()), file=sys.stderr)

    def event(self, phase: str, step: int, record: dict[str, Any]) -> None:
        """Appends a record to metrics.jsonl only (no TensorBoard scalar, no progress line): what
        happened to the run (``phase="resume"``: a resume, the checkpoints it found damaged)."""
        if not self.write:
            return
        rec = {"phase": phase, "step": step, "time": time.time(), **record}
        self._metrics.write(json.dumps(rec, default=json_default) + "\n")
        self._metrics.flush()

    def truncate(self, drop: Callable[[dict[str, Any]], bool]) -> int:
        """Rewrites metrics.jsonl without the records ``drop`` selects (and a record cut short by a
        crash), atomically (`jaxagent.jobs.resume.truncate_metrics`); returns how many went."""
        from jaxagent.jobs.resume import truncate_metrics

        if not self.write:
            return 0
        self._metrics.close()
        try:
            return truncate_metrics(self.dir / "metrics.jsonl", drop)
        finally:
            self._metrics = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")

    def read(self) -> list[dict[str, Any]]:
        """The records so far (`report.read_metrics`: a record cut short by a crash is skipped)."""
        from jaxagent.eval.report import read_metrics

        path = self.dir / "metrics.jsonl"
        return read_metrics(path) if path.exists() else []

    def close(self, *, keep_wandb: bool = False) -> None:
        """Closes metrics.jsonl and TensorBoard and finishes the W&B run (``keep_wandb``: left open
        for `finish_wandb`, which logs the plots first)."""
        for phase in list(self._bars):
            self.end(phase)
        if self.write:
            self._metrics.close()
            self._tb.close()
        if not keep_wandb:
            self.finish_wandb()

    def finish_wandb(self, plots: Iterable[Path] = ()) -> None:
        """Logs ``plots`` (PNG files) to W&B and finishes the W&B run (nothing without one)."""
        if self.wandb is not None:
            self.wandb.images(plots)
            self.wandb.finish()
            self.wandb = None


def json_default(x):
    if isinstance(x, (np.generic, jax.Array)):
        return np.asarray(x).tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _short(key: str) -> str:
    """A metric's name on the progress line: its last part (``update/kl_ref`` -> ``kl_ref``), but
    ``sampled/success`` -> ``sampled_success`` (beside the greedy ``success``)."""
    head, _, last = key.rpartition("/")
    return f"sampled_{last}" if head == "sampled" else last


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)

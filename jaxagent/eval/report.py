"""Reports on a run: read ``runs/<name>/metrics.jsonl`` back and turn it into plots, TensorBoard
scalars, InfoPO-style collapse diagnostics and a before/after table.

Input: `jaxagent.jobs.RunLog` writes one JSON object per line,
``{"phase": "sft" | "rl" | "eval", "step": int, "time": unix_seconds, ...metrics}``.

Outputs:

- `read_metrics(path)`: the records, in file order. Blank lines are skipped; a truncated last line
  (the process died mid-write) is dropped; a line where a resumed run appended a whole record to
  such a partial line keeps the whole record.
- `TensorBoardWriter(log_dir).scalars(step, metrics, prefix)`: one TensorBoard scalar
  ``<prefix>/<key>`` per finite number in ``metrics`` (lists, strings, None, NaN and inf are
  skipped; so are the record keys ``step`` and ``time``). `export_tensorboard` replays a whole
  metrics list (prefix = phase, wall time = the record's ``time``).
- `plot_run(metrics, out_dir)`: PNG files (matplotlib, Agg canvas, no display, pyplot untouched),
  each built by its own function (`PLOTS`: name -> figure builder, for inspection):
    * ``reward.png`` (`reward_figure`): RL outcome reward and success rate per RL iteration on a
      [0, 1] axis, with the evaluations' success rates as labelled points (``during`` at its step =
      the number of RL iterations done, ``after`` one past the last RL iteration, ``before`` at 0 —
      or, when the run did SFT, at -1 ("pre-SFT"), the SFT span shaded and a dashed line at 0
      where RL starts, so the SFT gain is not read as RL's);
    * ``turns_length.png`` (`turns_length_figure`): two panels, turns per episode and response
      tokens per turn, per RL iteration, each axis from 0;
    * ``infogain_heatmap.png`` (`infogain_figure`): information gain by action-turn (y, 1 = first
      action turn) over RL iterations (x), from ``info/gain_by_turn`` (as in the InfoPO paper's
      Figure 6); grey cells are turn indices with no value in that iteration (no episode reached
      that turn), as the note under the plot says;
    * ``sft_loss.png`` (`sft_loss_figure`): SFT loss and NLL per SFT step, from 0: one line,
      "loss (= NLL)", when they are the same curve (`loss_equals_nll`), two when they differ.
    * ``rl_diagnostics.png`` (`diagnostics_figure`): the gradient's signal-to-noise, KL to the old
      and reference policies, clip fraction, entropy and credit coverage per RL iteration.
  Iteration and step axes have integer ticks. A plot whose data is absent is not written; the
  paths written are returned.
- `infopo_diagnostics(metrics)`: the numbers that tell whether RL training collapsed (see the
  function for the rule).
- `summary_table(before, after)`: a fixed-width ``metric | before | after | change`` text table
  for the end-of-run printout.

Resumed runs re-run (and re-log) the iterations after their last checkpoint, so a metrics file can
hold a step twice; plots and diagnostics keep the last record per (phase, step[, label]).

``python -m jaxagent.eval.report runs/<name> [--tensorboard]`` writes the plots to
``runs/<name>/plots/`` (and the scalars to ``runs/<name>/tb/``) and prints the diagnostics.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import numpy as np

# A run collapsed when its evaluated success fell this far from its best, or when the policy's
# entropy fell below this fraction of its first value.
COLLAPSE_DROP = 0.2
COLLAPSE_ENTROPY_RATIO = 0.05

_RECORD_KEYS = ("step", "time")


# ----------------------------------------------------------------------------- reading
def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in file order.

    Blank lines are skipped and an unparsable last line (a crash mid-write) is ignored. A resumed
    run appends to such a partial line, so an unparsable line in the middle keeps the complete
    record that ends it; a middle line with no complete record raises ``ValueError`` (path:line).
    """
    path = Path(path)
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    out: list[dict[str, Any]] = []
    for k, (lineno, line) in enumerate(numbered):
        rec = _parse_record(line)
        if rec is None:
            if k == len(numbered) - 1:
                break  # truncated last line
            raise ValueError(f"{path}:{lineno}: not a JSON object: {line[:80]!r}")
        out.append(rec)
    return out


def _parse_record(line: str) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
        return rec if isinstance(rec, dict) else None
    except json.JSONDecodeError:
        pass
    # a partial record followed by a complete one: the complete one starts at some later "{"
    start = line.find("{", 1)
    while start != -1:
        try:
            rec = json.loads(line[start:])
            if isinstance(rec, dict):
                return rec
        except json.JSONDecodeError:
            pass
        start = line.find("{", start + 1)
    return None


def _finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite real number (bools count as 0/1), else None."""
    if isinstance(v, (bool, int, float, np.integer, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    return None


def _phase(metrics: Iterable[Mapping[str, Any]], phase: str) -> list[Mapping[str, Any]]:
    """The records of one phase, the last one per step (per (step, label) for evaluations).

    SFT and RL records are sorted by step; evaluation records keep file order (of their last copy).
    """
    last: dict[Any, tuple[int, Mapping[str, Any]]] = {}
    for i, rec in enumerate(metrics):
        if rec.get("phase") != phase:
            continue
        key = (rec.get("step"), rec.get("label")) if phase == "eval" else rec.get("step")
        last[key] = (i, rec)
    recs = sorted(last.values(), key=lambda t: t[0])
    if phase != "eval":
        recs.sort(key=lambda t: (t[1].get("step") is None, t[1].get("step") or 0, t[0]))
    return [r for _, r in recs]


def _series(recs: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
    return np.array([np.nan if _finite(r.get(key)) is None else _finite(r.get(key)) for r in recs], np.float64)


def _steps(recs: Sequence[Mapping[str, Any]]) -> np.ndarray:
    return np.array([r.get("step", i) for i, r in enumerate(recs)], np.float64)


# ----------------------------------------------------------------------------- TensorBoard
class TensorBoardWriter:
    """TensorBoard scalars through ``tensorboardX.SummaryWriter`` (event files under ``log_dir``)."""

    def __init__(self, log_dir: str | Path):
        from tensorboardX import SummaryWriter

        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(logdir=str(self.log_dir))

    def scalars(self, step: int, metrics: Mapping[str, Any], prefix: str, walltime: float | None = None,
                skip: Sequence[str] = _RECORD_KEYS) -> int:
        """Writes ``<prefix>/<key>`` for every finite number in ``metrics`` (not the keys in ``skip``);
        lists, strings, None and NaN/inf are skipped. Returns how many scalars were written."""
        n = 0
        for key, value in metrics.items():
            v = _finite(value)
            if v is None or key in skip:
                continue
            tag = f"{prefix}/{key}" if prefix else str(key)
            self._writer.add_scalar(tag, v, global_step=int(step), walltime=walltime)
            n += 1
        return n

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def export_tensorboard(metrics: Iterable[Mapping[str, Any]], log_dir: str | Path) -> int:
    """Replays a metrics list into TensorBoard: prefix = the record's phase, step = its step, wall
    time = its ``time``. Returns the number of scalars written."""
    n = 0
    with TensorBoardWriter(log_dir) as tb:
        for i, rec in enumerate(metrics):
            body = {k: v for k, v in rec.items() if k != "phase"}
            n += tb.scalars(int(rec.get("step", i)), body, str(rec.get("phase", "metrics")),
                            walltime=_finite(rec.get("time")))
    return n


# ----------------------------------------------------------------------------- plots
def gain_by_turn_matrix(metrics: Iterable[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """``(steps [S], gain [T, S])``: ``info/gain_by_turn`` of the RL records as a turn x iteration
    grid over every RL step from the first to the last that has the key; NaN where an iteration
    has no record, or no value (None/NaN) for that turn index. ``S == 0`` when no record has it."""
    recs = [r for r in _phase(metrics, "rl") if isinstance(r.get("info/gain_by_turn"), list)
            and isinstance(r.get("step"), int)]
    if not recs:
        return np.zeros((0,), np.int64), np.zeros((0, 0), np.float64)
    first, last = recs[0]["step"], recs[-1]["step"]
    steps = np.arange(first, last + 1)
    turns = max(len(r["info/gain_by_turn"]) for r in recs)
    grid = np.full((turns, len(steps)), np.nan)
    for r in recs:
        for t, g in enumerate(r["info/gain_by_turn"]):
            v = _finite(g)
            if v is not None:
                grid[t, r["step"] - first] = v
    return steps, grid


def _eval_x(rec: Mapping[str, Any], rl_steps: np.ndarray, sft: bool = False) -> float:
    """Where an evaluation sits on the RL-iteration axis: ``before`` at 0 (at -1 when SFT ran
    between it and RL, so that SFT's gain is not drawn as RL's), ``after`` one past the last RL
    iteration, ``during`` at its step (the RL iterations done)."""
    label = rec.get("label")
    if len(rl_steps) and label == "before":
        return -1.0 if sft else 0.0
    if label == "after_sft":  # the SFT policy: where RL starts
        return 0.0
    if len(rl_steps) and label == "after":
        return float(np.nanmax(rl_steps) + 1)
    return float(rec.get("step", 0))


def new_figure(nrows: int = 1, height: float = 4.5):
    """A figure of ``nrows`` stacked axes (Agg canvas, no display), the report plots' common size."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(nrows, 1, i + 1) for i in range(nrows)]
    return fig, axes


def save_figure(fig, path: Path) -> Path:
    """``fig`` as a PNG at ``path`` (no software stamp: the same plot writes the same bytes)."""
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def _integer_ticks(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _rate_limits(ax, *series: np.ndarray) -> None:
    """A rate's axis: all of [0, 1] (wider when a value falls outside), room above for labels, so a
    small change looks small."""
    vals = np.concatenate([v[np.isfinite(v)] for v in series] + [np.zeros(0)])
    lo, hi = min(0.0, float(vals.min(initial=0.0))), max(1.0, float(vals.max(initial=1.0)))
    ax.set_ylim(lo - 0.03 * (hi - lo), hi + 0.12 * (hi - lo))


def _from_zero(ax, *series: np.ndarray) -> None:
    """A count's or loss's axis: from 0 (or the lowest negative value) to above the largest, so
    the range spans the values' own scale and a few percent change stays a few percent."""
    vals = np.concatenate([v[np.isfinite(v)] for v in series] + [np.zeros(0)])
    lo, hi = min(0.0, float(vals.min(initial=0.0))), max(0.0, float(vals.max(initial=0.0)))
    if hi - lo <= 0:
        hi = lo + 1.0
    ax.set_ylim(lo - 0.02 * (hi - lo) if lo < 0 else 0.0, hi + 0.1 * (hi - lo))


def reward_figure(metrics: Sequence[Mapping[str, Any]]):
    """``reward.png``'s figure (None without RL reward or success): RL reward and success per RL
    iteration on a [0, 1] axis, the evaluations' success as labelled points, and, when the run
    did SFT, the ``before`` evaluation at -1, the SFT span shaded and RL's start marked at 0."""
    rl, ev, sft = _phase(metrics, "rl"), _phase(metrics, "eval"), _phase(metrics, "sft")
    x = _steps(rl)
    reward, success = _series(rl, "reward"), _series(rl, "success")
    if not (np.isfinite(reward).any() or np.isfinite(success).any()):
        return None
    from matplotlib.ticker import FuncFormatter

    did_sft = bool(sft) and len(x) > 0
    fig, (ax,) = new_figure()
    if did_sft:
        ax.axvspan(-1.0, 0.0, color="0.85", alpha=0.6, lw=0, label="SFT (between the first eval and RL)")
        ax.axvline(0.0, color="0.3", ls="--", lw=1.0, label="RL starts (after SFT)")
    if np.isfinite(reward).any():
        ax.plot(x, reward, color="tab:blue", lw=1.5, label="RL reward")
    if np.isfinite(success).any():
        ax.plot(x, success, color="tab:green", lw=1.5, label="RL success")
    pts = [(_eval_x(r, x, did_sft), _finite(r.get("success")), str(r.get("label", ""))) for r in ev]
    pts = [p for p in pts if p[1] is not None]
    sampled = [(_eval_x(r, x, did_sft), _finite(r.get("sampled/success"))) for r in ev]
    sampled = [p for p in sampled if p[1] is not None]
    if sampled:
        ax.scatter([p[0] for p in sampled], [p[1] for p in sampled], color="tab:orange", marker="o", zorder=3,
                   label=f"eval success at the training temperature ({ev[-1].get('sampled/temperature', '')})")
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="tab:red", marker="D", zorder=3,
                   label="eval success")
        right = max(p[0] for p in pts)
        for px, py, label in pts:
            shown = "before (pre-SFT)" if did_sft and label == "before" else label
            last = px == right and px > 0    # the rightmost label reads leftwards, inside the axes
            ax.annotate(f"{shown} {py:.2f}".strip(), (px, py), textcoords="offset points",
                        xytext=(-4 if last else 4, 6), ha="right" if last else "left", fontsize=8, color="tab:red")
    ax.margins(x=0.08)
    _rate_limits(ax, reward, success, np.array([p[1] for p in pts + sampled], np.float64))
    _integer_ticks(ax.xaxis)
    if did_sft:   # -1 is not an iteration: it is the evaluation before SFT
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda v, _: "pre-SFT" if round(v) == -1 else (f"{v:g}" if v >= 0 else "")))
    ax.set_xlabel("RL iteration")
    ax.set_ylabel("reward / success")
    ax.set_title("Outcome reward and success")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return fig


def turns_length_figure(metrics: Sequence[Mapping[str, Any]]):
    """``turns_length.png``'s figure (None without the data): turns per episode and response
    tokens per turn per RL iteration, each axis from 0."""
    rl = _phase(metrics, "rl")
    x = _steps(rl)
    turns, tokens = _series(rl, "turns"), _series(rl, "response_tokens")
    if not (np.isfinite(turns).any() or np.isfinite(tokens).any()):
        return None
    fig, (ax1, ax2) = new_figure(2, height=6)
    ax1.plot(x, turns, color="tab:purple", lw=1.5)
    ax1.set_ylabel("turns / episode")
    ax1.set_title("Episode turns and response length")
    ax2.plot(x, tokens, color="tab:orange", lw=1.5)
    ax2.set_ylabel("response tokens / turn")
    ax2.set_xlabel("RL iteration")
    for a, values in ((ax1, turns), (ax2, tokens)):
        a.grid(alpha=0.3)
        _integer_ticks(a.xaxis)
        _from_zero(a, values)
    return fig


#: rl_diagnostics.png's panels: (title, y label, [(metrics key, legend), ...], rate axis)
DIAGNOSTIC_PANELS = (
    ("Gradient signal-to-noise", "cosine", [("update/grad_cos_halves", "cos(even, odd microbatch gradients)")],
     False),
    ("KL and clipping", "nats / share", [("update/approx_kl_k3", "KL(old || new)"), ("update/kl_ref", "KL to ref"),
                                         ("update/clip_frac", "clip fraction")], False),
    ("Entropy", "nats / token", [("update/entropy", "policy entropy")], False),
    ("Credit coverage", "share", [("credit/zero_adv_group_share", "groups with A_ext = 0"),
                                  ("credit/cover/ext", "tokens with A_ext != 0"),
                                  ("credit/cover/info", "tokens with A_info != 0"),
                                  ("credit/cover/proc", "tokens with A_proc != 0")], True),
)


def diagnostics_figure(metrics: Sequence[Mapping[str, Any]]):
    """``rl_diagnostics.png``'s figure (None without RL records): per RL iteration the gradient's
    signal-to-noise (`DIAGNOSTIC_PANELS`), KL to the old and the reference policy with the clip
    fraction, the entropy, and the credit coverage (shares of non-discriminating groups and of
    agent tokens each term reaches). Panels without data are left out."""
    rl = _phase(metrics, "rl")
    if not rl:
        return None
    x = _steps(rl)
    panels = [(t, y, [(k, lab, _series(rl, k)) for k, lab in keys], rate) for t, y, keys, rate in DIAGNOSTIC_PANELS]
    panels = [(t, y, [c for c in curves if np.isfinite(c[2]).any()], rate) for t, y, curves, rate in panels]
    panels = [p for p in panels if p[2]]
    if not panels:
        return None
    fig, axes = new_figure(len(panels), height=max(3.5, 2.6 * len(panels)))
    for ax, (title, ylabel, curves, rate) in zip(axes, panels):
        for _, label, values in curves:
            ax.plot(x, values, lw=1.5, marker=".", label=label)
        (_rate_limits if rate else _from_zero)(ax, *[c[2] for c in curves])
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _integer_ticks(ax.xaxis)
        ax.legend(loc="best", fontsize=8)
    axes[-1].set_xlabel("RL iteration")
    return fig


GREY_CELLS_NOTE = "grey: no valid turn at this index (no episode of that iteration reached it)"


def infogain_figure(metrics: Sequence[Mapping[str, Any]]):
    """``infogain_heatmap.png``'s figure (None without ``info/gain_by_turn``): gain by action turn
    (y) over RL iterations (x); grey cells, explained under the plot, have no value."""
    steps, grid = gain_by_turn_matrix(metrics)
    if not grid.size:
        return None
    import matplotlib
    from matplotlib.colors import TwoSlopeNorm

    fig, (ax,) = new_figure()
    vals = grid[np.isfinite(grid)]
    lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 1.0)
    if lo < 0 < hi:
        cmap, norm = matplotlib.colormaps["RdBu_r"], TwoSlopeNorm(0.0, lo, hi)
    else:
        cmap, norm = matplotlib.colormaps["viridis"], None
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", origin="lower", interpolation="nearest",
                   cmap=cmap.with_extremes(bad="lightgrey"), norm=norm,
                   extent=(steps[0] - 0.5, steps[-1] + 0.5, 0.5, grid.shape[0] + 0.5))
    fig.colorbar(im, ax=ax, label="information gain")
    ax.set_xlabel("RL iteration")
    ax.set_ylabel("action turn")
    _integer_ticks(ax.xaxis)
    if grid.shape[0] <= 20:
        ax.set_yticks(range(1, grid.shape[0] + 1))
    else:
        _integer_ticks(ax.yaxis)
    ax.set_title("Information gain by turn")
    if not np.isfinite(grid).all():
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(facecolor="lightgrey", edgecolor="0.5", label=GREY_CELLS_NOTE)],
                  loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8, frameon=False)
    return fig


#: loss and NLL are drawn as one line when every step's |loss - nll| is at most this share of
#: max(1, the largest |value|): both are float32 means of the same token NLLs when SFT has no other
#: loss term (token_mean aggregation, unit row weights), so they differ only by summation order
#: (~1e-7 relative); any real difference (another aggregation, row weights) is orders larger, and
#: 1e-5 of the axis is far below a pixel.
LOSS_EQUALS_NLL_RTOL = 1e-5


def loss_equals_nll(loss: np.ndarray, nll: np.ndarray) -> bool:
    """Whether the SFT ``loss`` and ``nll`` series ([steps], NaN = not logged) are the same curve:
    logged at the same steps and within `LOSS_EQUALS_NLL_RTOL` there."""
    have_l, have_n = np.isfinite(loss), np.isfinite(nll)
    if not have_l.any() or not np.array_equal(have_l, have_n):
        return False
    scale = max(1.0, float(np.abs(loss[have_l]).max()), float(np.abs(nll[have_n]).max()))
    return float(np.abs(loss[have_l] - nll[have_n]).max()) <= LOSS_EQUALS_NLL_RTOL * scale


def sft_loss_figure(metrics: Sequence[Mapping[str, Any]]):
    """``sft_loss.png``'s figure (None without SFT records): loss and NLL per SFT step, from 0 --
    one line, "loss (= NLL)", when they are the same curve (`loss_equals_nll`: the loss is the token-mean
    NLL itself), two when they differ."""
    sft = _phase(metrics, "sft")
    loss, nll = _series(sft, "loss"), _series(sft, "nll")
    if not (np.isfinite(loss).any() or np.isfinite(nll).any()):
        return None
    fig, (ax,) = new_figure()
    xs = _steps(sft)
    if loss_equals_nll(loss, nll):
        ax.plot(xs, loss, color="tab:blue", lw=1.5, label="loss (= NLL)")
    else:
        if np.isfinite(loss).any():
            ax.plot(xs, loss, color="tab:blue", lw=1.5, label="loss")
        if np.isfinite(nll).any():
            ax.plot(xs, nll, color="tab:gray", lw=1.0, ls="--", label="NLL (token mean)")
    ax.set_xlabel("SFT step")
    ax.set_ylabel("loss")
    ax.set_title("SFT loss")
    _integer_ticks(ax.xaxis)
    _from_zero(ax, loss, nll)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return fig


PLOTS = (("reward.png", reward_figure), ("turns_length.png", turns_length_figure),
         ("infogain_heatmap.png", infogain_figure), ("sft_loss.png", sft_loss_figure),
         ("rl_diagnostics.png", diagnostics_figure))
"""The run's plots: file name and the function that builds its figure from the metrics."""


def plot_run(metrics: Sequence[Mapping[str, Any]], out_dir: str | Path) -> list[Path]:
    """Writes the run's PNG plots (see the module docstring) to ``out_dir``; returns their paths.
    A plot whose data is absent is skipped."""
    out = Path(out_dir)
    written: list[Path] = []
    for name, make in PLOTS:
        fig = make(metrics)
        if fig is not None:
            out.mkdir(parents=True, exist_ok=True)
            written.append(save_figure(fig, out / name))
    return written


# ----------------------------------------------------------------------------- diagnostics
def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    a, b = a - a.mean(), b - b.mean()
    return float(np.dot(a, b) / math.sqrt(float(np.dot(a, a)) * float(np.dot(b, b))))


def _mean(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else None


def infopo_diagnostics(metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Collapse diagnostics of an RL run.

    From the ``during``/``after`` evaluations (file order; None when there are none):
    ``final_success`` (the last), ``best_success`` (the max), ``best_to_final_drop`` (best - final).
    From the RL records: ``avg_turns``, ``avg_response_tokens`` (means; None without RL records),
    ``length_reward_corr`` (Pearson correlation of ``response_tokens`` and ``reward`` across
    iterations; 0 with fewer than 3 iterations or when either is constant), ``entropy_ratio``
    (last / first ``update/entropy``; None when unavailable or the first is not positive).

    Rule: ``collapse`` is True when ``best_to_final_drop >= COLLAPSE_DROP`` (0.2, with 1e-9
    tolerance for float rounding) or ``entropy_ratio < COLLAPSE_ENTROPY_RATIO`` (0.05: the last
    entropy fell below 5% of the first); ``collapse_reasons`` says which.
    """
    ev = [r for r in _phase(metrics, "eval") if r.get("label") in ("during", "after")]
    succ = [s for s in (_finite(r.get("success")) for r in ev) if s is not None]
    final = succ[-1] if succ else None
    best = max(succ) if succ else None
    drop = best - final if succ else None

    rl = _phase(metrics, "rl")
    ent = _series(rl, "update/entropy")
    ent = ent[np.isfinite(ent)]
    ratio = float(ent[-1] / ent[0]) if ent.size and ent[0] > 0 else None

    reasons = []
    if drop is not None and drop >= COLLAPSE_DROP - 1e-9:
        reasons.append(f"eval success fell {drop:.3g} from its best {best:.3g} (>= {COLLAPSE_DROP})")
    if ratio is not None and ratio < COLLAPSE_ENTROPY_RATIO:
        reasons.append(f"entropy fell to {ratio:.3g} of its first value (< {COLLAPSE_ENTROPY_RATIO})")
    return {
        "final_success": final,
        "best_success": best,
        "best_to_final_drop": drop,
        "collapse": bool(reasons),
        "collapse_reasons": reasons,
        "avg_turns": _mean(_series(rl, "turns")),
        "avg_response_tokens": _mean(_series(rl, "response_tokens")),
        "length_reward_corr": _pearson(_series(rl, "response_tokens"), _series(rl, "reward")),
        "entropy_ratio": ratio,
    }


# ----------------------------------------------------------------------------- table
def _fmt(v: float | None, sign: bool = False) -> str:
    if v is None:
        return "-"
    spec = ".1f" if abs(v) >= 100 else ".3f"
    return format(v, ("+" if sign else "") + spec)


def eval_table(result: Mapping[str, Any],
               keys: Sequence[str] = ("success", "sampled/success", "reward", "sampled/reward", "turns",
                                      "response_tokens")) -> str:
    """A fixed-width ``metric | value`` table of one evaluation (job=eval), one row per key present."""
    rows = [("metric", "value")] + [(k, _fmt(_finite(result.get(k)))) for k in keys if k in result]
    w = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    lines = [f"{a.ljust(w[0])} | {b.rjust(w[1])}" for a, b in rows]
    return "\n".join([lines[0], "-" * w[0] + "-+-" + "-" * w[1]] + lines[1:])


def summary_table(before: Mapping[str, Any], after: Mapping[str, Any],
                  keys: Sequence[str] = ("success", "sampled/success", "reward", "sampled/reward", "turns",
                                         "response_tokens"),
                  after_sft: Mapping[str, Any] | None = None) -> str:
    """A fixed-width ``metric | before | after | change`` table (change = after - before; ``-`` where
    a value is missing or not a finite number). One header, one rule, one row per key present in
    either evaluation. With ``after_sft`` (an sft+rl run): ``metric | before | after SFT | after |
    SFT | RL``, the last two the gain of each stage (after SFT - before, after - after SFT)."""
    keys = [k for k in keys if k in before or k in after]

    def change(a, b):
        return _fmt(a - b, sign=True) if a is not None and b is not None else "-"

    if after_sft is None:
        rows = [("metric", "before", "after", "change")]
        for k in keys:
            b, a = _finite(before.get(k)), _finite(after.get(k))
            rows.append((k, _fmt(b), _fmt(a), change(a, b)))
    else:
        rows = [("metric", "before", "after SFT", "after", "SFT", "RL")]
        for k in keys:
            b, m, a = _finite(before.get(k)), _finite(after_sft.get(k)), _finite(after.get(k))
            rows.append((k, _fmt(b), _fmt(m), _fmt(a), change(m, b), change(a, m)))
    n = len(rows[0])
    w = [max(len(r[i]) for r in rows) for i in range(n)]

    def line(r):
        return " | ".join([r[0].ljust(w[0])] + [c.rjust(w[i]) for i, c in enumerate(r) if i]).rstrip()

    return "\n".join([line(rows[0]), "-+-".join("-" * x for x in w)] + [line(r) for r in rows[1:]])


# ----------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxagent.eval.report", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path, help="runs/<name> (holds metrics.jsonl)")
    p.add_argument("--out", type=Path, default=None, help="plot directory (default: <run_dir>/plots)")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard scalars to <run_dir>/tb")
    args = p.parse_args(argv)
    metrics = read_metrics(args.run_dir / "metrics.jsonl")
    for path in plot_run(metrics, args.out or args.run_dir / "plots"):
        print(path)
    if args.tensorboard:
        export_tensorboard(metrics, args.run_dir / "tb")
    evals = _phase(metrics, "eval")
    before = next((r for r in evals if r.get("label") == "before"), None)
    after = next((r for r in reversed(evals) if r.get("label") == "after"), None)
    after_sft = next((r for r in evals if r.get("label") == "after_sft"), None)
    if before is not None and after is not None:
        print(summary_table(before, after, after_sft=after_sft))
    print(json.dumps(infopo_diagnostics(metrics), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Q&D reports (host code): an arm's readings, per-task rows, the paired comparison of two arms,
the plots and the printed table of ``job=qd_eval`` (docs/QD.md).

Every reading is a mean over tasks of the task's mean over its runs (rollout seeds); undefined
readings (NaN: no required evidence, no eligible edge, ...) are left out of both means. The
comparison pairs the two arms' runs by (task, seed) (`jaxagent.qd.metrics.pair_runs`) and reads
each pair at equal spend (both at the lower question count, the spec's symmetric default) and at
their own stops; per-task differences get a BCa interval over tasks, the "decided" verdict (three
50,000-resample runs), a sign-flip p-value and the minimum detectable effect
(`jaxagent.eval.qd_stats.compare_arms`).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxagent.eval.qd_stats import compare_arms
from jaxagent.eval.report import new_figure, save_figure
from jaxagent.qd import metrics as M
from jaxagent.qd.graphs import NeedGraph
from jaxagent.qd.transcript import QDRun

#: The equal-spend rows of the spec's Table 2 (name, metric(run, graph, k)).
SPEND_ROWS = ("coverage", "dwr", "deepest", "breadth", "out_of_order")


def _nanmean(xs) -> float:
    xs = [float(x) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(xs)) if xs else math.nan


def _task_mean(rows: Sequence[tuple[str, float]]) -> float:
    by: dict[str, list[float]] = defaultdict(list)
    for task, v in rows:
        by[task].append(v)
    return _nanmean(_nanmean(v) for v in by.values())


def _metric(name: str, depth_rule: str):
    return {"coverage": M.coverage, "need_recall": M.need_recall,
            "dwr": functools.partial(M.dwr, depth_rule=depth_rule),
            "deepest": functools.partial(M.deepest_resolved, depth_rule=depth_rule),
            "breadth": M.breadth, "out_of_order": M.out_of_order}[name]


def _answer_rows(runs: Sequence[QDRun], graphs: Mapping[str, NeedGraph], tasks) -> dict[str, float]:
    f1 = [(r.task_id, M.answer_f1(r.answer, tasks[r.task_id].answer, tasks[r.task_id].aliases)) for r in runs]
    ok = [(r.task_id, M.answer_correct(r.answer, tasks[r.task_id].answer, tasks[r.task_id].aliases)) for r in runs]
    return {"answer_f1": _task_mean(f1), "answer_correct": _task_mean(ok)}


def arm_summary(runs: Sequence[QDRun], graphs: Mapping[str, NeedGraph], *, tasks: Mapping[str, Any],
                depth_rule: str = "longest", frontier_caps: Sequence[int] = M.FRONTIER_CAPS) -> dict[str, Any]:
    """One arm's readings at its own stop (the §5.3 rows), its pooled stop 2x2, coverage by depth
    (pooled over runs: resolved / needs of that depth, with the count) and the budget frontier
    (caps up to the run cap, read as prefixes; a larger cap only when no run was cut by the budget)."""
    rows = [M.run_metrics(r, graphs[r.task_id], depth_rule=depth_rule) for r in runs]
    out: dict[str, Any] = {"runs_scored": len(runs), "tasks_scored": len({r.task_id for r in runs})}
    for key in ("coverage", "need_recall", "dwr", "dwr_required_only", "deepest", "breadth", "out_of_order_edge",
                "out_of_order_need", "n_asks", "question_words_mean"):
        out[key] = _task_mean([(row["task_id"], row[key]) for row in rows])
    out["questions_per_task"] = out.pop("n_asks")
    out.update(_answer_rows(runs, graphs, tasks))
    # the runs' counted tokens (a local policy's prompts and completions; 0 for a scripted arm and the
    # offline stand-ins, which use no model: then the reading is undefined, not 0)
    counted = any(sum(r.tokens.values()) for r in runs)
    comps = [M.breadth_components(r, graphs[r.task_id]) for r in runs]  # breadth's components variant
    out["breadth_components"] = _task_mean([(r.task_id, c.count) for r, c in zip(runs, comps)])
    out["breadth_components_singleton_share"] = _task_mean(
        [(r.task_id, c.singleton_share) for r, c in zip(runs, comps)])
    out["tokens_per_required_need"] = M.pooled_tokens_per_need(runs, graphs) if counted else math.nan
    out["malformed"] = int(sum(r.malformed for r in runs))
    out["stop_reasons"] = {s: sum(r.stop_reason == s for r in runs) for s in ("policy_stop", "budget", "max_turns")}
    out["stop"] = M.stop_rates(M.stop_cells(r, graphs[r.task_id]) for r in runs)
    depth: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r in runs:
        for d, cell in M.depth_coverage(r, graphs[r.task_id], depth_rule=depth_rule).items():
            depth[d][0] += cell.resolved
            depth[d][1] += cell.total
    out["coverage_by_depth"] = {str(d): {"coverage": n / t if t else math.nan, "needs": t // max(1, _seeds(runs))}
                                for d, (n, t) in sorted(depth.items())}
    cap = max((r.cap for r in runs), default=0)
    caps = [c for c in frontier_caps if c <= cap or not any(r.stop_reason == "budget" for r in runs)]
    out["frontier"] = [p._asdict() for p in M.budget_frontier(runs, graphs, caps)] if runs else []
    out["frontier_caps_skipped"] = [c for c in frontier_caps if c not in caps]
    return out


def _seeds(runs: Sequence[QDRun]) -> int:
    return len({r.seed for r in runs})


def per_task(runs: Sequence[QDRun], graphs: Mapping[str, NeedGraph], *, tasks: Mapping[str, Any],
             depth_rule: str = "longest") -> list[dict[str, Any]]:
    """One row per task: the seeds' mean of each numeric `run_metrics` reading and of answer F1."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        row = M.run_metrics(r, graphs[r.task_id], depth_rule=depth_rule)
        t = tasks[r.task_id]
        row["answer_f1"] = M.answer_f1(r.answer, t.answer, t.aliases)
        row["answer_correct"] = M.answer_correct(r.answer, t.answer, t.aliases)
        by[r.task_id].append(row)
    out = []
    for task, rows in by.items():
        keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float)) and k not in ("seed", "k")]
        out.append({"task_id": task, "runs": len(rows), **{k: _nanmean(r.get(k) for r in rows) for k in keys},
                    "stop_reasons": [r["stop_reason"] for r in rows]})
    return out


def compare(treatment: Sequence[QDRun], baseline: Sequence[QDRun], graphs: Mapping[str, NeedGraph], *,
            tasks: Mapping[str, Any], depth_rule: str = "longest", resamples: int = 10_000, seed: int = 0,
            variant: str = "symmetric") -> dict[str, Any]:
    """Treatment - baseline, paired by (task, seed): the equal-spend rows (symmetric), the length
    control (coverage, the baseline read at the prefix whose question tokens fit the treatment's),
    then own stop (coverage, questions, answer F1, and the stop 2x2's two rates, each run's over its
    own decision points, a run without such a point left out), each with `compare_arms`' interval,
    verdict, p and MDE."""
    out: dict[str, Any] = {"equal_spend_variant": variant, "equal_spend": {}, "own_stop": {}}
    for name in SPEND_ROWS:
        sc = M.equal_spend(treatment, baseline, graphs, metric=_metric(name, depth_rule), variant=variant)
        a = {(t, 0): p.treatment for t, p in sc.per_task.items()}
        b = {(t, 0): p.comparator for t, p in sc.per_task.items()}
        out["equal_spend"][name] = dict(_compare(a, b, resamples, seed), dropped_pairs=sc.dropped,
                                        unpaired=sc.unpaired)
    lc = M.length_control(treatment, baseline, graphs)  # the baseline given as many question tokens
    out["length_control"] = {"coverage": dict(
        _compare({(t, 0): p.treatment for t, p in lc.per_task.items()},
                 {(t, 0): p.comparator for t, p in lc.per_task.items()}, resamples, seed),
        dropped_pairs=lc.dropped, unpaired=lc.unpaired)}
    own = {"coverage": lambda r: M.coverage(r, graphs[r.task_id]), "questions": lambda r: float(r.n_asks),
           "answer_f1": lambda r: M.answer_f1(r.answer, tasks[r.task_id].answer, tasks[r.task_id].aliases),
           # the stop 2x2, paired: each run's rate over its own decision points (NaN, left out, without one)
           "stop_when_done": lambda r: M.stop_cells(r, graphs[r.task_id]).stop_when_done,
           "ask_when_not_done": lambda r: M.stop_cells(r, graphs[r.task_id]).ask_when_not_done}
    for name, read in own.items():
        a = {(r.task_id, r.seed): read(r) for r in treatment}
        b = {(r.task_id, r.seed): read(r) for r in baseline}
        out["own_stop"][name] = _compare(a, b, resamples, seed)
    return out


def _compare(a, b, resamples: int, seed: int) -> dict[str, Any]:
    a = {k: v for k, v in a.items() if v is not None and not math.isnan(v)}
    b = {k: v for k, v in b.items() if v is not None and not math.isnan(v)}
    if not {t for t, _ in a} & {t for t, _ in b}:
        return {"n_tasks": 0, "mean_diff": math.nan}
    return compare_arms(a, b, n=resamples, seed=seed)


# ----------------------------------------------------------------------------- plots and the table
def plot(summary: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """``frontier.png`` (`frontier_figure`) and ``coverage_by_depth.png`` (`depth_figure`)."""
    arms = summary.get("arms") or {}
    if not arms:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    return [save_figure(frontier_figure(summary), out_dir / "frontier.png"),
            save_figure(depth_figure(summary), out_dir / "coverage_by_depth.png")]


def _caps_label(caps: Sequence[int]) -> str:
    caps = sorted(caps)
    return f"cap {caps[0]}" if len(caps) == 1 else "caps " + ", ".join(str(c) for c in caps)


#: where a frontier label goes, in points from its point, tried in turn until it overlaps no
#: label placed before it: below right, above right, then further down / up
_LABEL_OFFSETS = [(3, -9), (3, 3)] + [(3, sign * (9 + 8 * k)) for k in range(1, 8) for sign in (-1, 1)]


def _separate_labels(fig, texts) -> None:
    """Moves each annotation of ``texts`` (in order) to the first `_LABEL_OFFSETS` offset where its
    box overlaps none placed before it (the last offset tried when none is free)."""
    fig.canvas.draw()  # lays the figure out: the boxes below are where the labels will be drawn
    renderer = fig.canvas.get_renderer()
    placed = []
    for t in texts:
        for off in _LABEL_OFFSETS:
            t.xyann = off
            box = t.get_window_extent(renderer)
            if not any(box.overlaps(b) for b in placed):
                break
        placed.append(t.get_window_extent(renderer))


def frontier_figure(summary: Mapping[str, Any]):
    """Coverage against retrieval calls per arm, one point per cap. Caps an arm reaches at the same
    point (no run used the extra budget) share one label ("caps 8, 12, 16"), in the arm's colour;
    labels that would overlap another are moved (`_separate_labels`)."""
    arms = summary.get("arms") or {}
    fig, (ax,) = new_figure()
    texts = []
    for arm, s in arms.items():
        pts = s.get("frontier") or []
        if not pts:
            continue
        (line,) = ax.plot([p["calls"] for p in pts], [p["coverage"] for p in pts], marker="o",
                          label=f"{arm}: {s.get('questioner')}")
        at: dict[tuple[float, float], list[int]] = {}
        for p in pts:  # the caps at each distinct point (rounded well below a pixel)
            at.setdefault((round(p["calls"], 6), round(p["coverage"], 6)), []).append(p["cap"])
        for xy, caps in at.items():
            texts.append(ax.annotate(_caps_label(caps), xy, fontsize=7, xytext=_LABEL_OFFSETS[0],
                                     textcoords="offset points", color=line.get_color()))
    ax.set(xlabel="retrieval calls (mean per task)", ylabel="required-evidence coverage",
           title=f"{summary.get('benchmark')}: budget frontier ({summary.get('tasks')} tasks)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    _separate_labels(fig, texts)
    return fig


def depth_figure(summary: Mapping[str, Any]):
    """Coverage by need depth per arm: bars grouped at the depths present (integer ticks, each with
    its need count). A depth where an arm resolved nothing gets a short line at 0 in the arm's colour
    (a zero-height bar would be invisible), so every legend entry stands for something drawn; an arm
    with no need at any depth is left out of the legend."""
    arms = summary.get("arms") or {}
    fig, (ax,) = new_figure()
    width = 0.8 / max(1, len(arms))
    present: dict[int, Any] = {}
    for j, (arm, s) in enumerate(arms.items()):
        cells = s.get("coverage_by_depth") or {}
        depths = sorted(int(d) for d in cells)
        xs = [d + (j - (len(arms) - 1) / 2) * width for d in depths]
        ys = [cells[str(d)]["coverage"] for d in depths]
        drawn = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
        color = f"C{j}"
        label = f"{arm}: {s.get('questioner')}" if drawn else None
        if drawn and all(y == 0 for _, y in drawn):
            label += " (0 at every depth)"
        ax.bar([x for x, _ in drawn], [y for _, y in drawn], width=width, color=color, label=label)
        zero = [x for x, y in drawn if y == 0]
        if zero:
            ax.hlines([0.0] * len(zero), [x - width / 2 for x in zero], [x + width / 2 for x in zero],
                      colors=color, lw=3, clip_on=False, zorder=3)
        for d in depths:
            present.setdefault(d, cells[str(d)].get("needs"))
    ticks = sorted(present)
    ax.set_xticks(ticks, [f"{d}\nn={present[d]}" if present[d] is not None else str(d) for d in ticks])
    if ticks:
        ax.set_xlim(ticks[0] - 0.6, ticks[-1] + 0.6)
    ax.set(xlabel=f"need depth: hops from a seed need ({summary.get('depth_rule') or 'longest'} rule); "
                  "n = needs of that depth over the tasks",
           ylabel="needs resolved (share)", ylim=(0, 1.05),
           title=f"{summary.get('benchmark')}: coverage by depth (drafter: {summary.get('drafter')})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return fig


_ROWS = [("coverage", "coverage"), ("need recall", "need_recall"), ("DWR", "dwr"), ("deepest need (hops)", "deepest"),
         ("breadth (lines)", "breadth"), ("out-of-order (edge)", "out_of_order_edge"),
         ("answer F1", "answer_f1"), ("questions per task", "questions_per_task"),
         ("question words", "question_words_mean")]


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _decided(c: Mapping[str, Any]) -> str:
    v = c.get("decided")
    return "-" if v is None else ("yes" if v else "no")


def _p(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "p=-"
    return f"p={x:.3f}" if x >= 0.001 else "p<0.001"


def _signed(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3f}"


#: the comparison rows whose name alone gives no unit
_COMPARE_NAMES = {"deepest": "deepest (hops)"}


def summary_table(summary: Mapping[str, Any]) -> str:
    """The printed table: each arm's own-stop readings and stop rates; with a comparison, the
    equal-spend and own-stop differences with their intervals, each with its two separate tests
    (the "decided" column: whether every one of the three 50,000-resample BCa 95% intervals excludes
    0; the sign-flip p) named as such, since the two can disagree."""
    arms = summary.get("arms") or {}
    names = list(arms)
    head = (f"Q&D {summary.get('benchmark')}: {summary.get('tasks')} tasks x {len(summary.get('seeds', []))} seeds, "
            f"drafter {summary.get('drafter')}, answerer {summary.get('answerer')}")
    w = max(len(label) for label, _ in _ROWS) + 1
    lines = [head, f"{'own stop':<{w}}| " + " | ".join(f"{n}: {arms[n].get('questioner')}" for n in names)]
    for label, key in _ROWS:
        lines.append(f"{label:<{w}}| " + " | ".join(_fmt(arms[n].get(key)) for n in names))
    for label, key in (("stop when done", "stop_when_done"), ("ask when not done", "ask_when_not_done")):
        lines.append(f"{label:<{w}}| " + " | ".join(_fmt((arms[n].get("stop") or {}).get(key)) for n in names))
    rule = summary.get("depth_rule") or "longest"
    lines.append(f"deepest need (hops): the deepest resolved need's depth, in edges from a seed need ({rule} path; "
                 "a seed need is 0, -1 when none is resolved)")
    comp = summary.get("comparison")
    if comp:
        lines.append("treatment - baseline, paired by task: mean diff [BCa 95% interval over tasks] and two separate "
                     "tests, which can disagree near the edge:")
        lines.append("  BCa CI excl. 0 = all three 50k-resample BCa 95% intervals (seeds 101/202/303) exclude 0 "
                     "(summary.json's 'decided');")
        lines.append("  sign-flip p = two-sided sign-flip permutation test of the task differences; "
                     "MDE = minimum detectable effect (80% power, two-sided 0.05); n = tasks")
        rows = [(part, _COMPARE_NAMES.get(name, name), c) for part in ("equal_spend", "length_control", "own_stop")
                for name, c in comp.get(part, {}).items()]
        wn = max((len(f"{part} {name}") for part, name, _ in rows), default=0)
        for part, name, c in rows:
            iv = c.get("interval") or (math.nan, math.nan)
            diff = f"{_signed(c.get('mean_diff'))} [{_signed(iv[0])}, {_signed(iv[1])}]"
            lines.append(f"  {f'{part} {name}':<{wn}}  {diff:<24}  BCa CI excl. 0: {_decided(c):<3}  "
                         f"sign-flip {_p(c.get('p')):<7}  MDE={_fmt(c.get('mde'))}  n={c.get('n_tasks')}")
    return "\n".join(lines)


__all__ = ["arm_summary", "compare", "per_task", "plot", "summary_table"]

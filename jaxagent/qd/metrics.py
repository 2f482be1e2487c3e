"""Q&D transcript metrics (host code): what a finished run reached, read from its turns and the task's need graph.

Every reading is a pure function of a `QDRun` (`jaxagent.qd.transcript`) and its `NeedGraph`
(`jaxagent.qd.graphs`), following the Q&D spec's §3; no model judge is involved. Conventions:

- **Turns and prefixes.** Turn t is the t-th executed question (0-based). ``first(u)`` is the first
  turn whose ``retrieved`` holds pool index u. A need is *resolved* iff its evidence is non-empty and
  every unit in it was retrieved; its resolution turn is the largest ``first(u)`` over its evidence
  (the turn its last piece arrived). Optional needs (empty evidence) never resolve. Every per-run
  reading takes ``k``: ``None`` reads the full run, an integer reads **prefix k** (turns 0..k-1, i.e.
  `QDRun.prefix`), where a need counts iff its resolution turn is < k; ``k >= n_asks`` is the full run.
- **Undefined readings are NaN** (never None): uid coverage and need recall on a graph without
  required evidence, DWR with no weighted depth, out-of-order with nothing eligible, a mean over
  nothing. Test with `math.isnan`; aggregates (`equal_spend`, `own_stop`, ...) drop them.
- **Depth rule.** ``depth_rule`` is ``"longest"`` (the default) or ``"shortest"``
  (`NeedGraph.depths`); facets, and so breadth, always use the longest rule (spec §2.3).
- **Pairing and aggregation** (spec §3.8, §5.2): runs pair by ``(task_id, seed)`` (the rollout
  seed), so several treatment runs (training seeds) may pair with one comparator run; a task's value
  is the mean over its runs or pairs, and a suite's value the mean over tasks. Pass the runs of one
  benchmark and ``graphs`` keyed by task id.

Readings: `resolution_turns`, `coverage` (uid coverage, the default) and `need_recall` (the
variant), `coverage_ladder`, `depth_coverage` (C_d with |V_d|) and `dwr`, `deepest_resolved`,
`breadth` and `breadth_components`, `out_of_order` (per edge or per need), `stop_cells` and
`stop_rates` (the stop 2x2), `question_words` / `question_lengths`, `equal_spend`, `length_control`,
`own_stop`, `budget_frontier`, `tokens_per_need`; `run_metrics` gathers one run's main readings in
one flat dict. Answer scoring (spec §1.4): `normalize_answer`, `answer_f1`, `answer_correct`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from jaxagent.qd.graphs import DepthRule, NeedGraph
from jaxagent.qd.transcript import QDRun

#: "done" = uid coverage at least 1 - DONE_TOL (spec §3.2, §3.7)
DONE_TOL = 1e-12
#: DWR depth weights (spec §3.3); a depth above 5 weighs 0
DWR_WEIGHTS: Mapping[int, float] = {0: 0.5, 1: 1.0, 2: 1.5, 3: 2.0, 4: 2.0, 5: 2.0}
#: budget-frontier caps (spec §1.2)
FRONTIER_CAPS = (4, 8, 12, 16, 24)

NAN = float("nan")
Metric = Callable[[QDRun, NeedGraph, "int | None"], float]
SpendVariant = Literal["symmetric", "asymmetric"]


def _undefined(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _mean(values: Iterable[float]) -> float:
    vals = [v for v in values if not _undefined(v)]
    return float(np.mean(vals)) if vals else NAN


def _view(run: QDRun, k: int | None) -> QDRun:
    """The run read at prefix ``k`` (the full run for None)."""
    return run if k is None else run.prefix(k)


# ----------------------------------------------------------------------------- resolution (§3.1)
def first_retrieval(run: QDRun, k: int | None = None) -> dict[int, int]:
    """Pool index -> the first turn (< k) whose ``retrieved`` holds it; units never retrieved are absent."""
    first: dict[int, int] = {}
    for t, turn in enumerate(_view(run, k).turns):
        for u in turn.retrieved:
            first.setdefault(u, t)
    return first


def resolution_turns(run: QDRun, graph: NeedGraph, k: int | None = None) -> dict[str, int | None]:
    """Need id -> its resolution turn (the max first-retrieval turn over its evidence), or None when
    it is optional or some unit of its evidence was not retrieved within prefix ``k``."""
    first = first_retrieval(run, k)
    out: dict[str, int | None] = {}
    for need in graph.needs:
        turns = [first.get(u) for u in need.evidence]
        out[need.id] = max(turns) if turns and None not in turns else None  # type: ignore[type-var]
    return out


def resolved(run: QDRun, graph: NeedGraph, k: int | None = None) -> dict[str, int]:
    """The needs resolved within prefix ``k``, with their resolution turns (all of them are required)."""
    return {v: t for v, t in resolution_turns(run, graph, k).items() if t is not None}


# ----------------------------------------------------------------------------- coverage (§3.2)
def coverage(run: QDRun, graph: NeedGraph, k: int | None = None) -> float:
    """uid coverage (default): |G ∩ retrieved| / |G|, G = `NeedGraph.required_evidence`; NaN when G is empty."""
    g = graph.required_evidence
    return len(g & _view(run, k).held()) / len(g) if g else NAN


def need_recall(run: QDRun, graph: NeedGraph, k: int | None = None) -> float:
    """Need recall (variant): resolved required needs / required needs; NaN without a required need."""
    required = [n for n in graph.needs if n.required]
    return len(resolved(run, graph, k)) / len(required) if required else NAN


def coverage_ladder(run: QDRun, graph: NeedGraph) -> list[float]:
    """uid coverage at each decision point t = 0..n_asks (coverage of prefix t), n_asks + 1 values."""
    g = graph.required_evidence
    if not g:
        return [NAN] * (run.n_asks + 1)
    first = first_retrieval(run)
    return [sum(first[u] < t for u in g if u in first) / len(g) for t in range(run.n_asks + 1)]


def is_done(cov: float) -> bool:
    """Done = uid coverage >= 1 - 1e-12 (all required needs resolved); False for NaN."""
    return not math.isnan(cov) and cov >= 1.0 - DONE_TOL


# ----------------------------------------------------------------------------- depth (§3.3, §3.4)
class DepthCell(NamedTuple):
    """C_d's parts at one depth: ``resolved`` of the ``total`` (= |V_d|) needs of that depth."""

    resolved: int
    total: int

    @property
    def rate(self) -> float:
        return self.resolved / self.total


def depth_coverage(run: QDRun, graph: NeedGraph, k: int | None = None, depth_rule: DepthRule = "longest",
                   required_only: bool = False) -> dict[int, DepthCell]:
    """Depth d -> `DepthCell` (C_d = ``cell.rate``, |V_d| = ``cell.total``), ascending in d, over every
    need with a defined depth, optional needs included (default), or over required needs only."""
    depth = graph.depths(depth_rule)
    done = resolved(run, graph, k)
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for need in graph.needs:
        d = depth[need.id]
        if d is None or (required_only and not need.required):
            continue
        counts[d][0] += need.id in done
        counts[d][1] += 1
    return {d: DepthCell(*counts[d]) for d in sorted(counts)}


def dwr(run: QDRun, graph: NeedGraph, k: int | None = None, depth_rule: DepthRule = "longest",
        required_only: bool = False) -> float:
    """Depth-weighted resolution: sum_d w_d C_d / sum_d w_d over the depths present (`depth_coverage`),
    w = `DWR_WEIGHTS` (0 above depth 5); NaN when no present depth has weight."""
    cells = depth_coverage(run, graph, k, depth_rule, required_only)
    weights = {d: DWR_WEIGHTS.get(d, 0.0) for d in cells}
    total = sum(weights.values())
    return sum(weights[d] * cells[d].rate for d in cells) / total if total > 0 else NAN


def deepest_resolved(run: QDRun, graph: NeedGraph, k: int | None = None, depth_rule: DepthRule = "longest") -> int:
    """The largest depth of a resolved need; -1 when no need of defined depth is resolved."""
    depth = graph.depths(depth_rule)
    ds = [depth[v] for v in resolved(run, graph, k) if depth[v] is not None]
    return max(ds, default=-1)  # type: ignore[type-var]


# ----------------------------------------------------------------------------- breadth (§3.5)
def breadth(run: QDRun, graph: NeedGraph, k: int | None = None) -> int:
    """Facets (`NeedGraph.facets`, longest rule) holding at least one resolved need: a count."""
    done = resolved(run, graph, k)
    return sum(any(v in done for v in facet) for facet in graph.facets())


class ComponentBreadth(NamedTuple):
    """``breadth_components``: components (over all needs) with a resolved need, and how many of
    those are single needs (``singleton_share`` = singletons / count, NaN when count is 0)."""

    count: int
    singletons: int

    @property
    def singleton_share(self) -> float:
        return self.singletons / self.count if self.count else NAN


def breadth_components(run: QDRun, graph: NeedGraph, k: int | None = None) -> ComponentBreadth:
    """Breadth's ``components`` variant (tau2): weakly connected components over all needs with a resolved need."""
    done = resolved(run, graph, k)
    hit = [c for c in graph.components() if any(v in done for v in c)]
    return ComponentBreadth(len(hit), sum(len(c) == 1 for c in hit))


# ----------------------------------------------------------------------------- out of order (§3.6)
def out_of_order(run: QDRun, graph: NeedGraph, k: int | None = None, per: Literal["edge", "need"] = "edge") -> float:
    """Out-of-order rate (lower is better), NaN when nothing is eligible.

    ``per="edge"`` (default): over edges u -> v with both ends resolved, the share with
    turn(v) < turn(u) (a same-turn edge is in order). ``per="need"`` (variant): over resolved needs
    with at least one resolved parent, the share resolved strictly before some resolved parent.
    """
    turn = resolved(run, graph, k)
    if per == "edge":
        eligible = [(u, v) for u, v in graph.edges if u in turn and v in turn]
        return sum(turn[v] < turn[u] for u, v in eligible) / len(eligible) if eligible else NAN
    if per != "need":
        raise ValueError(f"per={per!r}: expected edge or need")
    flags = []
    for v, parents in graph.parents().items():
        done_parents = [u for u in parents if u in turn]
        if v in turn and done_parents:
            flags.append(any(turn[v] < turn[u] for u in done_parents))
    return sum(flags) / len(flags) if flags else NAN


# ----------------------------------------------------------------------------- stop 2x2 (§3.7)
@dataclasses.dataclass(frozen=True)
class StopCells:
    """The stop 2x2 of one run (or, summed with ``+``, of many), over its decision points.

    ``n_done`` / ``n_not_done``: counted decision points at which the held coverage was done / not
    done; ``n_stop_at_done``: of the done points, those where the policy stopped; ``n_ask_at_not_done``:
    of the not-done points, those where it asked; ``asks_after_done``: asks at done points;
    ``forced_stops``: final points excluded because the harness ended the run (budget / max_turns).
    """

    n_done: int = 0
    n_stop_at_done: int = 0
    n_not_done: int = 0
    n_ask_at_not_done: int = 0
    asks_after_done: int = 0
    forced_stops: int = 0

    def __add__(self, other: StopCells) -> StopCells:
        return StopCells(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    @property
    def stop_when_done(self) -> float:
        """n_stop_at_done / n_done (NaN with no done point)."""
        return self.n_stop_at_done / self.n_done if self.n_done else NAN

    @property
    def ask_when_not_done(self) -> float:
        """n_ask_at_not_done / n_not_done (NaN with no not-done point)."""
        return self.n_ask_at_not_done / self.n_not_done if self.n_not_done else NAN


def stop_cells(run: QDRun, graph: NeedGraph) -> StopCells:
    """The run's `StopCells` over decision points t = 0..n_asks: an ASK at every t < n_asks; at
    t = n_asks a STOP when ``stop_reason == "policy_stop"``, else a forced stop (excluded, counted).
    A graph without required evidence has undefined coverage at every point: all empty (nothing counted)."""
    ladder = coverage_ladder(run, graph)
    if math.isnan(ladder[0]):
        return StopCells()
    n_done = stop_done = n_not = ask_not = asks_done = forced = 0
    for t, cov in enumerate(ladder):
        asked = t < run.n_asks
        if not asked and run.stop_reason != "policy_stop":
            forced += 1
            continue
        if is_done(cov):
            n_done += 1
            stop_done += not asked
            asks_done += asked
        else:
            n_not += 1
            ask_not += asked
    return StopCells(n_done, stop_done, n_not, ask_not, asks_done, forced)


def stop_rates(cells: Iterable[StopCells]) -> dict[str, float]:
    """Pooled over all decision points of an arm: the summed cells plus ``stop_when_done`` =
    sum n_stop_at_done / sum n_done and ``ask_when_not_done`` = sum n_ask_at_not_done / sum n_not_done."""
    total = sum(cells, StopCells())
    return {**dataclasses.asdict(total), "stop_when_done": total.stop_when_done,
            "ask_when_not_done": total.ask_when_not_done}


# ----------------------------------------------------------------------------- spend (§3.8)
def question_words(question: str) -> int:
    """Question length: whitespace-separated words."""
    return len(question.split())


def question_lengths(run: QDRun, k: int | None = None) -> list[int]:
    """Whitespace words of each executed question within prefix ``k`` (question volume = its length)."""
    return [question_words(t.question) for t in _view(run, k).turns]


def tokens_per_need(run: QDRun, graph: NeedGraph) -> float:
    """Run tokens / resolved required needs of the full run. Run tokens = ``sum(run.tokens.values())``
    (every counter the run records: questioner, drafter, answerer prompts and completions); NaN when
    no need is resolved."""
    n = len(resolved(run, graph))
    return sum(run.tokens.values()) / n if n else NAN


def pooled_tokens_per_need(runs: Iterable[QDRun], graphs: Mapping[str, NeedGraph]) -> float:
    """Suite form of `tokens_per_need`: all runs' tokens / all runs' resolved required needs (NaN if none)."""
    tokens = needs = 0
    for run in runs:
        tokens += sum(run.tokens.values())
        needs += len(resolved(run, graphs[run.task_id]))
    return tokens / needs if needs else NAN


@dataclasses.dataclass(frozen=True)
class TaskPair:
    """One task's paired reading: treatment and comparator means over its ``pairs`` kept pairs."""

    treatment: float
    comparator: float
    pairs: int

    @property
    def delta(self) -> float:
        return self.treatment - self.comparator


@dataclasses.dataclass(frozen=True)
class SpendContrast:
    """A paired contrast: ``per_task`` task id -> `TaskPair`; ``contrast`` = mean over tasks of
    treatment - comparator (NaN with no task); ``dropped`` pairs had an undefined value; ``unpaired``
    counts treatment runs without a comparator run of their (task, seed)."""

    per_task: dict[str, TaskPair]
    contrast: float
    dropped: int
    unpaired: int

    @property
    def treatment(self) -> float:
        return _mean(p.treatment for p in self.per_task.values())

    @property
    def comparator(self) -> float:
        return _mean(p.comparator for p in self.per_task.values())


def pair_runs(treatment: Iterable[QDRun], comparator: Iterable[QDRun]) -> tuple[list[tuple[QDRun, QDRun]], int]:
    """(treatment, comparator) pairs of the same task and rollout seed, and the count of unpaired
    treatment runs. A treatment key may repeat (training seeds); a repeated comparator key is an error."""
    by_key: dict[tuple[str, int], QDRun] = {}
    for c in comparator:
        key = (c.task_id, c.seed)
        if key in by_key:
            raise ValueError(f"comparator runs: two runs of task {c.task_id!r}, seed {c.seed}; expected one")
        by_key[key] = c
    pairs, unpaired = [], 0
    for t in treatment:
        c = by_key.get((t.task_id, t.seed))
        if c is None:
            unpaired += 1
        else:
            pairs.append((t, c))
    return pairs, unpaired


def _contrast(pairs: Sequence[tuple[QDRun, QDRun]], unpaired: int, graphs: Mapping[str, NeedGraph],
              read: Callable[[QDRun, QDRun, NeedGraph], tuple[float, float]]) -> SpendContrast:
    cells: dict[str, list[tuple[float, float]]] = defaultdict(list)
    dropped = 0
    for t, c in pairs:
        vt, vc = read(t, c, graphs[t.task_id])
        if _undefined(vt) or _undefined(vc):
            dropped += 1
        else:
            cells[t.task_id].append((float(vt), float(vc)))
    per_task = {task: TaskPair(_mean(v[0] for v in vals), _mean(v[1] for v in vals), len(vals))
                for task, vals in cells.items()}
    return SpendContrast(per_task, _mean(p.delta for p in per_task.values()), dropped, unpaired)


def equal_spend(treatment: Iterable[QDRun], comparator: Iterable[QDRun], graphs: Mapping[str, NeedGraph],
                metric: Metric = coverage, variant: SpendVariant = "symmetric") -> SpendContrast:
    """Equal-spend contrast of ``metric(run, graph, k)``: each pair (`pair_runs`) is read at
    k = min(n_asks_T, n_asks_C), both sides (``symmetric``, default) or the comparator only, the
    treatment at its own end (``asymmetric``); pairs with an undefined value are dropped."""
    if variant not in ("symmetric", "asymmetric"):
        raise ValueError(f"variant={variant!r}: expected symmetric or asymmetric")

    def read(t: QDRun, c: QDRun, g: NeedGraph) -> tuple[float, float]:
        k = min(t.n_asks, c.n_asks)
        return metric(t, g, k if variant == "symmetric" else None), metric(c, g, k)

    return _contrast(*pair_runs(treatment, comparator), graphs, read)


def length_matched_prefix(budget_tokens: int, run: QDRun) -> int:
    """The largest j <= n_asks whose first j questions total at most ``budget_tokens`` question tokens (0 allowed)."""
    spent, j = 0, 0
    for turn in run.turns:
        spent += turn.question_tokens
        if spent > budget_tokens:
            break
        j += 1
    return j


def length_control(treatment: Iterable[QDRun], comparator: Iterable[QDRun], graphs: Mapping[str, NeedGraph],
                   metric: Metric = coverage) -> SpendContrast:
    """Length-control contrast: the treatment read at its own end, its paired comparator at
    `length_matched_prefix` of the treatment's total question tokens."""

    def read(t: QDRun, c: QDRun, g: NeedGraph) -> tuple[float, float]:
        budget = sum(turn.question_tokens for turn in t.turns)
        return metric(t, g, None), metric(c, g, length_matched_prefix(budget, c))

    return _contrast(*pair_runs(treatment, comparator), graphs, read)


def _task_mean(rows: Iterable[tuple[Hashable, float]]) -> float:
    """Mean over tasks of each task's mean over its defined values (NaN with none)."""
    by_task: dict[Hashable, list[float]] = defaultdict(list)
    for task, v in rows:
        if not _undefined(v):
            by_task[task].append(float(v))
    return _mean(_mean(vals) for vals in by_task.values())


def own_stop(runs: Sequence[QDRun], graphs: Mapping[str, NeedGraph],
             gold: Mapping[str, tuple[str, Sequence[str]]] | None = None) -> dict[str, float | int]:
    """Own-stop readings, each run at its own end, averaged per task then over tasks: ``coverage``,
    ``questions`` (n_asks), ``tasks`` (runs' distinct tasks) and, when ``gold`` maps task id ->
    (answer, aliases), ``answer_f1``."""
    out: dict[str, float | int] = {"coverage": _task_mean((r.task_id, coverage(r, graphs[r.task_id])) for r in runs),
                                   "questions": _task_mean((r.task_id, r.n_asks) for r in runs),
                                   "tasks": len({r.task_id for r in runs})}
    if gold is not None:
        out["answer_f1"] = _task_mean((r.task_id, answer_f1(r.answer, *gold[r.task_id])) for r in runs)
    return out


class FrontierPoint(NamedTuple):
    """One budget-frontier point: at retrieval cap ``cap``, the mean calls and mean uid coverage (task means)."""

    cap: int
    calls: float
    coverage: float


def budget_frontier(runs: Sequence[QDRun], graphs: Mapping[str, NeedGraph],
                    caps: Sequence[int] = FRONTIER_CAPS) -> list[FrontierPoint]:
    """Coverage vs calls over ``caps``, each run read at prefix cap (valid as the policy is budget-blind).
    A run the budget ended at a cap below a requested one cannot stand in for it: ValueError."""
    points = []
    for cap in caps:
        short = [r for r in runs if r.stop_reason == "budget" and r.cap < cap]
        if short:
            raise ValueError(f"cap {cap}: run {short[0].task_id!r} (seed {short[0].seed}) ended by its own budget "
                             f"{short[0].cap}; expected runs of cap >= {cap} (e.g. cap-24 runs)")
        calls = _task_mean((r.task_id, r.prefix(cap).n_asks) for r in runs)
        cov = _task_mean((r.task_id, coverage(r, graphs[r.task_id], cap)) for r in runs)
        points.append(FrontierPoint(cap, calls, cov))
    return points


# ----------------------------------------------------------------------------- one run, one row
def run_metrics(run: QDRun, graph: NeedGraph, k: int | None = None, depth_rule: DepthRule = "longest") -> dict[str, Any]:
    """One run's main readings at prefix ``k`` (None: the full run) as one flat dict for per-task tables:
    task_id, seed, questioner, k (the prefix read), n_asks, stop_reason (of the prefix: ``budget`` when
    cut), coverage, need_recall, dwr, dwr_required_only, deepest, breadth, out_of_order_edge,
    out_of_order_need, question_words_mean, and ``c_d{d}`` / ``n_d{d}`` (C_d and |V_d|, all needs) per depth."""
    view = _view(run, k)
    words = question_lengths(view)
    row: dict[str, Any] = {
        "task_id": run.task_id, "seed": run.seed, "questioner": run.questioner, "k": view.n_asks,
        "n_asks": view.n_asks, "stop_reason": view.stop_reason,
        "coverage": coverage(view, graph), "need_recall": need_recall(view, graph),
        "dwr": dwr(view, graph, depth_rule=depth_rule),
        "dwr_required_only": dwr(view, graph, depth_rule=depth_rule, required_only=True),
        "deepest": deepest_resolved(view, graph, depth_rule=depth_rule), "breadth": breadth(view, graph),
        "out_of_order_edge": out_of_order(view, graph, per="edge"),
        "out_of_order_need": out_of_order(view, graph, per="need"),
        "question_words_mean": float(np.mean(words)) if words else NAN,
    }
    for d, cell in depth_coverage(view, graph, depth_rule=depth_rule).items():
        row[f"c_d{d}"], row[f"n_d{d}"] = cell.rate, cell.total
    return row


# ----------------------------------------------------------------------------- answers (§1.4)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)
YES_TOKENS = frozenset({"yes", "true"})
NO_TOKENS = frozenset({"no", "false"})


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token F1 of normalised token bags; two empty strings score 1, one empty string 0."""
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if not common:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def answer_f1(answer: str, gold: str, aliases: Sequence[str] = ()) -> float:
    """Answer token F1: the maximum of `token_f1` over the gold answer and each alias."""
    return max(token_f1(answer, g) for g in (gold, *aliases))


def contains_tokens(tokens: Sequence[str], sub: Sequence[str]) -> bool:
    """Whether ``sub`` (non-empty) occurs as a contiguous run of ``tokens``."""
    n = len(sub)
    return n > 0 and any(list(tokens[i:i + n]) == list(sub) for i in range(len(tokens) - n + 1))


def is_yes_no(gold: str) -> bool:
    """A yes/no task: the normalised gold answer is yes/no/true/false (StrategyQA)."""
    return normalize_answer(gold) in YES_TOKENS | NO_TOKENS


def is_hedge(answer: str) -> bool:
    """The hedge detector of yes/no tasks: the normalised answer holds no polarity token (none of
    yes/no/true/false, e.g. "the evidence does not say"), or tokens of both polarities ("yes or no",
    "no, it is not true"), which token containment cannot score."""
    tokens = set(normalize_answer(answer).split())
    return bool(tokens & YES_TOKENS) == bool(tokens & NO_TOKENS)


def answer_correct(answer: str, gold: str, aliases: Sequence[str] = ()) -> float:
    """1.0 when the normalised gold answer or an alias occurs as a token sequence in the normalised
    answer, else 0.0. On a yes/no task (`is_yes_no`) the gold's polarity words are accepted as
    aliases (yes, true / no, false) and a hedge (`is_hedge`) is unknown: NaN."""
    golds = [gold, *aliases]
    if is_yes_no(gold):
        if is_hedge(answer):
            return NAN
        golds += sorted(YES_TOKENS if normalize_answer(gold) in YES_TOKENS else NO_TOKENS)
    tokens = normalize_answer(answer).split()
    return float(any(contains_tokens(tokens, normalize_answer(g).split()) for g in golds))


__all__ = [
    "DONE_TOL", "DWR_WEIGHTS", "FRONTIER_CAPS", "ComponentBreadth", "DepthCell", "FrontierPoint", "SpendContrast",
    "contains_tokens",
    "StopCells", "TaskPair", "answer_correct", "answer_f1", "breadth", "breadth_components", "budget_frontier",
    "coverage", "coverage_ladder", "deepest_resolved", "depth_coverage", "dwr", "equal_spend", "first_retrieval",
    "is_done", "is_hedge", "is_yes_no", "length_control", "length_matched_prefix", "need_recall",
    "normalize_answer", "out_of_order", "own_stop", "pair_runs", "pooled_tokens_per_need", "question_lengths",
    "question_words", "resolution_turns", "resolved", "run_metrics", "stop_cells", "stop_rates", "token_f1",
    "tokens_per_need",
]

"""Labelling candidate actions from their consequences (the Q&D spec's §4.2-§4.6; host code).

**Values (§4.2).** The value of an ASK at a decision point is read from what its retrieval
brought, with no judge: Phi(s) = the uid coverage of the evidence held
(`jaxagent.qd.metrics.coverage`'s quantity); phi_gain = max(0, Phi(after) - Phi(before)); rho =
1 - n_new / n_retrieved, the share of the retrieved units already held (0 when nothing was
retrieved); and

    value = 0.5 * phi_gain - 0.1 * rho - c_ret        (c_ret = 0.05, the per-call cost)

A STOP is worth 0 (`ask_value`, `STOP_VALUE`).

**Records.** `jaxagent.qd.forks` plays the forks and builds one `ForkState` per (task, parent run,
fork turn) with its `Candidate`\\ s (the fork-turn decision of each continued run). Everything below
is a pure function of those records:

- `canonical_target`: the completion a candidate is trained towards (sorted-key JSON, §4.3).
- `leaks_answer`: the leak filter (a leaking question is never a target nor a pair side).
- `sft_rows`: stage-1 imitation rows (§4.3), with sample weights.
- `pairs`: preference pairs, ask_ask (§4.4), recorded ask_stop and the synthesised stop pairs
  (§4.5); `stage_pairs` selects a stage's pairs (§4.6).
- `write_jsonl`, `read_sft_rows`, `read_pairs`: one record a line, validated on reading (an error
  names the line, the field, the value and what was expected).

**Conventions** (choices the spec leaves open, [S]):

- A malformed reply is a STOP (as in the loop, §1.1): it counts as a recorded STOP for §4.5 and
  for "no candidate stopped"; its target is the canonical STOP, never its verbatim text.
- Stable hashes: a candidate's identity is ``sha256(f"{state_id}|{index}|{seed}|{question}")``;
  value ties (SFT's best ASK, the synthesised pairs' best ASK, the order of equal values in
  ask_ask) go to the smallest identity hash, and the cap keeps the pairs with the smallest pair
  hash (sha256 of the state id, the pair's kind and its two candidates' identity hashes, sorted).
  So no result depends on the order the candidates are listed in.
- ``done_before`` None (coverage undefined): no SFT row (``unknown_done``), no synthesised pair,
  and a recorded ask_stop pair only when the outcome decides it.
- The pin and rendered-state guards of §4.4 apply to recorded ask_stop pairs too (two runs under
  different pins or states are not comparable whatever the actions); the identity, margin and
  length guards do not (§4.5).
- A question's "normalised" text, for the identity and length guards, is its whitespace collapsed
  and casefolded; the length is its character count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

from jaxagent.qd.graphs import NeedGraph
from jaxagent.qd.metrics import NO_TOKENS, YES_TOKENS, contains_tokens, is_yes_no, normalize_answer

C_RET = 0.05
GAIN_WEIGHT, REDUNDANCY_WEIGHT = 0.5, 0.1
#: the SFT / pair floor m = tau + 1.5 * sigma_J * sqrt(2) with the reference's tau 0.05, sigma_J 0.01 (§4.3)
FLOOR = 0.071213
#: at most this many recorded pairs (ask_ask + ask_stop) per state (§4.4)
MAX_PAIRS = 12
#: ask_ask pairs whose normalised questions differ in length by more than this are dropped (§4.4)
MAX_LEN_DELTA = 40


class AskValue(NamedTuple):
    phi_gain: float
    rho: float
    value: float


def held_coverage(held: Collection[int], graph: NeedGraph) -> float:
    """Phi: the share of the graph's required pool indices in ``held`` (NaN without required evidence)."""
    g = graph.required_evidence
    return len(g & set(held)) / len(g) if g else math.nan


def ask_value(held_before: Collection[int], retrieved: Sequence[int], graph: NeedGraph, *,
              c_ret: float = C_RET) -> AskValue:
    """The value of an ASK that retrieved ``retrieved`` (pool indices) with ``held_before`` held."""
    before = set(held_before)
    new = [u for u in dict.fromkeys(retrieved) if u not in before]
    after = before | set(new)
    gain = max(0.0, held_coverage(after, graph) - held_coverage(before, graph))
    rho = 1.0 - len(new) / len(retrieved) if retrieved else 0.0
    return AskValue(gain, rho, GAIN_WEIGHT * gain - REDUNDANCY_WEIGHT * rho - c_ret)


STOP_VALUE = 0.0


# ----------------------------------------------------------------------------- validation
class RecordError(ValueError):
    """A record field holding a value it must not: names the field, the value and what was expected."""

    def __init__(self, field: str, value: Any, expected: str, where: str = ""):
        self.field, self.value, self.expected, self.where = field, value, expected, where
        super().__init__(f"{where}field {field!r}: value {_show(value)}: expected {expected}")

    def at(self, where: str) -> RecordError:
        """The same error located at ``where`` (e.g. ``"rows.jsonl line 3: "``)."""
        return RecordError(self.field, self.value, self.expected, where)


def _show(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= 120 else s[:117] + "..."


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _finite(x: Any) -> bool:
    return _is_real(x) and math.isfinite(x)


def _require(ok: bool, field: str, value: Any, expected: str) -> None:
    if not ok:
        raise RecordError(field, value, expected)


# ----------------------------------------------------------------------------- records from the forks
@dataclasses.dataclass(frozen=True)
class Candidate:
    """One candidate's fork-turn decision and the consequences of its continued run (built by
    `jaxagent.qd.forks`)."""

    index: int                       # i in 0..N-1 (0 = the parent itself)
    seed: int                        # the questioner seed it was reseeded with at the fork
    action: Literal["ask", "stop"]   # a malformed output counts as "stop"
    question: str = ""               # the ask's question ("" for stop)
    rationale: str = ""
    raw: str = ""                    # the questioner's verbatim reply at the fork turn
    malformed: bool = False
    value: float = 0.0               # §4.2 (0.0 for a stop)
    phi_gain: float = 0.0            # phi~ (0.0 for a stop)
    answer_correct: float = math.nan  # §1.4 label of the candidate's continued run (NaN = unknown)
    turns_to_complete: int = -1      # questions from the fork (fork question counts 1) until done, -1 never
    prompt: str = ""                 # the rendered state the candidate acted on at the fork
    pin: str = ""                    # questioner name + prompt version + caps, e.g. "policy:x|cap=8|max_turns=16"

    def __post_init__(self) -> None:
        _require(_is_int(self.index) and self.index >= 0, "index", self.index, "an integer >= 0")
        _require(_is_int(self.seed), "seed", self.seed, "an integer")
        _require(self.action in ("ask", "stop"), "action", self.action, "'ask' or 'stop'")
        _require(isinstance(self.question, str) and (self.action == "stop" or bool(self.question.strip())),
                 "question", self.question, "a non-empty string for an ask")
        for name in ("rationale", "raw", "prompt", "pin"):
            _require(isinstance(getattr(self, name), str), name, getattr(self, name), "a string")
        _require(_finite(self.value), "value", self.value, "a finite number")
        _require(_finite(self.phi_gain) and self.phi_gain >= 0, "phi_gain", self.phi_gain, "a finite number >= 0")
        _require(_is_real(self.answer_correct) and (math.isnan(self.answer_correct) or 0 <= self.answer_correct <= 1),
                 "answer_correct", self.answer_correct, "a number in [0, 1] or NaN")
        _require(_is_int(self.turns_to_complete) and self.turns_to_complete >= -1, "turns_to_complete",
                 self.turns_to_complete, "an integer >= -1")

    @property
    def is_ask(self) -> bool:
        return self.action == "ask"


@dataclasses.dataclass(frozen=True)
class ForkState:
    """A decision state (benchmark, task, parent run, fork turn) with its candidates."""

    benchmark: str
    task_id: str
    parent_seed: int
    turn: int                        # the fork turn t
    done_before: bool | None         # done(t) of the state (None: coverage undefined -> unknown)
    answer: str                      # gold answer and aliases (for the leak filter)
    aliases: tuple[str, ...]
    candidates: tuple[Candidate, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "aliases", tuple(self.aliases))
        object.__setattr__(self, "candidates", tuple(self.candidates))
        if self.done_before is not None:  # a numpy bool (from a numpy comparison) is accepted and made a bool
            _require(type(self.done_before).__name__ in ("bool", "bool_"), "done_before", self.done_before,
                     "True, False or None")
            object.__setattr__(self, "done_before", bool(self.done_before))
        _require(_is_int(self.turn) and self.turn >= 0, "turn", self.turn, "an integer >= 0")
        _require(bool(self.candidates) and all(isinstance(c, Candidate) for c in self.candidates), "candidates",
                 self.candidates, "at least one Candidate")
        idx = [c.index for c in self.candidates]
        _require(len(set(idx)) == len(idx), "candidates", idx, "distinct candidate indices")

    @property
    def state_id(self) -> str:
        return f"{self.benchmark}/{self.task_id}/seed{self.parent_seed}/t{self.turn}"


# ----------------------------------------------------------------------------- targets and the leak filter
ASK_TARGET, STOP_TARGET = "ASK", "STOP"


def canonical_target(c: Candidate) -> str:
    """The completion ``c`` is trained towards (§4.3): an ASK is the sorted-key JSON
    ``{"action": "ASK", "question": ..., "rationale": ...}``, a STOP (malformed replies included)
    ``{"action": "STOP"}``, both with `json.dumps`'s default separators. `prompts.parse_action`
    reads either back (it compares ``action`` case-insensitively)."""
    if c.is_ask:
        return json.dumps({"action": ASK_TARGET, "question": c.question, "rationale": c.rationale}, sort_keys=True)
    return STOP_COMPLETION


STOP_COMPLETION = json.dumps({"action": STOP_TARGET}, sort_keys=True)


def _canonical_kind(completion: str) -> str | None:
    """"ASK" / "STOP" when ``completion`` is exactly a canonical target, else None."""
    try:
        obj = json.loads(completion)
    except (TypeError, ValueError):
        return None
    if not isinstance(obj, dict):
        return None
    if obj == {"action": STOP_TARGET}:
        kind = STOP_TARGET
    elif (set(obj) == {"action", "question", "rationale"} and obj["action"] == ASK_TARGET
          and isinstance(obj["question"], str) and obj["question"].strip() and isinstance(obj["rationale"], str)):
        kind = ASK_TARGET
    else:
        return None
    return kind if json.dumps(obj, sort_keys=True) == completion else None


_YES_NO = YES_TOKENS | NO_TOKENS


def leaks_answer(question: str, answer: str, aliases: Sequence[str] = ()) -> bool:
    """Whether ``question`` leaks the gold answer (§4.3 [S]): the normalised (SQuAD,
    `metrics.normalize_answer`) gold answer or one of its aliases occurs as a token sequence in the
    normalised question.

    Yes/no golds are exempt: on a yes/no task (`metrics.is_yes_no`: StrategyQA, aliases yes/true
    and no/false) the filter is not applied, and more generally a gold or alias that normalises to
    one of the words yes/no/true/false is never looked for, since a question holding such a word
    ("Is there no record of ...?") does not give away a yes/no answer (the literal rule would drop
    every StrategyQA question containing "no" or "true"). A gold or alias that normalises to
    nothing (e.g. "The") never leaks."""
    if is_yes_no(answer):
        return False
    tokens = normalize_answer(question).split()
    for gold in (answer, *aliases):
        g = normalize_answer(gold)
        if g and g not in _YES_NO and contains_tokens(tokens, g.split()):
            return True
    return False


def _norm_question(q: str) -> str:
    return " ".join(q.split()).casefold()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def candidate_hash(state: ForkState, c: Candidate) -> str:
    """The stable identity hash of candidate ``c`` of ``state`` (ties and the pair cap, module docstring)."""
    return _sha(f"{state.state_id}|{c.index}|{c.seed}|{c.question}")


def pair_hash(state: ForkState, kind: str, a: Candidate, b: Candidate | None) -> str:
    """The stable hash of a pair of ``state`` (``b`` None: the synthesised STOP); the cap keeps the smallest."""
    sides = sorted(candidate_hash(state, c) if c is not None else "STOP" for c in (a, b))
    return _sha(f"{state.state_id}|{kind}|{sides[0]}|{sides[1]}")


def _by_value(state: ForkState, cands: Iterable[Candidate]) -> list[Candidate]:
    """Candidates by value, highest first, ties by identity hash."""
    return sorted(cands, key=lambda c: (-c.value, candidate_hash(state, c)))


def _leaks(state: ForkState, c: Candidate) -> bool:
    return c.is_ask and leaks_answer(c.question, state.answer, state.aliases)


def _best_ask(state: ForkState) -> Candidate | None:
    """The highest-value non-leaking ASK (ties by identity hash), None when there is none."""
    ok = [c for c in state.candidates if c.is_ask and not _leaks(state, c)]
    return _by_value(state, ok)[0] if ok else None


def _check_floor(floor: float) -> None:
    if not _finite(floor):
        raise ValueError(f"floor={floor!r}: expected a finite number")


# ----------------------------------------------------------------------------- SFT rows (§4.3)
SFTKind = Literal["ASK", "STOP"]
SFTReason = Literal["stop_done", "ask_clears_floor", "parent"]
#: the reasons a row of each kind may carry ("parent": a parent run's own decision, unfiltered, e.g. a warm start)
SFT_REASONS = {"STOP": ("stop_done", "parent"), "ASK": ("ask_clears_floor", "parent")}
SFT_DROPS = ("below_floor", "no_ask", "all_leak", "unknown_done", "duplicate")


@dataclasses.dataclass(frozen=True)
class SFTRow:
    """One stage-1 imitation row: the state's rendered prompt and the canonical target completion.
    ``candidate_index`` is the chosen candidate (-1 for a STOP row: the target is no candidate's)."""

    state_id: str
    benchmark: str
    task_id: str
    kind: SFTKind
    reason: SFTReason
    prompt: str
    completion: str
    weight: float = 1.0
    value: float = 0.0
    phi_gain: float = 0.0
    candidate_index: int = -1

    def __post_init__(self) -> None:
        for name in ("state_id", "benchmark", "task_id", "prompt"):
            _require(isinstance(getattr(self, name), str), name, getattr(self, name), "a string")
        _require(self.kind in SFT_REASONS, "kind", self.kind, "'ASK' or 'STOP'")
        _require(self.reason in SFT_REASONS[self.kind], "reason", self.reason,
                 f"{' or '.join(map(repr, SFT_REASONS[self.kind]))} for a {self.kind} row")
        _require(isinstance(self.completion, str) and _canonical_kind(self.completion) == self.kind, "completion",
                 self.completion, f"the canonical {self.kind} target")
        _require(_finite(self.weight) and self.weight > 0, "weight", self.weight, "a finite number > 0")
        _require(_finite(self.value), "value", self.value, "a finite number")
        _require(_finite(self.phi_gain) and self.phi_gain >= 0, "phi_gain", self.phi_gain, "a finite number >= 0")
        _require(_is_int(self.candidate_index) and self.candidate_index >= -1, "candidate_index",
                 self.candidate_index, "an integer >= -1")

    def to_json(self) -> str:
        """One JSON line (sorted keys)."""
        return _dumps(self)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> SFTRow:
        """The row from `to_json`'s text (or its parsed object); `RecordError` on a bad field."""
        return _loads(cls, text)


def sft_rows(states: Iterable[ForkState], *, floor: float = FLOOR) -> tuple[list[SFTRow], Counter]:
    """Stage-1 SFT rows from forked states (§4.3) and their counts.

    Per state: ``done_before`` True -> target STOP (``stop_done``); False -> the non-leaking ASK of
    highest value (ties by identity hash) is the target (``ask_clears_floor``) when its phi_gain >
    ``floor``, else no row (``below_floor``); no ASK at all -> ``no_ask``, every ASK leaking ->
    ``all_leak``; None -> ``unknown_done``. A recorded STOP is never the target at a not-done state.
    Rows byte-identical in (benchmark, task_id, prompt, completion) are kept once (the first, in
    state order; the others count as ``duplicate``). Weights: 1/sqrt(rows of the same task and
    kind), normalised to mean 1 within each kind.

    Counts: kept rows by ``(kind, reason)``, dropped states (and duplicate rows) by reason string."""
    _check_floor(floor)
    counts: Counter = Counter()
    rows: list[SFTRow] = []
    seen: set[tuple[str, str, str, str]] = set()
    for state in states:
        row = _sft_row(state, floor)
        if isinstance(row, str):
            counts[row] += 1
            continue
        key = (row.benchmark, row.task_id, row.prompt, row.completion)
        if key in seen:
            counts["duplicate"] += 1
            continue
        seen.add(key)
        rows.append(row)
    per_task = Counter((r.kind, r.benchmark, r.task_id) for r in rows)
    raw = [1.0 / math.sqrt(per_task[(r.kind, r.benchmark, r.task_id)]) for r in rows]
    mean = {k: sum(w for w, r in zip(raw, rows) if r.kind == k) / n
            for k, n in Counter(r.kind for r in rows).items()}
    rows = [dataclasses.replace(r, weight=w / mean[r.kind]) for w, r in zip(raw, rows)]
    counts.update((r.kind, r.reason) for r in rows)
    return rows, counts


def _sft_row(state: ForkState, floor: float) -> SFTRow | str:
    """The state's row, or the reason it has none."""
    if state.done_before is None:
        return "unknown_done"
    common = {"state_id": state.state_id, "benchmark": state.benchmark, "task_id": state.task_id}
    if state.done_before:
        parent = min(state.candidates, key=lambda c: c.index)
        return SFTRow(**common, kind="STOP", reason="stop_done", prompt=parent.prompt, completion=STOP_COMPLETION)
    if not any(c.is_ask for c in state.candidates):
        return "no_ask"
    best = _best_ask(state)
    if best is None:
        return "all_leak"
    if not best.phi_gain > floor:
        return "below_floor"
    return SFTRow(**common, kind="ASK", reason="ask_clears_floor", prompt=best.prompt,
                  completion=canonical_target(best), value=best.value, phi_gain=best.phi_gain,
                  candidate_index=best.index)


# ----------------------------------------------------------------------------- preference pairs (§4.4, §4.5)
PairKind = Literal["ask_ask", "ask_stop", "synth_done", "synth_not_done"]
DecidedBy = Literal["outcome", "quickest", "gain", "stop_done", "floor", "stop_contrast"]
PAIR_KINDS = ("ask_ask", "ask_stop", "synth_done", "synth_not_done")
DECIDED_BY = {"ask_ask": ("outcome", "quickest", "gain"), "ask_stop": ("outcome", "stop_done", "floor"),
              "synth_done": ("stop_done",), "synth_not_done": ("stop_contrast",)}
PAIR_DROPS = ("leak", "pin", "prompt", "identical", "margin", "length", "cap", "no_pair")


@dataclasses.dataclass(frozen=True)
class Pair:
    """One preference pair: the state's rendered prompt, the chosen and the rejected canonical
    targets, the margin, and the candidates on each side (-1: the synthesised STOP)."""

    state_id: str
    benchmark: str
    task_id: str
    kind: PairKind
    decided_by: DecidedBy
    prompt: str
    chosen: str
    rejected: str
    margin: float
    chosen_index: int
    rejected_index: int

    def __post_init__(self) -> None:
        for name in ("state_id", "benchmark", "task_id", "prompt"):
            _require(isinstance(getattr(self, name), str), name, getattr(self, name), "a string")
        _require(self.kind in DECIDED_BY, "kind", self.kind, " or ".join(map(repr, PAIR_KINDS)))
        _require(self.decided_by in DECIDED_BY[self.kind], "decided_by", self.decided_by,
                 f"{' or '.join(map(repr, DECIDED_BY[self.kind]))} for a {self.kind} pair")
        for name in ("chosen", "rejected"):
            v = getattr(self, name)
            _require(isinstance(v, str) and _canonical_kind(v) is not None, name, v, "a canonical ASK or STOP target")
        _require(self.chosen != self.rejected, "rejected", self.rejected, "a completion other than the chosen one")
        _require(_finite(self.margin) and self.margin >= 0, "margin", self.margin, "a finite number >= 0")
        for name in ("chosen_index", "rejected_index"):
            v = getattr(self, name)
            _require(_is_int(v) and v >= -1, name, v, "an integer >= -1")

    @property
    def synthesised(self) -> bool:
        return self.kind in ("synth_done", "synth_not_done")

    def to_json(self) -> str:
        """One JSON line (sorted keys)."""
        return _dumps(self)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> Pair:
        """The pair from `to_json`'s text (or its parsed object); `RecordError` on a bad field."""
        return _loads(cls, text)


def _outcome(a: Candidate, b: Candidate) -> int:
    """+1 when ``a``'s run answered better, -1 when ``b``'s did, 0 when undecided (a NaN never decides)."""
    x, y = a.answer_correct, b.answer_correct
    if math.isnan(x) or math.isnan(y) or x == y:
        return 0
    return 1 if x > y else -1


def _quicker(a: Candidate, b: Candidate) -> int:
    """+1 when ``a``'s run completed in fewer questions, -1 when ``b``'s did, 0 undecided (-1 never decides)."""
    x, y = a.turns_to_complete, b.turns_to_complete
    if x < 0 or y < 0 or x == y:
        return 0
    return 1 if x < y else -1


def _pair(state: ForkState, kind: str, decided_by: str, chosen: Candidate | None, rejected: Candidate | None,
          margin: float) -> Pair:
    side = chosen if chosen is not None else rejected
    assert side is not None
    return Pair(state_id=state.state_id, benchmark=state.benchmark, task_id=state.task_id, kind=kind,  # type: ignore[arg-type]
                decided_by=decided_by, prompt=side.prompt,  # type: ignore[arg-type]
                chosen=canonical_target(chosen) if chosen is not None else STOP_COMPLETION,
                rejected=canonical_target(rejected) if rejected is not None else STOP_COMPLETION,
                margin=margin, chosen_index=chosen.index if chosen is not None else -1,
                rejected_index=rejected.index if rejected is not None else -1)


def _ask_ask(state: ForkState, hi: Candidate, lo: Candidate, floor: float, max_len_delta: int) -> Pair | str:
    """The ask_ask pair of ``hi`` (value >= ``lo``'s), or the reason it is dropped (§4.4)."""
    if _leaks(state, hi) or _leaks(state, lo):
        return "leak"
    if hi.pin != lo.pin:
        return "pin"
    if hi.prompt != lo.prompt:
        return "prompt"
    qh, ql = _norm_question(hi.question), _norm_question(lo.question)
    if qh == ql:
        return "identical"
    margin = abs(hi.value - lo.value)  # value(hi) - value(lo), or its absolute value when a key flips the order
    if not margin > floor:
        return "margin"
    if abs(len(qh) - len(ql)) > max_len_delta:
        return "length"
    if o := _outcome(hi, lo):
        decided, hi_wins = "outcome", o > 0
    elif q := _quicker(hi, lo):
        decided, hi_wins = "quickest", q > 0
    else:
        decided, hi_wins = "gain", True
    chosen, rejected = (hi, lo) if hi_wins else (lo, hi)
    return _pair(state, "ask_ask", decided, chosen, rejected, margin)


def _ask_stop(state: ForkState, ask: Candidate, stop: Candidate, floor: float) -> Pair | str:
    """The recorded ask_stop pair of ``ask`` and the STOP candidate ``stop``, or why there is none (§4.5)."""
    if _leaks(state, ask):
        return "leak"
    if ask.pin != stop.pin:
        return "pin"
    if ask.prompt != stop.prompt:
        return "prompt"
    margin = abs(ask.value)
    if o := _outcome(ask, stop):
        return _pair(state, "ask_stop", "outcome", *((ask, stop) if o > 0 else (stop, ask)), margin)
    if state.done_before is True:
        return _pair(state, "ask_stop", "stop_done", stop, ask, margin)
    if state.done_before is False and ask.phi_gain > floor:
        return _pair(state, "ask_stop", "floor", ask, stop, margin)
    return "no_pair"


def state_pairs(state: ForkState, *, floor: float = FLOOR, max_pairs: int = MAX_PAIRS,
                max_len_delta: int = MAX_LEN_DELTA) -> tuple[list[Pair], Counter]:
    """One state's pairs (see `pairs`): the capped recorded pairs in pair-hash order, then the
    synthesised pair if any."""
    counts: Counter = Counter()
    kept: list[tuple[str, Pair]] = []

    def take(kind: str, result: Pair | str, a: Candidate, b: Candidate) -> None:
        if isinstance(result, str):
            counts[result] += 1
        else:
            kept.append((pair_hash(state, kind, a, b), result))

    asks = _by_value(state, (c for c in state.candidates if c.is_ask))
    stops = sorted((c for c in state.candidates if not c.is_ask), key=lambda c: candidate_hash(state, c))
    for i, hi in enumerate(asks):
        for lo in asks[i + 1:]:
            take("ask_ask", _ask_ask(state, hi, lo, floor, max_len_delta), hi, lo)
    for stop in stops:
        for ask in asks:
            take("ask_stop", _ask_stop(state, ask, stop, floor), ask, stop)
    kept.sort(key=lambda hp: hp[0])
    counts["cap"] += max(0, len(kept) - max_pairs)
    out = [p for _, p in kept[:max_pairs]]
    if asks and not stops and state.done_before is not None:
        best = _best_ask(state)
        if best is None:
            counts["leak"] += 1
        elif state.done_before:
            out.append(_pair(state, "synth_done", "stop_done", None, best, abs(best.value)))
        else:
            out.append(_pair(state, "synth_not_done", "stop_contrast", best, None, abs(best.value)))
    counts.update((p.kind, p.decided_by) for p in out)
    return out, +counts


def pairs(states: Iterable[ForkState], *, floor: float = FLOOR, max_pairs: int = MAX_PAIRS,
          max_len_delta: int = MAX_LEN_DELTA) -> tuple[list[Pair], Counter]:
    """Preference pairs from forked states (§4.4, §4.5) and their counts.

    - **ask_ask**: the ASK candidates by value (highest first, ties by identity hash), every pair
      (hi, lo). The chosen side is decided by, in order, ``outcome`` (higher ``answer_correct``; a
      NaN never decides), ``quickest`` (smaller non-negative ``turns_to_complete``; -1 never
      decides), ``gain`` (hi). margin = |value(hi) - value(lo)|. Dropped when either side leaks
      (``leak``), the pins differ (``pin``), the rendered states differ (``prompt``), the
      questions are equal after whitespace collapse and casefold (``identical``), margin <=
      ``floor`` (``margin``), or the normalised questions' lengths differ by more than
      ``max_len_delta`` characters (``length``).
    - **ask_stop** (recorded): each STOP candidate (malformed included) against each ASK candidate:
      ``outcome`` first; else at a done state the STOP is chosen (``stop_done``); else at a
      not-done state the ASK is chosen when its phi_gain > ``floor`` (``floor``); else no pair
      (``no_pair``). margin = |value(ASK)|; the leak, pin and prompt guards apply, no other.
    - **cap**: at most ``max_pairs`` recorded pairs per state, those of smallest `pair_hash`
      (not by margin); the rest count as ``cap``.
    - **synthesised** (outside the cap), only when the state has an ASK and no candidate stopped:
      ``done_before`` True -> STOP chosen over the best ASK (``synth_done``, ``stop_done``); False
      -> the best ASK chosen over STOP (``synth_not_done``, ``stop_contrast``); None -> none. The
      best ASK is the highest-value non-leaking one (all leaking: ``leak``, no pair); margin =
      |value(best)|; ``rejected_index`` / ``chosen_index`` -1 marks the synthesised STOP.

    Counts: kept pairs by ``(kind, decided_by)``, dropped candidate pairs by reason string."""
    _check_floor(floor)
    if not (_is_int(max_pairs) and max_pairs >= 0):
        raise ValueError(f"max_pairs={max_pairs!r}: expected an integer >= 0")
    if not (_finite(max_len_delta) and max_len_delta >= 0):
        raise ValueError(f"max_len_delta={max_len_delta!r}: expected a number >= 0")
    out: list[Pair] = []
    counts: Counter = Counter()
    for state in states:
        ps, c = state_pairs(state, floor=floor, max_pairs=max_pairs, max_len_delta=max_len_delta)
        out += ps
        counts.update(c)
    return out, counts


def stage_pairs(pairs: Iterable[Pair], stage: Literal[2, 3]) -> list[Pair]:
    """A DPO stage's pairs (§4.6): stage 2 = the ask_ask pairs; stage 3 = ask_ask, ask_stop and
    the synthesised pairs, excluding every pair decided by ``stop_done``."""
    if stage == 2:
        return [p for p in pairs if p.kind == "ask_ask"]
    if stage == 3:
        return [p for p in pairs if p.decided_by != "stop_done"]
    raise ValueError(f"stage={stage!r}: expected 2 or 3")


# ----------------------------------------------------------------------------- JSONL
R = TypeVar("R", SFTRow, Pair)


def _dumps(record: SFTRow | Pair) -> str:
    return json.dumps(dataclasses.asdict(record), sort_keys=True, ensure_ascii=False, allow_nan=False)


def _loads(cls: type[R], text: str | Mapping[str, Any]) -> R:
    obj = json.loads(text) if isinstance(text, str) else text
    if not isinstance(obj, Mapping):
        raise RecordError("<record>", obj, f"a JSON object with the fields of {cls.__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in obj:
        _require(name in fields, str(name), obj[name], f"no such field in {cls.__name__} "
                 f"(fields: {', '.join(fields)})")
    required = [n for n, f in fields.items() if f.default is dataclasses.MISSING]
    for name in required:
        _require(name in obj, name, "<missing>", f"a value (a required field of {cls.__name__})")
    return cls(**obj)


def write_jsonl(path: str | os.PathLike, rows: Iterable[SFTRow | Pair]) -> int:
    """Write ``rows`` one JSON line each (UTF-8; replaced atomically); returns the count."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(r.to_json() + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def _read(path: str | os.PathLike, cls: type[R]) -> list[R]:
    out: list[R] = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            where = f"{path} line {i}: "
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{where}invalid JSON ({e}): expected one {cls.__name__} object a line") from None
            try:
                out.append(cls.from_json(obj))
            except RecordError as e:
                raise e.at(where) from None
    return out


def read_sft_rows(path: str | os.PathLike) -> list[SFTRow]:
    """The rows `write_jsonl` wrote; a ValueError naming the line, field, value and expectation on a bad one."""
    return _read(path, SFTRow)


def read_pairs(path: str | os.PathLike) -> list[Pair]:
    """The pairs `write_jsonl` wrote; a ValueError naming the line, field, value and expectation on a bad one."""
    return _read(path, Pair)


__all__ = [
    "C_RET", "DECIDED_BY", "FLOOR", "MAX_LEN_DELTA", "MAX_PAIRS", "PAIR_DROPS", "PAIR_KINDS", "SFT_DROPS",
    "STOP_COMPLETION", "STOP_VALUE", "AskValue", "Candidate", "DecidedBy", "ForkState", "Pair", "PairKind",
    "RecordError", "SFTKind", "SFTReason", "SFTRow", "ask_value", "candidate_hash", "canonical_target",
    "held_coverage", "leaks_answer", "pair_hash", "pairs", "read_pairs", "read_sft_rows", "sft_rows", "stage_pairs",
    "state_pairs", "write_jsonl",
]

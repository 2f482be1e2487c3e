"""A questioner-drafter run as a record (host code): what the metrics read and the JSONL holds.

A `QDRun` is one episode of the loop (the Q&D spec's §1.2) on one task: its executed questions
(`QDTurn`: the question, the pool indices BM25 returned in rank order, those not held before, the
drafter's reply, token counts), why it ended (``stop_reason``: ``policy_stop`` (a STOP, or a
malformed output counted in ``malformed``), ``budget`` (an ASK past the retrieval cap: not
executed, not recorded) or ``max_turns``), the final draft and answer, and the run's token
counts. ``n_asks`` = the executed questions. Prefix k (`QDRun.prefix`) = the first k turns, the
run a cap-k harness would have recorded (the policy is budget-blind).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

StopReason = Literal["policy_stop", "budget", "max_turns"]
STOP_REASONS = ("policy_stop", "budget", "max_turns")


@dataclasses.dataclass(frozen=True)
class QDTurn:
    question: str
    retrieved: tuple[int, ...]  # pool indices, BM25 rank order
    new: tuple[int, ...] = ()  # of those, the ones not held before this turn
    reply: str = ""  # the drafter's resolution of the question (A_n)
    rationale: str = ""
    parent_uids: tuple[str, ...] = ()
    question_tokens: int = 0  # the question's tokens (the length control's budget unit)
    completion_tokens: int = 0  # the questioner's whole output for this decision
    raw: str = ""  # the questioner's reply, verbatim (a training row's completion)
    draft: str = ""  # the draft after this turn (with the history, what the next decision saw)


@dataclasses.dataclass(frozen=True)
class QDRun:
    benchmark: str
    task_id: str
    seed: int
    questioner: str  # the arm's name, e.g. "scripted", "never_ask", "local:runs/x/hf", "endpoint:model"
    turns: tuple[QDTurn, ...]
    stop_reason: StopReason
    malformed: int = 0  # malformed outputs (each ends the run as a policy stop)
    draft: str = ""
    answer: str = ""
    cap: int = 8
    max_turns: int = 16
    drafter: str = ""  # e.g. "extractive (offline stand-in)" or "endpoint:model"
    answerer: str = ""
    tokens: dict[str, int] = dataclasses.field(default_factory=dict)  # questioner_prompt, questioner_completion, ...
    failed: bool = False  # a questioner / drafter / answerer call failed after its retries: counted, kept out
    error: str = ""
    final_raw: str = ""  # the reply of the decision that ended the run (a STOP, a malformed reply, an ASK past the cap)

    def __post_init__(self) -> None:
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason={self.stop_reason!r}: expected one of {', '.join(STOP_REASONS)}")

    @property
    def n_asks(self) -> int:
        return len(self.turns)

    def prefix(self, k: int) -> QDRun:
        """The first ``k`` turns (``k >= n_asks``: the run itself); a shorter prefix ends by the
        budget, as a cap-k harness would have ended it."""
        if k < 0:
            raise ValueError(f"k={k}: expected k >= 0")
        if k >= self.n_asks:
            return self
        return dataclasses.replace(self, turns=self.turns[:k], stop_reason="budget", cap=k)

    def held(self, k: int | None = None) -> set[int]:
        """Pool indices held after the first ``k`` turns (all turns by default)."""
        turns = self.turns if k is None else self.turns[:k]
        return {i for t in turns for i in t.retrieved}

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["n_asks"] = self.n_asks
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QDRun:
        d = {k: v for k, v in d.items() if k != "n_asks"}
        turns = tuple(QDTurn(**{**t, "retrieved": tuple(t["retrieved"]), "new": tuple(t.get("new", ())),
                                "parent_uids": tuple(t.get("parent_uids", ()))}) for t in d.pop("turns"))
        return cls(turns=turns, **d)


def write_runs(runs: Iterable[QDRun], path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in runs)
    return path


def read_runs(path: Path | str) -> list[QDRun]:
    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if line.strip():
            try:
                out.append(QDRun.from_dict(json.loads(line)))
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{i + 1}: expected a QDRun JSON line ({e})") from None
    return out


def runs_by_task(runs: Sequence[QDRun]) -> dict[str, list[QDRun]]:
    out: dict[str, list[QDRun]] = {}
    for r in runs:
        out.setdefault(r.task_id, []).append(r)
    return out


__all__ = ["STOP_REASONS", "QDRun", "QDTurn", "StopReason", "read_runs", "runs_by_task", "write_runs"]

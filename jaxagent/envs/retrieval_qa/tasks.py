"""Retrieval QA tasks (host code): a question, its gold answer and aliases, and the task's own pool
of evidence units, built from MuSiQue, StrategyQA and 2WikiMultiHopQA records as their releases
ship them (docs/QD.md; the Q&D spec's §1.3 and §2.4-2.6 define the pools).

- **MuSiQue**: the 20 paragraphs sorted by ``idx`` (pool index = ``idx``); ``answerable`` false
  records are skipped; k = 5.
- **StrategyQA**: 20 units: the gold paragraphs of the step evidence (`strategyqa_step_evidence`,
  in step order, de-duplicated) padded with distractors drawn by a seeded shuffle of the corpus
  (``random.Random(f"17:{qid}")``), then the pool shuffled by the same generator; gold "yes"/"no"
  with aliases true/false; k = 2.
- **2WikiMultiHopQA**: ``context`` in order (text = the stripped sentences joined by spaces); k = 3.

The package ships 100 MuSiQue train tasks (CC BY 4.0), the 229 StrategyQA dev tasks with their
998 paragraphs (MIT) and 500 2WikiMultiHopQA train tasks (Apache-2.0) under
``jaxagent/data/qd/`` (licences beside them); `load_suite` reads those or any file of the same
format.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "data" / "qd"
BENCHMARKS = ("musique", "strategyqa", "2wiki", "synthetic")
#: top-k per benchmark (spec §1.3); synthetic suites (`jaxagent.qd.synthetic`) are MuSiQue-format files
TOP_K = {"musique": 5, "strategyqa": 2, "2wiki": 3, "synthetic": 2}
SHIPPED = {"musique": DATA / "musique" / "musique_train_100.json",
           "strategyqa": DATA / "strategyqa" / "strategyqa_dev_229.json",
           "2wiki": DATA / "wiki2" / "2wiki_train_500.json"}
SHIPPED_PARAGRAPHS = DATA / "strategyqa" / "strategyqa_dev_paragraphs.json"
STRATEGYQA_POOL = 20


@dataclasses.dataclass(frozen=True)
class Unit:
    """One evidence unit of a task's pool: its pool index, the source's id for it (MuSiQue's
    ``idx``, StrategyQA's ``"Title-para_index"``, 2Wiki's title), title and text."""

    index: int
    source_id: str
    title: str
    text: str


@dataclasses.dataclass(frozen=True)
class QATask:
    """A retrieval QA task; evidence identity is ``f"{task_id}:{index}"`` (`uid`)."""

    benchmark: str
    task_id: str
    question: str
    answer: str
    aliases: tuple[str, ...]
    pool: tuple[Unit, ...]
    k: int
    kind: str = ""  # MuSiQue's hop class (e.g. "2hop"), 2Wiki's type; "" for StrategyQA

    def uid(self, index: int) -> str:
        return f"{self.task_id}:{index}"


def _need(record: Mapping[str, Any], key: str, what: str, where: str):
    if key not in record:
        raise ValueError(f"{where}: no field {key!r}; expected {what}")
    return record[key]


# ----------------------------------------------------------------------------- MuSiQue
def musique_task(record: Mapping[str, Any], benchmark: str = "musique") -> QATask | None:
    """The task of a MuSiQue record (None when ``answerable`` is false); ``benchmark="synthetic"``
    for the synthetic suites, written in the same format."""
    tid = str(_need(record, "id", "the task id", "musique record"))
    if not record.get("answerable", True):
        return None
    paras = sorted(_need(record, "paragraphs", "a list of {idx, title, paragraph_text}", tid), key=lambda p: p["idx"])
    pool = tuple(Unit(int(p["idx"]), str(p["idx"]), p["title"], p["paragraph_text"]) for p in paras)
    if [u.index for u in pool] != list(range(len(pool))):
        raise ValueError(f"{tid}: paragraphs idx {[u.index for u in pool]}; expected 0..{len(pool) - 1}")
    return QATask(benchmark, tid, record["question"], record["answer"], tuple(record.get("answer_aliases") or ()),
                  pool, TOP_K[benchmark], kind=tid.split("__")[0])


# ----------------------------------------------------------------------------- StrategyQA
def strategyqa_corpus(paragraphs: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Paragraph id ``f"{title}-{para_index}"`` -> (title, contents); the shipped list, or the
    upstream dict keyed by that id."""
    if isinstance(paragraphs, Mapping):
        return {pid: (p["title"], p["content"] if "content" in p else p["contents"]) for pid, p in paragraphs.items()}
    return {f"{p['title']}-{p['para_index']}": (p["title"], p["contents"]) for p in paragraphs}


def strategyqa_step_evidence(record: Mapping[str, Any], corpus: Mapping[str, Any]) -> list[list[str]]:
    """Per decomposition step, its paragraph ids: walking the annotators in order, the first whose
    step has an alternative that is a non-empty list of ids gives its first such list (no union);
    ``"operation"`` / ``"no_evidence"`` are not evidence, and ids missing from the corpus are
    dropped (an alternative left empty by that is passed over)."""
    steps = record["decomposition"]
    out: list[list[str]] = []
    for i in range(len(steps)):
        found: list[str] = []
        for annotator in record.get("evidence") or ():
            if i >= len(annotator):
                continue
            for alt in annotator[i]:
                if isinstance(alt, list):
                    ids = [pid for pid in alt if isinstance(pid, str) and pid in corpus]
                    if ids:
                        found = ids
                        break
            if found:
                break
        out.append(found)
    return out


def strategyqa_task(record: Mapping[str, Any], corpus: Mapping[str, tuple[str, str]]) -> QATask | None:
    """The task of a StrategyQA record (None for an empty decomposition), with the seeded pool."""
    qid = str(_need(record, "qid", "the task id", "strategyqa record"))
    if not record.get("decomposition"):
        return None
    gold: list[str] = []
    for ids in strategyqa_step_evidence(record, corpus):
        gold += [pid for pid in ids if pid not in gold]
    rng = random.Random(f"17:{qid}")
    candidates = [pid for pid in sorted(corpus) if pid not in gold]
    rng.shuffle(candidates)
    pool_ids = gold + candidates[: max(0, STRATEGYQA_POOL - len(gold))]
    rng.shuffle(pool_ids)
    pool = tuple(Unit(i, pid, corpus[pid][0], corpus[pid][1]) for i, pid in enumerate(pool_ids))
    yes = bool(record["answer"])
    return QATask("strategyqa", qid, record["question"], "yes" if yes else "no", ("true",) if yes else ("false",),
                  pool, TOP_K["strategyqa"])


# ----------------------------------------------------------------------------- 2WikiMultiHopQA
def wiki2_task(record: Mapping[str, Any]) -> QATask:
    tid = str(_need(record, "_id", "the task id", "2wiki record"))
    pool = tuple(Unit(i, title, title, " ".join(s.strip() for s in sentences))
                 for i, (title, sentences) in enumerate(record.get("context") or ()))
    return QATask("2wiki", tid, record["question"], record["answer"], (), pool, TOP_K["2wiki"],
                  kind=str(record.get("type", "")).replace("-", "_"))


# ----------------------------------------------------------------------------- suites
def read_json(path: Path | str, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: expected a readable JSON file of {what} ({e})") from None


def load_records(benchmark: str, path: Path | str | None = None) -> list[dict[str, Any]]:
    """A benchmark file's records (the shipped one by default)."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"benchmark={benchmark!r}: expected one of {', '.join(BENCHMARKS)}")
    if path is None and benchmark not in SHIPPED:
        raise ValueError(f"benchmark={benchmark!r}: no file ships with the package; expected a file "
                         "(python -m jaxagent.qd.synthetic writes one)")
    data = read_json(path or SHIPPED[benchmark], f"{benchmark} records")
    if not isinstance(data, list):
        raise ValueError(f"{path or SHIPPED[benchmark]}: a {type(data).__name__}; expected a list of {benchmark} "
                         "records")
    return data


def load_corpus(paragraphs: Path | str | None = None) -> dict[str, tuple[str, str]]:
    """The StrategyQA corpus (`strategyqa_corpus`) of a paragraphs file (the shipped one by default)."""
    return strategyqa_corpus(read_json(paragraphs or SHIPPED_PARAGRAPHS, "StrategyQA paragraphs"))


def load_suite(benchmark: str, path: Path | str | None = None, paragraphs: Path | str | None = None, *,
               corpus: Mapping[str, tuple[str, str]] | None = None) -> list[tuple[dict[str, Any], QATask]]:
    """(record, task) for every usable record of a benchmark file, in file order (skipped:
    MuSiQue's unanswerable records, StrategyQA's empty decompositions). StrategyQA's corpus:
    ``corpus`` when given, else `load_corpus` of ``paragraphs``."""
    records = load_records(benchmark, path)
    if benchmark == "strategyqa":
        corpus = corpus if corpus is not None else load_corpus(paragraphs)
        built = [(r, strategyqa_task(r, corpus)) for r in records]
    elif benchmark in ("musique", "synthetic"):
        built = [(r, musique_task(r, benchmark)) for r in records]
    else:
        built = [(r, wiki2_task(r)) for r in records]
    return [(r, t) for r, t in built if t is not None]


__all__ = ["BENCHMARKS", "TOP_K", "QATask", "Unit", "load_corpus", "load_records", "load_suite", "musique_task",
           "strategyqa_corpus", "strategyqa_step_evidence", "strategyqa_task", "wiki2_task"]

"""Synthetic multi-hop retrieval tasks (host code) for small models on a CPU, written as MuSiQue records.

A task is ``breadth`` independent **lines**, each a chain of ``depth`` hops over made-up entities
(people, cities, companies, countries) and relations ("was born in", "founded", "is headquartered
in", ...): hop 1 of a line names its start entity, hop j > 1 asks about the previous hop's answer as
``#n`` (MuSiQue's convention, n = that step's 1-based number), e.g. ``"Where was #1 born?"``. Each hop
has one supporting paragraph, titled by the hop's subject, whose text states the hop's fact and so
**names the entity the next hop needs** (a questioner that asks about entities named in new evidence
can walk the chain; BM25 with that name as the query finds the next paragraph). With ``breadth > 1``
the lines are combined:

- ``join="step"`` (default): a final comparison step ``"Which is the oldest: #a or #b?"``
  referencing the last step of every line, supported by one paragraph naming the lines' last
  entities with their years. The final step (depth ``depth``) joins the lines into one weakly connected
  component, so under the spec's §2.3 the task has **one** facet, whatever the depth.
- ``join="question"``: the comparison lives in the top-level question only (2WikiMultiHopQA's
  bridge-comparison shape), so the lines stay apart: ``breadth`` facets for depth >= 2 (none for
  depth 1, where every need is a seed); the answer is still the oldest line end, whose years the
  last paragraph of each line states.

Steps are numbered line by line (line l's hop j is step ``l * depth + j``; the final step, if any, is
``breadth * depth + 1``). Graph shape (`jaxagent.qd.graphs.musique_graph`, longest rule): every need
required; depth histogram ``{d: breadth for d < depth}`` plus ``{depth: 1}`` for the final step;
edges ``s{k} -> s{k+1}`` within a line and each line's last step -> the final step.

The pool is ``pool`` paragraphs: the supporting ones plus distractors about other (fresh) entities,
same relations and fillers, titled by their subject's name; the whole pool is shuffled, ``idx`` =
position. Names within a task are distinct pseudowords (each entity has a token no other entity in
the task shares). Fully deterministic: task i is drawn by its own
``random.Random(f"jaxagent.qd.synthetic:{depth}x{breadth}:{pool}:{join}:{seed}:{i}")``, so it does not
depend on ``n``, and suites of other shapes or seeds do not share tasks. Task ids are
``f"syn{depth}x{breadth}__{i}"`` (``...q__`` for ``join="question"`` with breadth > 1); the part before
``__`` is the task's kind.

As a command (writes a JSON list loadable by ``load_suite("synthetic", OUT.json)``):

    python -m jaxagent.qd.synthetic OUT.json --n N --depth D --breadth B [--pool P] [--seed S] [--join step|question]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Any, Literal

Join = Literal["step", "question"]
JOINS = ("step", "question")
TYPES = ("person", "city", "company", "country")
MAX_BREADTH = 1000


@dataclasses.dataclass(frozen=True)
class Relation:
    """A relation from a ``subject`` type to an ``object`` type: ``fact`` (the paragraph sentence),
    ``ask`` (the step question) and ``phrase`` (a noun phrase for the composed question), each a
    format string over ``{s}`` (subject) and, for ``fact``, ``{o}`` (object)."""

    name: str
    subject: str
    object: str
    fact: str
    ask: str
    phrase: str


RELATIONS = (
    Relation("born_in", "person", "city", "{s} was born in {o}.", "Where was {s} born?", "the birthplace of {s}"),
    Relation("founded", "person", "company", "{s} founded {o}.", "Which company did {s} found?",
             "the company founded by {s}"),
    Relation("married_to", "person", "person", "{s} is married to {o}.", "Who is {s} married to?",
             "the spouse of {s}"),
    Relation("headquartered_in", "company", "city", "{s} is headquartered in {o}.", "Where is {s} headquartered?",
             "the headquarters city of {s}"),
    Relation("led_by", "company", "person", "{s} is led by {o}.", "Who leads {s}?", "the leader of {s}"),
    Relation("located_in", "city", "country", "{s} is located in {o}.", "Which country is {s} located in?",
             "the country of {s}"),
    Relation("mayor", "city", "person", "The mayor of {s} is {o}.", "Who is the mayor of {s}?", "the mayor of {s}"),
    Relation("capital", "country", "city", "The capital of {s} is {o}.", "What is the capital of {s}?",
             "the capital of {s}"),
)
_FROM = {t: [r for r in RELATIONS if r.subject == t] for t in TYPES}
# a hop never follows one it would contradict with a fresh entity (the capital of X lies in X; a
# spouse's spouse is the first person)
_NOT_AFTER = {("capital", "located_in"), ("married_to", "married_to")}

_FILLER = {
    "person": ("{s} is a painter.", "{s} is an engineer.", "{s} is a chemist.", "{s} is a poet.",
               "{s} is a merchant.", "{s} is a sailor."),
    "city": ("{s} is a river city.", "{s} is a mountain town.", "{s} is a busy port.", "{s} is a market town."),
    "company": ("{s} makes bicycles.", "{s} makes lamps.", "{s} builds bridges.", "{s} brews tea.",
                "{s} prints maps."),
    "country": ("{s} is a small country.", "{s} is a coastal country.", "{s} is a highland country."),
}
_SINCE = {"person": "{s} was born in {y}.", "city": "{s} was founded in {y}.", "company": "{s} was founded in {y}.",
          "country": "{s} was established in {y}."}

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kl", "pr", "st",
           "tr", "th", "sh", "qu")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "u", "ai", "ei", "ou")
_CODAS = ("", "", "n", "r", "l", "s", "x", "m")
_COMPANY = ("Labs", "Industries", "Group", "Systems", "Works", "Holdings")
_COUNTRY = ("ia", "land", "stan", "ora")
_CITY = ("", "ton", "burg", "port", "vale")
# words of the templates: a pseudoword equal to one of them would make a name collide with prose
_RESERVED = {w.lower() for r in RELATIONS for w in f"{r.fact} {r.ask} {r.phrase}".replace("?", " ").split()} | {
    w.lower().strip(".") for fs in _FILLER.values() for f in fs for w in f.split()} | {
    "which", "of", "and", "is", "the", "oldest", "was", "established", "dates", "from"} | {c.lower() for c in _COMPANY}


class _Names:
    """Fresh entity names for one task: every name's pseudowords are new to the task."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set(_RESERVED)

    def _word(self) -> str:
        while True:
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(2)) + self.rng.choice(_CODAS)
            if w not in self.used:
                self.used.add(w)
                return w

    def make(self, kind: str) -> str:
        if kind == "person":
            return f"{self._word().capitalize()} {self._word().capitalize()}"
        if kind == "city":
            return (self._word() + self.rng.choice(_CITY)).capitalize()
        if kind == "company":
            return f"{self._word().capitalize()} {self.rng.choice(_COMPANY)}"
        if kind == "country":
            return (self._word() + self.rng.choice(_COUNTRY)).capitalize()
        raise ValueError(f"entity type {kind!r}: expected one of {', '.join(TYPES)}")


def _check_int(name: str, value: Any, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name}={value!r}: expected an integer >= {lo}")


def supporting_count(depth: int, breadth: int, join: Join = "step") -> int:
    """Supporting paragraphs per task: one per hop, plus the final step's when lines are joined by one."""
    return depth * breadth + (1 if breadth > 1 and join == "step" else 0)


def _check(n: int, depth: int, breadth: int, pool: int, seed: int, join: str) -> None:
    _check_int("n", n, 0)
    _check_int("depth", depth, 1)
    _check_int("breadth", breadth, 1)
    if breadth > MAX_BREADTH:
        raise ValueError(f"breadth={breadth!r}: expected at most {MAX_BREADTH} (the lines' years are distinct)")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r}: expected an integer")
    if join not in JOINS:
        raise ValueError(f"join={join!r}: expected one of {', '.join(JOINS)}")
    need = supporting_count(depth, breadth, join)  # type: ignore[arg-type]
    _check_int("pool", pool, 1)
    if pool < need:
        final = " plus the final step's" if need > depth * breadth else ""
        raise ValueError(f"pool={pool!r}: expected at least {need} paragraphs (the supporting paragraphs of "
                         f"depth={depth} x breadth={breadth}{final})")


def _paragraph(rng: random.Random, rel: Relation, s: str, o: str) -> tuple[str, str]:
    """(title, text) of a fact paragraph: the fact, then a filler sentence about the subject."""
    return s, f"{rel.fact.format(s=s, o=o)} {rng.choice(_FILLER[rel.subject]).format(s=s)}"


def _task(i: int, depth: int, breadth: int, pool: int, seed: int, join: Join) -> dict[str, Any]:
    rng = random.Random(f"jaxagent.qd.synthetic:{depth}x{breadth}:{pool}:{join}:{seed}:{i}")
    names = _Names(rng)
    steps: list[dict[str, Any]] = []
    paragraphs: list[dict[str, Any]] = []  # supporting first (step order), shuffled at the end
    ends: list[tuple[str, str, str]] = []  # per line: (last entity, its type, the line's noun phrase)
    for line in range(breadth):
        kind = rng.choice(TYPES)
        entity = names.make(kind)
        phrase, rel = entity, None
        for j in range(1, depth + 1):
            k = line * depth + j  # this step's 1-based number
            rel = rng.choice([r for r in _FROM[kind] if rel is None or (rel.name, r.name) not in _NOT_AFTER])
            obj = names.make(rel.object)
            subject_ref = entity if j == 1 else f"#{k - 1}"
            title, text = _paragraph(rng, rel, entity, obj)
            if join == "question" and breadth > 1 and j == depth:
                text += " " + _SINCE[rel.object].format(s=obj, y="{year}")  # the year, filled in below
            steps.append({"id": (i + 1) * 1000 + k, "question": rel.ask.format(s=subject_ref), "answer": obj,
                          "paragraph_support_idx": len(paragraphs)})
            paragraphs.append({"title": title, "paragraph_text": text, "is_supporting": True})
            phrase = rel.phrase.format(s=phrase)
            entity, kind = obj, rel.object
        ends.append((entity, kind, phrase))
    if breadth == 1:
        question = f"What is {ends[0][2]}?"
        answer = ends[0][0]
    else:
        years = rng.sample(range(1000, 1000 + MAX_BREADTH), breadth)
        answer = ends[min(range(breadth), key=years.__getitem__)][0]
        listed = ", ".join(p for _, _, p in ends[:-1]) + f" or {ends[-1][2]}"
        question = f"Which is the oldest: {listed}?"
        if join == "step":
            refs = [f"#{(line + 1) * depth}" for line in range(breadth)]
            names_ = [e for e, _, _ in ends]
            since = " ".join(_SINCE[t].format(s=e, y=y) for (e, t, _), y in zip(ends, years))
            steps.append({"id": (i + 1) * 1000 + breadth * depth + 1,
                          "question": f"Which is the oldest: {', '.join(refs[:-1])} or {refs[-1]}?",
                          "answer": answer, "paragraph_support_idx": len(paragraphs)})
            paragraphs.append({"title": f"{', '.join(names_[:-1])} and {names_[-1]}",
                               "paragraph_text": f"{since} Of these, {answer} is the oldest.", "is_supporting": True})
        else:
            for line, y in enumerate(years):
                p = paragraphs[steps[(line + 1) * depth - 1]["paragraph_support_idx"]]
                p["paragraph_text"] = p["paragraph_text"].replace("{year}", str(y))
    for _ in range(pool - len(paragraphs)):  # distractors: other entities, same relations
        kind = rng.choice(TYPES)
        rel = rng.choice(_FROM[kind])
        title, text = _paragraph(rng, rel, names.make(kind), names.make(rel.object))
        paragraphs.append({"title": title, "paragraph_text": text, "is_supporting": False})
    order = list(range(len(paragraphs)))
    rng.shuffle(order)
    where = {old: new for new, old in enumerate(order)}
    for s in steps:
        s["paragraph_support_idx"] = where[s["paragraph_support_idx"]]
    shuffled = [{"idx": new, **paragraphs[old]} for new, old in enumerate(order)]
    kind_id = f"syn{depth}x{breadth}" + ("q" if join == "question" and breadth > 1 else "")
    return {"id": f"{kind_id}__{i}", "question": question, "answer": answer, "answer_aliases": [],
            "answerable": True, "question_decomposition": steps, "paragraphs": shuffled}


def generate(n: int, *, depth: int, breadth: int, pool: int = 20, seed: int = 0,
             join: Join = "step") -> list[dict[str, Any]]:
    """``n`` MuSiQue-format records (module docstring) of ``breadth`` lines of ``depth`` hops each, in
    pools of ``pool`` paragraphs; task i is the same for a seed whatever ``n``."""
    _check(n, depth, breadth, pool, seed, join)
    return [_task(i, depth, breadth, pool, seed, join) for i in range(n)]


def write_suite(path: str | Path, n: int, *, depth: int, breadth: int, pool: int = 20, seed: int = 0,
                join: Join = "step") -> Path:
    """`generate` written to ``path`` as one JSON list (parent folders created); returns the path."""
    records = generate(n, depth=depth, breadth=breadth, pool=pool, seed=seed, join=join)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxagent.qd.synthetic", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the JSON file to write")
    ap.add_argument("--n", type=int, required=True, help="tasks")
    ap.add_argument("--depth", type=int, required=True, help="hops per line")
    ap.add_argument("--breadth", type=int, default=1, help="independent lines (default 1)")
    ap.add_argument("--pool", type=int, default=20, help="paragraphs per task (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--join", choices=JOINS, default="step",
                    help="breadth > 1: a final comparison step (one facet) or the question only (breadth facets)")
    args = ap.parse_args(argv)
    try:
        path = write_suite(args.out, args.n, depth=args.depth, breadth=args.breadth, pool=args.pool, seed=args.seed,
                           join=args.join)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.n} tasks (depth {args.depth}, breadth {args.breadth}, pool {args.pool}, seed {args.seed}, "
          f"join {args.join}) to {path}")
    return 0


__all__ = ["JOINS", "MAX_BREADTH", "RELATIONS", "TYPES", "Relation", "generate", "main", "supporting_count",
           "write_suite"]


if __name__ == "__main__":
    sys.exit(main())


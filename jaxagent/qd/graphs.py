"""Need graphs (host code): what a task needs, recovered from the benchmark's own decomposition.

A `NeedGraph` has needs (nodes) with an evidence set of pool indices (required iff non-empty,
else optional: never resolvable, kept for its edges), prerequisite edges u -> v ("v can be named
only after u is resolved") and seeds (depth 0). Depth (`NeedGraph.depths`): ``longest`` (the
default: 1 + the deepest parent, in topological order; undefined for a non-seed without parents,
on a cycle, or below an undefined parent) or ``shortest`` (breadth-first distance from the seeds).
Facets (`NeedGraph.facets`): the weakly connected components left when the depth-0 needs are
deleted (the task's independent lines); `NeedGraph.components`: the components over all needs.

Builders (the Q&D spec's §2.4-2.6): `musique_graph`, `strategyqa_graph`, `wiki2_graph`;
`build_graph` picks by benchmark. As a command, the shapes of a whole file:

    python -m jaxagent.qd.graphs --benchmark musique|strategyqa|2wiki|synthetic [FILE] [--paragraphs FILE] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections import Counter, defaultdict, deque
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from jaxagent.envs.retrieval_qa.tasks import BENCHMARKS, QATask, load_corpus, load_suite, strategyqa_step_evidence

DepthRule = Literal["longest", "shortest"]
_REF = re.compile(r"#(\d+)")


@dataclasses.dataclass(frozen=True)
class Need:
    """One need: ``evidence`` are pool indices (all must be retrieved to resolve it)."""

    id: str
    text: str
    evidence: tuple[int, ...] = ()
    alias: str | None = None

    @property
    def required(self) -> bool:
        return bool(self.evidence)


@dataclasses.dataclass(frozen=True)
class NeedGraph:
    task_id: str
    needs: tuple[Need, ...]
    edges: tuple[tuple[str, str], ...]
    seeds: tuple[str, ...]

    def __post_init__(self) -> None:
        ids = [n.id for n in self.needs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{self.task_id}: need ids {ids}: expected distinct ids")
        known = set(ids)
        for u, v in self.edges:
            if u not in known or v not in known:
                raise ValueError(f"{self.task_id}: edge {u}->{v} names an unknown need; needs {ids}")
        if not set(self.seeds) <= known:
            raise ValueError(f"{self.task_id}: seeds {list(self.seeds)}: expected a subset of {ids}")

    # ---------------------------------------------------------------- structure
    @property
    def by_id(self) -> dict[str, Need]:
        return {n.id: n for n in self.needs}

    def parents(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {n.id: [] for n in self.needs}
        for u, v in self.edges:
            out[v].append(u)
        return out

    @property
    def required_evidence(self) -> frozenset[int]:
        """G: the pool indices some required need names (the uid-coverage denominator)."""
        return frozenset(i for n in self.needs for i in n.evidence)

    @property
    def scorable(self) -> bool:
        """At least one required need (else coverage is undefined: the task is excluded, counted)."""
        return bool(self.required_evidence)

    def depths(self, rule: DepthRule = "longest") -> dict[str, int | None]:
        """Each need's depth (None: undefined, an orphan). Seeds are 0 even with parents."""
        seeds = set(self.seeds)
        if rule == "shortest":
            dist: dict[str, int | None] = {n.id: None for n in self.needs}
            children = defaultdict(list)
            for u, v in self.edges:
                children[u].append(v)
            queue = deque(sorted(seeds, key=self._order))
            for s in queue:
                dist[s] = 0
            while queue:
                u = queue.popleft()
                for v in children[u]:
                    if dist[v] is None:
                        dist[v] = dist[u] + 1
                        queue.append(v)
            return dist
        if rule != "longest":
            raise ValueError(f"qd.depth_rule={rule!r}: expected longest or shortest")
        parents = self.parents()
        depth: dict[str, int | None] = {}
        state: dict[str, int] = {}  # 1: on the stack, 2: done

        def visit(v: str) -> int | None:
            if state.get(v) == 2:
                return depth[v]
            if state.get(v) == 1:  # a cycle: every need on it (and below it) is undefined
                return None
            state[v] = 1
            if v in seeds:
                d: int | None = 0
            elif not parents[v]:
                d = None
            else:
                ds = [visit(u) for u in parents[v]]
                d = None if any(x is None for x in ds) else 1 + max(ds)  # type: ignore[type-var]
            state[v], depth[v] = 2, d
            return d

        for n in self.needs:
            visit(n.id)
        # a need visited while its cycle was open got a depth from a parent still unresolved: redo
        # the needs downstream of any undefined one until nothing changes
        changed = True
        while changed:
            changed = False
            for n in self.needs:
                if n.id in seeds or depth[n.id] is None:
                    continue
                if any(depth[u] is None for u in parents[n.id]):
                    depth[n.id], changed = None, True
        return {n.id: depth[n.id] for n in self.needs}

    def facets(self) -> list[tuple[str, ...]]:
        """Weakly connected components after deleting the depth-0 needs (longest rule), each sorted
        in need order, in order of their first need."""
        d = self.depths("longest")
        return self._components([n.id for n in self.needs if d[n.id] != 0])

    def components(self) -> list[tuple[str, ...]]:
        """Weakly connected components over all needs (breadth's ``components`` variant)."""
        return self._components([n.id for n in self.needs])

    def _order(self, nid: str) -> int:
        return [n.id for n in self.needs].index(nid)

    def _components(self, keep: Sequence[str]) -> list[tuple[str, ...]]:
        kept = set(keep)
        root = {v: v for v in keep}

        def find(v: str) -> str:
            while root[v] != v:
                root[v] = root[root[v]]
                v = root[v]
            return v

        for u, v in self.edges:
            if u in kept and v in kept:
                root[find(u)] = find(v)
        groups: dict[str, list[str]] = defaultdict(list)
        for v in keep:
            groups[find(v)].append(v)
        return sorted((tuple(g) for g in groups.values()), key=lambda g: self._order(g[0]))


def _ref_edges(steps: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """``#n`` references: an edge s{n} -> s{i+1} for each distinct n in step i with
    1 <= n <= #steps and n != i + 1; steps without a kept reference are seeds."""
    edges, seeds = [], []
    for i, text in enumerate(steps):
        refs = sorted({int(m) for m in _REF.findall(text or "")} - {i + 1})
        refs = [n for n in refs if 1 <= n <= len(steps)]
        edges += [(f"s{n}", f"s{i + 1}") for n in refs]
        if not refs:
            seeds.append(f"s{i + 1}")
    return edges, seeds


def musique_graph(record: Mapping[str, Any], task: QATask) -> NeedGraph:
    steps = record["question_decomposition"]
    in_pool = {u.index for u in task.pool}
    needs = tuple(Need(f"s{i + 1}", s["question"],
                       (int(s["paragraph_support_idx"]),) if s.get("paragraph_support_idx") in in_pool else (),
                       s.get("answer")) for i, s in enumerate(steps))
    edges, seeds = _ref_edges([s["question"] for s in steps])
    return NeedGraph(task.task_id, needs, tuple(edges), tuple(seeds))


def strategyqa_graph(record: Mapping[str, Any], task: QATask, corpus: Mapping[str, Any]) -> NeedGraph:
    where = {u.source_id: u.index for u in task.pool}
    steps = record["decomposition"]
    evidence = strategyqa_step_evidence(record, corpus)
    needs = tuple(Need(f"s{i + 1}", text, tuple(where[pid] for pid in ev if pid in where))
                  for i, (text, ev) in enumerate(zip(steps, evidence)))
    edges, seeds = _ref_edges(steps)
    return NeedGraph(task.task_id, needs, tuple(edges), tuple(seeds))


def wiki2_key(s: str) -> str:
    """Lowercase, parenthesised parts dropped, runs of other characters one space, stripped."""
    s = re.sub(r"\s*\([^)]*\)", "", s.lower())
    return re.sub(r"[^a-z0-9]+", " ", s).strip()


_WIKI2_CHAINED = ("compositional", "inference", "bridge_comparison")


def wiki2_graph(record: Mapping[str, Any], task: QATask) -> NeedGraph:
    triples = [t for t in record.get("evidences") or () if len(t) >= 3]
    named = {sf[0] for sf in record.get("supporting_facts") or ()}
    order = ([u for u in task.pool if u.title in named] + [u for u in task.pool if u.title not in named])
    keys = [(u.index, wiki2_key(u.title)) for u in order]

    def locate(subject: str) -> tuple[int, ...]:
        k = wiki2_key(subject)
        for idx, tk in keys:
            if tk == k:
                return (idx,)
        for idx, tk in keys:
            if k and tk and (k in tk or tk in k):
                return (idx,)
        return ()

    needs = tuple(Need(f"e{i + 1}", f"{s} >> {r}", locate(s), o) for i, (s, r, o, *_) in enumerate(triples))
    edges = []
    if task.kind in _WIKI2_CHAINED:
        for i, ti in enumerate(triples):
            for j in range(i + 1, len(triples)):
                obj = wiki2_key(ti[2])
                if obj and obj == wiki2_key(triples[j][0]):
                    edges.append((f"e{i + 1}", f"e{j + 1}"))
    has_parent = {v for _, v in edges}
    return NeedGraph(task.task_id, needs, tuple(edges), tuple(n.id for n in needs if n.id not in has_parent))


def build_graphs(benchmark: str, path=None, paragraphs=None) -> list[tuple[QATask, NeedGraph]]:
    """(task, graph) for every usable record of a benchmark file (the shipped one by default)."""
    if benchmark == "strategyqa":  # the corpus read once, for the pools and the step evidence
        corpus = load_corpus(paragraphs)
        return [(t, strategyqa_graph(r, t, corpus)) for r, t in load_suite(benchmark, path, corpus=corpus)]
    build = musique_graph if benchmark in ("musique", "synthetic") else wiki2_graph
    return [(t, build(r, t)) for r, t in load_suite(benchmark, path)]


def _hist(values) -> dict[str, int]:
    c = Counter(v for v in values if v is not None)
    return {str(d): c[d] for d in sorted(c)}


def shapes(graphs: Sequence[NeedGraph]) -> dict[str, Any]:
    """Whole-file figures (spec §2.7): counts of tasks, needs and edges, depth histograms under
    both rules, facets per task."""
    nodes = [n for g in graphs for n in g.needs]
    longest = [d for g in graphs for d in g.depths("longest").values()]
    shortest = [d for g in graphs for d in g.depths("shortest").values()]
    facets = [len(g.facets()) for g in graphs]
    return {"tasks": len(graphs), "unscorable_tasks": sum(not g.scorable for g in graphs), "nodes": len(nodes),
            "required_nodes": sum(n.required for n in nodes), "optional_nodes": sum(not n.required for n in nodes),
            "required_pool_ids": sum(len(g.required_evidence) for g in graphs),
            "edges": sum(len(g.edges) for g in graphs), "orphans": sum(d is None for d in longest),
            "depth_hist": _hist(longest), "depth_hist_shortest": _hist(shortest),
            "tasks_gt1_facet": sum(f > 1 for f in facets), "tasks_0_facets": sum(f == 0 for f in facets)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxagent.qd.graphs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--benchmark", required=True, choices=BENCHMARKS)
    ap.add_argument("file", nargs="?", help="a benchmark file (default: the one the package ships)")
    ap.add_argument("--paragraphs", help="StrategyQA: the paragraphs file (default: the shipped one)")
    ap.add_argument("--json", action="store_true", help="one JSON object (else one line per figure)")
    args = ap.parse_args(argv)
    try:
        out = shapes([g for _, g in build_graphs(args.benchmark, args.file, args.paragraphs)])
    except (ValueError, KeyError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = {"benchmark": args.benchmark, "file": args.file or "(shipped)", **out}
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

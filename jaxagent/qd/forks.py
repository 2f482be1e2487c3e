"""Forking runs at their decision points and valuing each candidate action (the Q&D spec's §4.1-§4.2).

A **parent** is a finished run of the policy on a training task. A **state** is (task, parent,
fork turn t) for every t < the parent's ``n_asks`` (the decision points where it asked). At a
state, ``n`` candidates are played: candidate i replays the parent's first t questions (the same
retrievals, drafter replies and drafts: `jaxagent.qd.loop.run_episode`'s ``replay``) and acts from
t on with the questioner reseeded (`candidate_seed`: candidate 0 keeps the parent's seed, so it
*is* the parent; the others a hash of (seed, i)), each continued to the end by the same policy
under the same caps, as separate runs: a state's candidates (and every state of a suite, up to
``concurrency``) play at once, so a local policy's decisions batch in its engine.

Only the fork-turn decision of a candidate becomes a label (`jaxagent.qd.labels.Candidate`): its
action at t, its §4.2 value (`ask_value` of what its question retrieved against the parent's held
evidence at t), ``answer_correct`` of its final answer and ``turns_to_complete`` (questions from
the fork, the fork's counting 1, until the run is done; -1 if never). ``done_before`` is done(t)
of the parent's prefix (None where the task has no required evidence). A state with a candidate
run that failed (a role call that kept failing) is dropped and counted, never labelled.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxagent.envs.retrieval_qa.bm25 import PoolIndex
from jaxagent.envs.retrieval_qa.tasks import QATask
from jaxagent.qd import metrics
from jaxagent.qd.agents import Answerer, Drafter, Questioner, describe
from jaxagent.qd.graphs import NeedGraph
from jaxagent.qd.labels import Candidate, ForkState, ask_value
from jaxagent.qd.loop import LoopConfig, decision_prompts, run_episode
from jaxagent.qd.prompts import parse_action
from jaxagent.qd.transcript import QDRun

N_CANDIDATES = 8


def candidate_seed(seed: int, i: int) -> int:
    """The questioner seed of candidate ``i`` at a fork of a run with rollout seed ``seed``: the
    run's own seed for i = 0 (candidate 0 continues the parent), else a stable 31-bit hash of (seed, i)."""
    if i < 0:
        raise ValueError(f"candidate index {i}: expected >= 0")
    return seed if i == 0 else zlib.crc32(f"qd-fork:{seed}:{i}".encode()) & 0x7FFFFFFF


def pin(questioner: Questioner, config: LoopConfig) -> str:
    """What two candidates must share to be compared: the questioner and the caps."""
    return f"{describe(questioner)}|cap={config.cap}|max_turns={config.max_turns}"


def turns_to_complete(run: QDRun, graph: NeedGraph, t: int) -> int:
    """Questions of ``run`` from decision ``t`` on (the one at t counting 1) until its held evidence
    is done (uid coverage 1); -1 if it never is, or if the run did not ask at t."""
    ladder = metrics.coverage_ladder(run, graph)
    for j in range(t + 1, run.n_asks + 1):
        if metrics.is_done(ladder[j]):
            return j - t
    return -1


def candidate_of(run: QDRun, task: QATask, graph: NeedGraph, t: int, *, index: int, seed: int, prompt: str,
                 pin_: str) -> Candidate:
    """The label of ``run``'s decision at turn ``t`` (a candidate continued to its end)."""
    correct = metrics.answer_correct(run.answer, task.answer, task.aliases)
    if run.n_asks > t:
        turn = run.turns[t]
        v = ask_value(run.held(t), turn.retrieved, graph)
        return Candidate(index=index, seed=seed, action="ask", question=turn.question, rationale=turn.rationale,
                         raw=turn.raw, value=v.value, phi_gain=v.phi_gain, answer_correct=correct,
                         turns_to_complete=turns_to_complete(run, graph, t), prompt=prompt, pin=pin_)
    if run.stop_reason != "policy_stop":  # t < the parent's n_asks <= cap <= max_turns: only a STOP ends here
        raise ValueError(f"task {task.task_id!r}: candidate {index} ended at fork turn {t} by {run.stop_reason!r}; "
                         "expected an ask or a policy stop there")
    return Candidate(index=index, seed=seed, action="stop", rationale=parse_action(run.final_raw).rationale,
                     raw=run.final_raw, malformed=parse_action(run.final_raw).malformed, answer_correct=correct,
                     prompt=prompt, pin=pin_)


async def fork_state(parent: QDRun, task: QATask, graph: NeedGraph, t: int, questioner: Questioner, drafter: Drafter,
                     answerer: Answerer, *, key: jax.Array, config: LoopConfig = LoopConfig(), n: int = N_CANDIDATES,
                     index: PoolIndex | None = None, count_tokens: Callable[[str], int] | None = None,
                     gate: asyncio.Semaphore | None = None) -> tuple[ForkState | None, list[QDRun]]:
    """The state (``parent``, turn ``t``) with its ``n`` candidates, and the candidates' runs.

    ``key`` is the key the parent was played with (`run_episode`'s), so candidate 0 replays it
    exactly. The state is None (its runs still returned) when a candidate's run failed."""
    if not 0 <= t < parent.n_asks:
        raise ValueError(f"fork turn t={t}: expected 0 <= t < the parent's {parent.n_asks} questions")
    if n < 1:
        raise ValueError(f"qd.forks={n}: expected an integer >= 1")
    index = index or PoolIndex([(u.title, u.text) for u in task.pool])
    gate = gate or asyncio.Semaphore(n)
    seeds = [candidate_seed(parent.seed, i) for i in range(n)]

    async def one(s: int) -> QDRun:
        async with gate:
            return await run_episode(task, questioner, drafter, answerer, seed=parent.seed, key=key, config=config,
                                     index=index, count_tokens=count_tokens, replay=parent, fork_turn=t, fork_seed=s)

    runs = list(await asyncio.gather(*(one(s) for s in seeds)))
    if any(r.failed for r in runs):
        return None, runs
    for i, r in enumerate(runs):  # the prefix is the parent's, by construction; a drift is a bug, not data
        if r.turns[:t] != parent.turns[:t]:
            raise AssertionError(f"task {task.task_id!r} candidate {i}: its first {t} turns differ from the parent's")
    prompt = decision_prompts(parent, task)[t][0]
    p = pin(questioner, config)
    cov = metrics.coverage(parent, graph, k=t)
    done = None if math.isnan(cov) else metrics.is_done(cov)
    cands = tuple(candidate_of(r, task, graph, t, index=i, seed=s, prompt=prompt, pin_=p)
                  for i, (r, s) in enumerate(zip(runs, seeds)))
    return ForkState(benchmark=task.benchmark, task_id=task.task_id, parent_seed=parent.seed, turn=t,
                     done_before=done, answer=task.answer, aliases=task.aliases, candidates=cands), runs


async def fork_suite(parents: Sequence[QDRun], tasks: dict[str, QATask], graphs: dict[str, NeedGraph],
                     questioner: Questioner, drafter: Drafter, answerer: Answerer, *, key: jax.Array,
                     config: LoopConfig = LoopConfig(), n: int = N_CANDIDATES, concurrency: int = 16,
                     count_tokens: Callable[[str], int] | None = None,
                     on_state: Callable[[ForkState | None, list[QDRun]], None] | None = None,
                     ) -> tuple[list[ForkState], Counter]:
    """Every state of every (not failed) parent, forked: (states in parent then turn order,
    counts). Counts: ``parents``, ``parents_failed`` (not forked), ``parents_unscorable`` (no
    required evidence: their states could not be valued), ``states`` (forked), ``states_failed``
    (a candidate run failed: dropped), ``candidate_runs``. ``on_state`` is called as each state ends."""
    counts: Counter = Counter()
    gate = asyncio.Semaphore(concurrency)
    indexes = {tid: PoolIndex([(u.title, u.text) for u in t.pool]) for tid, t in tasks.items()}
    jobs: list[Any] = []
    for parent in parents:
        counts["parents"] += 1
        if parent.failed:
            counts["parents_failed"] += 1
            continue
        graph = graphs[parent.task_id]
        if not graph.required_evidence:
            counts["parents_unscorable"] += 1
            continue
        for t in range(parent.n_asks):
            jobs.append((parent, t))

    async def one(parent: QDRun, t: int) -> ForkState | None:
        state, runs = await fork_state(parent, tasks[parent.task_id], graphs[parent.task_id], t, questioner, drafter,
                                       answerer, key=key, config=config, n=n, index=indexes[parent.task_id],
                                       count_tokens=count_tokens, gate=gate)
        counts["candidate_runs"] += len(runs)
        counts["states" if state is not None else "states_failed"] += 1
        if on_state is not None:
            on_state(state, runs)
        return state

    states = await asyncio.gather(*(one(p, t) for p, t in jobs))
    return [s for s in states if s is not None], counts


__all__ = ["N_CANDIDATES", "candidate_of", "candidate_seed", "fork_state", "fork_suite", "pin", "turns_to_complete"]

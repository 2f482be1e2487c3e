"""The questioner-drafter episode (the Q&D spec's §1.2) and a suite of them, as coroutines.

For i = 0 .. max_turns - 1 the questioner acts on the rendered state. STOP (or a malformed reply,
counted) ends the run as ``policy_stop``. An ASK is charged one retrieval call; past the cap the
run ends as ``budget`` and that question is neither executed nor recorded. Otherwise BM25 returns
the task pool's top-k for the question, the turn is recorded (retrieved in rank order, the new
units), the units join the held evidence, and the drafter resolves the question and rewrites the
draft. After max_turns decisions the run ends as ``max_turns``. Then the final draft and answer.

A questioner, drafter or answerer call that still fails after ``retries`` more tries marks the
run ``failed`` (its error kept; a prompt past the engine's capacity is a setting error instead,
`EpisodeBudgetError`): `run_suite` counts such runs and the metrics leave them out. The
questioner's sampling key of decision t is ``fold_in(fold_in(key, seed), t)``: a run is a
function of (task, seed), whatever else runs beside it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence

import jax

from jaxagent.envs.retrieval_qa.bm25 import PoolIndex
from jaxagent.envs.retrieval_qa.tasks import QATask
from jaxagent.qd.agents import Answerer, Drafter, QDState, Questioner, describe
from jaxagent.qd.prompts import EvidenceView, parse_action, render_state
from jaxagent.qd.transcript import QDRun, QDTurn
from jaxagent.rollout.loop import EpisodeBudgetError


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    cap: int = 8  # retrieval calls (executed questions)
    max_turns: int = 16  # questioner decisions
    retries: int = 2  # more tries of a failed drafter / answerer call

    def __post_init__(self) -> None:
        for name in ("cap", "max_turns"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"qd.{name}={v!r}: expected an integer >= 0")
        if self.retries < 0:
            raise ValueError(f"qd.retries={self.retries!r}: expected an integer >= 0")


class RoleFailed(RuntimeError):
    """A questioner, drafter or answerer call failed after its retries."""


async def call_role(what: str, retries: int, fn, *args):
    """``await fn(*args)``, tried ``retries`` more times on failure; `RoleFailed` naming ``what`` after."""
    last: BaseException | None = None
    for _ in range(retries + 1):
        try:
            return await fn(*args)
        except EpisodeBudgetError:  # a setting (rollout.capacity): no retry helps
            raise
        except Exception as e:  # noqa: BLE001 - any failure is retried, then reported
            last = e
    raise RoleFailed(f"{what}: {type(last).__name__}: {last}"[:300])


def _views(task: QATask, held: Sequence[int]) -> list[EvidenceView]:
    return [EvidenceView(task.uid(i), task.pool[i].title, task.pool[i].text) for i in held]


async def run_episode(task: QATask, questioner: Questioner, drafter: Drafter, answerer: Answerer, *,
                      seed: int, key: jax.Array, config: LoopConfig = LoopConfig(), index: PoolIndex | None = None,
                      count_tokens: Callable[[str], int] | None = None, replay: QDRun | None = None,
                      fork_turn: int = 0, fork_seed: int | None = None) -> QDRun:
    """One run of ``task`` (module docstring). ``index``: the pool's BM25 index (built when None);
    ``count_tokens``: a question's tokens (whitespace words when None).

    A fork (the spec's §4.1): with ``replay`` (a run of the same task and seed), its first
    ``fork_turn`` executed questions are replayed (each question retrieved again, which must
    return what the parent recorded; the parent's drafter replies and drafts kept, so evidence
    and history are identical) and the questioner acts from decision ``fork_turn`` on, its key
    of decision t then ``fold_in(fold_in(key, fork_seed), t)`` (``fork_seed`` = ``seed`` continues
    the parent exactly). The returned run keeps ``seed`` (the rollout seed it pairs under)."""
    index = index or PoolIndex([(u.title, u.text) for u in task.pool])
    count = count_tokens or (lambda s: len(s.split()))
    if replay is not None:
        if (replay.task_id, replay.seed) != (task.task_id, seed):
            raise ValueError(f"replay: a run of task {replay.task_id!r} seed {replay.seed}; expected task "
                             f"{task.task_id!r} seed {seed}")
        if not 0 <= fork_turn <= replay.n_asks:
            raise ValueError(f"fork_turn={fork_turn}: expected 0 <= fork_turn <= the parent's {replay.n_asks} questions")
    elif fork_turn:
        raise ValueError(f"fork_turn={fork_turn}: expected 0 without a run to replay")
    fork_key = jax.random.fold_in(key, seed if fork_seed is None else fork_seed)
    key = jax.random.fold_in(key, seed)
    held: list[int] = []
    new: tuple[int, ...] = ()
    draft = ""
    history: list[tuple[str, str]] = []
    turns: list[QDTurn] = []
    malformed, stop_reason, final_raw = 0, "max_turns", ""
    tokens = dict.fromkeys(("questioner_prompt", "questioner_completion", "drafter_prompt", "drafter_completion",
                            "answerer_prompt", "answerer_completion"), 0)

    def spent(role: str, reply) -> str:
        tokens[f"{role}_prompt"] += reply.prompt_tokens
        tokens[f"{role}_completion"] += reply.completion_tokens
        return reply.text
    base = {"benchmark": task.benchmark, "task_id": task.task_id, "seed": seed, "questioner": describe(questioner),
            "cap": config.cap, "max_turns": config.max_turns, "drafter": describe(drafter),
            "answerer": describe(answerer)}
    try:
        for t in range(config.max_turns):
            if t < fork_turn:  # the parent's prefix, replayed
                turn = replay.turns[t]
                retrieved = tuple(index.search(turn.question, task.k))
                if retrieved != turn.retrieved:
                    raise ValueError(f"replay of task {task.task_id!r} seed {seed} turn {t}: the question retrieves "
                                     f"{list(retrieved)}, the parent recorded {list(turn.retrieved)} (another pool?)")
                new = tuple(i for i in retrieved if i not in held)
                held += new
                draft = turn.draft
                history.append((turn.question, turn.reply))
                turns.append(turn)
                continue
            prompt = render_state(question=task.question, benchmark=task.benchmark, evidence=_views(task, held),
                                  draft=draft, history=history)
            state = QDState(task, tuple(held), new, draft, tuple(history), prompt, t, tuple(len(x.new) for x in turns))
            reply = await call_role("questioner.act", config.retries, questioner.act, state,
                                jax.random.fold_in(fork_key if replay is not None else key, t))
            spent("questioner", reply)
            action = parse_action(reply.text)
            if action.kind == "stop":
                malformed += action.malformed
                stop_reason, final_raw = "policy_stop", reply.text
                break
            if len(turns) + 1 > config.cap:  # the call would exceed the cap: not executed, not recorded
                stop_reason, final_raw = "budget", reply.text
                break
            retrieved = tuple(index.search(action.question, task.k))
            new = tuple(i for i in retrieved if i not in held)
            held += new
            units = [task.pool[i] for i in held]
            answer = spent("drafter", await call_role("drafter.resolve", config.retries, drafter.resolve, task, units,
                                                  action.question))
            draft = spent("drafter", await call_role("drafter.draft", config.retries, drafter.draft, task, units))
            history.append((action.question, answer))
            turns.append(QDTurn(action.question, retrieved, new, answer, action.rationale, action.parent_uids,
                                question_tokens=count(action.question), completion_tokens=reply.completion_tokens,
                                raw=reply.text, draft=draft))
        units = [task.pool[i] for i in held]
        if not turns:
            draft = spent("drafter", await call_role("drafter.draft", config.retries, drafter.draft, task, units))
        final = spent("answerer", await call_role("answerer.answer", config.retries, answerer.answer, task, units, draft))
    except RoleFailed as e:
        return QDRun(turns=tuple(turns), stop_reason=stop_reason if stop_reason != "max_turns" else "policy_stop",
                     malformed=malformed, draft=draft, tokens=tokens, failed=True, error=str(e), final_raw=final_raw,
                     **base)
    return QDRun(turns=tuple(turns), stop_reason=stop_reason, malformed=malformed, draft=draft, answer=final,
                 tokens=tokens, final_raw=final_raw, **base)


def decision_prompts(run: QDRun, task: QATask) -> list[tuple[str, str]]:
    """(prompt, reply) of every decision of ``run`` as the questioner saw and made it: one per
    executed question, plus the decision that ended the run (a STOP, a malformed reply, an ASK
    past the cap) unless max_turns ended it. The prompts are re-rendered from the transcript
    (held evidence, drafts, history), so a training row needs nothing else than the run and its task."""
    out, held, draft, history = [], [], "", []
    for turn in run.turns:
        out.append((render_state(question=task.question, benchmark=task.benchmark, evidence=_views(task, held),
                                 draft=draft, history=history), turn.raw))
        held += [i for i in turn.retrieved if i not in held]
        draft = turn.draft
        history.append((turn.question, turn.reply))
    if run.stop_reason != "max_turns":
        out.append((render_state(question=task.question, benchmark=task.benchmark, evidence=_views(task, held),
                                 draft=draft, history=history), run.final_raw))
    return out


async def run_suite(tasks: Sequence[QATask], questioner: Questioner, drafter: Drafter, answerer: Answerer, *,
                    seeds: Sequence[int], key: jax.Array, config: LoopConfig = LoopConfig(), concurrency: int = 16,
                    count_tokens: Callable[[str], int] | None = None,
                    on_done: Callable[[QDRun], None] | None = None) -> list[QDRun]:
    """Every (task, seed) run, at most ``concurrency`` at once (a local policy's decisions batch
    in its engine); returned task-major, then seed order. ``on_done`` is called as each ends."""
    if concurrency < 1:
        raise ValueError(f"qd.concurrency={concurrency!r}: expected an integer >= 1")
    indexes = {t.task_id: PoolIndex([(u.title, u.text) for u in t.pool]) for t in tasks}
    gate = asyncio.Semaphore(concurrency)

    async def one(task: QATask, seed: int) -> QDRun:
        async with gate:
            run = await run_episode(task, questioner, drafter, answerer, seed=seed, key=key, config=config,
                                    index=indexes[task.task_id], count_tokens=count_tokens)
        if on_done is not None:
            on_done(run)
        return run

    return list(await asyncio.gather(*(one(t, s) for t in tasks for s in seeds)))


__all__ = ["LoopConfig", "RoleFailed", "call_role", "decision_prompts", "run_episode", "run_suite"]

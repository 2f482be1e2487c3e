"""Asynchronous RL: rollouts that never wait for the update (``rl.max_staleness = K >= 1``; host code).

    loop = AsyncRL(trainer, plan, max_staleness=1, start=0)   # plan(i) -> (tasks, key) of iteration i
    metrics, trajs = loop.iteration(0)                        # as RLTrainer.iteration's
    loop.close()

With ``K = 0`` the job runs `RLTrainer.iteration` (the synchronous loop, unchanged). With ``K >= 1``
a producer thread runs its own event loop and plays episode groups through the trainer's engine
without stopping, while the main thread computes credit and updates:

- **Which groups start.** Groups are numbered in the order of the synchronous run's (group j of
  iteration i is ``i * tasks_per_step + j``, with that iteration's task and rollout key, so each
  group's episodes draw the keys the synchronous run would). While the policy is at version v
  (v updates made), groups start until those of iteration ``v + K`` have started (plus one for
  each group dropped), so at most K iterations of groups run ahead of the update.
- **Weight updates reach running episodes** (partial rollouts): after each update the new weights
  are `GenerationEngine.publish`ed; the turns running then finish with the weights that began
  them, and every later turn of every episode is generated with the new ones. Each turn records
  the version that generated it (``info["policy_versions"]``) and its sampling log-probs.
- **Which groups train.** Iteration i takes the first ``tasks_per_step`` groups to finish whose
  oldest turn is at most K versions old (``staleness = i - oldest version``); a group older than
  that is **dropped** (never trained on, counted; the producer starts another in its place):
  finishing it under the new policy would still train on its stale turns. Groups are taken in the
  order they finish, so short episodes are over-represented in a batch when the user is slow
  (the price of not waiting; ``async/staleness_*`` and the success metrics show it).
- **Behaviour correction.** The PPO ratio is always taken against the log-probs the tokens were
  sampled with (``old_logp``: the behaviour policy's, of whatever version): staleness enters the
  ratio and the clip bounds the step. With ``rl.behaviour_correction=truncated_is`` the update
  instead takes the ratio against the proximal policy (the weights at the start of the update,
  scored once) and weights each token by ``min(pi_prox / mu, rl.is_cap)``
  (`jaxagent.credit.losses.truncated_is_weights`), the decoupled objective.
- **Credit** (GRPO groups, InfoPO's information gain, Faca's reactions) is computed on the taken
  groups under the current policy, as in the synchronous loop.
- **Evaluation** during training (`pause` / `resume`): no group starts, the running ones finish
  (kept for the next batch), the evaluation uses the engine, then the producer resumes with the
  latest weights. A resumed run starts a fresh producer at its iteration (groups in flight when
  the run stopped are not kept). One process only (``rl.max_staleness`` with several processes is
  refused where the job is built).

Metrics added to the iteration's: ``async/staleness_mean``, ``async/staleness_max``,
``async/staleness_hist`` (groups by staleness 0..K), ``async/dropped_groups`` and
``async/dropped_episodes`` (this iteration), ``async/dropped_total``, ``async/partial_episodes``
(episodes whose turns came from more than one version), ``async/engine_idle_share`` (1 - the
engine's device time / the wall time since the last take), ``async/update_wait_share`` (the share
of the iteration the trainer waited for groups), ``async/buffered_groups`` (finished, not taken).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.rollout.loop import run_episode, turn_key_data
from jaxagent.rollout.trajectory import Trajectory

Plan = Callable[[int], tuple[Sequence[str], jax.Array]]


@dataclasses.dataclass
class Group:
    """One finished group: its number, its episodes, the policy version when it started."""

    index: int
    trajs: list[Trajectory]
    started: int

    def oldest(self) -> int:
        """The oldest policy version of any of its turns (its start version when no turn was made)."""
        versions = [v for t in self.trajs for v in t.info.get("policy_versions", ())]
        return min(versions, default=self.started)


def take_fresh(ready: list[Group], version: int, max_staleness: int, n: int) -> tuple[list[Group], list[Group]]:
    """From ``ready`` (finished groups, in the order they finished): the first ``n`` whose
    staleness ``version - oldest`` is at most ``max_staleness`` (fewer when there are not so many),
    and every group older than that (dropped); ``ready`` loses both. Pure bookkeeping."""
    taken, dropped, kept = [], [], []
    for g in ready:
        if version - g.oldest() > max_staleness:
            dropped.append(g)
        elif len(taken) < n:
            taken.append(g)
        else:
            kept.append(g)
    ready[:] = kept
    return taken, dropped


class ProducerFailed(RuntimeError):
    """The rollout thread of asynchronous RL stopped with an error (the message names it)."""


class AsyncRL:
    """The asynchronous loop around an `RLTrainer` (module docstring); ``plan(i)`` gives iteration
    i's tasks and key, as the synchronous loop draws them; ``start``: the first iteration."""

    def __init__(self, trainer, plan: Plan, *, max_staleness: int, start: int = 0):
        if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 1:
            raise ValueError(f"rl.max_staleness={max_staleness!r}: expected an integer >= 1 for the asynchronous "
                             "loop (0 is the synchronous one)")
        if trainer.processes is not None and trainer.processes.multi:
            raise ValueError(f"rl.max_staleness={max_staleness}: asynchronous RL runs in one process; this run has "
                             f"{trainer.processes.count}. Expected rl.max_staleness=0 with several processes")
        self.trainer, self.plan, self.K, self.start = trainer, plan, max_staleness, int(start)
        self.P, self.G = trainer.settings.tasks_per_step, trainer.settings.group_size
        self.version = self.start  # the policy version: updates made (iterations trained)
        self._published = self.start  # the version the producer's gate has seen (its thread's)
        self.params = _copy(trainer.state.model_params)  # the engine's own copy (the update donates the state)
        self._cond = threading.Condition()
        self.ready: list[Group] = []
        self.started_groups = 0  # groups started by this producer (from group start * P)
        self.dropped_groups = 0
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._pausing = False
        self._cancel = False
        self._plans: dict[int, tuple[list[str], np.ndarray]] = {}
        self._last_take = time.perf_counter()
        self._device_s = trainer.engine.stats["device_s"]
        self.resume()

    # ------------------------------------------------------------------ producer (its own thread)
    def resume(self) -> None:
        """Starts the producer thread (the engine gets the latest weights first)."""
        if self._thread is not None:
            return
        self._pausing = False
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), name="jaxagent-async-rollouts", daemon=True)
        self._thread.start()
        ready.wait()

    def pause(self) -> None:
        """No group starts; the running ones finish (kept for the next batch); the thread ends.
        Raises `ProducerFailed` if the rollouts failed."""
        self._stop(cancel=False)
        self._raise_if_failed()

    def close(self) -> None:
        """The running groups cancelled, the thread ended, the finished groups not trained on
        forgotten (never raises: a failure was raised by `take` already)."""
        self._stop(cancel=True)
        with self._cond:
            self.ready.clear()

    def _stop(self, *, cancel: bool) -> None:
        if self._thread is None:
            return
        self._pausing, self._cancel = True, cancel
        self._poke()
        self._thread.join()
        self._thread = self._loop = self._wake = None

    def _main(self, ready: threading.Event) -> None:
        async def run():
            self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
            self.trainer.engine.set_params(self.params, self.version)
            with self._cond:
                self._published = self.version
            ready.set()
            await self._produce()

        try:
            asyncio.run(run())
        except BaseException as e:  # noqa: BLE001 - handed to the trainer's thread (`take`)
            with self._cond:
                self.error = e
                self._cond.notify_all()
        finally:
            ready.set()

    def _may_start(self) -> bool:
        with self._cond:
            return self.started_groups - self.dropped_groups < (self._published - self.start + self.K + 1) * self.P

    async def _produce(self) -> None:
        running: set[asyncio.Task] = set()
        while not self._pausing:
            while not self._pausing and self._may_start():
                g = self.start * self.P + self.started_groups
                with self._cond:
                    self.started_groups += 1
                task = asyncio.create_task(self._play(g))
                running.add(task)
                task.add_done_callback(running.discard)
            self._wake.clear()
            await self._wake.wait()
        if running and self._cancel:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        elif running:
            await asyncio.gather(*running)

    def _iteration_plan(self, i: int) -> tuple[list[str], np.ndarray]:
        """Iteration i's tasks and every one of its episodes' turn keys (as `run_episodes` makes them)."""
        if i not in self._plans:
            tasks, key = self.plan(i)
            k_roll = jax.random.split(key, 3)[0]
            ids = [j * self.G + e for j in range(len(tasks)) for e in range(self.G)]
            self._plans = {i: (list(tasks), turn_key_data(k_roll, ids, self.trainer.episode.max_turns))}
        return self._plans[i]

    async def _play(self, g: int) -> None:
        i, j = divmod(g, self.P)
        tasks, keys = self._iteration_plan(i)
        tr, started = self.trainer, self._published
        coros = [run_episode(tr.engine, tr.make_env(), tr.tok, task_id=tasks[j], seed=e, group_id=g,
                             sampling=tr.sampling, key=None, config=tr.episode, session=f"{tasks[j]}#{g}#{e}",
                             turn_keys=keys[j * self.G + e]) for e in range(self.G)]
        try:
            trajs = list(await asyncio.gather(*coros))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - an agent's error (the runner keeps simulators'): to `take`
            with self._cond:
                self.error = self.error or e
                self._cond.notify_all()
            return
        with self._cond:
            self.ready.append(Group(g, trajs, started))
            self._cond.notify_all()

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop has closed: nothing to wake
                pass

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            e = self.error
            raise ProducerFailed(f"asynchronous rollouts failed: {type(e).__name__}: {e}") from e

    # ------------------------------------------------------------------ trainer (the caller's thread)
    def take(self, i: int) -> tuple[list[Group], list[Group], float]:
        """Blocks until ``tasks_per_step`` groups fresh enough for iteration ``i`` have finished:
        ``(taken, dropped, seconds waited)``."""
        t0 = time.perf_counter()
        taken: list[Group] = []
        dropped: list[Group] = []
        with self._cond:
            while True:
                got, old = take_fresh(self.ready, i, self.K, self.P - len(taken))
                taken += got
                dropped += old
                if old:
                    self.dropped_groups += len(old)
                    self._poke()  # the producer starts one in place of each
                if len(taken) == self.P:
                    break
                if self.error is not None:
                    break
                if self._thread is None:
                    raise RuntimeError(f"AsyncRL.take({i}): the producer is paused and {len(taken)}/{self.P} "
                                       "groups are ready; call resume() first")
                self._cond.wait(timeout=1.0)
        self._raise_if_failed()
        return taken, dropped, time.perf_counter() - t0

    def iteration(self, i: int) -> tuple[dict[str, Any], list[Trajectory]]:
        """Iteration ``i`` (the next one): its groups, credit and update, then the new weights
        published to the running episodes. Returns the metrics (with ``async/*``) and episodes."""
        if i != self.version:
            raise ValueError(f"AsyncRL.iteration({i}): expected the next iteration, {self.version}")
        t0 = time.perf_counter()
        taken, dropped, waited = self.take(i)
        wall = time.perf_counter() - self._last_take
        device = self.trainer.engine.stats["device_s"]
        idle = 1.0 - min(1.0, (device - self._device_s) / max(wall, 1e-9))
        self._last_take, self._device_s = time.perf_counter(), device
        trajs = [t for g in sorted(taken, key=lambda g: g.index) for t in g.trajs]
        _, key = self.plan(i)
        metrics = self.trainer.train_on(trajs, key, index=i, rollout_s=waited)
        self.version = i + 1
        self.params = _copy(self.trainer.state.model_params)
        loop = self._loop
        if loop is not None:  # running (paused: `resume` hands the engine these weights)
            params, version = self.params, self.version
            try:
                loop.call_soon_threadsafe(lambda: self._on_publish(params, version))
            except RuntimeError:  # the rollout thread ended (failed): the next `take` raises why
                pass
        stale = [i - g.oldest() for g in taken]
        with self._cond:
            buffered = len(self.ready)
        metrics.update({
            "async/staleness_mean": float(np.mean(stale)), "async/staleness_max": int(max(stale)),
            "async/staleness_hist": np.bincount(stale, minlength=self.K + 1).tolist(),
            "async/dropped_groups": len(dropped), "async/dropped_episodes": sum(len(g.trajs) for g in dropped),
            "async/dropped_total": self.dropped_groups,
            "async/partial_episodes": sum(len(set(t.info.get("policy_versions", ()))) > 1 for t in trajs),
            "async/engine_idle_share": idle,
            "async/update_wait_share": waited / max(time.perf_counter() - t0, 1e-9),
            "async/buffered_groups": buffered,
        })
        return metrics, trajs

    def _on_publish(self, params, version: int) -> None:
        """On the producer's loop: the new weights to the engine, and the gate moves on."""
        self.trainer.engine.publish(params, version)
        with self._cond:
            self._published = version
        if self._wake is not None:
            self._wake.set()


def _copy(params):
    return jax.tree.map(jnp.copy, params)


__all__ = ["AsyncRL", "Group", "ProducerFailed", "take_fresh"]

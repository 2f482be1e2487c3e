"""One training loop for every job: steps, hooks, checkpoints (host code).

    state = fit(state, step, start=0, total=600, hooks=[log_every(10, ...)],
                checkpoint=Checkpointing(ckpt, every=4, meta_key="next_step"))

``step(i, state) -> (state, metrics)`` is the job's step: for SFT and DPO a batch drawn for step
``i`` (every draw of step ``i`` derives from ``(seed, phase, i)``, so a resumed run replays the
same steps) through the jitted update; for RL one `RLTrainer.iteration`. After each step the
``hooks`` run in order with ``(i, state, metrics)`` (logging, the skipped-update check, an
evaluation, writing trajectories: what a job adds); a hook stops the run by raising. Then, every
``checkpoint.every`` steps (not after the last), the checkpoint; after the last step a final
one (forced). The checkpointer is waited for and closed however the loop ends, so a run stopped
by an error keeps its last complete checkpoint; ``on_error(exc, i)`` runs first (the job's
failure record).

Resuming is the caller's: restore the state and pass the step to continue from as ``start``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

S = TypeVar("S")
Hook = Callable[[int, Any, Mapping[str, Any]], None]


@dataclasses.dataclass
class Checkpointing:
    """How `fit` saves: ``checkpointer`` (a `jaxagent.train.checkpoint.Checkpointer`), every
    ``every`` steps (0: only at the end), the meta key holding the next step (``next_step``,
    ``next_iter``), ``tree(state)``: what is saved (default the state itself), and ``metrics()``:
    the metrics the checkpointer ranks by (its ``best_metric``), or None."""

    checkpointer: Any
    every: int
    meta_key: str
    tree: Callable[[Any], Any] | None = None
    metrics: Callable[[], Mapping[str, float]] | None = None

    def save(self, done: int, state: Any, *, force: bool = False) -> None:
        tree = state if self.tree is None else self.tree(state)
        kw = {"metrics": dict(self.metrics())} if self.metrics is not None else {}
        self.checkpointer.save(done, tree, {self.meta_key: done}, force=force, **kw)

    def close(self) -> None:
        self.checkpointer.wait()
        self.checkpointer.close()


def fit(state: S, step: Callable[[int, S], tuple[S, Mapping[str, Any]]], *, start: int, total: int,
        hooks: Sequence[Hook] = (), checkpoint: Checkpointing | None = None,
        on_error: Callable[[BaseException, int], None] | None = None) -> S:
    """Steps ``start .. total - 1`` (module docstring); returns the final state."""
    if not (0 <= start <= total):
        raise ValueError(f"start={start}: expected 0 <= start <= total={total}")
    i = start
    try:
        for i in range(start, total):
            state, metrics = step(i, state)
            for hook in hooks:
                hook(i, state, metrics)
            done = i + 1
            if checkpoint is not None and checkpoint.every and done % checkpoint.every == 0 and done < total:
                checkpoint.save(done, state)
        if checkpoint is not None and total and start < total:
            checkpoint.save(total, state, force=True)
    except BaseException as e:
        if on_error is not None:
            on_error(e, i)
        raise
    finally:
        if checkpoint is not None:
            checkpoint.close()
    return state


def every(n: int, total: int, fn: Hook) -> Hook:
    """A hook running ``fn`` at steps ``i`` with ``i % n == 0`` and at the last (``total - 1``)."""

    def hook(i: int, state: Any, metrics: Mapping[str, Any]) -> None:
        if i % n == 0 or i == total - 1:
            fn(i, state, metrics)

    return hook


__all__ = ["Checkpointing", "Hook", "every", "fit"]

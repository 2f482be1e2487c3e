"""Rollouts over several processes (host code): one engine per process, episodes exchanged.

In a multi-process run (`jax.distributed.initialize`: a TPU pod slice, a multi-node GPU cluster)
the training step runs on one global mesh, but the in-flight engine is driven by one host's event
loop: two processes stepping their own requests over shared parameters would issue different
programs and wait on each other's collectives forever. So each process plays its own share of the
episodes on a copy of the policy placed on its own devices, and the finished episodes are
exchanged, so that every process holds the same list in the same order and builds the same batch
for the next global update:

- `ProcessGroup.share`: the tasks split into contiguous blocks, one per process (process i plays
  groups ``lo_i .. hi_i - 1``, with the same group ids and episode keys as one process playing
  them all: `run_episodes`'s ``first_group``);
- `ProcessGroup.local_params`: the policy gathered from the global mesh
  (`multihost_utils.process_allgather`) and placed on this process's devices (fsdp over them);
- `ProcessGroup.gather`: every process's Python objects (pickled, padded to a common length,
  all-gathered as bytes), in process order;
- `play_episodes`: the three together; with one process it is `run_episodes` itself;
- `ProcessGroup.check_same`: the batch every process built from them is the same (a checksum).

Process 0 alone writes a run's host files (`ProcessGroup.is_main`); `barrier` orders the
writes against the other processes' reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxagent.envs.base import Environment
from jaxagent.models.generate import SamplingParams
from jaxagent.models.sharding import LogicalRules, MeshConfig, make_mesh
from jaxagent.models.placement import shard_params
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.loop import run_episodes
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.text.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """This process's place among the run's ``count`` processes (``index`` 0 is the main one)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and self.count >= 1 and isinstance(self.index, int)
                and 0 <= self.index < self.count):
            raise ValueError(f"ProcessGroup(index={self.index!r}, count={self.count!r}): expected "
                             "0 <= index < count")

    @classmethod
    def current(cls) -> ProcessGroup:
        """The running JAX processes (`jax.process_index`, `jax.process_count`)."""
        return cls(jax.process_index(), jax.process_count())

    @property
    def is_main(self) -> bool:
        return self.index == 0

    @property
    def multi(self) -> bool:
        return self.count > 1

    def share(self, n: int) -> range:
        """This process's block of ``n`` items: contiguous, sizes differing by at most one (the
        first ``n % count`` processes take one more), in process order."""
        base, extra = divmod(n, self.count)
        lo = self.index * base + min(self.index, extra)
        return range(lo, lo + base + (self.index < extra))

    def gather(self, obj: Any) -> list[Any]:
        """``[obj of process 0, obj of process 1, ...]`` on every process (a collective: every
        process calls it, in the same order). ``obj`` must pickle; with one process, ``[obj]``."""
        if not self.multi:
            return [obj]
        from jax.experimental import multihost_utils

        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int32))).reshape(-1)
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[: data.size] = data
        rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(self.count, -1)
        return [pickle.loads(rows[p, : int(sizes[p])].tobytes()) for p in range(self.count)]

    def check_same(self, what: str, *arrays: np.ndarray) -> None:
        """Every process holds the same ``arrays`` (a CRC-32 of each, compared across processes: a
        collective); RuntimeError naming ``what`` otherwise. The global update reads each
        process's rows of the batch from that process's copy, so copies that differ would train
        on a mix without any other error. No-op with one process."""
        if not self.multi:
            return
        digest = np.asarray([zlib.crc32(np.ascontiguousarray(a).tobytes()) for a in arrays], np.uint32).view(np.int32)
        from jax.experimental import multihost_utils

        every = np.asarray(multihost_utils.process_allgather(digest)).reshape(self.count, -1)
        if (every != every[0]).any():
            raise RuntimeError(f"{what}: the {self.count} processes hold different copies (CRC-32 per process "
                               f"{every.view(np.uint32).tolist()}); expected the same episodes in the same order")

    def barrier(self, name: str) -> None:
        """Waits until every process has reached the barrier ``name`` (no-op with one process)."""
        if self.multi:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(name)

    def local_params(self, config) -> Callable[[Any], Any]:
        """A function from parameters on the global mesh to the same values on this process's
        devices (fsdp over them): the copy this process's engine decodes with. Identity with one
        process (the engine then shares the training mesh, as it always has)."""
        if not self.multi:
            return lambda params: params
        from jax.experimental import multihost_utils

        rules = LogicalRules(make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1), jax.local_devices()))

        def to_local(params):
            return shard_params(multihost_utils.process_allgather(params, tiled=True), config, rules)

        return to_local


def play_episodes(engine: GenerationEngine, make_env: Callable[[], Environment], tokenizer: Tokenizer,
                  tasks: Sequence[str], *, group_size: int, sampling: SamplingParams, key: jax.Array,
                  config: EpisodeConfig = EpisodeConfig(), processes: ProcessGroup | None = None,
                  on_episode: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """`run_episodes` over ``processes``: this process plays its `share` of ``tasks`` (with the
    group ids and keys those groups have in the whole list) and every process returns all the
    episodes, in task order. ``processes=None`` or one process: all of them, here.
    ``on_episode``: called as each of this process's episodes ends."""
    processes = processes or ProcessGroup()
    mine = processes.share(len(tasks))
    trajs = asyncio.run(run_episodes(engine, make_env, tokenizer, list(tasks)[mine.start : mine.stop],
                                     group_size=group_size, sampling=sampling, key=key, config=config,
                                     first_group=mine.start, on_episode=on_episode)) if len(mine) else []
    if not processes.multi:
        return trajs
    return [t for part in processes.gather(trajs) for t in part]


__all__ = ["ProcessGroup", "play_episodes"]

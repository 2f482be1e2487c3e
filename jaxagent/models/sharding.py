"""Device meshes and logical-axis sharding rules.

A mesh has three axes: ``data`` (pure data parallelism), ``fsdp`` (data parallelism with
parameters sharded over it) and ``tensor`` (Megatron-style tensor parallelism over heads, MLP
width and vocabulary). Parameters and activations are annotated with *logical* axis names
(`jaxagent.models.qwen.param_logical_axes`, the ``constrain`` calls in the forward pass); the
rules below map each logical name to mesh axes. A mesh axis is dropped from a dimension it does
not divide (e.g. 2 KV heads on a tensor axis of 4): that dimension is then replicated over it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axes (None: replicated)
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("seq", None),
    ("act_embed", None),
    ("act_q_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("layers", None),
    ("embed", "fsdp"),
    ("norm", None),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh shape; -1 on one axis takes all remaining devices. Multi-host runs set
    ``distributed`` (and, off TPU/SLURM auto-detection, the coordinator fields)."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    distributed: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def __post_init__(self) -> None:
        """The axes' values alone, at construction (the devices: `shape`)."""
        dims = [self.data, self.fsdp, self.tensor]
        for name, d in zip(MESH_AXES, dims):
            if isinstance(d, bool) or not (d == -1 or (isinstance(d, int) and d >= 1)):
                raise ValueError(f"mesh.{name}={d!r}: expected a positive integer or -1")
        if dims.count(-1) > 1:
            raise ValueError(f"mesh={dict(zip(MESH_AXES, dims))}: at most one axis may be -1")

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        """The mesh's (data, fsdp, tensor) on ``num_devices`` devices; ValueError naming the
        ``mesh.*`` keys when it cannot be laid on them."""
        dims = [self.data, self.fsdp, self.tensor]
        known = int(np.prod([d for d in dims if d != -1]))
        if -1 in dims:
            if num_devices % known:
                raise ValueError(
                    f"mesh={dict(zip(MESH_AXES, dims))}: {num_devices} devices are not divisible by {known}"
                )
            dims[dims.index(-1)] = num_devices // known
        if int(np.prod(dims)) != num_devices:
            raise ValueError(
                f"mesh={dict(zip(MESH_AXES, dims))}: product {int(np.prod(dims))} != {num_devices} devices"
            )
        return tuple(dims)


def initialize_distributed(cfg: MeshConfig) -> None:
    """Calls `jax.distributed.initialize` for multi-host runs (no-op unless ``cfg.distributed``;
    before any other JAX call of the process). Without a coordinator address, JAX detects the
    cluster (TPU pods, SLURM, Open MPI); CPU processes talk through gloo."""
    if not cfg.distributed or jax.distributed.is_initialized():
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices only; no-op elsewhere
    kwargs = {}
    if cfg.coordinator_address is not None:
        kwargs = dict(
            coordinator_address=cfg.coordinator_address,
            num_processes=cfg.num_processes,
            process_id=cfg.process_id,
        )
    jax.distributed.initialize(**kwargs)


def make_mesh(cfg: MeshConfig | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over ``devices`` (default: all), with auto (GSPMD) axes."""
    cfg = cfg or MeshConfig()
    devices = list(jax.devices() if devices is None else devices)
    shape = cfg.shape(len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


@dataclasses.dataclass(frozen=True)
class LogicalRules:
    """A mesh with the logical-to-mesh axis rules; hashable, so it can be a static argument."""

    mesh: Mesh
    rules: tuple[tuple[str, Any], ...] = DEFAULT_RULES

    def mesh_axes(self, name: str | None):
        if name is None:
            return None
        for key, value in self.rules:
            if key == name:
                return value
        raise KeyError(f"logical axis {name!r}: no rule; known: {[k for k, _ in self.rules]}")

    def spec(self, logical_axes: Sequence[str | None], shape: Sequence[int] | None = None) -> PartitionSpec:
        """PartitionSpec for an array with these logical axes. With ``shape``, mesh axes that do
        not divide a dimension (or are already used by an earlier dimension) are dropped."""
        used: set[str] = set()
        out = []
        for i, name in enumerate(logical_axes):
            axes = self.mesh_axes(name)
            if axes is None:
                out.append(None)
                continue
            axes = (axes,) if isinstance(axes, str) else tuple(axes)
            kept = []
            size = 1
            for a in axes:
                if a in used or self.mesh.shape[a] == 1:
                    continue
                if shape is not None and shape[i] % (size * self.mesh.shape[a]):
                    continue
                kept.append(a)
                size *= self.mesh.shape[a]
            used.update(kept)
            out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
        return PartitionSpec(*out)

    def sharding(self, logical_axes: Sequence[str | None], shape: Sequence[int] | None = None) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(logical_axes, shape))


def constrain(x: jax.Array, logical_axes: Sequence[str | None], rules: LogicalRules | None) -> jax.Array:
    """`jax.lax.with_sharding_constraint` by logical axes; identity when ``rules`` is None."""
    if rules is None:
        return x
    return jax.lax.with_sharding_constraint(x, rules.sharding(logical_axes, x.shape))


def batch_sharding(rules: LogicalRules, ndim: int = 2, shape: Sequence[int] | None = None) -> NamedSharding:
    """Sharding of a [B, L, ...] input batch: batch over (data, fsdp), the rest replicated. With
    ``shape``, mesh axes that do not divide the batch are dropped (replicated) instead of failing."""
    ndim = len(shape) if shape is not None else ndim
    return NamedSharding(rules.mesh, rules.spec(("batch",) + (None,) * (ndim - 1), shape))


def row_rules(rules: LogicalRules | None, rows: int) -> LogicalRules | None:
    """The rules a program running ``rows`` rows at a time is given for its activations: ``rules``
    when the rows split evenly over its batch axes (more than one device there), else None.

    With the rules each device computes its own rows and gathers the (fsdp-sharded) parameters it
    needs; without them the partitioner keeps the parameters where they are and runs every row on
    every device, all-reducing the activations. The first is much smaller per device when the rows
    divide (infopo_7b's info gain: 16.7 against 50.3 GB), a little larger when they do not (its
    update at 5 rows per microbatch on 4 devices: 55.1 against 52.8 GB), hence the rule."""
    if rules is None:
        return None
    n = batch_devices(rules)
    return rules if n > 1 and rows > 0 and rows % n == 0 else None


def batch_devices(rules: LogicalRules) -> int:
    """How many devices the rules' ``batch`` axis splits rows over (the product of its mesh axes)."""
    axes = rules.mesh_axes("batch")
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(rules.mesh.shape[a] for a in axes)


def place_rows(tree, rules: LogicalRules):
    """``tree`` with each array leaf's leading (row) axis split over the batch's mesh axes that
    divide it (`batch_sharding` of the leaf's shape; scalars replicated): where a program that runs
    on a whole batch of rows (the info gain, the scorer) finds its rows, each device its own."""
    def put(x):
        if not hasattr(x, "shape"):
            return x
        s = batch_sharding(rules, shape=x.shape) if x.ndim else NamedSharding(rules.mesh, PartitionSpec())
        return jax.device_put(x, s)

    return jax.tree.map(put, tree)

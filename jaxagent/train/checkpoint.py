"""Training-run checkpoints on top of orbax-checkpoint's ``CheckpointManager``.

``Checkpointer`` saves, per step, a pytree of jax arrays (params, optax state,
step counters, typed PRNG keys) plus a JSON ``meta`` dict (run config,
data-iterator position, host RNG state, ...), keeps the last ``keep`` steps
plus the best one by a metric, and restores into caller-given shardings.

Layout on disk
--------------
::

    <directory>/
      <step>/                          one COMPLETE checkpoint, e.g. ``12/``
        _CHECKPOINT_METADATA           orbax step metadata (commit time, ...)
        commit_success.txt             written just before the final rename
        state/                         the pytree (orbax PyTree/OCDBT +
                                       tensorstore); typed PRNG keys are stored
                                       as their ``jax.random.key_data`` (uint32)
        meta/metadata                  ``meta`` as JSON (orbax ``JsonSave``)
        prng_keys/metadata             JSON ``{keypath: impl name}`` of the leaves
                                       that were typed PRNG keys
        metrics/metrics                the ``metrics`` dict as JSON, only when
                                       ``best_metric`` is set
      <step>.orbax-checkpoint-tmp/     a save in progress (or one that died);
                                       its items are ``<item>.orbax-checkpoint-tmp``
                                       until each is written

Crash semantics
---------------
orbax writes every step into a temporary directory
(``<step>.orbax-checkpoint-tmp``; orbax 0.12 adds no suffix) and renames it to
``<step>`` only after all of its items are written and ``commit_success.txt``
is in place.  The rename is atomic on a local/POSIX file system: this protects
against process death (durability across a power loss is up to the file
system).  Step discovery only considers finalised ``<step>`` directories, so a
save killed at any point (SIGKILL, OOM, preemption) is never seen as a
checkpoint: ``latest_step()`` returns the previous complete step and
``restore()`` restores it.  Stale temporary directories left by a dead process
are deleted by the next ``Checkpointer`` on the directory (orbax
``cleanup_tmp_directories``: started on construction, awaited before its first
save), and re-saving the interrupted step works.  Retention deletes old steps
only after the new step is finalised, so a crash mid-save never loses the
previous checkpoints.

Within one process, an asynchronous save that is still running is not listed
by ``latest_step()``/``all_steps()``/``best_step()``; steps that retention will
delete when that save finishes are already unlisted.  ``restore()`` first
waits for a running save.

Retention
---------
``keep`` newest steps are kept; when ``best_metric`` is set, the step with the
best ``metrics[best_metric]`` (``best_mode`` "max" or "min") is kept as well,
even when it is older (orbax ``AnyPreservationPolicy(LatestN, BestN)``).  A
save without metrics, or whose metrics lack ``best_metric`` or are NaN, ranks
worst for "best" and is kept only as one of the newest ``keep``.

Saving a step twice
-------------------
``save`` raises ``ValueError`` naming the step when that step already exists
(complete, or still being written), unless ``force=True`` and it is the latest
step: then the existing step is deleted first and saved again (a crash in
between loses that step, never older ones).  Saving a step lower than the
latest one is always a ``ValueError`` (orbax's retention assumes increasing
steps); delete the newer steps first if you roll back.  ``save`` therefore
always returns True: a save that is not made raises.

JSON
----
``meta`` and ``metrics`` go through JSON: tuples come back as lists and
non-string dict keys as strings.  They are validated (``json.dumps``) and
copied when ``save`` is called, so a bad value raises there and later
mutation by the caller does not affect the background write.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Literal, Self

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, SingleDeviceSharding
from orbax.checkpoint import checkpoint_managers as ocp_policies

__all__ = ["CheckpointNotFound", "Checkpointer"]

log = logging.getLogger(__name__)

_STATE = "state"
_META = "meta"
_KEYS = "prng_keys"


class CheckpointNotFound(FileNotFoundError):
    """There is no complete checkpoint to restore in the directory."""


def _is_prng_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _key_impl(leaf: Any) -> str:
    """The PRNG impl name of a typed key array or of a key ShapeDtypeStruct."""
    if isinstance(leaf, jax.Array):
        return str(jax.random.key_impl(leaf))
    found: list[str] = []

    def probe(k):
        found.append(str(jax.random.key_impl(k)))
        return k

    jax.eval_shape(probe, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
    return found[0]


def _default_sharding() -> jax.sharding.Sharding:
    return SingleDeviceSharding(jax.devices()[0])


class Checkpointer:
    """Saves/restores ``(state, meta)`` per step with keep-last-N + best retention.

    Args:
      directory: root directory of the run's checkpoints (created if missing).
      keep: number of most recent steps to keep (>= 1).
      best_metric: name of a scalar in the ``metrics`` passed to ``save``; the
        best step by it is never deleted.  None: no best tracking.
      best_mode: "max" or "min": which direction of ``best_metric`` is better.
      async_save: write in a background thread (``save`` returns once the
        arrays are copied off the devices); ``wait``/``close`` finish it.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        keep: int = 3,
        best_metric: str | None = None,
        best_mode: Literal["max", "min"] = "max",
        async_save: bool = True,
    ):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        self.directory = Path(directory).expanduser().absolute()
        self.keep = keep
        self.best_metric = best_metric
        self.best_mode = best_mode
        self.async_save = async_save

        policies: list[Any] = [ocp_policies.LatestN(n=keep)]
        if best_metric is not None:
            policies.append(
                ocp_policies.BestN(
                    get_metric_fn=self._score,
                    reverse=False,  # _score is "higher is better" in both modes
                    n=1,
                    # else every metrics-less step would be kept forever
                    keep_checkpoints_without_metrics=False,
                )
            )
        options = ocp.CheckpointManagerOptions(
            # best_fn makes orbax write the metrics item and read it back on
            # reload; retention itself is entirely the preservation policy.
            best_fn=self._score if best_metric is not None else None,
            best_mode="max",
            preservation_policy=ocp_policies.AnyPreservationPolicy(policies),
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,
            create=True,
        )
        self._mngr = ocp.CheckpointManager(self.directory, item_names=(_STATE, _META, _KEYS), options=options)
        self._pending: int | None = None  # step of an async save not yet seen finished
        self._error: BaseException | None = None  # a background save failure not yet raised
        self._closed = False

    # ---------------------------------------------------------------- metrics

    def _score(self, metrics: Any) -> float:
        """Higher is better; missing/NaN/non-numeric ranks worst."""
        try:
            value = float(metrics[self.best_metric])
        except (KeyError, TypeError, ValueError, IndexError):
            return -math.inf
        if math.isnan(value):
            return -math.inf
        return value if self.best_mode == "max" else -value

    # ------------------------------------------------------- background state

    def _collect(self) -> None:
        """Notice a finished async save; stash its error (raised by wait/save/close)."""
        if self._pending is None or self._mngr.is_saving_in_progress():
            return
        self._pending = None
        try:
            self._mngr.wait_until_finished()
        except BaseException as e:  # noqa: BLE001 - re-raised from wait()/save()/close()
            log.error("checkpoint save in %s failed: %r", self.directory, e)
            self._error = e
            # orbax dropped the failed step and also the steps it meant to
            # delete after it (they were not deleted): re-read the directory.
            self._mngr.reload()

    def _raise_error(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _complete_steps(self) -> list[int]:
        self._collect()
        steps = sorted(self._mngr.all_steps())
        if self._pending is not None:
            steps = [s for s in steps if s != self._pending]
        return steps

    # ------------------------------------------------------------------ query

    def all_steps(self) -> list[int]:
        """Complete, retained steps, ascending."""
        return self._complete_steps()

    def latest_step(self) -> int | None:
        """The newest complete step, or None."""
        steps = self._complete_steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The complete step with the best ``best_metric`` (ties: the newest).

        None when ``best_metric`` is not set or no complete step has that
        metric.
        """
        if self.best_metric is None:
            return None
        best, best_score = None, -math.inf
        for step in self._complete_steps():
            score = self._score(self._mngr.metrics(step) or {})
            if score > -math.inf and score >= best_score:
                best, best_score = step, score
        return best

    # ------------------------------------------------------------------- save

    def save(
        self,
        step: int,
        state: Any,
        meta: dict,
        metrics: dict | None = None,
        *,
        force: bool = False,
    ) -> bool:
        """Save ``state`` and ``meta`` as ``step``; returns True when a save started.

        With ``async_save`` this returns once the arrays are copied to host
        memory; the write continues in the background (one at a time: a new
        save first waits for the previous one).  Raises ``ValueError`` if
        ``step`` exists (unless ``force``: then the latest step is replaced) or
        is older than the latest step; ``TypeError`` if ``meta``/``metrics`` are not JSON.
        """
        self._check_open()
        step = int(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
        meta_copy = json.loads(json.dumps(meta))
        metrics_copy = None if metrics is None else json.loads(json.dumps(metrics))

        # The previous save must be finished (and its error surfaced) before
        # deciding on step collisions.
        self.wait()
        existing = self._complete_steps()
        latest = existing[-1] if existing else None
        if step in existing and not force:
            raise ValueError(
                f"checkpoint step {step} already exists in {self.directory} (pass force=True to overwrite it)"
            )
        if latest is not None and step < latest:
            raise ValueError(
                f"checkpoint step {step} is older than the latest step {latest} "
                f"in {self.directory}; steps must increase"
                + (" (only the latest step can be overwritten)" if step in existing else "")
            )
        if step in existing:  # force=True, step == latest
            log.warning("overwriting checkpoint step %d in %s", step, self.directory)
            self._mngr.delete(step)

        if self.best_metric is not None and (metrics_copy is None or self.best_metric not in metrics_copy):
            log.warning(
                "checkpoint step %d saved without metric %r: it will not count as best",
                step,
                self.best_metric,
            )

        keys: dict[str, str] = {}

        def to_savable(path, leaf):
            if _is_prng_key(leaf):
                keys[jax.tree_util.keystr(path)] = _key_impl(leaf)
                return jax.random.key_data(leaf)
            return leaf

        savable = jax.tree_util.tree_map_with_path(to_savable, state)
        args = ocp.args.Composite(
            **{
                _STATE: ocp.args.StandardSave(savable),
                _META: ocp.args.JsonSave(meta_copy),
                _KEYS: ocp.args.JsonSave(keys),
            }
        )
        saved = self._mngr.save(step, args=args, metrics=metrics_copy, force=True)
        if saved and self.async_save:
            self._pending = step
        return bool(saved)

    # ---------------------------------------------------------------- restore

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restore ``(state, meta)`` of ``step`` (default: the latest complete).

        ``target`` is a pytree with the structure of the saved state whose
        leaves are arrays or ``jax.ShapeDtypeStruct``s; the restored arrays get
        their shapes, dtypes and shardings (a leaf without a sharding goes to
        the first device).  Typed PRNG key leaves come back as typed keys.
        Waits for a running async save first.
        """
        self._check_open()
        self.wait()
        steps = self._complete_steps()
        if not steps:
            raise CheckpointNotFound(
                f"no complete checkpoint in {self.directory}"
                + (f" (asked for step {step})" if step is not None else "")
            )
        if step is None:
            step = steps[-1]
        elif int(step) not in steps:
            raise ValueError(f"checkpoint step {step} does not exist in {self.directory}; available steps: {steps}")
        step = int(step)

        saved_keys: dict[str, str] = (
            self._mngr.restore(step, args=ocp.args.Composite(**{_KEYS: ocp.args.JsonRestore()}))[_KEYS] or {}
        )
        target_keys: dict[str, tuple[str, Any]] = {}

        def to_abstract(path, leaf):
            name = jax.tree_util.keystr(path)
            if _is_prng_key(leaf):
                impl = _key_impl(leaf)
                if saved_keys.get(name) != impl:
                    raise ValueError(
                        f"target leaf {name} is a {impl} PRNG key but checkpoint step "
                        f"{step} stored {saved_keys.get(name) or 'a non-key array'} there"
                    )
                sharding = getattr(leaf, "sharding", None)
                target_keys[name] = (impl, sharding)
                data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
                if sharding is None:
                    data_sharding = _default_sharding()
                elif isinstance(sharding, NamedSharding):
                    # key data has trailing key dims: same spec, trailing dims replicated
                    data_sharding = NamedSharding(sharding.mesh, sharding.spec)
                elif isinstance(sharding, SingleDeviceSharding):
                    data_sharding = sharding
                else:
                    raise TypeError(
                        f"PRNG key leaf {name}: sharding {type(sharding).__name__} is not "
                        "supported (use NamedSharding or SingleDeviceSharding)"
                    )
                return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=data_sharding)
            if name in saved_keys:
                raise ValueError(
                    f"target leaf {name} is not a PRNG key but checkpoint step {step} "
                    f"stored a {saved_keys[name]} key there"
                )
            if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
                sharding = getattr(leaf, "sharding", None) or _default_sharding()
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
            if isinstance(leaf, (np.ndarray, np.generic, int, float, bool)):
                arr = np.asarray(leaf)
                return jax.ShapeDtypeStruct(arr.shape, arr.dtype, sharding=_default_sharding())
            return leaf

        abstract = jax.tree_util.tree_map_with_path(to_abstract, target)
        restored = self._mngr.restore(
            step,
            args=ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(abstract), _META: ocp.args.JsonRestore()}),
        )

        def to_user(path, leaf):
            entry = target_keys.get(jax.tree_util.keystr(path))
            if entry is None:
                return leaf
            return jax.random.wrap_key_data(leaf, impl=entry[0])

        state = jax.tree_util.tree_map_with_path(to_user, restored[_STATE])
        return state, restored[_META]

    # -------------------------------------------------------------- lifecycle

    def wait(self) -> None:
        """Block until a running async save is finished; re-raise its error."""
        if self._pending is not None:
            self._pending = None
            try:
                self._mngr.wait_until_finished()
            except BaseException as e:  # noqa: BLE001
                self._error = e
                self._mngr.reload()
        self._raise_error()

    def close(self) -> None:
        """Finish running saves and release orbax's resources (idempotent)."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._mngr.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"Checkpointer on {self.directory} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Checkpointer({str(self.directory)!r}, keep={self.keep}, "
            f"best_metric={self.best_metric!r}, best_mode={self.best_mode!r}, "
            f"async_save={self.async_save})"
        )

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

Damaged steps
-------------
A finalised step can still be damaged afterwards (a truncated array file, a deleted
``meta/metadata``, a disk or copy error): orbax then fails deep inside tensorstore or with a bare
``FileNotFoundError``.  ``restore_newest(target)`` restores the newest step that restores and
moves every newer step that failed aside, renamed ``<step>.damaged-<kind>-<UTC time>`` (e.g.
``12.damaged-truncated-20250101T120000Z``, with a ``DAMAGED.txt`` holding the error), where
orbax's step listing no longer sees it; nothing is deleted.  A step counts as damaged only when
an older step restores into the same ``target``: when every step fails, nothing is moved (a
target that no longer matches the checkpoints, e.g. a changed model shape, fails on all of them
alike) and ``CheckpointDamaged`` names the directory and each step's error.  A step whose
``metrics/metrics`` is unreadable JSON stops orbax from even listing the directory: the
constructor then moves such steps aside the same way (see ``damaged_on_open``).  Single-process
runs: the rename is done by the process that finds the damage.

Test-only pause
---------------
``JAXAGENT_TEST_PAUSE_SAVE=<step>`` (or ``<dir name>/<step>``, e.g. ``rl/3``) in the environment
makes a ``Checkpointer`` stop in the middle of saving that step: every item is written into
``<step>.orbax-checkpoint-tmp`` but the final rename is not done.  It prints the line
``JAXAGENT_TEST_PAUSE_SAVE: paused ...`` (``PAUSE_MARKER``) on stderr and then blocks the
background writer and the caller of ``save`` (for up to an hour), so a test can SIGKILL the
process at a known point (``tests/test_resume.py``).  Unset (the normal case), nothing changes.

JSON
----
``meta`` and ``metrics`` go through JSON: tuples come back as lists and
non-string dict keys as strings.  They are validated (``json.dumps``) and
copied when ``save`` is called, so a bad value raises there and later
mutation by the caller does not affect the background write.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal, NamedTuple, Self

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, SingleDeviceSharding
from orbax.checkpoint import checkpoint_managers as ocp_policies

__all__ = ["PAUSE_ENV", "PAUSE_MARKER", "CheckpointDamaged", "CheckpointNotFound", "Checkpointer", "DamagedStep",
           "Restored"]

log = logging.getLogger(__name__)

_STATE = "state"
_META = "meta"
_KEYS = "prng_keys"


#: Test-only: ``<step>`` or ``<dir name>/<step>`` whose save stops before its final rename.
PAUSE_ENV = "JAXAGENT_TEST_PAUSE_SAVE"
PAUSE_MARKER = f"{PAUSE_ENV}: paused"
_PAUSE_LIMIT_S = 3600.0


class CheckpointNotFound(FileNotFoundError):
    """There is no complete checkpoint to restore in the directory."""


@dataclasses.dataclass(frozen=True)
class DamagedStep:
    """A step that failed to restore (or to list): its error and where it was moved."""

    step: int
    reason: str  # one line: the exception type and the first line of its message
    moved_to: Path | None  # None: left in place (nothing older restored either)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "reason": self.reason, "moved_to": None if self.moved_to is None
                else str(self.moved_to)}


class CheckpointDamaged(CheckpointNotFound):
    """No complete step in the directory restores; ``failures`` holds each step's error."""

    def __init__(self, directory: Path, failures: list[DamagedStep]):
        self.directory = directory
        self.failures = failures
        lines = "; ".join(f"step {f.step}: {f.reason}" + (f" (moved to {f.moved_to.name})" if f.moved_to else "")
                          for f in failures)
        if any(f.moved_to is None for f in failures):
            advice = ("Nothing was moved: with no step restoring, damage cannot be told from a state that no longer "
                      "matches the checkpoints (e.g. a changed model shape); move damaged step directories aside "
                      "by hand, or start the run afresh under another name")
        else:
            advice = "No complete step is left; start the run afresh under another name"
        super().__init__(f"no checkpoint in {directory} restores ({lines}). {advice}")


class Restored(NamedTuple):
    """What ``restore_newest`` returns."""

    state: Any
    meta: dict
    step: int
    damaged: list[DamagedStep]  # newer steps that failed to restore, moved aside (newest first)


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions behind it (``__cause__``, else ``__context__``)."""
    out: list[BaseException] = []
    while e is not None and all(e is not x for x in out) and len(out) < 8:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    for junk in (" [tensorstore_spec", " See full TensorStore details"):
        msg = msg.split(junk)[0]
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _reason(e: BaseException) -> str:
    """One line: ``Type: message`` (and the root cause's, tensorstore's spec dumps left out), at
    most 500 characters."""
    chain = _chain(e)
    text = _line(chain[0]) + (f" (caused by {_line(chain[-1])})" if len(chain) > 1 else "")
    return text if len(text) <= 500 else text[:497] + "..."


def _damage_kind(e: BaseException) -> str:
    chain = _chain(e)
    msg = " ".join(str(x) for x in chain)
    if any(isinstance(x, FileNotFoundError) for x in chain) or "NOT_FOUND" in msg:
        return "missing-file"
    if "OUT_OF_RANGE" in msg or "is not valid for value of size" in msg:
        return "truncated"
    if any(isinstance(x, json.JSONDecodeError) for x in chain) or "DATA_LOSS" in msg:
        return "corrupt"
    return "unreadable"


def _pause_spec() -> tuple[str | None, int] | None:
    raw = os.environ.get(PAUSE_ENV, "").strip()
    if not raw:
        return None
    where, _, step = raw.rpartition("/")
    if not step.isdigit():
        raise ValueError(f"{PAUSE_ENV}={raw!r}: expected <step> or <dir name>/<step> (test-only)")
    return (where or None), int(step)


def _block(what: str) -> None:
    deadline = time.monotonic() + _PAUSE_LIMIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise RuntimeError(f"{PAUSE_ENV}: {what} still paused after {_PAUSE_LIMIT_S:.0f}s; nobody killed the process")


def _pausing_temporary_path(directory: Path, step: int, reached: threading.Event) -> type:
    """orbax's atomic-rename temporary path, stopping before the rename of ``directory/step``."""

    class PausingTemporaryPath(ocp.path.atomicity.AtomicRenameTemporaryPath):
        async def finalize(self, *args, **kwargs):
            final = Path(str(self.get_final()))
            if final.parent == directory and final.name == str(step):
                print(f"{PAUSE_MARKER} before committing step {step} in {directory} (written to {self.get()})",
                      file=sys.stderr, flush=True)
                reached.set()
                _block(f"the save of step {step} in {directory}")
            return await super().finalize(*args, **kwargs)

    return PausingTemporaryPath


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
        self._pause_step: int | None = None
        self._pause_reached = threading.Event()
        extra: dict[str, Any] = {}
        pause = _pause_spec()
        if pause is not None and pause[0] in (None, self.directory.name):
            self._pause_step = pause[1]
            extra["temporary_path_class"] = _pausing_temporary_path(self.directory, pause[1], self._pause_reached)
        options = ocp.CheckpointManagerOptions(
            # best_fn makes orbax write the metrics item and read it back on
            # reload; retention itself is entirely the preservation policy.
            best_fn=self._score if best_metric is not None else None,
            best_mode="max",
            preservation_policy=ocp_policies.AnyPreservationPolicy(policies),
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,
            create=True,
            **extra,
        )
        #: Steps moved aside on construction: their ``metrics/metrics`` was unreadable.
        self.damaged_on_open: list[DamagedStep] = []
        try:
            self._mngr = self._manager(options)
        except Exception as e:  # noqa: BLE001 - re-raised unless a damaged metrics file explains it
            unreadable = self._unreadable_metrics()
            if not unreadable:
                raise
            log.warning("checkpoints in %s do not list (%s)", self.directory, _reason(e))
            self.damaged_on_open = [self._move_aside(step, err) for step, err in unreadable]
            self._mngr = self._manager(options)
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

    # ------------------------------------------------------------ damage

    def _manager(self, options) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(self.directory, item_names=(_STATE, _META, _KEYS), options=options)

    def _unreadable_metrics(self) -> list[tuple[int, BaseException]]:
        """(step, error) of the finalised steps whose metrics file is not readable JSON."""
        bad = []
        for d in sorted(self.directory.iterdir()) if self.directory.is_dir() else []:
            f = d / "metrics" / "metrics"
            if d.name.isdigit() and f.is_file():
                try:
                    json.loads(f.read_text())
                except (OSError, ValueError) as e:
                    bad.append((int(d.name), e))
        return bad

    def _move_aside(self, step: int, error: BaseException) -> DamagedStep:
        """Rename ``<step>`` to ``<step>.damaged-<kind>-<time>`` (a name orbax does not list as a
        step, nor clean up as a temporary directory) with the error in ``DAMAGED.txt``."""
        src = self.directory / str(step)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        dst = self.directory / f"{step}.damaged-{_damage_kind(error)}-{stamp}"
        n = 1
        while dst.exists():
            dst = self.directory / f"{step}.damaged-{_damage_kind(error)}-{stamp}-{n}"
            n += 1
        os.rename(src, dst)
        try:
            (dst / "DAMAGED.txt").write_text(
                f"checkpoint step {step} of {self.directory} failed to restore and was moved here "
                f"at {stamp} (UTC):\n"
                + "\ncaused by:\n".join(f"{type(x).__name__}: {x}" for x in _chain(error)) + "\n")
        except OSError:
            pass
        reason = _reason(error)
        log.warning("checkpoint step %d in %s is damaged (%s): moved to %s", step, self.directory, reason, dst)
        return DamagedStep(step, reason, dst)

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
        if step == self._pause_step:  # test-only (PAUSE_ENV): the caller stops too, at a known point
            self._pause_reached.wait(_PAUSE_LIMIT_S)
            _block(f"the caller of save({step})")
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

    def restore_newest(self, target: Any) -> Restored:
        """Restore the newest step that restores (see "Damaged steps" in the module docstring).

        Tries the complete steps newest first; once one restores, the newer ones that failed are
        moved aside (each logged as a warning) and returned in ``damaged``.  Raises
        ``CheckpointNotFound`` when there is no complete step and ``CheckpointDamaged`` (a
        ``CheckpointNotFound``) when none restores (then nothing is moved) or when every step was
        moved aside on construction (``damaged_on_open``).
        """
        self._check_open()
        self.wait()
        steps = self._complete_steps()
        if not steps and self.damaged_on_open:
            raise CheckpointDamaged(self.directory, self.damaged_on_open)
        if not steps:
            raise CheckpointNotFound(f"no complete checkpoint in {self.directory}")
        failed: list[tuple[int, BaseException]] = []
        for step in reversed(steps):
            try:
                state, meta = self.restore(target, step)
            except Exception as e:  # noqa: BLE001 - judged below: damage only if an older step restores
                log.warning("checkpoint step %d in %s does not restore: %s", step, self.directory, _reason(e))
                failed.append((step, e))
                continue
            damaged = [self._move_aside(s, e) for s, e in failed]
            if damaged:
                self._mngr.reload()
            return Restored(state, meta, step, damaged)
        raise CheckpointDamaged(self.directory, [DamagedStep(s, _reason(e), None) for s, e in failed])

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

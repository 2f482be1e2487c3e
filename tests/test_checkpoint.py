"""Checkpointer: round trip, sharded restore, retention, crash safety, errors, damaged steps (moved
aside, not deleted) and the test-only pause mid-save."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxagent.train.checkpoint import CheckpointDamaged, Checkpointer, CheckpointNotFound

REPO = Path(__file__).resolve().parents[1]


def _bits(x) -> np.ndarray:
    """The raw bytes of an array (typed PRNG keys via their key data)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    a = np.asarray(x)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a


def _assert_bit_identical(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if jnp.issubdtype(w.dtype, jax.dtypes.prng_key):
            assert jax.random.key_impl(g) == jax.random.key_impl(w)
        np.testing.assert_array_equal(_bits(g), _bits(w))


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _train_state():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "w": jax.random.normal(k1, (5, 7), jnp.float32),
        "emb": jax.random.normal(k2, (3, 4), jnp.float32).astype(jnp.bfloat16),
    }
    opt = optax.adamw(1e-2)
    opt_state = opt.init(params)
    grads = jax.tree.map(lambda p: jnp.cos(p.astype(jnp.float32)).astype(p.dtype), params)
    updates, opt_state = opt.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return {
        "params": {**params, "count": jnp.arange(6, dtype=jnp.int32) * 7 - 11},
        "opt_state": opt_state,
        "rng": k3,
        "rngs": jax.random.split(jax.random.key(42, impl="rbg"), 4),
        "step": jnp.asarray(17, jnp.int32),
    }


META = {
    "config": {"lr": 1e-2, "model": "tiny", "layers": [1, 2, 3]},
    "data": {"epoch": 2, "offset": 12345},
    "host_rng": [3, "MT19937", 0.25, None, True],
}


@pytest.mark.parametrize("async_save", [True, False])
def test_round_trip_bit_identical(tmp_path, async_save):
    state = _train_state()
    assert state["opt_state"][0].count == 1  # adam state after a real update: non-trivial mu/nu
    ck = Checkpointer(tmp_path / "ckpt", async_save=async_save)
    assert ck.save(3, state, META, {"loss": 0.5})
    ck.wait()
    assert ck.all_steps() == [3] and ck.latest_step() == 3 and ck.best_step() is None

    # target given as ShapeDtypeStructs
    restored, meta = ck.restore(_abstract(state))
    _assert_bit_identical(restored, state)
    assert meta == META
    assert isinstance(restored["opt_state"][0], optax.ScaleByAdamState)
    # the restored key is a usable typed key of the same impl
    np.testing.assert_array_equal(
        jax.random.key_data(jax.random.split(restored["rng"])), jax.random.key_data(jax.random.split(state["rng"]))
    )
    # target given as concrete arrays, explicit step; and from a fresh instance
    ck.close()
    ck2 = Checkpointer(tmp_path / "ckpt")
    restored2, meta2 = ck2.restore(jax.tree.map(jnp.zeros_like, state), step=3)
    _assert_bit_identical(restored2, state)
    assert meta2 == META
    ck2.close()


def test_restore_into_sharded_targets(tmp_path):
    assert jax.device_count() == 8
    mesh = jax.make_mesh((8,), ("x",))
    rows = NamedSharding(mesh, P("x", None))
    cols = NamedSharding(mesh, P(None, "x"))
    repl = NamedSharding(mesh, P())
    vec = NamedSharding(mesh, P("x"))
    w = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8) / 7
    state = {
        "w_rows": jax.device_put(w, rows),  # saved sharded, restored resharded
        "w_plain": w + 1,  # saved on one device, restored sharded
        "b": jnp.arange(8, dtype=jnp.bfloat16),
        "keys": jax.random.split(jax.random.key(1), 8),
    }
    with Checkpointer(tmp_path) as ck:
        ck.save(1, state, {"n": 1})
        ck.wait()
        target = {
            "w_rows": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=cols),
            "w_plain": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=rows),
            "b": jax.ShapeDtypeStruct((8,), jnp.bfloat16, sharding=repl),
            "keys": jax.ShapeDtypeStruct(state["keys"].shape, state["keys"].dtype, sharding=vec),
        }
        restored, meta = ck.restore(target)
    assert meta == {"n": 1}
    for name, t in target.items():
        r = restored[name]
        assert r.sharding == t.sharding, (name, r.sharding, t.sharding)
        assert len(r.sharding.device_set) == 8
    assert restored["w_plain"].addressable_shards[0].data.shape == (2, 8)
    assert restored["w_rows"].addressable_shards[0].data.shape == (16, 1)
    _assert_bit_identical(restored, state)


def test_keep_last_n_plus_best(tmp_path):
    success = {1: 0.1, 2: 0.9, 3: 0.3, 4: 0.2, 5: 0.5, 6: 0.4}
    state = {"x": jnp.zeros(3)}
    ck = Checkpointer(tmp_path, keep=2, best_metric="success", best_mode="max")
    for step, s in success.items():
        ck.save(step, {"x": state["x"] + step}, {"step": step}, {"success": s})
    ck.wait()
    assert ck.all_steps() == [2, 5, 6]
    assert ck.best_step() == 2 and ck.latest_step() == 6
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [2, 5, 6]
    assert not [p for p in tmp_path.iterdir() if "tmp" in p.name]
    best, meta = ck.restore(state, step=ck.best_step())
    assert meta == {"step": 2} and float(best["x"][0]) == 2.0
    ck.close()
    # a new instance reads the metrics back; retention still honours the best
    ck = Checkpointer(tmp_path, keep=2, best_metric="success")
    assert ck.all_steps() == [2, 5, 6] and ck.best_step() == 2
    ck.save(7, state, {}, {"success": 0.0})
    ck.save(8, state, {})  # no metrics: only kept as one of the newest
    ck.save(9, state, {}, {"success": float("nan")})
    ck.wait()
    assert ck.all_steps() == [2, 8, 9] and ck.best_step() == 2
    ck.close()

    # min mode: the lowest loss survives
    loss = {1: 3.0, 2: 2.0, 3: 0.5, 4: 1.0, 5: 0.7, 6: 0.9}
    with Checkpointer(tmp_path / "min", keep=2, best_metric="loss", best_mode="min") as ck:
        for step, v in loss.items():
            ck.save(step, state, {}, {"loss": v})
        ck.wait()
        assert ck.all_steps() == [3, 5, 6] and ck.best_step() == 3


_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    import jax, jax.numpy as jnp
    from jaxagent.train.checkpoint import Checkpointer

    d = sys.argv[1]
    ck = Checkpointer(d, keep=3, async_save=True)
    ck.save(1, {"w": jnp.arange(1000, dtype=jnp.float32)}, {"step": 1})
    ck.wait()
    # ~200 MB of incompressible data in 50 arrays, so that writing takes a while
    big = {"w": jnp.zeros(1000, jnp.float32),
           "big": [jax.random.normal(jax.random.key(i), (1 << 20,)) for i in range(50)]}
    jax.block_until_ready(big)
    t0 = time.perf_counter()
    ck.save(2, big, {"step": 2})
    print(f"SAVE2_RETURNED {time.perf_counter() - t0:.3f}", flush=True)

    def written(prefix):
        total = 0
        for name in os.listdir(d):
            if name.startswith(prefix):
                for root, _, files in os.walk(os.path.join(d, name)):
                    for f in files:
                        try:
                            total += os.path.getsize(os.path.join(root, f))
                        except OSError:
                            pass
        return total

    # kill ourselves once >= 20 MB of step 2's arrays are on disk: mid-write
    deadline = time.time() + 30
    while time.time() < deadline and written("2.orbax-checkpoint-tmp") < 20e6:
        time.sleep(0.001)
    print(f"LATEST {ck.latest_step()} ALL {ck.all_steps()} WRITTEN {written('2.'):.0f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_sigkill_mid_save_leaves_previous_checkpoint(tmp_path):
    env = dict(os.environ)
    env.update(
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert "SAVE2_RETURNED" in proc.stdout, proc.stderr[-3000:]
    # while step 2 was being written, it was not reported as a checkpoint
    assert "LATEST 1 ALL [1] WRITTEN" in proc.stdout, proc.stdout
    assert float(proc.stdout.split("WRITTEN")[1]) >= 20e6, proc.stdout
    # the kill landed mid-save: step 2 never got finalised, its temp dir is left over
    assert (tmp_path / "1").is_dir()
    assert not (tmp_path / "2").exists()
    stale = [p for p in tmp_path.iterdir() if p.name.startswith("2.orbax-checkpoint-tmp")]
    assert stale, sorted(p.name for p in tmp_path.iterdir())

    # plus a leftover like it for a step that will not be saved again
    (tmp_path / "7.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
    (tmp_path / "7.orbax-checkpoint-tmp" / "state" / "junk").write_bytes(b"x" * 100)

    ck = Checkpointer(tmp_path, keep=3)
    assert ck.latest_step() == 1 and ck.all_steps() == [1]
    state, meta = ck.restore({"w": jax.ShapeDtypeStruct((1000,), jnp.float32)})
    np.testing.assert_array_equal(np.asarray(state["w"]), np.arange(1000, dtype=np.float32))
    assert meta == {"step": 1}
    # the stale temp dir does not get in the way of saving step 2 again, and
    # stale temp dirs are removed (before the first save of a new Checkpointer)
    ck.save(2, {"w": jnp.full((1000,), 2.0, jnp.float32)}, {"step": 2})
    ck.wait()
    assert ck.all_steps() == [1, 2]
    assert not [p for p in tmp_path.iterdir() if "orbax-checkpoint-tmp" in p.name]
    state, meta = ck.restore({"w": jax.ShapeDtypeStruct((1000,), jnp.float32)})
    assert meta == {"step": 2} and float(state["w"][0]) == 2.0
    ck.close()


def test_errors(tmp_path):
    empty = tmp_path / "empty"
    ck = Checkpointer(empty)
    target = {"x": jax.ShapeDtypeStruct((3,), jnp.float32)}
    with pytest.raises(CheckpointNotFound, match=str(empty)) as info:
        ck.restore(target)
    assert isinstance(info.value, FileNotFoundError)
    assert ck.latest_step() is None and ck.all_steps() == [] and ck.best_step() is None
    ck.close()

    with Checkpointer(tmp_path / "run") as ck:
        ck.save(5, {"x": jnp.ones(3)}, {"v": 1})
        with pytest.raises(ValueError, match=r"\b99\b"):
            ck.restore(target, step=99)
        # same step again (even while the first is still being written)
        with pytest.raises(ValueError, match=r"step 5 already exists"):
            ck.save(5, {"x": jnp.zeros(3)}, {"v": 2})
        with pytest.raises(ValueError, match=r"step 4 is older"):
            ck.save(4, {"x": jnp.zeros(3)}, {})
        with pytest.raises(TypeError):
            ck.save(6, {"x": jnp.zeros(3)}, {"bad": object()})
        assert ck.all_steps() == [5]
        # force=True replaces the latest step
        assert ck.save(5, {"x": jnp.full(3, 7.0)}, {"v": 3}, force=True)
        state, meta = ck.restore(target)
        assert ck.all_steps() == [5] and meta == {"v": 3} and float(state["x"][0]) == 7.0
        # a typed-key target where a plain array was saved is refused clearly
        with pytest.raises(ValueError, match="PRNG key"):
            ck.restore({"x": jax.ShapeDtypeStruct((3,), jax.random.key(0).dtype)})


# ----------------------------------------------------------------------------- damaged steps
_TARGET = {"w": jax.ShapeDtypeStruct((1000,), jnp.float32), "k": jax.random.key(0)}


def _three_steps(directory: Path, **kw) -> None:
    with Checkpointer(directory, keep=3, **kw) as ck:
        for s in (1, 2, 3):
            ck.save(s, {"w": jnp.arange(1000, dtype=jnp.float32) + s, "k": jax.random.key(s)}, {"step": s},
                    {"success": s / 10})


def _truncate_arrays(step_dir: Path) -> list[Path]:
    """Cuts every tensorstore data file of a step to half its size (a copy or disk cut short)."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    assert files, sorted(step_dir.rglob("*"))
    for f in files:
        os.truncate(f, f.stat().st_size // 2)
    return files


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("damage", ["truncated", "no_meta"])
def test_restore_newest_moves_a_damaged_newest_step_aside(tmp_path, damage, caplog):
    _three_steps(tmp_path, best_metric="success")
    if damage == "truncated":
        _truncate_arrays(tmp_path / "3")
    else:
        (tmp_path / "3" / "meta" / "metadata").unlink()
    ck = Checkpointer(tmp_path, keep=3, best_metric="success")
    assert ck.all_steps() == [1, 2, 3]  # orbax still lists it: the damage shows on restore
    with pytest.raises(Exception):  # noqa: B017 - the raw error restore_newest recovers from
        ck.restore(_TARGET)
    got = ck.restore_newest(_TARGET)
    assert got.step == 2 and got.meta == {"step": 2}
    np.testing.assert_array_equal(np.asarray(got.state["w"]), np.arange(1000, dtype=np.float32) + 2)
    [d] = got.damaged
    kind = "truncated" if damage == "truncated" else "missing-file"
    assert d.step == 3 and d.moved_to.parent == tmp_path and d.moved_to.name.startswith(f"3.damaged-{kind}-")
    assert ("FileNotFoundError" if damage == "no_meta" else "OUT_OF_RANGE") in d.reason
    assert "\n" not in d.reason and "tensorstore_spec" not in d.reason
    assert "step 3" in caplog.text and "damaged" in caplog.text
    # moved, not deleted; with the error next to it; orbax no longer lists it
    assert _names(tmp_path) == ["1", "2", d.moved_to.name]
    assert "failed to restore" in (d.moved_to / "DAMAGED.txt").read_text()
    assert ck.all_steps() == [1, 2] and ck.latest_step() == 2 and ck.best_step() == 2
    # the run goes on: step 3 is saved again, and a fresh instance ignores the moved directory
    ck.save(3, {"w": jnp.zeros(1000), "k": jax.random.key(9)}, {"step": "3 again"}, {"success": 0.0})
    ck.close()
    with Checkpointer(tmp_path, keep=3, best_metric="success") as ck:
        assert ck.all_steps() == [1, 2, 3]
        assert ck.restore_newest(_TARGET).meta == {"step": "3 again"}
        ck.save(4, {"w": jnp.zeros(1000), "k": jax.random.key(9)}, {}, {"success": 0.0})
        ck.wait()
    assert d.moved_to.is_dir()  # retention and tmp cleanup leave it alone


def test_restore_newest_when_no_step_restores_names_each_and_moves_nothing(tmp_path):
    _three_steps(tmp_path)
    for s in ("1", "2", "3"):
        _truncate_arrays(tmp_path / s)
    ck = Checkpointer(tmp_path, keep=3)
    with pytest.raises(CheckpointDamaged) as info:
        ck.restore_newest(_TARGET)
    msg = str(info.value)
    assert str(tmp_path) in msg and all(f"step {s}:" in msg for s in (1, 2, 3)) and "Nothing was moved" in msg
    assert [f.step for f in info.value.failures] == [3, 2, 1]
    assert isinstance(info.value, CheckpointNotFound)
    assert _names(tmp_path) == ["1", "2", "3"]
    # a target that does not match any step (a changed shape) is not damage either
    _three_steps(tmp_path / "ok")
    with Checkpointer(tmp_path / "ok", keep=3) as ok:
        with pytest.raises(CheckpointDamaged):
            ok.restore_newest({"w": jax.ShapeDtypeStruct((999,), jnp.float32), "k": jax.random.key(0)})
        assert ok.all_steps() == [1, 2, 3]
    ck.close()
    with Checkpointer(tmp_path / "empty") as empty, pytest.raises(CheckpointNotFound, match="no complete"):
        empty.restore_newest(_TARGET)


def test_unreadable_metrics_step_is_moved_aside_on_open(tmp_path):
    """orbax reads every step's metrics to rank them: one unparsable file stops it listing any."""
    _three_steps(tmp_path, best_metric="success")
    (tmp_path / "3" / "metrics" / "metrics").write_text('{"succ')
    ck = Checkpointer(tmp_path, keep=3, best_metric="success")
    [d] = ck.damaged_on_open
    assert d.step == 3 and d.moved_to.name.startswith("3.damaged-corrupt-") and "JSONDecodeError" in d.reason
    assert ck.all_steps() == [1, 2] and ck.restore_newest(_TARGET).step == 2
    ck.close()
    # every step unreadable: all moved aside, and no step left to restore is an error naming them
    (tmp_path / "1" / "metrics" / "metrics").write_text("")
    (tmp_path / "2" / "metrics" / "metrics").write_text("[")
    with Checkpointer(tmp_path, keep=3, best_metric="success") as ck:
        assert [d.step for d in ck.damaged_on_open] == [1, 2] and ck.all_steps() == []
        with pytest.raises(CheckpointDamaged, match=r"step 1: JSONDecodeError.*moved to 1\.damaged-corrupt-.*"
                                                    r"No complete step is left"):
            ck.restore_newest(_TARGET)
    assert sorted(n.split("-")[0] for n in _names(tmp_path)) == ["1.damaged", "2.damaged", "3.damaged"]


_PAUSED_CHILD = textwrap.dedent(
    """
    import sys
    import jax.numpy as jnp
    from jaxagent.train.checkpoint import Checkpointer

    ck = Checkpointer(sys.argv[1], keep=3, async_save=sys.argv[2] == "async")
    for s in (1, 2, 3):
        ck.save(s, {"w": jnp.arange(1000, dtype=jnp.float32) + s}, {"step": s})
        print("SAVED", s, flush=True)
    """
)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_pause_env_stops_a_save_before_its_commit(tmp_path, mode):
    """JAXAGENT_TEST_PAUSE_SAVE (test-only) stops the save of one step with every item written
    and the final rename not done, and blocks the caller: a kill there is a kill mid-save."""
    from jaxagent.train.checkpoint import PAUSE_ENV, PAUSE_MARKER

    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env[PAUSE_ENV] = f"{tmp_path.name}/2"
    log = tmp_path.parent / f"{tmp_path.name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", _PAUSED_CHILD, str(tmp_path), mode], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while PAUSE_MARKER not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        time.sleep(0.5)  # paused means paused: nothing moves on
        text = log.read_text(errors="replace")
        assert "SAVED 1" in text and "SAVED 2" not in text and proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert _names(tmp_path) == ["1", "2.orbax-checkpoint-tmp"]
    # every item was written into the temporary directory (the pause is at the final rename)
    assert {"meta", "prng_keys", "state"} <= set(_names(tmp_path / "2.orbax-checkpoint-tmp"))
    with Checkpointer(tmp_path, keep=3) as ck:
        assert ck.all_steps() == [1]

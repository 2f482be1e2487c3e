"""Resume: a run SIGKILLed in the middle of saving a checkpoint, or one whose newest checkpoint
was damaged afterwards, relaunched with ``resume=true``, logs exactly the records (and samples
exactly the episodes) of the same run left alone: every record, in order, but for wall-clock
fields, with none twice (``metrics.jsonl`` is cut back to the restored checkpoint).

``python -m jaxagent.launch`` subprocesses on two simulated CPU devices (fsdp=2, so the restored
state must land on the mesh as the live one does): the uninterrupted run; the one to kill
(started once the first has compiled an iteration's programs), stopped by the test-only
``JAXAGENT_TEST_PAUSE_SAVE=rl/3`` inside the save of checkpoint 3 (every item written, the
final rename not done: `jaxagent.train.checkpoint`) and SIGKILLed there; the killed one
resumed; and copies of the finished uninterrupted run whose newest checkpoint (4) has a
truncated array file or no ``meta/metadata``, resumed (from 3, the damaged step moved aside).
They share a persistent XLA compilation cache, so only the first compiles (a loaded executable
computes what a compiled one does). The job is RL only (InfoPO credit, PPO with a reference KL,
two minibatches per iteration, an evaluation every two iterations): SFT adds compile time, not
another way to resume.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxagent.train.checkpoint import PAUSE_ENV, PAUSE_MARKER
from jaxagent.eval.report import read_metrics

REPO = Path(__file__).resolve().parents[1]
STEPS = 4
PAUSE_AT = 3  # the checkpoint whose save the killed run stops in (after RL iteration 2)
SMALL = ["job=rl", f"steps={STEPS}", "eval.tasks=2", "eval.every=2", "rl.tasks_per_step=2", "rl.group_size=2",
         "rl.minibatch_size=2", "rollout.max_turns=3", "rollout.slots=4", "rollout.max_new_tokens=32",
         "rollout.max_tokens=256", "rollout.capacity=256", "checkpoint.every=1", "checkpoint.export_hf=false",
         "progress=false"]
# Wall-clock fields (and "time/..."): the only ones allowed to differ.
WALL = ("time", "tokens_per_s", "wall_s")
TIMEOUT_S = 300
# What the uninterrupted run logs: (phase, step, label), in order.
TIMELINE = [("eval", 0, "before"), ("rl", 0, None), ("rl", 1, None), ("eval", 2, "during"), ("rl", 2, None),
            ("rl", 3, None), ("eval", STEPS, "after")]


def _launch(tmp: Path, name: str, *extra: str, env_extra: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop(PAUSE_ENV, None)
    env.update(JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_COMPILATION_CACHE_DIR=str(tmp / "xla_cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1", **(env_extra or {}))
    with open(tmp / f"{name}.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "jaxagent.launch", *SMALL, f"runs_dir={tmp / 'runs'}",
                                 f"name={name}", *extra], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def _log(tmp: Path, name: str) -> str:
    path = tmp / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _records(path: Path) -> list[dict]:
    return read_metrics(path) if path.exists() else []


def _rl_checkpoints(ckpt_dir: Path) -> tuple[list[int], list[str]]:
    """(complete steps, names of everything else) in ``checkpoints/rl``."""
    names = [p.name for p in ckpt_dir.iterdir()] if ckpt_dir.is_dir() else []
    return sorted(int(n) for n in names if n.isdigit()), sorted(n for n in names if not n.isdigit())


def _key(r: dict) -> tuple:
    return r["phase"], r["step"], r.get("label")


def _results(records: list[dict]) -> list[dict]:
    """The training and evaluation records (not the ``resume`` events a resumed run adds)."""
    return [r for r in records if r["phase"] in ("sft", "rl", "eval")]


def _diff(got: dict, want: dict) -> list[str]:
    def strip(rec):
        return {k: v for k, v in rec.items() if k not in WALL and not k.startswith("time/")}

    got, want = strip(got), strip(want)
    return [f"{k}: resumed {got.get(k, '<absent>')!r} != uninterrupted {want.get(k, '<absent>')!r}"
            for k in sorted(set(got) | set(want))
            if got.get(k, "<absent>") != want.get(k, "<absent>") or type(got.get(k)) is not type(want.get(k))]


def _assert_same_records(got: list[dict], want: list[dict]) -> None:
    """Every record equal, one by one and in order (but for wall-clock fields); none twice."""
    got, want = _results(got), _results(want)
    assert [_key(r) for r in want] == TIMELINE
    assert [_key(r) for r in got] == TIMELINE  # in particular: no duplicate (phase, step, label)
    diffs = {_key(w): _diff(g, w) for g, w in zip(got, want)}
    assert not any(diffs.values()), {k: v for k, v in diffs.items() if v}


def _episodes(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "timings"} for line in path.read_text().splitlines()]


def _assert_same_episodes(run: Path, full: Path, iters) -> None:
    for i in iters:
        name = f"trajectories/iter_{i:05d}.jsonl"
        assert _episodes(run / name) == _episodes(full / name), name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run (finished) and the run killed mid-save (not resumed yet)."""
    tmp = tmp_path_factory.mktemp("resume")
    t0 = time.perf_counter()
    full = _launch(tmp, "full")
    cut = None
    try:
        # The second run starts once the first has compiled (and cached) the programs of an
        # iteration: from there on the two overlap, and compile nothing twice.
        deadline = time.monotonic() + TIMEOUT_S
        while not any(r["phase"] == "rl" for r in _records(tmp / "runs" / "full" / "metrics.jsonl")):
            assert full.poll() is None, ("full", _log(tmp, "full")[-4000:])
            assert time.monotonic() < deadline, ("RL iteration 0 never logged", _log(tmp, "full")[-4000:])
            time.sleep(0.05)
        cut = _launch(tmp, "cut", env_extra={PAUSE_ENV: f"rl/{PAUSE_AT}"})
        # Deterministic: the checkpointer stops in the save of step 3 and says so; both the
        # background writer and the training loop wait there until the kill.
        deadline = time.monotonic() + TIMEOUT_S
        while PAUSE_MARKER not in _log(tmp, "cut"):
            assert cut.poll() is None, ("the run ended before it paused", _log(tmp, "cut")[-4000:])
            assert time.monotonic() < deadline, ("the save never paused", _log(tmp, "cut")[-4000:])
            time.sleep(0.02)
        cut.send_signal(signal.SIGKILL)
        assert cut.wait(timeout=60) == -signal.SIGKILL
        t_kill = time.perf_counter() - t0
        killed = _records(tmp / "runs" / "cut" / "metrics.jsonl")
        ckpts = _rl_checkpoints(tmp / "runs" / "cut" / "checkpoints" / "rl")
        assert full.wait(timeout=TIMEOUT_S) == 0, ("full", _log(tmp, "full")[-4000:])
        t_full = time.perf_counter() - t0
    finally:
        for p in (full, cut):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    print(f"\nkilled mid-save at {t_kill:.1f}s; uninterrupted run {t_full:.1f}s")
    return {"tmp": tmp, "killed": killed, "ckpts": ckpts, "want": _records(tmp / "runs" / "full" / "metrics.jsonl")}


def test_killed_mid_save_resumes_with_the_uninterrupted_metrics(runs):
    tmp, run = runs["tmp"], runs["tmp"] / "runs" / "cut"
    # Killed at a known point: iteration 2 logged, checkpoint 3 written but not committed.
    assert [_key(r) for r in runs["killed"]] == TIMELINE[:5]
    complete, other = runs["ckpts"]
    assert complete[-1] == PAUSE_AT - 1 and other == [f"{PAUSE_AT}.orbax-checkpoint-tmp"], runs["ckpts"]

    t0 = time.perf_counter()
    again = _launch(tmp, "cut", "resume=true")
    assert again.wait(timeout=TIMEOUT_S) == 0, ("resume", _log(tmp, "cut")[-4000:])
    print(f"\nresumed run {time.perf_counter() - t0:.1f}s")

    records = _records(run / "metrics.jsonl")
    # Iteration 2 (logged after checkpoint 2) was dropped from the log and run again.
    [event] = [r for r in records if r["phase"] == "resume"]
    assert event["of"] == "rl" and event["checkpoint"] == PAUSE_AT - 1 and event["step"] == PAUSE_AT - 1
    assert event["dropped_records"] == 1 and event["damaged"] == []
    assert records.index(event) == 4  # before, rl 0, rl 1, eval 2 | resume | rl 2, rl 3, after
    _assert_same_records(records, runs["want"])
    assert runs["want"][-2]["update/kl_ref"] > 0  # the policy moved: not a vacuous comparison
    # ... and so do the episodes themselves (tokens, log-probs, rewards) of the re-run iterations.
    _assert_same_episodes(run, tmp / "runs" / "full", range(PAUSE_AT - 1, STEPS))
    # The stale temporary directory is gone; the config history has both launches.
    complete, other = _rl_checkpoints(run / "checkpoints" / "rl")
    assert complete[-1] == STEPS and other == []
    assert (run / "config.yaml").is_file() and (run / "config.resume-1.yaml").is_file()


@pytest.mark.parametrize("damage", ["truncated", "no_meta"])
def test_damaged_newest_checkpoint_resumes_from_the_previous_one(runs, damage):
    """The finished run's last checkpoint (4) damaged: a truncated array file, or its
    ``meta/metadata`` gone. The resume restores 3, moves 4 aside, runs iteration 3 and the final
    evaluation again and ends with the uninterrupted run's records."""
    tmp, full = runs["tmp"], runs["tmp"] / "runs" / "full"
    name = f"damaged_{damage}"
    run = tmp / "runs" / name
    shutil.copytree(full, run)
    step_dir = run / "checkpoints" / "rl" / str(STEPS)
    if damage == "truncated":
        data = sorted((p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
                      key=lambda p: -p.stat().st_size)
        os.truncate(data[0], data[0].stat().st_size // 2)
    else:
        (step_dir / "meta" / "metadata").unlink()
    assert STEPS - 1 in _rl_checkpoints(run / "checkpoints" / "rl")[0]

    proc = _launch(tmp, name, "resume=true")
    assert proc.wait(timeout=TIMEOUT_S) == 0, (name, _log(tmp, name)[-4000:])
    log = _log(tmp, name)
    # Said on stderr and in the log; moved aside, not deleted; checkpoint 4 written anew.
    assert f"rl checkpoint step {STEPS} in" in log and "is damaged" in log and f"resuming from step {STEPS - 1}" in log
    kind = "truncated" if damage == "truncated" else "missing-file"
    complete, other = _rl_checkpoints(run / "checkpoints" / "rl")
    assert complete[-1] == STEPS and len(other) == 1 and other[0].startswith(f"{STEPS}.damaged-{kind}-"), other
    moved = run / "checkpoints" / "rl" / other[0]
    assert (moved / "state").is_dir() and "failed to restore" in (moved / "DAMAGED.txt").read_text()
    records = _records(run / "metrics.jsonl")
    [event] = [r for r in records if r["phase"] == "resume"]
    assert event["checkpoint"] == STEPS - 1 and event["dropped_records"] == 2  # rl 3 and the final eval
    [d] = event["damaged"]
    assert d["step"] == STEPS and Path(d["moved_to"]).name == moved.name
    assert ("FileNotFoundError" if damage == "no_meta" else "OUT_OF_RANGE") in d["reason"]
    _assert_same_records(records, runs["want"])
    _assert_same_episodes(run, full, [STEPS - 1])


def test_no_checkpoint_that_restores_is_a_clear_error(runs):
    """Every checkpoint of the finished run truncated: the resume stops with one line naming the
    directory and each step's error, and moves nothing."""
    tmp = runs["tmp"]
    run = tmp / "runs" / "all_damaged"
    shutil.copytree(tmp / "runs" / "full", run)
    ckpt_dir = run / "checkpoints" / "rl"
    steps, _ = _rl_checkpoints(ckpt_dir)
    for s in steps:
        for p in (ckpt_dir / str(s) / "state").rglob("*"):
            if p.is_file() and p.parent.name == "d":
                os.truncate(p, p.stat().st_size // 2)
    proc = _launch(tmp, "all_damaged", "resume=true")
    assert proc.wait(timeout=TIMEOUT_S) == 1, _log(tmp, "all_damaged")[-4000:]
    [line] = [x for x in _log(tmp, "all_damaged").splitlines() if x.startswith("error: ")]
    assert f"no checkpoint in {ckpt_dir}" in line and "Nothing was moved" in line
    assert all(f"step {s}: " in line for s in steps) and "OUT_OF_RANGE" in line
    assert _rl_checkpoints(ckpt_dir) == (steps, [])

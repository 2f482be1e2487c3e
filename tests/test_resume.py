"""Resume: a run SIGKILLed mid-training (while it saves a checkpoint, as a rule) and relaunched
with ``resume=true`` logs, for every RL iteration and evaluation after its last complete
checkpoint, exactly the metrics (and samples exactly the episodes) of the same run left alone.

Three ``python -m jaxagent.launch`` subprocesses on two simulated CPU devices (fsdp=2, so the
restored state must land on the mesh as the live one does): the uninterrupted run, the one to
kill (started once the first has compiled an iteration's programs), then the killed one resumed.
They share a persistent XLA compilation cache, so only the first compiles (a loaded executable
computes what a compiled one does). The job is RL only (InfoPO credit, PPO with a reference KL, two minibatches per iteration,
an evaluation every two iterations): SFT adds compile time, not another way to resume.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from jaxagent.train.report import read_metrics

REPO = Path(__file__).resolve().parents[1]
STEPS = 4
SMALL = ["job=rl", f"steps={STEPS}", "eval.tasks=2", "eval.every=2", "rl.tasks_per_step=2", "rl.group_size=2",
         "rl.minibatch_size=2", "rollout.max_turns=3", "rollout.slots=4", "rollout.max_new_tokens=32",
         "rollout.max_tokens=256", "rollout.capacity=256", "checkpoint.every=1", "checkpoint.export_hf=false",
         "progress=false"]
# Wall-clock fields (and "time/..."): the only ones allowed to differ.
WALL = ("time", "tokens_per_s", "wall_s")
TIMEOUT_S = 300


def _launch(tmp: Path, name: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_COMPILATION_CACHE_DIR=str(tmp / "xla_cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    with open(tmp / f"{name}.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "jaxagent.launch", *SMALL, f"runs_dir={tmp / 'runs'}",
                                 f"name={name}", *extra], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def _log_tail(tmp: Path, name: str) -> str:
    return (tmp / f"{name}.log").read_text(errors="replace")[-4000:]


def _records(path: Path) -> list[dict]:
    return read_metrics(path) if path.exists() else []


def _rl_checkpoints(ckpt_dir: Path) -> tuple[list[int], list[str]]:
    """(complete steps, names of saves in progress) in ``checkpoints/rl``."""
    names = [p.name for p in ckpt_dir.iterdir()] if ckpt_dir.is_dir() else []
    return sorted(int(n) for n in names if n.isdigit()), [n for n in names if "orbax-checkpoint-tmp" in n]


def _last(records: list[dict]) -> dict[tuple, dict]:
    """The last record per (phase, step, label): a resumed run re-logs what followed its checkpoint."""
    return {(r["phase"], r["step"], r.get("label")): r for r in records}


def _diff(got: dict, want: dict) -> list[str]:
    def strip(rec):
        return {k: v for k, v in rec.items() if k not in WALL and not k.startswith("time/")}

    got, want = strip(got), strip(want)
    return [f"{k}: resumed {got.get(k, '<absent>')!r} != uninterrupted {want.get(k, '<absent>')!r}"
            for k in sorted(set(got) | set(want))
            if got.get(k, "<absent>") != want.get(k, "<absent>") or type(got.get(k)) is not type(want.get(k))]


def _episodes(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "timings"} for line in path.read_text().splitlines()]


def test_killed_run_resumes_with_the_uninterrupted_metrics(tmp_path):
    t0 = time.perf_counter()
    full = _launch(tmp_path, "full")
    cut = None
    run = tmp_path / "runs" / "cut"
    try:
        # The second run starts once the first has compiled (and cached) the programs of an
        # iteration: from there on the two overlap, and compile nothing twice.
        deadline = time.monotonic() + TIMEOUT_S
        while not any(r["phase"] == "rl" for r in _records(tmp_path / "runs" / "full" / "metrics.jsonl")):
            assert full.poll() is None, ("full", _log_tail(tmp_path, "full"))
            assert time.monotonic() < deadline, ("RL iteration 0 never logged", _log_tail(tmp_path, "full"))
            time.sleep(0.05)
        cut = _launch(tmp_path, "cut")
        # SIGKILL the second run once it saves the checkpoint after RL iteration 1 (the save of
        # step 2, in the background while iteration 2 starts) or, should the poll miss that
        # save, once it logged iteration 2.
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert cut.poll() is None, ("the run ended before it was killed", _log_tail(tmp_path, "cut"))
            assert time.monotonic() < deadline, ("RL iteration 1 never saved", _log_tail(tmp_path, "cut"))
            saving = [n for n in _rl_checkpoints(run / "checkpoints" / "rl")[1] if int(n.split(".")[0]) >= 2]
            if saving or any(r["phase"] == "rl" and r["step"] >= 2 for r in _records(run / "metrics.jsonl")):
                break
            time.sleep(0.01)
        cut.send_signal(signal.SIGKILL)
        assert cut.wait(timeout=60) == -signal.SIGKILL
        t_kill = time.perf_counter() - t0
        killed_records = len(_records(run / "metrics.jsonl"))
        complete, _ = _rl_checkpoints(run / "checkpoints" / "rl")
        assert complete and complete[-1] < STEPS, complete
        resume_at = complete[-1]  # the iteration the relaunch starts from

        assert full.wait(timeout=TIMEOUT_S) == 0, ("full", _log_tail(tmp_path, "full"))
        t_full = time.perf_counter() - t0
        again = _launch(tmp_path, "cut", "resume=true")
        assert again.wait(timeout=TIMEOUT_S) == 0, ("resume", _log_tail(tmp_path, "cut"))
        t_resume = time.perf_counter() - t0 - max(t_full, t_kill)
    finally:
        for p in (full, cut):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    print(f"\nkilled at {t_kill:.1f}s {'mid-save' if saving else 'after iteration 2'} (resume from iteration "
          f"{resume_at}); uninterrupted run {t_full:.1f}s; resumed run {t_resume:.1f}s")

    want = _records(tmp_path / "runs" / "full" / "metrics.jsonl")
    records = _records(run / "metrics.jsonl")
    resumed = records[killed_records:]
    # The relaunch continued from the checkpoint (no evaluation before, no earlier iteration) to the end.
    assert [r for r in resumed if r.get("label") == "before"] == []
    assert [r["step"] for r in resumed if r["phase"] == "rl"] == list(range(resume_at, STEPS))
    assert [(r["step"], r["label"]) for r in resumed if r["phase"] == "eval"] == (
        [(2, "during")] * (resume_at < 2) + [(STEPS, "after")])
    # Every record equals the uninterrupted run's but for wall-clock fields: the iterations and
    # evaluations after the resume point as much as those the killed run logged before it.
    got, exp = _last(records), _last(want)
    assert sorted(got, key=str) == sorted(exp, key=str)
    diffs = {key: _diff(got[key], exp[key]) for key in exp}
    assert not any(diffs.values()), {k: v for k, v in diffs.items() if v}
    assert exp[("rl", STEPS - 1, None)]["update/kl_ref"] > 0  # the policy moved: not a vacuous comparison
    # ... and so do the episodes themselves (tokens, log-probs, rewards) of the re-run iterations.
    for i in range(resume_at, STEPS):
        name = f"trajectories/iter_{i:05d}.jsonl"
        assert _episodes(run / name) == _episodes(tmp_path / "runs" / "full" / name), name

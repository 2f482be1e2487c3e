"""Two processes, one mesh: `jax.distributed.initialize` with a coordinator on 127.0.0.1 and 4
fake CPU devices per process gives a global 8-device mesh on which an SFT update, an RL update
(InfoPO + Faca credit on fixed episodes) and an orbax checkpoint save / restore give what the same
work gives in one process with 8 devices (`tests/distributed_worker.py` does the work); and a
whole job (``python -m jaxagent.launch``) runs as two processes (docs/PODS.md)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxagent.envs.gyms import GYMS
from jaxagent.rollout.trajectory import to_jsonl
from tests.test_rl import _trainer

WORKER = Path(__file__).resolve().parent / "distributed_worker.py"
TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(num_processes: int, trajectories: Path, out: Path) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // num_processes}"}
    port = _free_port()
    out.mkdir(parents=True)
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(i), str(num_processes), str(port), str(trajectories),
                               str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(num_processes)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for p in procs:
            p.kill()
    for i, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"process {i} of {num_processes} exited {p.returncode}:\n{log[-6000:]}"
        assert f"process {i} done" in log
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory) -> Path:
    """8 episodes (4 telepathy tasks x 2) of a tiny random policy, fixed for both runs."""
    trainer = _trainer("grpo")
    trajs = trainer.rollout(GYMS["telepathy"].make_tasks("train", 4, seed=0), jax.random.key(0))
    assert len(trajs) == 8 and sum(len(t.action_spans()) >= 2 for t in trajs) >= 2  # turns with info gain
    return to_jsonl(trajs, tmp_path_factory.mktemp("episodes") / "episodes.jsonl")


def test_two_processes_equal_one(trajectories, tmp_path):
    one = _run(1, trajectories, tmp_path / "one")
    two = _run(2, trajectories, tmp_path / "two")
    assert (one["processes"], one["devices"]) == (1, 8)
    assert (two["processes"], two["devices"]) == (2, 8)
    assert one["ckpt/restored_equal"] is True and two["ckpt/restored_equal"] is True
    assert one["ckpt/next_iter"] == two["ckpt/next_iter"] == 1
    assert one["rl/updates"] == two["rl/updates"] == 2  # two minibatches of 4
    assert np.isfinite(one["rl/info/gain_mean"]) and one["rl/info/gain_mean"] != 0.0
    for key in ("sft/loss", "sft/grad_norm", "sft/param_sum", "rl/update/loss", "rl/update/kl_ref",
                "rl/update/grad_norm", "rl/info/gain_mean", "rl/param_sum", "ckpt/param_sum"):
        np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert two["ckpt/param_sum"] == two["rl/param_sum"]


JOB = ["progress=false", "steps=2", "sft.steps=5", "sft.batch_size=4", "sft.demos=8", "env.train_tasks=8",
       "env.test_tasks=3", "eval.tasks=3", "eval.every=1", "eval.sampled_k=1", "rl.group_size=2",
       "rl.tasks_per_step=2", "rl.minibatch_size=4", "rollout.slots=4", "rollout.max_turns=4",
       "rollout.max_new_tokens=32"]


def _launch(tmp_path: Path, extra: list[str], processes: int = 2) -> list[tuple[int, str]]:
    """``python -m jaxagent.launch`` as ``processes`` processes of one run (2 fake CPU devices
    each); their (exit code, output)."""
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    procs = [subprocess.Popen([sys.executable, "-m", "jaxagent.launch", f"runs_dir={tmp_path}", *extra,
                               "mesh.distributed=true", f"mesh.coordinator_address=127.0.0.1:{port}",
                               f"mesh.num_processes={processes}", f"mesh.process_id={i}"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(processes)]
    try:
        outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
        return [(p.returncode, out) for p, out in zip(procs, outs)]
    finally:
        for p in procs:
            p.kill()


def test_a_two_process_job_plays_its_shares_and_trains_on_all(tmp_path):
    # One sft+rl job over two processes (2 devices each, one 4-device mesh): each process plays its
    # share of every evaluation and RL iteration on its own copy of the policy, the episodes are
    # exchanged, both update on the same batch (a per-iteration checksum refuses otherwise) and
    # process 0 alone writes the run directory.
    logs = _launch(tmp_path, ["name=two", *JOB])
    for i, (rc, log) in enumerate(logs):
        assert rc == 0, f"process {i} exited {rc}:\n{log[-6000:]}"
    run = tmp_path / "two"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 7 and summary["eval_tasks"] == 3 and len(summary["devices"]) == 4
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["phase"] == "eval"]
    assert [r["label"] for r in evals] == ["before", "after_sft", "during", "after"]
    for r in evals:  # process 0 played 2 of the 3 tasks, process 1 the third: all three are in every record
        assert r["tasks"] == 3 and len(r["success_by_task"]) == 3, r
        if r["label"] != "before":
            assert len(r["sampled/success_by_task"]) == 3
    assert [r["step"] for r in records if r["phase"] == "rl"] == [0, 1]
    assert [r["step"] for r in records if r["phase"] == "sft"] == [0, 4]  # written once, by process 0
    for name in ("iter_00000.jsonl", "iter_00001.jsonl"):  # task 0's group from process 0, task 1's from process 1
        trajs = [json.loads(line) for line in (run / "trajectories" / name).read_text().splitlines()]
        assert [t["group_id"] for t in trajs] == [0, 0, 1, 1]
        assert trajs[0]["task_id"] == trajs[1]["task_id"] != trajs[2]["task_id"] == trajs[3]["task_id"]
    assert sorted(p.name for p in (run / "checkpoints" / "rl").iterdir()) == ["2"]
    assert sorted(p.name for p in (run / "checkpoints" / "sft").iterdir()) == ["4", "5"]  # checkpoint.every=4
    from jaxagent.models.hf import load_pretrained

    _, params = load_pretrained(run / "hf")  # gathered from both processes
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)) == summary["model_params"]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
    assert len(list((run / "plots").glob("*.png"))) >= 3 and (run / "config.yaml").exists()
    assert '"name": "two"' in logs[1][1]  # process 1 ran to the end too (its summary, without plots)


def test_a_host_agent_eval_over_processes_is_refused(tmp_path):
    # job=eval with the tau2 oracle uses no devices: two processes of it would play it twice
    logs = _launch(tmp_path, ["name=oracle", "job=eval", "env.kind=tau2_retail", "eval.agent=oracle"])
    for rc, log in logs:
        assert rc != 0, log[-3000:]
        assert "config error: eval.agent='oracle': this launch is one of 2 processes" in log, log[-3000:]
    assert not list(tmp_path.iterdir())

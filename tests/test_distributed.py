"""Two processes, one mesh: `jax.distributed.initialize` with a coordinator on 127.0.0.1 and 4
fake CPU devices per process gives a global 8-device mesh on which an SFT update, an RL update
(InfoPO + Faca credit on fixed episodes) and an orbax checkpoint save / restore give what the same
work gives in one process with 8 devices (`tests/distributed_worker.py` does the work)."""

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


def test_a_multi_process_launch_is_refused_before_it_can_hang(tmp_path):
    # The jobs' rollout engine is driven by one host: two launches joined into one run stop at once
    # with the key named, instead of waiting on each other's collectives.
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    procs = [subprocess.Popen([sys.executable, "-m", "jaxagent.launch", f"runs_dir={tmp_path}", f"name=p{i}",
                               "progress=false", "mesh.distributed=true", f"mesh.coordinator_address=127.0.0.1:{port}",
                               "mesh.num_processes=2", f"mesh.process_id={i}"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    try:
        logs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode != 0, log[-3000:]
        assert "config error: mesh.distributed=True: this launch is one of 2 processes" in log, log[-3000:]
    assert not list(tmp_path.iterdir())  # refused before the run directory was made

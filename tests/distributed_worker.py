"""One process of the two-process check (`tests/test_distributed.py`), or the single-process
reference: the same work on a global 8-device (data 2 x fsdp 4) mesh of fake CPU devices.

    python tests/distributed_worker.py PROCESS_ID NUM_PROCESSES PORT TRAJECTORIES OUT_DIR

The coordinator is process 0 at ``$COORDINATOR_HOST:PORT`` (default 127.0.0.1: one machine).

Each process holds 8 / NUM_PROCESSES devices (XLA_FLAGS, set by the caller). The work: one SFT
update on the trajectories' tokens (loss on the agent's tokens), one RL update (`RLTrainer.train_on`,
InfoPO + Faca credit, PPO with a KL term) on the same fixed episodes, an orbax checkpoint of the
RL trainer saved by every process and restored into the trainer's shardings. Process 0 writes
``OUT_DIR/result.json``: the figures the test compares with the reference, each a float (sums
of the parameters after each update, the updates' metrics, whether the restore gave back the
saved arrays)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import jax

PROCESS_ID, NUM_PROCESSES, PORT = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
TRAJECTORIES, OUT = Path(sys.argv[4]), Path(sys.argv[5])
COORDINATOR = os.environ.get("COORDINATOR_HOST", "127.0.0.1")

if NUM_PROCESSES > 1:  # CPU devices of several processes talk through gloo
    jax.config.update("jax_cpu_collectives_implementation", "gloo")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax.numpy as jnp  # noqa: E402

from jaxagent.credit.infopo import InfoPOConfig  # noqa: E402
from jaxagent.credit.losses import PPOConfig  # noqa: E402
from jaxagent.credit.reaction import FacaConfig  # noqa: E402
from jaxagent.models import LogicalRules, make_mesh, preset  # noqa: E402
from jaxagent.models.generate import SamplingParams  # noqa: E402
from jaxagent.models.sharding import MeshConfig, batch_sharding, initialize_distributed
from jaxagent.models.placement import init_params_sharded
from jaxagent.train.batch import Row, build_batch  # noqa: E402
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.trajectory import from_jsonl  # noqa: E402
from jaxagent.text import load_tokenizer  # noqa: E402
from jaxagent.train.checkpoint import Checkpointer  # noqa: E402
from jaxagent.train.rl import RLSettings, RLTrainer  # noqa: E402
from jaxagent.train.step import (OptimSettings, StepShardings, TrainState, make_optimizer, make_update,  # noqa: E402
                                 place_on_mesh, sft_loss_fn)

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def param_sum(params) -> float:
    """The parameters' sum (a jitted reduction: the arrays span processes, no host sees them whole)."""
    return float(jax.jit(lambda p: sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(p)))(params))


def all_equal(a, b) -> bool:
    return bool(jax.jit(lambda a, b: jnp.all(jnp.stack([jnp.array_equal(x, y) for x, y in
                                                        zip(jax.tree.leaves(a), jax.tree.leaves(b))])))(a, b))


def main() -> None:
    t0 = time.perf_counter()

    def mark(what: str) -> None:
        print(f"process {PROCESS_ID}: {what} at {time.perf_counter() - t0:.1f}s", flush=True)

    mesh_cfg = MeshConfig(data=2, fsdp=4, distributed=NUM_PROCESSES > 1, coordinator_address=f"{COORDINATOR}:{PORT}",
                          num_processes=NUM_PROCESSES, process_id=PROCESS_ID)
    initialize_distributed(mesh_cfg)
    assert jax.process_count() == NUM_PROCESSES and jax.device_count() == 8, (jax.process_count(), jax.devices())
    rules = LogicalRules(make_mesh(mesh_cfg))
    tok = load_tokenizer(FIXTURES / "tokenizer_qwen")
    cfg = preset("tiny-qwen2", vocab_size=tok.vocab_size, max_position_embeddings=1024)
    trajs = from_jsonl(TRAJECTORIES)
    out: dict[str, float | bool | int] = {"processes": jax.process_count(), "devices": jax.device_count()}

    # -- one SFT update: the episodes' tokens, the loss on the agent's tokens
    params = init_params_sharded(jax.random.key(0), cfg, rules)
    # SGD: an update linear in the gradient (Adam's first step is about lr * sign(g), so a gradient
    # entry near 0 would flip with float noise and hide a real difference among those)
    tx = make_optimizer(OptimSettings(name="sgd", lr=1e-1))
    state = place_on_mesh(TrainState.create(params, tx), rules.mesh)
    host = build_batch([Row(tokens=t.tokens, loss_mask=t.loss_mask()) for t in trajs])
    shardings = StepShardings.of(state, batch_sharding(rules, shape=host.shape))
    update = make_update(sft_loss_fn(cfg), tx, microbatches=2, shardings=shardings)
    state, m = update(state, shardings.put_batch({"tokens": host.tokens_BL, "loss_mask": host.loss_mask_BL}))
    mark("sft update")
    out.update({"sft/loss": float(m["loss"]), "sft/grad_norm": float(m["grad_norm"]),
                "sft/param_sum": param_sum(state.params)})

    # -- one RL update on the same fixed episodes (no rollout: train_on)
    # weights x4: a policy whose log-probs move with the feedback (a 0.02-init random model's info
    # gains are ~1e-4, round-off level, and their group z-scores would amplify round-off)
    params = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, init_params_sharded(jax.random.key(1), cfg, rules))
    state = place_on_mesh(TrainState.create(params, tx), rules.mesh)
    settings = RLSettings(credit="infopo+faca", group_size=2, tasks_per_step=len(trajs) // 2, ppo_epochs=1,
                          minibatch_size=len(trajs) // 2)
    trainer = RLTrainer(state, tx, config=cfg, tokenizer=tok, make_env=None, settings=settings,
                        ppo=PPOConfig(kl_coef=0.01), sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
                        episode=EpisodeConfig(max_turns=3, max_tokens=1024), engine=None, infopo=InfoPOConfig(),
                        faca=FacaConfig(),
                        shardings=StepShardings.of(state, batch_sharding(rules, shape=(settings.minibatch_size, 1))))
    metrics = trainer.train_on(trajs, jax.random.key(2))
    mark("rl update")
    for k in ("update/loss", "update/kl_ref", "update/grad_norm", "info/gain_mean", "updates"):
        out[f"rl/{k}"] = float(metrics[k])
    out["rl/param_sum"] = param_sum(trainer.state.params)

    # -- checkpoint from every process, restored onto the trainer's shardings
    ckpt = Checkpointer(OUT / "checkpoints", keep=2, async_save=False)
    ckpt.save(1, trainer.checkpoint_tree(), {"next_iter": 1}, force=True)
    ckpt.wait()
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          trainer.checkpoint_tree())
    restored, meta = ckpt.restore(target)
    ckpt.close()
    live = trainer.checkpoint_tree()
    same = all_equal(restored, live) and all(x.sharding == y.sharding for x, y in
                                             zip(jax.tree.leaves(restored), jax.tree.leaves(live)))
    out.update({"ckpt/restored_equal": same, "ckpt/next_iter": int(meta["next_iter"]),
                "ckpt/param_sum": param_sum(restored["state"].params)})
    trainer.restore(restored)
    mark("checkpoint saved and restored")
    if jax.process_index() == 0:
        (OUT / "result.json").write_text(json.dumps(out, indent=1))
    print(f"process {jax.process_index()} done", flush=True)


if __name__ == "__main__":
    main()

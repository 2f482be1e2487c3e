"""The training phases of a run: SFT on demonstrations and RL, each checkpointed and resumable."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import jax
import numpy as np

from jaxagent.jobs.build import Run, episode_config, sampling_params, step_key, step_rng
from jaxagent.jobs.config import RunConfig
from jaxagent.jobs.evaluate import run_eval
from jaxagent.models.sharding import batch_sharding
from jaxagent.rollout.batch import Row, build_batch
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.train.rl import FailureBudget, RLTrainer, SimulatorFailureBudget
from jaxagent.train.step import (OptimSettings, StepShardings, TrainingFailed, TrainState, check_skipped_share,
                                 learning_rate, make_optimizer, make_update, place_on_mesh, sft_loss_fn)


# ----------------------------------------------------------------------------- SFT
def sft_data(cfg: RunConfig, tok: Tokenizer, make_env=None) -> list[tuple[list[int], list[bool]]]:
    """Rendered demonstrations from ``env.kind``'s spec (`EnvSpec.demonstrations`): a gym's expert
    (with ``sft.noise``), or on tau2 the gold-action oracle's episodes on the selected tasks (one
    each, at most ``sft.demos``). ``make_env``: the run's environment family (built when None)."""
    from jaxagent.envs.registry import DemoRequest, EnvSetup
    from jaxagent.jobs.build import build_env
    from jaxagent.jobs.config import env_context
    from jaxagent.rollout.demos import render_demo

    spec = cfg.env.spec
    if spec.demonstrations is None:
        raise ValueError(f"env.kind={cfg.env.kind!r}: offers no demonstrations for SFT")
    setup = EnvSetup(*build_env(cfg)) if make_env is None else EnvSetup(make_env, [], [])
    demos = spec.demonstrations(env_context(cfg), setup, DemoRequest(n=cfg.sft.demos, noise=cfg.sft.noise,
                                                                     policy=cfg.sft.demo_policy, seed=cfg.env.task_seed))
    rendered = [render_demo(d, tok, tool_schemas_in_prompt=cfg.rollout.tool_schemas_in_prompt) for d in demos]
    kept = [(ids, mask) for ids, mask in rendered if len(ids) <= cfg.rollout.capacity]
    if not kept:
        raise ValueError(f"rollout.capacity={cfg.rollout.capacity}: shorter than every demonstration")
    return kept


def sft_optim(cfg: RunConfig) -> OptimSettings:
    """The SFT phase's optimizer: ``optim`` with the ``sft`` section's learning rate, warmup and
    schedule (cosine: decays over the SFT steps after the warmup)."""
    s = cfg.sft
    optim = cfg.optim if s.lr is None else dataclasses.replace(cfg.optim, lr=s.lr)
    if s.warmup_steps is not None:
        optim = dataclasses.replace(optim, warmup_steps=s.warmup_steps)
    if s.schedule == "cosine":
        return dataclasses.replace(optim, schedule="cosine", decay_steps=max(1, s.steps - optim.warmup_steps),
                                   final_lr_fraction=s.final_lr_fraction)
    return dataclasses.replace(optim, schedule="constant")


def sft_batch(data, idx: np.ndarray, multiple: int = 64) -> dict[str, np.ndarray]:
    """Demonstrations ``data[idx]`` ((token ids, loss mask) pairs) padded by `build_batch`: the
    ``tokens`` and ``loss_mask`` [B, L] of `sft_loss_fn`, L rounded up to ``multiple``."""
    batch = build_batch([Row(tokens=data[i][0], loss_mask=data[i][1]) for i in idx], multiple=multiple,
                        noun="demonstration")
    return {"tokens": batch.tokens_BL, "loss_mask": batch.loss_mask_BL}


def run_sft(run: Run, params):
    from jaxagent.train.checkpoint import Checkpointer

    cfg = run.cfg
    s = cfg.sft
    optim = sft_optim(cfg)
    tx = make_optimizer(optim)
    state = place_on_mesh(TrainState.create(params, tx, trainable=trainable(run.qcfg)), run.rules.mesh)
    ckpt = Checkpointer(run.run_dir / "checkpoints" / "sft", keep=cfg.checkpoint.keep,
                        async_save=cfg.checkpoint.async_save)
    restored, start = _resume(run, ckpt, "sft", _abstract(state), "next_step", s.steps, "sft.steps")
    state = state if restored is None else restored
    data = sft_data(run.cfg, run.tok, run.make_env) if start < s.steps else []
    rows = min(s.batch_size, len(data))
    if rows:  # one jitted step, its shardings declared: the state stays where it is, fresh or restored
        shardings = StepShardings.of(state, batch_sharding(run.rules, shape=(rows, 1)))
        update = make_update(sft_loss_fn(run.qcfg), tx, lr_schedule=learning_rate(optim), shardings=shardings)
    run.log.start("sft", s.steps, start, desc="sft")
    for i in range(start, s.steps):
        idx = step_rng(cfg.seed, "sft", i).choice(len(data), size=rows, replace=False)
        state, m = update(state, shardings.put_batch(sft_batch(data, idx)))
        if i % 10 == 0 or i == s.steps - 1:
            run.log.log("sft", i, {k: float(v) for k, v in jax.device_get(m).items()}, show=("loss", "nll", "grad_norm"))
            _check_skipped(run, ckpt, "sft", state, s.max_skipped_share, "sft.max_skipped_share",
                           final=i == s.steps - 1)
        if cfg.checkpoint.every and (i + 1) % cfg.checkpoint.every == 0 and i + 1 < s.steps:
            ckpt.save(i + 1, state, {"next_step": i + 1})
    run.log.end("sft")
    if s.steps and start < s.steps:
        ckpt.save(s.steps, state, {"next_step": s.steps}, force=True)
    ckpt.wait()
    ckpt.close()
    return state.model_params


def trainable(qcfg) -> tuple[str, ...] | None:
    """What an update trains: the LoRA adapter alone with ``model.lora`` (the base frozen), else everything."""
    return ("lora",) if qcfg.lora is not None else None


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _resume(run: Run, ckpt, phase: str, target, next_key: str, total: int, total_key: str) -> tuple[Any, int]:
    """With ``resume=true``: (the restored state or None, the step to continue from).

    Restores the newest checkpoint of ``phase`` that restores (`Checkpointer.restore_newest`:
    newer damaged steps are moved aside, each named on stderr and in the ``resume`` record),
    then truncates metrics.jsonl back to it (what the resumed phase logs again goes: no
    duplicate records) and appends a ``{"phase": "resume", "of": phase, ...}`` record."""
    from jaxagent.jobs.resume import after_checkpoint, check_not_shortened

    if not run.cfg.resume:
        return None, 0
    state, start, from_step = None, 0, None
    damaged = list(ckpt.damaged_on_open)
    if ckpt.latest_step() is not None or damaged:  # all damaged on open: CheckpointDamaged
        restored = ckpt.restore_newest(target)
        state, start, from_step = restored.state, int(restored.meta[next_key]), restored.step
        damaged += restored.damaged
    for d in damaged:
        print(f"WARNING: {phase} checkpoint step {d.step} in {ckpt.directory} is damaged ({d.reason}); moved it to "
              f"{d.moved_to.name}, resuming from {'step ' + str(from_step) if from_step is not None else 'the start'}",
              file=sys.stderr, flush=True)
    check_not_shortened(run.cfg, phase, start, total, total_key)
    dropped = run.log.truncate(after_checkpoint(phase, start))  # process 0's file (the others': 0)
    run.processes.barrier(f"jaxagent-resume-{phase}")  # metrics.jsonl as it will be read from here on
    run.log.event("resume", start, {"of": phase, "checkpoint": from_step, "dropped_records": dropped,
                                    "damaged": [d.to_dict() for d in damaged]})
    if run.cfg.progress:
        print(f"[resume] {phase} from {'checkpoint step ' + str(from_step) if from_step is not None else 'the start'}"
              f" ({dropped} metrics records after it dropped)", file=sys.stderr, flush=True)
    return state, start


def _check_skipped(run: Run, ckpt, phase: str, state: TrainState, limit: float, key: str, *, final: bool) -> None:
    """`check_skipped_share` on ``state``'s counters; on failure the ``failure`` record is logged and
    the checkpointer closed (its last complete checkpoint stays) before `TrainingFailed` goes up."""
    applied, skipped = (int(x) for x in jax.device_get((state.step, state.skipped)))
    try:
        check_skipped_share(applied, skipped, limit, phase=phase, key=key, final=final)
    except TrainingFailed as e:
        run.log.event("failure", applied + skipped, {"of": phase, "reason": str(e)})
        run.log.end(phase)
        ckpt.close()
        raise


def run_rl(run: Run, params) -> tuple[Any, int]:
    from jaxagent.train.checkpoint import Checkpointer

    cfg = run.cfg
    tx = make_optimizer(cfg.optim)
    state = place_on_mesh(TrainState.create(params, tx, trainable=trainable(run.qcfg)), run.rules.mesh)
    minibatch = cfg.rl.minibatch_size or cfg.rl.group_size * cfg.rl.tasks_per_step
    trainer = RLTrainer(state, tx, config=run.qcfg, tokenizer=run.tok, make_env=run.make_env, settings=cfg.rl,
                        ppo=cfg.ppo, sampling=sampling_params(cfg, run.tok), episode=episode_config(cfg),
                        engine=run.engine, infopo=cfg.infopo, faca=cfg.faca, grpo=cfg.grpo,
                        lr_schedule=learning_rate(cfg.optim),
                        shardings=StepShardings.of(state, batch_sharding(run.rules, shape=(minibatch, 1))),
                        processes=run.processes)
    ckpt = Checkpointer(run.run_dir / "checkpoints" / "rl", keep=cfg.checkpoint.keep,
                        best_metric=cfg.checkpoint.best_metric, async_save=cfg.checkpoint.async_save)
    restored, start = _resume(run, ckpt, "rl", _abstract(trainer.checkpoint_tree()), "next_iter", cfg.steps, "steps")
    if restored is not None:
        trainer.restore(restored)
    traj_dir = run.run_dir / "trajectories"
    if run.processes.is_main:
        traj_dir.mkdir(exist_ok=True)
    last_eval: dict[str, Any] = {}
    if start:  # the evaluation the uninterrupted run would hold here (the checkpoints' best metric)
        from jaxagent.eval.report import read_metrics

        during = [r for r in read_metrics(run.run_dir / "metrics.jsonl")
                  if r.get("phase") == "eval" and r.get("label") == "during" and r.get("step", 0) <= start]
        last_eval = sorted(during, key=lambda r: r["step"])[-1] if during else {}
    budget = FailureBudget.from_settings(cfg.rl)
    run.log.start("rl", cfg.steps, start, desc=f"rl ({cfg.rl.credit})")
    for i in range(start, cfg.steps):
        rng = step_rng(cfg.seed, "rl", i)
        tasks = [run.train_tasks[j] for j in rng.choice(len(run.train_tasks), cfg.rl.tasks_per_step, replace=False)]
        metrics, trajs = trainer.iteration(tasks, step_key(cfg.seed, "rl", i))
        run.log.log("rl", i, metrics, show=("success", "reward", "turns", "info/gain_mean", "info/gate_mean",
                                             "update/kl_ref", "sim/failed_episodes", "tokens_per_s"))
        if run.processes.is_main:  # every process holds every episode (jaxagent.rollout.processes)
            with open(traj_dir / f"iter_{i:05d}.jsonl", "w", encoding="utf-8") as f:
                for t in trajs[: 2 * cfg.rl.group_size]:
                    f.write(json.dumps(t.to_dict()) + "\n")
        try:
            budget.update(trajs, i)  # rl.failure_share / rl.failure_budget_iters
        except SimulatorFailureBudget as e:  # the last complete checkpoint stays
            run.log.event("failure", i, {"of": "rl", "reason": str(e)})
            run.log.end("rl")
            ckpt.wait()
            ckpt.close()
            raise
        _check_skipped(run, ckpt, "rl", trainer.state, cfg.rl.max_skipped_share, "rl.max_skipped_share",
                       final=i == cfg.steps - 1)
        done = i + 1
        if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.steps:
            last_eval = run_eval(run, trainer.state.model_params, "during", done)
        if cfg.checkpoint.every and done % cfg.checkpoint.every == 0 and done < cfg.steps:
            ckpt.save(done, trainer.checkpoint_tree(), {"next_iter": done},
                      metrics={"eval/success": last_eval.get("success", 0.0)})
    run.log.end("rl")
    if cfg.steps and start < cfg.steps:
        ckpt.save(cfg.steps, trainer.checkpoint_tree(), {"next_iter": cfg.steps},
                  metrics={"eval/success": last_eval.get("success", 0.0)}, force=True)
    ckpt.wait()
    ckpt.close()
    return trainer.state.model_params, int(trainer.state.step)

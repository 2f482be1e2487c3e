"""The training phases of a run: SFT on demonstrations and RL, each through the one training loop
(`jaxagent.train.loop.fit`), checkpointed and resumable; and what every training job shares:
`resume_phase` (restore, cut metrics.jsonl back, record the resume), `skip_check` (the skipped-update
hook), `failure_record` (a stopped run's ``failure`` record) and `build_trainer` (the RL trainer of a run).
"""

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
from jaxagent.models.sharding import batch_sharding, row_rules
from jaxagent.train.batch import Row, build_batch
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.train.loop import Checkpointing, every, fit
from jaxagent.train.rl import FailureBudget, RLTrainer, SimulatorFailureBudget
from jaxagent.train.step import (OptimSettings, StepShardings, TrainingFailed, TrainState, check_skipped_share,
                                 learning_rate, make_optimizer, make_update, place_on_mesh, sft_loss_fn)


# ----------------------------------------------------------------------------- shared by the training jobs
def abstract(tree):
    """``tree``'s shapes, dtypes and shardings (the target a checkpoint restores onto)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def trainable(qcfg) -> tuple[str, ...] | None:
    """What an update trains: the LoRA adapter alone with ``model.lora`` (the base frozen), else everything."""
    return ("lora",) if qcfg.lora is not None else None


def resume_phase(run, ckpt, phase: str, target, next_key: str, total: int, total_key: str) -> tuple[Any, int]:
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


def skip_check(run, phase: str, limit: float, key: str, total: int, state_of=lambda s: s):
    """A `fit` hook: `check_skipped_share` on the state's update counters (``state_of(state)``: the
    `TrainState`), ``final`` at the last step. Past ``limit`` (``key`` names it) the ``failure``
    record is logged at the number of updates made, then `TrainingFailed` goes up."""

    def hook(i: int, state: Any, metrics) -> None:
        st = state_of(state)
        applied, skipped = (int(x) for x in jax.device_get((st.step, st.skipped)))
        try:
            check_skipped_share(applied, skipped, limit, phase=phase, key=key, final=i == total - 1)
        except TrainingFailed as e:
            run.log.event("failure", applied + skipped, {"of": phase, "reason": str(e)})
            e.recorded = True
            raise

    return hook


def failure_record(run, phase: str):
    """`fit`'s ``on_error``: a run stopped by `SimulatorFailureBudget` (or a `TrainingFailed` not
    recorded yet) gets a ``{"phase": "failure", "of": phase, ...}`` record (its last complete
    checkpoint stays: `fit` closes the checkpointer); the phase's progress bar is closed however it
    stopped."""

    def on_error(e: BaseException, i: int) -> None:
        if isinstance(e, (TrainingFailed, SimulatorFailureBudget)) and not getattr(e, "recorded", False):
            run.log.event("failure", i, {"of": phase, "reason": str(e)})
        run.log.end(phase)

    return on_error


# ----------------------------------------------------------------------------- SFT
def sft_data(cfg: RunConfig, tok: Tokenizer, make_env=None) -> list[tuple[list[int], list[bool]]]:
    """Rendered demonstrations from ``env.kind``'s spec (`EnvSpec.demonstrations`): a gym's expert
    (with ``sft.noise``), or on tau2 the gold-action oracle's episodes on the selected tasks (one
    each, at most ``sft.demos``). ``make_env``: the run's environment family (built when None)."""
    from jaxagent.envs.registry import DemoPlan, DemoRequest, EnvSetup
    from jaxagent.jobs.build import build_env
    from jaxagent.jobs.config import env_context
    from jaxagent.rollout.demos import play_demos, render_demo

    spec = cfg.env.spec
    if spec.demonstrations is None:
        raise ValueError(f"env.kind={cfg.env.kind!r}: offers no demonstrations for SFT")
    setup = EnvSetup(*build_env(cfg)) if make_env is None else EnvSetup(make_env, [], [])
    demos = spec.demonstrations(env_context(cfg), setup, DemoRequest(n=cfg.sft.demos, noise=cfg.sft.noise,
                                                                     policy=cfg.sft.demo_policy, seed=cfg.env.task_seed))
    if isinstance(demos, DemoPlan):  # an expert agent's episodes, played through the episode runner
        demos = play_demos(demos)
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
    """SFT on the environment's demonstrations (`sft_data`): ``sft.steps`` updates of ``sft.batch_size``
    demonstrations drawn for each step from ``(seed, "sft", i)``, checkpointed every ``checkpoint.every``."""
    from jaxagent.train.checkpoint import Checkpointer

    cfg = run.cfg
    s = cfg.sft
    optim = sft_optim(cfg)
    tx = make_optimizer(optim)
    state = place_on_mesh(TrainState.create(params, tx, trainable=trainable(run.qcfg)), run.rules.mesh)
    ckpt = Checkpointer(run.run_dir / "checkpoints" / "sft", keep=cfg.checkpoint.keep,
                        async_save=cfg.checkpoint.async_save)
    restored, start = resume_phase(run, ckpt, "sft", abstract(state), "next_step", s.steps, "sft.steps")
    state = state if restored is None else restored
    data = sft_data(run.cfg, run.tok, run.make_env) if start < s.steps else []
    rows = min(s.batch_size, len(data))
    if rows:  # one jitted step, its shardings declared: the state stays where it is, fresh or restored
        shardings = StepShardings.of(state, batch_sharding(run.rules, shape=(rows, 1)))
        loss = sft_loss_fn(run.qcfg, rules=row_rules(run.rules, rows))  # one microbatch of all the rows
        update = make_update(loss, tx, lr_schedule=learning_rate(optim), shardings=shardings)

    def step(i, state):
        idx = step_rng(cfg.seed, "sft", i).choice(len(data), size=rows, replace=False)
        return update(state, shardings.put_batch(sft_batch(data, idx)))

    def log(i, state, m):
        run.log.log("sft", i, {k: float(v) for k, v in jax.device_get(m).items()}, show=("loss", "nll", "grad_norm"))

    run.log.start("sft", s.steps, start, desc="sft")
    state = fit(state, step, start=start, total=s.steps,
                hooks=[every(10, s.steps, log), every(10, s.steps, skip_check(run, "sft", s.max_skipped_share,
                                                                                  "sft.max_skipped_share", s.steps))],
                checkpoint=Checkpointing(ckpt, cfg.checkpoint.every, "next_step"), on_error=failure_record(run, "sft"))
    run.log.end("sft")
    return state.model_params


# ----------------------------------------------------------------------------- RL
def build_trainer(run: Run, params) -> RLTrainer:
    """The RL trainer of a run: a fresh state of ``params`` on the run's mesh (the LoRA adapter alone
    trained with ``model.lora``), the run's optimizer, credit terms, sampling, episode limits, engine
    and processes, its update's shardings declared for ``rl.minibatch_size`` rows."""
    cfg = run.cfg
    tx = make_optimizer(cfg.optim)
    state = place_on_mesh(TrainState.create(params, tx, trainable=trainable(run.qcfg)), run.rules.mesh)
    minibatch = cfg.rl.minibatch_size or cfg.rl.group_size * cfg.rl.tasks_per_step
    return RLTrainer(state, tx, config=run.qcfg, tokenizer=run.tok, make_env=run.make_env, settings=cfg.rl,
                     ppo=cfg.ppo, sampling=sampling_params(cfg, run.tok), episode=episode_config(cfg),
                     engine=run.engine, infopo=cfg.infopo, faca=cfg.faca, grpo=cfg.grpo,
                     lr_schedule=learning_rate(cfg.optim),
                     shardings=StepShardings.of(state, batch_sharding(run.rules, shape=(minibatch, 1))),
                     processes=run.processes, rules=run.rules)


def run_rl(run: Run, params) -> tuple[Any, int]:
    """``steps`` RL iterations on ``rl.tasks_per_step`` train tasks drawn from ``(seed, "rl", i)``:
    each logged, a sample of its episodes written to ``trajectories/``, the simulator's failure
    budget and the skipped updates checked, evaluated every ``eval.every``, checkpointed every
    ``checkpoint.every`` (ranked by the last evaluation's success)."""
    from jaxagent.train.checkpoint import Checkpointer

    cfg = run.cfg
    trainer = build_trainer(run, params)
    ckpt = Checkpointer(run.run_dir / "checkpoints" / "rl", keep=cfg.checkpoint.keep,
                        best_metric=cfg.checkpoint.best_metric, async_save=cfg.checkpoint.async_save)
    restored, start = resume_phase(run, ckpt, "rl", abstract(trainer.checkpoint_tree()), "next_iter", cfg.steps,
                                   "steps")
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

    def plan(i):  # iteration i's tasks and key, whichever loop plays them
        rng = step_rng(cfg.seed, "rl", i)
        tasks = [run.train_tasks[j] for j in rng.choice(len(run.train_tasks), cfg.rl.tasks_per_step, replace=False)]
        return tasks, step_key(cfg.seed, "rl", i)

    asynchronous = None
    if cfg.rl.max_staleness:  # jaxagent.train.async_rl: rollouts never wait for the update
        from jaxagent.train.async_rl import AsyncRL

        asynchronous = AsyncRL(trainer, plan, max_staleness=cfg.rl.max_staleness, start=start)

    def step(i, trainer):
        if asynchronous is not None:
            metrics, trajs = asynchronous.iteration(i)
        else:
            metrics, trajs = trainer.iteration(*plan(i), index=i)
        return trainer, {"metrics": metrics, "trajs": trajs}

    def log(i, trainer, out):
        run.log.log("rl", i, out["metrics"], show=("success", "reward", "turns", "info/gain_mean", "info/gate_mean",
                                                   "update/kl_ref", "sim/failed_episodes", "tokens_per_s",
                                                   "async/staleness_mean"))
        if run.processes.is_main:  # every process holds every episode (jaxagent.rollout.processes)
            with open(traj_dir / f"iter_{i:05d}.jsonl", "w", encoding="utf-8") as f:
                for t in out["trajs"][: 2 * cfg.rl.group_size]:
                    f.write(json.dumps(t.to_dict()) + "\n")

    def failures(i, trainer, out):
        budget.update(out["trajs"], i)  # rl.failure_share / rl.failure_budget_iters

    def evaluate(i, trainer, out):
        nonlocal last_eval
        done = i + 1
        if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.steps:
            if asynchronous is not None:  # the engine is the evaluation's while it runs
                asynchronous.pause()
            last_eval = run_eval(run, trainer.state.model_params, "during", done)
            if asynchronous is not None:
                asynchronous.resume()

    run.log.start("rl", cfg.steps, start, desc=f"rl ({cfg.rl.credit})")
    try:
        fit(trainer, step, start=start, total=cfg.steps,
            hooks=[log, failures, skip_check(run, "rl", cfg.rl.max_skipped_share, "rl.max_skipped_share", cfg.steps,
                                             state_of=lambda tr: tr.state), evaluate],
            checkpoint=Checkpointing(ckpt, cfg.checkpoint.every, "next_iter", tree=lambda tr: tr.checkpoint_tree(),
                                     metrics=lambda: {"eval/success": last_eval.get("success", 0.0)}),
            on_error=failure_record(run, "rl"))
    finally:
        if asynchronous is not None:
            asynchronous.close()
    run.log.end("rl")
    return trainer.state.model_params, int(trainer.state.step)

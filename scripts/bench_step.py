#!/usr/bin/env python3
"""InfoPO's overhead: the wall time of an InfoPO RL step over a GRPO RL step on the same batch.

    python3 scripts/bench_step.py                         # the quickstart's model, gym and batch, CPU
    python3 scripts/bench_step.py --tasks-per-step 4 --reps 7
    python3 scripts/bench_step.py --set model.path=runs/<run>/hf      # any RunConfig override

The run is built as ``python -m jaxagent.launch`` builds it (`jaxagent.jobs`: the config's
tokenizer, model, gym and generation engine; default: the quickstart's tiny-qwen2 with random
weights on the intention gym, the builtin gyms tokenizer). One batch of episodes
(``--tasks-per-step`` tasks x ``--group-size``) is sampled with the policy (temperature 1). Then,
on that same batch, two `RLTrainer` s that differ only in ``rl.credit`` (``grpo`` and
``infopo``) run `RLTrainer.train_on` alternately, each from the same initial train state:

- GRPO: collate, fuse (the outcome advantage), the reference policy's scores for the KL term, and
  the PPO update(s) (``rl.ppo_epochs`` x minibatches), exactly as `RLTrainer.iteration`;
- InfoPO: the same plus the information-gain pass (``infopo.mode``, default shared_prefix).

Each round runs the rollout again (same key and weights: the same episodes, checked) and then
both methods' `train_on`, back to back in alternating order. ``--warmup`` rounds compile
everything first (the count of XLA compilations during the timed rounds is reported and should
be 0), then ``--reps`` rounds are timed. Reported:

- ``infopo_over_grpo_step_time``: (rollout + InfoPO train) / (rollout + GRPO train), medians: the
  full RL step, what the InfoPO paper's step time (verl) includes;
- ``infopo_over_grpo_train_time``: InfoPO train / GRPO train (credit + update only);
- ``paired_*_ratio_median``: the same ratios per round, median over rounds (less sensitive to
  other load drifting during the run);
- the absolute medians, the split into credit and update, the info-gain pass alone, the shapes,
  each method's first (compiling) call, and the 1-minute load average at the end.

The last line of stdout is one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import jaxagent  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT))

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.jobs.config import load_config
from jaxagent.configlib import ConfigError
from jaxagent.credit.batch import infogain_valid_turns
from jaxagent.train.batch import packed_length
from jaxagent.train.infogain import compute_infogain
from jaxagent.models import LogicalRules, make_mesh, preset_names
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.train.collate import collate
from jaxagent.jobs import (
    build_env,
    build_model,
    build_tokenizer,
    episode_config,
    param_count,
    sampling_params,
    step_key,
    step_rng,
)
from jaxagent.train.rl import RLTrainer
from jaxagent.models.sharding import batch_sharding
from jaxagent.train.step import StepShardings, TrainState, learning_rate, make_optimizer, place_on_mesh


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def heartbeat(what: str, every_s: float = 10.0):
    """A line on stderr every ``every_s`` seconds while ``what`` runs (`jaxagent.eval.progress.heartbeat`)."""
    from jaxagent.eval.progress import heartbeat as beat

    return beat(what, log, every_s)


class CompileCounter:
    """Counts XLA backend compilations (jax.monitoring), to show none lands in a timed round."""

    def __init__(self):
        self.n = 0
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event: str, duration: float, **kw) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.n += 1


def med(xs):
    return float(statistics.median(xs))


#: The batch this benchmark was first measured on (docs/BENCHMARKS.md), pinned so that its figures
#: stay comparable when the quickstart's RL defaults change: 8 tasks x 5 episodes, one minibatch of
#: 20 per update without accumulation, episodes of up to 12 turns / 1,024 tokens, GRPO with both
#: signs. Without --config only; flags and --set come after and win.
SHAPE = ("rl.group_size=5", "rl.minibatch_size=20", "rl.microbatches=1", "rollout.max_turns=12",
         "rollout.max_tokens=1024", "grpo.negative_weight=1")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default=None, choices=preset_names(), help="model.preset (default: the config's)")
    ap.add_argument("--hidden", type=int, default=None, help="model.hidden_size")
    ap.add_argument("--layers", type=int, default=None, help="model.num_hidden_layers")
    ap.add_argument("--intermediate", type=int, default=None, help="model.intermediate_size")
    ap.add_argument("--gym", default=None, help="env.gym (default: the config's, intention)")
    ap.add_argument("--tasks-per-step", type=int, default=None, help="rl.tasks_per_step (default 8)")
    # (the defaults: SHAPE, then the config's)
    ap.add_argument("--group-size", type=int, default=None, help="rl.group_size (default 5)")
    ap.add_argument("--minibatch", type=int, default=None,
                    help="rl.minibatch_size (default: the config's, or the whole batch where that does not divide it)")
    ap.add_argument("--mode", default=None, choices=("naive", "vmapped", "shared_prefix"), help="infopo.mode")
    ap.add_argument("--reps", type=int, default=5, help="timed rounds (each: one GRPO and one InfoPO train_on)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first (compilation)")
    ap.add_argument("--config", default=None, help="a run config YAML (as python -m jaxagent.launch --config)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a dotted config override")
    args = ap.parse_args(argv)
    log(f"[setup] one GRPO and one InfoPO step on the same batch: {args.warmup} warm-up and {args.reps} timed rounds; "
        "building the model, environment and engine")

    ov = [] if args.config else list(SHAPE)  # a config file's own batch shape stands
    for flag, key in (("preset", "model.preset"), ("hidden", "model.hidden_size"), ("layers", "model.num_hidden_layers"),
                      ("intermediate", "model.intermediate_size"), ("gym", "env.gym"),
                      ("tasks_per_step", "rl.tasks_per_step"), ("group_size", "rl.group_size"),
                      ("minibatch", "rl.minibatch_size"), ("mode", "infopo.mode")):
        if getattr(args, flag) is not None:
            ov.append(f"{key}={getattr(args, flag)}")
    try:
        cfg = load_config(args.config, ov + args.set)
    except ConfigError as e:  # the config's minibatch does not divide a smaller batch: the whole batch
        if args.minibatch is not None or any(s.startswith("rl.minibatch_size=") for s in args.set) \
                or "minibatch_size" not in str(e):
            raise
        log(f"[setup] {e}; using rl.minibatch_size=0 (the whole batch)")
        cfg = load_config(args.config, ov + args.set + ["rl.minibatch_size=0"])
    n_batch = cfg.rl.group_size * cfg.rl.tasks_per_step
    credit_info = cfg.rl.credit if "infopo" in cfg.rl.credit else "infopo"

    # --- the run's pieces, as jobs.prepare builds them
    rules = LogicalRules(make_mesh(cfg.mesh))
    tok = build_tokenizer(cfg)
    qcfg, params = build_model(cfg, tok, rules)
    make_env, train_tasks, _ = build_env(cfg)
    r = cfg.rollout
    park = r.park_rows if r.park_rows >= 0 else n_batch
    engine = GenerationEngine(params, qcfg, slots=r.slots, capacity=r.capacity, park_rows=park,
                              decode_steps=r.decode_steps, vocab_limit=tok.vocab_size)
    tx = make_optimizer(cfg.optim)
    state0 = place_on_mesh(TrainState.create(params, tx), rules.mesh)  # never donated: rounds start from a copy
    # the job's step: its shardings declared (jaxagent.jobs.phases.run_rl)
    shardings = StepShardings.of(state0, batch_sharding(rules, shape=(cfg.rl.minibatch_size or n_batch, 1)))

    def trainer(credit: str) -> RLTrainer:
        return RLTrainer(jax.tree.map(jnp.copy, state0), tx, config=qcfg, tokenizer=tok, make_env=make_env,
                         settings=dataclasses.replace(cfg.rl, credit=credit), ppo=cfg.ppo,
                         sampling=sampling_params(cfg, tok), episode=episode_config(cfg), engine=engine,
                         infopo=cfg.infopo, faca=cfg.faca, grpo=cfg.grpo, ref_params=params,
                         lr_schedule=learning_rate(cfg.optim), shardings=shardings)

    trainers = {"grpo": trainer("grpo"), "infopo": trainer(credit_info)}
    rng = step_rng(cfg.seed, "rl", 0)
    tasks = [train_tasks[j] for j in rng.choice(len(train_tasks), cfg.rl.tasks_per_step, replace=False)]
    key = step_key(cfg.seed, "rl", 0)
    k_roll = jax.random.split(key, 3)[0]
    log(f"[setup] {cfg.model.path or cfg.model.preset} ({param_count(params):,} params) on {jax.default_backend()}, "
        f"gym {cfg.env.gym}, {cfg.rl.tasks_per_step} tasks x {cfg.rl.group_size}, minibatch "
        f"{cfg.rl.minibatch_size or n_batch}, ppo_epochs {cfg.rl.ppo_epochs}, info-gain mode {cfg.infopo.mode}")

    def rollout():  # the policy of state0, whatever the trainers have done since
        trainers["grpo"].restore({"state": jax.tree.map(jnp.copy, state0), "ref": trainers["grpo"].ref_params})
        return trainers["grpo"].rollout(tasks, k_roll)

    # --- the batch
    compiles = CompileCounter()
    log("[rollout] engine warm-up (compiles every shape) + first rollout")
    t0 = time.perf_counter()
    with heartbeat("[rollout] warm-up + first rollout"):
        engine.warmup()
        trajs = rollout()
    log(f"[rollout] engine warm-up + first rollout {time.perf_counter() - t0:.1f}s")
    n_turns = max(len(t.action_spans()) for t in trajs)
    batch, _ = collate(trajs, multiple=cfg.rl.length_multiple, turns=max(n_turns, cfg.rollout.max_turns))
    ph_ids = trainers["infopo"].ph_ids
    packed = packed_length(batch, len(ph_ids), cfg.infopo.placeholder_mode, multiple=cfg.rl.length_multiple)
    B, L = batch.tokens_BL.shape
    n_valid = int(np.asarray(infogain_valid_turns(batch)).sum())
    n_tok = int(np.asarray(batch.pad_mask_BL).sum())
    log(f"[batch] {B} episodes x {L} padded tokens ({n_tok} real, {n_tok / B:.0f} per episode), "
        f"{n_turns} turns at most, {n_valid} info-gain turns, packed length {packed}")

    # --- rounds: the rollout again (same key: the same episodes), then GRPO and InfoPO credit +
    # update on the batch, in alternating order, each from the same initial state
    times = {m: {"train_s": [], "credit_s": [], "update_s": []} for m in trainers}
    roll_s, same, first, compiles_timed = [], True, {}, 0
    for rnd in range(args.warmup + args.reps):
        timed = rnd >= args.warmup
        t0 = time.perf_counter()
        again = rollout()
        dt = time.perf_counter() - t0
        same &= [t.tokens for t in again] == [t.tokens for t in trajs]
        if timed:
            roll_s.append(dt)
        log(f"[{'timed' if timed else 'warmup'} {rnd}] rollout: {dt:.3f}s")
        for m in (("grpo", "infopo") if rnd % 2 == 0 else ("infopo", "grpo")):
            tr = trainers[m]
            tr.restore({"state": jax.tree.map(jnp.copy, state0), "ref": tr.ref_params})
            jax.block_until_ready(tr.state)
            c0 = compiles.n
            t0 = time.perf_counter()
            metrics = tr.train_on(trajs, key)
            dt = time.perf_counter() - t0
            first.setdefault(m, dt)
            if timed:
                compiles_timed += compiles.n - c0
                times[m]["train_s"].append(dt)
                times[m]["credit_s"].append(metrics["time/credit_s"])
                times[m]["update_s"].append(metrics["time/update_s"])
            log(f"[{'timed' if timed else 'warmup'} {rnd}] {m}: {dt:.3f}s (credit "
                f"{metrics['time/credit_s']:.3f}, update {metrics['time/update_s']:.3f}; "
                f"updates {metrics['updates']}, skipped {metrics['skipped_updates']})")
    log(f"[rollout] the same episodes every time: {same}")

    # --- the information-gain pass alone (what InfoPO adds to the credit)
    def infogain():  # as RLTrainer calls it
        out = compute_infogain(state0.params, batch, ph_ids, config=qcfg, mode=cfg.infopo.mode,
                               placeholder_mode=cfg.infopo.placeholder_mode, packed_len=packed,
                               row_chunk=cfg.rl.score_rows or None)
        return jax.block_until_ready(out)

    out = infogain()
    ig_s = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        infogain()
        ig_s.append(time.perf_counter() - t0)
    log(f"[infogain] median {med(ig_s):.3f}s, {out.tokens_processed:,} tokens through the model")

    g, i = (med(times[m]["train_s"]) for m in ("grpo", "infopo"))
    rl = med(roll_s)
    res = {
        "bench": "step",
        "device": f"{jax.default_backend()}:{jax.devices()[0].device_kind}",
        "model": cfg.model.path or cfg.model.preset,
        "model_params": param_count(params),
        "dtype": cfg.model.dtype,
        "gym": cfg.env.gym,
        "tasks_per_step": cfg.rl.tasks_per_step,
        "group_size": cfg.rl.group_size,
        "minibatch_size": cfg.rl.minibatch_size or n_batch,
        "ppo_epochs": cfg.rl.ppo_epochs,
        "microbatches": cfg.rl.microbatches,
        "score_rows": cfg.rl.score_rows,
        "kl_coef": cfg.ppo.kl_coef,
        "infopo_credit": credit_info,
        "infogain_mode": cfg.infopo.mode,
        "placeholder_mode": cfg.infopo.placeholder_mode,
        "batch": B,
        "length": L,
        "packed_length": packed,
        "real_tokens": n_tok,
        "infogain_turns": n_valid,
        "infogain_tokens_processed": out.tokens_processed,
        "reps": args.reps,
        "rollout_median_s": rl,
        "rollout_s": roll_s,
        "rollout_same_episodes": bool(same),
        "grpo_train_median_s": g,
        "infopo_train_median_s": i,
        "grpo_credit_median_s": med(times["grpo"]["credit_s"]),
        "infopo_credit_median_s": med(times["infopo"]["credit_s"]),
        "grpo_update_median_s": med(times["grpo"]["update_s"]),
        "infopo_update_median_s": med(times["infopo"]["update_s"]),
        "infogain_alone_median_s": med(ig_s),
        "grpo_step_median_s": rl + g,
        "infopo_step_median_s": rl + i,
        "grpo_train_s": times["grpo"]["train_s"],
        "infopo_train_s": times["infopo"]["train_s"],
        "grpo_first_train_s": first["grpo"],
        "infopo_first_train_s": first["infopo"],
        "compiles_during_timed_rounds": compiles_timed,
        # per round (the two methods and the rollout timed back to back), median over rounds
        "paired_train_ratio_median": med([x / y for x, y in zip(times["infopo"]["train_s"], times["grpo"]["train_s"])]),
        "paired_step_ratio_median": med([(r_ + x) / (r_ + y) for r_, x, y in
                                         zip(roll_s, times["infopo"]["train_s"], times["grpo"]["train_s"])]),
        "load_average_1m": os.getloadavg()[0],
        "infopo_over_grpo_train_time": i / g,
        "infopo_over_grpo_step_time": (rl + i) / (rl + g),
        "jax_version": jax.__version__,
    }
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    t_start = time.perf_counter()
    main()
    sys.stdout.flush()
    print(f"bench_step: done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record them in "
          "docs/BENCHMARKS.md", file=sys.stderr, flush=True)

"""Does one RL update generalise? A diagnostic of the update rule, without a training run.

From a checkpoint (``model.path``), sample a training batch (``rl.tasks_per_step`` x ``rl.group_size``
episodes on training tasks) and, with other keys, a probe batch on other training tasks. For each
optimizer setting, apply ``--updates`` RL updates (`RLTrainer.train_on`, the run's credit and PPO
settings) on the training batch, then score the probe batch under the updated policy at the
training temperature: ``gap`` = mean change of the summed agent log-probs of the probe's
successful episodes minus that of its failed ones. A positive gap means the update moved the policy
towards success on episodes it was not computed from (what an RL step should do); a gap near 0 or
negative means the update is noise for the probe. Also the KL of the updated policy to the old one
on the probe's tokens, and the norm of the parameter change.

    python3 scripts/probe_rl_update.py model.path=runs/rl_learns_intention_s0_sft/hf \\
        --optim adam:3e-4 adam:1e-3 sgd:1.0 adam_eps1e-3:1e-3 adam:1e-3,neg=0.25

Prints one JSON object per setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jaxagent.jobs.config import load_config  # noqa: E402
from jaxagent.train.collate import collate  # noqa: E402
from jaxagent import jobs  # noqa: E402
from jaxagent.train.rl import RLTrainer  # noqa: E402
from jaxagent.train.step import OptimSettings, TrainState, make_optimizer  # noqa: E402


def log(msg: str) -> None:
    """Progress on stderr; stdout holds the JSON lines."""
    print(f"probe_rl_update: {msg}", file=sys.stderr, flush=True)


def heartbeat(what: str, every_s: float = 10.0):
    """A line on stderr every ``every_s`` seconds while ``what`` runs (`jaxagent.eval.progress.heartbeat`)."""
    from jaxagent.eval.progress import heartbeat as beat

    return beat(what, log, every_s)


def parse_optim(spec: str) -> tuple[OptimSettings, float | None]:
    """``name:lr[,neg=W]`` with name adam, sgd or adam_eps<eps> (Adam with that epsilon); ``neg``:
    ``grpo.negative_weight`` for this setting (default: the config's)."""
    spec, _, neg = spec.partition(",neg=")
    return _optim(spec), (float(neg) if neg else None)


def _optim(spec: str) -> OptimSettings:
    name, _, lr = spec.partition(":")
    if name == "sgd":
        return OptimSettings(name="sgd", lr=float(lr), clip_norm=1.0)
    if name.startswith("adam"):
        eps = float(name.split("eps", 1)[1]) if "eps" in name else 1e-8
        return OptimSettings(name="adamw", lr=float(lr), eps=eps, clip_norm=1.0)
    raise SystemExit(f"--optim {spec!r}: expected adam:LR, sgd:LR or adam_epsE:LR")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--optim", nargs="+", default=["adam:3e-4", "adam:1e-3", "sgd:1.0"])
    ap.add_argument("--updates", type=int, default=1)
    ap.add_argument("--probe-tasks", type=int, default=16)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    log(f"{len(args.optim)} optimizer setting(s) x {args.updates} update(s), probed on {args.probe_tasks} tasks; "
        "building the model, environment and engine")
    cfg = load_config(None, ["job=rl", "progress=false", "name=probe_rl_update", "runs_dir=/tmp/probe_rl_update",
                             "resume=false", *args.overrides])
    import shutil

    shutil.rmtree(Path(cfg.runs_dir) / cfg.name, ignore_errors=True)
    run = jobs.prepare(cfg)
    params0 = run.params

    def trainer_for(optim: OptimSettings, neg: float | None = None) -> RLTrainer:
        tx = make_optimizer(optim)
        grpo = cfg.grpo if neg is None else dataclasses.replace(cfg.grpo, negative_weight=neg)
        own = jax.tree.map(jnp.copy, params0)  # the update donates its state: params0 must survive
        return RLTrainer(TrainState.create(own, tx), tx, config=run.qcfg, tokenizer=run.tok,
                         make_env=run.make_env, settings=cfg.rl, ppo=cfg.ppo,
                         sampling=jobs.sampling_params(cfg, run.tok), episode=jobs.episode_config(cfg),
                         engine=run.engine, infopo=cfg.infopo, faca=cfg.faca, grpo=grpo)

    base = trainer_for(cfg.optim)
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(len(run.train_tasks))
    n = cfg.rl.tasks_per_step
    log(f"rolling out the training batch ({n} tasks x {cfg.rl.group_size}) and the probe batch ({args.probe_tasks} "
        f"tasks x {cfg.rl.group_size})")
    with heartbeat("rolling out"):
        train = base.rollout([run.train_tasks[i] for i in order[:n]], jax.random.key(cfg.seed))
        probe = base.rollout([run.train_tasks[i] for i in order[n : n + args.probe_tasks]],
                             jax.random.key(cfg.seed + 1))
    batch, _ = collate(probe, multiple=cfg.rl.length_multiple)
    ok = np.asarray([t.outcome_reward >= cfg.rl.success_threshold - 1e-9 for t in probe])
    mask = np.asarray(batch.loss_mask_BL) > 0
    lp0 = np.asarray(base.scores(params0, batch.tokens_BL))
    print(json.dumps({"train_success": float(np.mean([t.outcome_reward >= 1 - 1e-9 for t in train])),
                      "probe_success": float(ok.mean()), "probe_episodes": len(probe)}), flush=True)
    for spec in args.optim:
        log(f"{spec}: {args.updates} update(s), then the probe scored")
        t = trainer_for(*parse_optim(spec))
        with heartbeat(spec):
            for u in range(args.updates):
                m = t.train_on(train, jax.random.fold_in(jax.random.key(cfg.seed), u))
        lp1 = np.asarray(t.scores(t.state.params, batch.tokens_BL))
        d = np.where(mask, lp1 - lp0, 0.0).sum(axis=1)
        kl = float(np.where(mask, lp0 - lp1, 0.0).sum() / mask.sum())  # k1 estimate of KL(old || new)
        step = float(jnp.sqrt(sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(t.state.params),
                                                                          jax.tree.leaves(params0)))))
        gap = float(d[ok].mean() - d[~ok].mean()) if ok.any() and (~ok).any() else None
        print(json.dumps({"optim": spec, "updates": args.updates, "gap": gap,
                          "dlogp_success": float(d[ok].mean()) if ok.any() else None,
                          "dlogp_failure": float(d[~ok].mean()) if (~ok).any() else None,
                          "kl_old_new_per_token": kl, "param_step_norm": step,
                          "grad_cos_halves": m.get("update/grad_cos_halves")}), flush=True)
    log("done; results above (JSON lines on stdout: the batches, then one per optimizer setting)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

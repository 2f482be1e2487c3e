"""Where does a turn-level credit term push? A diagnostic of InfoPO's information-gain term.

From a checkpoint (``model.path``), sample ``--batches`` training batches (``rl.tasks_per_step`` x
``rl.group_size`` episodes each, different tasks and keys) and compute the run's credit on each as
`RLTrainer.train_on` would (`RLTrainer.credit`: no update). The info term on a token is the fused
advantage minus the outcome term (``A_BL - A_ext``; Faca off). Per episode its sum over the agent
tokens is the push the term gives that episode's actions: > 0 makes them likelier, < 0 less likely.
Reported, over all batches:

- ``net_info_per_token`` by outcome (``success``: reward >= ``rl.success_threshold``; ``failure``)
  and by group kind (``all_success``, ``all_failure``, ``mixed`` outcomes): the mean info term per
  agent token. A positive value on failures means the term makes failed episodes likelier;
- ``info_l1_share`` by group kind: where the term's mass goes;
- ``against_outcome``: in groups with unequal rewards, the share of episodes whose info push has
  the opposite sign to their centred outcome (``R_i - mean_g``): credit that contradicts the outcome;
- ``corr_info_reward_mixed``: Pearson correlation of the episode push with the reward, in those groups;
- ``l1_per_token`` of the info and outcome terms, and ``cancelling_share``: the share of the info
  term's L1 mass that cancels within episodes (1 - sum |push| / sum L1): credit moved between the
  turns of an episode rather than between episodes;
- ``a_info_by_turn``: the mean A_info at each turn index (before beta and the gate).

    python3 scripts/probe_credit.py model.path=runs/rl_learns_intention_s0_sft/hf rl.credit=infopo

Prints one JSON object. Settings: the quickstart's RL defaults, then ``key=value`` overrides.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import time
from pathlib import Path

import jax
import numpy as np

from jaxagent import jobs
from jaxagent.jobs.config import load_config
from jaxagent.jobs.phases import build_trainer


def episode_pushes(A_BL: np.ndarray, A_ext_B: np.ndarray, loss_mask_BL: np.ndarray):
    """Per episode, the info term ``A_BL - A_ext`` on its agent tokens: its sum (the push), its L1
    mass, the outcome term's L1 mass and the agent-token count. A_BL: [B, L]; A_ext_B: [B];
    loss_mask_BL: [B, L]. Returns (push_B, info_l1_B, ext_l1_B, n_B)."""
    agent = np.asarray(loss_mask_BL) != 0
    ext = np.where(agent, np.asarray(A_ext_B, np.float64)[:, None], 0.0)
    info = np.where(agent, np.asarray(A_BL, np.float64) - ext, 0.0)
    return info.sum(axis=1), np.abs(info).sum(axis=1), np.abs(ext).sum(axis=1), agent.sum(axis=1)


def by_turn(A_info_BT: np.ndarray, valid_BT: np.ndarray) -> list[float | None]:
    """The mean A_info of the valid turns at each turn index (``[B, T]`` arrays): what turn
    position alone gets."""
    A, v = np.asarray(A_info_BT, float), np.asarray(valid_BT, bool)
    return [float(A[v[:, t], t].mean()) if v[:, t].any() else None for t in range(A.shape[1])]


def summarise(push_B, n_B, reward_B, group_B, success_threshold: float) -> dict:
    """The figures of the module docstring from per-episode pushes (all [B] arrays, any number of
    batches concatenated; group ids unique across batches)."""
    push_B, n_B = np.asarray(push_B, float), np.asarray(n_B, float)
    reward_B, group_B = np.asarray(reward_B, float), np.asarray(group_B)
    ok = reward_B >= success_threshold - 1e-9
    kind = np.empty(len(reward_B), object)
    centred = np.zeros(len(reward_B))
    for g in np.unique(group_B):
        m = group_B == g
        kind[m] = "all_success" if ok[m].all() else "all_failure" if (~ok[m]).all() else "mixed"
        centred[m] = reward_B[m] - reward_B[m].mean()

    def per_token(m):
        return float(push_B[m].sum() / n_B[m].sum()) if n_B[m].sum() else None

    l1 = np.abs(push_B).sum()
    out = {"episodes": len(reward_B), "success_rate": float(ok.mean()),
           "net_info_per_token": {"success": per_token(ok), "failure": per_token(~ok)},
           "info_l1_share": {}, "group_share": {}}
    for k in ("all_success", "all_failure", "mixed"):
        m = kind == k
        out["net_info_per_token"][k] = per_token(m)
        out["info_l1_share"][k] = float(np.abs(push_B[m]).sum() / l1) if l1 else None
        out["group_share"][k] = float(len(np.unique(group_B[m])) / len(np.unique(group_B)))
    m = (kind == "mixed") & (centred != 0) & (push_B != 0)
    out["against_outcome"] = float(np.mean(np.sign(push_B[m]) != np.sign(centred[m]))) if m.any() else None
    mm = kind == "mixed"
    ok_corr = mm.sum() > 2 and np.std(push_B[mm]) > 0 and np.std(reward_B[mm]) > 0
    out["corr_info_reward_mixed"] = float(np.corrcoef(push_B[mm], reward_B[mm])[0, 1]) if ok_corr else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    cfg = load_config(None, ["job=rl", "progress=false", "name=probe_credit", "runs_dir=/tmp/probe_credit",
                             "resume=false", "rl.credit=infopo", *args.overrides])
    if cfg.rl.credit != "infopo":
        raise SystemExit(f"rl.credit={cfg.rl.credit!r}: this probe reads InfoPO's info term alone; expected infopo")
    shutil.rmtree(Path(cfg.runs_dir) / cfg.name, ignore_errors=True)
    t0 = time.perf_counter()
    say = functools.partial(print, file=sys.stderr, flush=True)
    say(f"[probe_credit] {args.batches} batches of {cfg.rl.tasks_per_step} tasks x {cfg.rl.group_size} episodes: "
        "building the model and engine")
    run = jobs.prepare(cfg)
    trainer = build_trainer(run, run.params)
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(len(run.train_tasks))
    n = cfg.rl.tasks_per_step
    cols: dict[str, list] = {"push": [], "info_l1": [], "ext_l1": [], "n": [], "reward": [], "group": []}
    a_info, valid = [], []
    for b in range(args.batches):
        key = jax.random.fold_in(jax.random.key(cfg.seed), b)
        trajs = trainer.rollout([run.train_tasks[i] for i in order[b * n : (b + 1) * n]], key)
        batch, A_BL, diag = trainer.credit(trajs, key)
        push, info_l1, ext_l1, cnt = episode_pushes(jax.device_get(A_BL), jax.device_get(diag["A_ext_B"]),
                                                    jax.device_get(batch.loss_mask_BL))
        for k, v in (("push", push), ("info_l1", info_l1), ("ext_l1", ext_l1), ("n", cnt)):
            cols[k] += list(v)
        a_info.append(np.asarray(diag["A_info_BT"]))
        valid.append(np.asarray(diag["info_valid_BT"]))
        cols["reward"] += [t.outcome_reward for t in trajs]
        cols["group"] += [b * n + t.group_id for t in trajs]
        say(f"[probe_credit] batch {b + 1}/{args.batches} done, {time.perf_counter() - t0:.0f} s")
    out = summarise(cols["push"], cols["n"], cols["reward"], cols["group"], cfg.rl.success_threshold)
    n_tok = float(np.sum(cols["n"]))
    out.update(l1_per_token={"info": float(np.sum(cols["info_l1"]) / n_tok),
                             "ext": float(np.sum(cols["ext_l1"]) / n_tok)},
               cancelling_share=float(1 - np.abs(cols["push"]).sum() / max(np.sum(cols["info_l1"]), 1e-12)),
               a_info_by_turn=by_turn(np.concatenate(a_info), np.concatenate(valid)))
    out.update(model=cfg.model.path, normalize_by=cfg.infopo.normalize_by, credit=cfg.rl.credit,
               infopo_negative_weight=cfg.infopo.negative_weight, grpo_negative_weight=cfg.grpo.negative_weight,
               batches=args.batches)
    print(json.dumps(out), flush=True)
    say(f"[probe_credit] done in {time.perf_counter() - t0:.0f} s; results above (JSON on stdout)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

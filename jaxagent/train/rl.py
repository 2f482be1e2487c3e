"""One RL iteration: rollouts -> credit -> PPO epochs over minibatches (host orchestration).

`RLTrainer.iteration(tasks, key)` plays ``group_size`` episodes per task through the in-flight
engine with the current policy, collates them into a `CreditBatch`, assigns credit with the
method chosen (``grpo``: the group-normalised outcome; ``infopo``: + beta * gate * A_info from the
teacher-forced information gain of each feedback; ``faca``: + lambda * A_proc from the user's
reactions; ``infopo+faca``: both), scores the batch under the frozen reference policy for the
KL term, and runs ``ppo_epochs`` passes of shuffled minibatches through the jitted update. The
old log-probs are the sampler's (the raw policy at sampling time, equal to teacher forcing).
`RLTrainer.train_on(trajs, key)` is the part after the rollout, on given episodes
(``scripts/bench_step.py`` times it for GRPO and InfoPO on one batch).

Per-iteration metrics: success (outcome >= ``success_threshold``), reward, turns, response
length, terminations, simulator failures, info-gain by turn index, gate, the update's metrics
(means over minibatches), rollout and update wall times and tokens/s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxagent.credit.fusion import InfoPOConfig, fuse
from jaxagent.credit.grpo import GRPOConfig
from jaxagent.credit.infogain import compute_infogain, packed_length
from jaxagent.credit.losses import PPOConfig
from jaxagent.credit.reaction import FacaConfig
from jaxagent.envs.base import Environment
from jaxagent.models.config import QwenConfig
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.loop import EpisodeConfig, run_episodes
from jaxagent.rollout.trajectory import Trajectory, collate
from jaxagent.text.chat import ChatRenderer
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.train.step import TrainState, make_update, ppo_loss_fn, sequence_scores

CreditMethod = Literal["grpo", "infopo", "faca", "infopo+faca"]
CREDIT_METHODS = ("grpo", "infopo", "faca", "infopo+faca")


@dataclasses.dataclass(frozen=True)
class RLSettings:
    credit: CreditMethod = "infopo"
    group_size: int = 5
    tasks_per_step: int = 4
    ppo_epochs: int = 1
    minibatch_size: int = 0  # 0: the whole batch in one update
    microbatches: int = 1  # gradient accumulation inside one update
    success_threshold: float = 1.0
    length_multiple: int = 128  # collated (and info-gain packed) lengths round up to this: few compiled shapes
    # Teacher-forced scoring outside the gradient (reference log-probs, the info-gain pass) runs
    # this many rows at a time (0: the whole batch at once); results equal to float32 rounding.
    score_rows: int = 8

    def validate(self) -> None:
        if self.credit not in CREDIT_METHODS:
            raise ValueError(f"credit={self.credit!r}: expected one of {', '.join(CREDIT_METHODS)}")
        for field in ("group_size", "tasks_per_step", "ppo_epochs", "microbatches", "length_multiple"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field}={getattr(self, field)}: expected an integer >= 1")
        batch = self.group_size * self.tasks_per_step
        mb = self.minibatch_size or batch
        if mb < 0 or batch % mb:
            raise ValueError(f"minibatch_size={self.minibatch_size}: expected 0 or a divisor of "
                             f"group_size * tasks_per_step = {batch}")
        if mb % self.microbatches:
            raise ValueError(f"microbatches={self.microbatches}: expected a divisor of the minibatch size {mb}")
        if self.score_rows < 0:
            raise ValueError(f"score_rows={self.score_rows}: expected 0 (all rows at once) or an integer >= 1")


def _jit_scores(config: QwenConfig, rows: int | None = None):
    return jax.jit(lambda p, t: sequence_scores(p, t, config=config, row_chunk=rows))


class RLTrainer:
    """Holds the policy state, the frozen reference, the engine and the jitted update."""

    def __init__(self, state: TrainState, tx: optax.GradientTransformation, *, config: QwenConfig,
                 tokenizer: Tokenizer, make_env: Callable[[], Environment], settings: RLSettings, ppo: PPOConfig,
                 sampling: SamplingParams, episode: EpisodeConfig, engine: GenerationEngine,
                 infopo: InfoPOConfig | None = None, faca: FacaConfig | None = None,
                 grpo: GRPOConfig = GRPOConfig(), ref_params: Any = None,
                 lr_schedule: optax.Schedule | None = None):
        settings.validate()
        self.state, self.config, self.tok = state, config, tokenizer
        self.make_env, self.settings, self.ppo = make_env, settings, ppo
        self.sampling, self.episode, self.engine = sampling, episode, engine
        use_info = settings.credit in ("infopo", "infopo+faca")
        use_faca = settings.credit in ("faca", "infopo+faca")
        self.infopo = (infopo or InfoPOConfig()) if use_info else None
        self.faca = (faca or FacaConfig()) if use_faca else None
        self.grpo = grpo
        # The frozen reference policy (KL term): a copy of the initial weights by default.
        self.ref_params = ref_params if ref_params is not None else jax.tree.map(jnp.copy, state.params)
        self.update = make_update(ppo_loss_fn(config, ppo), tx, microbatches=settings.microbatches, agg=ppo.agg,
                                  lr_schedule=lr_schedule)
        self.scores = _jit_scores(config, settings.score_rows or None)
        self._fuse = jax.jit(lambda b, r, k: fuse(b, r, self.infopo, self.faca, self.grpo, k))
        if self.infopo is not None:
            self.ph_ids = ChatRenderer(tokenizer).encode_content(self.infopo.placeholder)

    # ------------------------------------------------------------------ rollouts
    def rollout(self, tasks: Sequence[str], key: jax.Array) -> list[Trajectory]:
        self.engine.set_params(self.state.params)
        return asyncio.run(run_episodes(self.engine, self.make_env, self.tok, list(tasks),
                                        group_size=self.settings.group_size, sampling=self.sampling, key=key,
                                        config=self.episode))

    # ------------------------------------------------------------------ one iteration
    def iteration(self, tasks: Sequence[str], key: jax.Array) -> tuple[dict[str, float], list[Trajectory]]:
        """Rollouts of ``tasks`` with the current policy, then `train_on` them (same ``key``)."""
        k_roll = jax.random.split(key, 3)[0]
        t0 = time.perf_counter()
        trajs = self.rollout(tasks, k_roll)
        t_roll = time.perf_counter() - t0
        return self._train(trajs, key, t_roll), trajs

    def train_on(self, trajs: Sequence[Trajectory], key: jax.Array) -> dict[str, Any]:
        """Credit and PPO epochs on given episodes: the part of `iteration` after the rollout.

        ``key`` is the iteration's key: of its three splits the first is the rollout's (unused
        here), the second the credit's and the third the minibatch order's, so
        ``iteration(tasks, key)`` equals ``rollout(tasks, split(key, 3)[0])`` then
        ``train_on(trajs, key)``. Returns the metrics of `iteration` without the rollout's time
        (``tokens_per_s`` over credit and update only)."""
        return self._train(trajs, key, None)

    def _train(self, trajs: Sequence[Trajectory], key: jax.Array, t_roll: float | None) -> dict[str, Any]:
        _, k_credit, k_perm = jax.random.split(key, 3)
        t1 = time.perf_counter()
        # Turns padded to the episode limit (padded turns are invalid: no credit, no statistic), so
        # the credit's compiled shapes depend on the lengths only, not on each batch's longest episode.
        n_turns = max(1, max(len(t.action_spans()) for t in trajs))
        batch, old_lp = collate(trajs, multiple=self.settings.length_multiple,
                                turns=max(n_turns, self.episode.max_turns))
        tokens = batch.tokens_BL
        r_info = None
        if self.infopo is not None:
            packed = packed_length(batch, len(self.ph_ids), self.infopo.placeholder_mode,
                                   multiple=self.settings.length_multiple)
            out = compute_infogain(self.state.params, batch, self.ph_ids, config=self.config, mode=self.infopo.mode,
                                   placeholder_mode=self.infopo.placeholder_mode, packed_len=packed,
                                   row_chunk=self.settings.score_rows or None)
            r_info = out.r_info_BT
        A_BL, diag = self._fuse(batch, r_info, k_credit)
        data = {"tokens": tokens, "loss_mask": batch.loss_mask_BL, "advantages": A_BL,
                "old_logp": jnp.asarray(old_lp)}
        if self.ppo.kl_coef > 0:
            data["ref_logp"] = self.scores(self.ref_params, tokens)
        jax.block_until_ready(data)  # time the credit here, not in the first update
        t_credit = time.perf_counter() - t1

        t2 = time.perf_counter()
        B = tokens.shape[0]
        mb = self.settings.minibatch_size or B
        upd: list[dict[str, jax.Array]] = []
        rng = np.random.default_rng(np.asarray(jax.random.key_data(k_perm)).astype(np.uint64))
        for _ in range(self.settings.ppo_epochs):
            order = rng.permutation(B)
            for s in range(0, B, mb):
                idx = order[s : s + mb]
                self.state, m = self.update(self.state, {k: v[idx] for k, v in data.items()})
                upd.append(m)
        upd_host = jax.device_get(upd)
        t_update = time.perf_counter() - t2

        metrics = episode_metrics(trajs, self.settings.success_threshold)
        for k in upd_host[0]:
            metrics[f"update/{k}"] = float(np.mean([m[k] for m in upd_host]))
        if self.infopo is not None:
            valid = np.asarray(diag["info_valid_BT"])
            r = np.asarray(diag["r_info_BT"])
            metrics["info/gain_mean"] = float(r[valid].mean()) if valid.any() else 0.0
            metrics["info/gate_mean"] = float(np.mean(np.asarray(diag["gate_B"])))
            metrics["info/l1_share"] = float(diag["info_l1_share"])
            metrics["info/gain_by_turn"] = [float(r[:, t][valid[:, t]].mean()) if valid[:, t].any() else None
                                            for t in range(n_turns)]
        if self.faca is not None:
            for k, v in diag.items():
                if k.startswith("faca/") and np.ndim(v) == 0:
                    metrics[k] = float(v)
        n_tok = int(np.asarray(batch.pad_mask_BL).sum())
        if t_roll is not None:
            metrics["time/rollout_s"] = t_roll
        metrics.update({"time/credit_s": t_credit, "time/update_s": t_update,
                        "tokens": n_tok, "tokens_per_s": n_tok / max((t_roll or 0.0) + t_credit + t_update, 1e-9),
                        "updates": int(self.state.step), "skipped_updates": int(self.state.skipped)})
        return metrics


def episode_metrics(trajs: Sequence[Trajectory], success_threshold: float = 1.0) -> dict[str, Any]:
    """Success rate, reward, turns, response lengths and terminations of a list of episodes."""
    rewards = np.asarray([t.outcome_reward for t in trajs], np.float64)
    turns = np.asarray([len(t.action_spans()) for t in trajs], np.float64)
    gen = np.asarray([sum(e - s for s, e in t.action_spans()) for t in trajs], np.float64)
    per_turn = gen / np.maximum(turns, 1)
    out: dict[str, Any] = {
        "episodes": len(trajs),
        "success": float(np.mean(rewards >= success_threshold - 1e-9)),
        "reward": float(rewards.mean()),
        "turns": float(turns.mean()),
        "response_tokens": float(per_turn.mean()),
        "episode_tokens": float(np.mean([len(t.tokens) for t in trajs])),
        "simulator_failures": int(sum(t.termination == "simulator_failure" for t in trajs)),
        "format_errors": int(sum(t.info.get("format_errors", 0) for t in trajs)),
        "tool_errors": int(sum(t.info.get("tool_errors", 0) for t in trajs)),
    }
    for term in sorted({t.termination for t in trajs}):
        out[f"termination/{term}"] = int(sum(t.termination == term for t in trajs))
    # InfoPO's length-reward correlation diagnostic (0 when either side is constant)
    if len(trajs) > 1 and gen.std() > 0 and rewards.std() > 0:
        out["length_reward_corr"] = float(np.corrcoef(gen, rewards)[0, 1])
    else:
        out["length_reward_corr"] = 0.0
    return out


__all__ = ["CREDIT_METHODS", "RLSettings", "RLTrainer", "episode_metrics"]

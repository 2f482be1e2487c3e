"""One RL iteration: rollouts -> credit -> PPO epochs over minibatches (host orchestration).

`RLTrainer.iteration(tasks, key)` plays ``group_size`` episodes per task through the in-flight
engine with the current policy, collates them into a `CreditBatch`, assigns credit with the
registered credit terms ``rl.credit`` names (`jaxagent.credit.registry`; ``grpo``: the
group-normalised outcome, always present; ``infopo``: + beta * gate * A_info from the
teacher-forced information gain of each feedback; ``faca``: + lambda * A_proc from the user's
reactions; ``infopo+faca``: both; the host inputs a term ``needs`` come from `CREDIT_INPUTS`),
scores the batch under the frozen reference policy for the KL term, and runs ``ppo_epochs``
passes of shuffled minibatches through the jitted update. The
distribution trained is the sampler's (`sampler_view`: the policy at ``rollout.temperature``,
limited to the tokenizer's ids): the old log-probs are the sampler's own, and the update, the
reference and the info gain teacher-force at the same temperature, so the first minibatch's
ratio is 1 at any temperature (top-k / top-p sampling is refused for training).
`RLTrainer.train_on(trajs, key)` is the part after the rollout, on given episodes
(``scripts/bench_step.py`` times it for GRPO and InfoPO on one batch).

Per-iteration metrics: success (outcome >= ``success_threshold``), reward, turns, response
length, terminations, simulator failures, info-gain by turn index, gate, the update's metrics
(means over minibatches), rollout and update wall times and tokens/s; the simulator's calls as
``sim/*`` (`episode_metrics`).

**Simulator failures.** An episode that ended in ``simulator_failure`` says nothing about the
policy: by default (``train_on_failed=False``) it is left out of the credit batch and of its
group's statistics, and counted (``sim/failed_episodes``, ``sim/excluded_episodes``). Its row
becomes an empty padding row (no tokens: no group statistic, no advantage, no loss), so the
batch keeps its shape and nothing recompiles. A group left with fewer members is normalised
over the ones left (the group statistics are segment sums over valid rows); a group left with
one member gets outcome advantage 0 (a degenerate group, `jaxagent.credit.grpo`) but keeps its
turn-level InfoPO/Faca terms. The PPO epochs then run ``ceil(kept / minibatch_size)``
minibatches of the usual size, the last one filled up with padding rows (which weigh nothing
under the token- and sequence-mean aggregations; ``seq_mean_token_sum_norm``'s constant
normaliser counts them as rows). When every episode failed the update is skipped
(``sim/update_skipped`` = 1) and the iteration is still recorded. `FailureBudget` stops a run
whose simulator keeps failing (`SimulatorFailureBudget`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxagent.credit.fusion import fuse_terms
from jaxagent.credit.grpo import GRPOConfig
from jaxagent.credit.infopo import InfoPOConfig
from jaxagent.credit.losses import PPOConfig, truncated_is_weights
from jaxagent.credit.reaction import FacaConfig
from jaxagent.credit.registry import make_terms, parse_credit
from jaxagent.credit.terms import CreditTerm
from jaxagent.models.config import QwenConfig
from jaxagent.models.generate import SamplingParams
from jaxagent.models.sharding import LogicalRules, place_rows, row_rules
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.metrics import episode_metrics, failure_causes
from jaxagent.rollout.processes import ProcessGroup, play_episodes
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.text.chat import ChatRenderer
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.train.collate import collate_host
from jaxagent.train.infogain import compute_infogain, marginal_infogain
from jaxagent.train.step import StepShardings, TrainState, make_update, ppo_loss_fn, sequence_scores
from jaxagent.train.why import why_metrics

#: The fusion diagnostics `why_metrics` reads.
WHY_INPUTS = ("A_info_BT", "info_valid_BT", "r_info_BT", "A_proc_BQ")

#: ``rl.behaviour_correction``: what the PPO ratio is taken against (`RLSettings`).
BEHAVIOUR_CORRECTIONS = ("ratio", "truncated_is")


@dataclasses.dataclass(frozen=True)
class RLSettings:
    # registered credit terms joined by '+' (jaxagent.credit.registry): grpo, infopo, faca, infopo+faca, ...
    credit: str = "infopo"
    group_size: int = 5
    tasks_per_step: int = 4
    ppo_epochs: int = 1
    minibatch_size: int = dataclasses.field(default=0, metadata={
        "help": "episodes per PPO update, a divisor of the batch (group_size x tasks_per_step); 0: the whole batch "
                "in one update"})
    microbatches: int = dataclasses.field(default=1, metadata={
        "help": "gradient accumulation: each update's episodes in this many parts"})
    success_threshold: float = 1.0
    length_multiple: int = 128  # collated (and info-gain packed) lengths round up to this: few compiled shapes
    # Teacher-forced scoring outside the gradient (reference log-probs, the info-gain pass) runs
    # this many rows at a time (0: the whole batch at once); results equal to float32 rounding.
    score_rows: int = 8
    # The run stops (TrainingFailed, a non-zero exit) when more than this share of its RL updates
    # so far were skipped for a non-finite loss or gradient (checked after each iteration once 4
    # updates were made, and at the end; 1: never).
    max_skipped_share: float = 0.5
    # A fired collapse diagnostic (summary.json "collapse": true, `report.infopo_diagnostics`)
    # ends the job with a non-zero exit, after the summary is written.
    fail_on_collapse: bool = True
    # Episodes that ended in simulator_failure: left out of the credit batch (False), or trained
    # on with outcome 0 (True).
    train_on_failed: bool = False
    # The failure budget: the job stops (SimulatorFailureBudget) after failure_budget_iters
    # consecutive iterations in each of which more than failure_share of the episodes ended in
    # simulator_failure (failure_budget_iters=0: never).
    failure_share: float = 0.5
    failure_budget_iters: int = 3
    max_staleness: int = dataclasses.field(default=0, metadata={
        "help": "asynchronous RL (jaxagent.train.async_rl): episodes keep running while the update is computed; a "
                "batch takes finished groups whose oldest turn is at most this many policy versions old (older "
                "ones are dropped and counted); 0: the synchronous loop"})
    behaviour_correction: str = dataclasses.field(default="ratio", metadata={
        "help": "ratio: the PPO ratio against the log-probs the tokens were sampled with (the behaviour policy); "
                "truncated_is: the ratio against the weights at the start of the update, each token weighted by "
                "min(pi_start / mu, rl.is_cap)"})
    is_cap: float = dataclasses.field(default=2.0, metadata={
        "help": "rl.behaviour_correction=truncated_is: the cap of the importance weights (> 0)"})

    def rows_scored_at_a_time(self, rows: int) -> int:
        """The rows the scorer and the info gain run at a time over a batch of ``rows``:
        ``score_rows``, or all of them when it is 0 or at least ``rows``."""
        return self.score_rows if 0 < self.score_rows < rows else rows

    def __post_init__(self) -> None:
        parse_credit(self.credit)  # registered terms, each once
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
        _check_share("max_skipped_share", self.max_skipped_share, "the share of updates that may be skipped for "
                     "non-finite values before the run stops; 1: never stop")
        if not isinstance(self.fail_on_collapse, bool):
            raise ValueError(f"fail_on_collapse={self.fail_on_collapse!r}: expected a bool")
        if not isinstance(self.train_on_failed, bool):
            raise ValueError(f"train_on_failed={self.train_on_failed!r}: expected a bool")
        _check_share("failure_share", self.failure_share, "the share of an iteration's episodes that may fail "
                     "before the iteration counts against the failure budget")
        iters = self.failure_budget_iters
        if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
            raise ValueError(f"failure_budget_iters={iters!r}: expected an integer >= 0 (consecutive failing "
                             "iterations that stop the run; 0: never stop)")
        k = self.max_staleness
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"max_staleness={k!r}: expected an integer >= 0 (policy versions a trained turn may "
                             "lag the update; 0: the synchronous loop)")
        if self.behaviour_correction not in BEHAVIOUR_CORRECTIONS:
            raise ValueError(f"behaviour_correction={self.behaviour_correction!r}: expected one of "
                             f"{BEHAVIOUR_CORRECTIONS}")
        cap = self.is_cap
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0 or cap == float("inf"):
            raise ValueError(f"is_cap={cap!r}: expected a finite number > 0 (the truncated importance weights' cap)")


def _check_share(name: str, share: Any, what: str) -> None:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
        raise ValueError(f"{name}={share!r}: expected a number in [0, 1] ({what})")


def _jit_scores(config: QwenConfig, rows: int | None = None, rules: LogicalRules | None = None, **view):
    return jax.jit(lambda p, t: sequence_scores(p, t, config=config, row_chunk=rows, rules=rules, **view))


def sampler_view(sampling: SamplingParams, vocab_size: int, model_vocab: int) -> dict[str, Any]:
    """The distribution RL trains: the policy as ``sampling`` draws from it (``temperature``, and
    ``vocab_limit`` when the tokenizer has fewer ids than the model's embedding), so that the
    teacher-forced log-probs of the update, of the reference and of the info gain are those of the
    sampler, and the first update's ratio is 1. Raises `ValueError` naming the ``rollout.*`` key
    for settings whose sampling distribution teacher forcing does not reproduce: greedy decoding
    (no distribution) and the top-k / top-p filters (a truncated distribution: every sampled token
    would get a biased ratio and gradient)."""
    if not sampling.temperature > 0:
        raise ValueError(f"rollout.temperature={sampling.temperature}: RL trains on sampled episodes; greedy "
                         "decoding (0) has no sampling distribution (every episode of a group would be the same). "
                         "Expected a temperature > 0 (1: the policy itself)")
    if sampling.top_k:
        raise ValueError(f"rollout.top_k={sampling.top_k}: RL's old and new log-probs are those of the tempered "
                         "policy; a top-k filter samples from a truncated distribution they do not describe. "
                         "Expected rollout.top_k=0 for RL (evaluation may filter)")
    if sampling.top_p < 1.0:
        raise ValueError(f"rollout.top_p={sampling.top_p}: RL's old and new log-probs are those of the tempered "
                         "policy; a nucleus filter samples from a truncated distribution they do not describe. "
                         "Expected rollout.top_p=1 for RL (evaluation may filter)")
    limit = vocab_size if vocab_size < model_vocab else None
    return {"temperature": float(sampling.temperature), "vocab_limit": limit}


class RLTrainer:
    """Holds the policy state, the frozen reference, the engine and the jitted update."""

    def __init__(self, state: TrainState, tx: optax.GradientTransformation, *, config: QwenConfig,
                 tokenizer: Tokenizer, make_env: Callable[[], Any], settings: RLSettings, ppo: PPOConfig,
                 sampling: SamplingParams, episode: EpisodeConfig, engine: GenerationEngine,
                 infopo: InfoPOConfig | None = None, faca: FacaConfig | None = None,
                 grpo: GRPOConfig = GRPOConfig(), ref_params: Any = None,
                 lr_schedule: optax.Schedule | None = None, shardings: StepShardings | None = None,
                 processes: ProcessGroup | None = None, term_settings: Mapping[str, Any] | None = None,
                 rules: LogicalRules | None = None):
        """``make_env()`` gives each episode a fresh environment (the runner's, `jaxagent.rollout`:
        training code never touches one). ``settings.credit`` names the credit terms
        (`jaxagent.credit.registry.parse_credit`): the built-in ones take ``grpo`` / ``infopo`` /
        ``faca``, any other registered term ``term_settings[name]`` (else its settings type's defaults).
        ``rules``: the run's mesh rules; on a mesh of several devices (one process's) the iteration's
        rows are split over its batch axes for the credit and the scorer (`place_rows`), each device
        scoring its own."""
        # the sampler's distribution: what the update, the reference and the info gain score
        self.view = sampler_view(sampling, tokenizer.vocab_size, config.vocab_size)
        self.state, self.config, self.tok = state, config, tokenizer
        self.make_env, self.settings, self.ppo = make_env, settings, ppo
        self.sampling, self.episode, self.engine = sampling, episode, engine
        self.terms: tuple[CreditTerm, ...] = make_terms(
            parse_credit(settings.credit, key="rl.credit"),
            {**(term_settings or {}), "grpo": grpo, "infopo": infopo, "faca": faca})
        missing = sorted({n for term in self.terms for n in term.needs} - set(CREDIT_INPUTS))
        if missing:
            raise ValueError(f"rl.credit={settings.credit!r}: the terms need inputs {missing} that no provider makes; "
                             f"expected one of {sorted(CREDIT_INPUTS)} (register_credit_input)")
        self._placeholders: dict[str, list[int]] = {}
        self.iteration_index = 0  # the RL iteration being trained (`iteration` / `train_on` set it)
        self.polarity = faca.polarity_map() if faca is not None else None  # Faca's label -> polarity
        # The frozen reference policy (KL term): a copy of the initial weights by default.
        self.ref_params = ref_params if ref_params is not None else jax.tree.map(jnp.copy, state.model_params)
        self.shardings = shardings
        self.processes = processes  # several: each plays its share of the episodes, all train on all
        # On a mesh: the rows placed over the batch axes, and each program given the rules when
        # the rows it runs at a time split evenly there (`row_rules`). Not on a mesh across
        # processes: the host reads the credit's outputs, whose rows would partly live elsewhere.
        multi = rules is not None and rules.mesh.is_multi_process
        self.rules = rules if rules is not None and rules.mesh.size > 1 and not multi else None
        n_rows = settings.group_size * settings.tasks_per_step
        self.score_rules = row_rules(self.rules, settings.rows_scored_at_a_time(n_rows))  # scorer, info gain
        per_micro = (settings.minibatch_size or n_rows) // settings.microbatches
        self.update = make_update(ppo_loss_fn(config, ppo, rules=row_rules(self.rules, per_micro), **self.view), tx,
                                  microbatches=settings.microbatches, agg=ppo.agg, lr_schedule=lr_schedule,
                                  shardings=shardings)
        self.scores = _jit_scores(config, settings.score_rows or None, rules=self.score_rules, **self.view)
        self._fuse = jax.jit(lambda b, inputs, k: fuse_terms(b, self.terms, inputs, k))

    def placeholder_ids(self, text: str) -> list[int]:
        """The token ids of a counterfactual placeholder's content (cached per text)."""
        if text not in self._placeholders:
            self._placeholders[text] = ChatRenderer(self.tok).encode_content(text)
        return self._placeholders[text]

    @property
    def ph_ids(self) -> list[int]:
        """The InfoPO term's placeholder ids (`placeholder_ids` of its ``placeholder``)."""
        info = [t for t in self.terms if "r_info" in t.needs]
        if not info:
            raise AttributeError("ph_ids: no credit term of this trainer needs the information gain")
        return self.placeholder_ids(info[0].settings.placeholder)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_tree(self) -> dict[str, Any]:
        """What a checkpoint holds: the train state and the frozen reference."""
        return {"state": self.state, "ref": self.ref_params}

    def restore(self, tree: dict[str, Any]) -> None:
        """Continues from a `checkpoint_tree` (restored onto this trainer's shardings)."""
        self.state, self.ref_params = tree["state"], tree["ref"]

    # ------------------------------------------------------------------ rollouts
    def rollout(self, tasks: Sequence[str], key: jax.Array) -> list[Trajectory]:
        self.engine.set_params(self.state.model_params, version=self.iteration_index)  # updates made so far
        return play_episodes(self.engine, self.make_env, self.tok, tasks, group_size=self.settings.group_size,
                             sampling=self.sampling, key=key, config=self.episode, processes=self.processes)

    # ------------------------------------------------------------------ one iteration
    def iteration(self, tasks: Sequence[str], key: jax.Array, index: int = 0
                  ) -> tuple[dict[str, float], list[Trajectory]]:
        """Rollouts of ``tasks`` with the current policy, then `train_on` them (same ``key``);
        ``index``: the iteration's number in the run (InfoPO's beta decay reads it)."""
        self.iteration_index = int(index)
        k_roll = jax.random.split(key, 3)[0]
        t0 = time.perf_counter()
        trajs = self.rollout(tasks, k_roll)
        t_roll = time.perf_counter() - t0
        return self._train(trajs, key, t_roll), trajs

    def train_on(self, trajs: Sequence[Trajectory], key: jax.Array, index: int = 0,
                 rollout_s: float | None = None) -> dict[str, Any]:
        """Credit and PPO epochs on given episodes: the part of `iteration` after the rollout.

        ``key`` is the iteration's key: of its three splits the first is the rollout's (unused
        here), the second the credit's and the third the minibatch order's, so
        ``iteration(tasks, key)`` equals ``rollout(tasks, split(key, 3)[0])`` then
        ``train_on(trajs, key)``. Returns the metrics of `iteration` without the rollout's time
        (``tokens_per_s`` over credit and update only), or with ``rollout_s`` (the seconds the
        episodes took to come, e.g. asynchronous RL's wait for them) that time as ``time/rollout_s``.
        ``index``: as `iteration`'s."""
        self.iteration_index = int(index)
        return self._train(trajs, key, rollout_s)

    def credit(self, trajs: Sequence[Trajectory], key: jax.Array) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
        """The batch, the fused per-token advantage ``A_BL`` and its diagnostics (`fuse`) for
        ``trajs`` under the current policy, as `train_on` computes them with the same ``key``
        (no update). For diagnostics: where each credit term goes (scripts/probe_credit.py)."""
        batch, _, A_BL, diag, _ = self._credit(list(trajs), jax.random.split(key, 3)[1], _turns(trajs))
        return batch, A_BL, diag

    def _credit(self, rows: Sequence[Trajectory], k_credit: jax.Array, n_turns: int):
        # Turns padded to the episode limit (padded turns are invalid: no credit, no statistic), so
        # the credit's compiled shapes depend on the lengths only, not on each batch's longest episode.
        host = collate_host(rows, multiple=self.settings.length_multiple, turns=max(n_turns, self.episode.max_turns),
                            polarity=self.polarity)
        if self.processes is not None:  # several processes: each reads its rows from its own copy
            self.processes.check_same("the RL batch", host.tokens_BL, host.loss_mask_BL, host.logprobs_BL)
        batch = host.credit_batch()
        if self.rules is not None:  # each device its own rows (the info gain, the scorer)
            batch = place_rows(batch, self.rules)
        inputs: dict[str, jax.Array] = {}
        for term in self.terms:  # the host inputs the terms need, each made once
            for name in term.needs:
                if name not in inputs:
                    inputs[name] = CREDIT_INPUTS[name](self, batch, host, term)
        A_BL, diag = self._fuse(batch, inputs, k_credit)
        return batch, host, A_BL, diag, inputs

    def _train(self, trajs: Sequence[Trajectory], key: jax.Array, t_roll: float | None) -> dict[str, Any]:
        _, k_credit, k_perm = jax.random.split(key, 3)
        t1 = time.perf_counter()
        metrics = episode_metrics(trajs, self.settings.success_threshold)
        # Failed episodes out (module docstring): their rows become empty padding rows at the end.
        kept = [t for t in trajs if self.settings.train_on_failed or t.termination != "simulator_failure"]
        n_kept = len(kept)
        metrics["sim/excluded_episodes"] = len(trajs) - n_kept
        metrics["sim/update_skipped"] = int(n_kept == 0)
        if n_kept == 0:  # nothing to learn from: no update, the iteration still recorded
            if t_roll is not None:
                metrics["time/rollout_s"] = t_roll
            metrics.update({"time/credit_s": 0.0, "time/update_s": 0.0, "tokens": 0, "tokens_per_s": 0.0,
                            "updates": int(self.state.step), "skipped_updates": int(self.state.skipped),
                            "update/skipped": 0.0, "update/skipped_total": int(self.state.skipped)})
            return metrics
        rows = kept + [_padding_row() for _ in range(len(trajs) - n_kept)]
        n_turns = _turns(kept)
        batch, host, A_BL, diag, inputs = self._credit(rows, k_credit, n_turns)
        record_turn_credit(kept, host, A_BL, {k: v for k, v in inputs.items() if getattr(v, "ndim", 0) == 2})
        tokens = batch.tokens_BL
        data = {"tokens": tokens, "loss_mask": batch.loss_mask_BL, "advantages": A_BL,
                "old_logp": jnp.asarray(host.logprobs_BL)}
        if self.ppo.kl_coef > 0:
            data["ref_logp"] = self.scores(self.ref_params, tokens)
        if self.settings.behaviour_correction == "truncated_is":  # decoupled PPO (jaxagent.train.async_rl)
            prox = self.scores(self.state.model_params, tokens)
            data["is_weight"], cut = truncated_is_weights(prox, data["old_logp"], batch.loss_mask_BL,
                                                          cap=self.settings.is_cap, max_log_ratio=self.ppo.max_log_ratio)
            data["old_logp"] = prox
            metrics["update/is_truncated_share"] = float(jnp.sum(cut) / jnp.maximum(jnp.sum(batch.loss_mask_BL != 0), 1))
        jax.block_until_ready(data)  # time the credit here, not in the first update
        t_credit = time.perf_counter() - t1

        t2 = time.perf_counter()
        B = tokens.shape[0]
        mb = self.settings.minibatch_size or B
        # ceil(kept / mb) minibatches of mb rows, the last filled up with padding rows (weightless)
        n_rows = -(-n_kept // mb) * mb
        fill = np.arange(n_kept, B)[: n_rows - n_kept]
        upd: list[dict[str, jax.Array]] = []
        rng = np.random.default_rng(np.asarray(jax.random.key_data(k_perm)).astype(np.uint64))
        for _ in range(self.settings.ppo_epochs):
            order = np.concatenate([rng.permutation(n_kept), fill]).astype(np.int64)
            for s in range(0, n_rows, mb):
                idx = order[s : s + mb]
                minibatch = {k: v[idx] for k, v in data.items()}
                if self.shardings is not None:
                    minibatch = self.shardings.put_batch(minibatch)
                self.state, m = self.update(self.state, minibatch)
                upd.append(m)
        upd_host = jax.device_get(upd)
        t_update = time.perf_counter() - t2

        for k in upd_host[0]:
            metrics[f"update/{k}"] = float(np.mean([m[k] for m in upd_host]))
        metrics.update(credit_metrics(diag, n_turns))
        why = jax.device_get({k: diag[k] for k in WHY_INPUTS if k in diag})  # one transfer
        metrics.update(why_metrics(why, host, [t.info.get("partial") for t in rows]))
        # Per iteration (not a mean of the running counter): updates refused in it, and in the run so far.
        metrics["update/skipped"] = float(sum(float(m["skipped"]) for m in upd_host))
        metrics["update/skipped_total"] = int(self.state.skipped)
        n_tok = int(np.asarray(batch.pad_mask_BL).sum())
        if t_roll is not None:
            metrics["time/rollout_s"] = t_roll
        metrics.update({"time/credit_s": t_credit, "time/update_s": t_update,
                        "tokens": n_tok, "tokens_per_s": n_tok / max((t_roll or 0.0) + t_credit + t_update, 1e-9),
                        "updates": int(self.state.step), "skipped_updates": int(self.state.skipped)})
        return metrics


def turn_means(values_BL: np.ndarray, turn_idx_BL: np.ndarray, mask_BL: np.ndarray, T: int) -> np.ndarray:
    """[B, T] float64: the mean of ``values_BL`` [B, L] over each action turn's tokens (``turn_idx_BL``
    == t where ``mask_BL`` is set), NaN for a turn with no such token."""
    B, _ = values_BL.shape
    sel = (turn_idx_BL >= 0) & (turn_idx_BL < T) & (np.asarray(mask_BL) > 0)
    flat = (np.arange(B)[:, None] * T + np.where(sel, turn_idx_BL, 0))[sel]
    total = np.bincount(flat, weights=np.asarray(values_BL, np.float64)[sel], minlength=B * T)
    count = np.bincount(flat, minlength=B * T)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / count).reshape(B, T)


def record_turn_credit(trajs: Sequence[Trajectory], host, A_BL: jax.Array, turn_inputs: Mapping[str, jax.Array]) -> None:
    """Writes each episode's credit per action turn into ``info["credit"]`` (what its trajectory
    record and the W&B table show): ``advantage``, the fused per-token advantage averaged over the
    turn's tokens, and each [B, T] host input the credit terms used (``r_info``: InfoPO's information
    gain of the turn). Rows ``len(trajs)`` onwards (padding) are ignored; None where a turn has no value."""
    n = len(trajs)
    host_arrays = jax.device_get({"advantage": A_BL, **turn_inputs})
    T = int(host.turn_valid_BT.shape[1])
    per_turn = {"advantage": turn_means(np.asarray(host_arrays.pop("advantage")), host.turn_idx_BL, host.loss_mask_BL, T)}
    per_turn.update({k: np.asarray(v, np.float64) for k, v in host_arrays.items()})
    for b, t in enumerate(trajs[:n]):
        turns = len(t.action_spans())
        t.info["credit"] = {k: [None if not np.isfinite(x) else round(float(x), 6) for x in v[b, :turns]]
                            for k, v in per_turn.items()}


def credit_metrics(diag: Mapping[str, Any], turns: int) -> dict[str, Any]:
    """The RL metrics of a fusion's diagnostics: ``credit/cover/*`` and ``credit/zero_adv_group_share``,
    and every other key holding a ``/`` (a term's own, e.g. ``info/gain_mean``, ``faca/proc_l1_share``):
    a scalar as a float, a 1-D array (per action turn) as a list of its first ``turns`` entries,
    None where NaN (no valid turn of that index)."""
    out: dict[str, Any] = {}
    logged = jax.device_get({k: v for k, v in diag.items() if "/" in k or k == "zero_adv_group_share"})  # one transfer
    for k, v in logged.items():
        if k.startswith("cover/") or k == "zero_adv_group_share":
            out[f"credit/{k}"] = float(v)
        elif "/" in k:
            a = np.asarray(v)
            if a.ndim == 0:
                out[k] = float(a)
            elif a.ndim == 1:
                out[k] = [None if x != x else float(x) for x in a[:turns].tolist()]
    return out


def _infogain_input(trainer: RLTrainer, batch, host, term: CreditTerm) -> jax.Array:
    """``r_info`` [B, T]: the teacher-forced information gain of every turn under the current
    policy, scored as the sampler draws (temperature and vocabulary limit): against the term's
    placeholder (`compute_infogain`, with its mode and placeholder mode; the packed length from
    the host arrays, no device round trip), or with ``prior="marginal"`` against the mixture over
    the replies the environment enumerated (`marginal_infogain`)."""
    s = term.settings
    if getattr(s, "prior", "placeholder") == "marginal":
        return marginal_infogain(trainer.state.model_params, host, config=trainer.config,
                                 rows=trainer.settings.score_rows or 8, multiple=trainer.settings.length_multiple,
                                 **trainer.view).r_info_BT
    out = compute_infogain(trainer.state.model_params, batch, trainer.placeholder_ids(s.placeholder),
                           config=trainer.config, mode=s.mode, placeholder_mode=s.placeholder_mode, host=host,
                           packed_multiple=trainer.settings.length_multiple,
                           row_chunk=trainer.settings.score_rows or None, rules=trainer.score_rules,
                           **trainer.view)
    return out.r_info_BT


def _iteration_input(trainer: RLTrainer, batch, host, term: CreditTerm) -> jax.Array:
    """``iteration``: the RL iteration whose episodes these are (float32 scalar; InfoPO's beta decay)."""
    return jnp.asarray(trainer.iteration_index, jnp.float32)


#: Host inputs of credit terms (`CreditTerm.needs`) by name: ``fn(trainer, batch, host_batch, term) -> array``.
CREDIT_INPUTS: dict[str, Callable[..., jax.Array]] = {"r_info": _infogain_input, "iteration": _iteration_input}


def register_credit_input(name: str, fn: Callable[..., jax.Array]) -> None:
    """Adds a provider of the host input ``name`` that a registered credit term ``needs``:
    ``fn(trainer, batch, host_batch, term)`` returns the array `FuseContext.inputs[name]` holds."""
    if name in CREDIT_INPUTS and CREDIT_INPUTS[name] is not fn:
        raise ValueError(f"credit input {name!r}: already provided by {CREDIT_INPUTS[name].__name__}")
    CREDIT_INPUTS[name] = fn


def _turns(trajs: Sequence[Trajectory]) -> int:
    """The most action turns of any episode (at least 1)."""
    return max(1, max(len(t.action_spans()) for t in trajs))


def _padding_row() -> Trajectory:
    """An empty record: a batch-padding row (no tokens: no statistic, no advantage, no loss)."""
    return Trajectory(task_id="", group_id=-1, tokens=[], logprobs=[], spans=[], turn_rewards=[],
                      outcome_reward=0.0, reaction_labels=[], termination="simulator_failure")


class SimulatorFailureBudget(RuntimeError):
    """The user simulator kept failing: a run stops (non-zero exit from ``jaxagent.launch``) rather
    than train on nothing. The message names the share, the budget's settings and the causes."""


class FailureBudget:
    """Counts consecutive iterations in which more than ``share`` of the episodes ended in
    ``simulator_failure``; `update` raises `SimulatorFailureBudget` at the ``iters``-th
    (``iters=0``: never). Built from `RLSettings` (``failure_share``, ``failure_budget_iters``)."""

    def __init__(self, share: float = 0.5, iters: int = 3):
        self.share, self.iters, self.streak = float(share), int(iters), 0

    @classmethod
    def from_settings(cls, settings: RLSettings) -> FailureBudget:
        return cls(settings.failure_share, settings.failure_budget_iters)

    def update(self, trajs: Sequence[Trajectory], step: int) -> None:
        n = len(trajs)
        failed = sum(t.termination == "simulator_failure" for t in trajs)
        self.streak = self.streak + 1 if n and failed > self.share * n else 0
        if self.iters and self.streak >= self.iters:
            raise SimulatorFailureBudget(
                f"rl iteration {step}: {failed}/{n} episodes ended in simulator_failure; more than "
                f"rl.failure_share={self.share:g} of the episodes failed in {self.streak} consecutive iterations "
                f"(rl.failure_budget_iters={self.iters}); {failure_causes(trajs)}")


__all__ = ["BEHAVIOUR_CORRECTIONS", "CREDIT_INPUTS", "FailureBudget", "RLSettings", "RLTrainer", "SimulatorFailureBudget", "credit_metrics",
           "register_credit_input"]

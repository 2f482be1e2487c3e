"""Direct preference optimisation (DPO / IPO) on tokenized preference pairs: library code the
``dpo`` job drives.

A pair is a prompt and two completions (`PairTokens`); each completion is scored as the sum of its
tokens' teacher-forced log-probs after the prompt (`jaxagent.credit.losses.sequence_logp` over
`jaxagent.train.step.sequence_scores`). The frozen reference policy is the initialising policy:
its completion log-probs are computed once per pair before training (`reference_logps`, jitted and
batched) and travel in every batch, so a training step runs the policy only.

Shapes: P pairs, B pairs per batch, L tokens (prompt + the longer completion of a batch's pairs,
right-padded and rounded up to ``multiple``). A batch (`pair_batch`) holds ``chosen_tokens`` /
``rejected_tokens`` [B, L] int32, ``chosen_mask`` / ``rejected_mask`` [B, L] bool (True on the
completion's tokens only: never the prompt, never padding), ``ref_chosen`` / ``ref_rejected``
[B] float32 (the reference's summed completion log-probs) and ``weight`` [B] float32.

The loss (`dpo_loss_fn`, for `make_update` with ``agg=DPO_AGG``) is the weighted mean over pairs
of `jaxagent.credit.losses.dpo_loss`'s per-pair loss,

    loss = sum_b w_b l_b / sum_b w_b,

so with every weight 1 it is ``dpo_loss``'s plain mean; its ``num_seqs`` is ``sum_b w_b`` (the
number of pairs when unweighted), the weight `make_update` combines microbatches by, so the
accumulated update is the full batch's whatever the split. Weight-0 pairs contribute nothing
(`train_dpo` fills an epoch's last, short batch with them to keep the batch shape static).

`train_dpo` is a plain loop: epochs over the pairs in an order that is a pure function of (seed,
epoch) (`step_pairs`), one jitted update per step, ``log(step, metrics)`` per step. It can start
at any step (``start_step``, with a restored ``state`` and the saved ``ref_logps``): checkpoints
are the job's (``on_step``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxagent.credit.losses import DPO_LOSS_TYPES, DPOLossType, dpo_loss, sequence_logp
from jaxagent.models.config import ConfigError, QwenConfig
from jaxagent.train.batch import Row, build_batch
from jaxagent.train.loop import Checkpointing, Hook, fit
from jaxagent.train.step import (
    SKIP_CHECK_MIN_UPDATES,
    LossFn,
    OptimSettings,
    StepShardings,
    TrainingFailed,
    TrainState,
    learning_rate,
    make_optimizer,
    make_update,
    place_on_mesh,
    sequence_scores,
)

#: The aggregation `make_update` must combine `dpo_loss_fn`'s microbatches with (by ``num_seqs``).
DPO_AGG = "seq_mean_token_mean"


# ----------------------------------------------------------------------------- data
class PairTokens(NamedTuple):
    """One preference pair, tokenized: ``prompt`` (the chat up to the assistant's generation
    start), ``chosen`` / ``rejected`` (the completions' tokens, end-of-turn token included) and a
    sample ``weight`` >= 0."""

    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    weight: float = 1.0


def pair_length(pair: PairTokens) -> int:
    """Tokens of the longer of the pair's two rows (prompt + completion)."""
    return len(pair.prompt) + max(len(pair.chosen), len(pair.rejected))


def check_pairs(pairs: Sequence[PairTokens], max_len: int | None = None, *, key: str = "dpo.max_len") -> None:
    """Refuses what cannot be trained, naming the pair's index: no pairs, an empty prompt (a
    sequence's first token is never scored), an empty completion, a weight that is not a finite
    number >= 0, all weights 0, and (with ``max_len``) a prompt + completion longer than
    ``max_len`` (the setting named as ``key``). Over-long pairs are refused, not dropped."""
    if not len(pairs):
        raise ValueError("pairs: empty; expected at least one preference pair")
    for i, p in enumerate(pairs):
        if len(p.prompt) < 1:
            raise ValueError(f"pair {i}: empty prompt; expected at least one prompt token (a sequence's first "
                             "token is never scored)")
        for name in ("chosen", "rejected"):
            if len(getattr(p, name)) < 1:
                raise ValueError(f"pair {i}: empty {name} completion; expected at least one token")
        w = p.weight
        if not (isinstance(w, (int, float, np.floating, np.integer)) and math.isfinite(w) and w >= 0):
            raise ValueError(f"pair {i}: weight={w!r}; expected a finite number >= 0")
        if max_len is not None:
            for name in ("chosen", "rejected"):
                n = len(p.prompt) + len(getattr(p, name))
                if n > max_len:
                    raise ValueError(
                        f"pair {i}: prompt + {name} completion is {n} tokens ({len(p.prompt)} + "
                        f"{len(getattr(p, name))}) > {key}={max_len}; raise {key} or drop the pair")
    if not any(p.weight > 0 for p in pairs):
        raise ValueError(f"pairs: all {len(pairs)} weights are 0; expected at least one weight > 0")


def pair_batch(pairs: Sequence[PairTokens], idx, multiple: int = 64,
               ref: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """``pairs[idx]`` padded by `build_batch`: ``chosen_tokens`` / ``rejected_tokens`` [B, L]
    int32 (prompt + completion, right-padded with 0), ``chosen_mask`` / ``rejected_mask`` [B, L]
    bool (True on the completion's tokens only), ``weight`` [B] float32 and, with ``ref`` (the
    [P, 2] of `reference_logps`), ``ref_chosen`` / ``ref_rejected`` [B] float32. Chosen and
    rejected rows share L: the longest row of the batch rounded up to ``multiple``."""
    picked = [pairs[int(i)] for i in idx]
    if not picked:
        raise ValueError("idx: empty; expected at least one pair")
    L = -(-max(pair_length(p) for p in picked) // multiple) * multiple
    out: dict[str, np.ndarray] = {}
    for name in ("chosen", "rejected"):
        rows = [Row(tokens=[*p.prompt, *getattr(p, name)],
                    loss_mask=[0.0] * len(p.prompt) + [1.0] * len(getattr(p, name))) for p in picked]
        b = build_batch(rows, length=L, multiple=multiple, noun=f"{name} row")
        out[f"{name}_tokens"] = b.tokens_BL
        out[f"{name}_mask"] = b.loss_mask_BL != 0
    out["weight"] = np.asarray([p.weight for p in picked], np.float32)
    if ref is not None:
        rows_idx = np.asarray([int(i) for i in idx])
        ref = np.asarray(ref, np.float32)
        out["ref_chosen"] = ref[rows_idx, 0]
        out["ref_rejected"] = ref[rows_idx, 1]
    return out


def as_step_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with its per-pair [B] leaves as [B, 1], so that every leaf has rank 2 and one
    `StepShardings.batch` sharding (a [B, L] spec) places them all; `dpo_loss_fn` reads either."""
    return {k: (np.reshape(v, (-1, 1)) if np.ndim(v) == 1 else v) for k, v in batch.items()}


# ----------------------------------------------------------------------------- the reference
def _pair_logps(params, batch, *, config: QwenConfig, attn_impl: str) -> tuple[jax.Array, jax.Array]:
    """Summed completion log-probs [B] of the chosen and the rejected rows, in one [2B, L] forward."""
    B = batch["chosen_tokens"].shape[0]
    tokens = jnp.concatenate([batch["chosen_tokens"], batch["rejected_tokens"]], axis=0)
    mask = jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]], axis=0)
    seq = sequence_logp(sequence_scores(params, tokens, config=config, attn_impl=attn_impl), mask)
    return seq[:B], seq[B:]


@functools.lru_cache(maxsize=16)
def _reference_scorer(config: QwenConfig, attn_impl: str, sharding: NamedSharding | None):
    fn = functools.partial(_pair_logps, config=config, attn_impl=attn_impl)
    if sharding is None:
        return jax.jit(fn)
    # the inputs keep where they are (params as placed, the rows put on ``sharding`` by the caller)
    return jax.jit(fn, out_shardings=NamedSharding(sharding.mesh, PartitionSpec()))


def reference_logps(params, config: QwenConfig, pairs: Sequence[PairTokens], batch_size: int, *,
                    multiple: int = 64, attn_impl: str | None = None,
                    sharding: NamedSharding | None = None) -> np.ndarray:
    """The frozen reference's summed completion log-probs: float32 [P, 2] (column 0 chosen, 1
    rejected), pair order. One jitted forward per ``batch_size`` pairs (chosen and rejected rows
    together, [2 * batch_size, L]); pairs are batched by length (less padding, fewer shapes) and
    the last batch is filled with repeats (static shape, results dropped). ``sharding``: where the
    [2 * batch_size, L] rows go (a batch sharding on the params' mesh; results come back
    replicated). Raises when a log-prob is not finite, naming the pair."""
    check_pairs(pairs)
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size={batch_size!r}: expected an int >= 1")
    score = _reference_scorer(config, attn_impl, sharding)
    P = len(pairs)
    order = sorted(range(P), key=lambda i: (pair_length(pairs[i]), i))
    out = np.zeros((P, 2), np.float32)
    for s in range(0, P, batch_size):
        idx = order[s:s + batch_size]
        fill = idx + [idx[-1]] * (batch_size - len(idx))
        b = pair_batch(pairs, fill, multiple)
        b = {k: b[k] for k in ("chosen_tokens", "rejected_tokens", "chosen_mask", "rejected_mask")}
        if sharding is not None:
            b = jax.device_put(b, sharding)
        c, r = jax.device_get(score(params, b))
        out[idx, 0] = np.asarray(c)[: len(idx)]
        out[idx, 1] = np.asarray(r)[: len(idx)]
    _check_ref(out, P)
    return out


def _check_ref(ref: np.ndarray, P: int) -> None:
    if ref.shape != (P, 2):
        raise ValueError(f"ref_logps: shape {ref.shape}; expected ({P}, 2) (one chosen and one rejected log-prob "
                         "per pair)")
    bad = np.flatnonzero(~np.all(np.isfinite(ref), axis=1))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"pair {i}: reference log-probs {ref[i].tolist()} are not finite ({bad.size} pairs); "
                         "expected finite numbers (check the tokens and the reference params)")


# ----------------------------------------------------------------------------- the loss
def dpo_loss_fn(config: QwenConfig, beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
                *, attn_impl: str | None = None) -> LossFn:
    """The DPO / IPO loss of a `pair_batch` for `make_update` (``agg=DPO_AGG``): chosen and rejected
    rows scored in one [2B, L] forward, summed completion log-probs, `dpo_loss` per pair against
    the batch's ``ref_chosen`` / ``ref_rejected``, the ``weight``-weighted mean over pairs (all
    weights 1 without a ``weight``). Per-pair leaves may be [B] or [B, 1] (`as_step_batch`).

    Metrics (float32 scalars, weighted means over pairs): ``loss``, ``rewards_chosen`` (``beta *
    (pi_c - ref_c)``), ``rewards_rejected``, ``reward_margin``, ``reward_accuracy``, ``logp_chosen``,
    ``logp_rejected``, ``logits`` (the policy-minus-reference log-ratio margin ``(pi_c - pi_r) -
    (ref_c - ref_r)``); ``num_seqs`` (the summed weights: the number of pairs when unweighted) and
    ``num_tokens`` (completion tokens scored, chosen and rejected)."""
    one = np.zeros((1,), np.float32)
    kw = {"beta": beta, "loss_type": loss_type, "label_smoothing": label_smoothing}
    jax.eval_shape(lambda: dpo_loss(one, one, one, one, **kw))  # the arguments' errors now, not at the first trace

    def per_pair(pc, pr, rc, rr):
        return dpo_loss(pc[None], pr[None], rc[None], rr[None], **kw)

    def loss_fn(params, batch):
        B = batch["chosen_tokens"].shape[0]
        pc, pr = _pair_logps(params, batch, config=config, attn_impl=attn_impl)
        rc = jnp.reshape(batch["ref_chosen"], (B,)).astype(jnp.float32)
        rr = jnp.reshape(batch["ref_rejected"], (B,)).astype(jnp.float32)
        w = (jnp.reshape(batch["weight"], (B,)).astype(jnp.float32) if "weight" in batch
             else jnp.ones((B,), jnp.float32))
        losses_B, metrics_B = jax.vmap(per_pair)(pc, pr, rc, rr)
        wsum = jnp.sum(w)
        den = jnp.where(wsum > 0, wsum, 1.0)
        wmean = lambda x: jnp.sum(jnp.where(w > 0, w * x, 0.0)) / den  # noqa: E731 (weight-0 pairs: nothing)
        loss = wmean(losses_B)
        sg = jax.lax.stop_gradient
        metrics = {k: sg(wmean(v)) for k, v in metrics_B.items()}
        metrics["loss"] = sg(loss)
        metrics["num_seqs"] = sg(wsum)
        metrics["num_tokens"] = (jnp.sum(batch["chosen_mask"] != 0, dtype=jnp.float32)
                                 + jnp.sum(batch["rejected_mask"] != 0, dtype=jnp.float32))
        return loss, metrics

    return loss_fn


# ----------------------------------------------------------------------------- settings
def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclasses.dataclass(frozen=True)
class DPOSettings:
    """What `train_dpo` runs (the ``dpo`` section of a run config); errors name ``dpo.<field>``.

    - ``beta`` > 0, ``loss_type`` sigmoid (DPO) | ipo, ``label_smoothing`` in [0, 0.5) (0 for ipo);
    - ``lr`` >= 0: AdamW's peak rate (clipping at global norm 1, no weight decay), reached after a
      linear warmup over ``ceil(warmup_ratio * total steps)`` steps and then constant;
    - ``epochs`` >= 1 passes over the pairs, ``batch_size`` pairs per update, split into
      ``microbatches`` (which must divide it);
    - ``max_len``: the longest prompt + completion accepted (longer pairs are refused);
    - ``seed`` >= 0: the pairs' order in each epoch.
    """

    beta: float = 0.1
    loss_type: DPOLossType = "sigmoid"
    label_smoothing: float = 0.0
    lr: float = 5e-6
    epochs: int = 1
    batch_size: int = 8
    microbatches: int = 1
    warmup_ratio: float = 0.03
    max_len: int = 5120
    seed: int = 0

    def __post_init__(self) -> None:
        def need(cond: bool, field: str, expected: str) -> None:
            if not cond:
                raise ConfigError(f"dpo.{field}={getattr(self, field)!r}: expected {expected}")

        need(_is_real(self.beta) and self.beta > 0, "beta", "a number > 0")
        need(self.loss_type in DPO_LOSS_TYPES, "loss_type", f"one of {DPO_LOSS_TYPES}")
        need(_is_real(self.label_smoothing) and 0 <= self.label_smoothing < 0.5, "label_smoothing",
             "a number in [0, 0.5)")
        need(self.loss_type != "ipo" or self.label_smoothing == 0, "label_smoothing", "0 with dpo.loss_type='ipo'")
        need(_is_real(self.lr) and self.lr >= 0, "lr", "a finite number >= 0")
        need(_is_int(self.epochs) and self.epochs >= 1, "epochs", "an int >= 1")
        need(_is_int(self.batch_size) and self.batch_size >= 1, "batch_size", "an int >= 1")
        need(_is_int(self.microbatches) and self.microbatches >= 1, "microbatches", "an int >= 1")
        need(self.batch_size % self.microbatches == 0, "microbatches",
             f"a divisor of dpo.batch_size={self.batch_size}")
        need(_is_real(self.warmup_ratio) and 0 <= self.warmup_ratio <= 1, "warmup_ratio", "a number in [0, 1]")
        need(_is_int(self.max_len) and self.max_len >= 2, "max_len", "an int >= 2 (a prompt and a completion token)")
        need(_is_int(self.seed) and self.seed >= 0, "seed", "an int >= 0")


def steps_per_epoch(n_pairs: int, settings: DPOSettings) -> int:
    return -(-n_pairs // settings.batch_size)


def dpo_steps(n_pairs: int, settings: DPOSettings) -> int:
    """Updates `train_dpo` makes over ``n_pairs`` pairs: ``epochs * ceil(n_pairs / batch_size)``."""
    return settings.epochs * steps_per_epoch(n_pairs, settings)


def dpo_optim(settings: DPOSettings, total_steps: int) -> OptimSettings:
    """The optimizer `train_dpo` builds when given none (see `DPOSettings`)."""
    return OptimSettings(name="adamw", lr=settings.lr, weight_decay=0.0, clip_norm=1.0,
                         warmup_steps=math.ceil(settings.warmup_ratio * total_steps), schedule="constant")


def pair_order(seed: int, epoch: int, n_pairs: int) -> np.ndarray:
    """The pairs' order in ``epoch``: a permutation of ``range(n_pairs)``, a pure function of its arguments."""
    return np.random.default_rng([seed, 0xD90, epoch]).permutation(n_pairs)


def step_pairs(step: int, n_pairs: int, settings: DPOSettings) -> tuple[np.ndarray, np.ndarray]:
    """The pairs of update ``step`` (a pure function of ``step``, ``n_pairs`` and the settings):
    ``idx`` [batch_size] int and ``live`` [batch_size] bool. Epoch ``step // steps_per_epoch``
    takes `pair_order`'s next ``batch_size`` pairs; its last batch, when short, is filled from the
    start of the order with ``live`` False (trained with weight 0), so each epoch trains every pair once."""
    spe = steps_per_epoch(n_pairs, settings)
    epoch, j = divmod(step, spe)
    order = pair_order(settings.seed, epoch, n_pairs)
    B = settings.batch_size
    idx = order[j * B:(j + 1) * B]
    live = np.ones(B, bool)
    if len(idx) < B:
        live[len(idx):] = False
        idx = np.concatenate([idx, np.resize(order, B - len(idx))])
    return idx, live


# ----------------------------------------------------------------------------- the loop
def train_dpo(params, config: QwenConfig, pairs: Sequence[PairTokens], settings: DPOSettings, *,
              tx: optax.GradientTransformation | None = None,
              lr_schedule: optax.Schedule | None = None,
              log: Callable[[int, dict[str, float]], None] | None = None,
              shardings: StepShardings | None = None,
              state: TrainState | None = None,
              start_step: int = 0,
              ref_logps: np.ndarray | None = None,
              on_step: Callable[[int, TrainState], None] | None = None,
              multiple: int = 64,
              attn_impl: str | None = None,
              hooks: Sequence[Hook] = (),
              checkpoint: Checkpointing | None = None,
              on_error: Callable[[BaseException, int], None] | None = None) -> tuple[Any, list[dict[str, float]]]:
    """DPO from ``params`` (the initial policy, also the frozen reference): returns the trained
    params and the history (one dict per update: ``step``, ``epoch`` and the update's metrics as
    floats, `dpo_loss_fn`'s and `make_update`'s).

    - The pairs are checked first (`check_pairs` with ``dpo.max_len``: over-long pairs are
      refused). The reference log-probs are ``ref_logps`` [P, 2] when given (a resumed run passes
      the ones it saved), else `reference_logps` of ``params``, computed before any update.
    - ``tx``: the optimizer (default `dpo_optim`'s; the metrics carry ``lr``, with a given ``tx``
      when its ``lr_schedule`` is given too). ``state``: a
      `TrainState` to continue from (restored; default a fresh one of ``params``, placed on
      ``shardings``' mesh when given). ``shardings``: the jitted update's (`make_update`); the
      state must already be where they say.
    - Updates ``start_step .. dpo_steps - 1`` through the training loop (`jaxagent.train.loop.fit`),
      update ``i`` on the pairs `step_pairs` gives it; ``log(i, metrics)`` after each, then the
      ``hooks`` and ``on_step(i + 1, state)`` (updates done, the live state; the next update donates
      its buffers), then ``checkpoint`` (`Checkpointing`) every ``checkpoint.every`` and at the end.
    - Raises `TrainingFailed` when every update so far was skipped for non-finite loss or
      gradients, once `SKIP_CHECK_MIN_UPDATES` were made (or at the last).
    ``params`` and ``state`` are donated to the update (their buffers are consumed on an accelerator).
    """
    check_pairs(pairs, settings.max_len)
    P = len(pairs)
    total = dpo_steps(P, settings)
    if not (_is_int(start_step) and 0 <= start_step <= total):
        raise ValueError(f"start_step={start_step!r}: expected an int in [0, {total}] ({P} pairs, "
                         f"dpo.epochs={settings.epochs}, dpo.batch_size={settings.batch_size})")
    if ref_logps is None:
        ref_logps = reference_logps(params, config, pairs, settings.batch_size, multiple=multiple,
                                    attn_impl=attn_impl, sharding=shardings.batch if shardings else None)
    ref_logps = np.asarray(ref_logps, np.float32)
    _check_ref(ref_logps, P)
    schedule = lr_schedule
    if tx is None:
        optim = dpo_optim(settings, total)
        tx, schedule = make_optimizer(optim), learning_rate(optim)
    if state is None:
        state = TrainState.create(params, tx)
        if shardings is not None:
            state = place_on_mesh(state, shardings.batch.mesh)
    loss_fn = dpo_loss_fn(config, settings.beta, settings.loss_type, settings.label_smoothing, attn_impl=attn_impl)
    update = make_update(loss_fn, tx, microbatches=settings.microbatches, agg=DPO_AGG, lr_schedule=schedule,
                         shardings=shardings)
    spe = steps_per_epoch(P, settings)
    history: list[dict[str, float]] = []
    made = {"applied": 0, "made": 0}

    def step(i: int, state: TrainState):
        idx, live = step_pairs(i, P, settings)
        batch = pair_batch(pairs, idx, multiple, ref=ref_logps)
        batch["weight"] = batch["weight"] * live
        batch = as_step_batch(batch)
        if shardings is not None:
            batch = shardings.put_batch(batch)
        state, m = update(state, batch)
        metrics = {k: float(v) for k, v in jax.device_get(m).items()}
        metrics["epoch"] = float(i // spe)
        history.append({"step": i, **metrics})
        if log is not None:
            log(i, metrics)
        made["made"] += 1
        made["applied"] += metrics["finite"] > 0
        if made["applied"] == 0 and (made["made"] >= SKIP_CHECK_MIN_UPDATES or i == total - 1):
            raise TrainingFailed(
                f"dpo: all {made['made']} updates (steps {start_step}..{i}) were skipped (non-finite loss or gradients); "
                "lower dpo.lr or check the pairs and the model")
        return state, metrics

    every_step = list(hooks)
    if on_step is not None:
        every_step.append(lambda i, state, metrics: on_step(i + 1, state))
    state = fit(state, step, start=start_step, total=total, hooks=every_step, checkpoint=checkpoint, on_error=on_error)
    return state.model_params, history


__all__ = ["DPO_AGG", "DPOSettings", "PairTokens", "as_step_batch", "check_pairs", "dpo_loss_fn",
           "dpo_optim", "dpo_steps", "pair_batch", "pair_length", "pair_order", "reference_logps", "step_pairs",
           "steps_per_epoch", "train_dpo"]

"""The training step: optimizer from config, train state, and one jitted update per job.

Pure code only (no I/O). Shapes: B sequences, L tokens, M microbatches (gradient accumulation),
B = M * b.

- `make_optimizer(OptimSettings)`: an optax chain (global-norm clipping, AdamW or SGD) with a
  linear warmup then a constant or cosine schedule.
- `TrainState`: params, optimizer state, ``step`` (updates applied) and ``skipped`` (updates
  refused because the loss or a gradient was not finite: the state is left as it was), and
  ``frozen``: parameters that are not trained (None: all are). ``TrainState.create(params, tx,
  trainable=("lora",))`` trains only the LoRA adapter: ``params`` is ``{"lora": adapter}``, the
  optimizer state is the adapter's, ``frozen`` the base; `TrainState.model_params` is the whole
  model. `check_skipped_share` raises `TrainingFailed` when too many were refused.
- `make_update(loss_fn, tx, microbatches=M, shardings=...)`: ``update(state, batch) -> (state,
  metrics)``, one `jax.jit` with the state donated and, with `StepShardings`, its input and output
  shardings declared (the state keeps its layout across updates; the batch is split over the
  mesh's batch axes; the metrics come back replicated). The batch (a dict of ``[B, ...]`` arrays) is split into M
  microbatches scanned in sequence; their gradients are combined with the weights the loss's
  aggregation implies (token counts for a token mean, sequence counts for a sequence mean), so
  the accumulated update equals the full-batch update. Only ``state.params`` is differentiated;
  the loss sees the whole model (``{**frozen, **params}``), the frozen part flowing through the jit
  as an argument with the rest of the state. With ``dropout_seed``, each microbatch's batch holds
  a ``dropout_key`` (the LoRA dropout's; `sft_loss_fn` / `ppo_loss_fn` pass it to the forward).
- `sft_loss_fn` and `ppo_loss_fn`: the per-microbatch losses of the SFT and RL jobs.
- `sequence_scores`: teacher-forced log-probs aligned to the tokens they score (entry t scores
  token t; entry 0 is 0), optionally with the policy entropy at each position.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxagent.credit.losses import PPOConfig, policy_loss, sft_loss
from jaxagent.models.config import QwenConfig
from jaxagent.models.qwen import token_logprobs
from jaxagent.models.sharding import LogicalRules

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


# ----------------------------------------------------------------------------- optimizer
@dataclasses.dataclass(frozen=True)
class OptimSettings:
    """What `make_optimizer` builds (the ``optim`` section of a run config)."""

    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_norm: float | None = 1.0
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    decay_steps: int = 0  # cosine: steps after the warmup to reach final_lr_fraction * lr
    final_lr_fraction: float = 0.0

    def __post_init__(self) -> None:
        for field in ("lr", "weight_decay", "eps", "final_lr_fraction"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{field}={value!r}: expected a finite number >= 0")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            raise ValueError(f"b1={self.b1!r}, b2={self.b2!r}: expected numbers in [0, 1)")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ValueError(f"clip_norm={self.clip_norm!r}: expected a positive number or null")
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps}, decay_steps={self.decay_steps}: expected >= 0")
        if self.schedule == "cosine" and self.decay_steps < 1:
            raise ValueError(f"decay_steps={self.decay_steps}: the cosine schedule needs decay_steps >= 1")


def learning_rate(cfg: OptimSettings) -> optax.Schedule:
    """Linear warmup from 0 over ``warmup_steps``, then constant or cosine decay."""
    if cfg.schedule == "cosine":
        after = optax.cosine_decay_schedule(cfg.lr, cfg.decay_steps, alpha=cfg.final_lr_fraction)
    else:
        after = optax.constant_schedule(cfg.lr)
    if cfg.warmup_steps == 0:
        return after
    warm = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
    return optax.join_schedules([warm, after], [cfg.warmup_steps])


def make_optimizer(cfg: OptimSettings) -> optax.GradientTransformation:
    lr = learning_rate(cfg)
    if cfg.name == "adamw":
        opt = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    else:
        opt = optax.sgd(lr)
    parts = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm is not None else []
    return optax.chain(*parts, opt)


# ----------------------------------------------------------------------------- state
def split_trainable(params: dict, trainable: Sequence[str] = ("lora",)) -> tuple[dict, dict]:
    """``(trained, frozen)``: the top-level entries of ``params`` named in ``trainable`` and the
    rest (``("lora",)``: the LoRA adapter trained, the base frozen). `combine_params` undoes it."""
    if isinstance(trainable, str):
        trainable = (trainable,)
    if not isinstance(params, dict):
        raise TypeError(f"params: {type(params).__name__}, expected a dict of parameters to split by key")
    missing = [k for k in trainable if k not in params]
    if missing or not trainable:
        raise ValueError(f"trainable={list(trainable)}: expected a non-empty list of keys of params "
                         f"{sorted(params)} (missing: {missing})")
    return ({k: v for k, v in params.items() if k in trainable},
            {k: v for k, v in params.items() if k not in trainable})


def combine_params(params: Any, frozen: Any) -> Any:
    """The whole model from the trained ``params`` and the ``frozen`` rest (``params`` when frozen is None)."""
    if frozen is None:
        return params
    both = sorted(set(params) & set(frozen))
    if both:
        raise ValueError(f"params and frozen both hold {both}: expected disjoint keys (split_trainable)")
    return {**frozen, **params}


@dataclasses.dataclass(frozen=True)
class TrainState:
    """What an update changes (a pytree). ``frozen`` is a child only when it is not None, so a state
    without frozen parameters has exactly the tree (and the checkpoint layout) it had before the
    field existed: older checkpoints restore into it unchanged."""

    params: Any  # what is trained (with ``frozen``: only that part of the model, e.g. {"lora": adapter})
    opt_state: Any  # the optimizer's state of ``params``
    step: jax.Array  # int32 []: updates applied
    skipped: jax.Array  # int32 []: updates refused (non-finite loss or gradients)
    frozen: Any = None  # parameters the update does not change (None: every parameter is trained)

    def replace(self, **changes) -> "TrainState":
        return dataclasses.replace(self, **changes)

    @classmethod
    def create(cls, params, tx: optax.GradientTransformation, *,
               trainable: Sequence[str] | None = None) -> "TrainState":
        """A fresh state. ``trainable`` (top-level keys of ``params``, e.g. ``("lora",)``): train
        only those, holding the rest in ``frozen`` (no optimizer state for it); None: train all."""
        zeros = lambda: jnp.zeros((), jnp.int32)  # noqa: E731 (two buffers: the state is donated)
        if trainable is None:
            return cls(params, tx.init(params), zeros(), zeros())
        trained, frozen = split_trainable(params, trainable)
        return cls(trained, tx.init(trained), zeros(), zeros(), frozen)

    @property
    def model_params(self) -> Any:
        """The whole model's parameters (trained and frozen), what forward / generation take."""
        return combine_params(self.params, self.frozen)


_STATE_FIELDS = ("params", "opt_state", "step", "skipped")


def _state_flatten(state: TrainState):
    names = _STATE_FIELDS + (("frozen",) if state.frozen is not None else ())
    return [(jax.tree_util.GetAttrKey(n), getattr(state, n)) for n in names], state.frozen is not None


def _state_unflatten(has_frozen: bool, children) -> TrainState:
    children = list(children)
    return TrainState(*children[:4], frozen=children[4] if has_frozen else None)


jax.tree_util.register_pytree_with_keys(
    TrainState, _state_flatten, _state_unflatten,
    flatten_func=lambda s: ([c for _, c in _state_flatten(s)[0]], s.frozen is not None))


@dataclasses.dataclass(frozen=True)
class StepShardings:
    """Where a jitted update's arguments live: ``state``, a pytree of shardings with the
    `TrainState`'s structure (in and out: every update of a run, fresh or restored, runs the same
    compiled program and returns the state where it was); ``batch``, one sharding for every
    ``[B, L]`` batch leaf (`jaxagent.models.sharding.batch_sharding`). Metrics come back
    replicated over ``batch``'s mesh."""

    state: Any
    batch: NamedSharding

    @classmethod
    def of(cls, state: "TrainState", batch: NamedSharding) -> "StepShardings":
        """The shardings ``state``'s arrays have now (every leaf must be on the mesh already)."""
        def sharding(x):
            if not isinstance(getattr(x, "sharding", None), NamedSharding):
                raise ValueError(f"state leaf {type(x).__name__} {getattr(x, 'shape', '')}: not on a mesh (expected "
                                 "every array placed with a NamedSharding before the step is built)")
            return x.sharding

        return cls(jax.tree.map(sharding, state), batch)

    def put_batch(self, batch: "Batch") -> "Batch":
        """``batch`` placed as the update expects it (a no-op for arrays already there)."""
        return jax.device_put(batch, self.batch)


def place_on_mesh(tree, mesh: jax.sharding.Mesh):
    """``tree`` with every leaf not yet on a mesh (optax's counters, the step counters: scalars on
    one device, uncommitted) replicated over ``mesh``, as the jitted update returns them. A state
    restored into these shardings then matches the live one (a counter committed to one device
    next to parameters on all of them is an error) and `StepShardings.of` can read them all."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: x if isinstance(getattr(x, "sharding", None), NamedSharding)
                        else jax.device_put(x, replicated), tree)


class TrainingFailed(RuntimeError):
    """A run stopped because its training went wrong (too many skipped updates, a collapse):
    `jaxagent.launch` turns it into a non-zero exit with this one-line message."""


#: `check_skipped_share` judges the share only after this many updates (applied + skipped) of a
#: phase, but for the phase's last check (``final=True``).
SKIP_CHECK_MIN_UPDATES = 4


def check_skipped_share(applied: int, skipped: int, limit: float, *, phase: str, key: str,
                        final: bool = False) -> None:
    """Raises `TrainingFailed` when more than ``limit`` of the ``applied + skipped`` updates so far
    were skipped (non-finite loss or gradients), once at least `SKIP_CHECK_MIN_UPDATES` were made
    (or ``final``). ``key``: the config key of ``limit``, named in the message (``limit`` 1: never)."""
    total = applied + skipped
    if total == 0 or (total < SKIP_CHECK_MIN_UPDATES and not final):
        return
    if skipped / total > limit:
        raise TrainingFailed(
            f"{phase}: {skipped} of {total} updates were skipped (non-finite loss or gradients), "
            f"{skipped / total:.0%} > {key}={limit:g}; lower the learning rate or check the data "
            f"(set {key}=1 to never stop)")


def _cosine(a, b) -> jax.Array:
    """Cosine similarity of two pytrees of equal structure (0 when either is all zeros)."""
    # an elementwise product summed, not `jnp.vdot`: vdot flattens its operands, and flattening an
    # fsdp-sharded array gathers all of it on every device (the update of configs/infopo_7b.yaml held
    # 27 GB more temp per device for it: docs/PODS.md)
    dot = sum(jnp.sum(x * y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    na, nb = optax.tree.norm(a), optax.tree.norm(b)
    return jnp.where((na > 0) & (nb > 0), dot / jnp.where((na > 0) & (nb > 0), na * nb, 1.0), 0.0)


def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


# ----------------------------------------------------------------------------- scoring
def sequence_scores(params, tokens_BL: jax.Array, *, config: QwenConfig, entropy: bool = False,
                    attn_impl: str | None = None, row_chunk: int | None = None, temperature: float = 1.0,
                    vocab_limit: int | None = None, dropout_key: jax.Array | None = None,
                    rules: LogicalRules | None = None) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Teacher-forced log-probs [B, L] with entry t scoring token t (entry 0 is 0), and with
    ``entropy`` the policy's entropy at the position that predicts token t (entry 0 is 0).
    ``row_chunk``: rows scored at a time (see `token_logprobs`). ``temperature`` / ``vocab_limit``:
    scored under the distribution a sampler with those settings draws from (the RL trainer's sampler).
    ``dropout_key``: the LoRA adapter's dropout (None: none). ``rules``: the mesh's activation
    rules (`token_logprobs`; rows placed over its batch axes: each device scores its own)."""
    out = token_logprobs(params, tokens_BL, config=config, attn_impl=attn_impl, return_entropy=entropy,
                         row_chunk=row_chunk, temperature=temperature, vocab_limit=vocab_limit,
                         dropout_key=dropout_key, rules=rules)
    lp, ent = out if entropy else (out, None)
    shift = lambda x: jnp.pad(x[:, :-1], ((0, 0), (1, 0)))  # noqa: E731
    return (shift(lp), shift(ent)) if entropy else shift(lp)


# ----------------------------------------------------------------------------- losses
LossFn = Callable[[Any, Batch], tuple[jax.Array, Metrics]]


def sft_loss_fn(config: QwenConfig, agg: str = "token_mean", *, rules: LogicalRules | None = None) -> LossFn:
    """Masked cross-entropy; the batch holds ``tokens`` [B, L] int32 and ``loss_mask`` [B, L] (and
    optionally ``dropout_key``, `make_update`'s ``dropout_seed``). ``rules``: the mesh's activation
    rules (`jaxagent.models.sharding.row_rules` of the microbatch's rows)."""

    def loss_fn(params, batch):
        logp = sequence_scores(params, batch["tokens"], config=config, dropout_key=batch.get("dropout_key"),
                               rules=rules)
        return sft_loss(logp, batch["loss_mask"], agg=agg)

    return loss_fn


def ppo_loss_fn(config: QwenConfig, ppo: PPOConfig, *, temperature: float = 1.0,
                vocab_limit: int | None = None, rules: LogicalRules | None = None) -> LossFn:
    """The clipped policy loss; the batch holds ``tokens``, ``loss_mask``, ``advantages``,
    ``old_logp``, with a KL term ``ref_logp`` and with truncated importance sampling ``is_weight``
    (`jaxagent.credit.losses.truncated_is_weights`), all [B, L] aligned to the tokens. The policy
    is scored at the sampler's ``temperature`` / ``vocab_limit`` (the distribution that drew the
    tokens, as ``old_logp`` and ``ref_logp`` must be), and its entropy is that distribution's. A
    ``dropout_key`` in the batch (`make_update`'s ``dropout_seed``) drives the LoRA dropout.
    ``rules``: as in `sft_loss_fn`."""
    view = {"temperature": temperature, "vocab_limit": vocab_limit, "rules": rules}

    def loss_fn(params, batch):
        kw = dict(view, dropout_key=batch.get("dropout_key"))
        if ppo.entropy_coef > 0:
            logp, ent = sequence_scores(params, batch["tokens"], config=config, entropy=True, **kw)
        else:
            logp, ent = sequence_scores(params, batch["tokens"], config=config, **kw), None
        return policy_loss(logp, batch["old_logp"], batch["advantages"], batch["loss_mask"], config=ppo,
                           ref_logp_BL=batch.get("ref_logp"), entropy_BL=ent, is_weight_BL=batch.get("is_weight"))

    return loss_fn


def microbatch_weight(metrics: Metrics, agg: str) -> jax.Array:
    """The weight of a microbatch's gradient under ``agg`` (see the module docstring)."""
    if agg == "token_mean":
        return metrics["num_tokens"]
    if agg in ("seq_mean_token_mean", "seq_mean_token_sum"):
        return metrics["num_seqs"]
    return jnp.float32(1.0)  # a constant normaliser: every microbatch counts the same


_SUMMED = ("num_tokens", "num_seqs")


def make_update(loss_fn: LossFn, tx: optax.GradientTransformation, *, microbatches: int = 1,
                agg: str = "token_mean", lr_schedule: optax.Schedule | None = None,
                shardings: StepShardings | None = None, dropout_seed: int | None = None,
                ) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """One jitted update: ``update(state, batch) -> (state, metrics)`` (state donated). With
    ``shardings``, the jit declares them: the state in and out on ``shardings.state``, every batch
    leaf on ``shardings.batch`` (place it there: `StepShardings.put_batch`), metrics replicated.

    Metrics: the loss's metrics (weighted means over microbatches; counts summed; ``ratio_min``
    / ``ratio_max`` the extremes), plus ``grad_norm`` (of the accumulated gradient), with M >= 2
    ``grad_cos_halves`` (the cosine between the summed gradients of the even and of the odd
    microbatches: two independent estimates of the same gradient, so about 0 when the update is
    noise and near 1 when it is signal; the gradient's signal-to-noise), ``lr`` (with
    ``lr_schedule``: the rate this update used), ``finite`` (1 when the update was applied), ``skipped``
    (1 when it was refused: ``1 - finite``) and ``skipped_total`` (updates refused so far, ``state.skipped``).

    With ``state.frozen`` (`TrainState.create(..., trainable=...)`) only ``state.params`` is
    differentiated and updated; ``loss_fn`` is called on `combine_params` of both, and the frozen
    part is returned as it came (an argument of the jit, never a constant baked into the program).
    ``dropout_seed``: microbatch m of the update attempted with counters (step, skipped) gets
    ``batch["dropout_key"] = fold_in(fold_in(key(dropout_seed), step + skipped), m)`` (a resumed run
    draws the same masks); None: no key (no dropout).
    """
    if microbatches < 1:
        raise ValueError(f"microbatches={microbatches}: expected >= 1")
    grad_fn = jax.value_and_grad(lambda params, frozen, mb: loss_fn(combine_params(params, frozen), mb), has_aux=True)

    def update(state: TrainState, batch: Batch):
        B = jax.tree.leaves(batch)[0].shape[0]
        if B % microbatches:
            raise ValueError(f"batch size {B} is not divisible by microbatches={microbatches}")
        split = jax.tree.map(lambda x: x.reshape(microbatches, B // microbatches, *x.shape[1:]), batch)

        if dropout_seed is not None:
            attempt_key = jax.random.fold_in(jax.random.key(dropout_seed), state.step + state.skipped)

        def one(carry, xs):
            grads_acc, wsum, odd_acc = carry
            i, mb = xs
            if dropout_seed is not None:
                mb = {**mb, "dropout_key": jax.random.fold_in(attempt_key, i)}
            (loss, metrics), grads = grad_fn(state.params, state.frozen, mb)
            w = microbatch_weight(metrics, agg).astype(jnp.float32)
            grads_acc = jax.tree.map(lambda a, g: a + w * g.astype(jnp.float32), grads_acc, grads)
            if odd_acc is not None:  # the odd microbatches' share, for the halves' cosine
                odd_acc = jax.tree.map(lambda a, g: a + (i % 2) * w * g.astype(jnp.float32), odd_acc, grads)
            return (grads_acc, wsum + w, odd_acc), (metrics, w, loss)

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        halves = microbatches >= 2
        carry0 = (zeros, jnp.float32(0.0), zeros if halves else None)
        (gsum, wsum, godd), (ms, ws, losses) = jax.lax.scan(one, carry0, (jnp.arange(microbatches), split))
        denom = jnp.where(wsum > 0, wsum, 1.0)
        grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), gsum, state.params)
        wn = ws / denom
        metrics = {}
        for k, v in ms.items():
            if k in _SUMMED:
                metrics[k] = jnp.sum(v)
            elif k == "ratio_min":
                metrics[k] = jnp.min(v)
            elif k == "ratio_max":
                metrics[k] = jnp.max(v)
            else:
                metrics[k] = jnp.where(wsum > 0, jnp.sum(v * wn), jnp.mean(v))
        finite = _all_finite(grads) & jnp.all(jnp.isfinite(losses))
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        new_state = TrainState(
            params=keep(params, state.params),
            opt_state=keep(opt_state, state.opt_state),
            step=state.step + finite.astype(jnp.int32),
            skipped=state.skipped + (~finite).astype(jnp.int32),
            frozen=state.frozen,
        )
        if halves:  # gradient signal-to-noise: cosine of the even and the odd microbatches' gradients
            geven = jax.tree.map(lambda a, b: a - b, gsum, godd)
            metrics["grad_cos_halves"] = _cosine(geven, godd)
        metrics.update(grad_norm=optax.tree.norm(grads), finite=finite.astype(jnp.float32),
                       skipped=(~finite).astype(jnp.float32), skipped_total=new_state.skipped.astype(jnp.float32))
        if lr_schedule is not None:
            metrics["lr"] = jnp.asarray(lr_schedule(state.step), jnp.float32)
        return new_state, metrics

    if shardings is None:
        return jax.jit(update, donate_argnums=(0,))
    replicated = NamedSharding(shardings.batch.mesh, PartitionSpec())
    return jax.jit(update, donate_argnums=(0,), in_shardings=(shardings.state, shardings.batch),
                   out_shardings=(shardings.state, replicated))


__all__ = ["SKIP_CHECK_MIN_UPDATES", "OptimSettings", "StepShardings", "TrainState", "TrainingFailed", "check_skipped_share",
           "combine_params", "learning_rate", "make_optimizer", "make_update", "microbatch_weight", "place_on_mesh",
           "ppo_loss_fn", "sequence_scores", "sft_loss_fn", "split_trainable"]

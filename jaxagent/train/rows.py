"""Supervised training on prompt-completion rows with sample weights (the Q&D spec's stage 1, §4.3/§4.6).

A row is (prompt tokens, completion tokens, weight, optional mask over the completion: a
conversation's assistant turns, docs/DATA.md): the loss is the trained completion tokens' negative
log-likelihood, a masked token mean with each row's tokens weighted by its row's weight,

    loss = sum_b w_b sum_t m_bt nll_bt / sum_b w_b sum_t m_bt,

so with every weight 1 it is `jaxagent.credit.losses.sft_loss`'s token mean. The loss's
``num_tokens`` is the weighted token count (the microbatch weight `make_update` combines
microbatches by: the weighted mean over the whole batch, whatever the split).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models.config import QwenConfig
from jaxagent.train.batch import Row, build_batch
from jaxagent.train.step import LossFn, sequence_scores


class RowTokens(NamedTuple):
    """One row: ``prompt`` tokens (never trained), ``completion`` tokens, the row's ``weight`` and
    ``mask``: per completion token whether the loss counts it (None: every completion token; a
    multi-turn conversation's completion runs from its first trained turn to its last, the turns
    between included and masked out)."""

    prompt: list[int]
    completion: list[int]
    weight: float = 1.0
    mask: Sequence[bool] | None = None


def _completion_mask(r: RowTokens) -> list[bool]:
    if r.mask is None:
        return [True] * len(r.completion)
    if len(r.mask) != len(r.completion):
        raise ValueError(f"RowTokens.mask: {len(r.mask)} flags for {len(r.completion)} completion tokens; expected "
                         "one flag per completion token")
    return [bool(m) for m in r.mask]


def row_batch(rows: Sequence[RowTokens], idx, multiple: int = 64) -> dict[str, np.ndarray]:
    """``rows[idx]`` padded (`build_batch`): ``tokens`` and ``loss_mask`` [B, L] (1 on the
    completion tokens only: those its ``mask`` flags when a row has one), ``weight`` [B, L] float32
    (each row's weight on all its positions: every batch leaf is [B, L], as `StepShardings` places
    them); L rounded up to ``multiple``."""
    picked = [rows[int(i)] for i in idx]
    batch = build_batch([Row(tokens=[*r.prompt, *r.completion],
                             loss_mask=[False] * len(r.prompt) + _completion_mask(r)) for r in picked],
                        multiple=multiple, noun="row")
    w_B1 = np.asarray([r.weight for r in picked], np.float32)[:, None]
    return {"tokens": batch.tokens_BL, "loss_mask": batch.loss_mask_BL,
            "weight": np.broadcast_to(w_B1, batch.tokens_BL.shape).copy()}


def weighted_sft_loss_fn(config: QwenConfig) -> LossFn:
    """The module docstring's loss for `make_update` (``agg="token_mean"``); the batch as `row_batch` makes it."""

    def loss_fn(params, batch):
        logp_BL = sequence_scores(params, batch["tokens"], config=config)
        m_BL = jnp.asarray(batch["loss_mask"]) != 0
        w_BL = jnp.where(m_BL, jnp.asarray(batch["weight"], jnp.float32), 0.0)
        nll_BL = jnp.where(m_BL, -logp_BL.astype(jnp.float32), 0.0)
        wsum = jnp.sum(w_BL)
        loss = jnp.where(wsum > 0, jnp.sum(w_BL * nll_BL) / jnp.where(wsum > 0, wsum, 1.0), 0.0)
        tokens = jnp.sum(m_BL, dtype=jnp.float32)
        nll = jax.lax.stop_gradient(jnp.sum(nll_BL) / jnp.maximum(tokens, 1.0))
        return loss, {"loss": jax.lax.stop_gradient(loss), "nll": nll, "ppl": jnp.exp(nll), "num_tokens": wsum,
                      "num_seqs": jnp.sum(jnp.any(m_BL, axis=-1), dtype=jnp.float32)}

    return loss_fn


__all__ = ["RowTokens", "row_batch", "weighted_sft_loss_fn"]

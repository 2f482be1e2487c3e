"""Synthetic multi-turn trajectories as `CreditBatch`es, for tests and benchmarks (host, numpy).

Each row is laid out as an agent conversation would be: a prompt, then per turn an action, some
template tokens, the feedback content, more template tokens; then right padding. Lengths are
drawn from the given ranges; feedback is empty with probability ``empty_feedback_prob`` (a turn
that drew no feedback), and rows have uneven turn counts.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxagent.credit.batch import CreditBatch


def synthetic_batch(
    rng: np.random.Generator,
    *,
    batch: int,
    length: int,
    turns: int,
    vocab: int,
    prompt_len: tuple[int, int] = (2, 8),
    action_len: tuple[int, int] = (1, 6),
    feedback_len: tuple[int, int] = (1, 8),
    template_len: tuple[int, int] = (0, 3),
    empty_feedback_prob: float = 0.2,
    min_turns: int = 1,
    groups: int = 1,
) -> CreditBatch:
    """A random padded batch; ranges are inclusive-exclusive ``(low, high)`` as numpy draws them."""
    B, L, T = batch, length, turns
    tokens = rng.integers(1, vocab, (B, L)).astype(np.int32)
    pad = np.zeros((B, L), np.int32)
    act = np.zeros((B, T, 2), np.int32)
    fb = np.zeros((B, T, 2), np.int32)
    valid = np.zeros((B, T), bool)
    turn_idx = np.full((B, L), -1, np.int32)
    loss_mask = np.zeros((B, L), np.float32)
    for b in range(B):
        pos = int(rng.integers(*prompt_len))
        n_turns = int(rng.integers(min_turns, T + 1))
        for t in range(n_turns):
            a = int(rng.integers(*action_len))
            t1, t2 = int(rng.integers(*template_len)), int(rng.integers(*template_len))
            f = 0 if rng.random() < empty_feedback_prob else int(rng.integers(*feedback_len))
            if pos + a + t1 + f + t2 > L:
                break
            act[b, t] = (pos, pos + a)
            valid[b, t] = True
            turn_idx[b, pos : pos + a] = t
            loss_mask[b, pos : pos + a] = 1
            pos += a + t1
            fb[b, t] = (pos, pos + f)
            pos += f + t2
        pad[b, :pos] = 1
        tokens[b, pos:] = 0
    Q = T
    return CreditBatch(
        tokens_BL=jnp.asarray(tokens),
        pad_mask_BL=jnp.asarray(pad),
        loss_mask_BL=jnp.asarray(loss_mask),
        turn_idx_BL=jnp.asarray(turn_idx),
        action_span_BT2=jnp.asarray(act),
        feedback_span_BT2=jnp.asarray(fb),
        turn_valid_BT=jnp.asarray(valid),
        segment_idx_BL=jnp.asarray(turn_idx),
        segment_polarity_BQ=jnp.asarray(rng.choice([-1.0, 0.0, 1.0], (B, Q)).astype(np.float32)),
        segment_valid_BQ=jnp.asarray(valid),
        reward_B=jnp.asarray(rng.random(B).astype(np.float32)),
        group_id_B=jnp.asarray(np.arange(B, dtype=np.int32) % groups),
    )

"""Synthetic multi-turn trajectories as `CreditBatch`es, for tests and benchmarks (host, numpy;
built by the one batch builder, `jaxagent.train.batch.build_batch`).

Each row is laid out as an agent conversation would be: a prompt, then per turn an action, some
template tokens, the feedback content, more template tokens; then right padding. Lengths are
drawn from the given ranges; feedback is empty with probability ``empty_feedback_prob`` (a turn
that drew no feedback), and rows have uneven turn counts.
"""

from __future__ import annotations

import numpy as np

from jaxagent.credit.batch import CreditBatch
from jaxagent.train.batch import Row, build_batch


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
    layouts = []  # per row: its length and action / feedback spans
    for b in range(B):
        pos = int(rng.integers(*prompt_len))
        n_turns = int(rng.integers(min_turns, T + 1))
        actions, feedback = [], []
        for _ in range(n_turns):
            a = int(rng.integers(*action_len))
            t1, t2 = int(rng.integers(*template_len)), int(rng.integers(*template_len))
            f = 0 if rng.random() < empty_feedback_prob else int(rng.integers(*feedback_len))
            if pos + a + t1 + f + t2 > L:
                break
            actions.append((pos, pos + a))
            pos += a + t1
            feedback.append((pos, pos + f))
            pos += f + t2
        layouts.append((pos, actions, feedback))
    polarity = rng.choice([-1.0, 0.0, 1.0], (B, T)).astype(np.float32)  # one segment per turn
    rewards = rng.random(B).astype(np.float32)
    rows = [Row(tokens=tokens[b, :n], actions=actions, feedback=feedback,
                segments=[([t], float(polarity[b, t])) for t in range(len(actions))],
                reward=float(rewards[b]), group=b % groups)
            for b, (n, actions, feedback) in enumerate(layouts)]
    return build_batch(rows, length=L, turns=T, segments=T).credit_batch()

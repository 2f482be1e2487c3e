"""The padded device batch that credit assignment consumes (built on the host by the rollout
collator; pure code only reads it).

Shapes: B trajectories, L tokens, T action turns (padded), Q U2U segments (padded), G groups.

- ``tokens_BL`` int32: the trajectory's tokens, right-padded (``pad_mask_BL`` 0 on padding).
- ``loss_mask_BL`` float32: 1 on agent-generated tokens (what is trained), else 0.
- ``turn_idx_BL`` int32: the action turn t of each agent token, -1 elsewhere.
- ``action_span_BT2`` int32: [start, end) token span of action t (end == start: no action).
- ``feedback_span_BT2`` int32: [start, end) span of the *content* of the feedback o_t that follows
  action t (a user message or tool result, without template tokens); empty when there is none.
- ``turn_valid_BT`` bool: action t exists.
- ``segment_idx_BL`` int32: ordinal U2U segment q of each agent token (all agent tokens between
  one user message and the next), -1 elsewhere.
- ``segment_polarity_BQ`` float32: polarity (+1/0/-1) of the user reaction that follows segment q.
- ``segment_valid_BQ`` bool: segment q exists (and was followed by a user reaction).
- ``reward_B`` float32: the outcome reward; ``group_id_B`` int32: rollouts sharing a prompt.
- ``feedback_kind_BT`` int32 or None: what the feedback o_t is, as the environment marked its
  messages (`jaxagent.envs.base.FEEDBACK_KINDS`): 0 unmarked, 1 information, 2 a correction (a
  tool error, a request to ask differently); None when no record carries marks.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class CreditBatch:
    tokens_BL: jax.Array
    pad_mask_BL: jax.Array
    loss_mask_BL: jax.Array
    turn_idx_BL: jax.Array
    action_span_BT2: jax.Array
    feedback_span_BT2: jax.Array
    turn_valid_BT: jax.Array
    segment_idx_BL: jax.Array
    segment_polarity_BQ: jax.Array
    segment_valid_BQ: jax.Array
    reward_B: jax.Array
    group_id_B: jax.Array
    feedback_kind_BT: jax.Array | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens_BL.shape)

    def check(self) -> "CreditBatch":
        """Asserts consistent shapes and dtypes (host side, before jit)."""
        B, L = self.tokens_BL.shape
        T = self.action_span_BT2.shape[1]
        Q = self.segment_polarity_BQ.shape[1]
        chex.assert_shape([self.pad_mask_BL, self.loss_mask_BL, self.turn_idx_BL, self.segment_idx_BL], (B, L))
        chex.assert_shape([self.action_span_BT2, self.feedback_span_BT2], (B, T, 2))
        chex.assert_shape(self.turn_valid_BT, (B, T))
        chex.assert_shape([self.segment_polarity_BQ, self.segment_valid_BQ], (B, Q))
        chex.assert_shape([self.reward_B, self.group_id_B], (B,))
        if self.feedback_kind_BT is not None:
            chex.assert_shape(self.feedback_kind_BT, (B, T))
        chex.assert_type([self.tokens_BL, self.turn_idx_BL, self.segment_idx_BL, self.group_id_B], jnp.int32)
        return self


def infogain_valid_turns(batch: CreditBatch) -> jax.Array:
    """Turns t that get an information gain, ``[B, T]`` bool.

    t is valid when: action t exists with a non-empty span inside ``[0, L)``; action t+1 exists
    likewise (so the last turn never is); the feedback o_t span is non-empty, inside ``[0, L)``,
    and lies between the two actions (``end(a_t) <= start(o_t)``, ``end(o_t) <= start(a_{t+1})``).
    """
    L = batch.tokens_BL.shape[1]
    a_BT2 = jnp.asarray(batch.action_span_BT2, jnp.int32)
    f_BT2 = jnp.asarray(batch.feedback_span_BT2, jnp.int32)
    a0, a1 = a_BT2[..., 0], a_BT2[..., 1]
    f0, f1 = f_BT2[..., 0], f_BT2[..., 1]
    act_BT = jnp.asarray(batch.turn_valid_BT, bool) & (a0 >= 0) & (a1 > a0) & (a1 <= L)
    B = act_BT.shape[0]
    next_act_BT = jnp.concatenate([act_BT[:, 1:], jnp.zeros((B, 1), bool)], axis=1)
    next_a0 = jnp.concatenate([a0[:, 1:], jnp.zeros((B, 1), jnp.int32)], axis=1)
    feedback_BT = (f0 >= 0) & (f1 > f0) & (f1 <= L) & (a1 <= f0) & (f1 <= next_a0)
    return act_BT & next_act_BT & feedback_BT


__all__ = ["CreditBatch", "infogain_valid_turns"]

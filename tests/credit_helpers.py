"""Shared by the credit tests: the hand formulas, a hand-built batch of four conversations, naive
references for the broadcasts, and hypothesis settings."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, settings

from jaxagent.train.batch import Row
from jaxagent.train.batch import build_batch as build_host_batch
from jaxagent.credit.reaction import (
    polarity_of,
)

EPS = 1e-6
R2 = math.sqrt(2.0)
PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def z(x, mean, std, eps=EPS):
    """The hand formula (float64): (x - mean) / (std + eps)."""
    return (np.asarray(x, np.float64) - mean) / (std + eps)


# ----------------------------------------------------------------------------- a hand-built batch
def build_batch(rollouts, rewards, groups, *, T, Q, L, prompt=2):
    """A CreditBatch laid out as conversations (through the one batch builder): per rollout a
    prompt (ending in the first user message), then per turn ``(action_len, feedback_len, kind,
    label)``: the action's tokens, one template token, the feedback content (``kind`` "user" /
    "tool" / None = no feedback), one template token. A user message ends the current U2U segment
    with ``label``'s polarity; the segment after the last user message has no reaction (invalid)."""
    rows = []
    for turns, reward, group in zip(rollouts, rewards, groups):
        pos, actions, feedback, segments, current = prompt, [], [], [], []
        for t, (a, f, kind, label) in enumerate(turns):
            actions.append((pos, pos + a))
            current.append(t)
            pos += a + 1
            feedback.append((pos, pos) if kind is None else (pos, pos + f))
            pos += (0 if kind is None else f) + 1
            if kind == "user":
                segments.append((current, float(polarity_of(label))))
                current = []
        if current:
            segments.append((current, None))
        assert pos <= L
        rows.append(Row(tokens=1 + (np.arange(pos) % 7), actions=actions, feedback=feedback, segments=segments,
                        reward=reward, group=group))
    return build_host_batch(rows, length=L, turns=T, segments=Q).credit_batch()


# Two groups of two. Group 0 has rewards 1, 0 (A_ext = +-0.5/(0.5+eps), gate sigmoid(-1)); group 1
# has equal rewards (A_ext = 0, gate 0.5, homogeneous).
ROLLOUTS = [
    [(2, 2, "user", "confirm"), (1, 1, "tool", None), (2, 0, None, None)],  # info-valid t0, t1
    [(1, 1, "user", "reject"), (2, 0, None, None)],  # info-valid t0
    [(2, 0, None, None), (1, 2, "user", "accept"), (1, 0, None, None)],  # t0 has no feedback: t1 only
    [(1, 1, "user", "be_vague"), (1, 1, "user", "approve"), (1, 0, None, None)],  # t0, t1
]
BATCH = build_batch(ROLLOUTS, [1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], T=3, Q=3, L=24)
NAN = float("nan")
# Values on turns that are not info-valid are garbage (NaN included) and must not matter.
R_INFO = jnp.asarray([[0.3, 0.1, NAN], [0.2, 5.0, 0.0], [9.0, 0.5, -7.0], [-0.5, 0.5, 3.0]], jnp.float32)
INFO_VALID = np.array([[1, 1, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]], bool)
# Group 0 valid turns 0.3, 0.1, 0.2: mean 0.2, population std sqrt(0.02/3).
# Group 1 valid turns 0.5, -0.5, 0.5: mean 1/6, population std sqrt(2)/3.
S0, S1 = math.sqrt(0.02 / 3), R2 / 3
A_INFO = np.zeros((4, 3))
A_INFO[0, :2] = z([0.3, 0.1], 0.2, S0)  # +-1.2247
A_INFO[1, 0] = z(0.2, 0.2, S0)  # 0
A_INFO[2, 1] = z(0.5, 1 / 6, S1)  # 0.7071
A_INFO[3, :2] = z([-0.5, 0.5], 1 / 6, S1)  # -1.4142, 0.7071
A_EXT = np.array([z(1, 0.5, 0.5), z(0, 0.5, 0.5), 0.0, 0.0])  # +-0.999998, group 1 degenerate
GATE = np.array([1 / (1 + math.e), 1 / (1 + math.e), 0.5, 0.5])  # sigmoid(-0.5 / 0.5), sigmoid(0)
# Faca: segment 0 of group 0 has reactions +1, -1 (mean 0, std 1); segment 0 of group 1 has +1
# (rollout 2), -1 (rollout 3); segment 1 only in rollout 3 (a single rollout: 0).
A_PROC = np.zeros((4, 3))
A_PROC[:, 0] = z([1, -1, 1, -1], 0.0, 1.0)


def tokens_of(A_BK, idx_BL, mask_BL):
    """Reference broadcast by explicit loops."""
    idx, mask = np.asarray(idx_BL), np.asarray(mask_BL)
    out = np.zeros(idx.shape)
    for b in range(idx.shape[0]):
        for l in range(idx.shape[1]):
            if mask[b, l] and 0 <= idx[b, l] < A_BK.shape[1]:
                out[b, l] = A_BK[b, idx[b, l]]
    return out


def permute_batch(batch, perm):
    return jax.tree.map(lambda x: x[perm], batch)

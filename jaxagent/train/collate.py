"""Episodes to arrays: `collate_host` pads trajectory records into the one host batch builder's
rows (`jaxagent.train.batch.build_batch`): tokens, the sampler's log-probs, action and feedback spans,
U2U segments with the polarity of their reaction labels, outcome rewards, dense group ids, and what
the environment said of each feedback (its kind, its alternatives);
`collate` puts the result on the device as a `CreditBatch` beside the old log-probs (host code).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from jaxagent.credit.batch import CreditBatch
from jaxagent.credit.reaction import polarity_of
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.train.batch import HostBatch, Row, build_batch


def collate_host(
    records: Sequence[Trajectory],
    *,
    length: int | None = None,
    turns: int | None = None,
    multiple: int = 64,
    polarity: Mapping[str, float] | None = None,
) -> HostBatch:
    """Records as `build_batch` rows: tokens, the sampler's log-probs, action and feedback spans,
    U2U segments with the polarity of their reaction labels (`jaxagent.credit.reaction.polarity_of`;
    ``polarity`` overrides the default map), the outcome reward, and group ids made dense in
    ``[0, G)`` (the group statistics index segment sums by them); each turn's feedback kind and
    alternatives when a record carries them (`Trajectory.feedback_kinds`, `feedback_alternatives`).

    ``length`` defaults to the longest record rounded up to ``multiple`` (a static shape);
    ``turns`` to the most action turns."""
    if not records:
        raise ValueError("records: empty; expected at least one trajectory")
    groups = np.unique([r.group_id for r in records], return_inverse=True)[1]
    rows = []
    for b, r in enumerate(records):
        segments = [(members, None if label is None else float(polarity_of([label], polarity)[0]))
                    for members, label in r.segments()]
        rows.append(Row(tokens=r.tokens, loss_mask=r.loss_mask(), logprobs=r.logprobs, actions=r.action_spans(),
                        feedback=r.feedback_spans(), segments=segments, reward=r.outcome_reward,
                        group=int(groups[b]), feedback_kinds=r.feedback_kinds() if r.message_kinds else None,
                        alternatives=r.feedback_alternatives() if r.alternatives else None))
    return build_batch(rows, length=length, turns=turns, multiple=multiple, noun="record",
                       names=[r.task_id for r in records])


def collate(
    records: Sequence[Trajectory],
    *,
    length: int | None = None,
    turns: int | None = None,
    multiple: int = 64,
    polarity: Mapping[str, float] | None = None,
) -> tuple[CreditBatch, np.ndarray]:
    """`collate_host`'s batch on the device (a `CreditBatch`) and the old log-probs [B, L] (entry
    i scores token i)."""
    host = collate_host(records, length=length, turns=turns, multiple=multiple, polarity=polarity)
    return host.credit_batch(), host.logprobs_BL


__all__ = ["collate", "collate_host"]

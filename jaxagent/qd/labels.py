"""Labelling candidate actions from their consequences (the Q&D spec's §4.2; host code).

The value of an ASK at a decision point is read from what its retrieval brought, with no judge:
Phi(s) = the uid coverage of the evidence held (`jaxagent.qd.metrics.coverage`'s quantity);
phi_gain = max(0, Phi(after) - Phi(before)); rho = 1 - n_new / n_retrieved, the share of the
retrieved units already held (0 when nothing was retrieved); and

    value = 0.5 * phi_gain - 0.1 * rho - c_ret        (c_ret = 0.05, the per-call cost)

A STOP is worth 0. (Forking runs and building SFT rows and preference pairs from these values is
Q&D part 2.)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import NamedTuple

from jaxagent.qd.graphs import NeedGraph

C_RET = 0.05
GAIN_WEIGHT, REDUNDANCY_WEIGHT = 0.5, 0.1


class AskValue(NamedTuple):
    phi_gain: float
    rho: float
    value: float


def held_coverage(held: Collection[int], graph: NeedGraph) -> float:
    """Phi: the share of the graph's required pool indices in ``held`` (NaN without required evidence)."""
    g = graph.required_evidence
    return len(g & set(held)) / len(g) if g else math.nan


def ask_value(held_before: Collection[int], retrieved: Sequence[int], graph: NeedGraph, *,
              c_ret: float = C_RET) -> AskValue:
    """The value of an ASK that retrieved ``retrieved`` (pool indices) with ``held_before`` held."""
    before = set(held_before)
    new = [u for u in dict.fromkeys(retrieved) if u not in before]
    after = before | set(new)
    gain = max(0.0, held_coverage(after, graph) - held_coverage(before, graph))
    rho = 1.0 - len(new) / len(retrieved) if retrieved else 0.0
    return AskValue(gain, rho, GAIN_WEIGHT * gain - REDUNDANCY_WEIGHT * rho - c_ret)


STOP_VALUE = 0.0

__all__ = ["C_RET", "STOP_VALUE", "AskValue", "ask_value", "held_coverage"]

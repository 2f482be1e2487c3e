"""The fusion of credit terms into one per-token advantage.

Shapes: B rollouts, L tokens, T action turns (padded), Q U2U segments (padded), G groups.

    A_BL = A_ext + beta * g * A_info + lam * A_proc     (+ any registered term)

`fuse_terms` sums the contributions of a tuple of `jaxagent.credit.terms.CreditTerm` objects in
order (registry order: `jaxagent.credit.registry`), each 0 off the agent tokens:

- ``grpo`` (`jaxagent.credit.grpo.GRPOTerm`): ``A_ext``, the GRPO outcome advantage of the rollout;
- ``infopo`` (`jaxagent.credit.infopo.InfoPOTerm`): ``beta * g * A_info``, the group-normalised
  information gain of each turn behind InfoPO's variance gate;
- ``faca`` (`jaxagent.credit.reaction.FacaTerm`): ``lam * A_proc``, the user's reaction to each
  U2U segment.

A term may silence another's contribution (InfoPO's ``use_ext=False`` silences the outcome term:
A = A_info, plus Faca when on); a silenced term still reports its diagnostics. Batch-padding rows
(no tokens) enter no group statistic and get no advantage. `fuse` is the same with the three
built-in terms named by their settings (None turns InfoPO or Faca off).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxagent.credit.batch import CreditBatch
from jaxagent.credit.grpo import GRPOConfig, GRPOTerm, safe_ratio
from jaxagent.credit.infopo import InfoPOConfig, InfoPOTerm
from jaxagent.credit.reaction import FacaConfig, FacaTerm
from jaxagent.credit.terms import CreditTerm, FuseContext


def fuse_terms(
    batch: CreditBatch,
    terms: Sequence[CreditTerm],
    inputs: Mapping[str, Any] | None = None,
    key: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The per-token advantage ``A_BL`` (float32 [B, L], 0 off the agent tokens): the sum of the
    ``terms``' contributions in the given order, with their diagnostics merged.

    ``inputs``: host-computed arrays the terms need (``r_info`` [B, T] for InfoPO); ``key``: a PRNG
    key (Faca's "random" ablation). Terms are static under jit (frozen dataclasses). Besides the
    terms' own diagnostics: ``cover/<term.cover>`` for each term and ``cover/total`` (float32
    scalars): the share of agent tokens where that contribution (and the sum) is nonzero."""
    batch.check()
    if not terms:
        raise ValueError("terms: empty; expected at least one credit term (the outcome term 'grpo')")
    B, L = batch.tokens_BL.shape
    agent_BL = jnp.asarray(batch.loss_mask_BL) != 0
    zeros_BL = jnp.zeros((B, L), jnp.float32)
    row_valid_B = jnp.any(jnp.asarray(batch.pad_mask_BL) != 0, axis=-1)
    inputs = dict(inputs or {})
    silenced = {name for t in terms for name in t.silences()}
    parts: dict[str, jax.Array] = {}
    diag: dict[str, jax.Array] = {}
    total_BL = None
    for term in terms:
        ctx = FuseContext(batch, agent_BL, row_valid_B, inputs, key, zeros_BL if total_BL is None else total_BL)
        part_BL, d = term.advantage(ctx)
        if term.name in silenced:
            part_BL = zeros_BL
        parts[term.name] = part_BL
        diag.update(d)
        total_BL = part_BL if total_BL is None else total_BL + part_BL
    ctx = FuseContext(batch, agent_BL, row_valid_B, inputs, key, total_BL)
    for term in terms:
        diag.update(term.finalize(ctx, parts, diag))
    n_agent = jnp.sum(agent_BL, dtype=jnp.float32)

    def cover(x_BL):
        return safe_ratio(jnp.sum(agent_BL & (x_BL != 0), dtype=jnp.float32), n_agent)

    for term in terms:
        diag[f"cover/{term.cover}"] = cover(parts[term.name])
    diag["cover/total"] = cover(total_BL)
    return total_BL, diag


def fuse(
    batch: CreditBatch,
    r_info_BT: jax.Array | None,
    infopo: InfoPOConfig | None,
    faca: FacaConfig | None,
    grpo: GRPOConfig = GRPOConfig(),
    key: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`fuse_terms` over the built-in terms: ``A_BL = A_ext + beta * g * A_info + lam * A_proc``.

    batch: the ``CreditBatch`` (group ids in ``[0, B)``). r_info_BT: ``[B, T]`` float per-turn
    information gain from ``infogain`` (ignored on turns ``infogain_valid_turns`` rejects; may be
    None when ``infopo`` is None). infopo / faca: None turns that term off. grpo: settings of
    A_ext. key: PRNG key, needed only for Faca's "random" ablation. Configs are static under jit.

    Returns ``(A_BL float32 [B, L], diagnostics)``: A_BL is 0 off the agent tokens. Diagnostics
    (float32 unless noted): ``A_ext_B`` and ``zero_adv_group_share`` (`GRPOTerm`); with InfoPO those
    of `InfoPOTerm` (``r_info_BT``, ``info_valid_BT``, ``A_info_BT``, ``gate_B``, ``gate_G``,
    ``info_l1_share``, ``info/*``); with Faca those of `FacaTerm` (``A_proc_BQ``, ``faca/*``);
    coverage ``cover/ext``, ``cover/total`` and with the terms on ``cover/info``, ``cover/proc``.
    """
    terms: list[CreditTerm] = [GRPOTerm(grpo)]
    if infopo is not None:
        terms.append(InfoPOTerm(infopo))
    if faca is not None:
        terms.append(FacaTerm(faca))
    return fuse_terms(batch, tuple(terms), {"r_info": r_info_BT}, key)


__all__ = ["fuse", "fuse_terms"]

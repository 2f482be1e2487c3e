"""Credit terms: the protocol every per-token advantage term implements, and its registry.

Shapes: B rollouts, L tokens, T action turns (padded), Q U2U segments (padded), G groups.

A credit term is a frozen dataclass (hashable: a static argument to ``jax.jit``) holding its own
settings. `jaxagent.credit.fusion.fuse_terms` sums the terms' contributions in registry order:

    A_BL = sum over terms of term.advantage(ctx)   (0 off the agent tokens)

GRPO's outcome term (``grpo``), InfoPO's information gain (``infopo``) and Faca's reaction
credit (``faca``) are the built-in terms. A new term needs no edit of this package:

    @dataclasses.dataclass(frozen=True)
    class LengthPenalty(CreditTerm):
        settings: MySettings = MySettings()
        name: ClassVar[str] = "length"
        cover: ClassVar[str] = "length"
        settings_type: ClassVar[type] = MySettings

        def advantage(self, ctx):
            ...
            return A_BL, {"length/mean": ...}

    register_credit_term(LengthPenalty)      # then rl.credit=length (or infopo+length)

What a term may read is the `FuseContext`: the batch, which tokens are the agent's, which rows
are real, the host-computed inputs it ``needs`` (the trainer computes them: ``r_info`` is the
teacher-forced information gain, `jaxagent.train.rl.CREDIT_INPUTS`), a PRNG key, and the sum of
the terms fused before it. Diagnostics are a dict of arrays; a key with a ``/`` is logged as an
RL metric (a scalar as a number, a 1-D array as a list over action turns).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

import jax

from jaxagent.credit.batch import CreditBatch

#: The outcome term every composition holds first (its contribution may be silenced: `CreditTerm.silences`).
OUTCOME_TERM = "grpo"


class FuseContext(NamedTuple):
    """What a term reads. ``agent_BL`` bool [B, L]: the trained tokens; ``row_valid_B`` bool [B]:
    rows with tokens (batch-padding rows have none and get no statistic); ``inputs``: host-computed
    arrays by name (`CreditTerm.needs`); ``key``: a PRNG key or None; ``before_BL`` float32
    [B, L]: the sum of the contributions fused before this term (zeros for the first)."""

    batch: CreditBatch
    agent_BL: jax.Array
    row_valid_B: jax.Array
    inputs: Mapping[str, Any]
    key: jax.Array | None
    before_BL: jax.Array


class CreditTerm(abc.ABC):
    """One per-token advantage term. Subclasses are frozen dataclasses (static under jit) with a
    ``settings`` field when they take settings, and set the class variables:

    - ``name``: the registry name (``rl.credit`` lists them, joined by ``+``);
    - ``cover``: the coverage key (``cover/<cover>``: the share of agent tokens the term moves);
    - ``needs``: names of host-computed inputs (`FuseContext.inputs`);
    - ``settings_type``: the settings class (None: the term takes none).
    """

    name: ClassVar[str]
    cover: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ()
    settings_type: ClassVar[type | None] = None

    @abc.abstractmethod
    def advantage(self, ctx: FuseContext) -> tuple[jax.Array, dict[str, jax.Array]]:
        """(the term's weighted contribution float32 [B, L], exactly 0 off ``ctx.agent_BL``; its
        diagnostics)."""

    def silences(self) -> tuple[str, ...]:
        """Names of terms whose contribution this one switches off (their diagnostics stay): InfoPO
        with ``use_ext=False`` silences the outcome term."""
        return ()

    def finalize(self, ctx: FuseContext, parts: Mapping[str, jax.Array],
                 diag: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """Diagnostics that need every term's contribution (``parts``: name -> [B, L], in fusion
        order, silenced terms as zeros; ``diag``: every term's diagnostics). None by default."""
        return {}


def check_term_class(cls: Any) -> None:
    """Raises TypeError naming what a term class lacks (a frozen dataclass subclassing `CreditTerm`
    with ``name``, ``cover`` and, with ``settings_type``, a ``settings`` field)."""
    if not (isinstance(cls, type) and issubclass(cls, CreditTerm)):
        raise TypeError(f"{cls!r}: expected a subclass of jaxagent.credit.terms.CreditTerm")
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):
        raise TypeError(f"{cls.__name__}: expected a frozen dataclass (a static argument to jax.jit)")
    for attr in ("name", "cover"):
        value = getattr(cls, attr, None)
        if not isinstance(value, str) or not value or "+" in value or "/" in value:
            raise TypeError(f"{cls.__name__}.{attr}={value!r}: expected a non-empty name without '+' or '/'")
    fields = {f.name for f in dataclasses.fields(cls)}
    if cls.settings_type is not None and "settings" not in fields:
        raise TypeError(f"{cls.__name__}: settings_type={cls.settings_type.__name__} but no 'settings' field")


__all__ = ["OUTCOME_TERM", "CreditTerm", "FuseContext", "check_term_class"]

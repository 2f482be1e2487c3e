"""The one host-side batch builder: rows of token ids with their turn layout -> padded arrays.

Every padded batch of the project is built here: RL episodes (`jaxagent.train.collate.collate`),
SFT demonstrations (`jaxagent.jobs.phases.sft_batch`), the synthetic batches of tests and
benchmarks (`jaxagent.train.synthetic`), and hand-laid test batches. Host code (numpy); the
device sees the result once, through `HostBatch.credit_batch`.

A `Row` is one sequence: its tokens and, for credit assignment, where its action turns and the
feedback after each lie, and how its turns group into U2U segments with the polarity of the user
reaction that ends each. Shapes: B rows, L tokens (padded), T action turns (padded), Q segments
(padded).

`packed_length` (the shared-prefix info gain's static packed length: every row's trajectory plus
all its counterfactual suffixes) is computed here, from the host arrays, once per batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.credit.batch import CreditBatch
from jaxagent.credit.batch import infogain_valid_turns


@dataclasses.dataclass(frozen=True)
class Row:
    """One sequence. Spans are ``(start, end)`` token positions, end exclusive.

    - ``loss_mask``: per token, what is trained (default: the action spans' tokens);
    - ``logprobs``: per token, the sampler's log-prob (entry i scores token i; default 0);
    - ``actions``: per action turn, its span; ``feedback``: per action turn, the span of the
      feedback's content that follows it (``(e, e)`` when none; default: none for every turn);
    - ``segments``: U2U segments, each ``(turn indices, polarity)`` with polarity None for a
      segment no user reaction ends (kept invalid);
    - ``reward``: the outcome reward; ``group``: the group id (rows sharing a prompt);
    - ``feedback_kinds``: per action turn, what its feedback is (0 unmarked, 1 information, 2 a
      correction; `Trajectory.feedback_kinds`), or None (unmarked);
    - ``alternatives``: per action turn, the replies its feedback could have been (`Alternatives`:
      the marginal prior of InfoPO), or None for every turn.
    """

    tokens: Sequence[int]
    loss_mask: Sequence[float] | None = None
    logprobs: Sequence[float] | None = None
    actions: Sequence[tuple[int, int]] = ()
    feedback: Sequence[tuple[int, int]] | None = None
    segments: Sequence[tuple[Sequence[int], float | None]] = ()
    reward: float = 0.0
    group: int = 0
    feedback_kinds: Sequence[int] | None = None
    alternatives: Sequence[Alternatives | None] | None = None


Alternatives = Sequence[tuple[tuple[int, int], Sequence[tuple[Sequence[int], float]]]]
"""The replies one feedback could have been: per message of the feedback that has alternatives,
``((content_start, content_end), [(content token ids, probability), ...])``; the feedback is
every combination of them (probabilities multiplied). A feedback without alternatives is
deterministic given the history."""


@dataclasses.dataclass(frozen=True)
class HostBatch:
    """The padded numpy arrays of a batch (fields named as `CreditBatch`'s, plus ``logprobs_BL``)."""

    tokens_BL: np.ndarray  # int32
    pad_mask_BL: np.ndarray  # int32
    loss_mask_BL: np.ndarray  # float32
    logprobs_BL: np.ndarray  # float32
    turn_idx_BL: np.ndarray  # int32, -1 off actions
    action_span_BT2: np.ndarray  # int32
    feedback_span_BT2: np.ndarray  # int32
    turn_valid_BT: np.ndarray  # bool
    segment_idx_BL: np.ndarray  # int32, -1 off actions
    segment_polarity_BQ: np.ndarray  # float32
    segment_valid_BQ: np.ndarray  # bool
    reward_B: np.ndarray  # float32
    group_id_B: np.ndarray  # int32
    feedback_kind_BT: np.ndarray | None = None  # int32: 0 unmarked, 1 information, 2 correction
    alternatives: tuple[tuple[Alternatives | None, ...], ...] | None = None  # [B][T], host only

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens_BL.shape)

    def credit_batch(self) -> CreditBatch:
        """The batch on the device, shape-checked (`CreditBatch.check`)."""
        fields = {f.name: None if getattr(self, f.name) is None else jnp.asarray(getattr(self, f.name))
                  for f in dataclasses.fields(CreditBatch)}
        return CreditBatch(**fields).check()

    def packed_length(self, P: int, placeholder_mode: str = "replace", multiple: int = 64) -> int:
        """`packed_length` of this batch (host arrays: no device round trip)."""
        return packed_length(self, P, placeholder_mode, multiple)


def build_batch(rows: Sequence[Row], *, length: int | None = None, turns: int | None = None,
                segments: int | None = None, multiple: int = 64, noun: str = "row",
                names: Sequence[str] | None = None) -> HostBatch:
    """Pads ``rows`` into a `HostBatch`.

    ``length`` defaults to the longest row rounded up to ``multiple`` (a static shape);
    ``turns`` / ``segments`` to the most action turns / segments of any row (at least 1).
    Errors name a row as ``noun`` and its index, with ``names[index]`` when given."""
    if not rows:
        raise ValueError(f"{noun}s: empty; expected at least one {noun}")

    def which(b: int) -> str:
        return f"{noun} {b}" + (f" ({names[b]!r})" if names is not None else "")

    B = len(rows)
    longest = max(len(r.tokens) for r in rows)
    L = length or -(-longest // multiple) * multiple
    if longest > L:
        raise ValueError(f"length={L}: shorter than the longest {noun} ({longest} tokens)")
    most_turns = max(len(r.actions) for r in rows)
    T = turns or max(1, most_turns)
    if most_turns > T:
        b = next(i for i, r in enumerate(rows) if len(r.actions) > T)
        raise ValueError(f"turns={T}: {which(b)} has {len(rows[b].actions)} action turns")
    most_segments = max(len(r.segments) for r in rows)
    Q = segments or max(1, most_segments)
    if most_segments > Q:
        b = next(i for i, r in enumerate(rows) if len(r.segments) > Q)
        raise ValueError(f"segments={Q}: {which(b)} has {len(rows[b].segments)} segments")
    tokens = np.zeros((B, L), np.int32)
    pad = np.zeros((B, L), np.int32)
    loss = np.zeros((B, L), np.float32)
    logprobs = np.zeros((B, L), np.float32)
    turn_idx = np.full((B, L), -1, np.int32)
    seg_idx = np.full((B, L), -1, np.int32)
    act = np.zeros((B, T, 2), np.int32)
    fb = np.zeros((B, T, 2), np.int32)
    tv = np.zeros((B, T), bool)
    pol = np.zeros((B, Q), np.float32)
    sv = np.zeros((B, Q), bool)
    marked = any(r.feedback_kinds is not None for r in rows)
    kinds = np.zeros((B, T), np.int32) if marked else None
    with_alts = any(r.alternatives is not None for r in rows)
    alts: list[tuple] = []
    for b, r in enumerate(rows):
        for name in ("feedback_kinds", "alternatives"):
            got = getattr(r, name)
            if got is not None and len(got) != len(r.actions):
                raise ValueError(f"{which(b)}: {len(got)} {name} for {len(r.actions)} action turns")
        if kinds is not None and r.feedback_kinds is not None:
            kinds[b, : len(r.feedback_kinds)] = r.feedback_kinds
        if with_alts:
            row_alts = list(r.alternatives or [None] * len(r.actions))
            alts.append(tuple(row_alts + [None] * (T - len(row_alts))))
        n = len(r.tokens)
        tokens[b, :n] = r.tokens
        pad[b, :n] = 1
        if r.logprobs is not None:
            logprobs[b, :n] = r.logprobs
        feedback = r.feedback if r.feedback is not None else [(e, e) for _, e in r.actions]
        if len(feedback) != len(r.actions):
            raise ValueError(f"{which(b)}: {len(feedback)} feedback spans for {len(r.actions)} action turns")
        for t, ((s, e), f) in enumerate(zip(r.actions, feedback)):
            act[b, t] = (s, e)
            fb[b, t] = f
            tv[b, t] = True
            turn_idx[b, s:e] = t
        if r.loss_mask is not None:
            loss[b, : len(r.loss_mask)] = r.loss_mask
        else:
            loss[b] = turn_idx[b] >= 0
        for q, (members, polarity) in enumerate(r.segments):
            for t in members:
                s, e = r.actions[t]
                seg_idx[b, s:e] = q
            sv[b, q] = polarity is not None
            pol[b, q] = 0.0 if polarity is None else float(polarity)
    return HostBatch(tokens_BL=tokens, pad_mask_BL=pad, loss_mask_BL=loss, logprobs_BL=logprobs,
                     turn_idx_BL=turn_idx, action_span_BT2=act, feedback_span_BT2=fb, turn_valid_BT=tv,
                     segment_idx_BL=seg_idx, segment_polarity_BQ=pol, segment_valid_BQ=sv,
                     reward_B=np.asarray([r.reward for r in rows], np.float32),
                     group_id_B=np.asarray([r.group for r in rows], np.int32), feedback_kind_BT=kinds,
                     alternatives=tuple(alts) if with_alts else None)


def packed_length(batch: HostBatch | CreditBatch, P: int, placeholder_mode: str = "replace",
                  multiple: int = 64) -> int:
    """The shared-prefix info gain's packed length: what holds every row's trajectory and all its
    counterfactual suffixes (at least the padded length L), rounded up to ``multiple`` (a static
    shape; bucketing limits recompilation). Host arithmetic (a `CreditBatch` on the device is
    pulled back first: pass the `HostBatch` where there is one)."""
    fb = np.asarray(batch.feedback_span_BT2)
    act = np.asarray(batch.action_span_BT2)
    nxt_end = np.concatenate([act[:, 1:, 1], np.zeros_like(act[:, :1, 1])], axis=1)
    with jax.default_device(jax.local_devices(backend="cpu")[0]):  # [B, T] spans only, on the host
        valid = np.asarray(infogain_valid_turns(batch))
    pad = np.asarray(batch.pad_mask_BL) != 0
    L = pad.shape[1]
    ends = np.where(pad.any(axis=1), L - np.argmax(pad[:, ::-1], axis=1), 0)
    r_len = np.full(fb.shape[:2], P) if placeholder_mode == "replace" else fb[..., 1] - fb[..., 0]
    suffix = np.where(valid, r_len + nxt_end - fb[..., 1], 0).sum(axis=1)
    need = max(L, int((ends + suffix).max(initial=0)))
    return -(-need // multiple) * multiple


__all__ = ["Alternatives", "HostBatch", "Row", "build_batch", "packed_length"]

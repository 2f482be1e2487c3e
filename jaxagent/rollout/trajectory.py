"""One record per episode, token-in/token-out (host code).

A `Trajectory` is built from the `RenderedChat` a `ChatRenderer` finished (the tokens exactly as
the model saw and produced them) plus what the environment reported. From the message spans it
derives:

- **action turns**: each generated assistant message; its span is the model's tokens
  (``content_start .. generated_end``: the stop token included, the template's prefix excluded);
- **feedback after action t**: the content of the messages between action t and the next action
  (user messages or tool results). Several consecutive messages (e.g. two tool results) form one
  observation whose span runs from the first content's start to the last content's end (the
  template tokens between them included: InfoPO replaces the observation as a unit);
- **U2U segments**: the actions between one user message and the next user message; segment q
  is followed by the reaction label of the user message that ends it (tool results do not end a
  segment). Actions before the first user message belong to no segment. The user's reaction to
  the episode's last segment (e.g. the verdict on the final answer) comes with the step that ends
  the episode, whose messages are not appended to the tokens (no action follows them): it is kept
  as ``final_reaction`` and labels that last segment.

What the environment said of its messages (`jaxagent.envs.base.EnvMessage`) is kept per message
as well: ``message_kinds`` (information / correction, or None) and ``alternatives`` (the token
ids of the replies a message could have been, with their probabilities); per action turn they
give `feedback_kinds` and `feedback_alternatives`.

Per-token ``logprobs`` are aligned with ``tokens``: entry i is log pi(tokens[i] | tokens[:i])
under the distribution that sampled it (the policy at the sampling temperature, with the
sampler's filters; the raw policy for greedy turns; 0 where the token was not generated).
`to_jsonl`/`from_jsonl` write and read a run's records; `jaxagent.train.collate` pads records into
the credit batch (rollout emits trajectories; training turns them into arrays).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from jaxagent.text.spans import MessageSpan, RenderedChat

Termination = Literal["done", "max_turns", "max_tokens", "simulator_failure", "format_error", "timeout"]
TERMINATIONS = ("done", "max_turns", "max_tokens", "simulator_failure", "format_error", "timeout")


@dataclasses.dataclass
class Trajectory:
    """Everything one episode produced; see the module docstring for the derived structure."""

    task_id: str
    group_id: int
    tokens: list[int]
    logprobs: list[float]
    spans: list[MessageSpan]  # as the renderer reported them
    turn_rewards: list[float]  # per action turn (environment step rewards)
    outcome_reward: float
    reaction_labels: list[str | None]  # per message (None where the message is not a user message)
    termination: Termination = "done"
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    # the label of the user message that ended the episode (not in the tokens): the last segment's
    final_reaction: str | None = None
    # per message: "information" / "correction" / None (empty: none marked)
    message_kinds: list[str | None] = dataclasses.field(default_factory=list)
    # [message index, [[content token ids, probability], ...]] for each message with alternatives
    alternatives: list[list] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if len(self.logprobs) != len(self.tokens):
            raise ValueError(f"logprobs: length {len(self.logprobs)}, expected len(tokens)={len(self.tokens)}")
        if len(self.reaction_labels) != len(self.spans):
            raise ValueError(f"reaction_labels: length {len(self.reaction_labels)}, expected one per span "
                             f"({len(self.spans)})")
        if self.message_kinds and len(self.message_kinds) != len(self.spans):
            raise ValueError(f"message_kinds: length {len(self.message_kinds)}, expected one per span "
                             f"({len(self.spans)}) or none")
        for entry in self.alternatives:
            i = entry[0]
            if not 0 <= i < len(self.spans) or self.spans[i].generated:
                raise ValueError(f"alternatives: message {i} is not an environment message of this record")
        if self.termination not in TERMINATIONS:
            raise ValueError(f"termination={self.termination!r}: expected one of {TERMINATIONS}")
        if len(self.turn_rewards) != len(self.action_spans()):
            raise ValueError(f"turn_rewards: length {len(self.turn_rewards)}, expected one per action turn "
                             f"({len(self.action_spans())})")

    # ------------------------------------------------------------------ derived structure
    def loss_mask(self) -> np.ndarray:
        """1 on the model's tokens (every generated message, stop tokens included), 0 elsewhere."""
        mask = np.zeros(len(self.tokens), np.int32)
        for s in self.spans:
            if s.generated:
                mask[s.content_start : s.generated_end] = 1
        return mask

    def _action_indices(self) -> list[int]:
        return [i for i, s in enumerate(self.spans) if s.generated]

    def action_spans(self) -> list[tuple[int, int]]:
        return [(self.spans[i].content_start, self.spans[i].generated_end) for i in self._action_indices()]

    def feedback_spans(self) -> list[tuple[int, int]]:
        """Per action turn, the content span of the observation that follows it (empty if none)."""
        acts = self._action_indices()
        out = []
        for k, i in enumerate(acts):
            nxt = acts[k + 1] if k + 1 < len(acts) else len(self.spans)
            between = [s for s in self.spans[i + 1 : nxt] if s.role in ("user", "tool")]
            if between:
                out.append((between[0].content_start, between[-1].content_end))
            else:
                end = self.spans[i].end
                out.append((end, end))
        return out

    def _between(self) -> list[list[int]]:
        """Per action turn, the indices of the messages between it and the next action."""
        acts = self._action_indices()
        return [list(range(i + 1, acts[k + 1] if k + 1 < len(acts) else len(self.spans)))
                for k, i in enumerate(acts)]

    def feedback_kinds(self) -> list[int]:
        """Per action turn, what its feedback is: 2 when a message of it is a correction, else 1
        when one is information, else 0 (unmarked)."""
        kinds = self.message_kinds or [None] * len(self.spans)
        out = []
        for idx in self._between():
            ks = {kinds[i] for i in idx}
            out.append(2 if "correction" in ks else 1 if "information" in ks else 0)
        return out

    def feedback_alternatives(self) -> list[list[tuple[tuple[int, int], list[tuple[list[int], float]]]] | None]:
        """Per action turn, the replies its feedback could have been: for each of its messages
        with alternatives, ``((content_start, content_end), [(token ids, probability), ...])``;
        None for a turn whose feedback has none (deterministic given the history)."""
        by_msg = {int(e[0]): [(list(ids), float(p)) for ids, p in e[1]] for e in self.alternatives}
        out = []
        for idx in self._between():
            got = [((self.spans[i].content_start, self.spans[i].content_end), by_msg[i]) for i in idx if i in by_msg]
            out.append(got or None)
        return out

    def segments(self) -> list[tuple[list[int], str | None]]:
        """U2U segments: (action turn indices, the reaction label of the user message ending it);
        the last segment, which no user message in the tokens ends, gets ``final_reaction``
        (None when the episode ended without a user reaction)."""
        out: list[tuple[list[int], str | None]] = []
        current: list[int] | None = None
        turn = 0
        for i, s in enumerate(self.spans):
            if s.generated:
                if current is not None:
                    current.append(turn)
                turn += 1
            elif s.role == "user":
                if current:
                    out.append((current, self.reaction_labels[i]))
                current = []
        if current:
            out.append((current, self.final_reaction))
        return out

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_rendered(
        cls,
        record: RenderedChat,
        *,
        task_id: str,
        group_id: int,
        generated_logprobs: Sequence[Sequence[float]],
        turn_rewards: Sequence[float],
        outcome_reward: float,
        reaction_labels: Mapping[int, str] | None = None,
        termination: Termination = "done",
        timings: Mapping[str, float] | None = None,
        info: Mapping[str, Any] | None = None,
        final_reaction: str | None = None,
        message_kinds: Mapping[int, str] | None = None,
        alternatives: Mapping[int, Sequence[tuple[Sequence[int], float]]] | None = None,
    ) -> Trajectory:
        """A record from a finished `RenderedChat`. ``generated_logprobs[k]`` are the policy
        log-probs of the k-th generated message's tokens (as `generate` returned them, stop token
        included); ``reaction_labels`` maps message index -> the user's private label;
        ``final_reaction``: the label of the user message that ended the episode (not rendered);
        ``message_kinds``: message index -> feedback kind; ``alternatives``: message index ->
        [(content token ids, probability), ...]."""
        spans = list(record.spans)
        logprobs = np.zeros(len(record.tokens), np.float64)
        gen = [s for s in spans if s.generated]
        if len(gen) != len(generated_logprobs):
            raise ValueError(f"generated_logprobs: {len(generated_logprobs)} lists, expected one per generated "
                             f"message ({len(gen)})")
        for k, (s, lp) in enumerate(zip(gen, generated_logprobs)):
            n = s.generated_end - s.content_start
            if len(lp) != n:
                raise ValueError(f"generated_logprobs[{k}]: {len(lp)} values, expected {n} (the message's tokens)")
            logprobs[s.content_start : s.generated_end] = lp
        labels = [None] * len(spans)
        for i, label in (reaction_labels or {}).items():
            if not 0 <= i < len(spans) or spans[i].role != "user":
                raise ValueError(f"reaction_labels[{i}]: expected the index of a user message")
            labels[i] = label
        kinds = [None] * len(spans) if message_kinds else []
        for i, kind in (message_kinds or {}).items():
            kinds[i] = kind
        alts = [[int(i), [[list(map(int, ids)), float(p)] for ids, p in replies]]
                for i, replies in sorted((alternatives or {}).items())]
        return cls(task_id=task_id, group_id=int(group_id), tokens=list(record.tokens), logprobs=logprobs.tolist(),
                   spans=spans, turn_rewards=[float(r) for r in turn_rewards], outcome_reward=float(outcome_reward),
                   reaction_labels=labels, termination=termination, timings=dict(timings or {}),
                   info=dict(info or {}), final_reaction=final_reaction, message_kinds=kinds, alternatives=alts)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["spans"] = [dataclasses.asdict(s) for s in self.spans]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trajectory:
        d = dict(d)
        d["spans"] = [MessageSpan(**s) for s in d["spans"]]
        return cls(**d)


def to_jsonl(records: Iterable[Trajectory], path: str | Path) -> Path:
    """Writes one JSON object per line (atomically: a temporary file renamed into place)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for r in records:
            f.write(json.dumps(r.to_dict(), separators=(",", ":")) + "\n")
    tmp.replace(path)
    return path


def from_jsonl(path: str | Path) -> list[Trajectory]:
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(Trajectory.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{n}: not a trajectory record ({e})") from None
    return out


__all__ = ["TERMINATIONS", "Termination", "Trajectory", "from_jsonl", "to_jsonl"]

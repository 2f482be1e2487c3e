"""Rollouts (host code): trajectory records built token-in/token-out, and the collator to the
credit batch."""

from jaxagent.rollout.trajectory import TERMINATIONS, Span, Trajectory, collate, from_jsonl, to_jsonl

__all__ = ["TERMINATIONS", "Span", "Trajectory", "collate", "from_jsonl", "to_jsonl"]

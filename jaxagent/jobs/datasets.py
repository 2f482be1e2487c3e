"""The rows of ``sft.data`` (job=sft) and ``dpo.data`` (job=dpo): each row's format detected,
validated and located, then tokenised as the policy sees it (docs/DATA.md).

Formats, detected row by row (a file may mix them):

- a row with ``state_id``: Q&D's (`jaxagent.qd.labels.SFTRow` / `Pair`, job=qd_label's sft.jsonl,
  decisions.jsonl, pairs.jsonl), validated as `jaxagent.qd.labels` reads them;
- else transformers / TRL's chat formats (`jaxagent.text.datasets`): SFT ``messages`` or
  ``prompt`` + ``completion``; DPO ``prompt`` + ``chosen`` + ``rejected``, standard (strings) or
  conversational (lists of messages).

A bad row is refused as ``FILE:LINE: field=value: expected ...`` (`DataError`).

Tokens. A string prompt with a string completion (a Q&D row, a standard prompt-completion row or
pair) is what the Q&D questioner conditions on and generates: one user turn and the assistant's
generation prompt with thinking disabled (`jaxagent.qd.agents.decision_prompt_ids`), the text and
the end-of-turn token (`completion_ids`). A conversation (``messages``, a conversational
prompt-completion row or pair) is rendered token-in/token-out as the rollout loop renders an
episode (`jaxagent.rollout.demos.render_demo`: the checkpoint's chat template, tool calls in the
project's ``<tool_call>`` form, the row's tools in the system turn unless
``rollout.tool_schemas_in_prompt=false``); the loss mask is exactly the trained assistant turns'
generated tokens (content, tool calls, end-of-turn token). SFT rows become `RowTokens` (the prompt:
every token before the first trained one; the completion: up to the last trained token, with its
mask), pairs `PairTokens` (the prompt: every token before the completion; a completion of several
assistant messages scores the template's tokens between them too, as TRL scores a completion).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from jaxagent.envs.base import Demo
from jaxagent.qd import labels
from jaxagent.qd.agents import completion_ids, decision_prompt_ids
from jaxagent.rollout.demos import render_demo
from jaxagent.text.datasets import (MISSING, ChatExample, ChatPair, DataError, FieldError, Located, TextExample,
                                    TextPair, parse_pair_row, parse_sft_row, read_jsonl)
from jaxagent.text.spans import ChatInputError
from jaxagent.text.template import ChatTemplateError
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.train.dpo import PairTokens
from jaxagent.train.rows import RowTokens

_SFT_KEYS = ("messages", "prompt", "completion")
_PAIR_KEYS = ("prompt", "chosen", "rejected")


def _qd(cls, obj: Mapping[str, Any]):
    try:
        return cls.from_json(obj)
    except labels.RecordError as e:
        raise FieldError(e.field, MISSING if e.value == "<missing>" else e.value, e.expected) from None


def sft_record(obj: Any) -> labels.SFTRow | TextExample | ChatExample:
    """One decoded ``sft.data`` row as its record (module docstring); `FieldError` on a bad field."""
    if isinstance(obj, Mapping) and "state_id" in obj:
        return _qd(labels.SFTRow, obj)
    if isinstance(obj, Mapping) and not any(k in obj for k in _SFT_KEYS):
        raise FieldError("row", sorted(obj), "the keys 'messages', or 'prompt' and 'completion', or a Q&D row's "
                                             "(job=qd_label's sft.jsonl: 'state_id', 'prompt', 'completion', ...); "
                                             "docs/DATA.md")
    return parse_sft_row(obj)


def pair_record(obj: Any) -> labels.Pair | TextPair | ChatPair:
    """One decoded ``dpo.data`` row as its record (module docstring); `FieldError` on a bad field."""
    if isinstance(obj, Mapping) and "state_id" in obj:
        return _qd(labels.Pair, obj)
    if isinstance(obj, Mapping) and not any(k in obj for k in _PAIR_KEYS):
        raise FieldError("row", sorted(obj), "the keys 'prompt', 'chosen' and 'rejected', or a Q&D pair's "
                                             "(job=qd_label's pairs.jsonl: 'state_id', 'prompt', 'chosen', ...); "
                                             "docs/DATA.md")
    return parse_pair_row(obj)


def read_sft_data(path: str | os.PathLike) -> list[Located]:
    """Every row of ``path`` (an ``sft.data`` file), located; `DataError` on the first bad one."""
    return read_jsonl(path, sft_record)


def read_pair_data(path: str | os.PathLike) -> list[Located]:
    """Every pair of ``path`` (a ``dpo.data`` file), located; `DataError` on the first bad one."""
    return read_jsonl(path, pair_record)


def stage_rows(rows: list[Located], stage: int) -> list[Located]:
    """The pairs a DPO stage trains on: the Q&D pairs of ``stage`` (`labels.stage_pairs`) and every
    pair of the TRL formats (they have no stage)."""
    return [r for r in rows if not isinstance(r.record, labels.Pair) or labels.stage_pairs([r.record], stage)]


def record_kind(record: Any) -> str:
    """A row's kind in the jobs' counts: a Q&D SFT row's ``ASK`` / ``STOP``, a Q&D pair's
    ``kind/decided_by``, a chat row's format (``messages``, ``prompt_completion``,
    ``prompt_completion_chat``, ``standard``, ``conversational``)."""
    if isinstance(record, labels.Pair):
        return f"{record.kind}/{record.decided_by}"
    return record.kind


def _located(row: Any) -> Located:
    return row if isinstance(row, Located) else Located("<rows>", 0, row)


def _render(row: Located, messages, train, tools, tok: Tokenizer, schemas: bool, field: str):
    """``render_demo`` of a conversation, its template's refusal located; (ids, mask, first and last
    trained token)."""
    try:
        ids, mask = render_demo(Demo(f"{row.path}:{row.line}", tuple(messages), tuple(train), 0.0, tuple(tools)),
                                tok, tool_schemas_in_prompt=schemas)
    except (ChatTemplateError, ChatInputError) as e:
        raise DataError(row.path, row.line, field, list(messages),
                        f"a conversation the chat template renders ({e})") from None
    trained = [i for i, m in enumerate(mask) if m]
    return ids, mask, trained[0], trained[-1] + 1


def sft_tokens(row: Located | Any, tok: Tokenizer, *, tool_schemas_in_prompt: bool = True) -> RowTokens:
    """A row (or a bare record) of `read_sft_data` as `RowTokens` (module docstring)."""
    row = _located(row)
    r = row.record
    if isinstance(r, (labels.SFTRow, TextExample)):
        return RowTokens(decision_prompt_ids(tok, r.prompt), completion_ids(tok, r.completion),
                         float(getattr(r, "weight", 1.0)))
    ids, mask, a, b = _render(row, r.messages, r.train, r.tools, tok, tool_schemas_in_prompt, "messages")
    return RowTokens(ids[:a], ids[a:b], 1.0, tuple(mask[a:b]))


def pair_tokens(row: Located | Any, tok: Tokenizer, *, tool_schemas_in_prompt: bool = True) -> PairTokens:
    """A pair (or a bare record) of `read_pair_data` as `PairTokens` (module docstring)."""
    row = _located(row)
    p = row.record
    if isinstance(p, (labels.Pair, TextPair)):
        return PairTokens(decision_prompt_ids(tok, p.prompt), completion_ids(tok, p.chosen),
                          completion_ids(tok, p.rejected))
    sides = []
    for name in ("chosen", "rejected"):
        completion = getattr(p, name)
        ids, _, a, b = _render(row, p.prompt + completion, [False] * len(p.prompt) + [True] * len(completion),
                               p.tools, tok, tool_schemas_in_prompt, name)
        sides.append((ids[:a], ids[a:b]))
    (prompt, chosen), (prompt_r, rejected) = sides
    if prompt != prompt_r:  # a template that renders the prompt by what follows it
        raise DataError(row.path, row.line, "prompt", list(p.prompt),
                        "a prompt the chat template renders to the same tokens before chosen and before rejected")
    return PairTokens(prompt, chosen, rejected)


__all__ = ["pair_record", "pair_tokens", "read_pair_data", "read_sft_data", "record_kind", "sft_record", "sft_tokens",
           "stage_rows"]

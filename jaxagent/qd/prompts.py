"""The questioner's prompt and its action contract (the Q&D spec's §1.1), pure string functions.

`render_state` writes the state s_t = (task, evidence held, draft, history) as the prompt's
sections in order: task; the suite's instructions; the evidence so far (each unit as a short id,
its title and the first 1,200 characters of its text, in canonical id order, so the block depends
only on the held set; "(nothing retrieved yet)" when empty); the current draft ("(no draft
yet)"); the history as ``Q1:`` / ``A1:`` lines ("(nothing asked yet)"); guidance on choosing and
stopping; the output contract. It never shows the budget, the turn index or the need graph.

`parse_action` reads a reply: the first balanced ``{...}`` (a code fence stripped), ``action``
compared case-insensitively; an ASK with an empty question, or anything unparseable, is
**malformed** (counted, and acted on as a STOP).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Literal

EVIDENCE_CHARS = 1200

SUITE_INSTRUCTIONS = {
    "musique": "The question needs several facts found one after another: an answer found in one "
               "paragraph names what the next question must be about.",
    "strategyqa": "The question is a yes/no question whose answer follows from facts it does not state: "
                  "find the facts an answer would rest on.",
    "2wiki": "The question compares or chains facts about the entities it names: find each fact.",
    "synthetic": "The question needs a chain of facts: each paragraph found names the entity the next "
                 "question must be about.",
}

GUIDANCE = """How to choose the next question:
- Ask for what the evidence above does not resolve yet, including needs the task implies but does not state.
- When evidence names a new entity the answer depends on, ask about that entity by name.
- Name entities explicitly; one need per question.
Stop when the evidence held is enough to answer the task, or when no question would add to it."""

CONTRACT = """Reply with exactly one JSON object and nothing else, either
{"action": "ask", "question": "...", "rationale": "...", "parent_uids": ["<evidence id>", ...]}
or
{"action": "stop", "rationale": "..."}"""


@dataclasses.dataclass(frozen=True)
class EvidenceView:
    """One held unit as the questioner sees it."""

    uid: str
    title: str
    text: str


def render_state(*, question: str, benchmark: str, evidence: Sequence[EvidenceView], draft: str,
                 history: Sequence[tuple[str, str]], instructions: str | None = None) -> str:
    """The questioner's prompt for one decision (module docstring); ``instructions`` replaces the
    suite's (the tau2 transfer's routing paragraphs, `jaxagent.qd.tau2`)."""
    held = sorted(evidence, key=lambda e: _uid_key(e.uid))
    ev = "\n".join(f"[{e.uid}] {e.title}: {e.text[:EVIDENCE_CHARS]}" for e in held) or "(nothing retrieved yet)"
    hist = "\n".join(f"Q{i + 1}: {q}\nA{i + 1}: {a}" for i, (q, a) in enumerate(history)) or "(nothing asked yet)"
    return "\n\n".join([
        f"Task: {question}",
        f"Instructions: {instructions or SUITE_INSTRUCTIONS.get(benchmark, SUITE_INSTRUCTIONS['synthetic'])}",
        f"Evidence so far:\n{ev}",
        f"Current draft:\n{draft or '(no draft yet)'}",
        f"Questions asked so far:\n{hist}",
        GUIDANCE,
        CONTRACT,
    ])


def _uid_key(uid: str) -> tuple:
    head, _, idx = uid.rpartition(":")
    return (head, int(idx)) if idx.isdigit() else (uid, -1)


@dataclasses.dataclass(frozen=True)
class Action:
    kind: Literal["ask", "stop"]
    question: str = ""
    rationale: str = ""
    parent_uids: tuple[str, ...] = ()
    malformed: bool = False
    reason: str = ""  # why a malformed reply was malformed


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def first_json_object(text: str) -> str | None:
    """The first balanced ``{...}`` of ``text`` (braces inside JSON strings not counted), a code
    fence's body searched first when there is one; None when there is none."""
    m = _FENCE.search(text)
    for source in ((m.group(1), text) if m else (text,)):
        start = source.find("{")
        while start != -1:
            depth, in_str, esc = 0, False, False
            for i in range(start, len(source)):
                c = source[i]
                if in_str:
                    if esc:
                        esc = False
                    elif c == "\\":
                        esc = True
                    elif c == '"':
                        in_str = False
                elif c == '"':
                    in_str = True
                elif c == "{":
                    depth += 1
                elif c == "}":
                    depth -= 1
                    if depth == 0:
                        return source[start : i + 1]
            start = source.find("{", start + 1)
    return None


def parse_action(text: str) -> Action:
    """The questioner's action from its reply (module docstring)."""
    raw = first_json_object(text)
    if raw is None:
        return Action("stop", malformed=True, reason="no JSON object")
    try:
        obj = json.loads(raw)
    except ValueError as e:
        return Action("stop", malformed=True, reason=f"invalid JSON ({e.msg})")
    if not isinstance(obj, dict):
        return Action("stop", malformed=True, reason="not a JSON object")
    kind = str(obj.get("action", "")).strip().lower()
    rationale = obj.get("rationale")
    rationale = rationale if isinstance(rationale, str) else ""
    if kind == "stop":
        return Action("stop", rationale=rationale)
    if kind == "ask":
        q = obj.get("question")
        if not isinstance(q, str) or not q.strip():
            return Action("stop", malformed=True, reason="ask without a question")
        parents = obj.get("parent_uids")
        parents = tuple(str(p) for p in parents) if isinstance(parents, list) else ()
        return Action("ask", question=q.strip(), rationale=rationale, parent_uids=parents)
    return Action("stop", malformed=True, reason=f"action {obj.get('action')!r}: expected ask or stop")


def ask_json(question: str, rationale: str = "") -> str:
    """An ASK in the contract's form (what scripted questioners and demonstrations emit)."""
    return json.dumps({"action": "ask", "question": question, "rationale": rationale, "parent_uids": []})


STOP_JSON = json.dumps({"action": "stop", "rationale": ""})

__all__ = ["CONTRACT", "EVIDENCE_CHARS", "STOP_JSON", "SUITE_INSTRUCTIONS", "Action", "EvidenceView", "ask_json",
           "first_json_object", "parse_action", "render_state"]

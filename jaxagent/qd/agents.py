"""The loop's roles (host code): questioners, drafters and answerers (the Q&D spec's §1.1).

Questioners (each an `act(state, key)` coroutine returning the raw reply and its token counts):

- `NeverAsk`: the never-ask baseline (STOP at once);
- `ScriptedQuestioner`: a heuristic that needs no model: it asks the task question first, then
  about each entity newly named by the evidence (the titles of new units, then capitalised names
  in their text), most task-relevant first, and stops when no unasked entity is left or two
  questions in a row brought nothing new;
- `PolicyQuestioner`: a local JAX model through the in-flight `GenerationEngine` (each decision a
  fresh chat prompt, thinking disabled, up to 400 new tokens);
- `EndpointQuestioner`: any OpenAI-compatible chat endpoint (`LLMUserClient`: retries, Retry-After).

Drafters resolve each question from the held evidence (a reply of at most 300 words) and rewrite
the draft from all of it (at most 700 words, a function of the task and the held set); answerers
write the final answer (its first 30 words are kept). `ExtractiveDrafter` / `ExtractiveAnswerer`
are **offline stand-ins that need no model** (sentences picked by word overlap), labelled as such
in every report; `EndpointDrafter` / `EndpointAnswerer` call an OpenAI-compatible endpoint.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, Protocol

import jax

from jaxagent.envs.llm_user import LLMUserClient
from jaxagent.envs.retrieval_qa.bm25 import tokenize
from jaxagent.envs.retrieval_qa.tasks import QATask, Unit
from jaxagent.qd.prompts import STOP_JSON, ask_json

REPLY_WORDS, DRAFT_WORDS, ANSWER_WORDS = 300, 700, 30
DRAFTER_EVIDENCE_CHARS = 1200
QUESTIONER_MAX_TOKENS = 400


def first_words(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


@dataclasses.dataclass(frozen=True)
class QDState:
    """What the questioner acts on at one decision point."""

    task: QATask
    held: tuple[int, ...]  # pool indices held, in the order they arrived
    new: tuple[int, ...]  # those the last question added
    draft: str
    history: tuple[tuple[str, str], ...]  # (question, drafter's reply) per executed question
    prompt: str  # `render_state` of the above
    turn: int
    added: tuple[int, ...] = ()  # new units each executed question brought, in order


@dataclasses.dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Questioner(Protocol):
    name: str

    async def act(self, state: QDState, key: jax.Array) -> Reply: ...


# ----------------------------------------------------------------------------- questioners
class NeverAsk:
    name = "never_ask"

    async def act(self, state: QDState, key: jax.Array) -> Reply:
        return Reply(STOP_JSON)


# A capitalised word (a "." inside it, as in "J.R.R", but never at its end: "Vituburg. Pougouia" is
# two names split by a sentence end), joined with the capitalised words that follow it.
_WORD = r"[A-Z](?:[\w'’-]|\.(?=[\w'’-]))*"
_NAME = re.compile(rf"\b{_WORD}(?:\s+(?:of|the|de|la|von|van|and|du|del)?\s*{_WORD})*")
_STOPWORD_NAMES = {"The", "A", "An", "In", "On", "It", "He", "She", "They", "His", "Her", "This", "That", "As", "At",
                   "By", "For", "From", "After", "Before", "During", "When", "While", "With", "Its", "Their", "There"}


class ScriptedQuestioner:
    """The heuristic of the module docstring (deterministic: ``key`` is unused). It also stops once
    ``patience`` questions in a row brought no new evidence."""

    name = "scripted"

    def __init__(self, patience: int = 2):
        self.patience = patience

    async def act(self, state: QDState, key: jax.Array) -> Reply:
        if state.turn == 0:
            return Reply(ask_json(state.task.question, "the task itself"))
        if len(state.added) >= self.patience and not any(state.added[-self.patience:]):
            return Reply(STOP_JSON)
        asked = {q.casefold() for q, _ in state.history}
        seen = {u.title.casefold() for u in state.task.pool if u.index in state.held and u.index not in state.new}
        qwords = set(tokenize(state.task.question))
        candidates: list[tuple[float, int, str]] = []
        for rank, idx in enumerate(self._newest_first(state)):
            unit = state.task.pool[idx]
            names = [unit.title] + [m.group(0).strip(" .") for m in _NAME.finditer(unit.text)]
            for j, name in enumerate(names):
                if name in _STOPWORD_NAMES or len(name) < 3:
                    continue
                q = f"What is known about {name}?"
                if q.casefold() in asked or name.casefold() in seen:
                    continue
                overlap = len(set(tokenize(unit.text)) & qwords)
                candidates.append((-overlap, rank * 1000 + j, q))
        if not candidates:
            return Reply(STOP_JSON)
        return Reply(ask_json(min(candidates)[2], "an entity the new evidence names"))

    @staticmethod
    def _newest_first(state: QDState) -> list[int]:
        # the last question's units first (in rank order), then older ones from the newest back
        older = [i for i in reversed(state.held) if i not in state.new]
        return list(state.new) + older


def decision_prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The tokens a local questioner conditions on for the rendered state ``prompt``: one user
    turn and the assistant's generation prompt, thinking disabled (what a training row's prompt is)."""
    from jaxagent.text.chat import ChatRenderer

    chat = ChatRenderer(tokenizer, thinking="disabled")
    chat.add({"role": "user", "content": prompt})
    return chat.start_generation()


def completion_ids(tokenizer, text: str) -> list[int]:
    """The tokens a local questioner generates to reply ``text``: the text's tokens and the
    end-of-turn token the template closes an assistant turn with (what a training row's completion is)."""
    from jaxagent.text.chat import ChatRenderer

    chat = ChatRenderer(tokenizer, thinking="disabled")
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": text}]
    rest = chat.render_text(msgs)
    rest = rest[rest.rindex(text) + len(text):] if text and text in rest else rest
    stops = sorted(chat.stop_token_ids)
    ends = [(rest.index(tok), i) for i in stops if (tok := tokenizer.id_to_token(i)) and tok in rest]
    if not ends:
        raise ValueError(f"the chat template writes none of the stop tokens {stops} after an assistant turn")
    return [*tokenizer.encode(text), min(ends)[1]]


class PolicyQuestioner:
    """A local model through the generation engine; ``name`` e.g. ``"local:runs/x/hf"``."""

    def __init__(self, engine, tokenizer, sampling, *, name: str = "policy"):
        self.engine, self.tok, self.sampling, self.name = engine, tokenizer, sampling, name
        self._n = 0

    async def act(self, state: QDState, key: jax.Array) -> Reply:
        prompt = decision_prompt_ids(self.tok, state.prompt)
        need = len(prompt) + self.sampling.max_new_tokens
        if need > self.engine.capacity:  # a setting, not an outcome of the run
            from jaxagent.rollout.loop import EpisodeBudgetError

            raise EpisodeBudgetError(
                f"rollout.capacity={self.engine.capacity}: the questioner's prompt for task {state.task.task_id!r} "
                f"at decision {state.turn} has {len(prompt)} tokens + qd.max_new_tokens={self.sampling.max_new_tokens}"
                f"; expected rollout.capacity >= {need} (the held evidence grows with each question)")
        self._n += 1
        session = f"qd:{state.task.task_id}:{state.turn}:{self._n}"
        try:
            res = await self.engine.generate(session, prompt, self.sampling, key)
        finally:
            self.engine.release(session)
        ids = [t for t in res.tokens if t not in self.sampling.stop_tokens]
        return Reply(self.tok.decode(ids), prompt_tokens=len(prompt), completion_tokens=len(res.tokens))


class EndpointQuestioner:
    def __init__(self, client: LLMUserClient, *, name: str | None = None):
        self.client, self.name = client, name or f"endpoint:{client.config.model}"

    async def act(self, state: QDState, key: jax.Array) -> Reply:
        text, usage = await self.client.complete_usage([{"role": "user", "content": state.prompt}])
        return Reply(text or "", usage["prompt_tokens"], usage["completion_tokens"])


# ----------------------------------------------------------------------------- drafters and answerers
class Drafter(Protocol):
    """Each call returns a `Reply`: the text and its token counts (0 without a model)."""

    name: str

    async def resolve(self, task: QATask, held: Sequence[Unit], question: str) -> Reply: ...

    async def draft(self, task: QATask, held: Sequence[Unit]) -> Reply: ...


class Answerer(Protocol):
    name: str

    async def answer(self, task: QATask, held: Sequence[Unit], draft: str) -> Reply: ...


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def best_sentence(units: Sequence[Unit], query: str) -> str:
    """The sentence of ``units`` (first 1,200 characters of each) sharing most distinct words with
    ``query``; ties: the earliest. "" when no sentence shares a word."""
    q = set(tokenize(query))
    best, best_n = "", 0
    for u in units:
        for s in _SENTENCE.split(u.text[:DRAFTER_EVIDENCE_CHARS]):
            n = len(set(tokenize(s)) & q)
            if n > best_n:
                best, best_n = s.strip(), n
    return best


class ExtractiveDrafter:
    """Offline stand-in: the reply is the held sentence that best matches the question; the draft
    is, per held unit in pool order, its sentence that best matches the task question."""

    name = "extractive (offline stand-in, no model)"

    async def resolve(self, task: QATask, held: Sequence[Unit], question: str) -> Reply:
        return Reply(first_words(best_sentence(held, question) or "The evidence held does not say.", REPLY_WORDS))

    async def draft(self, task: QATask, held: Sequence[Unit]) -> Reply:
        parts = [best_sentence([u], task.question) for u in sorted(held, key=lambda u: u.index)]
        return Reply(first_words(" ".join(p for p in parts if p), DRAFT_WORDS))


class ExtractiveAnswerer:
    """Offline stand-in: the draft's (else the evidence's) sentence that best matches the task."""

    name = "extractive (offline stand-in, no model)"

    async def answer(self, task: QATask, held: Sequence[Unit], draft: str) -> Reply:
        pseudo = [Unit(-1, "", "", draft)] if draft else []
        return Reply(first_words(best_sentence(pseudo + list(held), task.question), ANSWER_WORDS))


def _evidence_block(held: Sequence[Unit], chars: int) -> str:
    return "\n".join(f"- {u.title}: {u.text[:chars]}" for u in sorted(held, key=lambda u: u.index)) or "(none)"


class _Endpoint:
    def __init__(self, client: LLMUserClient):
        self.client, self.name = client, f"endpoint:{client.config.model}"

    async def _ask(self, task: QATask, held: Sequence[Unit], instruction: str, words: int) -> Reply:
        text, usage = await self.client.complete_usage([{"role": "user", "content": (
            f"Task: {task.question}\n\nEvidence:\n{_evidence_block(held, DRAFTER_EVIDENCE_CHARS)}\n\n{instruction}")}])
        return Reply(first_words(text or "", words), usage["prompt_tokens"], usage["completion_tokens"])


class EndpointDrafter(_Endpoint):
    async def resolve(self, task: QATask, held: Sequence[Unit], question: str) -> Reply:
        return await self._ask(task, held, "Answer this question from the evidence only, briefly (say so if it "
                                           f"does not say): {question}", REPLY_WORDS)

    async def draft(self, task: QATask, held: Sequence[Unit]) -> Reply:
        return await self._ask(task, held, "Write the current draft answer to the task from this evidence only: "
                                           "what is established, what is still missing.", DRAFT_WORDS)


class EndpointAnswerer(_Endpoint):
    async def answer(self, task: QATask, held: Sequence[Unit], draft: str) -> Reply:
        return await self._ask(task, held, f"Draft:\n{draft}\n\nGive the final answer only, in a few words.",
                               ANSWER_WORDS)


def describe(obj: Any) -> str:
    return str(getattr(obj, "name", type(obj).__name__))


__all__ = ["ANSWER_WORDS", "DRAFT_WORDS", "REPLY_WORDS", "Answerer", "Drafter", "EndpointAnswerer", "EndpointDrafter",
           "EndpointQuestioner", "ExtractiveAnswerer", "ExtractiveDrafter", "NeverAsk", "PolicyQuestioner", "QDState",
           "Questioner", "Reply", "ScriptedQuestioner", "best_sentence", "completion_ids", "decision_prompt_ids", "first_words"]

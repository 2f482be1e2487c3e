"""The policy as an agent: token-in/token-out through the generation engine, one `Trajectory` per episode.

`PolicyAgent` plays through the episode runner (`jaxagent.rollout.runner.run_episode`): the
renderer's prompt goes to the engine, the generated tokens are appended verbatim, parsed into text
and tool calls for the environment, and the environment's messages are appended (user reaction
labels kept off the tokens, recorded by message index). `run_episode` plays one episode and always
returns a `Trajectory` with its termination reason; `run_episodes` runs many at once (G per task)
so that while some wait for their users, others decode.

- **Simulator calls** are the runner's: retried, timed out, then the episode ends as
  ``simulator_failure`` (outcome 0; the RL trainer leaves such episodes out of its batch), every
  HTTP call counted in the record's ``info`` (`jaxagent.rollout.runner`). ``timeout_s`` must be at
  least the simulator client's own budget per call (`LLMUserConfig.call_budget_s`), or the loop
  cuts the client's retries and Retry-After waits short; `jaxagent.jobs.config` checks this and
  derives ``rollout.timeout_s`` from it when unset. The agent adds ``format_errors`` (tool calls the
  parser could not read) and ``truncated_replies`` to ``info``.
- **Bounded size.** A user message (the simulator's reply) longer than ``max_reply_tokens``
  tokens is cut to that many (characters first, to 8x the limit, so a runaway reply is never
  tokenised whole; its reaction label to 200 characters). Environment messages that would take
  the record past ``max_tokens`` (with a few tokens of margin for the template) are not appended:
  the episode ends there as ``max_tokens``, so no record is longer than ``max_tokens`` (the
  reset's prompt and one turn must fit: else `EpisodeBudgetError`, a setting error).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.base import AgentMessage, EnvMessage, Environment, Reset
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import LABEL_CHARS, Agent, EpisodeConfig
from jaxagent.rollout.runner import run_episode as run_with
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.text.chat import ChatRenderer
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.text.toolcalls import parse_assistant

GEN_PROMPT_MARGIN = 16
"""Tokens kept free for the generation prompt's template text."""


class EpisodeBudgetError(ValueError):
    """The episode's token budget cannot hold its first prompt and one answer (raised at the reset,
    naming ``rollout.max_tokens``; a configuration error, never an episode that ends with no turn)."""


def clip_reply(message: EnvMessage, tokenizer: Tokenizer, max_tokens: int) -> tuple[EnvMessage, bool]:
    """``message`` with its content cut to ``max_tokens`` tokens (a user message; others and
    ``max_tokens <= 0`` pass unchanged): to ``8 * max_tokens`` characters first, then tokenised
    and cut. Returns the message and whether anything was cut."""
    if message.role != "user":
        return message, False
    text, reaction, cut = message.content, message.reaction, False
    if reaction is not None and len(reaction) > LABEL_CHARS:
        reaction = reaction[:LABEL_CHARS]
    if max_tokens > 0:
        if len(text) > 8 * max_tokens:
            text, cut = text[: 8 * max_tokens], True
        ids = tokenizer.encode(text)
        if len(ids) > max_tokens:
            text, cut = tokenizer.decode(ids[:max_tokens]), True
    if text is message.content and reaction is message.reaction:
        return message, False
    return dataclasses.replace(message, content=text, reaction=reaction), cut


class PolicyAgent(Agent):
    """The policy through ``engine`` (module docstring) for one episode: turn t samples with the key
    data ``turn_keys[t]``; the engine session ``session`` is released when the episode ends."""

    def __init__(self, engine: GenerationEngine, tokenizer: Tokenizer, *, sampling: SamplingParams,
                 turn_keys: np.ndarray, config: EpisodeConfig, session: str):
        self.engine, self.tok, self.sampling, self.turn_keys = engine, tokenizer, sampling, turn_keys
        self.config, self.session = config, session
        self.chat: ChatRenderer | None = None
        self.task_id = ""
        self.labels: dict[int, str] = {}
        self.kinds: dict[int, str] = {}
        self.alternatives: dict[int, list[tuple[list[int], float]]] = {}
        self.gen_lps: list[list[float]] = []
        self.versions: list[int] = []  # per action turn: the policy version that generated it
        self.counters = {"format_errors": 0, "truncated_replies": 0}

    def start(self, task_id: str, reset: Reset, env: Environment) -> None:
        self.task_id = task_id
        tools = (list(reset.tools) or None) if self.config.tool_schemas_in_prompt else None
        self.chat = ChatRenderer(self.tok, tools=tools)
        self.chat.add(*[m.to_chat() for m in reset.messages])

    async def act(self, turn: int) -> AgentMessage | None:
        chat, s = self.chat, self.sampling
        # room for the generation prompt (a few template tokens) and the longest answer
        need = len(chat.tokens) + GEN_PROMPT_MARGIN + s.max_new_tokens
        if need > self.config.max_tokens:
            if turn == 0:  # not one turn fits: a setting, not an episode outcome
                raise EpisodeBudgetError(
                    f"rollout.max_tokens={self.config.max_tokens}: task {self.task_id!r} opens with a "
                    f"{len(chat.tokens)}-token prompt; one turn needs {need} (+ {GEN_PROMPT_MARGIN} for the "
                    f"generation prompt + rollout.max_new_tokens={s.max_new_tokens}); expected "
                    f"rollout.max_tokens >= {need}")
            self.stop_reason = "max_tokens"
            return None
        res = await self.engine.generate(self.session, chat.start_generation(), s, self.turn_keys[turn])
        chat.append_generated(res.tokens)
        self.versions.append(res.version)
        # the distribution that drew the tokens (the trainer's old log-probs): temperature and the
        # vocabulary limit applied; greedy turns (no distribution) keep the raw policy's
        self.gen_lps.append(list(res.logp_sample if s.temperature > 0 else res.logp_policy))
        parsed = parse_assistant(self.tok.decode([x for x in res.tokens if x not in s.stop_tokens]))
        self.counters["format_errors"] += len(parsed.errors)
        return AgentMessage(parsed.content, tuple(parsed.tool_calls), tuple(e.reason for e in parsed.errors))

    def observe(self, messages: Sequence[EnvMessage], info: dict[str, Any]) -> bool:
        clipped = [clip_reply(m, self.tok, self.config.max_reply_tokens) for m in messages]
        msgs = [m for m, _ in clipped]
        env_cut = bool(info.get("reply_truncated", False))  # cut by the environment itself
        self.counters["truncated_replies"] += sum(cut for _, cut in clipped) or int(env_cut)
        trial = self.chat.fork()  # appended only if it fits: no record grows past max_tokens
        spans = trial.add(*[m.to_chat() for m in msgs])
        if len(trial.tokens) + GEN_PROMPT_MARGIN > self.config.max_tokens:
            return False
        self.chat = trial
        for span, m, (_, cut) in zip(spans, msgs, clipped):
            if m.reaction is not None:
                self.labels[span.index] = m.reaction
            if m.kind is not None:
                self.kinds[span.index] = m.kind
            if m.alternatives is not None and not cut:  # a clipped reply is none of them
                self.alternatives[span.index] = [(self.chat.encode_content(text), p) for text, p in m.alternatives]
        return True

    async def aclose(self) -> None:
        self.engine.release(self.session)

    def trajectory(self, episode, group_id: int) -> Trajectory:
        """The episode's record: the rendered tokens (an empty record when the reset failed), the
        sampler's log-probs, the step rewards, reaction labels, termination, timings and counters
        (``info["policy_versions"]``: the engine's policy version that generated each action turn)."""
        chat = self.chat
        if chat is None:  # the reset itself failed: an empty record that still counts
            chat = ChatRenderer(self.tok)
            chat.add({"role": "user", "content": ""})
        info = {**episode.info, **self.counters, "policy_versions": list(self.versions)}
        return Trajectory.from_rendered(
            chat.finish(), task_id=episode.task_id, group_id=group_id, generated_logprobs=self.gen_lps,
            turn_rewards=episode.rewards, outcome_reward=episode.outcome, reaction_labels=self.labels,
            termination=episode.termination, timings=episode.timings, info=info, final_reaction=episode.final_reaction,
            message_kinds=self.kinds, alternatives=self.alternatives)


async def run_episode(
    engine: GenerationEngine,
    env: Environment,
    tokenizer: Tokenizer,
    *,
    task_id: str,
    seed: int,
    group_id: int,
    sampling: SamplingParams,
    key: jax.Array,
    config: EpisodeConfig = EpisodeConfig(),
    session: str | None = None,
    turn_keys: np.ndarray | None = None,
) -> Trajectory:
    """One episode of the policy; always returns a Trajectory (see the module docstring). Turn t
    samples with ``fold_in(key, t)``; ``turn_keys`` ([max_turns, 2] uint32, `turn_key_data`) gives
    those keys' data made beforehand (`run_episodes` makes every episode's in one call)."""
    session = session or f"{task_id}#{seed}"
    if turn_keys is None:
        turn_keys = np.asarray(jax.random.key_data(_turn_keys(key, config.max_turns)), np.uint32)
    agent = PolicyAgent(engine, tokenizer, sampling=sampling, turn_keys=turn_keys, config=config, session=session)
    episode = await run_with(env, agent, task_id=task_id, seed=seed, config=config)
    return agent.trajectory(episode, group_id)


def turn_key_data(key: jax.Array, episodes: Sequence[int], turns: int) -> np.ndarray:
    """The data of ``fold_in(fold_in(key, e), t)`` for every episode index e and turn t, as
    [len(episodes), turns, 2] uint32, in one jitted call (compiled once per number of episodes
    and turns): derived one by one on the event loop, each key was an eager dispatch (~0.3 ms of
    host time per turn, beside the engine's calls), and eager vmapped ops compile op by op."""
    return np.asarray(_turn_key_data(key, np.asarray(list(episodes), np.uint32), turns), np.uint32)


@functools.partial(jax.jit, static_argnums=2)
def _turn_key_data(key: jax.Array, ids_E: jax.Array, turns: int) -> jax.Array:
    """[E] episode ids -> [E, turns, 2] uint32 key data."""
    keys = jax.vmap(lambda e: _turn_keys(jax.random.fold_in(key, e), turns))(ids_E)
    return jax.random.key_data(keys)


def _turn_keys(key: jax.Array, turns: int) -> jax.Array:
    """``fold_in(key, t)`` for t < turns: [turns] keys."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(turns, dtype=jnp.uint32))


async def run_episodes(
    engine: GenerationEngine,
    make_env: Callable[[], Environment],
    tokenizer: Tokenizer,
    tasks: Sequence[str],
    *,
    group_size: int,
    sampling: SamplingParams,
    key: jax.Array,
    config: EpisodeConfig = EpisodeConfig(),
    first_group: int = 0,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """``group_size`` episodes per task, all concurrently; group ids follow the task order from
    ``first_group`` (the key of episode i of group g is ``fold_in(key, g * group_size + i)``), so
    a block of a task list played with its first group's index gives the episodes the whole list
    gives for those tasks (`jaxagent.rollout.processes`). ``on_episode(trajectory)`` is called as
    each episode ends (progress), in the order they end."""

    async def watched(coro):
        traj = await coro
        if on_episode is not None:
            on_episode(traj)
        return traj

    coros = []
    ids = [g * group_size + i for g in range(first_group, first_group + len(tasks)) for i in range(group_size)]
    keys = turn_key_data(key, ids, config.max_turns) if ids else None
    for g, task in enumerate(tasks, start=first_group):
        for i in range(group_size):
            j = (g - first_group) * group_size + i
            coros.append(run_episode(engine, make_env(), tokenizer, task_id=task, seed=i, group_id=g,
                                     sampling=sampling, key=key, config=config, session=f"{task}#{g}#{i}",
                                     turn_keys=keys[j]))
    return list(await asyncio.gather(*(watched(c) for c in coros)))


__all__ = ["GEN_PROMPT_MARGIN", "EpisodeBudgetError", "PolicyAgent", "clip_reply", "run_episode",
           "run_episodes", "turn_key_data"]

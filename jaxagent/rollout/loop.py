"""Episodes as coroutines: the agent (through the generation engine) meets an environment.

`run_episode` plays one episode token-in/token-out: the renderer's prompt goes to the engine,
the generated tokens are appended verbatim, parsed into text and tool calls for the environment,
and the environment's messages are appended (user reaction labels kept off the tokens, recorded
by message index). Nothing escapes: every outcome is a `Trajectory` with its termination reason.
`run_episodes` runs many at once (G per task) so that while some wait for their users, others
decode.

- **Simulator calls** (``env.reset`` / ``env.step``) are retried ``retries`` times, then the
  episode ends as ``simulator_failure`` (its outcome reward 0; the RL trainer leaves such
  episodes out of its batch). A call that exceeds ``timeout_s`` is cancelled and counts as a
  failure too; so the environments' ``step`` must be safe to call again with the same message
  (`LLMUserEnv` and the tau2 retail environment commit nothing before the reply arrives). An
  error that says retrying cannot help (``retryable=False``: `SimulatorError` for HTTP 401/403
  and the other non-retried statuses) is not retried. ``timeout_s`` must be at least the
  simulator client's own budget per call (`LLMUserConfig.call_budget_s`), or the loop cuts the
  client's retries and Retry-After waits short; `jaxagent.jobs.config` checks this and derives
  ``rollout.timeout_s`` from it when unset.
- **Counted** in the record's ``info``: ``simulator_errors`` (failed calls, loop level) and
  ``simulator_timeouts`` (those that ran past ``timeout_s``), ``last_error``,
  ``simulator_retries`` (retries inside a simulator client, as the environment reports them),
  and, through `collect_call_stats`, every HTTP call any `LLMUserClient` made for the episode:
  ``sim_calls``, ``sim_attempts``, ``sim_retries``, ``sim_failed_calls``, ``sim_failures``
  (failed attempts by cause); ``truncated_replies``.
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
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.base import AgentMessage, EnvMessage, Environment
from jaxagent.envs.llm_user import CallStats, collect_call_stats
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.text.chat import ChatRenderer
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.text.toolcalls import parse_assistant


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    max_turns: int = 8
    max_tokens: int = 2048
    retries: int = 2
    timeout_s: float = 60.0  # per reset/step call; >= the simulator client's call_budget_s (module docstring)
    tool_schemas_in_prompt: bool = True  # False: the tools are not rendered into the system prompt
    max_reply_tokens: int = 512  # tokens kept of each user (simulator) message; 0: no limit


async def _call(fn, cfg: EpisodeConfig, counters: dict):
    """``await fn()`` under ``cfg.timeout_s``, retried ``cfg.retries`` times (not when the error
    says ``retryable=False``); None when every attempt failed. Failures are counted in ``counters``."""
    for _ in range(cfg.retries + 1):
        try:
            return await asyncio.wait_for(fn(), cfg.timeout_s)
        except Exception as e:  # noqa: BLE001 - any simulator failure is retried, then counted
            counters["simulator_errors"] = counters.get("simulator_errors", 0) + 1
            if isinstance(e, TimeoutError):  # asyncio.wait_for's (asyncio.TimeoutError is TimeoutError)
                counters["simulator_timeouts"] = counters.get("simulator_timeouts", 0) + 1
            counters["last_error"] = f"{type(e).__name__}: {e}"[:300].replace("\n", " ")
            if getattr(e, "retryable", True) is False:  # e.g. HTTP 401/403: the same call fails again
                break
    return None


_LABEL_CHARS = 200


def clip_reply(message: EnvMessage, tokenizer: Tokenizer, max_tokens: int) -> tuple[EnvMessage, bool]:
    """``message`` with its content cut to ``max_tokens`` tokens (a user message; others and
    ``max_tokens <= 0`` pass unchanged): to ``8 * max_tokens`` characters first, then tokenised
    and cut. Returns the message and whether anything was cut."""
    if message.role != "user":
        return message, False
    text, reaction, cut = message.content, message.reaction, False
    if reaction is not None and len(reaction) > _LABEL_CHARS:
        reaction = reaction[:_LABEL_CHARS]
    if max_tokens > 0:
        if len(text) > 8 * max_tokens:
            text, cut = text[: 8 * max_tokens], True
        ids = tokenizer.encode(text)
        if len(ids) > max_tokens:
            text, cut = tokenizer.decode(ids[:max_tokens]), True
    if text is message.content and reaction is message.reaction:
        return message, False
    return dataclasses.replace(message, content=text, reaction=reaction), cut


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
    """One episode; always returns a Trajectory (see the module docstring). Turn t samples with
    ``fold_in(key, t)``; ``turn_keys`` ([max_turns, 2] uint32, `turn_key_data`) gives those keys'
    data made beforehand (`run_episodes` makes every episode's in one call)."""
    session = session or f"{task_id}#{seed}"
    if turn_keys is None:
        turn_keys = np.asarray(jax.random.key_data(_turn_keys(key, config.max_turns)), np.uint32)
    calls = CallStats()
    with collect_call_stats(calls):  # the HTTP calls of this episode (the task's own context)
        return await _run_episode(engine, env, tokenizer, task_id=task_id, seed=seed, group_id=group_id,
                                  sampling=sampling, turn_keys=turn_keys, config=config, session=session,
                                  calls=calls)


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


async def _run_episode(engine, env, tokenizer, *, task_id, seed, group_id, sampling, turn_keys, config, session,
                       calls: CallStats) -> Trajectory:
    counters = {"simulator_errors": 0, "simulator_timeouts": 0, "simulator_retries": 0, "tool_errors": 0,
                "format_errors": 0, "truncated_replies": 0}
    t0 = time.perf_counter()
    timings = {"generate_s": 0.0, "env_s": 0.0}
    chat = None
    labels: dict[int, str] = {}
    gen_lps: list[list[float]] = []
    rewards: list[float] = []
    termination = "max_turns"
    outcome = 0.0
    final_reaction: str | None = None
    try:
        t = time.perf_counter()
        reset = await _call(lambda: env.reset(task_id, seed), config, counters)
        timings["env_s"] += time.perf_counter() - t
        if reset is None:
            raise _Failure
        chat = ChatRenderer(tokenizer, tools=(list(reset.tools) or None) if config.tool_schemas_in_prompt else None)
        chat.add(*[m.to_chat() for m in reset.messages])
        for turn in range(config.max_turns):
            # room for the generation prompt (a few template tokens) and the longest answer
            need = len(chat.tokens) + _GEN_PROMPT_MARGIN + sampling.max_new_tokens
            if need > config.max_tokens:
                if turn == 0:  # not one turn fits: a setting, not an episode outcome
                    raise EpisodeBudgetError(
                        f"rollout.max_tokens={config.max_tokens}: task {task_id!r} opens with a "
                        f"{len(chat.tokens)}-token prompt; one turn needs {need} (+ {_GEN_PROMPT_MARGIN} for the "
                        f"generation prompt + rollout.max_new_tokens={sampling.max_new_tokens}); expected "
                        f"rollout.max_tokens >= {need}")
                termination = "max_tokens"
                break
            prompt = chat.start_generation()
            t = time.perf_counter()
            res = await engine.generate(session, prompt, sampling, turn_keys[turn])
            timings["generate_s"] += time.perf_counter() - t
            chat.append_generated(res.tokens)
            # the distribution that drew the tokens (the trainer's old log-probs): temperature and the
            # vocabulary limit applied; greedy turns (no distribution) keep the raw policy's
            gen_lps.append(list(res.logp_sample if sampling.temperature > 0 else res.logp_policy))
            stop_free = [x for x in res.tokens if x not in sampling.stop_tokens]
            parsed = parse_assistant(tokenizer.decode(stop_free))
            counters["format_errors"] += len(parsed.errors)
            msg = AgentMessage(parsed.content, tuple(parsed.tool_calls), tuple(e.reason for e in parsed.errors))
            t = time.perf_counter()
            step = await _call(lambda: env.step(msg), config, counters)
            timings["env_s"] += time.perf_counter() - t
            if step is None:
                rewards.append(0.0)
                raise _Failure
            rewards.append(float(step.reward))
            counters["tool_errors"] = int(step.info.get("tool_errors", counters["tool_errors"]))
            counters["simulator_retries"] += int(step.info.get("simulator_retries", 0))  # client-side retries
            if step.done:  # the user's reaction to the last segment: not appended (no action follows it)
                final_reaction = _last_reaction(step.messages, final_reaction)
            if step.messages and not step.done:
                clipped = [clip_reply(m, tokenizer, config.max_reply_tokens) for m in step.messages]
                msgs = [m for m, _ in clipped]
                env_cut = bool(step.info.get("reply_truncated", False))  # cut by the environment itself
                counters["truncated_replies"] += sum(cut for _, cut in clipped) or int(env_cut)
                trial = chat.fork()  # appended only if it fits: no record grows past max_tokens
                spans = trial.add(*[m.to_chat() for m in msgs])
                if len(trial.tokens) + _GEN_PROMPT_MARGIN > config.max_tokens:
                    termination = "max_tokens"
                    final_reaction = _last_reaction(msgs, final_reaction)  # the reaction still credits
                    break
                chat = trial
                for span, m in zip(spans, msgs):
                    if m.reaction is not None:
                        labels[span.index] = m.reaction
            if step.done:
                termination = "done"
                break
        out = env.outcome_reward()
        outcome = sum(rewards) if out != out else out  # NaN: the sum of step rewards
    except _Failure:
        termination = "simulator_failure"
    finally:
        engine.release(session)
        try:
            await env.aclose()
        except Exception:  # noqa: BLE001
            counters["simulator_errors"] += 1
    timings["total_s"] = time.perf_counter() - t0
    sim = calls.as_dict()
    counters.update(sim_calls=sim["calls"], sim_attempts=sim["attempts"], sim_retries=sim["retries"],
                    sim_failed_calls=sim["failed_calls"], sim_failures=sim["failures"])
    if chat is None:  # the reset itself failed: an empty record that still counts
        chat = ChatRenderer(tokenizer)
        chat.add({"role": "user", "content": ""})
    record = chat.finish()
    return Trajectory.from_rendered(
        record, task_id=task_id, group_id=group_id, generated_logprobs=gen_lps, turn_rewards=rewards,
        outcome_reward=outcome if termination != "simulator_failure" else 0.0, reaction_labels=labels,
        termination=termination, timings=timings, info=counters,
        final_reaction=final_reaction if termination != "simulator_failure" else None,
    )


def _last_reaction(messages, default: str | None) -> str | None:
    """The reaction label of the last user message among ``messages`` that has one (``default``
    when none has): the label a final step gives the agent's last U2U segment."""
    for m in reversed(messages):
        if m.role == "user" and m.reaction is not None:
            return m.reaction[:_LABEL_CHARS]
    return default


class _Failure(Exception):
    pass


class EpisodeBudgetError(ValueError):
    """The episode's token budget cannot hold its first prompt and one answer (raised at the reset,
    naming ``rollout.max_tokens``; a configuration error, never an episode that ends with no turn)."""


_GEN_PROMPT_MARGIN = 16


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
) -> list[Trajectory]:
    """``group_size`` episodes per task, all concurrently; group ids follow the task order from
    ``first_group`` (the key of episode i of group g is ``fold_in(key, g * group_size + i)``), so
    a block of a task list played with its first group's index gives the episodes the whole list
    gives for those tasks (`jaxagent.rollout.processes`)."""
    coros = []
    ids = [g * group_size + i for g in range(first_group, first_group + len(tasks)) for i in range(group_size)]
    keys = turn_key_data(key, ids, config.max_turns) if ids else None
    for g, task in enumerate(tasks, start=first_group):
        for i in range(group_size):
            j = (g - first_group) * group_size + i
            coros.append(run_episode(engine, make_env(), tokenizer, task_id=task, seed=i, group_id=g,
                                     sampling=sampling, key=key, config=config, session=f"{task}#{g}#{i}",
                                     turn_keys=keys[j]))
    return list(await asyncio.gather(*coros))

"""Episodes as coroutines: the agent (through the generation engine) meets an environment.

`run_episode` plays one episode token-in/token-out: the renderer's prompt goes to the engine,
the generated tokens are appended verbatim, parsed into text and tool calls for the environment,
and the environment's messages are appended (user reaction labels kept off the tokens, recorded
by message index). A simulator call that raises is retried ``retries`` times, then the episode
ends as ``simulator_failure`` (retries inside a simulator client, reported as
``info["simulator_retries"]``, are added up in the record too); a call that exceeds ``timeout_s`` counts as a failure too. Nothing
escapes: every outcome is a `Trajectory` with its termination reason. `run_episodes` runs many
at once (G per task) so that while some wait for their users, others decode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence

import jax

from jaxagent.envs.base import AgentMessage, Environment
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
    timeout_s: float = 60.0
    tool_schemas_in_prompt: bool = True  # False: the tools are not rendered into the system prompt


async def _call(fn, cfg: EpisodeConfig, counters: dict):
    for attempt in range(cfg.retries + 1):
        try:
            return await asyncio.wait_for(fn(), cfg.timeout_s)
        except Exception as e:  # noqa: BLE001 - any simulator failure is retried, then counted
            counters["simulator_errors"] += 1
            counters["last_error"] = f"{type(e).__name__}: {e}"[:300]
    return None


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
) -> Trajectory:
    """One episode; always returns a Trajectory (see the module docstring)."""
    session = session or f"{task_id}#{seed}"
    counters = {"simulator_errors": 0, "simulator_retries": 0, "tool_errors": 0, "format_errors": 0}
    t0 = time.perf_counter()
    timings = {"generate_s": 0.0, "env_s": 0.0}
    chat = None
    labels: dict[int, str] = {}
    gen_lps: list[list[float]] = []
    rewards: list[float] = []
    termination = "max_turns"
    outcome = 0.0
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
            if len(chat.tokens) + _GEN_PROMPT_MARGIN + sampling.max_new_tokens > config.max_tokens:
                termination = "max_tokens"
                break
            prompt = chat.start_generation()
            t = time.perf_counter()
            res = await engine.generate(session, prompt, sampling, jax.random.fold_in(key, turn))
            timings["generate_s"] += time.perf_counter() - t
            chat.append_generated(res.tokens)
            gen_lps.append(list(res.logp_policy))
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
            if step.messages and not step.done:
                spans = chat.add(*[m.to_chat() for m in step.messages])
                for span, m in zip(spans, step.messages):
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
    if chat is None:  # the reset itself failed: an empty record that still counts
        chat = ChatRenderer(tokenizer)
        chat.add({"role": "user", "content": ""})
    record = chat.finish()
    return Trajectory.from_rendered(
        record, task_id=task_id, group_id=group_id, generated_logprobs=gen_lps, turn_rewards=rewards,
        outcome_reward=outcome if termination != "simulator_failure" else 0.0, reaction_labels=labels,
        termination=termination, timings=timings, info=counters,
    )


class _Failure(Exception):
    pass


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
) -> list[Trajectory]:
    """``group_size`` episodes per task, all concurrently; group ids follow the task order."""
    coros = []
    for g, task in enumerate(tasks):
        for i in range(group_size):
            coros.append(run_episode(engine, make_env(), tokenizer, task_id=task, seed=i, group_id=g,
                                     sampling=sampling, key=jax.random.fold_in(key, g * group_size + i),
                                     config=config, session=f"{task}#{g}#{i}"))
    return list(await asyncio.gather(*coros))

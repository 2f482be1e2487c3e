"""The one episode runner: any `Agent` meets any `Environment` (host code, asyncio).

    episode = await run_episode(env, agent, task_id="0", seed=0, config=EpisodeConfig(max_turns=8))

Every episode of the project goes through here: the policy through the generation engine
(`jaxagent.rollout.loop.PolicyAgent`: training rollouts and evaluations), a scripted gym policy
(`PolicyFnAgent`: demonstrations), tau2's oracle, an OpenAI-compatible endpoint and the Q&D
questioner-drafter agent (`jaxagent.envs.tau2.agents`, `jaxagent.qd.tau2`: host evaluations).
Environments hold no agents and drive nothing.

The loop: ``env.reset`` -> `Agent.start`; then up to ``max_turns`` times `Agent.act` (None: the
agent stops, ``agent.stop_reason`` names why) -> ``env.step`` -> unless the step ends the episode,
`Agent.observe` of its messages (False: the agent cannot take them in, its context is full: the
episode ends as ``max_tokens``). The user's reaction to the agent's last segment, carried by the
ending step (or by messages the agent could not take), is the episode's ``final_reaction``.

**Simulator calls** (``env.reset`` / ``env.step``), with ``config.on_error="retry"`` (training
and policy evaluation): retried ``retries`` times, each under ``timeout_s``, then the episode ends
as ``simulator_failure`` (outcome 0); an error that says retrying cannot help (``retryable=False``)
is not retried. So an environment's ``step`` must be safe to call again with the same message.
With ``on_error="raise"`` (host evaluations, demonstrations) a failing call raises to the caller
(which reports the episode as failed and goes on). Every HTTP call any simulator client makes for
the episode is counted (`jaxagent.envs.base.collect_call_stats`) into ``info``: ``sim_calls``,
``sim_attempts``, ``sim_retries``, ``sim_failed_calls``, ``sim_failures``; beside
``simulator_errors``, ``simulator_timeouts``, ``last_error``, ``simulator_retries`` (retries inside a
client, as the environment reports them) and ``tool_errors``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from jaxagent.envs.base import Agent, AgentMessage, CallStats, EnvMessage, Environment, Reset, collect_call_stats

LABEL_CHARS = 200
"""A reaction label is kept to this many characters."""


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """``max_turns`` agent turns; the simulator-call policy (``retries``, ``timeout_s`` per reset or
    step call, None: no limit; ``on_error``: ``retry`` then end as ``simulator_failure``, or
    ``raise``); and the policy agent's limits (``max_tokens`` of one record,
    ``tool_schemas_in_prompt``, ``max_reply_tokens`` kept of each user message, 0: no limit)."""

    max_turns: int = 8
    max_tokens: int = 2048
    retries: int = 2
    timeout_s: float | None = 60.0  # per reset/step call; >= the simulator client's call_budget_s
    tool_schemas_in_prompt: bool = True  # False: the tools are not rendered into the system prompt
    max_reply_tokens: int = 512  # tokens kept of each user (simulator) message; 0: no limit
    on_error: Literal["retry", "raise"] = "retry"


@dataclasses.dataclass
class Episode:
    """What one episode produced. ``transcript``: the reset's messages, then each agent message
    and the messages it got back, except those of the step that ended the episode
    (``final_messages``); ``rewards``: per step; ``outcome``: ``env.outcome_reward()`` (the sum of
    the step rewards when it is NaN; 0 for a ``simulator_failure``); ``turns``: agent messages made."""

    task_id: str
    seed: int
    termination: str
    outcome: float
    rewards: list[float]
    transcript: list[EnvMessage | AgentMessage]
    final_messages: list[EnvMessage]
    turns: int
    final_reaction: str | None
    info: dict[str, Any]
    timings: dict[str, float]
    tools: tuple[dict[str, Any], ...] = ()


class _Failure(Exception):
    pass


async def call_simulator(fn: Callable[[], Any], config: EpisodeConfig, counters: dict[str, Any]):
    """``await fn()`` under ``config.timeout_s``; with ``on_error="retry"`` retried ``config.retries``
    times (not when the error says ``retryable=False``) and None when every attempt failed, each
    failure counted in ``counters``; with ``on_error="raise"`` the first error goes up."""
    if config.on_error == "raise":
        return await (fn() if config.timeout_s is None else asyncio.wait_for(fn(), config.timeout_s))
    for _ in range(config.retries + 1):
        try:
            return await (fn() if config.timeout_s is None else asyncio.wait_for(fn(), config.timeout_s))
        except Exception as e:  # noqa: BLE001 - any simulator failure is retried, then counted
            counters["simulator_errors"] = counters.get("simulator_errors", 0) + 1
            if isinstance(e, TimeoutError):  # asyncio.wait_for's (asyncio.TimeoutError is TimeoutError)
                counters["simulator_timeouts"] = counters.get("simulator_timeouts", 0) + 1
            counters["last_error"] = f"{type(e).__name__}: {e}"[:300].replace("\n", " ")
            if getattr(e, "retryable", True) is False:  # e.g. HTTP 401/403: the same call fails again
                break
    return None


def last_reaction(messages: Sequence[EnvMessage], default: str | None) -> str | None:
    """The reaction label of the last user message among ``messages`` that has one (``default``
    when none has), kept to `LABEL_CHARS`."""
    for m in reversed(messages):
        if m.role == "user" and m.reaction is not None:
            return m.reaction[:LABEL_CHARS]
    return default


async def run_episode(env: Environment, agent: Agent, *, task_id: str, seed: int,
                      config: EpisodeConfig = EpisodeConfig()) -> Episode:
    """One episode of ``agent`` in ``env`` (module docstring). The environment and the agent are
    closed however it ends; with ``on_error="retry"`` nothing escapes but the agent's own errors."""
    calls = CallStats()
    with collect_call_stats(calls):  # the HTTP calls of this episode (the task's own context)
        return await _run(env, agent, task_id, seed, config, calls)


async def _run(env: Environment, agent: Agent, task_id: str, seed: int, config: EpisodeConfig,
               calls: CallStats) -> Episode:
    counters: dict[str, Any] = {"simulator_errors": 0, "simulator_timeouts": 0, "simulator_retries": 0,
                                "tool_errors": 0}
    t0 = time.perf_counter()
    timings = {"generate_s": 0.0, "env_s": 0.0}
    rewards: list[float] = []
    transcript: list[EnvMessage | AgentMessage] = []
    final: list[EnvMessage] = []
    termination, outcome, final_reaction, turns, tools = "max_turns", 0.0, None, 0, ()
    try:
        t = time.perf_counter()
        reset = await call_simulator(lambda: env.reset(task_id, seed), config, counters)
        timings["env_s"] += time.perf_counter() - t
        if reset is None:
            raise _Failure
        transcript.extend(reset.messages)
        tools = tuple(reset.tools)
        agent.start(task_id, reset, env)
        for turn in range(config.max_turns):
            t = time.perf_counter()
            msg = await agent.act(turn)
            timings["generate_s"] += time.perf_counter() - t
            if msg is None:
                termination = agent.stop_reason
                break
            turns += 1
            transcript.append(msg)
            t = time.perf_counter()
            step = await call_simulator(lambda: env.step(msg), config, counters)
            timings["env_s"] += time.perf_counter() - t
            if step is None:
                rewards.append(0.0)
                raise _Failure
            rewards.append(float(step.reward))
            counters["tool_errors"] = int(step.info.get("tool_errors", counters["tool_errors"]))
            counters["simulator_retries"] += int(step.info.get("simulator_retries", 0))  # client-side retries
            if step.done:  # the user's reaction to the last segment: not observed (no action follows it)
                if "partial" in step.info:  # a graded score beside a binary outcome (the gyms')
                    counters["partial"] = float(step.info["partial"])
                final = list(step.messages)
                final_reaction = last_reaction(step.messages, final_reaction)
                termination = "done"
                break
            if step.messages:
                if not agent.observe(step.messages, step.info):
                    termination = "max_tokens"
                    final = list(step.messages)
                    final_reaction = last_reaction(step.messages, final_reaction)  # the reaction still credits
                    break
                transcript.extend(step.messages)
        out = env.outcome_reward()
        outcome = sum(rewards) if out != out else out  # NaN: the sum of step rewards
    except _Failure:
        termination = "simulator_failure"
    finally:
        try:
            await agent.aclose()
        finally:
            try:
                await env.aclose()
            except Exception:  # noqa: BLE001
                if config.on_error == "raise":
                    raise
                counters["simulator_errors"] += 1
    timings["total_s"] = time.perf_counter() - t0
    sim = calls.as_dict()
    counters.update(sim_calls=sim["calls"], sim_attempts=sim["attempts"], sim_retries=sim["retries"],
                    sim_failed_calls=sim["failed_calls"], sim_failures=sim["failures"])
    failed = termination == "simulator_failure"
    return Episode(task_id, seed, termination, 0.0 if failed else float(outcome), rewards, transcript, final, turns,
                   None if failed else final_reaction, counters, timings, tools)


HOST = EpisodeConfig(max_turns=200, retries=0, timeout_s=None, on_error="raise")
"""The config of host episodes (evaluations of host agents, demonstrations): no retry, no timeout,
errors raised to the caller."""


async def play(env: Environment, agent: Agent, task_id: str, seed: int = 0, *, max_turns: int = 200) -> dict[str, Any]:
    """One episode of a host agent (`HOST`: errors raise); the environment's report
    (`Environment.report`) with ``agent_turns``."""
    episode = await run_episode(env, agent, task_id=task_id, seed=seed,
                                config=dataclasses.replace(HOST, max_turns=max_turns))
    return dict(env.report(), agent_turns=episode.turns)


async def play_tasks(make_env: Callable[[], Environment], make_agent: Callable[[Environment, int], Agent],
                     task_ids: Sequence[str], *, k: int, concurrency: int, max_turns: int = 200,
                     on_report: Callable[[Agent, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Every task ``k`` times (seeds 0..k-1), ``concurrency`` episodes at once, each with a fresh
    environment and a fresh agent ``make_agent(env, seed)`` (`play`). An episode whose simulator or
    agent fails is reported as ``simulator_failure`` (its partial report, ``score`` reward 0 and the
    ``error``) and the rest go on. ``on_report(agent, report)`` may add the agent's side to each
    report. Reports come back task-major, then seed order."""
    sem = asyncio.Semaphore(concurrency)

    async def one(tid: str, seed: int) -> dict[str, Any]:
        async with sem:
            env = make_env()
            agent = make_agent(env, seed)
            try:
                report = await play(env, agent, tid, seed, max_turns=max_turns)
            except Exception as e:  # noqa: BLE001 - counted, the evaluation goes on
                try:
                    partial = env.report()
                except Exception:  # noqa: BLE001 - a report of a half-reset episode
                    partial = {"messages": []}
                score = dict(partial.get("score") or {}, reward=0.0, components={})
                report = dict(partial, task_id=tid, seed=seed, termination="simulator_failure", score=score,
                              error=f"{type(e).__name__}: {e}"[:500])
            if on_report is not None:
                on_report(agent, report)
            return report

    return list(await asyncio.gather(*(one(t, s) for t in task_ids for s in range(k))))


async def play_policy(env: Environment, policy: Callable[[Environment], AgentMessage], task_id: str, seed: int = 0,
                      max_turns: int = 32) -> tuple[float, list]:
    """One episode of a scripted policy (``policy(env) -> AgentMessage``, e.g. a gym's expert):
    ``(total reward, transcript)``, the transcript the reset's messages, then each agent message
    followed by the environment's answers, the last step's included."""
    ep = await run_episode(env, PolicyFnAgent(policy), task_id=task_id, seed=seed,
                           config=dataclasses.replace(HOST, max_turns=max_turns))
    return sum(ep.rewards), ep.transcript + ep.final_messages


class PolicyFnAgent(Agent):
    """A function of the running environment as the agent (a scripted gym's expert or random
    policy reads the gym's hidden state: ``policy(env) -> AgentMessage``)."""

    def __init__(self, policy: Callable[[Environment], AgentMessage]):
        self.policy = policy
        self.env: Environment | None = None

    def start(self, task_id: str, reset: Reset, env: Environment) -> None:
        self.env = env

    async def act(self, turn: int) -> AgentMessage:
        return self.policy(self.env)


__all__ = ["HOST", "LABEL_CHARS", "Episode", "EpisodeConfig", "PolicyFnAgent", "call_simulator", "last_reaction",
           "play", "play_policy", "play_tasks", "run_episode"]

"""The rollout loop's per-call timeout against the HTTP simulators' worst case: which clients one
environment call may use, their budget, the derived ``rollout.timeout_s`` and the rule a set one
must meet (`check_timeout`, run by `jaxagent.jobs.config.RunConfig`)."""

from __future__ import annotations

from typing import Any

from jaxagent.envs.llm_user import LLMUserConfig
from jaxagent.jobs.sections import EnvSection, env_settings


#: ``rollout.timeout_s`` when null and no environment call goes over HTTP (gyms, tau2's scripted customer),
#: and the margin added to the simulator clients' budget when some do.
DEFAULT_TIMEOUT_S = 60.0
TIMEOUT_MARGIN_S = 30.0


def simulator_clients(env: EnvSection) -> list[tuple[str, LLMUserConfig]]:
    """The HTTP simulator clients (dotted key, settings) that one environment call (a reset or a
    step) may use one after the other, as ``env.kind``'s spec lists them (`EnvSpec.simulator_clients`:
    ``env.llm_user``; on tau2 ``env.tau2.customer_llm`` with customer=llm and ``env.tau2.judge`` with
    scoring=tau2, the episode's last step also judging)."""
    return list(env.spec.simulator_clients(env_settings(env)))


def simulator_budget_s(env: EnvSection) -> float:
    """The worst case of one environment call's HTTP time: the sum of its clients'
    `LLMUserConfig.call_budget_s` (0 without HTTP clients)."""
    return float(sum(c.call_budget_s() for _, c in simulator_clients(env)))


def episode_timeout_s(cfg: Any) -> float:
    """The loop's per-call timeout: ``rollout.timeout_s``, or when null the simulator budget +
    `TIMEOUT_MARGIN_S` (`DEFAULT_TIMEOUT_S` without HTTP clients)."""
    if cfg.rollout.timeout_s is not None:
        return float(cfg.rollout.timeout_s)
    budget = simulator_budget_s(cfg.env)
    return budget + TIMEOUT_MARGIN_S if budget > 0 else DEFAULT_TIMEOUT_S


def check_timeout(cfg: Any) -> None:
    """The rule: ``rollout.timeout_s`` (when set) >= `simulator_budget_s`, where a client's budget
    is ``(max_retries + 1) * (connect_timeout_s + read_timeout_s)`` + its backoff sleeps (each at
    most ``max(min(backoff_max_s, backoff_base_s * 2**k), retry_after_max_s)``). A shorter loop
    timeout cancels a call while its client still retries or waits out a Retry-After."""
    t = cfg.rollout.timeout_s
    budget = simulator_budget_s(cfg.env)
    if t is None or t >= budget:
        return
    parts = []
    for key, c in simulator_clients(cfg.env):
        sleeps = c.call_budget_s() - (c.max_retries + 1) * (c.connect_timeout_s + c.read_timeout_s)
        parts.append(f"{key}: ({key}.max_retries={c.max_retries} + 1) x ({key}.connect_timeout_s="
                     f"{c.connect_timeout_s:g} + {key}.read_timeout_s={c.read_timeout_s:g}) + {sleeps:g} s of backoff "
                     f"(up to {key}.retry_after_max_s={c.retry_after_max_s:g} each) = {c.call_budget_s():g} s")
    keys = " / ".join(k for k, _ in simulator_clients(cfg.env))
    raise ValueError(f"rollout.timeout_s={t:g}: below the simulator's worst case per environment call, {budget:g} s "
                     f"({'; '.join(parts)}); the loop would cancel a call while its client still retries or waits "
                     f"out a Retry-After. Expected rollout.timeout_s >= {budget:g}, or null (derived: {budget:g} + "
                     f"{TIMEOUT_MARGIN_S:g} s), or a smaller budget for {keys} (read_timeout_s, max_retries, "
                     "retry_after_max_s)")


__all__ = ["DEFAULT_TIMEOUT_S", "TIMEOUT_MARGIN_S", "check_timeout", "episode_timeout_s", "simulator_budget_s",
           "simulator_clients"]

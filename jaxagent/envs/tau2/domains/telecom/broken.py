"""The broken variants of the telecom oracle: plans that must score 0.

Telecom is scored by env assertions on the end state (and, on transfer tasks, by the action check),
not by the database hash, so each variant is checked by replaying its actions on the task's initial
state (each call synced, as in an episode) and scoring the end state as tau2 does
(`jaxagent.envs.tau2.scoring.env_assertion_reward`, times ACTION when the task's basis holds it):

- ``missing_write``: the first gold action of either side (the transfer included) whose omission
  fails the task; the customer, who performs only what is asked, never does a left-out device
  action;
- ``wrong_argument``: the first gold action with the first changed argument under which the call
  still succeeds and the task fails: another refuel amount, another network mode, another
  permission, another line or bill; an agent write made without asking the customer, a device
  action asked for with the wrong arguments;
- ``extra_write``: the agent suspends the customer's line, or disables its roaming (made without
  asking), just before the last gold action or else first; absent when no such write fails the
  task (the transfer tasks, whose phones have no service anyway).

A variant with no such proposal is absent from the result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jaxagent.envs.base import AgentMessage
from jaxagent.envs.tau2 import get_domain
from jaxagent.envs.tau2.tasks import Action, Task

__all__ = ["broken_plans", "replay_reward"]

_MODES = ("2g_only", "3g_only", "4g_only", "4g_5g_preferred")
_PERMISSIONS = ("sms", "storage", "phone", "network")
_EXTRAS = (Action("extra_suspend", "suspend_line", {"customer_id": "C1001", "line_id": "L1002", "reason": "extra"}),
           Action("extra_disable_roaming", "disable_roaming", {"customer_id": "C1001", "line_id": "L1002"}))


def replay_reward(task: Task, actions: Iterable[Action], data_dir: str | Path | None = None) -> tuple[float, list[bool]]:
    """The reward of an episode that made ``actions`` (each by its requestor, synced) and ended by a
    customer stop, and which of the actions succeeded: ENV_ASSERTION, times ACTION when the task's
    basis holds it."""
    from jaxagent.envs.tau2.scoring import action_reward, env_assertion_reward, initial_db

    domain = get_domain(task.domain)
    state = initial_db(task, data_dir)
    acts = list(actions)
    ok = [not domain.call(state, a.requestor, a.name, dict(a.arguments)).error for a in acts]
    if domain.sync is not None:
        domain.sync(state)
    reward, _ = env_assertion_reward(task, state)
    if "ACTION" in task.reward_basis:
        reward *= action_reward(task, [(a.name, a.arguments) for a, done in zip(acts, ok, strict=True) if done])
    return reward, ok


def _wrong(action: Action) -> Iterable[dict[str, Any]]:
    args = dict(action.arguments)
    if action.name == "refuel_data":
        for gb in (1.0, 3.0, 0.5):
            if gb != args.get("gb_amount"):
                yield {**args, "gb_amount": gb}
    elif action.name == "set_network_mode_preference":
        for mode in _MODES:
            if mode != args.get("mode"):
                yield {**args, "mode": mode}
    elif action.name == "grant_app_permission":
        for perm in _PERMISSIONS:
            if perm != args.get("permission"):
                yield {**args, "permission": perm}
    elif "line_id" in args:
        for line in ("L1001", "L1003", "L1002"):
            if line != args["line_id"]:
                yield {**args, "line_id": line}
    elif "bill_id" in args:
        for bill in ("B1002", "B1001", "B1003"):
            if bill != args["bill_id"]:
                yield {**args, "bill_id": bill}


def broken_plans(task: Task, data_dir: str | Path | None = None) -> dict[str, list[AgentMessage]]:
    """``{variant: turns}`` for the variants of the module docstring this task admits, each checked
    by replay to score 0 (its changed call succeeding)."""
    from jaxagent.envs.tau2.agents import plan_for

    acts = list(task.actions)
    out: dict[str, list[AgentMessage]] = {}

    def breaks(changed: list[Action], i: int | None = None) -> bool:
        reward, ok = replay_reward(task, changed, data_dir)
        return reward == 0.0 and (i is None or ok[i])

    for i, a in enumerate(acts):
        found = next((dataclasses.replace(a, arguments=args) for args in _wrong(a)
                      if breaks(acts[:i] + [dataclasses.replace(a, arguments=args)] + acts[i + 1:], i)), None)
        if found is not None:
            out["wrong_argument"] = plan_for(task, acts[:i] + [found] + acts[i + 1:], unconfirmed=[found])
            break
    for i in range(len(acts)):
        kept = acts[:i] + acts[i + 1:]
        if breaks(kept):
            out["missing_write"] = plan_for(task, kept)
            break
    positions = list(dict.fromkeys([max(len(acts) - 1, 0), 0]))
    for extra in _EXTRAS:
        at = next((p for p in positions if breaks(acts[:p] + [extra] + acts[p:], p)), None)
        if at is not None:
            out["extra_write"] = plan_for(task, acts[:at] + [extra] + acts[at:], unconfirmed=[extra])
            break
    return out


"""A tau2 domain: what the shared tau2 machinery needs from one (`jaxagent.envs.tau2.domains`).

The episode (`jaxagent.envs.tau2.env`), the scoring, the agents, the harness and the replay tool
are the same for every domain; a `Domain` supplies the rest: its packaged data, its state (loaded
and canonicalised), its toolkit (one call at a time, `execute`), which tools write, its served
schemas, its scripted customer, and the broken plans its oracle is checked against. Domains are
listed by name in `jaxagent.envs.tau2.DOMAINS` and loaded on first use (`get_domain`).

**Dual control** (telecom): the customer has tools of its own on a second database (its phone).
Such a domain sets ``execute_user`` and the ``user_*`` fields, its episode state holds both
databases (``db_hash`` / ``user_db_hash`` hash each part), and ``sync`` links them after every
successful call, as tau2's ``Environment.sync_tools``. `Domain.call` routes one call of either
requestor; a domain without user tools answers a user call as tau2 does (``User tools not
available``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jaxagent.envs.tau2 import db as tau2_db
from jaxagent.envs.tau2.tools import ToolResult, make_tool_call_error

USER_TOOLS_UNAVAILABLE = "Error: User tools not available"
"""tau2's tool message for a user call when the domain has no user toolkit (``use_user_tool`` raises)."""


def _no_user_db(state: dict) -> None:
    return None


def _no_tools() -> tuple[dict, ...]:
    return ()


@dataclasses.dataclass(frozen=True)
class Domain:
    """One tau2 domain.

    - ``data_dir``: the packaged data (``db.json``, ``policy.md``, the task files, ``tool_schemas.json``);
    - ``task_files``: split -> file name in the data directory;
    - ``load_db(data_dir)``: a fresh canonical database (``data_dir`` None: the packaged one);
    - ``load_policy(data_dir)``: the agent's policy text;
    - ``execute(db, name, arguments) -> ToolResult``: one agent tool call, never raising;
    - ``write_tools`` / ``read_tools``: the mutating tools (tau2's evaluator replays them) and the
      read-only lookups;
    - ``tool_schemas()``: the agent's tools as tau2 serves them, byte for byte, in tau2's order;
    - ``scripted_customer(task, view, **kwargs)``: the deterministic customer for offline runs;
    - ``broken_plans(task, data_dir)``: the oracle's broken variants (each must score 0);
    - ``auth_tools``: the lookups that authenticate the customer (the scripted customer needs them done);
    - ``toolkit(db)``: the toolkit object over ``db`` (one method per tool, tau2's names and parameters,
      raw return values before rendering), for tau2's environment functions (`jaxagent.envs.tau2.replay`);
    - ``env_functions``: the non-tool methods of tau2's toolkit class that ``toolkit`` reproduces under
      tau2's names and parameters (initialization actions and env assertions may call them).

    Dual control (all optional; defaults: no user tools, the state is the agent's database):

    - ``db_hash(state)`` / ``user_db_hash(state)``: tau2's ``get_db_hash`` / ``get_user_db_hash``
      (None without a user database);
    - ``execute_user(state, name, arguments) -> ToolResult``: one user tool call, never raising;
    - ``user_write_tools`` / ``user_read_tools``, ``user_tool_schemas()``: as for the agent's side;
    - ``user_toolkit(state)`` / ``user_env_functions``: the user toolkit object and its non-tool
      functions (initialization actions, env assertions);
    - ``sync(state)``: tau2's ``sync_tools``, run after every successful call, environment function
      and initialization (`Domain.call`, `jaxagent.envs.tau2.functions`);
    - ``ask_user_action(name, arguments)``: the agent message asking the customer to perform one of
      its own tool calls, in the form the scripted customer reads (the oracle's user actions).
    """

    name: str
    data_dir: Path
    load_db: Callable[[str | Path | None], dict]
    load_policy: Callable[[str | Path | None], str]
    execute: Callable[[dict, str, Any], Any]
    write_tools: frozenset[str]
    read_tools: frozenset[str]
    tool_schemas: Callable[[], tuple[dict, ...]]
    scripted_customer: Callable[..., Any]
    broken_plans: Callable[..., dict] | None = None
    task_files: Mapping[str, str] = dataclasses.field(default_factory=lambda: {"train": "tasks_train.json"})
    auth_tools: tuple[str, ...] = ()
    toolkit: Callable[[dict], Any] | None = None
    env_functions: frozenset[str] = frozenset()
    db_hash: Callable[[dict], str] = tau2_db.db_hash
    user_db_hash: Callable[[dict], str | None] = _no_user_db
    execute_user: Callable[[dict, str, Any], Any] | None = None
    user_write_tools: frozenset[str] = frozenset()
    user_read_tools: frozenset[str] = frozenset()
    user_tool_schemas: Callable[[], tuple[dict, ...]] = _no_tools
    user_toolkit: Callable[[dict], Any] | None = None
    user_env_functions: frozenset[str] = frozenset()
    sync: Callable[[dict], None] | None = None
    ask_user_action: Callable[[str, Mapping[str, Any]], str] | None = None

    @property
    def has_user_tools(self) -> bool:
        """Whether the customer acts with tools of its own (dual control)."""
        return self.execute_user is not None

    def state_hash(self, state: dict) -> str:
        """One hash of the whole state: ``db_hash``, joined with ``user_db_hash`` when there is a user
        database (tau2's DB check requires both to match)."""
        user = self.user_db_hash(state)
        return self.db_hash(state) if user is None else f"{self.db_hash(state)}|{user}"

    def writes(self, requestor: str, name: str) -> bool:
        """Whether ``name`` is a mutating tool of ``requestor``'s toolkit (tau2 replays those)."""
        return name in (self.user_write_tools if requestor == "user" else self.write_tools)

    def reads(self, requestor: str, name: str) -> bool:
        """Whether ``name`` is a read-only tool of ``requestor``'s toolkit."""
        return name in (self.user_read_tools if requestor == "user" else self.read_tools)

    def call(self, state: dict, requestor: str, name: str, arguments: Any, *, sync: bool = True) -> ToolResult:
        """One tool call of ``requestor`` (``"assistant"`` or ``"user"``) as tau2's
        ``Environment.get_response`` runs it: routed to that side's toolkit only, then (``sync``, the
        default) the state synced after a success. ``sync=False`` is tau2's bare ``make_tool_call``
        (its gold replay). Never raises."""
        if requestor == "user":
            if self.execute_user is None:
                collision = make_tool_call_error(arguments) if isinstance(arguments, dict) else None
                return ToolResult(collision or USER_TOOLS_UNAVAILABLE, True)
            result = self.execute_user(state, name, arguments)
        else:
            result = self.execute(state, name, arguments)
        if sync and not result.error and self.sync is not None:
            try:   # tau2 syncs inside the call's try: a failing sync answers the call with its error
                self.sync(state)
            except Exception as e:   # noqa: BLE001 — the tool's own change stays, as in tau2
                return ToolResult(f"Error: {e}", True)
        return result


__all__ = ["USER_TOOLS_UNAVAILABLE", "Domain"]

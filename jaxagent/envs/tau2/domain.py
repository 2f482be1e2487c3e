"""A tau2 domain: what the shared tau2 machinery needs from one (`jaxagent.envs.tau2.domains`).

The episode (`jaxagent.envs.tau2.env`), the scoring, the agents, the harness and the replay tool
are the same for every domain; a `Domain` supplies the rest: its packaged data, its database
(loaded and canonicalised), its toolkit (one call at a time, `execute`), which tools write, its
served schemas, its scripted customer, and the broken plans its oracle is checked against. Domains
are listed by name in `jaxagent.envs.tau2.DOMAINS` and loaded on first use (`get_domain`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


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


__all__ = ["Domain"]

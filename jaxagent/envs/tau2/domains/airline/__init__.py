"""tau2-bench airline: its database (`db`), its 14 tools (`tools`), its scripted customer
(`customer`) and its oracle's broken variants (`broken`), gathered as the `Domain` ``AIRLINE``
(built on first access, so that importing the tools alone does not import the customer)."""

from __future__ import annotations

import functools
from typing import Any

from jaxagent.envs.tau2.domain import Domain


@functools.cache
def _airline() -> Domain:
    from jaxagent.envs.tau2.domains.airline.broken import broken_plans
    from jaxagent.envs.tau2.domains.airline.customer import AUTH_TOOLS, ScriptedCustomer
    from jaxagent.envs.tau2.domains.airline.db import DEFAULT_DATA_DIR, TASK_FILES, load_db, load_policy
    from jaxagent.envs.tau2.domains.airline.tools import (
        ENV_FUNCTIONS,
        READ_TOOLS,
        WRITE_TOOLS,
        AirlineTools,
        execute,
        tool_schemas,
    )

    return Domain(name="airline", data_dir=DEFAULT_DATA_DIR, load_db=load_db, load_policy=load_policy,
                  execute=execute, write_tools=WRITE_TOOLS, read_tools=READ_TOOLS, tool_schemas=tool_schemas,
                  scripted_customer=ScriptedCustomer, broken_plans=broken_plans, task_files=TASK_FILES,
                  auth_tools=AUTH_TOOLS, toolkit=AirlineTools, env_functions=ENV_FUNCTIONS)


def __getattr__(name: str) -> Any:
    if name == "AIRLINE":
        return _airline()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AIRLINE"]

"""tau2-bench telecom, the dual-control domain: the provider's database and its 13 agent tools
(`db`, `tools`), the customer's phone and its 30 user tools with the sync between the two
(`phone`), the episode state that holds both (`state`), the scripted customer who acts on its
phone (`customer`) and the oracle's broken variants (`broken`), gathered as the `Domain`
``TELECOM`` (built on first access, so that importing the tools alone imports no customer)."""

from __future__ import annotations

import functools
from typing import Any

from jaxagent.envs.tau2.domain import Domain


@functools.cache
def _telecom() -> Domain:
    from jaxagent.envs.tau2.domains.telecom import state
    from jaxagent.envs.tau2.domains.telecom.broken import broken_plans
    from jaxagent.envs.tau2.domains.telecom.customer import ScriptedCustomer, device_request
    from jaxagent.envs.tau2.domains.telecom.db import DEFAULT_DATA_DIR, TASK_FILES, load_policy
    from jaxagent.envs.tau2.domains.telecom.phone import (
        USER_ENV_FUNCTIONS,
        USER_READ_TOOLS,
        USER_WRITE_TOOLS,
        user_tool_schemas,
    )
    from jaxagent.envs.tau2.domains.telecom.tools import ENV_FUNCTIONS, READ_TOOLS, WRITE_TOOLS, tool_schemas

    return Domain(name="telecom", data_dir=DEFAULT_DATA_DIR, load_db=state.load_state, load_policy=load_policy,
                  execute=state.execute, write_tools=WRITE_TOOLS, read_tools=READ_TOOLS, tool_schemas=tool_schemas,
                  scripted_customer=ScriptedCustomer, broken_plans=broken_plans, task_files=TASK_FILES,
                  toolkit=state.toolkit, env_functions=ENV_FUNCTIONS, db_hash=state.db_hash,
                  user_db_hash=state.user_db_hash, execute_user=state.execute_user,
                  user_write_tools=USER_WRITE_TOOLS, user_read_tools=USER_READ_TOOLS,
                  user_tool_schemas=user_tool_schemas, user_toolkit=state.user_toolkit,
                  user_env_functions=USER_ENV_FUNCTIONS, sync=state.sync, ask_user_action=device_request)


def __getattr__(name: str) -> Any:
    if name == "TELECOM":
        return _telecom()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TELECOM"]

"""tau2-bench retail: its database (`db`), its 16 tools (`tools`), its scripted customer
(`customer`) and its oracle's broken variants (`broken`), gathered as the `Domain` ``RETAIL``.
Both of tau2's splits ship: ``train`` (74 tasks) and ``test`` (40, the split the papers report)."""

from jaxagent.envs.tau2.domain import Domain
from jaxagent.envs.tau2.domains.retail.broken import broken_plans
from jaxagent.envs.tau2.domains.retail.customer import AUTH_TOOLS, ScriptedCustomer
from jaxagent.envs.tau2.domains.retail.db import DEFAULT_DATA_DIR, TASKS_FILE, load_db, load_policy
from jaxagent.envs.tau2.domains.retail.tools import (
    ENV_FUNCTIONS,
    READ_TOOLS,
    WRITE_TOOLS,
    RetailTools,
    execute,
    tool_schemas,
)

#: tau2's retail test split (40 tasks, the ids the train split lacks), in the packaged data directory.
TEST_TASKS_FILE = "tasks_test.json"

RETAIL = Domain(name="retail", data_dir=DEFAULT_DATA_DIR, load_db=load_db, load_policy=load_policy, execute=execute,
                write_tools=WRITE_TOOLS, read_tools=READ_TOOLS, tool_schemas=tool_schemas,
                scripted_customer=ScriptedCustomer, broken_plans=broken_plans,
                task_files={"train": TASKS_FILE, "test": TEST_TASKS_FILE}, auth_tools=AUTH_TOOLS, toolkit=RetailTools,
                env_functions=ENV_FUNCTIONS)

__all__ = ["RETAIL", "TEST_TASKS_FILE"]

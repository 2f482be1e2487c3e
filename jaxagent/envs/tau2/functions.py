"""tau2's environment functions (``Environment.run_env_function_call``), for every domain.

Initialization actions, env assertions and the replay tool's ``env_function`` lines call a function
of either side's toolkit by name: ``getattr(toolkit, func_name)(**arguments)`` on the assistant's
toolkit (``env_type`` ``"assistant"``) or the user's (``"user"``; None when the domain has no user
tools, so ``'NoneType' object has no attribute ...``), then tau2 syncs the state (`Domain.sync`).
Reproduced: each toolkit's tools (raw values before rendering), the non-tool methods the domain
reproduces (`Domain.env_functions`, `Domain.user_env_functions`), and the reading functions of
tau2's ``ToolKitBase`` (`ToolKitBase`). `run_assertion` is tau2's ``run_env_assertion``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxagent.envs.tau2.domain import Domain
from jaxagent.envs.tau2.tasks import REQUESTORS, EnvAssertion

__all__ = ["NOT_REPRODUCED", "NotReproduced", "ToolKitBase", "run_assertion", "run_env_function"]

NOT_REPRODUCED = frozenset({"update_db", "get_tools", "tools", "db"})
"""Attributes of tau2's toolkit that are not reproduced (tau2 revalidates the whole database through
its pydantic models, or returns Python objects)."""


class NotReproduced(ValueError):
    """An environment function tau2's toolkit has that is not reproduced here."""


class ToolKitBase:
    """The reading functions of tau2's ``ToolKitBase`` over one side's toolkit (tau2 reaches them
    with ``getattr`` on its toolkit). The class carries tau2's name so that Python's argument errors
    read as tau2's (``ToolKitBase.has_tool() missing 1 required positional argument: 'tool_name'``).
    Tool types come from the `Domain`: that side's write tools, its read tools, ``generic``
    otherwise; ``get_db_hash`` is that side's database hash."""

    FUNCTIONS = ("use_tool", "has_tool", "tool_type", "get_statistics", "get_db_hash")

    def __init__(self, domain: Domain, state: dict, toolkit: Any, side: str = "assistant"):
        self._domain, self._state, self._toolkit, self._side = domain, state, toolkit, side
        schemas = domain.user_tool_schemas() if side == "user" else domain.tool_schemas()
        names = [s["function"]["name"] for s in schemas]
        self._types = {n: "write" if domain.writes(side, n) else "read" if domain.reads(side, n) else "generic"
                       for n in names}

    def use_tool(self, tool_name: str, **kwargs: Any) -> Any:
        """The tool's raw result; ``ValueError("Tool '<name>' not found.")`` for another name."""
        if tool_name not in self._types:
            raise ValueError(f"Tool '{tool_name}' not found.")
        return getattr(self._toolkit, tool_name)(**kwargs)

    def has_tool(self, tool_name: str) -> bool:
        """Whether the toolkit has a tool of that name."""
        return tool_name in self._types

    def tool_type(self, tool_name: str) -> str:
        """``"read"``, ``"write"`` or ``"generic"`` (tau2's ``ToolType`` value); KeyError for another name."""
        return self._types[tool_name]

    def get_statistics(self) -> dict[str, int]:
        """tau2's tool counts by type."""
        types = list(self._types.values())
        return {"num_tools": len(types), "num_read_tools": types.count("read"),
                "num_write_tools": types.count("write"), "num_think_tools": types.count("think"),
                "num_generic_tools": types.count("generic")}

    def get_db_hash(self) -> str | None:
        """This side's database hash (`Domain.db_hash` / `Domain.user_db_hash`)."""
        return self._domain.user_db_hash(self._state) if self._side == "user" else self._domain.db_hash(self._state)


def _call(domain: Domain, state: dict, env_type: str, func_name: str, arguments: Mapping[str, Any]) -> Any:
    if env_type not in REQUESTORS:
        raise ValueError(f"env_type={env_type!r}: expected one of {', '.join(map(repr, REQUESTORS))}")
    make = domain.user_toolkit if env_type == "user" else domain.toolkit
    if make is None:
        if env_type == "user":   # tau2: getattr(None, func_name)
            raise AttributeError(f"'NoneType' object has no attribute '{func_name}'")
        raise NotReproduced(f"domain {domain.name!r} defines no toolkit for environment functions")
    toolkit = make(state)
    base = ToolKitBase(domain, state, toolkit, env_type)
    own = domain.user_env_functions if env_type == "user" else domain.env_functions
    if func_name in base._types or func_name in own:
        return getattr(toolkit, func_name)(**arguments)
    if func_name in ToolKitBase.FUNCTIONS:
        return getattr(base, func_name)(**arguments)
    if func_name == "_func_tools":   # a property of tau2's toolkit metaclass: a dict, called
        raise TypeError("'dict' object is not callable")
    if func_name in NOT_REPRODUCED or func_name.startswith("__"):
        raise NotReproduced(f"func_name={func_name!r}: tau2's toolkit has it, it is not reproduced here; "
                            f"expected a tool, one of {sorted(own)} or one of {list(ToolKitBase.FUNCTIONS)}")
    raise AttributeError(f"'{type(toolkit).__name__}' object has no attribute '{func_name}'")


def run_env_function(domain: Domain, state: dict, env_type: str, func_name: str, arguments: Mapping[str, Any]) -> Any:
    """tau2's ``run_env_function_call`` on ``state``: the function's raw return value, or the
    exception tau2 would raise; then the state synced (`Domain.sync`) when the function returned.
    `NotReproduced` for a function tau2 has that is not reproduced here."""
    value = _call(domain, state, env_type, func_name, arguments)
    if domain.sync is not None:
        domain.sync(state)
    return value


def run_assertion(domain: Domain, state: dict, assertion: EnvAssertion) -> bool:
    """tau2's ``run_env_assertion`` (without raising on a failed assertion): the function's result
    must be a bool (else ``ValueError``), compared with ``assert_value``."""
    value = run_env_function(domain, state, assertion.env_type, assertion.func_name, dict(assertion.arguments))
    if not isinstance(value, bool):
        raise ValueError(f"Function {assertion.func_name} returned {type(value)} instead of bool")  # noqa: TRY004
    return value == assertion.assert_value

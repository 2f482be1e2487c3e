"""The telecom episode state: the provider's database and the customer's phone, in one dict.

``{"db": <provider database>, "user_db": {"device": ..., "surroundings": ...}}`` — the provider
database of `jaxagent.envs.tau2.domains.telecom.db` (the agent's side) and the phone of
`jaxagent.envs.tau2.domains.telecom.phone` (the user's side). The shared tau2 machinery sees this
dict as the domain's database; these functions give it each side: the two hashes (tau2's
``get_db_hash`` and ``get_user_db_hash``, each sha256 of its part's canonical JSON), one call of
each side (unsynced: `Domain.call` syncs after a success), each side's toolkit object (for tau2's
environment functions) and the sync between them (spec §5).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxagent.envs.tau2 import db as tau2_db
from jaxagent.envs.tau2.domains.telecom import phone, tools
from jaxagent.envs.tau2.domains.telecom.db import load_db
from jaxagent.envs.tau2.tools import ToolResult

__all__ = ["db_hash", "execute", "execute_user", "load_state", "sync", "toolkit", "user_db_hash", "user_toolkit"]


def load_state(data_dir: str | Path | None = None) -> dict:
    """A fresh state: the provider database (``db.toml``) and the phone (``user_db.toml``), unsynced
    (the surroundings know no phone number until ``set_user_info``)."""
    return {"db": load_db(data_dir), "user_db": phone.load_user_db(data_dir)}


def db_hash(state: dict) -> str:
    """tau2's ``get_db_hash``: the provider database's hash."""
    return tau2_db.db_hash(state["db"])


def user_db_hash(state: dict) -> str:
    """tau2's ``get_user_db_hash``: the phone's hash (device and surroundings)."""
    return tau2_db.db_hash(state["user_db"])


def execute(state: dict, name: str, arguments: Any) -> ToolResult:
    """One agent tool call on the provider database (no sync)."""
    return tools.execute(state["db"], name, arguments)


def execute_user(state: dict, name: str, arguments: Any) -> ToolResult:
    """One user tool call on the phone (no sync)."""
    return phone.execute_user(state["user_db"], name, arguments)


def sync(state: dict) -> None:
    """tau2's ``sync_tools``: the account's line status, roaming, data usage and payment request
    reach the phone's surroundings, and a paid request marks its bill paid (spec §5)."""
    phone.sync(state["db"], state["user_db"])


def toolkit(state: dict) -> tools.TelecomTools:
    """The agent's toolkit over the state's provider database."""
    return tools.TelecomTools(state["db"])


def user_toolkit(state: dict) -> phone.TelecomUserTools:
    """The user's toolkit over the state's phone."""
    return phone.TelecomUserTools(state["user_db"])

"""tau2-bench, native in jaxagent, for many domains: retail, airline and telecom (docs/TAU2.md).

The shared core: `tasks` (tau2's task format, splits, selection), `db` (the hash, data files),
`tools` (the tool-call machinery, ``calculate``), `functions` (tau2's environment functions, env
assertions), `scoring` (DB, COMMUNICATE, ACTION, NL_ASSERTION, ENV_ASSERTION),
`customer` (the customer protocol and the LLM customer), `env` (the episode), `agents` (the oracle,
scripted and endpoint agents), `harness` (host evaluations), `spec` (the registered environment
family, ``env.kind=tau2``), `replay` (the replay tool). What is a domain's own lives in
`domains/<name>/` and is described by a `Domain` (`jaxagent.envs.tau2.domain`).

    domain = get_domain("retail")
"""

from __future__ import annotations

import importlib

from jaxagent.envs.tau2.domain import Domain

#: Domains by name -> "module:attribute" of their `Domain` (imported on first use).
DOMAINS: dict[str, str] = {"retail": "jaxagent.envs.tau2.domains.retail:RETAIL",
                           "airline": "jaxagent.envs.tau2.domains.airline:AIRLINE",
                           "telecom": "jaxagent.envs.tau2.domains.telecom:TELECOM"}

#: The domain of ``env.tau2.domain``'s default and of the functions that take one by name.
DEFAULT_DOMAIN = "retail"

_LOADED: dict[str, Domain] = {}


def get_domain(name: str) -> Domain:
    """The `Domain` called ``name``; ValueError naming the choices otherwise."""
    if name not in _LOADED:
        if name not in DOMAINS:
            raise ValueError(f"domain={name!r}: expected one of {', '.join(map(repr, DOMAINS))}")
        module, _, attr = DOMAINS[name].partition(":")
        _LOADED[name] = getattr(importlib.import_module(module), attr)
    return _LOADED[name]


__all__ = ["DEFAULT_DOMAIN", "DOMAINS", "Domain", "get_domain"]

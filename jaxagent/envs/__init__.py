"""Environments and simulated users (host code): the async protocol, LLM users over HTTP, gyms."""

from jaxagent.envs.base import AgentMessage, EnvMessage, Environment, Reset, Step

__all__ = ["AgentMessage", "EnvMessage", "Environment", "Reset", "Step"]

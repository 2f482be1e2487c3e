"""jaxagent: training LLM agents that talk with people, on one pure-functional JAX stack."""

__version__ = "0.1.0"

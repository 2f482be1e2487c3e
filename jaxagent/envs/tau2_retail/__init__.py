"""tau2-bench retail, native in jaxagent (see docs/TAU2_RETAIL.md)."""

"""tau2 domains, one package each (`jaxagent.envs.tau2.DOMAINS` lists them by name)."""

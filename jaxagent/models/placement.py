"""A model's parameters on a mesh: their shardings from the logical axes `jaxagent.models.qwen` names
and the rules of `jaxagent.models.sharding`, placing an existing pytree, and initialising one so
that each device only materialises its own shards.
"""

from __future__ import annotations

import jax

from jaxagent.models.qwen import init_params, param_logical_axes, param_shapes
from jaxagent.models.sharding import LogicalRules


def param_shardings(config, rules: LogicalRules):
    """NamedSharding for every parameter of a `QwenConfig` model (pytree like `init_params`)."""
    is_leaf = lambda x: isinstance(x, tuple)  # noqa: E731
    return jax.tree.map(
        lambda axes, shape: rules.sharding(axes, shape),
        param_logical_axes(config),
        param_shapes(config),
        is_leaf=is_leaf,
    )


def shard_params(params, config, rules: LogicalRules):
    """Places an existing parameter pytree with the rules' shardings."""
    return jax.device_put(params, param_shardings(config, rules))


def init_params_sharded(key: jax.Array, config, rules: LogicalRules):
    """`init_params` compiled with the parameter shardings as outputs: each device only ever
    materialises its own shards."""
    return jax.jit(init_params, static_argnums=1, out_shardings=param_shardings(config, rules))(key, config)


__all__ = ["init_params_sharded", "param_shardings", "shard_params"]

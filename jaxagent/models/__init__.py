"""Pure-functional Qwen2/2.5/3 models: config, parameters, forward, log-probs, HF interop, sharding."""

from jaxagent.models.attention import attention, attention_structure, attention_xla
from jaxagent.models.config import ConfigError, DTypePolicy, QwenConfig, RopeScaling, preset, preset_names
from jaxagent.models.hf import CheckpointError, load_pretrained, save_pretrained
from jaxagent.models.qwen import (
    Params,
    forward,
    hidden_states,
    init_params,
    logprobs_from_hidden,
    next_token_targets,
    param_logical_axes,
    param_shapes,
    token_logprobs,
)
from jaxagent.models.sharding import LogicalRules, MeshConfig, make_mesh, param_shardings, shard_params

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DTypePolicy",
    "LogicalRules",
    "MeshConfig",
    "Params",
    "QwenConfig",
    "RopeScaling",
    "attention",
    "attention_structure",
    "attention_xla",
    "forward",
    "hidden_states",
    "init_params",
    "load_pretrained",
    "logprobs_from_hidden",
    "make_mesh",
    "next_token_targets",
    "param_logical_axes",
    "param_shapes",
    "param_shardings",
    "preset",
    "preset_names",
    "save_pretrained",
    "shard_params",
    "token_logprobs",
]

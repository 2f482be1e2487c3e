"""Pure-functional Qwen2/2.5/3 models: config, parameters, forward, log-probs, LoRA, HF / PEFT interop, sharding."""

from jaxagent.models.attention import attention, attention_structure, attention_xla
from jaxagent.models.config import (
    LORA_TARGETS,
    ConfigError,
    DTypePolicy,
    LoraSpec,
    QwenConfig,
    RopeScaling,
    preset,
    preset_names,
)
from jaxagent.models.hf import CheckpointError, load_pretrained, save_pretrained
from jaxagent.models.lora import init_lora, merge_lora, num_lora_params
from jaxagent.models.lora_hf import load_peft_adapter, save_peft_adapter
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
from jaxagent.models.placement import param_shardings, shard_params
from jaxagent.models.sharding import LogicalRules, MeshConfig, make_mesh

__all__ = [
    "LORA_TARGETS",
    "CheckpointError",
    "ConfigError",
    "DTypePolicy",
    "LogicalRules",
    "LoraSpec",
    "MeshConfig",
    "Params",
    "QwenConfig",
    "RopeScaling",
    "attention",
    "attention_structure",
    "attention_xla",
    "forward",
    "hidden_states",
    "init_lora",
    "init_params",
    "load_peft_adapter",
    "load_pretrained",
    "logprobs_from_hidden",
    "make_mesh",
    "merge_lora",
    "next_token_targets",
    "num_lora_params",
    "param_logical_axes",
    "param_shapes",
    "param_shardings",
    "preset",
    "preset_names",
    "save_peft_adapter",
    "save_pretrained",
    "shard_params",
    "token_logprobs",
]

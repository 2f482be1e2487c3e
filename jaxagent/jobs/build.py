"""Building a run from its `RunConfig`: tokenizer, model, environments, engine, sampling and
episode settings, the per-step random draws, and `prepare` (the run directory checked and recorded)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxagent import configlib
from jaxagent.envs.base import EnvFactory
from jaxagent.jobs.sections import BUILTIN_TOKENIZER
from jaxagent.jobs.config import RunConfig
from jaxagent.jobs.runlog import RunLog
from jaxagent.models import DTypePolicy, LogicalRules, QwenConfig, make_mesh, preset
from jaxagent.models.generate import SamplingParams
from jaxagent.models.hf import load_pretrained
from jaxagent.models.placement import init_params_sharded
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.processes import ProcessGroup
from jaxagent.text.tokenizer import Tokenizer, load_tokenizer

PACKAGE = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- building blocks
def tokenizer_path(spec: str) -> Path:
    if spec == BUILTIN_TOKENIZER:
        return PACKAGE / "data" / "tokenizers" / "gyms"
    return Path(spec)


def build_tokenizer(cfg: RunConfig) -> Tokenizer:
    return load_tokenizer(tokenizer_path(cfg.tokenizer))


def model_config(cfg: RunConfig, vocab_size: int) -> QwenConfig:
    """The preset with the run's shape and initializer overrides (vocab rounded up to a multiple
    of 64), or the checkpoint's config.json."""
    m = cfg.model
    dtype = DTypePolicy(m.param_dtype, m.dtype)
    if m.path is not None:
        hf = json.loads((Path(m.path) / "config.json").read_text())
        return QwenConfig.from_hf_dict(hf, dtype=dtype, remat=m.remat, attn_impl=m.attn_impl)
    overrides = {f: getattr(m, f) for f in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                            "num_attention_heads", "num_key_value_heads", "head_dim",
                                            "initializer_range")
                 if getattr(m, f) is not None}
    return preset(m.preset, vocab_size=-(-vocab_size // 64) * 64, dtype=dtype, remat=m.remat, attn_impl=m.attn_impl,
                  max_position_embeddings=max(cfg.rollout.capacity, 2048), **overrides)


def build_model(cfg: RunConfig, tok: Tokenizer, rules: LogicalRules) -> tuple[QwenConfig, Any]:
    """The policy: the checkpoint (or the preset's random weights) and, with ``model.lora.rank``, a
    fresh LoRA adapter at ``params["lora"]`` (the config's ``lora`` set: jobs then train it alone)."""
    m = cfg.model
    if m.attn_impl == "cudnn" and (jax.default_backend() != "gpu" or m.dtype == "float32"):
        raise configlib.ConfigError(
            f"model.attn_impl='cudnn': needs a GPU backend and model.dtype=bfloat16 (have {jax.default_backend()}, "
            f"{m.dtype}); use 'xla' or 'blockwise'")
    if m.attn_impl == "splash" and jax.default_backend() != "tpu":
        raise configlib.ConfigError(
            f"model.attn_impl='splash': needs a TPU backend (have {jax.default_backend()}; off a TPU the kernel only "
            "runs in Pallas's interpreter, for tests); use 'auto', 'xla' or 'blockwise'")
    if m.path is not None:
        if (Path(m.path) / "config.json").is_file():  # else load_pretrained names what is missing
            check_vocab(cfg, tok, model_config(cfg, tok.vocab_size))
        qcfg, params = load_pretrained(m.path, dtype=DTypePolicy(m.param_dtype, m.dtype), rules=rules, remat=m.remat,
                                       attn_impl=m.attn_impl)
    else:
        qcfg = model_config(cfg, tok.vocab_size)
        params = init_params_sharded(jax.random.key(m.init_seed), qcfg, rules)
    if m.lora.rank:
        from jaxagent.models.lora import init_lora, lora_logical_axes

        qcfg = dataclasses.replace(qcfg, lora=m.lora.spec())
        adapter = init_lora(jax.random.key(m.lora.init_seed), qcfg)
        axes = lora_logical_axes(qcfg)
        shardings = jax.tree.map(lambda ax, x: rules.sharding(ax, x.shape), axes, adapter,
                                 is_leaf=lambda x: isinstance(x, tuple))
        params = {**params, "lora": jax.device_put(adapter, shardings)}
    return qcfg, params


def check_vocab(cfg: RunConfig, tok: Tokenizer, qcfg: QwenConfig) -> None:
    """The tokenizer's ids all index the model's embedding (a larger tokenizer would feed ids past
    the table: on accelerators a silent clamp, not an error)."""
    if tok.vocab_size > qcfg.vocab_size:
        raise configlib.ConfigError(
            f"tokenizer={cfg.tokenizer!r}: its ids reach {tok.vocab_size - 1}, past the vocabulary of "
            f"model.path={cfg.model.path!r} (vocab_size={qcfg.vocab_size}); expected the checkpoint's own tokenizer "
            f"or one of at most {qcfg.vocab_size} ids")


def build_env(cfg: RunConfig) -> tuple[EnvFactory, list[str], list[str]]:
    """(environment family, train task ids, test task ids): ``env.kind``'s spec built from the run
    (`jaxagent.jobs.config.env_context`); a setting it refuses is a `ConfigError`."""
    from jaxagent.jobs.config import env_context

    try:
        setup = cfg.env.spec.build(env_context(cfg))
    except ValueError as e:
        raise configlib.ConfigError(str(e)) from None
    return setup.factory, setup.train_tasks, setup.test_tasks


def sampling_params(cfg: RunConfig, tok: Tokenizer, *, temperature: float | None = None) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature if temperature is None else temperature, top_p=r.top_p,
                          top_k=r.top_k, max_new_tokens=r.max_new_tokens, stop_tokens=tuple(tok.eos_token_ids))


def episode_config(cfg: RunConfig) -> EpisodeConfig:
    r = cfg.rollout
    from jaxagent.jobs.config import episode_timeout_s

    return EpisodeConfig(max_turns=r.max_turns, max_tokens=r.max_tokens, retries=r.retries,
                         timeout_s=episode_timeout_s(cfg), tool_schemas_in_prompt=r.tool_schemas_in_prompt,
                         max_reply_tokens=r.max_reply_tokens)


def param_count(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def step_key(seed: int, phase: str, i: int) -> jax.Array:
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), {"sft": 1, "rl": 2, "eval": 3}[phase]), i)


def step_rng(seed: int, phase: str, i: int) -> np.random.Generator:
    return np.random.default_rng([seed, {"sft": 1, "rl": 2, "eval": 3}[phase], i])


# ----------------------------------------------------------------------------- the run
@dataclasses.dataclass
class Run:
    cfg: RunConfig
    run_dir: Path
    tok: Tokenizer
    qcfg: QwenConfig
    params: Any
    rules: LogicalRules
    make_env: EnvFactory
    train_tasks: list[str]
    test_tasks: list[str]
    engine: GenerationEngine
    log: RunLog
    processes: ProcessGroup = dataclasses.field(default_factory=ProcessGroup)  # several: who plays, who writes


def build_engine(cfg: RunConfig, params, qcfg: QwenConfig, *, park_rows: int, vocab_limit: int,
                 place=None) -> GenerationEngine:
    """The job's generation engine from ``rollout`` (slots, capacity, decode steps, where its caches
    live); a cache sharding the mesh cannot take is a config error naming ``rollout.cache_sharding``."""
    r = cfg.rollout
    try:
        return GenerationEngine(params, qcfg, slots=r.slots, capacity=r.capacity, park_rows=park_rows,
                                decode_steps=r.decode_steps, vocab_limit=vocab_limit, place=place,
                                cache_sharding=r.cache_sharding)
    except ValueError as e:
        raise configlib.ConfigError(str(e)) from None


def prepare(cfg: RunConfig) -> Run:
    """Builds the run. In a multi-process run (docs/PODS.md) every process checks the run directory
    (one path all of them see) before process 0 alone writes into it, and each process's engine
    decodes with its own copy of the policy (`ProcessGroup.local_params`)."""
    from jaxagent.jobs.resume import checked_run_dir, record_config

    processes = ProcessGroup.current()
    run_dir = checked_run_dir(cfg, refuse_checkpoints=True)
    processes.barrier("jaxagent-run-dir-checked")  # every process has read it before process 0 writes
    mesh = make_mesh(cfg.mesh)
    rules = LogicalRules(mesh)
    tok = build_tokenizer(cfg)
    qcfg, params = build_model(cfg, tok, rules)
    make_env, train_tasks, test_tasks = build_env(cfg)
    r = cfg.rollout
    park = r.park_rows if r.park_rows >= 0 else cfg.rl.group_size * cfg.rl.tasks_per_step
    engine = build_engine(cfg, params, qcfg, park_rows=park, vocab_limit=tok.vocab_size,
                          place=processes.local_params(qcfg))
    if processes.is_main:  # config.yaml (overwrite=true: into an emptied directory), or config.resume-<n>.yaml
        record_config(cfg, run_dir)
    from jaxagent.jobs.wandb_log import open_wandb

    log = RunLog(run_dir, cfg.progress, write=processes.is_main,  # log.wandb=true: process 0's W&B run
                 wandb=open_wandb(cfg, run_dir, tok.decode) if processes.is_main else None)
    processes.barrier("jaxagent-run-dir-ready")
    return Run(cfg, run_dir, tok, qcfg, params, rules, make_env, train_tasks, test_tasks, engine, log, processes)


def planning_model_config(cfg: RunConfig):
    """(the model config a plan uses, where its shapes come from): the checkpoint's config.json, or
    the preset's architecture when ``model.path`` (or a Hub tokenizer) is not downloaded yet."""
    import dataclasses

    from jaxagent.jobs.sections import BUILTIN_TOKENIZER
    from jaxagent.models import preset

    shapes_from = "model.path" if cfg.model.path else "model.preset"
    if cfg.model.path is not None and (Path(cfg.model.path) / "config.json").exists():
        qcfg = model_config(cfg, 0)
    elif cfg.model.path is not None:
        # The checkpoint is not here yet (the usual case before downloading it): check the
        # rest with the preset's architecture and say so.
        shapes_from = (f"model.preset={cfg.model.preset!r} (model.path={cfg.model.path!r} not downloaded yet: "
                       "no config.json here)")
        qcfg = preset(cfg.model.preset, dtype=model_config(dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, path=None), serve=dataclasses.replace(cfg.serve, adapter=None)),
            64).dtype)
    elif cfg.tokenizer != BUILTIN_TOKENIZER and not Path(cfg.tokenizer).is_dir():  # a Hub tokenizer, not here yet
        shapes_from = (f"model.preset={cfg.model.preset!r} with its own vocabulary (tokenizer={cfg.tokenizer!r} "
                       "not downloaded yet)")
        qcfg = model_config(cfg, preset(cfg.model.preset).vocab_size)
    else:
        qcfg = model_config(cfg, build_tokenizer(cfg).vocab_size)
    return qcfg, shapes_from


def write_export(run_dir: Path, cfg: RunConfig, qcfg: QwenConfig, host_params) -> list[str]:
    """The policy as a plain HF checkpoint in ``hf/`` (with ``model.lora``: the adapter merged into
    the base) plus the tokenizer's files, and with ``model.lora`` the adapter alone in ``adapter/``
    (PEFT format: ``peft.PeftModel.from_pretrained`` loads it onto the base). Returns the folders."""
    import shutil

    from jaxagent.models import save_pretrained

    out = ["hf"]
    if qcfg.lora is not None:
        from jaxagent.models.lora import merge_lora
        from jaxagent.models.lora_hf import save_peft_adapter

        save_peft_adapter(run_dir / "adapter", host_params, qcfg, base_model_name_or_path=cfg.model.path)
        host_params, qcfg = merge_lora(host_params, qcfg)
        out.append("adapter")
    save_pretrained(run_dir / "hf", qcfg, host_params)
    src = tokenizer_path(cfg.tokenizer)
    if src.is_dir():
        for f in src.iterdir():
            if f.is_file() and not (run_dir / "hf" / f.name).exists() and f.name != "README.md":
                shutil.copy2(f, run_dir / "hf" / f.name)
    return out


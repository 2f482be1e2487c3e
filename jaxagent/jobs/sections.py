"""The run config's general sections (`jaxagent.jobs.config.RunConfig` holds them): the model, the
environment, rollouts, SFT, DPO, evaluation and checkpoints; each checks itself at construction and
names the dotted key it refuses. `at_least`, `number_in` and `helped` are the checks and the help
metadata every section uses.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from jaxagent import configlib
from jaxagent.envs.llm_user import LLMUserConfig
from jaxagent.envs.registry import EnvSpec, resolve_env
from jaxagent.envs.tau2.agents import EndpointConfig
from jaxagent.envs.tau2.spec import Tau2Section

GYM_NAMES = ("intention", "telepathy", "function", "preference")
BUILTIN_TOKENIZER = "builtin:gyms"

_field = dataclasses.field


def at_least(name: str, value: int, lo: int, what: str | None = None) -> None:
    if value < lo:
        raise ValueError(f"{name}={value}: expected {what or f'an integer >= {lo}'}")


def number_in(name: str, value: float, *, lo: float, lo_open: bool = False, hi: float = math.inf, what: str) -> None:
    if not (math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi):
        raise ValueError(f"{name}={value}: expected {what}")


def helped(default, text: str):
    return _field(default=default, metadata={"help": text})


@dataclasses.dataclass(frozen=True)
class LogSection:
    """Where a run's scalars go besides metrics.jsonl and TensorBoard (always written): Weights &
    Biases with ``wandb=true`` (``pip install 'jaxagent[wandb]'``), in ``wandb_mode`` (``offline``
    writes ``runs/<name>/wandb/`` for a later ``wandb sync``)."""

    wandb: bool = helped(False, "also log to Weights & Biases: the scalars, the plots, a table of sampled episodes")
    wandb_project: str = helped("jaxagent", "the W&B project")
    wandb_entity: str | None = helped(None, "the W&B entity (team or user); null: your default")
    wandb_mode: Literal["online", "offline", "disabled"] = helped("online", "online, offline (sync later) or disabled")
    wandb_table_rows: int = helped(16, "sampled episodes per RL iteration in the trajectory table")

    def __post_init__(self) -> None:
        at_least("log.wandb_table_rows", self.wandb_table_rows, 0)
        if not self.wandb_project:
            raise ValueError("log.wandb_project='': expected a W&B project name")


@dataclasses.dataclass(frozen=True)
class LoraSection:
    """``model.lora``: a LoRA adapter trained beside the frozen base (jaxagent.models.lora)."""

    rank: int = helped(0, "the adapter's rank (0: no adapter, every parameter trained)")
    alpha: float = helped(16.0, "the scale is alpha / rank")
    dropout: float = helped(0.0, "dropout on each adapted projection's input (training only)")
    targets: tuple[str, ...] = helped(("q", "k", "v", "o", "gate", "up", "down"), "the adapted projections")
    init_seed: int = helped(0, "the adapter's random A (B starts at 0: a fresh adapter changes nothing)")

    def __post_init__(self) -> None:
        at_least("rank", self.rank, 0)
        if self.rank:
            self.spec()  # checks alpha, dropout and targets, naming lora.<field>

    def spec(self):
        from jaxagent.models.config import LoraSpec

        return LoraSpec(rank=self.rank, alpha=self.alpha, dropout=self.dropout, targets=tuple(self.targets))


@dataclasses.dataclass(frozen=True)
class ModelSection:
    preset: str = helped("tiny-qwen2", "a preset name (see --help) used when path is null")
    path: str | None = helped(None, "a Hugging Face checkpoint (Qwen2/2.5/3): a local directory, or a Hub id "
                                    "org/name[@revision] (from the Hub cache, else downloaded)")
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    dtype: Literal["float32", "bfloat16"] = helped("float32", "compute dtype")
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    remat: Literal["none", "full", "dots"] = "none"
    attn_impl: Literal["auto", "xla", "cudnn", "blockwise", "splash"] = helped(
        "auto", "attention: xla (L x S scores), cudnn (GPU, 16-bit), blockwise (memory linear in L), splash (TPU: "
        "the Pallas splash kernel where it applies, else blockwise); auto: blockwise on a CPU, cudnn on a GPU for "
        "16-bit compute, splash on a TPU (else xla there), else xla")
    init_seed: int = 0
    initializer_range: float | None = helped(
        None, "std of the random initial weights (presets only; null: the preset's, 0.02 as transformers)")
    lora: LoraSection = _field(default_factory=LoraSection)

    def __post_init__(self) -> None:
        from jaxagent.models import preset_names

        if self.initializer_range is not None and not self.initializer_range > 0:
            raise ValueError(f"initializer_range={self.initializer_range}: expected a positive number or null")

        if self.path is None and self.preset not in preset_names():
            raise ValueError(f"preset={self.preset!r}: expected one of {', '.join(preset_names())} "
                             "(or set model.path to a checkpoint directory)")
        for f in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim"):
            v = getattr(self, f)
            if v is not None and v < 1:
                raise ValueError(f"{f}={v}: expected a positive integer or null")
            if v is not None and self.path is not None:
                raise ValueError(f"{f}={v}: shape overrides apply to presets only, not to model.path")


@dataclasses.dataclass(frozen=True)
class EnvSection:
    kind: str = helped(
        "gym", "the environment family: a registered name (see --help: gym, llm_user, tau2, tau2_retail, ...) or "
               "package.module:NAME, a user's EnvSpec (docs/ENVIRONMENTS.md)")
    gym: str = helped("intention", "kind=gym: the gym (" + ", ".join(GYM_NAMES) + ")")
    max_steps: int | None = helped(None, "gym steps before the user gives up (null: the gym's default)")
    outcome: Literal["graded", "binary"] = helped(
        "graded", "gym outcome: graded (partial credit) or binary (1 for a full answer, else 0: more groups "
                  "whose outcomes are all equal, where only turn-level credit discriminates)")
    train_tasks: int = 512
    test_tasks: int = 64
    task_seed: int = 0
    llm_user: LLMUserConfig | None = None
    user_tasks: str | None = helped(None, "llm_user: a JSON file {task_id: {profile, opening}}")
    tau2: Tau2Section = _field(default_factory=Tau2Section)
    options: dict[str, Any] = _field(default_factory=dict, metadata={
        "help": "a package.module:NAME environment's own settings, checked against its EnvSpec.settings_type"})

    def __post_init__(self) -> None:
        if self.train_tasks < 1 or self.test_tasks < 1:
            raise ValueError(f"train_tasks={self.train_tasks}, test_tasks={self.test_tasks}: expected >= 1")
        spec = resolve_env(self.kind)
        settings = env_settings(self)  # a plug-in's options, checked against its settings type
        if spec.check is not None:
            spec.check(settings)

    @property
    def spec(self) -> EnvSpec:
        """The registered family ``kind`` names (`jaxagent.envs.registry.resolve_env`)."""
        return resolve_env(self.kind)


def env_settings(env: EnvSection) -> Any:
    """What ``env.kind``'s spec is built from: ``env.options`` parsed into its ``settings_type`` when
    it has one, else the ``env`` section itself (the built-ins read their own keys of it)."""
    spec = resolve_env(env.kind)
    if spec.settings_type is None:
        if env.options:
            raise ValueError(f"options={dict(env.options)!r}: env.kind={env.kind!r} takes no options; expected {{}}")
        return env
    return configlib.parse_section(spec.settings_type, env.options, path="env.options")


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    slots: int = helped(16, "decode lanes of the generation engine")
    capacity: int = helped(1024, "KV-cache positions per lane")
    park_rows: int = helped(-1, "rows that keep waiting sessions' prefixes (-1: one per episode)")
    decode_steps: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 96
    max_turns: int = 12
    max_tokens: int = helped(1024, "an episode ends (max_tokens) before its context exceeds this")
    retries: int = 2
    timeout_s: float | None = helped(
        None, "seconds one environment call (reset/step) may take before the loop cancels it and counts a failure; "
              "must be >= the simulator clients' worst case per call (see simulator_budget_s); null: that + 30 s "
              "(60 s when no call goes over HTTP)")
    max_reply_tokens: int = helped(
        512, "tokens kept of each simulated-user message (longer replies are cut, counted as sim/truncated_replies; "
             "0: no limit, rollout.max_tokens still holds)")
    tool_schemas_in_prompt: bool = helped(True, "render the tools' JSON schemas into the system prompt")
    cache_sharding: str = helped(
        "replicated", "where the engine's KV and park caches live on several devices: replicated (each holds all) or "
                      "heads (the KV heads split over the mesh: 1/devices each; the device count must divide them)")

    def __post_init__(self) -> None:
        from jaxagent.rollout.engine import CACHE_SHARDINGS

        if self.cache_sharding not in CACHE_SHARDINGS:
            raise ValueError(f"cache_sharding={self.cache_sharding!r}: expected "
                             f"{' or '.join(map(repr, CACHE_SHARDINGS))}")
        for f in ("slots", "capacity", "decode_steps", "max_new_tokens", "max_turns", "max_tokens"):
            at_least(f, getattr(self, f), 1)
        at_least("retries", self.retries, 0)
        at_least("top_k", self.top_k, 0, what="an integer >= 0 (0: no top-k filter)")
        number_in("temperature", self.temperature, lo=0.0, what="a finite number >= 0 (0: greedy)")
        number_in("top_p", self.top_p, lo=0.0, lo_open=True, hi=1.0, what="a number in (0, 1] (1: no nucleus filter)")
        if self.timeout_s is not None:
            number_in("timeout_s", self.timeout_s, lo=0.0, lo_open=True,
                       what="a finite number of seconds > 0, or null (derived from the simulator clients' budget)")
        at_least("max_reply_tokens", self.max_reply_tokens, 0, what="an integer >= 0 (0: no limit)")
        if self.max_tokens > self.capacity:
            raise ValueError(f"max_tokens={self.max_tokens}: expected <= capacity={self.capacity}")
        if self.park_rows < -1:
            raise ValueError(f"park_rows={self.park_rows}: expected -1 (one per episode) or >= 0")


@dataclasses.dataclass(frozen=True)
class SFTSection:
    # 1000: at 600 the quickstart's copy circuit formed for 4 seeds of 5 and not for seed 2 (its batch
    # order; docs/BENCHMARKS.md, "A warm start on every seed"); at 1000 it formed for every seed tried.
    steps: int = helped(1000, "SFT updates (jobs sft and sft+rl)")
    batch_size: int = 16
    demos: int = helped(512, "expert demonstrations on train tasks (tau2_retail: the oracle's, one per task)")
    noise: float = helped(0.05, "share of demo turns taken by the random policy (not trained on)")
    demo_policy: Literal["expert", "imitable"] = helped(
        "imitable", "expert: the gym's (possibly privileged) expert; imitable: one that uses only what the agent sees")
    lr: float | None = helped(1e-2, "SFT learning rate (null: optim.lr)")
    warmup_steps: int | None = helped(
        10, "SFT warmup steps (null: optim.warmup_steps); the quickstart's tiny model needs them for its copy "
            "circuit to form, whatever the RL phase's warmup")
    schedule: Literal["constant", "cosine"] = helped(
        "cosine", "after the warmup: constant, or cosine decay to final_lr_fraction * lr at the last step")
    final_lr_fraction: float = 0.05
    max_skipped_share: float = helped(
        0.5, "stop (non-zero exit) once more than this share of the SFT updates were skipped for non-finite "
             "values (checked at each logged step once 4 were made, and at the end; 1: never)")
    data: str | None = helped(
        None, "a JSONL of rows: job=qd_label's sft.jsonl or decisions.jsonl, or chat data in TRL's formats "
              "('messages', or 'prompt' + 'completion'; docs/DATA.md): job=sft trains on them (the completions or the "
              "assistant turns alone, Q&D rows' sample weights) instead of an environment's demonstrations")
    epochs: float | None = helped(None, "with sft.data: passes over the rows (sets the steps; null: sft.steps)")
    warmup_ratio: float | None = helped(None, "with sft.data: warmup as a share of the steps (null: sft.warmup_steps)")
    microbatches: int = helped(1, "with sft.data: gradient accumulation (sft.batch_size rows in this many parts)")
    max_len: int = helped(5120, "with sft.data: rows of more tokens (prompt + completion) are left out, counted")

    def __post_init__(self) -> None:
        if self.lr is not None:  # as optim.lr: a finite rate >= 0
            number_in("lr", self.lr, lo=0.0, what="a finite number >= 0, or null (optim.lr)")
        for f in ("epochs", "warmup_ratio"):
            v = getattr(self, f)
            if v is not None:
                number_in(f, v, lo=0.0, lo_open=f == "epochs", hi=1.0 if f == "warmup_ratio" else math.inf,
                           what="a number in [0, 1]" if f == "warmup_ratio" else "a number > 0 or null")
        at_least("microbatches", self.microbatches, 1)
        at_least("max_len", self.max_len, 2)
        if self.batch_size % self.microbatches:
            raise ValueError(f"microbatches={self.microbatches}: expected a divisor of sft.batch_size={self.batch_size}")
        if not 0.0 <= self.max_skipped_share <= 1.0:
            raise ValueError(f"max_skipped_share={self.max_skipped_share}: expected a number in [0, 1] (1: never stop)")
        if self.warmup_steps is not None and (isinstance(self.warmup_steps, bool) or self.warmup_steps < 0):
            raise ValueError(f"warmup_steps={self.warmup_steps!r}: expected null or an integer >= 0")
        if not 0.0 <= self.final_lr_fraction <= 1.0:
            raise ValueError(f"final_lr_fraction={self.final_lr_fraction}: expected a number in [0, 1]")
        if not 0.0 <= self.noise < 1.0:
            raise ValueError(f"noise={self.noise}: expected a number in [0, 1)")
        if self.steps < 0 or self.batch_size < 1 or self.demos < 1:
            raise ValueError(f"steps={self.steps}, batch_size={self.batch_size}, demos={self.demos}: "
                             "expected steps >= 0 and batch_size, demos >= 1")


@dataclasses.dataclass(frozen=True)
class DPOSection:
    """``job=dpo``: preference pairs (job=qd_label's pairs.jsonl, or TRL's rows: docs/DATA.md) against the
    frozen initial policy."""

    data: str | None = helped(None, "the pairs: JSONL of job=qd_label's pairs.jsonl, or TRL's 'prompt' + 'chosen' + "
                                    "'rejected' rows, strings or messages (docs/DATA.md)")
    stage: Literal[2, 3] = helped(
        2, "the Q&D stage's pairs: 2 = ask_ask pairs only; 3 = ask_ask + ask_stop + synthesised stop contrasts, "
           "every pair decided by stop_done left out (TRL-format pairs train at either stage)")
    beta: float = 0.1
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"
    label_smoothing: float = 0.0
    lr: float = helped(5e-6, "AdamW's peak rate (constant after the warmup; clipped at global norm 1)")
    epochs: int = 1
    batch_size: int = helped(16, "pairs per update")
    microbatches: int = helped(1, "gradient accumulation: dpo.batch_size pairs in this many parts")
    warmup_ratio: float = 0.03
    max_len: int = helped(5120, "pairs whose prompt + completion is longer are left out, counted")

    def __post_init__(self) -> None:
        from jaxagent.train.dpo import DPOSettings

        DPOSettings(**self.settings_kwargs())  # checks every field, naming dpo.<field>

    def settings_kwargs(self) -> dict:
        return {f: getattr(self, f) for f in ("beta", "loss_type", "label_smoothing", "lr", "epochs", "batch_size",
                                              "microbatches", "warmup_ratio", "max_len")}


@dataclasses.dataclass(frozen=True)
class EvalSection:
    k: int | None = helped(
        None, "runs per task (avg@k, pass^k); null: the environment's default (EnvSpec.eval_k: tau2 4, as the "
              "papers report avg@4 and pass^4; the others 1)")
    tasks: int = helped(32, "held-out (test split) tasks")
    temperature: float = helped(0.0, "0: greedy")
    sampled_k: int = helped(
        4, "policy evaluations also sample sampled_k runs per task at rollout.temperature (the distribution RL "
           "trains), logged as sampled/*; not the first evaluation of a random initialisation; 0: off")
    every: int = helped(4, "RL iterations between evaluations (0: only before and after)")
    agent: Literal["policy", "oracle", "endpoint"] = helped(
        "policy", "job=eval: the model (policy), the gold-action oracle (tau2), or an OpenAI-compatible "
                  "endpoint (eval.endpoint; tau2)")
    endpoint: EndpointConfig | None = helped(
        None, "agent=endpoint: the agent's OpenAI-compatible server (its system prompt is the environment's, "
              "its temperature eval.temperature)")
    concurrency: int = helped(8, "agent=oracle/endpoint: episodes played at once")

    def __post_init__(self) -> None:
        number_in("temperature", self.temperature, lo=0.0, what="a finite number >= 0 (0: greedy)")
        if self.agent == "endpoint" and self.endpoint is None:
            raise ValueError("agent='endpoint': expected eval.endpoint (base_url, model, ...)")
        if self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency}: expected an integer >= 1")
        at_least("sampled_k", self.sampled_k, 0, what="an integer >= 0 (0: no sampled evaluation)")
        if self.k is not None:
            at_least("k", self.k, 1, what="an integer >= 1, or null (the environment's default: EnvSpec.eval_k)")
        if self.tasks < 1 or self.every < 0:
            raise ValueError(f"tasks={self.tasks}, every={self.every}: expected tasks >= 1, every >= 0")

    def runs_per_task(self, spec: EnvSpec) -> int:
        """``k``, or when null the environment's default (``spec.eval_k``)."""
        return self.k if self.k is not None else spec.eval_k


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    every: int = helped(4, "RL iterations (or SFT steps) between checkpoints (0: only at the end)")
    keep: int = 2
    best_metric: str | None = "eval/success"
    async_save: bool = True
    export_hf: bool = helped(True, "write the final policy as a Hugging Face checkpoint")

    def __post_init__(self) -> None:
        at_least("every", self.every, 0, what="an integer >= 0 (0: only at the end)")
        at_least("keep", self.keep, 1, what="an integer >= 1 (checkpoints kept; resume needs one)")




__all__ = ["BUILTIN_TOKENIZER", "GYM_NAMES", "CheckpointSection", "DPOSection", "EnvSection", "EvalSection",
           "LoraSection", "ModelSection", "RolloutSection", "SFTSection", "at_least", "env_settings", "helped",
           "number_in"]


def check_credit(cfg: Any) -> None:
    """The credit settings against the environment (a run config's cross-section check): Faca's
    ``faca.polarity`` labels among those ``env.kind`` declares, and ``infopo.prior=marginal`` only
    where the environment enumerates its replies. Raises ValueError naming the key."""
    spec = cfg.env.spec
    declared = {str(x).strip().lower() for x in spec.reaction_labels}
    unknown = sorted(k for k in cfg.faca.polarity if k.strip().lower() not in declared)
    if unknown:
        raise ValueError(f"faca.polarity.{unknown[0]}: not a reaction label of env.kind={cfg.env.kind!r}; expected "
                         f"one of {', '.join(spec.reaction_labels) or '(none: its users attach no labels)'}")
    if cfg.infopo.prior == "marginal" and not spec.enumerates_replies(env_settings(cfg.env)):
        raise ValueError(f"infopo.prior='marginal': env.kind={cfg.env.kind!r} does not enumerate the replies its "
                         "feedback could have been (EnvSpec.reply_alternatives); expected infopo.prior='placeholder'")

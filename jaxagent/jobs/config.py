"""The run configuration: one typed tree, loaded from YAML with dotted overrides (`configlib`).

The defaults ARE the quickstart (``python -m jaxagent.launch`` with no arguments): a tiny
Qwen-architecture model over the gyms' small tokenizer, an SFT warm start on expert
demonstrations mixed with noise, then RL (GRPO) on the intention gym, on whatever CPU runs it.
Files in ``configs/`` change what differs from it (the paper-scale settings, other gyms, an LLM
user over HTTP). Sections reuse the library's own frozen settings classes (`PPOConfig`,
`InfoPOConfig`, `FacaConfig`, `GRPOConfig`, `OptimSettings`, `RLSettings`, `MeshConfig`,
`LLMUserConfig`), so a field is validated in one place. The general sections are in
`jaxagent.jobs.sections`; here are the serving and Q&D sections and the run config itself.

    cfg = load_config("configs/infopo_7b.yaml", ["optim.lr=1e-6", "rl.group_size=8"])
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Literal

from jaxagent import configlib
from jaxagent.credit.infopo import InfoPOConfig
from jaxagent.credit.grpo import GRPOConfig
from jaxagent.credit.losses import PPOConfig
from jaxagent.credit.reaction import FacaConfig
from jaxagent.envs.llm_user import LLMUserConfig
from jaxagent.envs.registry import EnvContext
from jaxagent.envs.tau2.spec import tau2_domain
from jaxagent.jobs.registry import job_names
from jaxagent.jobs.sections import (BUILTIN_TOKENIZER, CheckpointSection, DPOSection, EnvSection,
                                    EvalSection, LogSection, ModelSection, RolloutSection, SFTSection, at_least,
                                    check_credit, env_settings, helped, number_in)
from jaxagent.jobs.timeouts import (DEFAULT_TIMEOUT_S, TIMEOUT_MARGIN_S, check_timeout, episode_timeout_s,  # noqa: F401
                                    simulator_budget_s, simulator_clients)
from jaxagent.models.sharding import MeshConfig
from jaxagent.train.rl import RLSettings
from jaxagent.train.step import OptimSettings


_field = dataclasses.field


@dataclasses.dataclass(frozen=True)
class ServeSection:
    """``job=serve``: the policy behind an OpenAI-compatible HTTP API (docs/SERVING.md). The
    engine's lanes, cache rows and decode steps are ``rollout.slots``, ``rollout.capacity``,
    ``rollout.park_rows`` and ``rollout.decode_steps``."""

    host: str = helped("127.0.0.1", "the address to bind (0.0.0.0 exposes the server: set api_key_env too)")
    port: int = helped(8000, "the port (0: a free one, printed at start)")
    api_key_env: str | None = helped(
        None, "the NAME of an environment variable holding the bearer token every /v1 request must carry (null: none)")
    model_name: str | None = helped(None, "the model id clients name (null: the checkpoint or run directory's name, "
                                         "or the preset's)")
    run: str | None = helped(None, "a run directory: serve its final policy (<run>/hf, its tokenizer included) "
                                  "instead of model.path")
    adapter: str | None = helped(None, "a PEFT LoRA adapter directory (e.g. <run>/adapter) applied to model.path")
    max_tokens: int = helped(512, "a request without max_tokens generates at most this many (and what fits)")
    max_n: int = helped(8, "the largest n (choices per request)")
    max_queue: int = helped(64, "choices that may wait for a lane; beyond them a request gets 429 with Retry-After")
    retry_after_s: int = helped(1, "the Retry-After of a 429")
    request_timeout_s: float = helped(600.0, "a request running longer is cancelled and answered 504")
    shutdown_timeout_s: float = helped(30.0, "on SIGINT/SIGTERM, seconds in-flight requests get to finish")
    max_body_bytes: int = helped(4 * 2**20, "a request body larger than this is refused with 413 before it is read "
                                            "whole")
    warmup: bool = helped(False, "compile every engine shape before listening (slower start, no compile on a "
                                "first request)")

    def __post_init__(self) -> None:
        import re

        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host={self.host!r}: expected an address such as 127.0.0.1")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port}: expected an integer in [0, 65535] (0: a free port)")
        if self.api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            # never echo it: a key pasted here by mistake must not reach logs
            raise ValueError("api_key_env=<not shown>: expected null or the NAME of an environment variable "
                             "([A-Za-z_][A-Za-z0-9_]*), not the key itself")
        for f in ("max_tokens", "max_n"):
            at_least(f, getattr(self, f), 1)
        for f in ("max_queue", "retry_after_s"):
            at_least(f, getattr(self, f), 0)
        at_least("max_body_bytes", self.max_body_bytes, 1024, "an integer >= 1024 (bytes)")
        for f in ("request_timeout_s", "shutdown_timeout_s"):
            number_in(f, getattr(self, f), lo=0.0, lo_open=True, what="a finite number of seconds > 0")
        if self.model_name is not None and not self.model_name.strip():
            raise ValueError(f"model_name={self.model_name!r}: expected a non-empty name or null")


QUESTIONERS = ("scripted", "never_ask", "policy", "endpoint")


@dataclasses.dataclass(frozen=True)
class QDTau2Section:
    """``qd.tau2``: ``job=qd_tau2``, the Q&D loop in a tau2 agent (docs/QD.md, "tau2 transfer")."""

    selector: Literal["rules", "endpoint"] = helped(
        "rules", "maps a question to one read-only tool call: rules (offline stand-in: the identifier the question "
                 "names) or endpoint (qd.tau2.selector_endpoint, else qd.drafter_endpoint: the drafter's model)")
    selector_endpoint: LLMUserConfig | None = None
    baseline: Literal["none", "never_ask", "endpoint"] = helped(
        "never_ask", "the arm without the questioner: never_ask (the same drafter and answerer, no question), "
                     "endpoint (qd.drafter_endpoint's model as a plain tool-calling agent, at eval.temperature)")
    questions: int = helped(16, "executed questions per dialogue")
    tool_calls: int = helped(16, "planned tool calls per dialogue (calculate and transfer_to_human_agents exempt)")
    max_decisions: int = helped(16, "questioner decisions per assistant turn")
    prompt: Literal["routing", "routing_stop"] = helped(
        "routing", "the questioner's instructions: routing (what the read-only lookups answer), routing_stop (and "
                   "when to stop)")

    def __post_init__(self) -> None:
        for f in ("questions", "tool_calls", "max_decisions"):
            at_least(f, getattr(self, f), 0)


@dataclasses.dataclass(frozen=True)
class QDSection:
    """``job=qd_eval``: questioners on a retrieval QA suite (docs/QD.md)."""

    benchmark: Literal["musique", "strategyqa", "2wiki", "synthetic"] = helped(
        "musique", "the suite (its shipped file unless qd.file; synthetic: a file of python -m jaxagent.qd.synthetic)")
    file: str | None = helped(None, "a benchmark file in the release's format (null: the shipped one)")
    paragraphs: str | None = helped(None, "strategyqa: the paragraphs file (null: the shipped one)")
    first_task: int = helped(0, "the suite's tasks from this position on (file order; usable records only)")
    tasks: int = helped(100, "tasks evaluated (fewer when the file has fewer)")
    seeds: int = helped(2, "rollout seeds per task (0 .. seeds-1)")
    questioner: Literal["scripted", "never_ask", "policy", "endpoint"] = helped(
        "scripted", "the arm: scripted heuristic (no model), never_ask, policy (model.path / preset through the "
                    "engine), endpoint (qd.questioner_endpoint)")
    questioner_endpoint: LLMUserConfig | None = None
    baseline: Literal["none", "scripted", "never_ask", "policy", "endpoint"] = helped(
        "none", "a second arm on the same tasks and seeds, compared with the first (paired, BCa); none: one arm")
    baseline_endpoint: LLMUserConfig | None = None
    baseline_model: str | None = helped(
        None, "baseline=policy: the baseline's HF checkpoint (e.g. the model before Q&D training; null: model.*, "
              "the treatment's own)")
    drafter: Literal["extractive", "endpoint"] = helped(
        "extractive", "extractive: the offline stand-in (no model, labelled in every report); endpoint: "
                      "qd.drafter_endpoint")
    drafter_endpoint: LLMUserConfig | None = None
    answerer: Literal["extractive", "endpoint"] = "extractive"
    answerer_endpoint: LLMUserConfig | None = None
    cap: int = helped(8, "retrieval calls per run (own stop)")
    max_turns: int = helped(16, "questioner decisions per run")
    retries: int = helped(
        2, "more tries of a failed questioner / drafter / answerer call before the run is marked failed")
    concurrency: int = helped(16, "runs played at once")
    depth_rule: Literal["longest", "shortest"] = "longest"
    equal_spend: Literal["symmetric", "asymmetric"] = helped(
        "symmetric", "equal spend: both arms read at the lower question count, or (asymmetric) the treatment at "
                     "its own end and the baseline at that count")
    frontier_caps: tuple[int, ...] = helped((4, 8, 12, 16, 24), "the budget frontier's caps (read as prefixes)")
    bootstrap: int = helped(10_000, "resamples of the printed BCa intervals")
    max_failed_share: float = helped(0.5, "stop (non-zero exit) when more runs than this share failed")
    temperature: float = helped(0.7, "questioner=policy: sampling temperature (0: greedy)")
    max_new_tokens: int = helped(400, "questioner=policy: tokens per decision")
    forks: int = helped(8, "job=qd_label: candidates per state (candidate 0 is the parent)")
    floor: float = helped(0.071213, "job=qd_label: the floor m (tau + 1.5 sigma_J sqrt 2) an ASK's gain must clear "
                                   "to be an SFT target, and a pair's margin")
    max_pairs: int = helped(12, "job=qd_label: ask_ask + recorded ask_stop pairs kept per state")
    max_len_delta: int = helped(40, "job=qd_label: largest question length difference (characters) of an ask_ask pair")
    tau2: QDTau2Section = _field(default_factory=QDTau2Section)

    def __post_init__(self) -> None:
        number_in("floor", self.floor, lo=0.0, what="a finite number >= 0")
        for f in ("tasks", "seeds", "concurrency", "bootstrap", "max_new_tokens", "forks", "max_pairs"):
            at_least(f, getattr(self, f), 1)
        for f in ("first_task", "cap", "max_turns", "retries", "max_len_delta"):
            at_least(f, getattr(self, f), 0)
        if not self.frontier_caps or any(c < 0 for c in self.frontier_caps):
            raise ValueError(f"frontier_caps={list(self.frontier_caps)}: expected non-negative integers")
        number_in("max_failed_share", self.max_failed_share, lo=0.0, hi=1.0, what="a number in [0, 1]")
        number_in("temperature", self.temperature, lo=0.0, what="a finite number >= 0 (0: greedy)")
        for role in ("questioner", "baseline", "drafter", "answerer"):
            if getattr(self, role) == "endpoint" and getattr(self, f"{role}_endpoint") is None:
                raise ValueError(f"{role}='endpoint': expected qd.{role}_endpoint (base_url, model, ...)")
        if self.tau2.selector == "endpoint" and self.tau2.selector_endpoint is None and self.drafter_endpoint is None:
            raise ValueError("tau2.selector='endpoint': expected qd.tau2.selector_endpoint or qd.drafter_endpoint (the "
                             "drafter's model selects by default)")
        if self.tau2.baseline == "endpoint" and self.drafter_endpoint is None:
            raise ValueError("tau2.baseline='endpoint': the plain agent is the drafter's model; expected "
                             "qd.drafter_endpoint (base_url, model, ...)")
        if self.benchmark == "synthetic" and self.file is None:
            raise ValueError("benchmark='synthetic': expected qd.file (python -m jaxagent.qd.synthetic OUT.json "
                             "writes one)")
        if self.baseline_model is not None and self.baseline != "policy":
            raise ValueError(f"baseline_model={self.baseline_model!r}: a checkpoint for baseline=policy (got baseline="
                             f"{self.baseline!r}); expected qd.baseline=policy or baseline_model=null")
        if self.baseline == self.questioner and self.baseline not in ("endpoint", "policy"):
            raise ValueError(f"baseline={self.baseline!r}: the same arm as qd.questioner; expected another arm or none")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    name: str = helped("quickstart", "runs/<name>/ holds everything the run writes")
    job: str = helped("sft+rl", "the job (see --help: sft, rl, sft+rl, eval, qd_eval, qd_label, dpo, qd_tau2, serve)")
    runs_dir: str = "runs"
    seed: int = 0
    steps: int = helped(32, "RL iterations")
    resume: bool = helped(False, "continue runs/<name>/ from its last complete checkpoint")
    resume_overrides: tuple[str, ...] = helped(
        (), "resume: dotted keys (or sections) allowed to differ from the run's config, e.g. [optim.lr,eval]; "
            "resume, resume_overrides, progress, log, runs_dir, name and steps always may")
    overwrite: bool = helped(False, "replace what runs/<name>/ holds (without it, a launch into an existing run is "
                                    "refused, or a default name gets the next free number: quickstart-2)")
    progress: bool = True
    log: LogSection = _field(default_factory=LogSection)
    # The quickstart's tiny model starts from random weights drawn wider than transformers' 0.02:
    # its attention is then sharp enough from the start for the copy the demonstrations need to
    # form within the SFT budget (docs/BENCHMARKS.md, the quickstart section).
    model: ModelSection = _field(default_factory=lambda: ModelSection(initializer_range=0.05))
    tokenizer: str = helped(BUILTIN_TOKENIZER, "a tokenizer directory, a Hub id org/name[@revision], or builtin:gyms")
    mesh: MeshConfig = _field(default_factory=MeshConfig)
    # The quickstart's RL phase is the one scripts/bench_rl_learns.py measured to improve the SFT
    # policy over an lr = 0 control (docs/RESULTS.md, "RL that learns"): RL tasks drawn from 4096
    # (SFT imitates the first sft.demos = 512, on which the warm start has nothing left to learn),
    # episodes limited as the demonstrations are, 8 tasks x 8 episodes in two updates, GRPO's
    # positive part at Adam lr 3e-4 without warmup, evaluation on all 64 held-out tasks.
    env: EnvSection = _field(default_factory=lambda: EnvSection(train_tasks=4096))
    # The quickstart's tiny model learns the tool-call format from demonstrations: no JSON schemas
    # in its prompts (configs for real models set rollout.tool_schemas_in_prompt: true).
    rollout: RolloutSection = _field(
        default_factory=lambda: RolloutSection(tool_schemas_in_prompt=False, max_turns=6, max_tokens=512))
    rl: RLSettings = _field(default_factory=lambda: RLSettings(credit="grpo", group_size=8, tasks_per_step=8,
                                                               minibatch_size=32, microbatches=2))
    ppo: PPOConfig = _field(default_factory=lambda: PPOConfig(kl_coef=1e-3, entropy_coef=1e-3))
    infopo: InfoPOConfig = _field(default_factory=InfoPOConfig)
    faca: FacaConfig = _field(default_factory=FacaConfig)
    grpo: GRPOConfig = _field(default_factory=lambda: GRPOConfig(negative_weight=0.0))
    optim: OptimSettings = _field(default_factory=lambda: OptimSettings(lr=3e-4, warmup_steps=0, clip_norm=1.0))
    sft: SFTSection = _field(default_factory=SFTSection)
    dpo: DPOSection = _field(default_factory=DPOSection)
    eval: EvalSection = _field(default_factory=lambda: EvalSection(tasks=64, every=0))
    checkpoint: CheckpointSection = _field(default_factory=CheckpointSection)
    qd: QDSection = _field(default_factory=QDSection)
    serve: ServeSection = _field(default_factory=ServeSection)

    def __post_init__(self) -> None:
        if self.job not in job_names():
            raise ValueError(f"job: {self.job!r} is not one of {', '.join(map(repr, job_names()))} (the registered "
                             "jobs, jaxagent.jobs.registry)")
        if self.steps < 0:
            raise ValueError(f"steps={self.steps}: expected >= 0")
        if self.job in ("rl", "sft+rl") and self.rl.group_size < 2:
            raise ValueError(f"rl.group_size={self.rl.group_size}: rl.credit={self.rl.credit!r} normalises each "
                             "episode's outcome within its group (GRPO), so a group of one gets no advantage; "
                             "expected an integer >= 2")
        if self.job in ("rl", "sft+rl"):  # RL trains the sampler's distribution: refuse what it cannot score
            from jaxagent.models.generate import SamplingParams
            from jaxagent.train.rl import sampler_view

            r = self.rollout
            sampler_view(SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k), 1, 1)
        top = env_max_reward(self.env)
        spec = self.env.spec
        if not 0.0 <= self.rl.success_threshold <= top:
            raise ValueError(f"rl.success_threshold={self.rl.success_threshold}: expected a number in [0, {top}] "
                             f"(the most reward an episode of env.kind={self.env.kind!r} can get)")
        if self.resume and self.overwrite:
            raise ValueError("overwrite=true: resume=true continues the run that overwrite=true would replace; "
                             "expected one of them")
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ValueError(f"name={self.name!r}: expected a directory name (no '/')")
        from jaxagent.jobs.resume import check_overrides_known

        check_overrides_known(RunConfig, self.resume_overrides)
        if spec.demonstrations is None and self.job in ("sft", "sft+rl") and self.sft.data is None:
            raise ValueError(f"job={self.job!r}: SFT trains on an environment's demonstrations, and env.kind="
                             f"{self.env.kind!r} offers none; use job rl or eval (or sft.data with job=sft)")
        if self.eval.agent != "policy" and (self.job != "eval" or self.eval.agent not in spec.host_agents):
            offered = ", ".join(spec.host_agents) or "none"
            raise ValueError(f"eval.agent={self.eval.agent!r}: host agents play job=eval on the environments that "
                             f"offer them (env.kind={self.env.kind!r} offers: {offered}; got job={self.job!r}); "
                             "expected eval.agent='policy'")
        if spec.needs_text_tokenizer and self.eval.agent == "policy" and self.tokenizer == BUILTIN_TOKENIZER \
                and self.job != "qd_tau2":  # job=qd_tau2 needs a tokenizer only for qd.questioner=policy (below)
            raise ValueError(f"tokenizer='builtin:gyms': the gyms' closed vocabulary cannot spell the text of env.kind="
                             f"{self.env.kind!r}; expected a tokenizer directory (e.g. the checkpoint's, as "
                             "model.path)")
        check_timeout(self)
        check_credit(self)
        if self.job == "dpo" and self.dpo.data is None:
            raise ValueError("dpo.data=None: job=dpo trains on preference pairs; expected a pairs file (job=qd_label's "
                             "pairs.jsonl)")
        if self.sft.data is not None and self.job != "sft":
            raise ValueError(f"sft.data={self.sft.data!r}: rows train in job=sft (got job={self.job!r}); expected "
                             "job=sft, or sft.data=null")
        if self.job == "serve" and self.serve.run is not None and self.model.path is not None:
            raise ValueError(f"serve.run={self.serve.run!r}: the run's final policy is served; expected model.path=null "
                             f"(got {self.model.path!r})")
        if self.serve.adapter is not None and (self.job != "serve" or self.model.path is None):
            raise ValueError(f"serve.adapter={self.serve.adapter!r}: an adapter is applied to model.path in job=serve; "
                             "expected job=serve and model.path set (the adapter's base)")
        if self.job == "qd_tau2" and tau2_domain(self.env) is None:
            raise ValueError(f"job='qd_tau2': the Q&D loop inside a tau2 agent; expected env.kind='tau2' (with "
                             f"env.tau2.domain) or 'tau2_retail' (got env.kind={self.env.kind!r})")
        if self.job == "qd_tau2":
            from jaxagent.qd.tau2 import QD_DOMAINS
            if self.env.tau2.domain not in QD_DOMAINS:
                raise ValueError(f"env.tau2.domain={self.env.tau2.domain!r}: job=qd_tau2 has Q&D plug-ins for tau2 "
                                 f"domains {', '.join(map(repr, QD_DOMAINS))} (jaxagent.qd.tau2.QD_DOMAINS); "
                                 "expected one of them")
        if self.job == "qd_tau2" and self.qd.baseline not in ("none",):
            raise ValueError(f"qd.baseline={self.qd.baseline!r}: job=qd_tau2's second arm is qd.tau2.baseline; "
                             "expected qd.baseline=none")
        if self.job in ("qd_eval", "qd_label", "qd_tau2") and "policy" in (self.qd.questioner, self.qd.baseline) \
                and self.tokenizer == BUILTIN_TOKENIZER:
            raise ValueError("tokenizer='builtin:gyms': the gyms' closed vocabulary cannot spell retrieval QA text; "
                             "expected a tokenizer directory for qd.questioner=policy (e.g. the checkpoint's)")


def env_max_reward(env: EnvSection) -> float:
    """The most outcome reward one episode of ``env`` can get (`EnvSpec.max_reward`): 1.0 in every
    gym (``MAX_REWARD``), on tau2 (a pass) and for an LLM user (its scorer's range is [0, 1] by contract)."""
    return env.spec.top_reward(env_settings(env))


def env_context(cfg: RunConfig) -> EnvContext:
    """The `EnvContext` ``env.kind``'s spec is built from: its settings (`env_settings`), the task
    counts and seed, and the rollout limits a simulator needs (an LLM user's reply count is
    ``rollout.max_turns``; a reply longer than 8 x ``rollout.max_reply_tokens`` characters is cut
    before it goes back to the simulator)."""
    e, r = cfg.env, cfg.rollout
    return EnvContext(settings=env_settings(e), train_tasks=e.train_tasks, test_tasks=e.test_tasks,
                      task_seed=e.task_seed, max_turns=r.max_turns, max_reply_chars=8 * r.max_reply_tokens or None)


def default_name(cfg: RunConfig) -> str:
    """The run name when none is given: ``quickstart`` for the default job and environment
    (sft+rl on the intention gym), else ``<job>-<label>`` with the environment's label (the gym's
    name, else the family's: e.g. ``eval-tau2_retail``), so runs of other jobs do not land in the
    quickstart's directory."""
    env = cfg.env.spec.run_label(env_settings(cfg.env))
    if cfg.job in ("qd_eval", "qd_label"):
        return f"{cfg.job}-{cfg.qd.benchmark}"
    if cfg.job == "qd_tau2":
        return f"qd_tau2-{cfg.env.tau2.domain}"
    if cfg.job == "serve":
        return "serve"
    if (cfg.job, cfg.env.kind, cfg.env.gym) == ("sft+rl", "gym", "intention"):
        return "quickstart"
    return f"{cfg.job}-{env}"


def load_config(path: str | Path | None = None, overrides=(), *, fresh_name: bool = False) -> RunConfig:
    """The quickstart defaults (``RunConfig()``, whose sections may differ from their classes'
    defaults), then the YAML file, then ``key=value`` overrides. Without a ``name`` in the file
    or the overrides, the name is `default_name`; with ``fresh_name`` (the launcher) and neither
    ``resume`` nor ``overwrite``, the first of it, ``<it>-2``, ... that holds no run under ``runs_dir``
    (`jaxagent.jobs.resume.free_run_name`), so that a rerun never lands in an earlier run."""
    overrides = list(overrides)
    data = configlib.read_yaml(path) if path is not None else {}  # read once: also tells whether it names the run
    cfg = configlib.load(RunConfig, None, overrides, base=configlib.deep_merge(configlib.to_dict(RunConfig()), data))
    if "name" in data or any(o.partition("=")[0].strip() == "name" for o in overrides):
        return cfg
    name = default_name(cfg)
    if fresh_name and not (cfg.resume or cfg.overwrite):
        from jaxagent.jobs.resume import free_run_name

        if (fresh := free_run_name(cfg.runs_dir, name)) != name:  # said even with progress=false
            print(f"[launch] {Path(cfg.runs_dir) / name} holds an earlier run; this one writes "
                  f"{Path(cfg.runs_dir) / fresh} (name= picks the directory, overwrite=true replaces a run, "
                  "resume=true continues it)", file=sys.stderr, flush=True)
        name = fresh
    return dataclasses.replace(cfg, name=name)


__all__ = ["DEFAULT_TIMEOUT_S", "QUESTIONERS", "TIMEOUT_MARGIN_S", "QDSection", "QDTau2Section", "RunConfig",
           "ServeSection", "check_timeout", "default_name", "env_context", "env_max_reward", "episode_timeout_s",
           "load_config", "simulator_budget_s", "simulator_clients"]

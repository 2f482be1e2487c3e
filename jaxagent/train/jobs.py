"""The jobs behind ``python -m jaxagent.launch``: build everything from a `RunConfig` and run it.

Host orchestration only; the math lives in `jaxagent.train.step`, `jaxagent.train.rl` and
`jaxagent.credit`. A run writes to ``runs/<name>/``:

- ``config.yaml``: the resolved configuration (of the first launch; each resume adds
  ``config.resume-<n>.yaml``: `jaxagent.train.resume`, which also refuses a resume with a changed
  config unless ``resume_overrides`` names the keys, and a launch into another job's run);
- ``metrics.jsonl``: one JSON object per SFT log step, RL iteration and evaluation
  (``{"phase": "sft" | "rl" | "eval", "step": ..., ...}``), appended and flushed as it goes; a
  resume cuts it back to the restored checkpoint first and adds a ``{"phase": "resume", ...}``
  record (the checkpoint it restored, damaged ones it moved aside); a run stopped by
  `TrainingFailed` or `SimulatorFailureBudget` adds a ``{"phase": "failure", ...}`` record;
- ``trajectories/iter_<i>.jsonl``: a sample of each RL iteration's episodes (re-scorable);
- ``checkpoints/{sft,rl}/``: orbax checkpoints (see `jaxagent.train.checkpoint`);
- ``hf/``: the final policy as a Hugging Face checkpoint (with the tokenizer's files);
- ``tb/``: TensorBoard scalars, written as the run goes;
- ``plots/``: reward and success, turns and response length, info gain by turn index (heatmap),
  SFT loss (`jaxagent.train.report`);
- ``summary.json``: ``success_before``, ``success_after``, ``wall_seconds``, ``steps``, ``credit``,
  the InfoPO diagnostics, ...

Determinism: every random draw of step i (SFT batch, RL tasks, sampling keys) derives from
``(seed, phase, i)``, so a resumed run replays exactly what the uninterrupted run would have done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxagent import configlib
from jaxagent.config import BUILTIN_TOKENIZER, RunConfig
from jaxagent.envs.base import Environment
from jaxagent.models import DTypePolicy, LogicalRules, QwenConfig, make_mesh, preset, save_pretrained
from jaxagent.models.generate import SamplingParams
from jaxagent.models.hf import load_pretrained
from jaxagent.models.sharding import batch_sharding, init_params_sharded
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.loop import EpisodeConfig
from jaxagent.text.tokenizer import Tokenizer, load_tokenizer
from jaxagent.train.rl import FailureBudget, RLTrainer, SimulatorFailureBudget, failure_causes
from jaxagent.train.step import (OptimSettings, TrainingFailed, TrainState, check_skipped_share, learning_rate,
                                 make_optimizer, make_update, sft_loss_fn)

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
        return QwenConfig.from_hf_dict(hf, dtype=dtype, remat=m.remat)
    overrides = {f: getattr(m, f) for f in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                            "num_attention_heads", "num_key_value_heads", "head_dim",
                                            "initializer_range")
                 if getattr(m, f) is not None}
    return preset(m.preset, vocab_size=-(-vocab_size // 64) * 64, dtype=dtype, remat=m.remat,
                  max_position_embeddings=max(cfg.rollout.capacity, 2048), **overrides)


def build_model(cfg: RunConfig, tok: Tokenizer, rules: LogicalRules) -> tuple[QwenConfig, Any]:
    m = cfg.model
    if m.path is not None:
        if (Path(m.path) / "config.json").is_file():  # else load_pretrained names what is missing
            check_vocab(cfg, tok, model_config(cfg, tok.vocab_size))
        return load_pretrained(m.path, dtype=DTypePolicy(m.param_dtype, m.dtype), rules=rules, remat=m.remat)
    qcfg = model_config(cfg, tok.vocab_size)
    return qcfg, init_params_sharded(jax.random.key(m.init_seed), qcfg, rules)


def check_vocab(cfg: RunConfig, tok: Tokenizer, qcfg: QwenConfig) -> None:
    """The tokenizer's ids all index the model's embedding (a larger tokenizer would feed ids past
    the table: on accelerators a silent clamp, not an error)."""
    if tok.vocab_size > qcfg.vocab_size:
        raise configlib.ConfigError(
            f"tokenizer={cfg.tokenizer!r}: its ids reach {tok.vocab_size - 1}, past the vocabulary of "
            f"model.path={cfg.model.path!r} (vocab_size={qcfg.vocab_size}); expected the checkpoint's own tokenizer "
            f"or one of at most {qcfg.vocab_size} ids")


def build_env(cfg: RunConfig) -> tuple[Callable[[], Environment], list[str], list[str]]:
    """(environment factory, train task ids, test task ids)."""
    e = cfg.env
    if e.kind == "tau2_retail":
        from jaxagent.envs.tau2_retail.harness import EnvFactory

        factory = EnvFactory(e.tau2)
        factory.record = False  # run_eval records its own episodes
        ids = factory.task_ids
        return factory, ids[: e.train_tasks], ids[: e.test_tasks]
    if e.kind == "gym":
        from jaxagent.envs.gyms import GYMS

        spec = GYMS[e.gym]
        return (lambda: spec.env(max_steps=e.max_steps, outcome=e.outcome),
                spec.make_tasks("train", e.train_tasks, e.task_seed),
                spec.make_tasks("test", e.test_tasks, e.task_seed))
    from jaxagent.envs.llm_user import LLMUserClient
    from jaxagent.envs.user_env import LLMUserEnv

    path = Path(e.user_tasks)
    try:
        tasks = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise configlib.ConfigError(f"env.user_tasks={str(path)!r}: expected a readable JSON file of "
                                    f"{{task_id: {{profile, opening}}}} ({err})") from None
    ids = sorted(tasks)
    n_test = min(e.test_tasks, max(1, len(ids) // 5))
    client = LLMUserClient(e.llm_user)
    chars = 8 * cfg.rollout.max_reply_tokens or None  # a runaway reply is not sent back to the simulator
    make = lambda: LLMUserEnv(client, tasks, max_user_turns=cfg.rollout.max_turns, max_reply_chars=chars)  # noqa: E731
    return make, ids[n_test:][: e.train_tasks], ids[:n_test]


def sampling_params(cfg: RunConfig, tok: Tokenizer, *, temperature: float | None = None) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature if temperature is None else temperature, top_p=r.top_p,
                          top_k=r.top_k, max_new_tokens=r.max_new_tokens, stop_tokens=tuple(tok.eos_token_ids))


def episode_config(cfg: RunConfig) -> EpisodeConfig:
    r = cfg.rollout
    from jaxagent.config import episode_timeout_s

    return EpisodeConfig(max_turns=r.max_turns, max_tokens=r.max_tokens, retries=r.retries,
                         timeout_s=episode_timeout_s(cfg), tool_schemas_in_prompt=r.tool_schemas_in_prompt,
                         max_reply_tokens=r.max_reply_tokens)


def param_count(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def step_key(seed: int, phase: str, i: int) -> jax.Array:
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), {"sft": 1, "rl": 2, "eval": 3}[phase]), i)


def step_rng(seed: int, phase: str, i: int) -> np.random.Generator:
    return np.random.default_rng([seed, {"sft": 1, "rl": 2, "eval": 3}[phase], i])


# ----------------------------------------------------------------------------- run directory
class RunLog:
    """``runs/<name>/``: metrics.jsonl (appended, flushed), live TensorBoard scalars and progress.

    Progress (``progress=True``): on a terminal, one tqdm bar per phase (`start`) whose postfix holds
    the live figures each `log` call names in ``show``; elsewhere (CI logs, pipes) one line per
    logged step, so logs stay readable without carriage returns."""

    def __init__(self, run_dir: Path, progress: bool = True, *, tty: bool | None = None):
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._bars: dict[str, Any] = {}
        self._metrics = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")
        from jaxagent.train.report import TensorBoardWriter

        self._tb = TensorBoardWriter(self.dir / "tb")  # live scalars: tensorboard --logdir runs/

    def start(self, phase: str, total: int, initial: int = 0, desc: str | None = None) -> None:
        """Opens ``phase``'s progress bar (``total`` steps, ``initial`` already done), on a terminal."""
        if self.progress and self.tty and total > 0:
            from tqdm.auto import tqdm

            self._bars[phase] = tqdm(total=total, initial=initial, desc=desc or phase, file=sys.stderr,
                                     dynamic_ncols=True, leave=True)

    def end(self, phase: str) -> None:
        bar = self._bars.pop(phase, None)
        if bar is not None:
            bar.close()

    def log(self, phase: str, step: int, metrics: dict[str, Any], show: tuple[str, ...] = ()) -> None:
        rec = {"phase": phase, "step": step, "time": time.time(), **metrics}
        self._metrics.write(json.dumps(rec, default=_json_default) + "\n")
        self._metrics.flush()
        self._tb.scalars(step, metrics, phase)
        if not self.progress:
            return
        figures = {_short(k): _fmt(metrics[k]) for k in show if k in metrics}
        bar = self._bars.get(phase)
        if bar is not None:
            bar.set_postfix(figures, refresh=False)
            bar.update(max(0, step + 1 - bar.n))
        elif phase in self._bars or not self._bars:
            print(f"[{phase} {step}] " + " ".join(f"{k}={v}" for k, v in figures.items()), file=sys.stderr, flush=True)
        else:  # another phase's bar is open (an evaluation during RL): write above it
            from tqdm.auto import tqdm

            tqdm.write(f"[{phase} {step}] " + " ".join(f"{k}={v}" for k, v in figures.items()), file=sys.stderr)

    def event(self, phase: str, step: int, record: dict[str, Any]) -> None:
        """Appends a record to metrics.jsonl only (no TensorBoard scalar, no progress line): what
        happened to the run (``phase="resume"``: a resume, the checkpoints it found damaged)."""
        rec = {"phase": phase, "step": step, "time": time.time(), **record}
        self._metrics.write(json.dumps(rec, default=_json_default) + "\n")
        self._metrics.flush()

    def truncate(self, drop: Callable[[dict[str, Any]], bool]) -> int:
        """Rewrites metrics.jsonl without the records ``drop`` selects (and a record cut short by a
        crash), atomically (`jaxagent.train.resume.truncate_metrics`); returns how many went."""
        from jaxagent.train.resume import truncate_metrics

        self._metrics.close()
        try:
            return truncate_metrics(self.dir / "metrics.jsonl", drop)
        finally:
            self._metrics = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")

    def read(self) -> list[dict[str, Any]]:
        """The records so far (`report.read_metrics`: a record cut short by a crash is skipped)."""
        from jaxagent.train.report import read_metrics

        path = self.dir / "metrics.jsonl"
        return read_metrics(path) if path.exists() else []

    def close(self) -> None:
        for phase in list(self._bars):
            self.end(phase)
        self._metrics.close()
        self._tb.close()


def _json_default(x):
    if isinstance(x, (np.generic, jax.Array)):
        return np.asarray(x).tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _short(key: str) -> str:
    """A metric's name on the progress line: its last part (``update/kl_ref`` -> ``kl_ref``), but
    ``sampled/success`` -> ``sampled_success`` (beside the greedy ``success``)."""
    head, _, last = key.rpartition("/")
    return f"sampled_{last}" if head == "sampled" else last


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# ----------------------------------------------------------------------------- SFT
def sft_data(cfg: RunConfig, tok: Tokenizer, make_env=None) -> list[tuple[list[int], list[bool]]]:
    """Rendered demonstrations: the gym's expert (with noise), or on tau2 retail the gold-action
    oracle's episodes on the selected tasks (one each, at most ``sft.demos``)."""
    from jaxagent.envs.gyms.demos import expert_demos, render_demo

    if cfg.env.kind == "tau2_retail":
        from jaxagent.envs.tau2_retail.agents import oracle_demos

        demos = oracle_demos(make_env, make_env.task_ids[: min(cfg.env.train_tasks, cfg.sft.demos)])
    else:
        demos = expert_demos(cfg.env.gym, "train", cfg.sft.demos, seed=cfg.env.task_seed, noise=cfg.sft.noise,
                             policy=cfg.sft.demo_policy)
    rendered = [render_demo(d, tok, tool_schemas_in_prompt=cfg.rollout.tool_schemas_in_prompt) for d in demos]
    kept = [(ids, mask) for ids, mask in rendered if len(ids) <= cfg.rollout.capacity]
    if not kept:
        raise ValueError(f"rollout.capacity={cfg.rollout.capacity}: shorter than every demonstration")
    return kept


def sft_optim(cfg: RunConfig) -> OptimSettings:
    """The SFT phase's optimizer: ``optim`` with the ``sft`` section's learning rate, warmup and
    schedule (cosine: decays over the SFT steps after the warmup)."""
    s = cfg.sft
    optim = cfg.optim if s.lr is None else dataclasses.replace(cfg.optim, lr=s.lr)
    if s.warmup_steps is not None:
        optim = dataclasses.replace(optim, warmup_steps=s.warmup_steps)
    if s.schedule == "cosine":
        return dataclasses.replace(optim, schedule="cosine", decay_steps=max(1, s.steps - optim.warmup_steps),
                                   final_lr_fraction=s.final_lr_fraction)
    return dataclasses.replace(optim, schedule="constant")


def sft_batch(data, idx: np.ndarray, multiple: int = 64) -> dict[str, np.ndarray]:
    L = -(-max(len(data[i][0]) for i in idx) // multiple) * multiple
    tokens = np.zeros((len(idx), L), np.int32)
    mask = np.zeros((len(idx), L), np.float32)
    for r, i in enumerate(idx):
        ids, m = data[i]
        tokens[r, : len(ids)] = ids
        mask[r, : len(m)] = m
    return {"tokens": tokens, "loss_mask": mask}


# ----------------------------------------------------------------------------- the run
@dataclasses.dataclass
class Run:
    cfg: RunConfig
    run_dir: Path
    tok: Tokenizer
    qcfg: QwenConfig
    params: Any
    rules: LogicalRules
    make_env: Callable[[], Environment]
    train_tasks: list[str]
    test_tasks: list[str]
    engine: GenerationEngine
    log: RunLog


def prepare(cfg: RunConfig) -> Run:
    from jaxagent.train.resume import check_run_dir, record_config

    run_dir = Path(cfg.runs_dir) / cfg.name
    check_run_dir(cfg, run_dir)  # another job's results; resume=true with nothing; a changed config
    if run_dir.exists() and not cfg.resume and any((run_dir / "checkpoints").glob("*/*")):
        raise FileExistsError(f"{run_dir}: a run with checkpoints exists; set resume=true to continue it or pick "
                              "another name=")
    mesh = make_mesh(cfg.mesh)
    rules = LogicalRules(mesh)
    tok = build_tokenizer(cfg)
    qcfg, params = build_model(cfg, tok, rules)
    make_env, train_tasks, test_tasks = build_env(cfg)
    r = cfg.rollout
    park = r.park_rows if r.park_rows >= 0 else cfg.rl.group_size * cfg.rl.tasks_per_step
    engine = GenerationEngine(params, qcfg, slots=r.slots, capacity=r.capacity, park_rows=park,
                              decode_steps=r.decode_steps, vocab_limit=tok.vocab_size)
    log = RunLog(run_dir, cfg.progress)
    record_config(cfg, run_dir)  # config.yaml, or on a resume config.resume-<n>.yaml
    return Run(cfg, run_dir, tok, qcfg, params, rules, make_env, train_tasks, test_tasks, engine, log)


def run_eval(run: Run, params, label: str, step: int, *, sampled: bool = True) -> dict[str, Any]:
    """Evaluates ``params`` on the held-out tasks (greedy, and with ``sampled`` also
    ``eval.sampled_k`` runs per task at the training temperature) and logs the record."""
    from jaxagent.train.evaluate import evaluate

    cfg = run.cfg
    tasks = run.test_tasks[: cfg.eval.tasks]
    t0 = time.perf_counter()
    recorder = getattr(run.make_env, "drain", None)  # tau2 retail: per-episode reports
    if recorder is not None:
        run.make_env.record = True
    try:
        m, trajs = evaluate(params, run.engine, run.make_env, run.tok, tasks, k=cfg.eval.k,
                        sampling=sampling_params(cfg, run.tok, temperature=cfg.eval.temperature),
                        key=step_key(cfg.seed, "eval", step), episode=episode_config(cfg),
                        success_threshold=cfg.rl.success_threshold)
    finally:
        if recorder is not None:
            run.make_env.record = False
    if recorder is not None:
        from jaxagent.envs.tau2_retail.harness import per_task, summarize, write_reports

        reports = recorder()
        if len(reports) == len(trajs):  # both in episode-creation order (task-major, then the k runs)
            for r, t in zip(reports, trajs):
                r["rollout_termination"] = t.termination  # e.g. max_turns, simulator_failure
        write_reports(run.run_dir / f"episodes_{label}_{step}.jsonl", reports)
        write_reports(run.run_dir / f"tasks_{label}_{step}.jsonl", per_task(reports))
        t2 = summarize(reports, scoring_mode=cfg.env.tau2.scoring, k=cfg.eval.k)
        m.update({f"tau2/{k}": v for k, v in t2.items() if k in ("db", "communicate", "pass_at_k", "scoring_mode")})
    if sampled and cfg.eval.sampled_k and cfg.eval.agent == "policy" and cfg.env.kind != "tau2_retail":
        # the distribution RL trains (rollout.temperature), beside the greedy figure: what RL fixes first
        ms, strajs = evaluate(params, run.engine, run.make_env, run.tok, tasks, k=cfg.eval.sampled_k,
                              sampling=sampling_params(cfg, run.tok),
                              key=jax.random.fold_in(step_key(cfg.seed, "eval", step), 1), episode=episode_config(cfg),
                              success_threshold=cfg.rl.success_threshold)
        m.update({f"sampled/{k}": ms[k] for k in ("success", "reward", "turns", "success_at_k_any", "k",
                                                   "success_by_task", "reward_by_task", "simulator_failures")})
        m["sampled/temperature"] = cfg.rollout.temperature
        trajs = trajs + strajs
    m["wall_s"] = time.perf_counter() - t0
    run.log.log("eval", step, dict(m, label=label), show=("success", "sampled/success", "reward", "turns",
                                                          "sim/failed_episodes", "label"))
    try:
        _check_eval_failures(trajs, label, step)
    except SimulatorFailureBudget as e:
        run.log.event("failure", step, {"of": "eval", "reason": str(e)})
        raise
    return m


def _check_eval_failures(trajs, label: str, step: int) -> None:
    """An evaluation whose every episode ended in ``simulator_failure`` measured nothing: before
    training (``label="before"``, also job=eval's only one) the run stops (`SimulatorFailureBudget`);
    later ones (during, after) say so on stderr and the run goes on (its checkpoints are kept)."""
    if not trajs or any(t.termination != "simulator_failure" for t in trajs):
        return
    msg = (f"eval {label} (step {step}): all {len(trajs)} episodes ended in simulator_failure; "
           f"{failure_causes(trajs)}")
    if label == "before":
        raise SimulatorFailureBudget(msg + "; stopping before any training")
    print(f"WARNING: {msg}", file=sys.stderr, flush=True)


def run_sft(run: Run, params):
    from jaxagent.train.checkpoint import Checkpointer

    cfg = run.cfg
    s = cfg.sft
    optim = sft_optim(cfg)
    tx = make_optimizer(optim)
    state = _on_mesh(TrainState.create(params, tx), run.rules)
    update = _keep_shardings(make_update(sft_loss_fn(run.qcfg), tx, lr_schedule=learning_rate(optim)), state)
    ckpt = Checkpointer(run.run_dir / "checkpoints" / "sft", keep=cfg.checkpoint.keep,
                        async_save=cfg.checkpoint.async_save)
    restored, start = _resume(run, ckpt, "sft", _abstract(state), "next_step", s.steps, "sft.steps")
    state = state if restored is None else restored
    data = sft_data(run.cfg, run.tok, run.make_env) if start < s.steps else []
    run.log.start("sft", s.steps, start, desc="sft")
    for i in range(start, s.steps):
        idx = step_rng(cfg.seed, "sft", i).choice(len(data), size=min(s.batch_size, len(data)), replace=False)
        batch = {k: jax.device_put(v, batch_sharding(run.rules, shape=v.shape)) for k, v in sft_batch(data, idx).items()}
        state, m = update(state, batch)
        if i % 10 == 0 or i == s.steps - 1:
            run.log.log("sft", i, {k: float(v) for k, v in jax.device_get(m).items()}, show=("loss", "nll", "grad_norm"))
            _check_skipped(run, ckpt, "sft", state, s.max_skipped_share, "sft.max_skipped_share",
                           final=i == s.steps - 1)
        if cfg.checkpoint.every and (i + 1) % cfg.checkpoint.every == 0 and i + 1 < s.steps:
            ckpt.save(i + 1, state, {"next_step": i + 1})
    run.log.end("sft")
    if s.steps and start < s.steps:
        ckpt.save(s.steps, state, {"next_step": s.steps}, force=True)
    ckpt.wait()
    ckpt.close()
    return state.params


def _on_mesh(tree, rules: LogicalRules):
    """``tree`` with every leaf not yet on the mesh (optax's counters, the step counters: scalars
    on one device, uncommitted) replicated over it, as the jitted update returns them. A state
    restored into these shardings then matches the live one: its arrays sit on the same devices
    (a counter committed to device 0 next to parameters on all of them is an error) and the
    update compiles once, for the state it is given from the first step on."""
    replicated = NamedSharding(rules.mesh, PartitionSpec())
    return jax.tree.map(lambda x: x if isinstance(getattr(x, "sharding", None), NamedSharding)
                        else jax.device_put(x, replicated), tree)


def _keep_shardings(update, state):
    """``update`` whose returned state is put back on ``state``'s shardings. XLA may lay an
    output out otherwise than its input (after one update the norm weights come back sharded
    over fsdp), while a state restored from a checkpoint gets the shardings of a fresh one: kept
    fixed, every update of a run, resumed or not, runs the same compiled program, compiled once
    per batch shape."""
    shardings = jax.tree.map(lambda x: x.sharding, state)

    def update_kept(state, batch):
        state, metrics = update(state, batch)
        return jax.device_put(state, shardings), metrics

    return update_kept


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _resume(run: Run, ckpt, phase: str, target, next_key: str, total: int, total_key: str) -> tuple[Any, int]:
    """With ``resume=true``: (the restored state or None, the step to continue from).

    Restores the newest checkpoint of ``phase`` that restores (`Checkpointer.restore_newest`:
    newer damaged steps are moved aside, each named on stderr and in the ``resume`` record),
    then truncates metrics.jsonl back to it (what the resumed phase logs again goes: no
    duplicate records) and appends a ``{"phase": "resume", "of": phase, ...}`` record."""
    from jaxagent.train.resume import after_checkpoint, check_not_shortened

    if not run.cfg.resume:
        return None, 0
    state, start, from_step = None, 0, None
    damaged = list(ckpt.damaged_on_open)
    if ckpt.latest_step() is not None or damaged:  # all damaged on open: CheckpointDamaged
        restored = ckpt.restore_newest(target)
        state, start, from_step = restored.state, int(restored.meta[next_key]), restored.step
        damaged += restored.damaged
    for d in damaged:
        print(f"WARNING: {phase} checkpoint step {d.step} in {ckpt.directory} is damaged ({d.reason}); moved it to "
              f"{d.moved_to.name}, resuming from {'step ' + str(from_step) if from_step is not None else 'the start'}",
              file=sys.stderr, flush=True)
    check_not_shortened(run.cfg, phase, start, total, total_key)
    dropped = run.log.truncate(after_checkpoint(phase, start))
    run.log.event("resume", start, {"of": phase, "checkpoint": from_step, "dropped_records": dropped,
                                    "damaged": [d.to_dict() for d in damaged]})
    if run.cfg.progress:
        print(f"[resume] {phase} from {'checkpoint step ' + str(from_step) if from_step is not None else 'the start'}"
              f" ({dropped} metrics records after it dropped)", file=sys.stderr, flush=True)
    return state, start


def _check_skipped(run: Run, ckpt, phase: str, state: TrainState, limit: float, key: str, *, final: bool) -> None:
    """`check_skipped_share` on ``state``'s counters; on failure the ``failure`` record is logged and
    the checkpointer closed (its last complete checkpoint stays) before `TrainingFailed` goes up."""
    applied, skipped = (int(x) for x in jax.device_get((state.step, state.skipped)))
    try:
        check_skipped_share(applied, skipped, limit, phase=phase, key=key, final=final)
    except TrainingFailed as e:
        run.log.event("failure", applied + skipped, {"of": phase, "reason": str(e)})
        run.log.end(phase)
        ckpt.close()
        raise


def run_rl(run: Run, params) -> tuple[Any, int]:
    from jaxagent.train.checkpoint import Checkpointer

    cfg = run.cfg
    tx = make_optimizer(cfg.optim)
    state = _on_mesh(TrainState.create(params, tx), run.rules)
    trainer = RLTrainer(state, tx, config=run.qcfg, tokenizer=run.tok, make_env=run.make_env, settings=cfg.rl,
                        ppo=cfg.ppo, sampling=sampling_params(cfg, run.tok), episode=episode_config(cfg),
                        engine=run.engine, infopo=cfg.infopo, faca=cfg.faca, grpo=cfg.grpo,
                        lr_schedule=learning_rate(cfg.optim))
    trainer.update = _keep_shardings(trainer.update, trainer.state)
    ckpt = Checkpointer(run.run_dir / "checkpoints" / "rl", keep=cfg.checkpoint.keep,
                        best_metric=cfg.checkpoint.best_metric, async_save=cfg.checkpoint.async_save)
    restored, start = _resume(run, ckpt, "rl", _abstract({"state": trainer.state, "ref": trainer.ref_params}),
                              "next_iter", cfg.steps, "steps")
    if restored is not None:
        trainer.state, trainer.ref_params = restored["state"], restored["ref"]
    traj_dir = run.run_dir / "trajectories"
    traj_dir.mkdir(exist_ok=True)
    last_eval: dict[str, Any] = {}
    if start:  # the evaluation the uninterrupted run would hold here (the checkpoints' best metric)
        from jaxagent.train.report import read_metrics

        during = [r for r in read_metrics(run.run_dir / "metrics.jsonl")
                  if r.get("phase") == "eval" and r.get("label") == "during" and r.get("step", 0) <= start]
        last_eval = sorted(during, key=lambda r: r["step"])[-1] if during else {}
    budget = FailureBudget.from_settings(cfg.rl)
    run.log.start("rl", cfg.steps, start, desc=f"rl ({cfg.rl.credit})")
    for i in range(start, cfg.steps):
        rng = step_rng(cfg.seed, "rl", i)
        tasks = [run.train_tasks[j] for j in rng.choice(len(run.train_tasks), cfg.rl.tasks_per_step, replace=False)]
        metrics, trajs = trainer.iteration(tasks, step_key(cfg.seed, "rl", i))
        run.log.log("rl", i, metrics, show=("success", "reward", "turns", "info/gain_mean", "info/gate_mean",
                                             "update/kl_ref", "sim/failed_episodes", "tokens_per_s"))
        with open(traj_dir / f"iter_{i:05d}.jsonl", "w", encoding="utf-8") as f:
            for t in trajs[: 2 * cfg.rl.group_size]:
                f.write(json.dumps(t.to_dict()) + "\n")
        try:
            budget.update(trajs, i)  # rl.failure_share / rl.failure_budget_iters
        except SimulatorFailureBudget as e:  # the last complete checkpoint stays
            run.log.event("failure", i, {"of": "rl", "reason": str(e)})
            run.log.end("rl")
            ckpt.wait()
            ckpt.close()
            raise
        _check_skipped(run, ckpt, "rl", trainer.state, cfg.rl.max_skipped_share, "rl.max_skipped_share",
                       final=i == cfg.steps - 1)
        done = i + 1
        if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.steps:
            last_eval = run_eval(run, trainer.state.params, "during", done)
        if cfg.checkpoint.every and done % cfg.checkpoint.every == 0 and done < cfg.steps:
            ckpt.save(done, {"state": trainer.state, "ref": trainer.ref_params}, {"next_iter": done},
                      metrics={"eval/success": last_eval.get("success", 0.0)})
    run.log.end("rl")
    if cfg.steps and start < cfg.steps:
        ckpt.save(cfg.steps, {"state": trainer.state, "ref": trainer.ref_params}, {"next_iter": cfg.steps},
                  metrics={"eval/success": last_eval.get("success", 0.0)}, force=True)
    ckpt.wait()
    ckpt.close()
    return trainer.state.params, int(trainer.state.step)


def run_job(cfg: RunConfig) -> dict[str, Any]:
    """Runs ``cfg.job`` and returns (and writes) the summary."""
    if cfg.job == "eval" and cfg.eval.agent != "policy":  # tau2 retail: the oracle or an HTTP endpoint
        from jaxagent.envs.tau2_retail.harness import run_host_eval

        return run_host_eval(cfg)
    t0 = time.perf_counter()
    run = prepare(cfg)
    before = _previous_eval(run, "before") if cfg.resume else None
    if before is None:  # a random initialisation is not worth sampling (its episodes run to the limits)
        before = run_eval(run, run.params, "before", 0, sampled=cfg.model.path is not None)
    params, steps = run.params, 0
    after_sft = None
    if cfg.job in ("sft", "sft+rl"):
        params = run_sft(run, params)
        steps += cfg.sft.steps
    if cfg.job == "sft+rl":  # the SFT policy alone: the summary attributes gains to SFT and to RL
        after_sft = _previous_eval(run, "after_sft") if cfg.resume else None
        if after_sft is None:
            after_sft = run_eval(run, params, "after_sft", steps)
    if cfg.job in ("rl", "sft+rl"):
        params, rl_steps = run_rl(run, params)
        steps += cfg.steps
    after = run_eval(run, params, "after", steps) if cfg.job != "eval" else before
    if cfg.checkpoint.export_hf and cfg.job != "eval":
        _export(run, params)
    summary = {
        "name": cfg.name, "job": cfg.job, "credit": cfg.rl.credit if cfg.job in ("rl", "sft+rl") else None,
        "gym": cfg.env.gym if cfg.env.kind == "gym" else None, "env": cfg.env.kind, "model_params": param_count(params),
        "success_before": before["success"], "success_after": after["success"],
        "reward_before": before["reward"], "reward_after": after["reward"],
        "turns_before": before["turns"], "turns_after": after["turns"],
        "eval_tasks": before["tasks"], "eval_k": before["k"], "steps": steps,
        "wall_seconds": time.perf_counter() - t0, "devices": [str(d) for d in jax.devices()],
    }
    summary.update(attribution(before, after_sft, after, cfg))
    run.log.close()
    closer = getattr(run.make_env, "aclose", None)  # tau2 retail: the customer / judge HTTP clients
    if closer is not None:
        asyncio.run(closer())
    from jaxagent.train import report

    metrics = report.read_metrics(run.run_dir / "metrics.jsonl")
    summary["diagnostics"] = report.infopo_diagnostics(metrics)
    summary["plots"] = [str(p.relative_to(run.run_dir)) for p in report.plot_run(metrics, run.run_dir / "plots")]
    diag = summary["diagnostics"]
    failure = None
    if cfg.job in ("rl", "sft+rl") and cfg.rl.fail_on_collapse and diag.get("collapse"):
        failure = (f"{run.run_dir}: RL collapsed ({'; '.join(diag.get('collapse_reasons') or [])}); the results are "
                   "in summary.json (set rl.fail_on_collapse=false to exit 0 on a collapse)")
        summary["failure"] = failure
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    if cfg.progress:
        print(report.summary_table(before, after, after_sft=after_sft), file=sys.stderr, flush=True)
    if failure is not None:
        raise TrainingFailed(failure)
    return summary


def attribution(before: dict[str, Any], after_sft: dict[str, Any] | None, after: dict[str, Any],
                cfg: RunConfig) -> dict[str, Any]:
    """The summary's per-stage figures: success (greedy, and ``sampled_*`` at the training
    temperature when evaluated) after SFT alone, and the gain each stage made: ``gain_sft`` =
    after SFT - before, ``gain_rl`` = after - after SFT (sft+rl), or after - before for the one
    stage of an sft or rl job."""
    out: dict[str, Any] = {}
    stages = {"sft": "sft", "rl": "rl", "sft+rl": None}.get(cfg.job)
    for prefix, key in (("", "success"), ("sampled_", "sampled/success")):
        if key not in after:
            continue
        if prefix:
            out[f"{prefix}success_before"] = before.get(key)
            out[f"{prefix}success_after"] = after[key]
        if after_sft is not None:
            out[f"{prefix}success_after_sft"] = after_sft.get(key)
            out[f"{prefix}gain_sft"] = _diff(after_sft.get(key), before.get(key))
            out[f"{prefix}gain_rl"] = _diff(after[key], after_sft.get(key))
        elif stages is not None:
            out[f"{prefix}gain_{stages}"] = _diff(after[key], before.get(key))
    return out


def _diff(a, b):
    return None if a is None or b is None else float(a) - float(b)


def _previous_eval(run: Run, label: str) -> dict[str, Any] | None:
    for rec in run.log.read():
        if rec.get("phase") == "eval" and rec.get("label") == label:
            return rec
    return None


def _export(run: Run, params) -> None:
    out = run.run_dir / "hf"
    save_pretrained(out, run.qcfg, jax.device_get(params))
    src = tokenizer_path(run.cfg.tokenizer)
    if src.is_dir():
        for f in src.iterdir():
            if f.is_file() and not (out / f.name).exists() and f.name != "README.md":
                shutil.copy2(f, out / f.name)


__all__ = ["Run", "RunLog", "build_env", "build_model", "build_tokenizer", "model_config", "param_count", "prepare",
           "run_job", "sft_batch", "sft_data", "step_key", "step_rng"]

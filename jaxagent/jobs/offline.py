"""Training on exported rows, no environment: ``job=sft`` with ``sft.data`` (Q&D stage 1) and
``job=dpo`` (Q&D stages 2 and 3; docs/QD.md).

    python -m jaxagent.launch job=sft sft.data=runs/lab/sft.jsonl model.path=... name=stage1
    python -m jaxagent.launch job=dpo dpo.data=runs/lab/pairs.jsonl dpo.stage=2 model.path=runs/stage1/hf name=stage2

The files hold job=qd_label's rows or pairs, or chat data in transformers / TRL's formats (SFT
``messages`` or ``prompt`` + ``completion``; DPO ``prompt`` + ``chosen`` + ``rejected``, strings or
messages), detected row by row, every row validated and a bad one refused with its file and line
(`jaxagent.jobs.datasets`; docs/DATA.md). A string row's prompt is rendered as the local questioner
sees it (one user turn, the assistant's generation prompt, thinking disabled:
`jaxagent.qd.agents.decision_prompt_ids`) and its completion as the questioner generates it (the
target's tokens and the end-of-turn token: `completion_ids`), so what is trained is what is sampled;
a conversation as the rollout loop renders an episode (`jaxagent.rollout.demos.render_demo`), the
loss on its assistant turns only. Rows longer than the length limit are left out and counted;
a job left with nothing to train on stops with a non-zero exit. Checkpoints under
``checkpoints/<phase>/`` (``resume=true`` continues), the policy exported to ``hf/`` (a plain HF
checkpoint; with ``model.lora`` the adapter merged into it) and with ``model.lora`` the adapter
alone to ``adapter/`` (PEFT format), ``metrics.jsonl`` and ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxagent import configlib
from jaxagent.jobs import datasets
from jaxagent.jobs.build import build_model, build_tokenizer, write_export
from jaxagent.jobs.config import RunConfig
from jaxagent.jobs.phases import abstract, failure_record, resume_phase, sft_optim, skip_check, trainable
from jaxagent.jobs.runlog import RunLog
from jaxagent.models import LogicalRules, make_mesh
from jaxagent.models.config import QwenConfig
from jaxagent.models.sharding import batch_sharding
from jaxagent.rollout.processes import ProcessGroup
from jaxagent.text.tokenizer import Tokenizer
from jaxagent.train.loop import Checkpointing, every, fit
from jaxagent.train.rows import RowTokens, row_batch, weighted_sft_loss_fn
from jaxagent.train.step import (StepShardings, TrainState, learning_rate, make_optimizer, make_update,
                                 place_on_mesh)


@dataclasses.dataclass
class OfflineRun:
    """What `jaxagent.jobs.phases`' training helpers read of a run (`Run`'s fields they use)."""

    cfg: RunConfig
    run_dir: Path
    tok: Tokenizer
    qcfg: QwenConfig
    params: Any
    rules: LogicalRules
    log: RunLog
    processes: ProcessGroup = dataclasses.field(default_factory=ProcessGroup)


def prepare_offline(cfg: RunConfig) -> OfflineRun:
    """The run directory checked and recorded, the tokenizer and the policy (no environment, no engine)."""
    from jaxagent.jobs.resume import checked_run_dir, record_config

    run_dir = checked_run_dir(cfg, refuse_checkpoints=True)
    rules = LogicalRules(make_mesh(cfg.mesh))
    tok = build_tokenizer(cfg)
    qcfg, params = build_model(cfg, tok, rules)
    record_config(cfg, run_dir)  # first: overwrite=true empties the directory
    from jaxagent.jobs.wandb_log import open_wandb

    log = RunLog(run_dir, cfg.progress, wandb=open_wandb(cfg, run_dir, tok.decode))  # log.wandb=true: W&B too
    return OfflineRun(cfg, run_dir, tok, qcfg, params, rules, log)


# ----------------------------------------------------------------------------- rows
def sft_row_tokens(rows: list, tok: Tokenizer, max_len: int, *,
                   tool_schemas_in_prompt: bool = True) -> tuple[list[RowTokens], int]:
    """(the rows that fit in ``max_len`` tokens, rendered: `jaxagent.jobs.datasets.sft_tokens`; how
    many did not). ``rows``: `read_sft_data`'s located rows (or bare records)."""
    out, long = [], 0
    for r in rows:
        row = datasets.sft_tokens(r, tok, tool_schemas_in_prompt=tool_schemas_in_prompt)
        if len(row.prompt) + len(row.completion) > max_len:
            long += 1
            continue
        out.append(row)
    return out, long


def check_positions(longest: int, key: str, max_len: int, qcfg: QwenConfig) -> None:
    """A kept row (or pair) of ``longest`` tokens must fit the model's positions: refused before
    training, naming both keys, rather than failing inside the first update."""
    if longest > qcfg.max_position_embeddings:
        raise configlib.ConfigError(
            f"{key}={max_len}: keeps rows of up to {longest} tokens, past the model's max_position_embeddings="
            f"{qcfg.max_position_embeddings}; expected {key} <= {qcfg.max_position_embeddings} (longer rows are left "
            "out and counted) or a model with more positions (a preset has max(rollout.capacity, 2048): set "
            "rollout.capacity; a checkpoint has its config.json's)")


_PHASES = {"sft": 11, "dpo": 12}  # the per-epoch permutations' streams (jobs.build.step_rng uses 1-3)


def epoch_batch(n: int, batch_size: int, step: int, seed: int, phase: str) -> np.ndarray:
    """The row indices of update ``step``: passes over a fresh permutation of the ``n`` rows per
    epoch (a stream of (seed, phase, epoch)), ``batch_size`` at a time, the epoch's last batch
    filled from its start (every batch has one shape: one compiled update)."""
    per_epoch = -(-n // batch_size)
    epoch, j = divmod(step, per_epoch)
    order = np.random.default_rng([seed, _PHASES[phase], epoch]).permutation(n)
    return order[(j * batch_size + np.arange(batch_size)) % n]


def _export(run: OfflineRun, params) -> list[str]:
    return write_export(run.run_dir, run.cfg, run.qcfg, jax.device_get(params))


# ----------------------------------------------------------------------------- job=sft on rows
def run_sft_rows(cfg: RunConfig) -> dict[str, Any]:
    """``job=sft`` with ``sft.data`` (module docstring)."""
    from jaxagent.train.checkpoint import Checkpointer

    t0 = time.perf_counter()
    s = cfg.sft
    try:
        rows = datasets.read_sft_data(s.data)
    except OSError as e:
        raise configlib.ConfigError(f"sft.data={s.data!r}: {e.strerror or e}; expected a readable rows file "
                                    "(job=qd_label's sft.jsonl or decisions.jsonl, or chat rows: docs/DATA.md)"
                                    ) from None
    except ValueError as e:
        raise configlib.ConfigError(f"sft.data={s.data!r}: {e}") from None
    if not rows:
        raise configlib.ConfigError(f"sft.data={s.data!r}: no rows; expected at least one JSON row (docs/DATA.md)")
    run = prepare_offline(cfg)
    try:
        data, long = sft_row_tokens(rows, run.tok, s.max_len, tool_schemas_in_prompt=cfg.rollout.tool_schemas_in_prompt)
    except ValueError as e:
        raise configlib.ConfigError(f"sft.data={s.data!r}: {e}") from None
    if not data:
        raise configlib.ConfigError(f"sft.data={s.data!r}: none of its {len(rows)} rows fits in "
                                    f"sft.max_len={s.max_len} tokens; expected rows (or a larger sft.max_len)")
    check_positions(max(len(r.prompt) + len(r.completion) for r in data), "sft.max_len", s.max_len, run.qcfg)
    batch = min(s.batch_size, len(data))
    if batch % s.microbatches:
        raise configlib.ConfigError(f"sft.microbatches={s.microbatches}: the {len(data)} rows make batches of {batch}; "
                                    "expected a divisor of it")
    steps = math.ceil(s.epochs * len(data) / batch) if s.epochs is not None else s.steps
    warmup = math.ceil(s.warmup_ratio * steps) if s.warmup_ratio is not None else s.warmup_steps
    optim = sft_optim(dataclasses.replace(cfg, sft=dataclasses.replace(s, steps=steps, warmup_steps=warmup)))
    tx = make_optimizer(optim)
    state = place_on_mesh(TrainState.create(run.params, tx, trainable=trainable(run.qcfg)), run.rules.mesh)
    ckpt = Checkpointer(run.run_dir / "checkpoints" / "sft", keep=cfg.checkpoint.keep,
                        async_save=cfg.checkpoint.async_save)
    restored, start = resume_phase(run, ckpt, "sft", abstract(state), "next_step", steps, "sft.steps")
    state = state if restored is None else restored
    shardings = StepShardings.of(state, batch_sharding(run.rules, shape=(batch, 1)))
    update = make_update(weighted_sft_loss_fn(run.qcfg), tx, microbatches=s.microbatches, agg="token_mean",
                         lr_schedule=learning_rate(optim), shardings=shardings)
    last: dict[str, float] = {}

    def step(i, state):
        return update(state, shardings.put_batch(row_batch(data, epoch_batch(len(data), batch, i, cfg.seed, "sft"))))

    def log(i, state, m):
        nonlocal last
        last = {k: float(v) for k, v in jax.device_get(m).items()}
        run.log.log("sft", i, last, show=("loss", "nll", "grad_norm"))

    run.log.start("sft", steps, start, desc="sft (rows)")
    state = fit(state, step, start=start, total=steps,
                hooks=[every(10, steps, log), every(10, steps, skip_check(run, "sft", s.max_skipped_share,
                                                                            "sft.max_skipped_share", steps))],
                checkpoint=Checkpointing(ckpt, cfg.checkpoint.every, "next_step"), on_error=failure_record(run, "sft"))
    run.log.end("sft")
    exported = _export(run, state.model_params) if cfg.checkpoint.export_hf else []
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[datasets.record_kind(r.record)] = kinds.get(datasets.record_kind(r.record), 0) + 1
    summary = {"name": cfg.name, "job": "sft", "data": s.data, "rows": len(rows), "rows_by_kind": kinds,
               "rows_trained": len(data), "rows_too_long": long, "max_len": s.max_len, "steps": steps,
               "epochs": steps * batch / len(data), "batch_size": batch, "microbatches": s.microbatches,
               "final": last, "exported": exported, "wall_seconds": time.perf_counter() - t0}
    run.log.close()
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.progress:
        print(f"sft on {len(data)} rows ({long} too long), {steps} steps: loss {last.get('loss', float('nan')):.4f}",
              file=sys.stderr, flush=True)
    return summary


# ----------------------------------------------------------------------------- job=dpo
def pair_tokens(pairs: list, tok: Tokenizer, max_len: int, *, tool_schemas_in_prompt: bool = True):
    """(the pairs that fit in ``max_len`` tokens, as `PairTokens`: `jaxagent.jobs.datasets.pair_tokens`;
    how many did not). ``pairs``: `read_pair_data`'s located pairs (or bare records)."""
    out, long = [], 0
    for p in pairs:
        pair = datasets.pair_tokens(p, tok, tool_schemas_in_prompt=tool_schemas_in_prompt)
        if len(pair.prompt) + max(len(pair.chosen), len(pair.rejected)) > max_len:
            long += 1
            continue
        out.append(pair)
    return out, long


def run_dpo(cfg: RunConfig) -> dict[str, Any]:
    """``job=dpo`` (module docstring): the stage's pairs of ``dpo.data``, the reference = the
    initial policy (its log-probs computed once, saved beside the checkpoints, so a resumed run
    scores against the same reference)."""
    from jaxagent.train.checkpoint import Checkpointer
    from jaxagent.train.dpo import DPOSettings, dpo_optim, dpo_steps, reference_logps, train_dpo

    t0 = time.perf_counter()
    d = cfg.dpo
    try:
        in_file = datasets.read_pair_data(d.data)
    except OSError as e:
        raise configlib.ConfigError(f"dpo.data={d.data!r}: {e.strerror or e}; expected a readable pairs file "
                                    "(job=qd_label's pairs.jsonl, or preference rows: docs/DATA.md)") from None
    except ValueError as e:
        raise configlib.ConfigError(f"dpo.data={d.data!r}: {e}") from None
    chosen = datasets.stage_rows(in_file, d.stage)
    settings = DPOSettings(**d.settings_kwargs(), seed=cfg.seed)
    run = prepare_offline(cfg)
    try:
        data, long = pair_tokens(chosen, run.tok, d.max_len, tool_schemas_in_prompt=cfg.rollout.tool_schemas_in_prompt)
    except ValueError as e:
        raise configlib.ConfigError(f"dpo.data={d.data!r}: {e}") from None
    if not data:
        raise configlib.ConfigError(
            f"dpo.data={d.data!r}: no pair to train on ({len(in_file)} pairs, {len(chosen)} selected: the Q&D pairs of "
            f"stage dpo.stage={d.stage} and every TRL-format pair; {long} longer than dpo.max_len={d.max_len}); "
            "expected pairs to train on")
    check_positions(max(len(p.prompt) + max(len(p.chosen), len(p.rejected)) for p in data), "dpo.max_len", d.max_len,
                    run.qcfg)
    total = dpo_steps(len(data), settings)
    optim = dpo_optim(settings, total)
    tx = make_optimizer(optim)
    state = place_on_mesh(TrainState.create(run.params, tx, trainable=trainable(run.qcfg)), run.rules.mesh)
    shardings = StepShardings.of(state, batch_sharding(run.rules, shape=(settings.batch_size, 1)))
    ref_path = run.run_dir / "checkpoints" / "dpo_reference.npy"
    ckpt = Checkpointer(run.run_dir / "checkpoints" / "dpo", keep=cfg.checkpoint.keep,
                        async_save=cfg.checkpoint.async_save)
    restored, start = resume_phase(run, ckpt, "dpo", abstract(state), "next_step", total, "dpo.epochs")
    if restored is not None:
        state = restored
        ref = np.load(ref_path)
    else:  # the reference: the initial policy, scored once (before any update)
        ref = reference_logps(run.params, run.qcfg, data, settings.batch_size, sharding=shardings.batch)
        ref_path.parent.mkdir(parents=True, exist_ok=True)
        np.save(ref_path, ref)
    run.log.start("dpo", total, start, desc=f"dpo (stage {d.stage})")
    last: dict[str, float] = {}

    def log(i: int, m: dict[str, float]) -> None:
        nonlocal last
        last = m
        if i % 10 == 0 or i == total - 1:
            run.log.log("dpo", i, m, show=("loss", "reward_accuracy", "reward_margin"))

    params, history = train_dpo(run.params, run.qcfg, data, settings, tx=tx, log=log, shardings=shardings,
                                state=state, start_step=start, ref_logps=ref,
                                hooks=[every(10, total, skip_check(run, "dpo", 0.5, "dpo (skipped updates)", total))],
                                checkpoint=Checkpointing(ckpt, cfg.checkpoint.every, "next_step"),
                                on_error=failure_record(run, "dpo"))
    run.log.end("dpo")
    exported = _export(run, params) if cfg.checkpoint.export_hf else []
    kinds: dict[str, int] = {}
    for p in chosen:
        kinds[datasets.record_kind(p.record)] = kinds.get(datasets.record_kind(p.record), 0) + 1
    first = history[0] if history else {}
    summary = {"name": cfg.name, "job": "dpo", "data": d.data, "stage": d.stage, "pairs_in_file": len(in_file),
               "pairs_of_stage": len(chosen), "pairs_by_kind": kinds, "pairs_trained": len(data),
               "pairs_too_long": long, "steps": total, "beta": d.beta, "lr": d.lr,
               "first": {k: first.get(k) for k in ("loss", "reward_accuracy", "reward_margin")},
               "final": last, "exported": exported, "wall_seconds": time.perf_counter() - t0}
    run.log.close()
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.progress:
        print(f"dpo stage {d.stage} on {len(data)} pairs ({long} too long), {total} steps: reward accuracy "
              f"{last.get('reward_accuracy', float('nan')):.3f}, margin {last.get('reward_margin', float('nan')):.4f}",
              file=sys.stderr, flush=True)
    return summary


__all__ = ["OfflineRun", "epoch_batch", "pair_tokens", "prepare_offline", "run_dpo", "run_sft_rows", "sft_row_tokens"]

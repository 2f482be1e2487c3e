#!/usr/bin/env python3
"""LoRA's cost and savings: one SFT update step and the train state, full fine-tuning vs LoRA.

    python3 scripts/bench_lora.py                      # hidden 512, 4 layers, vocab 4096, 4 x 256, CPU
    python3 scripts/bench_lora.py --reps 20 --ranks 8 16 64

On one Qwen2-shaped model (random weights; ``--hidden``, ``--layers``, ``--vocab``, ``--batch``,
``--seq``), the same `jaxagent.train.step.make_update` (AdamW, SFT token-mean loss, the state
donated) runs for each variant, alternating variants round by round so drifting load hits all alike:

- ``full``: every parameter trained (`TrainState.create(params, tx)`);
- ``lora_r{r}``: a rank-r adapter on all seven projections (q k v o gate up down), alpha 2r, the
  base frozen (`TrainState.create(params, tx, trainable=("lora",))`), applied inside the forward.

Reported per variant: the update's median wall time over ``--reps`` timed rounds (after
``--warmup``), the trained parameter count, the bytes of the trained params + optimizer state,
the bytes of the whole state (with the frozen base), the compiled step's temporary bytes and its
peak estimate (XLA's memory analysis: arguments + unaliased outputs + temporaries) and, where the
backend reports it (not on CPU), the device's peak bytes in use over the whole run; and the
teacher-forced scoring time of the adapter model unmerged vs merged (what decoding with an
unmerged adapter costs). Ratios are LoRA / full from this one run. The last line of stdout is one
JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import jaxagent  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT))

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import LoraSpec, init_params, merge_lora, num_lora_params, preset, token_logprobs
from jaxagent.train.step import OptimSettings, TrainState, make_optimizer, make_update, sft_loss_fn


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def tree_bytes(tree) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def peak_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    log(f"full fine-tuning and LoRA ranks {args.ranks} on a {args.layers}-layer {args.hidden}-wide model, batch "
        f"{args.batch} x {args.seq}: compiling each, then {args.warmup} warm-up and {args.reps} timed rounds")

    heads = max(1, args.hidden // 64)
    cfg = preset("small-qwen2", hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                 num_attention_heads=heads, num_key_value_heads=max(1, heads // 4), head_dim=64,
                 vocab_size=args.vocab, max_position_embeddings=max(args.seq, 512))
    tx = make_optimizer(OptimSettings(lr=1e-4))
    rng = np.random.default_rng(0)
    batch = {"tokens": jnp.asarray(rng.integers(1, args.vocab, (args.batch, args.seq)), jnp.int32),
             "loss_mask": jnp.ones((args.batch, args.seq), jnp.float32)}
    key = jax.random.key(0)

    variants: dict[str, dict] = {}
    base = init_params(key, cfg)
    variants["full"] = dict(config=cfg, params=base, trainable=None)
    for r in args.ranks:
        lcfg = cfg.replace(lora=LoraSpec(rank=r, alpha=2.0 * r))
        variants[f"lora_r{r}"] = dict(config=lcfg, params=init_params(key, lcfg), trainable=("lora",))

    states, updates, out = {}, {}, {}
    for name, v in variants.items():
        log(f"{name}: compiling")
        state = TrainState.create(jax.tree.map(jnp.copy, v["params"]), tx, trainable=v["trainable"])
        update = make_update(sft_loss_fn(v["config"]), tx)
        compiled = update.lower(state, batch).compile()
        mem = compiled.memory_analysis()
        state, m = update(state, batch)
        jax.block_until_ready(m)
        trained = tree_bytes(state.params) + tree_bytes(state.opt_state)
        out[name] = {
            "trained_params": int(sum(x.size for x in jax.tree.leaves(state.params))),
            "trained_plus_opt_state_bytes": trained,
            "state_bytes_with_frozen": trained + tree_bytes(state.frozen),
            "step_temp_bytes": None if mem is None else int(mem.temp_size_in_bytes),
            # XLA's accounting of the step: arguments + outputs not aliased to them + temporaries
            "step_peak_estimate_bytes": None if mem is None else int(
                mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
                + mem.temp_size_in_bytes),
        }
        states[name], updates[name] = state, update
        log(f"{name}: compiled")

    for _ in range(args.warmup):
        for name in variants:
            states[name], m = updates[name](states[name], batch)
            jax.block_until_ready(m)
    times = {name: [] for name in variants}
    for rep in range(args.reps):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            t0 = time.perf_counter()
            states[name], m = updates[name](states[name], batch)
            jax.block_until_ready(m)
            times[name].append(time.perf_counter() - t0)
        log(f"round {rep + 1}/{args.reps}: " + ", ".join(f"{n} {times[n][-1]:.3f}s" for n in variants))
    for name in variants:
        out[name]["step_s_median"] = round(statistics.median(times[name]), 4)

    # Scoring (forward only) of the largest-rank adapter unmerged vs merged: decoding's per-token cost.
    big = f"lora_r{max(args.ranks)}"
    lcfg = variants[big]["config"]
    adapter_params = states[big].model_params
    merged, mcfg = merge_lora(adapter_params, lcfg)
    score = {}
    for label, p, c in (("unmerged", adapter_params, lcfg), ("merged", merged, mcfg)):
        fn = jax.jit(functools.partial(token_logprobs, config=c))
        jax.block_until_ready(fn(p, batch["tokens"]))
        ts = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(p, batch["tokens"]))
            ts.append(time.perf_counter() - t0)
        score[label] = statistics.median(ts)

    full = out["full"]
    result = {
        "bench": "lora",
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "model": {"hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers, "vocab": cfg.vocab_size,
                  "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
                  "intermediate": cfg.intermediate_size, "base_params": cfg.num_params()},
        "batch": args.batch, "seq": args.seq, "reps": args.reps, "optimizer": "adamw",
        "targets": list(LoraSpec().targets),
        "variants": out,
        "ratios": {name: {
            "step_time_over_full": round(v["step_s_median"] / full["step_s_median"], 3),
            "trained_plus_opt_state_over_full": round(v["trained_plus_opt_state_bytes"]
                                                      / full["trained_plus_opt_state_bytes"], 5),
            "state_with_frozen_over_full": round(v["state_bytes_with_frozen"] / full["state_bytes_with_frozen"], 4),
            "step_temp_over_full": (None if not (v["step_temp_bytes"] and full["step_temp_bytes"])
                                    else round(v["step_temp_bytes"] / full["step_temp_bytes"], 3)),
            "step_peak_estimate_over_full": (None if not (v["step_peak_estimate_bytes"]
                                                          and full["step_peak_estimate_bytes"])
                                             else round(v["step_peak_estimate_bytes"]
                                                        / full["step_peak_estimate_bytes"], 3)),
        } for name, v in out.items() if name != "full"},
        "lora_params": {f"r{r}": num_lora_params(cfg.replace(lora=LoraSpec(rank=r))) for r in args.ranks},
        "score_s_median": {f"{big}_unmerged": round(score["unmerged"], 4), f"{big}_merged": round(score["merged"], 4),
                           "unmerged_over_merged": round(score["unmerged"] / score["merged"], 3)},
        "peak_bytes_in_use": peak_bytes(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    t_start = time.perf_counter()
    main()
    sys.stdout.flush()
    print(f"bench_lora: done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record them in "
          "docs/BENCHMARKS.md", file=sys.stderr, flush=True)

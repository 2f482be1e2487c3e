#!/usr/bin/env python3
"""InfoPO information gain: time and tokens processed by each mode on the same model and
trajectories, with the ratios, and the largest disagreement between modes.

    python3 scripts/bench_infogain.py                       # small-qwen2, 4 x 16-turn trajectories, CPU
    python3 scripts/bench_infogain.py --shape qwen2.5-1.5b --batch 8 --dtype bfloat16   # on a GPU

Trajectories are synthetic (`jaxagent.train.synthetic.synthetic_batch`) with agent-dialogue
lengths (defaults below: a 200-400 token prompt; per turn an action of 15-50 tokens, template
tokens, and feedback of 40-120 tokens, empty 10% of the time). Each mode is run once to compile
and then ``--iters`` times; medians are reported. ``naive`` runs two forwards per turn on the
host, in mini-batches; ``vmapped`` one call over every counterfactual history (its factual term
comes from the trajectories' own teacher-forced pass, timed with it); ``shared_prefix`` one call
that also yields the factual log-probs. Token counts are padded tokens fed to the model.

The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

try:
    import jaxagent  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.credit.batch import infogain_valid_turns
from jaxagent.train.batch import packed_length
from jaxagent.train.infogain import compute_infogain
from jaxagent.train.synthetic import synthetic_batch
from jaxagent.models import DTypePolicy, init_params, preset, preset_names, token_logprobs


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="small-qwen2", choices=preset_names())
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--length", type=int, default=2560, help="padded trajectory length")
    ap.add_argument("--placeholder-len", type=int, default=5, help="tokens of the placeholder")
    ap.add_argument("--placeholder-mode", default="replace", choices=("replace", "overwrite"))
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"))
    ap.add_argument("--iters", type=int, default=1, help="timed calls per mode after the first (naive takes minutes on a CPU)")
    ap.add_argument("--naive-minibatch", type=int, default=8)
    ap.add_argument("--modes", default="naive,vmapped,shared_prefix")
    args = ap.parse_args(argv)
    log(f"[setup] info-gain modes {args.modes} on {args.shape}, {args.batch} trajectories x {args.length} tokens: "
        f"each mode's first call compiles, then {args.iters} timed; building the batch and the model")
    backend = jax.default_backend()
    dtype = args.dtype or ("float32" if backend == "cpu" else "bfloat16")
    cfg = preset(args.shape, dtype=DTypePolicy(dtype, dtype))
    if args.length + args.placeholder_len > cfg.max_position_embeddings:
        cfg = cfg.replace(max_position_embeddings=args.length + args.placeholder_len)
    rng = np.random.default_rng(0)
    batch = synthetic_batch(
        rng, batch=args.batch, length=args.length, turns=args.turns, vocab=cfg.vocab_size,
        prompt_len=(200, 400), action_len=(15, 50), feedback_len=(40, 120), template_len=(3, 7),
        empty_feedback_prob=0.1, min_turns=args.turns,
    )
    params = jax.jit(init_params, static_argnums=1)(jax.random.key(0), cfg)
    ph = list(range(1, 1 + args.placeholder_len))
    valid = np.asarray(infogain_valid_turns(batch))
    real_tokens = int(np.asarray(batch.pad_mask_BL).sum())
    one_pass = args.batch * args.length
    log(f"[setup] {args.shape} {dtype} on {backend}; {args.batch} trajectories x {args.length} padded tokens "
        f"({real_tokens} real), {int(valid.sum())} valid turns")

    factual = jax.jit(lambda p, b: token_logprobs(p, b.tokens_BL, config=cfg, segment_ids_BL=b.pad_mask_BL))

    def run(mode):
        if mode == "vmapped":  # its factual term is the trajectories' own pass: count it
            f = factual(params, batch)
            out = compute_infogain(params, batch, ph, config=cfg, mode=mode, placeholder_mode=args.placeholder_mode,
                                   factual_logp_BL=f)
        else:
            out = compute_infogain(params, batch, ph, config=cfg, mode=mode, placeholder_mode=args.placeholder_mode)
        jax.block_until_ready(out.r_info_BT)
        return out

    results, outs = {}, {}
    for mode in args.modes.split(","):
        log(f"[{mode}] first call (compiles), then {args.iters} timed")
        t0 = time.perf_counter()
        outs[mode] = run(mode)
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            run(mode)
            times.append(time.perf_counter() - t0)
        tokens = outs[mode].tokens_processed + (one_pass if mode == "vmapped" else 0)
        results[mode] = {"median_s": statistics.median(times), "first_call_s": first, "tokens_processed": tokens}
        log(f"[{mode}] {results[mode]['median_s']:.3f}s (first call {first:.1f}s), {tokens:,} tokens")

    ref = np.asarray(next(iter(outs.values())).r_info_BT)
    diff = max(float(np.abs(np.asarray(o.r_info_BT) - ref).max()) for o in outs.values())
    res = {
        "bench": "infogain",
        "device": f"{backend}:{jax.devices()[0].device_kind}",
        "shape": args.shape,
        "dtype": dtype,
        "batch": args.batch,
        "turns": args.turns,
        "length": args.length,
        "valid_turns": int(valid.sum()),
        "placeholder_mode": args.placeholder_mode,
        "one_pass_tokens": one_pass,
        "packed_length": packed_length(batch, len(ph), args.placeholder_mode),
        "modes": results,
        "max_abs_diff_between_modes": diff,
        "jax_version": jax.__version__,
    }
    if "naive" in results and "shared_prefix" in results:
        res["speedup_shared_prefix_vs_naive"] = results["naive"]["median_s"] / results["shared_prefix"]["median_s"]
    if "naive" in results and "vmapped" in results:
        res["speedup_vmapped_vs_naive"] = results["naive"]["median_s"] / results["vmapped"]["median_s"]
    if "shared_prefix" in results:
        res["extra_tokens_ratio_shared_prefix"] = results["shared_prefix"]["tokens_processed"] / one_pass
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    t_start = time.perf_counter()
    main()
    sys.stdout.flush()
    print(f"bench_infogain: done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record them in "
          "docs/BENCHMARKS.md", file=sys.stderr, flush=True)

#!/usr/bin/env python3
"""The generation engine's prefill call: the admitted rows only vs every lane (the naive path).

The engine (`jaxagent.rollout.engine`) admits requests into lanes of a shared KV cache as lanes
free up, so most prefill calls admit one or a few rows while the others decode. Its prefill
gathers the admitted rows, extends them over a window of what they hold and scatters them back
(`_prefill`); the naive path, what the engine did before 2026-12-03, extends every lane (n_new = 0
elsewhere) attending over the whole cache. Both are timed here on the same cache and tokens, for
a few admitted counts and prompt lengths (medians of ``--repeats`` calls after one compiling call),
and their outputs compared (admitted rows' logits; other lanes bit for bit).

    python3 scripts/bench_prefill.py                                  # the Q&D labelling shape
    python3 scripts/bench_prefill.py --slots 8 --capacity 1024

The last line of stdout is one JSON object with ``ratio`` = naive / admitted-only time per case.
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

from jaxagent.models import init_params, preset
from jaxagent.models.generate import extend, init_cache
from jaxagent.rollout.engine import _bucket, _prefill


def _naive(params, cache, tokens_ST, n_new_S, config):
    return extend(params, cache, tokens_ST, n_new_S, config=config)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--capacity", type=int, default=1664)
    p.add_argument("--admitted", default="1,4,32", help="admitted rows per call, comma-separated")
    p.add_argument("--lengths", default="512,1024", help="new tokens per admitted row, comma-separated")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    n_cases = len(args.admitted.split(",")) * len(args.lengths.split(","))
    print(f"bench_prefill: {n_cases} cases (admitted {args.admitted} x lengths {args.lengths}), {args.repeats} timed "
          f"calls each after a compiling one; a JSON line per case", file=sys.stderr, flush=True)
    # the CPU Q&D model of docs/QD.md: hidden 128, 4 layers, the synthetic tokenizer's 2,048 ids
    cfg = preset("tiny-qwen2", vocab_size=2048, hidden_size=128, intermediate_size=384, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, num_hidden_layers=4, max_position_embeddings=args.capacity)
    params = init_params(jax.random.key(0), cfg)
    naive = jax.jit(_naive, static_argnames=("config",))
    S, C = args.slots, args.capacity
    rng = np.random.default_rng(0)
    cases = []
    for A in map(int, args.admitted.split(",")):
        for T in map(int, args.lengths.split(",")):
            lanes = np.sort(rng.choice(S, size=A, replace=False)).astype(np.int32)
            toks = rng.integers(3, cfg.vocab_size, size=(A, T)).astype(np.int32)
            Ab, Tb = _bucket(A, 1, S), _bucket(T, 16, C)
            rows = np.full(Ab, S, np.int32)
            rows[:A] = lanes
            tok_A = np.zeros((Ab, Tb), np.int32)
            tok_A[:A, :T] = toks
            n_A = np.zeros(Ab, np.int32)
            n_A[:A] = T
            window = _bucket(T, 64, C)
            tok_S = np.zeros((S, Tb), np.int32)
            tok_S[lanes, :T] = toks
            n_S = np.zeros(S, np.int32)
            n_S[lanes] = T
            logits0 = jnp.zeros((S, cfg.vocab_size), jnp.float32)

            def ours():
                cache = init_cache(cfg, S, C)
                t = time.perf_counter()
                out = _prefill(params, cache, rows, tok_A, n_A, np.zeros(Ab, np.int32), logits0, config=cfg,
                               window=window)
                jax.block_until_ready(out)
                return time.perf_counter() - t, out

            def theirs():
                cache = init_cache(cfg, S, C)
                t = time.perf_counter()
                out = naive(params, cache, tok_S, n_S, cfg)
                jax.block_until_ready(out)
                return time.perf_counter() - t, out

            (_, (lo, co)), (_, (ln, cn)) = ours(), theirs()  # compile
            diff = float(np.max(np.abs(np.asarray(lo)[lanes] - np.asarray(ln)[lanes])))
            kv = float(np.max(np.abs(np.asarray(co.k[:, lanes, :T]) - np.asarray(cn.k[:, lanes, :T]))))
            t_ours = statistics.median(ours()[0] for _ in range(args.repeats))
            t_naive = statistics.median(theirs()[0] for _ in range(args.repeats))
            case = {"admitted": A, "new_tokens": T, "ours_s": round(t_ours, 4), "naive_s": round(t_naive, 4),
                    "ratio": round(t_naive / t_ours, 2), "max_logit_diff": diff, "max_kv_diff": kv}
            print(json.dumps(case), file=sys.stderr, flush=True)
            cases.append(case)
    result = {"bench": "prefill", "slots": S, "capacity": C, "backend": jax.default_backend(),
              "repeats": args.repeats, "cases": cases}
    print(json.dumps(result), flush=True)
    print(f"bench_prefill: done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record them "
          "in docs/BENCHMARKS.md", file=sys.stderr, flush=True)
    return result


if __name__ == "__main__":
    main()

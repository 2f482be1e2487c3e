#!/usr/bin/env python3
"""The sampler's cost per decode step: `draw_categorical` (two uniforms per row, a two-level
inverse CDF) against `jax.random.categorical` (Gumbel-max: V uniforms per row), and
`argmax_first` against `jnp.argmax`, at vocabulary sizes of the presets (1,024) and of Qwen
(151,936), 1 and 8 rows.

Each timed call is one jitted `lax.scan` of ``--draws`` draws (a step's key folded in, the logits
shifted each draw so nothing is hoisted), so a figure is the in-graph cost of one draw, not
dispatch; ``--repeats`` calls per case, alternating the two implementations, medians reported
in microseconds per draw with their ratio (old / new), measured in this one run. The last line
of stdout is one JSON object.

    python3 scripts/bench_sampling.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import jaxagent  # noqa: F401
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, str(ROOT))

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models.generate import argmax_first, draw_categorical


def scanned(fn, draws: int):
    """A jitted loop of ``draws`` calls of fn(keys_B, logits_BV) -> tokens [B]; returns their sum."""
    def run(keys, logits):
        def body(acc, i):
            k = jax.vmap(jax.random.fold_in, (0, None))(keys, i)
            return acc + fn(k, logits + i.astype(jnp.float32) * 1e-3).astype(jnp.int32), None
        return jax.lax.scan(body, jnp.zeros(logits.shape[0], jnp.int32), jnp.arange(draws))[0]
    return jax.jit(run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 151936])
    ap.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--draws", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    t_start = time.perf_counter()
    print(f"bench_sampling: {len(args.vocab) * len(args.rows) * 2} cases (vocab {args.vocab} x rows {args.rows} x "
          f"draw, argmax), {args.repeats} calls each", file=sys.stderr, flush=True)

    impls = {
        "draw": {
            "old": lambda k, lg: jax.vmap(jax.random.categorical)(k, lg),
            "new": lambda k, lg: draw_categorical(k, lg)[0],
        },
        "argmax": {
            "old": lambda k, lg: jnp.argmax(lg, axis=-1),
            "new": lambda k, lg: argmax_first(lg),
        },
    }
    out = {}
    for V in args.vocab:
        for B in args.rows:
            logits = jax.random.normal(jax.random.key(1), (B, V)) * 3.0
            keys = jax.random.split(jax.random.key(0), B)
            for what, pair in impls.items():
                fns = {name: scanned(fn, args.draws) for name, fn in pair.items()}
                for f in fns.values():
                    jax.block_until_ready(f(keys, logits))
                times = {name: [] for name in fns}
                for _ in range(args.repeats):
                    for name, f in fns.items():
                        t = time.perf_counter()
                        jax.block_until_ready(f(keys, logits))
                        times[name].append(time.perf_counter() - t)
                med = {name: float(np.median(ts)) * 1e6 / args.draws for name, ts in times.items()}
                row = {"old_us": round(med["old"], 1), "new_us": round(med["new"], 1),
                       "speedup": round(med["old"] / med["new"], 2)}
                out[f"{what}_V{V}_B{B}"] = row
                print(f"bench_sampling: {what} V={V} B={B}: {row}", file=sys.stderr, flush=True)
    print(json.dumps({"bench": "sampling", "date": time.strftime("%Y-%m-%d"),
                      "machine": f"{platform.machine()} {os.cpu_count()} cpus", "backend": jax.default_backend(),
                      "draws_per_call": args.draws, "repeats": args.repeats,
                      "old": {"draw": "jax.random.categorical (vmapped)", "argmax": "jnp.argmax"},
                      "new": {"draw": "draw_categorical", "argmax": "argmax_first"}, "results": out}), flush=True)
    print(f"bench_sampling: done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record "
          "them in docs/BENCHMARKS.md", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

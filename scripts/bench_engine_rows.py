#!/usr/bin/env python3
"""The engine's batch scaling: tokens/s of the `GenerationEngine` with 1 request at a time against
``--rows`` concurrent ones, no server and no user in between.

Each round starts that many requests (``--prompt`` random prompt tokens, ``--new-tokens`` new
tokens each, no stop token) and waits for all of them; ``--rounds`` rounds per row count, after
`GenerationEngine.warmup()`. Every engine call is timed (``_step``, which holds the device work).
Reported per row count: tokens/s over the wall time, the median decode-only call and the median
call with a prefill (ms); and the ratio of tokens/s, measured in this one run. This is the ceiling
of what batching can win over one-at-a-time serving on this machine (`scripts/bench_serve.py`).
The last line of stdout is one JSON object.

    python3 scripts/bench_engine_rows.py --shape small-qwen2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
try:
    import jaxagent  # noqa: F401
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, str(ROOT))

import jax

from jaxagent.models import init_params, preset, preset_names
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine


def log(msg: str) -> None:
    """Progress on stderr (stdout holds only the JSON line)."""
    print(f"bench_engine_rows: {msg}", file=sys.stderr, flush=True)


def heartbeat(what: str, every_s: float = 10.0):
    """A line on stderr every ``every_s`` seconds while ``what`` runs (`jaxagent.eval.progress.heartbeat`)."""
    from jaxagent.eval.progress import heartbeat as beat

    return beat(what, log, every_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="tiny-qwen2", choices=preset_names())
    ap.add_argument("--rows", type=int, default=8, help="concurrent requests, against 1")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--capacity", type=int, default=256)
    ap.add_argument("--decode-steps", type=int, default=8)
    args = ap.parse_args()
    if args.rows < 2 or args.rows > args.slots:
        raise SystemExit(f"--rows={args.rows}: expected 2 <= rows <= --slots={args.slots}")

    t_start = time.perf_counter()
    log(f"{args.shape}, {args.rounds} rounds of 1 then {args.rows} concurrent requests ({args.prompt} prompt + "
        f"{args.new_tokens} new tokens each); compiling the engine first")
    vocab = 1024
    cfg = preset(args.shape, vocab_size=vocab, max_position_embeddings=max(2048, args.capacity))
    params = jax.jit(init_params, static_argnums=1)(jax.random.key(0), cfg)
    engine = GenerationEngine(params, cfg, slots=args.slots, capacity=args.capacity, decode_steps=args.decode_steps)
    with heartbeat("compiling the engine"):
        engine.warmup()
    log(f"engine compiled ({time.perf_counter() - t_start:.0f} s); timing")
    calls: list[tuple[bool, float]] = []  # (with a prefill, seconds)
    step = engine._step

    def timed(admitted):
        t = time.perf_counter()
        out = step(admitted)
        calls.append((bool(admitted), time.perf_counter() - t))
        return out

    engine._step = timed
    sp = SamplingParams(temperature=args.temperature, max_new_tokens=args.new_tokens, stop_tokens=())
    rng = np.random.default_rng(0)

    async def rounds(n: int) -> None:
        for r in range(args.rounds):
            await asyncio.gather(*(engine.generate(f"{n}-{r}-{i}", rng.integers(16, vocab, args.prompt).tolist(), sp,
                                                   np.array([r, i], np.uint32)) for i in range(n)))

    out = {}
    for n in (1, args.rows):
        calls.clear()
        t0 = time.perf_counter()
        asyncio.run(rounds(n))
        wall = time.perf_counter() - t0
        decode = [s for pre, s in calls if not pre]
        prefill = [s for pre, s in calls if pre]
        out[str(n)] = {"tokens_per_s": round(n * args.new_tokens * args.rounds / wall, 1), "calls": len(calls),
                       "decode_call_ms_p50": round(1e3 * float(np.median(decode)), 3),
                       "prefill_call_ms_p50": round(1e3 * float(np.median(prefill)), 3),
                       "engine_share_of_wall": round(sum(s for _, s in calls) / wall, 3)}
        log(f"{n} rows: {out[str(n)]}")
    print(json.dumps({
        "bench": "engine_rows", "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "shape": args.shape, "temperature": args.temperature, "prompt_tokens": args.prompt,
        "new_tokens": args.new_tokens, "slots": args.slots, "decode_steps": args.decode_steps, "rounds": args.rounds,
        "by_rows": out, "tokens_per_s_ratio": round(out[str(args.rows)]["tokens_per_s"] / out["1"]["tokens_per_s"], 2),
    }), flush=True)
    log(f"done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record them in "
        "docs/BENCHMARKS.md")


if __name__ == "__main__":
    main()

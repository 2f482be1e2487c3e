#!/usr/bin/env python3
"""Decode throughput of the KV-cache generator: decode steps/s and new tokens/s.

A batch of random prompts of ``--context`` tokens is prefilled into a fresh cache (timed as
``prefill_s``), then ``--new-tokens`` tokens are decoded per row in one jitted while-loop
(`jaxagent.models.generate.jit_generate`, greedy unless ``--temperature`` > 0; no stop tokens,
so every row decodes all of them). decode steps/s = new_tokens / decode seconds; new tokens/s =
batch * that. On a CPU backend the same decode in transformers ``generate`` (greedy, same
weights, same prompts, ``min_new_tokens = max_new_tokens``) is timed as the baseline, end to end
against our prefill + decode, and the greedy tokens of both are compared.

    python3 scripts/bench_decode.py                                   # tiny-qwen2, CPU, vs transformers
    python3 scripts/bench_decode.py --shape qwen2.5-1.5b --batch 64 --context 512 --new-tokens 256  # GPU bar

The last line of stdout is one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    import jaxagent  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import DTypePolicy, init_params, preset, preset_names, save_pretrained
from jaxagent.models.generate import init_cache, jit_extend, jit_generate


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="tiny-qwen2", choices=preset_names())
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=128, help="prompt tokens per row")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="default: float32 on CPU, bfloat16 elsewhere")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--scan-unroll", type=int, default=1, help="layers unrolled per scan step in decode")
    p.add_argument("--iters", type=int, default=3, help="timed decode runs (median reported)")
    p.add_argument("--no-torch", action="store_true", help="skip the transformers baseline")
    args = p.parse_args(argv)
    for name in ("batch", "context", "new_tokens", "iters", "scan_unroll"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)}: expected a positive integer")
    return args


def torch_baseline(cfg, params, prompts: np.ndarray, new_tokens: int, iters: int) -> dict:
    import torch
    import transformers

    with tempfile.TemporaryDirectory(prefix="bench_decode_") as tmp:
        save_pretrained(Path(tmp) / "m", cfg, params, dtype="float32")
        model = transformers.AutoModelForCausalLM.from_pretrained(Path(tmp) / "m", dtype=torch.float32).eval()
    ids = torch.from_numpy(prompts.astype(np.int64))
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                  pad_token_id=0, eos_token_id=None, attention_mask=torch.ones_like(ids))
    times = []
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)  # warm-up
        for _ in range(iters):
            t0 = time.perf_counter()
            out = model.generate(ids, **kwargs)
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"decode_s": med, "tokens": out[:, prompts.shape[1]:].numpy(), "torch_version": torch.__version__,
            "transformers_version": transformers.__version__}


def main(argv=None) -> dict:
    args = parse_args(argv)
    backend = jax.default_backend()
    dtype = args.dtype or ("float32" if backend == "cpu" else "bfloat16")
    cfg = preset(args.shape, dtype=DTypePolicy(dtype, dtype))
    B, P, N = args.batch, args.context, args.new_tokens
    if P + N > cfg.max_position_embeddings:
        raise SystemExit(f"--context + --new-tokens = {P + N}: exceeds max_position_embeddings={cfg.max_position_embeddings}")
    key_p, key_t, key_s = jax.random.split(jax.random.key(0), 3)
    params = jax.jit(init_params, static_argnums=1)(key_p, cfg)
    prompts = jax.random.randint(key_t, (B, P), 0, cfg.vocab_size, dtype=jnp.int32)
    n_new = jnp.full((B,), P, jnp.int32)
    keys = jax.random.split(key_s, B)
    capacity = P + N
    log(f"[jax] {args.shape} ({cfg.num_params() / 1e6:.1f}M) batch={B} context={P} new={N} dtype={dtype} "
        f"on {backend}:{jax.devices()[0].device_kind}")

    extend = jit_extend(cfg, None, args.scan_unroll)
    gen = jit_generate(cfg, N, None, 0, args.scan_unroll)

    def prefill():
        logits, cache = extend(params, init_cache(cfg, B, capacity), prompts, n_new)
        return jax.block_until_ready((logits, cache))

    def decode(logits, cache):
        out = gen(params, cache, logits, keys, temperature_B=args.temperature)
        return jax.block_until_ready(out)

    t0 = time.perf_counter()
    logits, cache = prefill()
    out = decode(logits, cache)
    compile_s = time.perf_counter() - t0
    pre, dec = [], []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        logits, cache = prefill()
        t1 = time.perf_counter()
        out = decode(logits, cache)
        t2 = time.perf_counter()
        pre.append(t1 - t0)
        dec.append(t2 - t1)
    assert int(out.num_tokens.min()) == N, "every row must decode all new tokens"
    decode_s = statistics.median(dec)
    result = {
        "bench": "decode",
        "decode_steps_per_s": N / decode_s,
        "new_tokens_per_s": B * N / decode_s,
        "batch": B,
        "context": P,
        "new_tokens": N,
        "device": f"{backend}:{jax.devices()[0].device_kind}",
        "shape": args.shape,
        "dtype": dtype,
        "temperature": args.temperature,
        "scan_unroll": args.scan_unroll,
        "decode_s": decode_s,
        "prefill_s": statistics.median(pre),
        "prefill_tokens_per_s": B * P / statistics.median(pre),
        "compile_s": compile_s,
        "iters": args.iters,
        "jax_version": jax.__version__,
    }
    log(f"[jax] decode {decode_s:.3f}s -> {result['decode_steps_per_s']:.1f} steps/s, "
        f"{result['new_tokens_per_s']:,.0f} new tokens/s; prefill {result['prefill_s']:.3f}s")
    if backend == "cpu" and not args.no_torch:
        try:
            base = torch_baseline(cfg, params, np.asarray(prompts), N, args.iters)
        except ImportError as e:
            result["transformers_skipped"] = str(e)
        else:
            result.update(
                transformers_decode_steps_per_s=N / base["decode_s"],
                # transformers' generate includes its prefill: compare end to end.
                speedup_vs_transformers_cpu=base["decode_s"] / (decode_s + statistics.median(pre)),
                greedy_tokens_match_transformers=bool(
                    args.temperature == 0 and (base["tokens"] == np.asarray(out.tokens)).all()
                ),
                torch_version=base["torch_version"],
                transformers_version=base["transformers_version"],
            )
            log(f"[torch] generate {base['decode_s']:.3f}s -> {N / base['decode_s']:.1f} steps/s "
                f"(incl. its prefill); ratio {result['speedup_vs_transformers_cpu']:.2f}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

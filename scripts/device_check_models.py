#!/usr/bin/env python3
"""The model stack's GPU checks, as one prepared run for a lent device (prints JSON lines).

    PYTHONPATH=. python3 scripts/device_check_models.py            # on the GPU machine
    PYTHONPATH=. python3 scripts/device_check_models.py --smoke    # plumbing check on a CPU

1. cuDNN vs XLA attention in bfloat16 on the three structures the project uses: plain causal,
   padded + packed segments, and the info-gain layout (suffixes that see only a shared prefix).
2. A whole small model's log-probs with ``attn_impl="cudnn"`` vs ``"xla"``.
3. Teacher-forced log-prob throughput, Qwen2.5-1.5B architecture, bf16, 8 x 4096 (bar: >= 170k
   tokens/s; cudnn and xla attention), and the Qwen2.5-7B architecture at the same batch.
4. KV-cache decode, Qwen2.5-1.5B architecture, bf16, batch 64, 512-token context, 256 new tokens
   (bar: >= 500 decode steps/s), with the layer scan unrolled 1 and 4.

Every line is a JSON object; the last one summarises. With ``$OUT`` set, the lines are also
written to ``$OUT/device_check_models.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxagent.models import DTypePolicy, attention, init_params, preset, token_logprobs  # noqa: E402

LINES: list[dict] = []


def emit(obj: dict) -> None:
    LINES.append(obj)
    print(json.dumps(obj), flush=True)


def structures(B: int, L: int):
    """(name, segment_ids_BL, mask_BLS) for the three structures."""
    seg = np.ones((B, L), np.int32)
    seg[:, L // 2 :] = 2
    seg[0, L - L // 8 :] = 0  # padding
    T = L - L // 4  # trajectory, then a suffix that sees only the first L//4 tokens
    allowed = np.tril(np.ones((L, L), bool))
    allowed[T:, L // 4 : T] = False
    return [
        ("causal", None, None),
        ("padded_packed_segments", jnp.asarray(seg), None),
        ("shared_prefix_mask", None, jnp.asarray(np.broadcast_to(allowed, (B, L, L)))),
    ]


def check_attention(impl: str, B=2, L=1024, N=12, K=2, H=128) -> None:
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(B, L, N, H)), jnp.bfloat16)
    k = jnp.asarray(rng.normal(size=(B, L, K, H)), jnp.bfloat16)
    v = jnp.asarray(rng.normal(size=(B, L, K, H)), jnp.bfloat16)
    for name, seg, mask in structures(B, L):
        kw = dict(scale=H**-0.5, segment_ids_BL=seg, mask_BLS=mask)
        ref = attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), impl="xla", **kw)
        got = jax.jit(lambda q, k, v: attention(q, k, v, impl=impl, **kw))(q, k, v)
        xla16 = jax.jit(lambda q, k, v: attention(q, k, v, impl="xla", **kw))(q, k, v)
        rows = np.ones((B, L), bool) if seg is None else np.asarray(seg) > 0
        err = float(jnp.abs(got.astype(jnp.float32) - ref)[rows].max())
        err16 = float(jnp.abs(xla16.astype(jnp.float32) - ref)[rows].max())
        emit({"check": "attention", "structure": name, "impl": impl, "max_abs_err_vs_f32": err,
              "xla_bf16_max_abs_err_vs_f32": err16, "ok": err <= max(2 * err16, 2e-2)})


def check_model(impl: str) -> None:
    cfg = preset("small-qwen2", dtype=DTypePolicy("bfloat16", "bfloat16"))
    p = init_params(jax.random.key(0), cfg)
    p = jax.tree.map(lambda x: (x.astype(jnp.float32) * (5.0 if x.ndim > 1 else 1.0)).astype(jnp.bfloat16), p)
    t = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (4, 512)), jnp.int32)
    f32 = cfg.replace(dtype=DTypePolicy("float32", "float32"))
    ref = token_logprobs(jax.tree.map(lambda x: x.astype(jnp.float32), p), t, config=f32, attn_impl="xla")
    got = jax.jit(lambda p, t: token_logprobs(p, t, config=cfg, attn_impl=impl))(p, t)
    xla = jax.jit(lambda p, t: token_logprobs(p, t, config=cfg, attn_impl="xla"))(p, t)
    err = float(jnp.abs(got - ref)[:, :-1].max())
    err_xla = float(jnp.abs(xla - ref)[:, :-1].max())
    emit({"check": "model_logprobs", "impl": impl, "max_abs_err_vs_f32": err, "xla_bf16_max_abs_err_vs_f32": err_xla,
          "ok": err <= max(2 * err_xla, 0.1)})


def bench(argv: list[str]) -> dict:
    from scripts.bench_model import main as bench_main

    t0 = time.perf_counter()
    try:
        out = bench_main(argv)
    except Exception as e:  # keep going: one failed bench must not hide the others
        out = {"error": f"{type(e).__name__}: {e}"[:500]}
    out = dict(out, check="bench", argv=" ".join(argv), wall_s=time.perf_counter() - t0)
    emit(out)
    return out


def bench_decode(argv: list[str]) -> dict:
    from scripts.bench_decode import main as decode_main

    t0 = time.perf_counter()
    try:
        out = decode_main(argv)
    except Exception as e:
        out = {"error": f"{type(e).__name__}: {e}"[:500]}
    out = dict(out, check="bench_decode", argv=" ".join(argv), wall_s=time.perf_counter() - t0)
    emit(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and XLA only, for a CPU")
    ap.add_argument("--skip-7b", action="store_true")
    args = ap.parse_args()
    backend = jax.default_backend()
    emit({"check": "device", "backend": backend, "devices": [d.device_kind for d in jax.devices()],
          "jax": jax.__version__})
    impl = "xla" if args.smoke else "cudnn"
    if args.smoke:
        check_attention(impl, B=1, L=64, N=4, K=2, H=16)
        bench(["--shape", "tiny-qwen2", "--batch", "2", "--seq", "64", "--iters", "2", "--warmup", "1", "--no-torch"])
        bench_decode(["--shape", "tiny-qwen2", "--batch", "2", "--context", "16", "--new-tokens", "4", "--no-torch"])
    else:
        check_attention(impl)
        check_model(impl)
        results = {}
        for attn in ("cudnn", "xla"):
            results[attn] = bench(["--shape", "qwen2.5-1.5b", "--batch", "8", "--seq", "4096", "--dtype", "bfloat16",
                                   "--attn", attn, "--iters", "10", "--warmup", "2"])
        if not args.skip_7b:
            bench(["--shape", "qwen2.5-7b", "--batch", "8", "--seq", "4096", "--dtype", "bfloat16",
                   "--attn", "cudnn", "--iters", "5", "--warmup", "2"])
        decode = {}
        for unroll in ("1", "4"):
            decode[unroll] = bench_decode(["--shape", "qwen2.5-1.5b", "--batch", "64", "--context", "512",
                                           "--new-tokens", "256", "--scan-unroll", unroll])
        steps = max((d.get("decode_steps_per_s") or 0) for d in decode.values())
        emit({"check": "bar_decode_1.5b_bf16_b64_ctx512_new256", "decode_steps_per_s": steps, "bar": 500,
              "met": steps >= 500})
        tok_s = results["cudnn"].get("teacher_forced_tokens_per_s")
        emit({"check": "bar_1.5b_bf16_8x4096", "tokens_per_s": tok_s, "bar": 170_000,
              "met": bool(tok_s and tok_s >= 170_000)})
    ok = all(line.get("ok", True) for line in LINES) and not any("error" in line for line in LINES)
    emit({"check": "summary", "ok": ok, "lines": len(LINES)})
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "device_check_models.jsonl").write_text("\n".join(json.dumps(x) for x in LINES) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

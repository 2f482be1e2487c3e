#!/usr/bin/env python3
"""Teacher-forced log-prob throughput (tokens/s) of a named model shape with random weights.

Our side is ``jax.jit(token_logprobs)`` on parameters from ``init_params``. On a CPU backend the
baseline is the same computation in transformers/torch on the same weights (saved with
``save_pretrained`` and loaded with ``AutoModelForCausalLM``, float32, sdpa attention): logits,
log_softmax, gather of the next-token targets. The two log-prob arrays are compared as a check
that both sides computed the same thing.

The last line of stdout is one JSON object with the results; progress goes to stderr.

Examples (from the repository root)::

    python3 scripts/bench_model.py                                   # tiny-qwen2, CPU, vs transformers
    python3 scripts/bench_model.py --shape small-qwen2 --batch 4 --seq 512
    python3 scripts/bench_model.py --shape qwen2.5-1.5b --batch 8 --seq 4096 --dtype bfloat16 --attn cudnn
    python3 scripts/bench_model.py --shape qwen2.5-7b --batch 8 --seq 4096 --dtype bfloat16 --attn cudnn
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    import jaxagent  # noqa: F401
except ImportError:  # run as `python3 scripts/bench_model.py` without PYTHONPATH
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import DTypePolicy, init_params, preset, preset_names, save_pretrained, token_logprobs


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def host_cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_calls(fn, warmup: int, iters: int) -> tuple[list[float], list[float]]:
    """Runs ``fn`` (which must block until its result is ready) ``warmup`` times untimed, then
    ``iters`` times timed; returns the per-call wall seconds and process CPU seconds (all
    threads). CPU time above wall time x threads used means spinning or contention."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(iters):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="tiny-qwen2", choices=preset_names(), help="model preset (default tiny-qwen2)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="params and compute dtype (default: float32 on CPU, bfloat16 on GPU/TPU)",
    )
    p.add_argument("--attn", choices=("xla", "cudnn", "auto"), default="auto", help="attention implementation")
    p.add_argument("--chunk", type=int, default=512, help="log-prob chunk size (positions per float32 logits chunk)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls after compilation")
    p.add_argument("--iters", type=int, default=30, help="timed calls")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="only 1 is supported: pin the process to one core and give torch 1 thread (default: both "
        "libraries' own thread counts). A fairer comparison on a shared, loaded machine, where torch's "
        "spinning OpenMP threads degrade far more than XLA's",
    )
    p.add_argument("--no-torch", action="store_true", help="skip the transformers/torch baseline")
    p.add_argument(
        "--torch-gpu",
        action="store_true",
        help="on a GPU backend, also time transformers/torch on CUDA (needs torch with CUDA)",
    )
    p.add_argument(
        "--remat",
        nargs="?",
        const="full",
        default="none",
        choices=("none", "full", "dots"),
        help="config.remat policy (bare --remat = full; no effect on a forward-only pass)",
    )
    args = p.parse_args(argv)
    for name in ("batch", "seq", "chunk", "iters"):
        if getattr(args, name) < 1:
            p.error(f"--{name}={getattr(args, name)}: expected a positive integer")
    if args.warmup < 0:
        p.error(f"--warmup={args.warmup}: expected >= 0")
    if args.threads is not None and args.threads != 1:
        p.error(f"--threads={args.threads}: only 1 is supported")
    return args


def torch_baseline(args, cfg, params, tokens_np: np.ndarray, device: str) -> dict:
    """Times transformers on the same weights; returns tokens/s, versions and the log-probs."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch_dtype = torch.float32 if device == "cpu" else getattr(torch, cfg.dtype.param_dtype)
    with tempfile.TemporaryDirectory(prefix="bench_model_") as tmp:
        t0 = time.perf_counter()
        save_pretrained(Path(tmp) / "ckpt", cfg, params, dtype="float32" if device == "cpu" else None)
        model = AutoModelForCausalLM.from_pretrained(
            Path(tmp) / "ckpt", dtype=torch_dtype, attn_implementation="sdpa"
        )
        log(f"[torch] saved+loaded checkpoint in {time.perf_counter() - t0:.1f}s")
    model = model.to(device).eval()
    if args.threads is not None and device == "cpu":
        torch.set_num_threads(args.threads)
    ids = torch.from_numpy(tokens_np.astype(np.int64)).to(device)
    targets = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)

    def step():
        with torch.inference_mode():
            logits = model(input_ids=ids, use_cache=False).logits.float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
        if device != "cpu":
            torch.cuda.synchronize()
        return logp

    logp = step()
    times, cpu = time_calls(step, args.warmup, args.iters)
    med = statistics.median(times)
    return {
        "tokens_per_s": args.batch * args.seq / med,
        "median_s": med,
        "median_cpu_s": statistics.median(cpu),
        "dtype": str(torch_dtype).removeprefix("torch."),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "logp": logp.float().cpu().numpy(),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads is not None:
        # Pin the whole process to one core before the CPU backend starts: XLA sizes its thread
        # pool from the affinity mask (XLA_FLAGS such as --xla_cpu_multi_thread_eigen=false do not
        # make jax 0.10's CPU runtime single-threaded).
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if args.torch_gpu:  # leave GPU memory for torch (also must precede backend start-up)
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    backend = jax.default_backend()
    dtype = args.dtype or ("float32" if backend == "cpu" else "bfloat16")
    if args.attn == "cudnn" and (backend != "gpu" or dtype == "float32"):
        raise SystemExit(f"--attn cudnn: needs a GPU backend and --dtype bfloat16 (have {backend}, {dtype})")
    cfg = preset(args.shape, dtype=DTypePolicy(dtype, dtype), remat=args.remat)
    if args.seq > cfg.max_position_embeddings:
        raise SystemExit(f"--seq={args.seq}: exceeds {args.shape}'s max_position_embeddings={cfg.max_position_embeddings}")
    dev = jax.devices()[0]
    log(
        f"[jax] {args.shape} ({cfg.num_params() / 1e6:.1f}M params) batch={args.batch} seq={args.seq} "
        f"dtype={dtype} attn={args.attn} chunk={args.chunk} on {backend}:{dev.device_kind} x{jax.device_count()}"
    )

    # Parameters are created by a jitted init so that large models are generated on the device
    # (no host copy); in bf16 directly when dtype is bf16.
    key_p, key_t = jax.random.split(jax.random.key(args.seed))
    t0 = time.perf_counter()
    params = jax.jit(init_params, static_argnums=1)(key_p, cfg)
    jax.block_until_ready(params)
    init_s = time.perf_counter() - t0
    tokens = jax.random.randint(key_t, (args.batch, args.seq), 0, cfg.vocab_size, dtype=jnp.int32)
    log(f"[jax] init_params in {init_s:.1f}s")

    fn = jax.jit(lambda p, t: token_logprobs(p, t, config=cfg, attn_impl=args.attn, chunk_size=args.chunk))
    t0 = time.perf_counter()
    compiled = fn.lower(params, tokens).compile()
    compile_s = time.perf_counter() - t0
    log(f"[jax] compiled in {compile_s:.1f}s")

    logp = compiled(params, tokens)
    logp.block_until_ready()
    times, cpu = time_calls(lambda: compiled(params, tokens).block_until_ready(), args.warmup, args.iters)
    med = statistics.median(times)
    ours = args.batch * args.seq / med
    log(
        f"[jax] median {med * 1e3:.2f} ms/call -> {ours:,.0f} tok/s (min {min(times) * 1e3:.2f} ms, "
        f"{statistics.median(cpu) * 1e3:.2f} ms CPU/call)"
    )

    result = {
        "bench": "teacher_forced_logprobs",
        "teacher_forced_tokens_per_s": ours,
        "device": f"{backend}:{dev.device_kind}",
        "device_count": jax.device_count(),
        "host_cpu": host_cpu(),
        "cpu_count": os.cpu_count(),
        "shape": args.shape,
        "num_params": cfg.num_params(),
        "batch": args.batch,
        "seq": args.seq,
        "dtype": dtype,
        "attn_impl": args.attn,
        "chunk_size": args.chunk,
        "remat": args.remat,
        "warmup": args.warmup,
        "iters": args.iters,
        "median_s": med,
        "min_s": min(times),
        "median_cpu_s": statistics.median(cpu),
        "threads": args.threads,
        "compile_s": compile_s,
        "init_s": init_s,
        "jax_version": jax.__version__,
        "jaxlib_version": getattr(__import__("jaxlib"), "__version__", None),
    }

    want_torch = None
    if backend == "cpu" and not args.no_torch:
        want_torch = "cpu"
    elif backend == "gpu" and args.torch_gpu:
        want_torch = "cuda"
    if want_torch is not None:
        try:
            import torch

            if want_torch == "cuda" and not torch.cuda.is_available():
                raise ImportError("torch has no CUDA")
        except ImportError as e:
            log(f"[torch] baseline skipped: {e}")
            result["transformers_skipped"] = str(e)
        else:
            base = torch_baseline(args, cfg, params, np.asarray(tokens), want_torch)
            diff = float(np.max(np.abs(base.pop("logp") - np.asarray(logp, dtype=np.float32))))
            log(
                f"[torch] median {base['median_s'] * 1e3:.2f} ms/call -> {base['tokens_per_s']:,.0f} tok/s "
                f"({base['torch_threads']} threads, {base['median_cpu_s'] * 1e3:.2f} ms CPU/call); "
                f"max |logp diff| = {diff:.3g}"
            )
            suffix = "cpu" if want_torch == "cpu" else "gpu"
            result.update(
                {
                    "transformers_tokens_per_s": base["tokens_per_s"],
                    "transformers_median_s": base["median_s"],
                    "transformers_median_cpu_s": base["median_cpu_s"],
                    "transformers_dtype": base["dtype"],
                    f"speedup_vs_transformers_{suffix}": ours / base["tokens_per_s"],
                    "max_abs_diff_vs_transformers": diff,
                    "torch_version": base["torch_version"],
                    "transformers_version": base["transformers_version"],
                    "torch_threads": base["torch_threads"],
                }
            )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

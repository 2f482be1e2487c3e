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
    python3 scripts/bench_model.py --shape small-qwen2 --batch 1 --seq 8192 --attn blockwise --backward --no-torch

Every run reports the compiled program's memory (``memory_analysis``: arguments + outputs +
temporaries, the peak XLA plans for) and the process's peak RSS. ``--backward`` times the gradient of
the summed log-probs instead (forward + backward). ``--sweep`` runs this script once per shape,
length, attention implementation and pass in child processes (a fresh peak RSS each) and prints
blockwise vs XLA side by side, with the ratios: a configuration whose planned memory exceeds
``--max-run-gb`` is compiled and reported but not run::

    python3 scripts/bench_model.py --sweep --sweep-shapes tiny-qwen2,small-qwen2 --sweep-lengths 1024,4096,8192,16384
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
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
    p.add_argument("--attn", choices=("xla", "cudnn", "blockwise", "auto"), default="auto",
                   help="attention implementation")
    p.add_argument("--backward", action="store_true", help="time forward + backward (the gradient of the summed log-probs)")
    p.add_argument("--max-run-gb", type=float, default=16.0,
                   help="compile but do not run when the planned memory exceeds this (GiB)")
    p.add_argument("--sweep", action="store_true", help="blockwise vs XLA over --sweep-shapes x --sweep-lengths")
    p.add_argument("--sweep-shapes", default="tiny-qwen2,small-qwen2")
    p.add_argument("--sweep-lengths", default="1024,4096,8192,16384")
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


def planned_bytes(compiled) -> int:
    """The peak XLA plans for a compiled call: its arguments, outputs and temporaries (aliased
    buffers once)."""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def sweep(args) -> dict:
    """Blockwise vs XLA attention, each configuration in its own process (its own peak RSS)."""
    rows = []
    for shape in args.sweep_shapes.split(","):
        for seq in (int(x) for x in args.sweep_lengths.split(",")):
            for backward in (False, True):
                pair = {}
                for attn in ("xla", "blockwise"):
                    cmd = [sys.executable, __file__, "--shape", shape, "--batch", str(args.batch), "--seq", str(seq),
                           "--attn", attn, "--no-torch", "--warmup", str(args.warmup), "--iters", str(args.iters),
                           "--max-run-gb", str(args.max_run_gb)] + (["--backward"] if backward else [])
                    log(f"[sweep] {' '.join(cmd[2:])}")
                    proc = subprocess.run(cmd, capture_output=True, text=True)
                    if proc.returncode != 0:
                        log(proc.stderr[-2000:])
                        pair[attn] = {"ran": False, "error": f"exit {proc.returncode}"}
                        continue
                    pair[attn] = json.loads(proc.stdout.strip().splitlines()[-1])
                x, b = pair["xla"], pair["blockwise"]
                row = {"shape": shape, "seq": seq, "batch": args.batch, "backward": backward}
                for name, r in (("xla", x), ("blockwise", b)):
                    row[f"{name}_planned_gib"] = r.get("planned_bytes", 0) / 2**30 or None
                    row[f"{name}_peak_rss_gib"] = r.get("peak_rss_bytes", 0) / 2**30 if r.get("ran") else None
                    row[f"{name}_median_s"] = r.get("median_s")
                if x.get("planned_bytes") and b.get("planned_bytes"):
                    row["planned_memory_ratio_blockwise_over_xla"] = b["planned_bytes"] / x["planned_bytes"]
                if x.get("ran") and b.get("ran"):
                    row["peak_rss_ratio_blockwise_over_xla"] = b["peak_rss_bytes"] / x["peak_rss_bytes"]
                    row["speed_ratio_blockwise_over_xla"] = x["median_s"] / b["median_s"]
                log(f"[sweep] {json.dumps(row)}")
                rows.append(row)
    result = {"bench": "attention_memory_sweep", "rows": rows, "host_cpu": host_cpu(), "cpu_count": os.cpu_count(),
              "jax_version": jax.__version__, "device": jax.default_backend()}
    print(json.dumps(result))
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.sweep:
        return sweep(args)
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
    # random weights: a preset's position limit is raised to --seq rather than refused
    cfg = cfg.replace(max_position_embeddings=max(cfg.max_position_embeddings, args.seq))
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

    def logprobs(p, t):
        return token_logprobs(p, t, config=cfg, attn_impl=args.attn, chunk_size=args.chunk)

    fn = jax.jit(jax.grad(lambda p, t: jnp.sum(logprobs(p, t))) if args.backward else logprobs)
    t0 = time.perf_counter()
    compiled = fn.lower(params, tokens).compile()
    compile_s = time.perf_counter() - t0
    planned = planned_bytes(compiled)
    log(f"[jax] compiled in {compile_s:.1f}s; planned memory {planned / 2**30:.3f} GiB")
    result = {
        "bench": "teacher_forced_logprobs" + ("_backward" if args.backward else ""),
        "backward": args.backward,
        "planned_bytes": planned,
        "device": f"{backend}:{dev.device_kind}",
        "shape": args.shape,
        "batch": args.batch,
        "seq": args.seq,
        "attn_impl": args.attn,
    }
    if planned > args.max_run_gb * 2**30:
        log(f"[jax] not run: planned {planned / 2**30:.1f} GiB > --max-run-gb={args.max_run_gb}")
        result.update(ran=False, peak_rss_bytes=peak_rss_bytes())
        print(json.dumps(result))
        return result

    logp = compiled(params, tokens)
    jax.block_until_ready(logp)
    times, cpu = time_calls(lambda: jax.block_until_ready(compiled(params, tokens)), args.warmup, args.iters)
    med = statistics.median(times)
    ours = args.batch * args.seq / med
    log(
        f"[jax] median {med * 1e3:.2f} ms/call -> {ours:,.0f} tok/s (min {min(times) * 1e3:.2f} ms, "
        f"{statistics.median(cpu) * 1e3:.2f} ms CPU/call)"
    )

    result.update({
        "ran": True,
        "peak_rss_bytes": peak_rss_bytes(),
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
    })

    want_torch = None
    if backend == "cpu" and not args.no_torch and not args.backward and args.attn != "blockwise":
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
    t_start = time.perf_counter()
    main()
    sys.stdout.flush()
    print(f"bench_model: done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record them in "
          "docs/BENCHMARKS.md", file=sys.stderr, flush=True)

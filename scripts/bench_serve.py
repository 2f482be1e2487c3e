#!/usr/bin/env python3
"""Serving throughput and latency: `job=serve` with continuous batching against the same model
served one request at a time.

Two servers are started one after the other, each as users start it (``python -m
jaxagent.launch job=serve``, a separate process): **batched** with ``--slots`` decode lanes, and
**one at a time** with one lane (requests wait in its queue and are decoded one after another).
Both serve the same weights (``--preset`` at ``model.init_seed=0``, reshaped by ``--set``
overrides, the builtin tokenizer).
For each client count in ``--clients``, that many concurrent clients (asyncio + httpx, streamed
``POST /v1/completions``) share ``--requests`` requests of ``--prompt`` random prompt tokens
(distinct per request) and ``--max-tokens`` new tokens each at temperature 1. Each server
compiles every engine shape before it listens (``serve.warmup=true``), and every workload is
played once unmeasured first (other prompts), then measured.

Reported per server and client count: completion tokens/s (all clients' tokens over the wall
time), requests/s, time to first token p50/p95 (the first streamed chunk with text) and request
latency p50/p95; and the ratio batched / one-at-a-time of tokens/s per client count, measured in
this one run. The last line of stdout is one JSON object.

    python3 scripts/bench_serve.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
try:
    import jaxagent  # noqa: F401
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, str(ROOT))


@contextlib.contextmanager
def heartbeat(what: str, every_s: float = 10.0):
    """A line on stderr every ``every_s`` seconds while ``what`` runs: a long compile is never silent."""
    stop, t0 = threading.Event(), time.perf_counter()

    def beat():
        while not stop.wait(every_s):
            print(f"bench_serve: {what}: still running ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    th = threading.Thread(target=beat, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


def start_server(args, slots: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "jaxagent.launch", "job=serve", "serve.port=0", f"model.preset={args.preset}",
           f"rollout.slots={slots}", f"rollout.capacity={args.capacity}", f"rollout.max_tokens={args.capacity}",
           f"rollout.decode_steps={args.decode_steps}", f"serve.max_queue={max(args.clients) + 8}",
           f"serve.model_name={args.preset}", "serve.request_timeout_s=3600", "serve.warmup=true",
           f"runs_dir={args.runs_dir}", *args.set]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    print(f"bench_serve: starting the server with {slots} decode lane(s) (it compiles every engine shape before it "
          "listens)", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with heartbeat("the server is building and compiling"):
        return _wait_for_server(proc, t0)


def _wait_for_server(proc: subprocess.Popen, t0: float) -> tuple[subprocess.Popen, str]:
    deadline = time.monotonic() + 1800  # serve.warmup compiles every engine shape first
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if line.strip():  # the server's own progress while it builds and compiles
            print(f"bench_serve:   server: {line.rstrip()}", file=sys.stderr, flush=True)
        m = re.search(r"on (http://\S+/v1)", line)
        if m:
            print(f"bench_serve: server up at {m.group(1)} after {time.monotonic() - t0:.0f} s", file=sys.stderr,
                  flush=True)
            return proc, m.group(1)
    proc.kill()
    raise SystemExit(f"bench_serve: the server did not start:\n{''.join(lines)}")


def stop_server(proc: subprocess.Popen) -> dict:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"bench_serve: the server exited {proc.returncode}:\n{err[-2000:]}")
    return json.loads(out)


async def one_request(http: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int,
                      seed: int) -> tuple[float, float, int]:
    """(time to first token, latency, completion tokens) of one streamed completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    async with http.stream("POST", url + "/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"bench_serve: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise SystemExit(f"bench_serve: stream error {chunk['error']}")
            if ttft is None and any(c.get("text") for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    latency = time.perf_counter() - t0
    return (ttft if ttft is not None else latency), latency, tokens


async def workload(url: str, args, clients: int, prompts: list[list[int]]) -> dict:
    queue: asyncio.Queue = asyncio.Queue()
    for i, p in enumerate(prompts):
        queue.put_nowait((i, p))
    results = []
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as http:
        async def client():
            while not queue.empty():
                i, p = queue.get_nowait()
                results.append(await one_request(http, url, args.preset, p, args.max_tokens, seed=i))

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - t0
    ttft = np.array([r[0] for r in results])
    lat = np.array([r[1] for r in results])
    tokens = int(sum(r[2] for r in results))
    return {"clients": clients, "requests": len(results), "completion_tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 2), "requests_per_s": round(len(results) / wall, 3),
            "ttft_p50_s": round(float(np.median(ttft)), 4), "ttft_p95_s": round(float(np.percentile(ttft, 95)), 4),
            "latency_p50_s": round(float(np.median(lat)), 4), "latency_p95_s": round(float(np.percentile(lat, 95)), 4)}


def measure(args, slots: int, prompts) -> tuple[dict, dict]:
    """``prompts(c, warm)``: the prompts of one pass, fresh ones every pass (no pass finds its
    prompts in the cache another pass left)."""
    proc, url = start_server(args, slots)
    try:
        out = {}
        for c in args.clients:
            asyncio.run(workload(url, args, c, prompts(c, True)))  # compiles, unmeasured
            out[str(c)] = asyncio.run(workload(url, args, c, prompts(c, False)))
            print(f"bench_serve: slots={slots} clients={c}: {out[str(c)]['tokens_per_s']} tokens/s, ttft p50 "
                  f"{out[str(c)]['ttft_p50_s']} s", file=sys.stderr, flush=True)
    finally:
        if proc.poll() is None:
            summary = stop_server(proc)
    return out, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny-qwen2")
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=64, help="requests per measurement (shared by the clients)")
    ap.add_argument("--warm-requests", type=int, default=8, help="requests of the unmeasured pass (at least clients)")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per request")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--slots", type=int, default=32, help="decode lanes of the batched server")
    ap.add_argument("--capacity", type=int, default=256)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--runs-dir", default="/tmp/jaxagent_bench_serve")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more overrides for both servers, e.g. a model shape: model.hidden_size=1024 "
                         "model.intermediate_size=4096")
    args = ap.parse_args()
    t_start = time.perf_counter()
    print(f"bench_serve: {args.preset}, two servers one after the other ({args.slots} lanes, then 1), clients "
          f"{','.join(map(str, args.clients))} x {args.requests} requests of {args.max_tokens} tokens each",
          file=sys.stderr, flush=True)

    from jaxagent.jobs.build import tokenizer_path
    from jaxagent.text.tokenizer import load_tokenizer

    vocab = load_tokenizer(tokenizer_path("builtin:gyms")).vocab_size

    def prompts(c: int, warm: bool) -> list[list[int]]:
        # the same prompts for both servers: pass (c, warm) of each draws from the same seed
        rng = random.Random(f"{c}-{warm}")
        n = max(c, args.warm_requests) if warm else args.requests
        return [[rng.randrange(16, vocab) for _ in range(args.prompt)] for _ in range(n)]

    batched, batched_summary = measure(args, args.slots, prompts)
    single, single_summary = measure(args, 1, prompts)
    ratios = {c: round(batched[c]["tokens_per_s"] / single[c]["tokens_per_s"], 2) for c in batched}
    result = {
        "bench": "serve", "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "preset": args.preset, "overrides": args.set, "prompt_tokens": args.prompt, "max_tokens": args.max_tokens,
        "requests": args.requests, "slots": args.slots, "decode_steps": args.decode_steps,
        "batched": batched, "one_at_a_time": single, "tokens_per_s_ratio": ratios,
        "prefix_reuses": {"batched": batched_summary.get("prefix_reuses"),
                          "one_at_a_time": single_summary.get("prefix_reuses")},
        "bar_8_clients_ge_4x": ratios.get("8", 0) >= 4.0,
    }
    print(json.dumps(result), flush=True)
    print(f"bench_serve: done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record them in "
          "docs/BENCHMARKS.md", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

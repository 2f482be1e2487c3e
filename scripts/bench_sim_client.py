#!/usr/bin/env python3
"""Host CPU per user-simulator call: our `LLMUserClient` (aiohttp) against httpx clients.

The rollout loop's host side pays for every simulator call on the event loop that also feeds the
engine, so a client's CPU per request is device time lost on a CPU box. A local OpenAI-compatible
simulator (``scripts/bench_rollout.py``'s, in its own process, answering after ``--delay``
seconds) gets ``--requests`` chat calls at each concurrency in ``--concurrency``, from:

- **ours**: `LLMUserClient.chat` (aiohttp session, JSON encoded once, reply parsed);
- **httpx**: an ``httpx.AsyncClient`` whose pool has as many connections as requests in flight,
  posting the same payload and parsing the reply (what `LLMUserClient` did before 2026-12-03);
- **httpx_8**: the same with an 8-connection pool (httpcore's pool work per request grows with
  the square of its connections) and requests beyond 8 queued in the pool.

CPU is this process's (`time.process_time`) over the timed calls, in ms per request; the ratios
are httpx's over ours, measured in one run. The last line of stdout is one JSON object.

    python3 scripts/bench_sim_client.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import jaxagent  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT))

import httpx
from bench_rollout import start_simulator

from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig

MESSAGES = [{"role": "system", "content": "You are a customer. " * 30},
            {"role": "user", "content": "Hello, how can I help?"}, {"role": "assistant", "content": "I need a trip."}]


async def timed(call, n: int, concurrency: int) -> float:
    """CPU ms per request of ``n`` calls, ``concurrency`` at a time (after one untimed call)."""
    await call()
    gate = asyncio.Semaphore(concurrency)

    async def one():
        async with gate:
            return await call()

    c0 = time.process_time()
    await asyncio.gather(*(one() for _ in range(n)))
    return (time.process_time() - c0) / n * 1e3


async def ours(url: str, n: int, concurrency: int) -> float:
    async with LLMUserClient(LLMUserConfig(base_url=url, model="sim", max_concurrency=concurrency)) as client:
        return await timed(lambda: client.chat(MESSAGES), n, concurrency)


async def with_httpx(url: str, n: int, concurrency: int, connections: int) -> float:
    payload = {"model": "sim", "messages": MESSAGES, "temperature": 1.0, "stream": False}
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0)) as http:
        async def call():
            r = await http.post(url + "/chat/completions", json=payload)
            return json.loads(r.content)["choices"][0]["message"]["content"]
        return await timed(call, n, concurrency)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--delay", type=float, default=0.02, help="the simulator's answer delay, seconds")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    print(f"bench_sim_client: {args.requests} calls x 3 clients at each concurrency {args.concurrency}, simulator "
          f"delay {args.delay} s", file=sys.stderr, flush=True)
    port, proc = start_simulator(args.delay, 0.0, "process")
    url = f"http://127.0.0.1:{port}/v1"
    rows = []
    try:
        for c in args.concurrency:
            row = {"concurrency": c, "ours_cpu_ms": asyncio.run(ours(url, args.requests, c)),
                   "httpx_cpu_ms": asyncio.run(with_httpx(url, args.requests, c, c)),
                   "httpx_8_cpu_ms": asyncio.run(with_httpx(url, args.requests, c, 8))}
            row["httpx_over_ours"] = row["httpx_cpu_ms"] / row["ours_cpu_ms"]
            row["httpx_8_over_ours"] = row["httpx_8_cpu_ms"] / row["ours_cpu_ms"]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        proc.terminate()
    res = {"bench": "sim_client", "requests": args.requests, "delay_s": args.delay, "rows": rows}
    print(json.dumps(res), flush=True)
    print(f"bench_sim_client: done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record "
          "them in docs/BENCHMARKS.md", file=sys.stderr, flush=True)
    return res


if __name__ == "__main__":
    main()

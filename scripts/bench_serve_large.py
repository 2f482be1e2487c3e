#!/usr/bin/env python3
"""Large request bodies against `job=serve`: does `/health` stay answered, and how fast is an
oversized body refused? (issue 38, point 1's reproduction.)

One server is started as users start it (``python -m jaxagent.launch job=serve``, the Qwen fixture
tokenizer so that chats render through a real chat template, ``rollout.capacity`` large enough that
a multi-megabyte chat is tokenised rather than refused by its byte count alone). Then, one after
the other: ``/health`` polled alone every ``--poll-s`` (the idle figure); for each size in
``--sizes-mb`` one chat whose user message is that many megabytes of words, sent while ``/health``
is polled from another thread (the figure under load: p50, p95 and max latency, and the body's
status and time to answer). Bodies over ``serve.max_body_bytes`` (4 MiB by default) get 413
before they are read; bodies under it are parsed, rendered and tokenised in the server's worker
threads and then refused as too long for a lane (400) or answered.

The last line of stdout is one JSON object: per size the status, seconds to answer, and
``health_p95_ratio`` (p95 of /health during the body over idle p95) and ``health_max_s``.

    python3 scripts/bench_serve_large.py                      # sizes 2 and 20 MB
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
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
FIXTURE_TOKENIZER = ROOT / "tests" / "fixtures" / "tokenizer_qwen"


def say(msg: str) -> None:
    print(f"bench_serve_large: {msg}", file=sys.stderr, flush=True)


def start_server(capacity: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "jaxagent.launch", "job=serve", "serve.port=0", f"tokenizer={FIXTURE_TOKENIZER}",
           "rollout.slots=2", f"rollout.capacity={capacity}", f"rollout.max_tokens={capacity}", "serve.model_name=m",
           "progress=false", *extra]
    env = {"PYTHONPATH": str(ROOT), **{k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before listening")
        if m := re.search(r"(http://127\.0\.0\.1:\d+/v1)", line):
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep the pipe drained
            return proc, m.group(1)
    raise SystemExit("the server did not start within 600 s")


def poll_health(base: str, stop: threading.Event, every_s: float, out: list[float]) -> None:
    with httpx.Client(timeout=600) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            c.get(base + "/health")
            out.append(time.perf_counter() - t0)
            stop.wait(every_s)


def figures(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs)
    return {"n": int(a.size), "p50_s": float(np.percentile(a, 50)), "p95_s": float(np.percentile(a, 95)),
            "max_s": float(a.max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mb", type=lambda s: [float(x) for x in s.split(",")], default=[2.0, 20.0])
    ap.add_argument("--idle-s", type=float, default=5.0, help="seconds of /health polled alone")
    ap.add_argument("--poll-s", type=float, default=0.05)
    ap.add_argument("--capacity", type=int, default=131072,
                    help="the lane length: with the fixture tokenizer (17 bytes a token at most) 131072 tokens admit 2.2 MB,\n                    so a 2 MB chat is tokenised, not refused by its bytes")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more job=serve overrides")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    say(f"starting a job=serve server (tiny-qwen2, capacity {args.capacity}); then {args.idle_s:g} s of /health "
        f"alone and one chat of each of {args.sizes_mb} MB with /health polled every {args.poll_s:g} s")
    proc, url = start_server(args.capacity, args.set)
    base = url.removesuffix("/v1")
    results: dict = {}
    try:
        httpx.post(url + "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": 1}, timeout=600)  # the first compile, unmeasured
        idle: list[float] = []
        stop = threading.Event()
        th = threading.Thread(target=poll_health, args=(base, stop, args.poll_s, idle))
        th.start()
        time.sleep(args.idle_s)
        stop.set()
        th.join()
        results["idle"] = figures(idle)
        say(f"idle /health p95 {results['idle']['p95_s'] * 1e3:.1f} ms over {len(idle)} polls")
        for mb in args.sizes_mb:
            words = "word " * int(mb * 2**20 / 5)
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": words}], "max_tokens": 1})
            during: list[float] = []
            stop = threading.Event()
            th = threading.Thread(target=poll_health, args=(base, stop, args.poll_s, during))
            th.start()
            time.sleep(0.3)
            t1 = time.perf_counter()
            try:
                r = httpx.post(url + "/chat/completions", content=body.encode(),
                               headers={"Content-Type": "application/json"}, timeout=600)
                status, code = r.status_code, (r.json().get("error") or {}).get("code") if r.status_code >= 400 else None
            except httpx.HTTPError as e:  # the server may close the connection after its 413
                status, code = f"client error: {type(e).__name__}", None
            answer_s = time.perf_counter() - t1
            time.sleep(0.3)
            stop.set()
            th.join()
            f = figures(during)
            results[f"{mb:g}MB"] = {"bytes": len(body), "status": status, "code": code, "answer_s": answer_s,
                                    "health": f, "health_p95_ratio": f["p95_s"] / results["idle"]["p95_s"],
                                    "health_max_s": f["max_s"]}
            say(f"{mb:g} MB: {status} {code or ''} in {answer_s:.2f} s; /health p95 {f['p95_s'] * 1e3:.1f} ms "
                f"(x{f['p95_s'] / results['idle']['p95_s']:.2f} idle), max {f['max_s'] * 1e3:.0f} ms over {f['n']} polls")
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    out = {"bench": "serve_large_bodies", "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
           "machine": f"{platform.machine()} {__import__('os').cpu_count()} cores", "capacity": args.capacity,
           "overrides": args.set, "server_exit": rc, **results}
    print(json.dumps(out), flush=True)
    say(f"done in {time.perf_counter() - t0:.0f} s; results above (JSON on stdout); record them in docs/BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

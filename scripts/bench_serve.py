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

**Soak** (``--soak N``): one server (``--slots`` lanes, default 16; ``--capacity`` 512; the
Qwen fixture tokenizer, for chat; ``serve.max_body_bytes=--soak-max-body-bytes``) and N minutes of
mixed traffic from ``--soak-clients`` concurrent clients, each request's kind drawn by the shares
of ``--soak-mix``: **good** (chat, with tools or not, and completions, some streamed, one with
n=2; 4-16 new tokens), **bad** (malformed JSON, bytes that are not UTF-8, an empty body, wrong
types, an unknown model, garbage tool schemas, a tool message answering no call, a lone
surrogate ``"a\\ud800b"`` and 10,000-deep nesting sent as raw bytes, a request that can never fit,
an unknown route, a wrong method), **abandoned** (raw sockets that hang up mid-body, after sending
a non-streamed request, or after a stream's first chunk; each asks for most of a lane) and
**large** (bodies 64 KiB over the limit, with a Content-Length or chunked, and 1 KiB under it: a
valid request padded with whitespace and a prompt too long for a lane). Before it: 3 s of
``/health`` alone (polled every 0.1 s), a few seconds unmeasured, then ``--soak-baseline-s`` of
good requests alone (the latency baseline). ``/health`` is polled every 0.5 s from a thread of
its own through the baseline and the soak. After it: up to ``--soak-settle-s`` for the in-flight
count to return to 0 (``leaked_lanes``: what is still in flight then), then SIGTERM. Every answer
is counted by kind, variant and outcome (a status code, ``hung_up``, ``stream_error``,
``conn_error:...``, ``client_timeout``); 5xx and error events in good streams are
``server_errors``. The server's stderr is forwarded and saved under ``--runs-dir``.

    python3 scripts/bench_serve.py --soak 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import signal
import socket
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


def heartbeat(what: str, every_s: float = 10.0):
    """A line on stderr every ``every_s`` seconds while ``what`` runs (`jaxagent.eval.progress.heartbeat`)."""
    from jaxagent.eval.progress import heartbeat as beat

    return beat(what, lambda m: print(f"bench_serve: {m}", file=sys.stderr, flush=True), every_s)


def start_server(args, slots: int, settings: list[str] | None = None,
                 lines: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """``settings``: the serve overrides (default: the throughput mode's); ``lines``: collects the
    server's stderr lines up to its URL."""
    if settings is None:
        settings = [f"serve.max_queue={max(args.clients) + 8}", "serve.request_timeout_s=3600"]
    cmd = [sys.executable, "-m", "jaxagent.launch", "job=serve", "serve.port=0", f"model.preset={args.preset}",
           f"rollout.slots={slots}", f"rollout.capacity={args.capacity}", f"rollout.max_tokens={args.capacity}",
           f"rollout.decode_steps={args.decode_steps}", *settings,
           f"serve.model_name={args.preset}", "serve.warmup=true",
           f"runs_dir={args.runs_dir}", *args.set]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    print(f"bench_serve: starting the server with {slots} decode lane(s) (it compiles every engine shape before it "
          "listens)", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with heartbeat("the server is building and compiling"):
        return _wait_for_server(proc, t0, lines)


def _wait_for_server(proc: subprocess.Popen, t0: float,
                     lines: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    deadline = time.monotonic() + 1800  # serve.warmup compiles every engine shape first
    lines = [] if lines is None else lines
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


# ---------------------------------------------------------------------------------------------- soak
# `--soak N`: one server, N minutes of mixed traffic. Each client picks a kind by the shares of
# `--soak-mix`, then one of the kind's variants at random, and records the outcome (the status
# code, or what happened instead). Nothing below fails on an unexpected answer: it is counted.

SOAK_KINDS = ("good", "bad", "abandoned", "large")
WORDS = ("the weather in Paris", "a list of three fruits", "why the sky is blue", "an order to return",
         "the capital of Peru", "a short poem", "two plus two", "the time in Tokyo", "a shoe size",
         "a train to Lyon", "the tallest tree", "a recipe for soup")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
REQUEST_TIMEOUT_S = 120.0  # a client's own limit on one request (then counted as client_timeout)


def parse_mix(text: str) -> dict[str, float]:
    mix = {}
    for part in text.split(","):
        name, _, share = part.partition("=")
        name = name.strip()
        if name not in SOAK_KINDS:
            raise SystemExit(f"bench_serve: --soak-mix {text!r}: unknown kind {name!r}; expected some of "
                             f"{', '.join(SOAK_KINDS)} as kind=share")
        try:
            mix[name] = float(share)
        except ValueError:
            raise SystemExit(f"bench_serve: --soak-mix {text!r}: {name}={share!r} is not a number") from None
        if not mix[name] >= 0:
            raise SystemExit(f"bench_serve: --soak-mix {text!r}: {name}={share!r}; expected a share >= 0")
    total = sum(mix.values())
    if total <= 0:
        raise SystemExit(f"bench_serve: --soak-mix {text!r}: expected a positive share somewhere")
    return {k: round(mix.get(k, 0.0) / total, 4) for k in SOAK_KINDS}


def pct(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0, "p50": None, "p95": None}
    a = np.asarray(xs)
    return {"n": len(xs), "p50": round(float(np.median(a)), 4), "p95": round(float(np.percentile(a, 95)), 4)}


def ratio(a, b):
    return round(a / b, 2) if a is not None and b else None


class Soak:
    """The soak's traffic, its counts and its /health samples."""

    def __init__(self, url: str, args, lanes: int):
        self.url, self.args = url, args
        u = httpx.URL(url)
        self.host, self.port, self.base = u.host, u.port, url[: -len("/v1")]
        self.model, self.capacity, self.limit = args.preset, args.capacity, args.soak_max_body_bytes
        self.lanes = lanes
        self.mix = parse_mix(args.soak_mix)
        self.counts: dict[tuple[str, str, str], int] = {}
        self.latency: dict[str, list[float]] = {"baseline": [], "soak": []}  # good requests answered 200
        self.samples: list[str] = []  # what went wrong, the first few of each kind
        self.health: list[tuple[str, float, int, dict | None]] = []  # (phase, latency, status, body)
        self.phase = "quiet"
        self._bodies()

    # ---- bodies, built once
    def _chat(self, rng: random.Random, **extra) -> dict:
        return {"model": self.model, "messages": [{"role": "user", "content": f"Tell me about {rng.choice(WORDS)}."}],
                **extra}

    def _bodies(self) -> None:
        m = json.dumps(self.model)
        chat = b'"messages": [{"role": "user", "content": "hi"}]'
        self.bad_raw = {
            "malformed_json": b'{"model": ' + m.encode() + b', "messages": [{"role": "user", "content": "hi"}',
            "not_utf8": b'{"model": ' + m.encode() + b', "messages": [{"role": "user", "content": "\xff\xfe"}]}',
            "empty_body": b"",
            "lone_surrogate": b'{"model": ' + m.encode() + b', "messages": [{"role": "user", "content": '
                              b'"a\\ud800b"}], "max_tokens": 4}',
            "deep_nesting": b'{"model": ' + m.encode() + b', ' + chat + b', "metadata": ' + b"[" * 10_000
                            + b"]" * 10_000 + b"}",
        }
        self.bad_json = {  # wrong types and values (sent as JSON by httpx)
            "wrong_types": [
                {"model": self.model, "messages": "hi"},
                {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
                {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -5},
                {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "n": "two"},
                {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"},
                {"model": self.model, "messages": [{"role": "wizard", "content": "hi"}]},
                {"model": self.model, "messages": [{"role": "user", "content": 7}]},
                [1, 2, 3],
            ],
            "unknown_model": [{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}],
            "garbage_tools": [
                {"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"type": "function", "function": {"name": "f", "parameters": "garbage"}}]},
                {"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"type": "function", "function": {"name": "f", "parameters": [1, 2]}}]},
                {"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"type": "function", "function": {"name": "x" * 10_000}}]},
                {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "tools": "garbage"},
                {"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}]},
            ],
            "tool_order": [
                {"model": self.model, "messages": [{"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
                                                   {"role": "user", "content": "hi"}]},
            ],
            "never_fits": [{"model": self.model, "prompt": ["hi"] * 200, "max_tokens": 2}],
        }
        # large: a chat whose content fills the body to just past / just under the limit
        pad = b'{"model": ' + m.encode() + b', "messages": [{"role": "user", "content": "'
        over = self.limit + 65_536
        self.over_body = pad + b"x" * (over - len(pad) - 4) + b'"}]}'
        under = self.limit - 1024
        self.under_long = pad + b"x" * (under - len(pad) - 4) + b'"}]}'
        small = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 8}).encode()
        self.under_padded = small[:-1] + b" " * (under - len(small)) + b"}"  # JSON whitespace: a valid request

    # ---- outcomes
    def count(self, kind: str, variant: str, outcome: str, detail: str = "") -> None:
        key = (kind, variant, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.phase == "soak" and self._bad(kind, variant, outcome) and len(self.samples) < 20:
            self.samples.append(f"{kind}/{variant}: {outcome} {detail[:300]}".strip())

    @staticmethod
    def is_server_error(outcome: str) -> bool:
        return outcome.isdigit() and int(outcome) >= 500 or outcome.startswith("stream_error")

    @staticmethod
    def is_conn_error(outcome: str) -> bool:
        return outcome.startswith("conn_error") or outcome == "client_timeout"

    def _bad(self, kind, variant, outcome) -> bool:
        return (self.is_server_error(outcome) or self.is_conn_error(outcome)
                or not self.expected(kind, variant, outcome))

    @staticmethod
    def expected(kind: str, variant: str, outcome: str) -> bool:
        """Whether the outcome is one a correct server may give (5xx and connection errors aside)."""
        if kind == "good" or variant == "under_padded":
            return outcome in ("200", "429")
        if kind == "bad":
            return outcome.isdigit() and 400 <= int(outcome) < 500 and outcome != "413"
        if kind == "abandoned":
            return outcome == "hung_up" or outcome.isdigit() and int(outcome) < 500
        if variant == "under_long_prompt":
            return outcome in ("400", "429")
        return outcome in ("413", "400")  # over the limit: 413 (a server without the limit: 400 or worse)

    # ---- raw HTTP/1.1 (hang-ups, chunked and over-limit bodies)
    def _head(self, path: str, length: int | None, *, chunked: bool = False, expect: bool = False) -> bytes:
        lines = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Content-Type: application/json",
                 "Connection: close"]
        lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}")
        if expect:
            lines.append("Expect: 100-continue")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    @staticmethod
    def _parse(buf: bytes) -> tuple[int | None, int, bool]:
        """(final status or None, where its body starts, whether a ``100 Continue`` came first)."""
        pos, continued = 0, False
        while (end := buf.find(b"\r\n\r\n", pos)) >= 0:
            code = int(buf[pos:end].split(None, 2)[1])
            if code >= 200:
                return code, end + 4, continued
            pos, continued = end + 4, True
        return None, 0, continued

    async def raw(self, path: str, head: bytes, parts, *, hang_up: str | None = None,
                  wait_s: float = 0.0, expect: bool = False) -> tuple[str, bytes]:
        """Sends ``head`` then ``parts`` on a fresh connection, stopping when the server has
        answered, and reads the answer (what arrived before a reset included: the socket is read
        as data comes, not after a failed write). ``hang_up``: "mid_body" (close after the first
        part), "after_send" (close ``wait_s`` after the whole body), "first_chunk" (close after a
        stream's first chunk). ``expect``: the head asked for ``100 Continue``: the body waits for
        it, or for 1 s (as curl)."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        buf = bytearray()
        answered, continued = asyncio.Event(), asyncio.Event()

        async def read() -> OSError | None:
            while True:
                try:
                    data = await loop.sock_recv(sock, 1 << 16)
                except OSError as e:
                    return e
                if not data:
                    return None
                buf.extend(data)
                code, at, cont = self._parse(bytes(buf))
                if cont:
                    continued.set()
                if code is not None:
                    answered.set()
                    i = buf.find(b"data:", at)
                    if hang_up == "first_chunk" and code == 200 and i >= 0 and b"\n" in buf[i:]:
                        return None

        tasks: list[asyncio.Future] = []
        try:
            try:
                await loop.sock_connect(sock, (self.host, self.port))
            except OSError as e:
                return f"conn_error:{type(e).__name__}", b""
            reading = asyncio.ensure_future(read())
            tasks.append(reading)
            try:
                await loop.sock_sendall(sock, head)
                if expect:
                    tasks += [asyncio.ensure_future(continued.wait()), asyncio.ensure_future(answered.wait())]
                    await asyncio.wait([reading, *tasks[1:]], timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                for part in parts:
                    if answered.is_set() or reading.done():
                        break
                    await loop.sock_sendall(sock, part)
                    if hang_up == "mid_body":
                        await asyncio.sleep(wait_s)
                        return "hung_up", b""
            except OSError:
                pass  # the server closed early (a 413 before the body): its answer is read below
            if hang_up == "after_send":
                await asyncio.sleep(wait_s)
                if not answered.is_set():
                    return "hung_up", b""
            try:
                error = await asyncio.wait_for(asyncio.shield(reading), REQUEST_TIMEOUT_S)
            except TimeoutError:
                return "client_timeout", b""
            code, at, _ = self._parse(bytes(buf))
            if code is None:
                why = type(error).__name__ if error is not None else "closed"
                return f"conn_error:{why}", f"{error or 'closed without an answer'}".encode()
            if hang_up == "first_chunk" and code == 200:
                return "hung_up", bytes(buf[at:])
            return str(code), bytes(buf[at:])
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            sock.close()

    # ---- the four kinds
    async def good(self, http: httpx.AsyncClient, rng: random.Random, *, phase_latency: list[float] | None) -> None:
        variant = rng.choice(("chat", "chat_stream", "chat_tools", "completion", "completion_stream", "completion_n2"))
        max_tokens = rng.randint(4, 16)
        stream = variant.endswith("_stream")
        if variant.startswith("chat"):
            path = "/chat/completions"
            body = self._chat(rng, max_tokens=max_tokens, temperature=1.0, seed=rng.randrange(1 << 30))
            if variant == "chat_tools":
                body["tools"] = TOOLS
        else:
            path = "/completions"
            prompt = (f"Once upon a time, {rng.choice(WORDS)}" if rng.random() < 0.5
                      else [rng.randrange(16, 1000) for _ in range(rng.randint(8, 48))])
            body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0,
                    "n": 2 if variant == "completion_n2" else 1}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        try:
            if stream:
                async with http.stream("POST", self.url + path, json=body) as r:
                    outcome, detail = str(r.status_code), ""
                    if r.status_code == 200:
                        done, err = False, None
                        async for line in r.aiter_lines():
                            if line == "data: [DONE]":
                                done = True
                            elif line.startswith("data: ") and '"error"' in line:
                                err = line[6:]
                        if err is not None:
                            outcome, detail = "stream_error", err
                        elif not done:
                            outcome, detail = "bad_response", "no [DONE]"
                    else:
                        detail = (await r.aread()).decode(errors="replace")
            else:
                r = await http.post(self.url + path, json=body)
                outcome, detail = str(r.status_code), "" if r.status_code == 200 else r.text
                if r.status_code == 200 and not r.json().get("choices"):
                    outcome, detail = "bad_response", r.text
        except httpx.TimeoutException:
            outcome, detail = "client_timeout", ""
        except (httpx.HTTPError, ValueError) as e:
            outcome, detail = f"conn_error:{type(e).__name__}", str(e)
        if outcome == "200" and phase_latency is not None:
            phase_latency.append(time.perf_counter() - t0)
        self.count("good", variant, outcome, detail)

    async def bad(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        variant = rng.choice((*self.bad_raw, *self.bad_json, "unknown_path", "wrong_method"))
        path = "/completions" if variant == "never_fits" else "/chat/completions"
        try:
            if variant == "unknown_path":
                r = await http.post(self.url + "/no/such/route", json=self._chat(rng))
            elif variant == "wrong_method":
                r = await http.get(self.url + "/chat/completions")
            elif variant in self.bad_raw:
                r = await http.post(self.url + path, content=self.bad_raw[variant],
                                    headers={"content-type": "application/json"})
            else:
                r = await http.post(self.url + path, json=rng.choice(self.bad_json[variant]))
            outcome, detail = str(r.status_code), r.text
        except httpx.TimeoutException:
            outcome, detail = "client_timeout", ""
        except httpx.HTTPError as e:
            outcome, detail = f"conn_error:{type(e).__name__}", str(e)
        self.count("bad", variant, outcome, detail)

    async def abandoned(self, rng: random.Random) -> None:
        """Clients that hang up: a long generation (most of a lane) nobody reads."""
        variant = rng.choice(("after_send", "stream_first_chunk", "mid_body"))
        body = self._chat(rng, max_tokens=max(1, self.capacity - 128), temperature=1.0)
        if variant == "stream_first_chunk":
            body["stream"] = True
        data = json.dumps(body).encode()
        path = "/v1/chat/completions"
        if variant == "mid_body":
            parts = [data[: len(data) // 2], data[len(data) // 2:]]
            outcome, body_ = await self.raw(path, self._head(path, len(data)), parts, hang_up="mid_body",
                                            wait_s=rng.uniform(0.0, 0.2))
        else:
            outcome, body_ = await self.raw(path, self._head(path, len(data)), [data],
                                            hang_up="first_chunk" if variant == "stream_first_chunk" else "after_send",
                                            wait_s=rng.uniform(0.05, 0.3))
        self.count("abandoned", variant, outcome, body_.decode(errors="replace"))

    async def large(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        variant = rng.choice(("over_content_length", "over_expect_100", "over_chunked", "under_padded",
                              "under_long_prompt"))
        path = "/v1/chat/completions"
        if variant in ("over_content_length", "over_expect_100"):
            step, expect = 1 << 16, variant == "over_expect_100"
            parts = [self.over_body[i:i + step] for i in range(0, len(self.over_body), step)]
            outcome, body = await self.raw(path, self._head(path, len(self.over_body), expect=expect), parts,
                                           expect=expect)
            detail = body.decode(errors="replace")
        elif variant == "over_chunked":
            step = 1 << 16
            parts = [b"%x\r\n%s\r\n" % (len(c), c) for c in
                     (self.over_body[i:i + step] for i in range(0, len(self.over_body), step))] + [b"0\r\n\r\n"]
            outcome, body = await self.raw(path, self._head(path, None, chunked=True), parts)
            detail = body.decode(errors="replace")
        else:
            data = self.under_padded if variant == "under_padded" else self.under_long
            try:
                r = await http.post(self.url + "/chat/completions", content=data,
                                    headers={"content-type": "application/json"})
                outcome, detail = str(r.status_code), "" if r.status_code == 200 else r.text
            except httpx.TimeoutException:
                outcome, detail = "client_timeout", ""
            except httpx.HTTPError as e:
                outcome, detail = f"conn_error:{type(e).__name__}", str(e)
        self.count("large", variant, outcome, detail)

    # ---- phases
    def client(self, timeout: float = REQUEST_TIMEOUT_S) -> httpx.AsyncClient:
        n = self.args.soak_clients + 4
        return httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=httpx.Limits(max_connections=n,
                                                                                     max_keepalive_connections=n))

    async def run_good(self, clients: int, seconds: float, latency: list[float] | None, seed: int) -> None:
        async with self.client() as http:
            end = time.perf_counter() + seconds

            async def worker(i):
                rng = random.Random(f"good-{seed}-{i}")
                while time.perf_counter() < end:
                    await self.good(http, rng, phase_latency=latency)

            await asyncio.gather(*(worker(i) for i in range(clients)))

    async def run_soak(self, seconds: float) -> float:
        kinds = [k for k in SOAK_KINDS if self.mix[k] > 0]
        weights = [self.mix[k] for k in kinds]
        t0 = time.perf_counter()
        end = t0 + seconds
        async with self.client() as good_http, self.client() as bad_http:
            async def worker(i):
                rng = random.Random(f"soak-{i}")
                while time.perf_counter() < end:
                    kind = rng.choices(kinds, weights)[0]
                    if kind == "good":
                        await self.good(good_http, rng, phase_latency=self.latency["soak"])
                    elif kind == "bad":
                        await self.bad(bad_http, rng)
                    elif kind == "abandoned":
                        await self.abandoned(rng)
                    else:
                        await self.large(bad_http, rng)

            async def progress():
                while True:
                    await asyncio.sleep(10.0)
                    now = time.perf_counter() - t0
                    late = " (no new requests; the last ones finishing)" if now > seconds else ""
                    print(f"bench_serve: soak {now:.0f}/{seconds:.0f} s{late}: {self.progress()}", file=sys.stderr,
                          flush=True)

            beat = asyncio.ensure_future(progress())
            try:
                workers = [asyncio.ensure_future(worker(i)) for i in range(self.args.soak_clients)]
                done, pending = await asyncio.wait(workers, timeout=seconds + REQUEST_TIMEOUT_S + 30)
                for w in pending:  # a request the server never answered (counted as a client timeout)
                    w.cancel()
                for w in done:
                    w.result()
            finally:
                beat.cancel()
        return time.perf_counter() - t0

    def progress(self) -> str:
        by_kind = {k: 0 for k in SOAK_KINDS}
        server = conn = 0
        for (kind, _, outcome), n in self.counts.items():
            by_kind[kind] += n
            server += n * self.is_server_error(outcome)
            conn += n * self.is_conn_error(outcome)
        last = next((b for _, _, _, b in reversed(self.health) if b), None)
        where = f", inflight {last.get('inflight')}" if last else ""
        return (f"{sum(by_kind.values())} requests ({', '.join(f'{k} {n}' for k, n in by_kind.items())}); "
                f"{server} server errors, {conn} connection errors{where}")

    # ---- /health, polled from a thread of its own (the clients' event loop does not delay it)
    def poll_health(self, stop: threading.Event, every_s: float) -> None:
        with httpx.Client(timeout=httpx.Timeout(60.0)) as http:
            while True:
                phase, t0 = self.phase, time.perf_counter()
                try:
                    r = http.get(self.base + "/health")
                    dt = time.perf_counter() - t0
                    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else None
                    self.health.append((phase, dt, r.status_code, body))
                except httpx.HTTPError:
                    self.health.append((phase, time.perf_counter() - t0, 0, None))
                if stop.wait(max(0.0, every_s - (time.perf_counter() - t0))):
                    return

    def health_stats(self, phase: str) -> dict:
        xs = [dt for p, dt, code, _ in self.health if p == phase and code == 200]
        out = pct(xs)
        out["max"] = round(max(xs), 4) if xs else None
        out["failures"] = sum(1 for p, _, code, _ in self.health if p == phase and code != 200)
        return out


def settle(base: str, seconds: float) -> dict:
    """Polls /health until nothing is in flight, the engine runs no lane and holds no waiting
    request, or ``seconds`` pass: what it says then, and how long it took."""
    t0 = time.perf_counter()
    body: dict = {}
    with httpx.Client(timeout=httpx.Timeout(60.0)) as http:
        while True:
            try:
                body = http.get(base + "/health").json()
            except (httpx.HTTPError, ValueError):
                body = {}
            eng = body.get("engine", {})
            if body and body.get("inflight") == 0 and not eng.get("lanes_busy") and not eng.get("waiting"):
                break
            if time.perf_counter() - t0 > seconds:
                break
            time.sleep(0.1)
    eng = body.get("engine", {})
    keys = ("requests", "served", "disconnected", "rejected_413", "rejected_429", "timeouts", "errors", "aborted")
    return {"settle_s": round(time.perf_counter() - t0, 2), "inflight": body.get("inflight"),
            "lanes_busy": eng.get("lanes_busy"), "waiting": eng.get("waiting"),
            "health": {k: body.get(k) for k in keys if k in body}}


def forward_stderr(proc: subprocess.Popen, log, seen: list[str], lines: list[str]) -> threading.Thread:
    """Saves the server's stderr (the lines before its URL, then the rest) to ``log`` and
    forwards each line, prefixed, to this script's stderr."""
    for line in seen:
        log.write(line)
    lines.extend(seen)

    def pump():
        for line in proc.stderr:
            log.write(line)
            log.flush()
            lines.append(line)
            if line.strip():
                print(f"bench_serve:   server: {line.rstrip()}", file=sys.stderr, flush=True)

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    return th


def soak(args) -> None:
    t_start = time.perf_counter()
    mix = parse_mix(args.soak_mix)
    lanes = args.slots
    baseline_clients = args.soak_baseline_clients or max(1, round(args.soak_clients * mix["good"]))
    seconds = args.soak * 60.0
    print(f"bench_serve: soak: {args.preset}, one server ({lanes} lanes, capacity {args.capacity}, body limit "
          f"{args.soak_max_body_bytes:,} bytes); 3 s of /health alone, {args.soak_baseline_s:g} s of good requests "
          f"alone ({baseline_clients} clients, the baseline), then {args.soak:g} min of mixed traffic "
          f"({args.soak_clients} clients: " + ", ".join(f"{k} {v:.0%}" for k, v in mix.items()) + "), "
          f"{args.soak_settle_s:g} s to settle, SIGTERM", file=sys.stderr, flush=True)
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    log_path = Path(args.runs_dir) / f"soak_server_{time.strftime('%Y%m%d_%H%M%S')}.log"
    settings = [f"serve.max_body_bytes={args.soak_max_body_bytes}", f"tokenizer={args.soak_tokenizer}"]
    seen: list[str] = []
    proc, url = start_server(args, lanes, settings, seen)
    lines: list[str] = []
    stdout: list[str] = []  # the server's summary, read as it comes (a full pipe never blocks it)
    reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)
    reader.start()
    with open(log_path, "w", encoding="utf-8") as log:
        pump = forward_stderr(proc, log, seen, lines)
        try:
            s = Soak(url, args, lanes)
            stop = threading.Event()
            poller = threading.Thread(target=s.poll_health, args=(stop, 0.1), daemon=True)
            poller.start()
            time.sleep(3.0)  # /health alone ("quiet"), polled every 0.1 s
            stop.set()
            poller.join()
            s.phase = "warm"
            asyncio.run(s.run_good(baseline_clients, min(5.0, args.soak_baseline_s), None, seed=0))  # unmeasured
            stop = threading.Event()
            poller = threading.Thread(target=s.poll_health, args=(stop, 0.5), daemon=True)
            poller.start()
            s.phase = "baseline"
            print(f"bench_serve: soak: baseline ({args.soak_baseline_s:g} s of good requests alone)", file=sys.stderr,
                  flush=True)
            s.counts.clear()
            asyncio.run(s.run_good(baseline_clients, args.soak_baseline_s, s.latency["baseline"], seed=1))
            baseline_outcomes: dict[str, int] = {}
            for (_, _, outcome), n in s.counts.items():
                baseline_outcomes[outcome] = baseline_outcomes.get(outcome, 0) + n
            s.counts.clear()
            s.phase = "soak"
            print(f"bench_serve: soak: {args.soak:g} min of mixed traffic", file=sys.stderr, flush=True)
            wall = asyncio.run(s.run_soak(seconds))
            s.phase = "settle"
            stop.set()
            poller.join()
            end = settle(s.base, args.soak_settle_s)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=args.soak_settle_s + 180)  # the drain: serve.shutdown_timeout_s at most
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            pump.join(timeout=10)
            reader.join(timeout=10)
    out = "".join(stdout)
    err = "".join(lines)
    try:
        summary = json.loads(out)
    except ValueError:
        try:
            summary = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            summary = {}

    outcomes: dict[str, dict[str, dict[str, int]]] = {k: {} for k in SOAK_KINDS}
    by_kind: dict[str, dict[str, int]] = {k: {} for k in SOAK_KINDS}
    server_errors = conn_errors = unexpected = timeouts = 0
    for (kind, variant, outcome), n in sorted(s.counts.items()):
        outcomes[kind].setdefault(variant, {})[outcome] = n
        by_kind[kind][outcome] = by_kind[kind].get(outcome, 0) + n
        server_errors += n * s.is_server_error(outcome)
        conn_errors += n * outcome.startswith("conn_error")
        timeouts += n * (outcome == "client_timeout")
        unexpected += n * (not s.is_server_error(outcome) and not s.is_conn_error(outcome)
                           and not s.expected(kind, variant, outcome))
    total = sum(s.counts.values())
    base_lat, soak_lat = pct(s.latency["baseline"]), pct(s.latency["soak"])
    quiet, base_h, soak_h = s.health_stats("quiet"), s.health_stats("baseline"), s.health_stats("soak")
    keys = ("requests", "served", "drained", "aborted", "disconnected", "timeouts", "errors", "rejected_413",
            "rejected_429", "prefix_reuses")
    result = {
        "bench": "serve_soak", "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus", "preset": args.preset, "tokenizer": args.soak_tokenizer,
        "overrides": args.set, "minutes": args.soak, "clients": args.soak_clients, "mix": mix, "slots": lanes,
        "capacity": args.capacity, "decode_steps": args.decode_steps, "max_body_bytes": args.soak_max_body_bytes,
        "soak_s": round(wall, 1), "requests": total, "requests_per_s": round(total / wall, 2),
        "outcomes": outcomes, "by_kind": by_kind,
        "server_errors": server_errors, "connection_errors": conn_errors, "client_timeouts": timeouts,
        "unexpected": unexpected, "samples": s.samples,
        "good_latency_s": {"baseline": {**base_lat, "clients": baseline_clients, "seconds": args.soak_baseline_s,
                                        "outcomes": baseline_outcomes},
                           "soak": soak_lat, "p50_ratio": ratio(soak_lat["p50"], base_lat["p50"]),
                           "p95_ratio": ratio(soak_lat["p95"], base_lat["p95"])},
        "health_latency_s": {"quiet": quiet, "baseline": base_h, "soak": soak_h,
                             "p50_ratio_to_quiet": ratio(soak_h["p50"], quiet["p50"]),
                             "p95_ratio_to_quiet": ratio(soak_h["p95"], quiet["p95"]),
                             "p95_ratio_to_baseline": ratio(soak_h["p95"], base_h["p95"])},
        "end": end, "inflight": end["inflight"], "lanes_busy": end["lanes_busy"], "leaked_lanes": end["inflight"],
        "server": {"exit_code": proc.returncode, "traceback": "Traceback" in err,
                   "task_destroyed": "Task was destroyed" in err, "stderr_log": str(log_path),
                   "summary": {k: summary[k] for k in keys if k in summary}},
    }
    result["bars"] = {"server_errors_0": server_errors == 0, "leaked_lanes_0": end["inflight"] == 0,
                      # hostile traffic on top of good traffic: /health against the good-only baseline
                      "health_p95_ratio_to_baseline_le_2":
                          (result["health_latency_s"]["p95_ratio_to_baseline"] or 99) <= 2,
                      "clean_exit": proc.returncode == 0 and not result["server"]["traceback"]
                      and not result["server"]["task_destroyed"]}
    print(json.dumps(result), flush=True)
    print(f"bench_serve: soak: {total} requests, {server_errors} server errors, {conn_errors} connection errors, "
          f"{unexpected} unexpected answers, {end['inflight']} in flight after {end['settle_s']} s; server exit "
          f"{proc.returncode}", file=sys.stderr, flush=True)
    print(f"bench_serve: done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record them in "
          "docs/BENCHMARKS.md", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny-qwen2")
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=64, help="requests per measurement (shared by the clients)")
    ap.add_argument("--warm-requests", type=int, default=8, help="requests of the unmeasured pass (at least clients)")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per request")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--slots", type=int, default=None,
                    help="decode lanes of the batched server (default 32; with --soak: the server's, default 16)")
    ap.add_argument("--capacity", type=int, default=None, help="context per lane (default 256; with --soak 512)")
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--runs-dir", default="/tmp/jaxagent_bench_serve")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more overrides for both servers, e.g. a model shape: model.hidden_size=1024 "
                         "model.intermediate_size=4096")
    soak_group = ap.add_argument_group("soak", "--soak N: one server, N minutes of mixed traffic (good, bad, "
                                       "abandoned, large requests) instead of the throughput comparison")
    soak_group.add_argument("--soak", type=float, default=None, metavar="MINUTES",
                            help="run the soak for this many minutes (e.g. 0.1, 1, 10)")
    soak_group.add_argument("--soak-clients", type=int, default=16, help="concurrent clients of the soak")
    soak_group.add_argument("--soak-mix", default="good=60,bad=20,abandoned=10,large=10",
                            help="shares of the request kinds (kind=share, normalised): good (chat and completions, "
                                 "some streamed), bad (malformed, wrong types, unknown model, garbage tools, a lone "
                                 "surrogate, 10k-deep nesting, ...), abandoned (hang-ups), large (bodies over and "
                                 "just under --soak-max-body-bytes)")
    soak_group.add_argument("--soak-baseline-s", type=float, default=20.0,
                            help="seconds of good requests alone before the soak (the latency baseline)")
    soak_group.add_argument("--soak-baseline-clients", type=int, default=None,
                            help="clients of the baseline (default: the soak's good share of --soak-clients)")
    soak_group.add_argument("--soak-settle-s", type=float, default=5.0,
                            help="after the soak, seconds to wait for the in-flight count to return to 0")
    soak_group.add_argument("--soak-max-body-bytes", type=int, default=2**20,
                            help="the server's serve.max_body_bytes (the large bodies are sized around it)")
    soak_group.add_argument("--soak-tokenizer", default=str(ROOT / "tests" / "fixtures" / "tokenizer_qwen"),
                            help="the soak server's tokenizer (chat needs a chat template)")
    args = ap.parse_args()
    if args.soak is not None:
        if not args.soak > 0 or args.soak_clients < 1:
            ap.error("--soak: expected minutes > 0 and --soak-clients >= 1")
        args.slots = 16 if args.slots is None else args.slots
        args.capacity = 512 if args.capacity is None else args.capacity
        soak(args)
        return
    args.slots = 32 if args.slots is None else args.slots
    args.capacity = 256 if args.capacity is None else args.capacity
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

"""job=serve under a loopback load (issue 38, point 6): 64 concurrent clients against one server
(8 lanes, room for all 64 in the queue), a mix of normal and streamed requests, clients that hang
up (sockets closed or reset after sending, mid-body, streams closed after their first chunk),
slow readers (a small receive buffer, a pause after the first chunk) and, in the middle of the
load, one large body (~1.2 MB of chat text, under serve.max_body_bytes) held at its tokenisation.

Every check is by order (an event set, a count reached), not by time: `/health` and clients that
came after the large body are answered while it is still held in its worker thread; every good
request gets 200 with its answer (a stream: complete, ending in [DONE]); nothing gets a 500 and
the server logs no traceback; at the end no lane leaks (nothing in flight, no lane busy, nothing
waiting) and the summary's counts add up to the requests admitted. Deadlines are generous bounds
on a hang, never latency assertions (those belong to scripts/bench_serve.py)."""

import json
import logging
import random
import re
import socket
import struct
import threading
import time

import httpx
import pytest
from serve_helpers import MODEL, Running, tokenizer, tool_model

from jaxagent.serve.server import _EncodeVia, token_facts

SLOTS, QUEUE = 8, 64  # 8 lanes + 64 waiting: all 64 clients (and the large body) are admitted, no 429
MAX_BODY = 3 * 2**20
CAPACITY = 128  # few shapes to compile (most of the test's time): short prompts only
LONG = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 120, "temperature": 0}  # fitted model: no end token
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello, how are you?"}], "max_tokens": 12}
BIG_TEXT = "Tell me about the weather. " * 45_000  # 1.2 MB: an assistant turn, not refused by its bytes alone
BIG = {"model": MODEL, "max_tokens": 8, "messages": [
    {"role": "user", "content": "Hi."}, {"role": "assistant", "content": BIG_TEXT}, {"role": "user", "content": "And?"}]}
TIMEOUT = 180  # a bound on a hang


@pytest.fixture(scope="module")
def model():
    return tool_model()


def port_of(url: str) -> int:
    return int(re.search(r":(\d+)/", url + "/").group(1))


def wait_for(predicate, what: str, timeout: float = TIMEOUT) -> None:
    """Polls ``predicate`` until it holds (a bound on a hang, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def raw_send(port: int, path: str, body: bytes, *, upto: int | None = None) -> socket.socket:
    """A connection that has sent a request (its first ``upto`` body bytes only, when given)."""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.sendall(head + body[:upto])
    return sock


class Logged(logging.Handler):
    """Warnings and errors of the server's loggers (uvicorn's do not reach the root logger)."""

    NAMES = ("uvicorn", "uvicorn.error", "asyncio", "sse_starlette", "jaxagent")

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        for name in self.NAMES:
            logging.getLogger(name).addHandler(self)

    def emit(self, record):
        self.records.append(record)

    def remove(self):
        for name in self.NAMES:
            logging.getLogger(name).removeHandler(self)


# ----------------------------------------------------------------------------- the clients
# each returns a record: {"status": ..., "ok": whether its own checks held, "why": what failed}
def plain(url, path, body):
    r = httpx.post(url + path, json=body, timeout=TIMEOUT)
    out = {"status": r.status_code, "body": r.json()}
    choices = out["body"].get("choices") or []
    out["ok"] = r.status_code == 200 and len(choices) == 1
    if out["ok"] and path == "/completions":
        out["ok"] = out["body"]["usage"]["completion_tokens"] == body["max_tokens"] and choices[0]["finish_reason"] == "length"
    elif out["ok"]:
        msg, usage = choices[0]["message"], out["body"]["usage"]
        out["ok"] = msg["role"] == "assistant" and choices[0]["finish_reason"] in ("stop", "length") \
            and 1 <= usage["completion_tokens"] <= body["max_tokens"]
    return out


def streamed(url, path, body, *, close_after_first=False, pause=0.0, rcvbuf=None):
    """A streamed request read to its end (or closed after its first event; or paused after it,
    over a socket with a small receive buffer: a slow reader)."""
    opts = [(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)] if rcvbuf else []
    with httpx.Client(timeout=TIMEOUT, transport=httpx.HTTPTransport(socket_options=opts)) as c, \
            c.stream("POST", url + path, json={**body, "stream": True}) as resp:
        events = []
        if resp.status_code != 200:
            resp.read()
            return {"status": resp.status_code, "ok": False, "body": resp.text}
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 1 and close_after_first:
                return {"status": 200, "ok": True, "events": events}  # leaving `with`: the connection closes
            if len(events) == 1 and pause:
                time.sleep(pause)  # the server goes on writing into a full window
    out = {"status": 200, "events": events, "ok": bool(events) and events[-1] == "[DONE]"}
    chunks = [json.loads(e) for e in events[:-1]] if out["ok"] else []
    if not out["ok"] or any("error" in c for c in chunks):
        out["ok"] = False
    elif path == "/completions":
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        usage = [c["usage"] for c in chunks if c.get("usage")]
        out["ok"] = finish[-1] == "length" and usage[-1]["completion_tokens"] == body["max_tokens"]
    else:
        out["ok"] = chunks[0]["choices"][0]["delta"].get("role") == "assistant" \
            and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    return out


def hang_up(url, path, body, *, how):
    """Sends a request and goes: ``fin`` (a close after the whole body), ``rst`` (a reset after
    it), ``mid`` (a close halfway through the body)."""
    raw = json.dumps(body).encode()
    sock = raw_send(port_of(url), "/v1" + path, raw, upto=len(raw) // 2 if how == "mid" else None)
    if how == "rst":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    return {"status": None, "ok": True}


# (kind, how many, whether it must be served, the client)
MIX = [
    ("completion", 12, True, lambda u: plain(u, "/completions", {**LONG, "max_tokens": 8})),
    ("chat", 8, True, lambda u: plain(u, "/chat/completions", CHAT)),
    ("completion-stream", 12, True, lambda u: streamed(u, "/completions", {**LONG, "max_tokens": 16,
                                                                          "stream_options": {"include_usage": True}})),
    ("chat-stream", 6, True, lambda u: streamed(u, "/chat/completions", CHAT)),
    ("slow-reader", 4, True, lambda u: streamed(u, "/completions", {**LONG, "max_tokens": 64, "stream_options": {
        "include_usage": True}}, pause=0.5, rcvbuf=2048)),
    # admitted for sure (the first event is a token) and cancelled: counted `disconnected`
    ("stream-closed", 8, False, lambda u: streamed(u, "/completions", LONG, close_after_first=True)),
    # its first event (the role) comes before it is admitted: admitted or not, served or disconnected
    ("chat-stream-closed", 4, False, lambda u: streamed(u, "/chat/completions", CHAT, close_after_first=True)),
    # admitted or not (gone while prepared: never admitted); never served (120 tokens)
    ("hang-up", 6, False, lambda u: hang_up(u, "/completions", LONG, how="fin")),
    ("reset", 2, False, lambda u: hang_up(u, "/completions", LONG, how="rst")),
    ("mid-body", 2, False, lambda u: hang_up(u, "/completions", LONG, how="mid")),  # never admitted
]


def test_64_clients_with_hang_ups_slow_readers_and_a_large_body(model, monkeypatch):
    kinds = [(kind, must, fn) for kind, count, must, fn in MIX for _ in range(count)]
    assert len(kinds) == 64
    random.Random(0).shuffle(kinds)
    with Running(*model, slots=SLOTS, capacity=CAPACITY, decode_steps=4, max_queue=QUEUE, max_body_bytes=MAX_BODY) as r:
        server, url = r.server, r.url
        logged = Logged()  # after the server configured its logging (which drops handlers set before)
        assert len(json.dumps(BIG).encode()) < MAX_BODY < QUEUE * len(json.dumps(BIG).encode())
        # compiled outside the rush (the prompt lengths of both kinds)
        assert plain(url, "/completions", {**LONG, "max_tokens": 2})["ok"]
        assert plain(url, "/chat/completions", CHAT)["ok"]
        base = dict(server.stats)

        # the large body is held at its tokenisation (in its worker thread) until `release`
        facts = token_facts(tokenizer())
        held, release, where = threading.Event(), threading.Event(), []

        def encode(text):
            if len(text) >= len(BIG_TEXT):
                where.append(threading.current_thread().name)
                held.set()
                assert release.wait(TIMEOUT), "never released"
            return facts.encode(text)

        monkeypatch.setattr(server, "_render_tok", _EncodeVia(tokenizer(), encode))
        try:
            run_the_load(server, url, kinds, base, held, release, where)
        finally:
            release.set()  # a failed check leaves no worker thread held
            logged.remove()
    # nothing went wrong out of sight: no exception logged by uvicorn, asyncio or sse-starlette
    assert not logged.records, [rec.getMessage() for rec in logged.records]


def run_the_load(server, url, kinds, base, held, release, where):
    """The 64 clients, the large body held in their middle, and the checks of what came back."""
    results: dict[int, dict] = {}

    def client(i, fn):
        try:
            results[i] = fn(url)
        except Exception as e:  # noqa: BLE001 (recorded: every client's failure is reported, not just the first)
            results[i] = {"status": None, "ok": False, "why": f"{type(e).__name__}: {e}"}

    threads = [threading.Thread(target=client, args=(i, fn), name=f"client-{i}") for i, (_, _, fn) in enumerate(kinds)]
    for t in threads[:32]:
        t.start()
    wait_for(lambda: server.stats["requests"] - base["requests"] >= 8, "the load to be on (8 requests admitted)")

    big_out: dict = {}
    big = threading.Thread(target=lambda: big_out.setdefault(
        "r", httpx.post(url + "/chat/completions", json=BIG, timeout=TIMEOUT)))
    big.start()
    assert held.wait(TIMEOUT), "the large body never reached its tokenisation"
    for t in threads[32:]:  # clients that come after the large body
        t.start()
    h = httpx.get(url.removesuffix("/v1") + "/health", timeout=TIMEOUT)
    late_good = [i for i in range(32, 64) if kinds[i][1]]
    wait_for(lambda: any(results.get(i, {}).get("ok") for i in late_good),
             "a client that came after the large body to be served")
    h2 = httpx.get(url.removesuffix("/v1") + "/health", timeout=TIMEOUT)
    # (order) /health twice and a later client's answer came back while the large body is held
    assert not release.is_set() and big.is_alive() and not big_out
    assert h.status_code == 200 and h.json()["status"] == "ok" and h2.status_code == 200
    assert where and where[0].startswith("jaxagent-serve-prep")  # a worker thread, not the event loop's
    release.set()

    for t in [big, *threads]:
        t.join(TIMEOUT)
        assert not t.is_alive(), f"{t.name} hung"

    # the large body was tokenised, then refused: its ~540k tokens cannot fit a 128-token lane
    got = big_out["r"]
    assert got.status_code == 400, got.text
    assert got.json()["error"]["code"] == "context_length_exceeded" and got.json()["error"]["param"] == "messages"

    # every good client got its whole answer; nobody got a 500
    bad = {i: (kinds[i][0], results.get(i)) for i in range(64) if not results.get(i, {}).get("ok")}
    assert not bad, bad
    statuses = [res["status"] for res in results.values() if res["status"] is not None]
    assert 500 not in statuses and set(statuses) == {200}, statuses

    # no lane leaks, and the server still serves
    def idle() -> bool:
        h = httpx.get(url.removesuffix("/v1") + "/health", timeout=TIMEOUT).json()
        return (h["inflight"], h["engine"]["lanes_busy"], h["engine"]["waiting"]) == (0, 0, 0)

    wait_for(idle, "every lane freed")
    assert server.inflight == 0 and server.preparing == 0
    assert plain(url, "/completions", {**LONG, "max_tokens": 8})["ok"]

    # the counts add up: every admitted request was served or abandoned by its client
    st = {k: server.stats[k] - base[k] for k in base}
    n = {kind: count for kind, count, _, _ in MIX}
    good = sum(count for _, count, must, _ in MIX if must) + 1  # and the request after the load
    assert (st["errors"], st["timeouts"], st["aborted"], st["drained"]) == (0, 0, 0, 0), st
    assert (st["rejected_429"], st["rejected_413"]) == (0, 0), st
    assert st["requests"] == st["served"] + st["disconnected"], st
    assert good <= st["served"] <= good + n["chat-stream-closed"], st
    assert n["stream-closed"] <= st["disconnected"] <= n["stream-closed"] + n["chat-stream-closed"] + \
        n["hang-up"] + n["reset"], st
    assert st["requests"] <= 64 - n["mid-body"] + 1, st
    health = httpx.get(url.removesuffix("/v1") + "/health", timeout=TIMEOUT).json()
    assert health["errors"] == 0 and health["inflight"] == 0

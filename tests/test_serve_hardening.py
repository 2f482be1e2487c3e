"""job=serve against what clients send and how servers stop (issue 38): bodies over
serve.max_body_bytes (413 by Content-Length before reading, and while a chunked body is read),
bodies that break the JSON parser (400), prompts prepared off the event loop (/health answered
while a render is blocked), prompts refused by their bytes before tokenising, requests that could
never be admitted (400, not 429), non-streamed requests whose clients hang up (lanes freed), and
the drain on shutdown: in-flight requests finish, or are ended with a JSON 503 / an SSE error event
and [DONE]; SIGTERM under load in a real process exits 0 with no traceback.

Every check is by order (an event set, a count reached), not by time: deadlines are generous
bounds on a hang, never latency assertions (those belong to scripts/bench_serve.py)."""

import json
import re
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from jaxagent.serve.server import ServerThread, _EncodeVia, make_app, token_facts  # noqa: E402
from serve_helpers import MODEL, Running, launch_serve, make_server, tokenizer, tool_model  # noqa: E402

from conftest import FIXTURES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 256 * 1024  # the module server's serve.max_body_bytes
LONG = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 500, "temperature": 0}  # fitted model: no end token in 500


@pytest.fixture(scope="module")
def model():
    return tool_model()


@pytest.fixture(scope="module")
def running(model):
    with Running(*model, slots=2, capacity=512, max_body_bytes=LIMIT) as r:
        yield r


def port_of(url: str) -> int:
    return int(re.search(r":(\d+)/", url + "/").group(1))


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    """Polls ``predicate`` until it holds (a bound on a hang, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (status, headers, body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        assert got, f"the connection closed before a response: {data!r}"
        data += got
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    n = int(headers.get("content-length", "0"))
    while len(body) < n:
        got = sock.recv(65536)
        if not got:
            break
        body += got
    return int(lines[0].split()[1]), headers, body[:n]


def request_head(port: int, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def raw_post(port: int, path: str, body: bytes) -> socket.socket:
    """A connection that has sent one whole request (the caller reads, or hangs up)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(request_head(port, path, {"Content-Length": str(len(body))}) + body)
    return sock


def health(url: str) -> dict:
    return httpx.get(url.removesuffix("/v1") + "/health", timeout=60).json()


# ----------------------------------------------------------------------------- bodies
def test_a_body_declared_over_the_limit_gets_413_before_a_byte_is_read(running):
    port = port_of(running.url)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        # headers only: the server answers without waiting for the 10 MB it was promised
        sock.sendall(request_head(port, "/v1/chat/completions", {"Content-Length": str(10 * 2**20)}))
        status, headers, body = read_response(sock)
    err = json.loads(body)["error"]
    assert status == 413 and err["code"] == "request_too_large" and str(LIMIT) in err["message"]
    assert "max_body_bytes" in err["message"] and headers.get("connection") == "close"
    assert health(running.url)["status"] == "ok"


def test_a_chunked_body_growing_past_the_limit_gets_413_while_it_is_read(running):
    port = port_of(running.url)
    chunk = b"x" * (64 * 1024)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(request_head(port, "/v1/completions", {"Transfer-Encoding": "chunked"}))
        for _ in range(LIMIT // len(chunk) + 1):  # one chunk past the limit, and the body never ends
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, _, body = read_response(sock)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert running.server.stats["rejected_413"] >= 1


@pytest.mark.parametrize("body, message", [
    (b"[" * 100_000, "nested too deeply"),  # RecursionError in the parser
    (b'{"model": "tiny-tool", "prompt": "caf\xe9"}', "not valid UTF-8"),  # latin-1, not UTF-8
    (b"\xff\xfe{}", "not valid UTF-8"),
    (b'{"model": "tiny-tool", "prompt": [5, 6', "not valid JSON"),
], ids=["deep", "latin-1", "utf-16", "cut"])
def test_bodies_that_break_the_json_parser_get_400(running, body, message):
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = httpx.post(running.url + path.removeprefix("/v1"), content=body, timeout=60)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert httpx.post(running.url + "/completions", json={"model": MODEL, "prompt": [5, 6], "max_tokens": 1},
                      timeout=60).status_code == 200


# ----------------------------------------------------------------------------- off the event loop
def test_health_is_answered_while_a_prompt_is_rendered(running, monkeypatch):
    """A large body (200 kB, under the limit) whose render blocks (on an event, in its worker
    thread): /health and a completion of another client are answered meanwhile; once let go, the
    render refuses the prompt (it cannot fit the 512-token context)."""
    server = running.server
    entered, release = threading.Event(), threading.Event()
    render, where = server.render_chat, []

    def blocked_render(req):
        where.append(threading.current_thread().name)
        entered.set()
        assert release.wait(120), "never released"
        return render(req)

    monkeypatch.setattr(server, "render_chat", blocked_render)
    out = {}
    big = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about the weather. " * 7500}]}
    t = threading.Thread(target=lambda: out.setdefault("r", httpx.post(running.url + "/chat/completions", json=big,
                                                                       timeout=120)))
    t.start()
    assert entered.wait(60)
    h = health(running.url)  # answered while the render is still blocked
    other = httpx.post(running.url + "/completions", json={"model": MODEL, "prompt": [5, 6], "max_tokens": 2},
                       timeout=60)
    assert not release.is_set() and not out  # (order) both came back while the chat waits in its render
    assert h["status"] == "ok" and other.status_code == 200
    assert where[0].startswith("jaxagent-serve-prep")  # a worker thread, not the event loop's
    release.set()
    t.join(120)
    err = out["r"].json()["error"]
    assert out["r"].status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "messages"


def test_a_prompt_too_long_by_its_bytes_alone_is_refused_before_tokenising(running, monkeypatch):
    server = running.server
    facts = token_facts(tokenizer())
    limit = server.engine.capacity * facts.bytes_per_token

    def no_tokenising(text):
        raise AssertionError("tokenised")

    monkeypatch.setattr(server, "_encode", no_tokenising)
    monkeypatch.setattr(server, "_render_tok", _EncodeVia(tokenizer(), no_tokenising))
    text = "x" * (limit + 1)
    r = httpx.post(running.url + "/completions", json={"model": MODEL, "prompt": ["hi", text]}, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    r = httpx.post(running.url + "/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "system", "content": text[: limit // 2]},
                                                      {"role": "user", "content": text[: limit // 2 + 1]}]})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "messages"


def test_the_byte_bound_is_sound_and_the_releasing_encoder_agrees():
    tok = tokenizer()
    facts = token_facts(tok)
    assert facts.bytes_per_token is not None and facts.releases_gil  # the fixture: a byte-level BPE
    rng = np.random.default_rng(0)
    longest = max(range(tok.vocab_size), key=lambda i: len(tok.decode([i]).encode()))
    texts = [tok.decode([longest] * 50), "x" * 5000, "caf\u00e9 \U0001f600 " * 300, "<|im_start|>" * 40]
    texts += [tok.decode(rng.integers(0, tok.vocab_size, 200).tolist()) for _ in range(50)]
    for text in texts:
        ids = facts.encode(text)
        assert ids == tok.encode(text)
        assert len(ids) * facts.bytes_per_token >= len(text.encode("utf-8", "surrogatepass"))


def test_a_request_that_could_never_be_admitted_is_400_not_429(model):
    with Running(*model, slots=2, max_queue=2) as r:
        for body, param in (({"prompt": ["a", "b", "c", "d", "e"]}, "prompt"), ({"prompt": "a", "n": 5}, "n"),
                            ({"prompt": ["a", "b"], "n": 3}, "n")):
            got = httpx.post(r.url + "/completions", json={"model": MODEL, "max_tokens": 1, **body}, timeout=60)
            err = got.json()["error"]
            assert got.status_code == 400 and err["param"] == param and "at most 4" in err["message"], got.text
            streamed = httpx.post(r.url + "/completions", json={"model": MODEL, "max_tokens": 1, "stream": True,
                                                                **body}, timeout=60)
            assert streamed.status_code == 400  # refused before the stream opens
        assert r.server.stats["rejected_429"] == 0
        ok = httpx.post(r.url + "/completions", json={"model": MODEL, "prompt": ["a", "b"], "n": 2, "max_tokens": 1},
                        timeout=60)
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 4


def test_a_streamed_prompt_past_the_context_is_400_before_the_stream_opens(model):
    with Running(*model, slots=2, capacity=128) as r:
        for path, body, param in (("/chat/completions", {"messages": [{"role": "user", "content": "word " * 300}]},
                                   "messages"), ("/completions", {"prompt": list(range(5, 200))}, "prompt"),
                                  ("/completions", {"prompt": [5, 6, 7], "max_tokens": 500}, "max_tokens")):
            got = httpx.post(r.url + path, json={"model": MODEL, "max_tokens": 2, "stream": True, **body}, timeout=60)
            assert got.status_code == 400, got.text
            err = got.json()["error"]
            assert err["param"] == param and err["code"] == "context_length_exceeded", err


# ----------------------------------------------------------------------------- hang-ups
def test_abandoned_non_streamed_requests_free_their_lanes(model):
    """100 clients send a long non-streamed request and hang up once all are in flight: every one
    is cancelled in the engine, another client is served, and no lane or queue entry is left."""
    with Running(*model, slots=4, capacity=512, decode_steps=1, max_queue=100) as r:
        c = openai.OpenAI(base_url=r.url, api_key="x", max_retries=0, timeout=120)
        c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=2)  # compiled outside the rush
        port, body = port_of(r.url), json.dumps(LONG).encode()
        socks = [raw_post(port, "/v1/completions", body) for _ in range(100)]
        wait_for(lambda: r.server.inflight == 100, "100 requests in flight")
        for s in socks:
            s.close()
        assert c.completions.create(model=MODEL, prompt=[8, 9], max_tokens=2).usage.completion_tokens == 2
        def idle() -> bool:
            h = health(r.url)
            return h["inflight"] == 0 and h["engine"]["lanes_busy"] == 0 and h["engine"]["waiting"] == 0

        wait_for(idle, "the lanes freed")
        st = r.server.stats
        assert st["disconnected"] == 100 and st["served"] == 2 and st["requests"] == 102


# ----------------------------------------------------------------------------- shutdown
class Gate:
    """Holds the engine's device call (in its executor thread) until ``open()``."""

    def __init__(self, engine):
        self.engine, self.step, self.event = engine, engine._step, threading.Event()
        engine._step = self  # an instance attribute over the method, as the failure test does

    def __call__(self, admitted):
        assert self.event.wait(120), "the gate was never opened"
        return self.step(admitted)

    def open(self):
        self.event.set()
        del self.engine._step


def start(url: str, body: dict, out: list) -> threading.Thread:
    """A client in a thread: (status, JSON) of a plain request, or (status, data lines) of a stream."""
    def go():
        with httpx.Client(timeout=120) as c:
            if body.get("stream"):
                with c.stream("POST", url + "/completions", json=body) as resp:
                    out.append((resp.status_code, [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]))
            else:
                resp = c.post(url + "/completions", json=body)
                out.append((resp.status_code, resp.json()))

    t = threading.Thread(target=go)
    t.start()
    return t


def test_a_drain_lets_in_flight_requests_finish(model):
    server = make_server(*model, slots=2, capacity=512, decode_steps=1)
    thread = ServerThread(make_app(server), shutdown_timeout_s=60)
    gate = Gate(server.engine)
    out: list = []
    clients = [start(thread.url, {**LONG, "max_tokens": 16}, out),
               start(thread.url, {**LONG, "max_tokens": 16, "stream": True}, out)]
    wait_for(lambda: server.inflight == 2, "two requests in flight")
    stopper = threading.Thread(target=thread.stop)
    stopper.start()
    wait_for(lambda: server.closing, "the drain to begin")
    gate.open()  # (order) the requests decode only once the server is stopping
    for t in clients + [stopper]:
        t.join(120)
    plain = next(body for status, body in out if isinstance(body, dict))
    events = next(body for status, body in out if isinstance(body, list))
    assert all(status == 200 for status, _ in out) and plain["usage"]["completion_tokens"] == 16
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert (server.stats["drained"], server.stats["aborted"], server.stats["served"]) == (2, 0, 0)


def test_past_the_drain_deadline_requests_are_ended_with_503_and_an_error_event(model):
    server = make_server(*model, slots=2, capacity=512, decode_steps=1)
    thread = ServerThread(make_app(server), shutdown_timeout_s=0.5)
    gate = Gate(server.engine)
    out: list = []
    clients = [start(thread.url, {**LONG, "stream": i % 2 == 1}, out) for i in range(8)]
    port = port_of(thread.url)
    slow = socket.create_connection(("127.0.0.1", port), timeout=60)  # a body that never arrives whole
    slow.sendall(request_head(port, "/v1/completions", {"Content-Length": "1000"}) + b'{"model": ')
    wait_for(lambda: server.inflight == 8 and server.preparing == 1, "eight requests in flight, one uploading")
    stopper = threading.Thread(target=thread.stop)
    stopper.start()
    wait_for(lambda: server.stats["aborted"] == 8, "the drain's deadline to end them")
    gate.open()  # (order) nothing decoded before the deadline ended them all
    for t in clients + [stopper]:
        t.join(120)
    status, _, body = read_response(slow)
    slow.close()
    assert status == 503 and json.loads(body)["error"]["code"] == "server_shutdown"
    assert len(out) == 8
    for status, body in out:
        if isinstance(body, dict):
            assert status == 503 and body["error"]["code"] == "server_shutdown"
        else:
            assert status == 200 and body[-1] == "[DONE]" and json.loads(body[-2])["error"]["code"] == "server_shutdown"
    assert server.inflight == 0 and server.stats["requests"] == 8


def test_sigterm_under_load_ends_every_request_cleanly(tmp_path):
    """A real `job=serve` process: 12 long requests (half streamed) in flight, SIGTERM with a 1 s
    drain: each ends with its answer, a JSON 503 or an SSE error event and [DONE]; the process
    exits 0, its summary's counts add up, and stderr holds no traceback or pending-task warning."""
    proc, url, lines = launch_serve(tmp_path, f"tokenizer={FIXTURES / 'tokenizer_qwen'}", "rollout.slots=2",
                                    "rollout.capacity=512", "rollout.decode_steps=1", "serve.shutdown_timeout_s=1")
    try:
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 500, "temperature": 0}
        assert httpx.post(url + "/completions", json={**body, "max_tokens": 2}, timeout=120).status_code == 200
        out: list = []
        clients = [start(url, {**body, "stream": i % 2 == 1}, out) for i in range(12)]
        wait_for(lambda: health(url)["inflight"] == 12, "twelve requests in flight")
        proc.send_signal(signal.SIGTERM)
        for t in clients:
            t.join(120)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = "".join(lines) + stderr
    assert proc.returncode == 0, stderr
    for bad in ("Traceback", "Task was destroyed", "timeout graceful shutdown exceeded", "ASGI callable"):
        assert bad not in stderr, stderr
    assert len(out) == 12
    ended = 0
    for status, got in out:
        if isinstance(got, dict):
            assert (status, "choices" in got) == (200, True) or (status, got["error"]["code"]) == (503, "server_shutdown")
            ended += status == 503
        else:
            last = json.loads(got[-2])
            assert status == 200 and got[-1] == "[DONE]", got[-3:]
            assert last.get("error", {}).get("code") == "server_shutdown" or last["choices"][0]["finish_reason"]
            ended += "error" in last
    summary = json.loads(stdout)
    assert summary["requests"] == 13 and summary["served"] + summary["drained"] + summary["aborted"] == 13
    assert summary["aborted"] == ended >= 1  # 12 x 500 tokens on 2 lanes: 3,000 engine calls cannot fit in 1 s
    assert f"{summary['aborted']} aborted" in stderr and "stopped (SIGTERM)" in stderr

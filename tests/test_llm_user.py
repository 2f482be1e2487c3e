"""LLM user simulator over HTTP: a real OpenAI-compatible server on 127.0.0.1 (an ephemeral port)
started in a thread by each test, with faults injected per request."""

from __future__ import annotations

import asyncio
import gc
import collections
import json
import logging
import socket
import threading
import time
import urllib.parse
import warnings
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler

import pytest

from jaxagent.envs.llm_user import (LLMUserClient, LLMUserConfig, SimulatorError, UserReply, env_proxy,
                                    parse_retry_after)
from jaxagent.envs.user_prompt import ProfileError
from tests.loopback import LoopbackServer

SECRET = "sk-test-SECRET-7f3a9c"
PROFILE = {"instructions": "You want to return order #W123 because the shoes are too small."}
CONVERSATION = [
    {"role": "system", "content": "You are a retail agent. POLICY-TEXT"},
    {"role": "user", "content": "Hi, I want to return something.", "reaction": "inform"},
    {"role": "assistant", "content": "<think>secret plan</think>Sure, which order?",
     "tool_calls": None},
    {"role": "assistant", "content": None,
     "tool_calls": [{"type": "function", "function": {"name": "find_user", "arguments": "{}"}}]},
    {"role": "tool", "content": "TOOL-RESULT user_id=42"},
    {"role": "assistant", "content": "I found your account."},
]


def ok_content(n: int) -> str:
    return json.dumps({"utterance": f"reply {n}", "strategy": "inform"})


class FakeServer(LoopbackServer):
    """An OpenAI-compatible /chat/completions server; ``faults`` is consumed one per request."""

    def __init__(self):
        self.faults: collections.deque = collections.deque()
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.inflight = 0
        self.max_inflight = 0
        self.delay_s = 0.0
        self.release = threading.Event()  # set at teardown to end sleeping handlers
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def _send(self, status, body: bytes, headers=None, length=None):
                self.send_response_only(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body) if length is None else length))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                try:
                    self.end_headers()
                    self.wfile.write(body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    self.close_connection = True

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with server.lock:
                    n = len(server.requests)
                    server.requests.append({"t": time.monotonic(), "path": self.path,
                                            "headers": dict(self.headers.items()), "body": json.loads(raw)})
                    fault = server.faults.popleft() if server.faults else ("ok",)
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                try:
                    if server.delay_s:
                        server.release.wait(server.delay_s)
                    self._handle(n, fault)
                finally:
                    with server.lock:
                        server.inflight -= 1

            def _handle(self, n, fault):
                kind = fault[0]
                if kind == "sleep":  # longer than the client's read timeout
                    server.release.wait(fault[1])
                    kind, fault = "ok", ("ok",)
                if urllib.parse.urlsplit(self.path).path != "/v1/chat/completions":  # absolute when proxied
                    return self._send(404, b'{"error": "not found"}')
                if kind == "ok" or kind == "content":
                    content = ok_content(n) if kind == "ok" else fault[1]
                    body = {"id": f"c{n}", "object": "chat.completion",
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": content}}]}
                    return self._send(200, json.dumps(body).encode())
                if kind == "status":
                    _, code, headers = fault
                    return self._send(code, json.dumps({"error": {"message": f"injected {code}"}}).encode(), headers)
                if kind == "echo_auth":  # a server that echoes the key back in its error
                    msg = f"Incorrect API key provided: {self.headers.get('Authorization')}"
                    return self._send(401, json.dumps({"error": {"message": msg}}).encode())
                if kind == "truncate":  # promises more bytes than it sends, then hangs up
                    self.close_connection = True
                    return self._send(200, b'{"id": "c", "choices": [{"mess', length=400)
                if kind == "nonjson":
                    return self._send(200, b"<html>502 Bad Gateway</html>")
                if kind == "cut_json":  # complete HTTP body, truncated JSON
                    return self._send(200, b'{"id": "c", "choices": [{"message": {"content": "hi')
                if kind == "no_choices":
                    return self._send(200, b'{"object": "error", "message": "overloaded"}')
                raise AssertionError(f"unknown fault {fault}")

        self._serve(Handler)


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def make_config(base_url: str, **kw) -> LLMUserConfig:
    defaults = {"model": "sim-model", "temperature": 0.3, "connect_timeout_s": 1.0, "read_timeout_s": 1.0,
                "max_retries": 3, "backoff_base_s": 0.01, "backoff_max_s": 0.05, "trust_env": False, "seed": 0}
    return LLMUserConfig(base_url=base_url, **{**defaults, **kw})


def run(config: LLMUserConfig, conversation=CONVERSATION, profile=PROFILE) -> UserReply:
    async def go():
        async with LLMUserClient(config) as client:
            return await client.respond(conversation, profile)
    return asyncio.run(go())


# ----------------------------------------------------------------------------- requests and roles


def test_request_shape_and_role_flipping(server):
    reply = run(make_config(server.base_url + "/"))
    assert reply == UserReply("reply 0", "inform", False, None, 1, reply.latency_s, ok_content(0))
    assert 0 < reply.latency_s < 5
    (req,) = server.requests
    assert req["path"] == "/v1/chat/completions"
    body = req["body"]
    assert body["model"] == "sim-model" and body["temperature"] == 0.3 and body["max_tokens"] == 512
    assert "Authorization" not in req["headers"]
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert PROFILE["instructions"] in msgs[0]["content"] and "###STOP###" in msgs[0]["content"]
    assert '{"utterance"' in msgs[0]["content"]  # the doubled braces became literal JSON
    # the agent's greeting opens (the user would otherwise speak first)
    assert msgs[1] == {"role": "user", "content": "Hi! How can I help you today?"}
    # the user's own past turn, in its reply format
    assert json.loads(msgs[2]["content"]) == {"utterance": "Hi, I want to return something.", "strategy": "inform"}
    # two agent texts merged; thinking, tool calls, tool results and the agent's system prompt hidden
    assert msgs[3]["content"] == "Sure, which order?\n\nI found your account."
    text = json.dumps(msgs)
    for hidden in ("POLICY-TEXT", "TOOL-RESULT", "secret plan", "find_user"):
        assert hidden not in text


def test_config_validation():
    good = {"base_url": "http://127.0.0.1:1/v1", "model": "m"}
    assert LLMUserConfig(**good, stop_markers=["A"]).stop_markers == ("A",)
    for field, value, match in [
        ("base_url", "127.0.0.1:8000", "base_url='127.0.0.1:8000'"),
        ("model", "", "model=''"),
        ("temperature", -0.1, "temperature=-0.1"),
        ("max_concurrency", 0, "max_concurrency=0"),
        ("read_timeout_s", 0, "read_timeout_s=0"),
        ("max_retries", -1, "max_retries=-1"),
        ("backoff_max_s", 0.1, "backoff_max_s=0.1"),
        ("stop_markers", "###STOP###", "stop_markers="),
        ("system_prompt", "Hi {0}", r"field \{0\}"),
        ("system_prompt", "Hi {a.__class__}", "plain name"),
        ("system_prompt", "Hi {", "not a valid str.format template"),
    ]:
        with pytest.raises(ValueError, match=match):
            LLMUserConfig(**{**good, field: value, **({"backoff_base_s": 1.0} if field == "backoff_max_s" else {})})
    # a key pasted into api_key_env is refused without being echoed
    with pytest.raises(ValueError) as e:
        LLMUserConfig(**good, api_key_env=SECRET)
    assert SECRET not in str(e.value) and "NAME of an environment variable" in str(e.value)


def test_missing_key_variable(monkeypatch):
    monkeypatch.delenv("JAXAGENT_TEST_NO_SUCH_KEY", raising=False)
    config = LLMUserConfig(base_url="http://127.0.0.1:1/v1", model="m", api_key_env="JAXAGENT_TEST_NO_SUCH_KEY")
    with pytest.raises(ValueError, match="JAXAGENT_TEST_NO_SUCH_KEY.*unset or empty"):
        LLMUserClient(config)


# ----------------------------------------------------------------------------- the API key


def test_api_key_sent_but_never_logged_or_shown(server, monkeypatch, caplog):
    monkeypatch.setenv("JAXAGENT_TEST_KEY", SECRET)
    caplog.set_level(logging.DEBUG)  # every logger, aiohttp's included
    config = make_config(server.base_url, api_key_env="JAXAGENT_TEST_KEY", max_retries=1)
    server.faults.extend([("status", 500, {}), ("ok",), ("echo_auth",)])

    async def go():
        async with LLMUserClient(config) as client:
            reply = await client.respond(CONVERSATION, PROFILE)
            with pytest.raises(SimulatorError) as err:
                await client.respond(CONVERSATION, PROFILE)
            return client, reply, err.value
    client, reply, err = asyncio.run(go())
    assert [r["headers"]["Authorization"] for r in server.requests] == [f"Bearer {SECRET}"] * 3
    assert reply.attempts == 2 and err.status == 401 and err.attempts == 1
    assert "Incorrect API key provided: Bearer ***" in str(err)
    assert any("retrying" in r.getMessage() for r in caplog.records)
    assert len(caplog.records) > 0
    for record in caplog.records:
        assert SECRET not in record.getMessage() and SECRET not in str(record.args)
    assert SECRET not in caplog.text
    for obj in (client, config, reply, err, err.body_excerpt, err.reason, client.__dict__):
        assert SECRET not in repr(obj) and SECRET not in str(obj)


# ----------------------------------------------------------------------------- faults and retries


@pytest.mark.parametrize("fault", [
    ("status", 500, {}), ("status", 502, {}), ("status", 503, {}), ("truncate",), ("nonjson",),
    ("cut_json",), ("no_choices",), ("sleep", 3.0),
])
def test_transient_fault_is_retried(server, fault):
    server.faults.extend([fault, fault])
    reply = run(make_config(server.base_url, read_timeout_s=0.3))
    assert reply.attempts == 3 and len(server.requests) == 3
    assert reply.utterance == "reply 2" and reply.parse_error is None


def test_retry_after_seconds_is_honoured(server, caplog):
    caplog.set_level(logging.WARNING)
    server.faults.extend([("status", 429, {"Retry-After": "0.3"}), ("status", 503, {"Retry-After": "0.2"})])
    reply = run(make_config(server.base_url))
    assert reply.attempts == 3
    t = [r["t"] for r in server.requests]
    assert t[1] - t[0] >= 0.3 and t[2] - t[1] >= 0.2  # backoff alone would be <= 0.05 s
    assert reply.latency_s >= 0.5
    assert sum("Retry-After" in r.getMessage() for r in caplog.records) == 2


def test_retry_after_http_date_and_cap(server):
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after(format_datetime(now + timedelta(seconds=7), usegmt=True), now=now) == 7.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=7), usegmt=True), now=now) == 0.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("-3") is None and parse_retry_after("soon") is None and parse_retry_after(None) is None
    # an HTTP date a second or two ahead is waited for; a huge Retry-After is capped
    server.faults.extend([("status", 429, {"Retry-After": "3600"})])
    reply = run(make_config(server.base_url, retry_after_max_s=0.2))
    t = [r["t"] for r in server.requests]
    assert reply.attempts == 2 and 0.2 <= t[1] - t[0] < 2.0


def test_backoff_is_full_jitter_within_bounds():
    client = LLMUserClient(make_config("http://127.0.0.1:1/v1", backoff_base_s=0.5, backoff_max_s=4.0))
    try:
        for k, cap in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (10, 4.0), (500, 4.0)]:
            delays = [client.backoff_delay(k) for _ in range(200)]
            assert all(0 <= d <= cap for d in delays) and max(delays) > cap * 0.8 and min(delays) < cap * 0.2
        assert all(client.backoff_delay(0, retry_after=2.5) >= 2.5 for _ in range(50))
    finally:
        asyncio.run(client.aclose())


@pytest.mark.parametrize("fault", [("status", 500, {}), ("status", 429, {"Retry-After": "0"}), ("truncate",)])
def test_persistent_fault_raises_after_max_retries(server, fault):
    server.faults.extend([fault] * 10)
    with pytest.raises(SimulatorError, match="failed after 3 attempts") as e:
        run(make_config(server.base_url, max_retries=2))
    assert e.value.attempts == 3 and len(server.requests) == 3
    assert e.value.status == (None if fault[0] == "truncate" else fault[1])


def test_persistent_timeout_raises(server):
    server.faults.extend([("sleep", 3.0)] * 3)
    t0 = time.monotonic()
    with pytest.raises(SimulatorError, match="timeout") as e:
        run(make_config(server.base_url, read_timeout_s=0.2, max_retries=1))
    assert e.value.attempts == 2 and e.value.status is None and time.monotonic() - t0 < 2.0


def test_connection_refused_is_retried_then_raises():
    with socket.socket() as s:  # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SimulatorError, match="Cannot connect") as e:
        run(make_config(f"http://127.0.0.1:{port}/v1", max_retries=2))
    assert (e.value.attempts, e.value.kind, e.value.status) == (3, "connection", None)


@pytest.mark.parametrize("code", [400, 401, 404, 422])
def test_other_4xx_not_retried(server, code):
    server.faults.extend([("status", code, {})] * 3)
    with pytest.raises(SimulatorError, match=rf"HTTP {code} \(not retried\).*injected {code}") as e:
        run(make_config(server.base_url))
    assert e.value.status == code and e.value.attempts == 1 and len(server.requests) == 1
    assert f"injected {code}" in e.value.body_excerpt


# ----------------------------------------------------------------------------- replies


@pytest.mark.parametrize("content,utterance,strategy,error", [
    ('```json\n{"utterance": "It is order W1", "strategy": "inform",}\n```', "It is order W1", "inform", None),
    ("{'utterance': 'No, the blue one', 'strategy': 'correct'}", "No, the blue one", "correct", None),
    ('Sure. {"utterance": "Yes please", "strategy": "accept"} Thanks', "Yes please", "accept", None),
    ('{"utterance": "I would like to ret', "I would like to ret", None, "malformed JSON reply"),
    ("I just want my money back.", "I just want my money back.", None, "no JSON object in reply"),
])
def test_malformed_inner_json_falls_back(server, content, utterance, strategy, error):
    server.faults.append(("content", content))
    reply = run(make_config(server.base_url))
    assert (reply.utterance, reply.strategy, reply.parse_error, reply.stop) == (utterance, strategy, error, False)
    assert reply.attempts == 1 and reply.raw == content  # a malformed inner reply is not retried


@pytest.mark.parametrize("content", [
    '{"utterance": "Thanks, that is all. ###STOP###", "strategy": "accept"}',
    '{"utterance": "###STOP###", "strategy": "done"}',
    "Thanks! ###STOP###",
])
def test_stop_markers(server, content):
    server.faults.append(("content", content))
    reply = run(make_config(server.base_url))
    assert reply.stop is True and "###STOP###" not in reply.utterance
    assert reply.utterance in ("Thanks, that is all.", "", "Thanks!")


def test_custom_stop_marker(server):
    server.faults.extend([("content", '{"utterance": "bye <DONE>", "strategy": "x"}'), ("ok",)])
    config = make_config(server.base_url, stop_markers=("<DONE>", "###STOP###"))

    async def go():
        async with LLMUserClient(config) as client:
            return [await client.respond(CONVERSATION, PROFILE) for _ in range(2)]
    first, second = asyncio.run(go())
    assert (first.stop, first.utterance, second.stop) == (True, "bye", False)
    assert "<DONE>" in server.requests[0]["body"]["messages"][0]["content"]


# ----------------------------------------------------------------------------- concurrency


def test_concurrency_limit_holds(server):
    server.delay_s = 0.1
    config = make_config(server.base_url, max_concurrency=3)

    async def go():
        async with LLMUserClient(config) as client:
            return await asyncio.gather(*[client.respond(CONVERSATION, PROFILE) for _ in range(10)])
    t0 = time.monotonic()
    replies = asyncio.run(go())
    elapsed = time.monotonic() - t0
    assert len(server.requests) == 10 and all(r.attempts == 1 for r in replies)
    assert server.max_inflight == 3
    assert elapsed >= 0.35  # ceil(10 / 3) rounds of 0.1 s
    assert sorted(r.utterance for r in replies) == sorted(f"reply {n}" for n in range(10))


def test_profile_error_before_any_request(server):
    with pytest.raises(ProfileError, match="'instructions'"):
        run(make_config(server.base_url), profile={"name": "Ann"})
    assert server.requests == []


def test_closed_client_refuses():
    async def go():
        client = LLMUserClient(make_config("http://127.0.0.1:1/v1"))
        await client.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await client.respond(CONVERSATION, PROFILE)
    asyncio.run(go())


def test_trust_env_sends_through_the_environments_proxy(server, monkeypatch):
    """trust_env=True: HTTP_PROXY names our loopback server, so a call to a host that does not
    resolve reaches it as a proxy request (absolute URI); NO_PROXY exempts a host; trust_env=False
    ignores the environment."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
                 "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.port}")
    far = "http://simulator.invalid/v1"
    assert (env_proxy(far), env_proxy("https://simulator.invalid/v1")) == (f"http://127.0.0.1:{server.port}", None)
    reply = run(make_config(far, trust_env=True, max_retries=0))
    assert reply.utterance == "reply 0"
    assert server.requests[0]["path"] == far + "/chat/completions"
    with pytest.raises(SimulatorError) as e:  # the environment ignored: the name does not resolve
        run(make_config(far, trust_env=False, max_retries=0))
    assert e.value.kind == "connection" and len(server.requests) == 1
    monkeypatch.setenv("NO_PROXY", "simulator.invalid")
    assert env_proxy(far) is None


def test_session_closed_with_its_event_loop(server):
    """A loop that ends closes its HTTP session there (asyncio.run finalises the client's closer):
    no socket is left for the garbage collector to close, and the next loop gets a new session."""
    client = LLMUserClient(make_config(server.base_url, max_retries=0))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        asyncio.run(client.respond(CONVERSATION, PROFILE))
        first = client._http
        assert first is not None and first.closed
        asyncio.run(client.respond(CONVERSATION, PROFILE))
        assert client._http is not first and client._http.closed
        gc.collect()
    assert [w for w in seen if issubclass(w.category, ResourceWarning)] == []


def test_client_serves_successive_event_loops(server):
    """A job runs each evaluation in its own asyncio.run: the same client must keep working (its
    connection pool and semaphore are rebound to the new loop, not reused from a closed one)."""
    client = LLMUserClient(make_config(server.base_url, max_retries=0))
    replies = [asyncio.run(client.respond(CONVERSATION, PROFILE)) for _ in range(3)]
    assert [r.utterance for r in replies] == ["reply 0", "reply 1", "reply 2"]
    assert all(r.attempts == 1 for r in replies)
    asyncio.run(client.aclose())
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(client.respond(CONVERSATION, PROFILE))

"""job=serve's server through the official `openai` client: plain, streamed and tool-calling chats,
completions, n and seeds, stop strings, errors naming their field, the API key (401), the queue
(429 with Retry-After), timeouts (504), prefix reuse across turns and batching of concurrent
clients. The model is tiny-qwen2 fitted to answer one tool chat (tests/serve_helpers.py)."""

import asyncio
import dataclasses
import json
import threading
import time

import httpx
import jax
import pytest

openai = pytest.importorskip("openai")

from jaxagent.models.generate import SamplingParams  # noqa: E402
from jaxagent.rollout.engine import GenerationEngine  # noqa: E402
from jaxagent.serve.streaming import visible  # noqa: E402
from serve_helpers import (ANSWER, CALL_TEXT, MODEL, THINKING, TOOL_CHAT, TOOLS, Running, prompt_of,  # noqa: E402
                           tokenizer, tool_model, tool_prompt)

HELLO = [{"role": "user", "content": "Hello there, how are you?"}]


@pytest.fixture(scope="module")
def model():
    return tool_model()


@pytest.fixture(scope="module")
def running(model):
    with Running(*model, slots=4, capacity=512) as r:
        yield r


@pytest.fixture()
def client(running):
    return openai.OpenAI(base_url=running.url, api_key="unused", max_retries=0, timeout=120)


def engine_greedy(model, prompt, max_new):
    """Our engine, called directly: the reference the server's answers are compared with."""
    cfg, params = model
    engine = GenerationEngine(params, cfg, slots=1, capacity=512, vocab_limit=tokenizer().vocab_size)
    sp = SamplingParams(temperature=0.0, max_new_tokens=max_new, stop_tokens=tokenizer().eos_token_ids)
    return asyncio.run(engine.generate("ref", prompt, sp, jax.random.key(0))).tokens


def test_models_and_health(client, running):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(running.url.removesuffix("/v1") + "/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL


def test_a_plain_chat_is_the_engines_greedy_answer(client, model):
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    prompt = prompt_of(HELLO)
    ref = engine_greedy(model, prompt, 12)
    body = ref[:-1] if ref[-1] in tokenizer().eos_token_ids else ref
    want = visible(tokenizer().decode(body), thinking=True, opened=False, tools=False, final=True)
    assert r.choices[0].message.content == want.content
    assert r.choices[0].finish_reason == ("stop" if len(ref) < 12 else "length")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), len(ref))
    assert r.usage.total_tokens == len(prompt) + len(ref)


def test_a_tool_call_comes_back_as_tool_calls_with_the_thinking_apart(client):
    r = client.chat.completions.create(model=MODEL, messages=TOOL_CHAT, tools=TOOLS, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.model_extra["reasoning_content"] == THINKING
    assert r.usage.completion_tokens == len(tokenizer().encode(ANSWER)) + 1  # and the end-of-turn token
    # tool_choice=none: the tools are not shown and nothing is parsed (the model, shown no tools, answers otherwise)
    r = client.chat.completions.create(model=MODEL, messages=TOOL_CHAT, tools=TOOLS, tool_choice="none",
                                       temperature=0, max_tokens=8)
    assert r.choices[0].message.tool_calls is None


def test_a_streamed_tool_call(client):
    stream = client.chat.completions.create(model=MODEL, messages=TOOL_CHAT, tools=TOOLS, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    reasoning, content, calls, finish, usage, chunks = "", "", [], None, None, 0
    for chunk in stream:
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert reasoning == THINKING and content == "" and finish == "tool_calls"
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [(0, "get_weather", {"city": "Paris"})]
    assert usage.completion_tokens == len(tokenizer().encode(ANSWER)) + 1
    assert usage.prompt_tokens == len(tool_prompt())
    assert chunks >= 4  # role, reasoning deltas, the call, the finish, the usage


def test_streamed_text_equals_the_unstreamed_answer_at_the_same_seed(client):
    kwargs = dict(model=MODEL, messages=HELLO, max_tokens=24, temperature=1.0, seed=11)
    whole = client.chat.completions.create(**kwargs).choices[0]
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(**kwargs, stream=True)
             if c.choices]
    assert "".join(parts) == whole.message.content


def test_n_choices_and_seeds(client):
    kwargs = dict(model=MODEL, messages=HELLO, max_tokens=16, temperature=1.0, n=3)
    a = client.chat.completions.create(**kwargs, seed=7)
    b = client.chat.completions.create(**kwargs, seed=7)
    c = client.chat.completions.create(**kwargs, seed=8)
    texts = lambda r: [ch.message.content for ch in sorted(r.choices, key=lambda ch: ch.index)]  # noqa: E731
    assert [ch.index for ch in a.choices] == [0, 1, 2]
    assert texts(a) == texts(b)
    assert texts(a) != texts(c)
    assert len(set(texts(a))) > 1  # each choice draws its own key
    assert a.usage.prompt_tokens == len(prompt_of(HELLO))  # the prompt counted once, as OpenAI does


def test_completions_with_token_ids_logprobs_and_a_stop_string(client):
    ids = tool_prompt()
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=60, temperature=0, logprobs=0)
    ch = r.choices[0]
    assert ch.text == ANSWER and ch.finish_reason == "stop"
    assert len(ch.logprobs.token_logprobs) == r.usage.completion_tokens
    assert max(ch.logprobs.token_logprobs) <= 0 and min(ch.logprobs.token_logprobs) > -0.5  # the fitted answer
    assert "".join(ch.logprobs.tokens[:-1]) == ANSWER
    cut = client.completions.create(model=MODEL, prompt=ids, max_tokens=60, temperature=0, stop=["Paris", "zzz"])
    assert cut.choices[0].text == ANSWER[: ANSWER.index("Paris")] and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < r.usage.completion_tokens  # generation ended at the stop string
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=ids, max_tokens=60, temperature=0, stop=["Paris"], stream=True) if c.choices)
    assert streamed == cut.choices[0].text
    # a chat with a stop string inside the call: the call is unclosed, so the text comes back as content
    r = client.chat.completions.create(model=MODEL, messages=TOOL_CHAT, tools=TOOLS, temperature=0, stop=["Paris"])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == CALL_TEXT[: CALL_TEXT.index("Paris")].strip()


@pytest.mark.parametrize("kwargs, status, param", [
    ({"temperature": 3}, 400, "temperature"),
    ({"max_tokens": 10_000}, 400, "max_tokens"),
    ({"n": 99}, 400, "n"),
    ({"tool_choice": "required", "tools": TOOLS}, 400, "tool_choice"),
    ({"model": "gpt-4o"}, 404, "model"),
    ({"messages": [{"role": "user", "content": "x" * 3000}]}, 400, "messages"),  # past the 512-token context
])
def test_bad_requests_get_openai_errors_naming_the_field(client, kwargs, status, param):
    args = {"model": MODEL, "messages": HELLO, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(**args)
    assert e.value.status_code == status
    err = e.value.body if "message" in e.value.body else e.value.body["error"]
    assert err["param"] == param and param in err["message"]


def test_unknown_routes_and_bad_json_are_openai_errors(running):
    base = running.url
    r = httpx.post(base + "/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["message"] == "the request body is not valid JSON"
    r = httpx.get(base + "/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.get(base + "/chat/completions").status_code == 405


def test_an_api_key_is_required_when_set(model):
    with Running(*model, api_key="s3cret") as r:
        bad = openai.OpenAI(base_url=r.url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        assert httpx.post(r.url + "/chat/completions", json={}).status_code == 401  # no header at all
        good = openai.OpenAI(base_url=r.url, api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2).usage.completion_tokens >= 1
        assert httpx.get(r.url.removesuffix("/v1") + "/health").status_code == 200  # health stays open


def test_a_full_queue_answers_429_with_retry_after(model):
    with Running(*model, slots=1, max_queue=0, decode_steps=1, retry_after_s=3) as r:
        c = openai.OpenAI(base_url=r.url, api_key="x", max_retries=0, timeout=120)
        started = threading.Event()
        out = {}

        def long_request():
            started.set()
            out["r"] = c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=300, temperature=0)

        t = threading.Thread(target=long_request)
        t.start()
        started.wait()
        deadline = time.monotonic() + 60
        while r.server.inflight == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        with pytest.raises(openai.RateLimitError) as e:
            c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        assert e.value.status_code == 429 and e.value.response.headers["retry-after"] == "3"
        assert e.value.code == "queue_full"
        t.join()
        assert out["r"].usage.completion_tokens == 300 and r.server.stats["rejected_429"] == 1


def test_a_request_past_its_timeout_is_cancelled_with_504(model):
    with Running(*model, slots=2, decode_steps=1) as r:
        c = openai.OpenAI(base_url=r.url, api_key="x", max_retries=0, timeout=60)
        c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=2)  # compiled before the clock matters
        settings = r.server.settings
        r.server.settings = dataclasses.replace(settings, request_timeout_s=0.5)
        with pytest.raises(openai.APIStatusError) as e:
            c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=500, temperature=0)  # no end token in 300
        assert e.value.status_code == 504 and e.value.code == "request_timeout"
        with pytest.raises(openai.APIError, match="request_timeout_s"):  # streamed: an error event ends the stream
            for _ in c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=500, temperature=0, stream=True):
                pass
        assert r.server.inflight == 0 and r.server.stats["timeouts"] == 2
        # both lanes were freed (with a lane still held, a third request would wait for ever)
        r.server.settings = settings
        assert c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=1).usage.completion_tokens == 1
        assert all(req is None for req in r.server.engine.running)


def test_the_next_turn_of_a_conversation_reuses_its_prefix(model):
    with Running(*model, slots=2, capacity=512) as r:
        c = openai.OpenAI(base_url=r.url, api_key="x", max_retries=0, timeout=120)
        first = c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0)
        before = r.server.engine.stats["prefill_tokens"]
        turn2 = HELLO + [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "And tomorrow?"}]
        second = c.chat.completions.create(model=MODEL, messages=turn2, max_tokens=8, temperature=0)
        prefilled = r.server.engine.stats["prefill_tokens"] - before
        assert second.usage.prompt_tokens == len(prompt_of(turn2))
        assert prefilled < second.usage.prompt_tokens - len(prompt_of(HELLO)) + 8  # only the new turn, about
        assert r.server.sessions.reused == 1


def test_concurrent_clients_are_decoded_together(model):
    with Running(*model, slots=4, capacity=512, decode_steps=4) as r:
        c = openai.OpenAI(base_url=r.url, api_key="x", max_retries=0, timeout=120)
        c.completions.create(model=MODEL, prompt=[5, 6], max_tokens=4)  # compile outside the measured part
        calls0 = r.server.engine.stats["engine_calls"]
        results = [None] * 4

        def ask(i):
            results[i] = c.completions.create(model=MODEL, prompt=[5 + i, 6], max_tokens=32, temperature=1.0, seed=i)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tokens = sum(x.usage.completion_tokens for x in results)
        calls = r.server.engine.stats["engine_calls"] - calls0
        # one after another: one call per 4 tokens of each request; together: the lanes share calls
        assert calls < -(-tokens // 4), (calls, tokens)


def test_a_failed_engine_call_fails_its_requests_and_the_server_goes_on(model):
    with Running(*model, slots=2) as r:
        c = openai.OpenAI(base_url=r.url, api_key="x", max_retries=0, timeout=60)

        def boom(admitted):
            raise ValueError("injected device failure")

        r.server.engine._step = boom  # the engine's device call fails (an instance attribute over the method)
        with pytest.raises(openai.InternalServerError, match="injected device failure"):
            c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=4)
        with pytest.raises(openai.APIError, match="injected device failure"):  # streamed: an error event
            for _ in c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=4, stream=True):
                pass
        assert r.server.stats["errors"] == 2 and r.server.inflight == 0
        del r.server.engine._step
        again = c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=2, temperature=0)
        assert again.usage.completion_tokens == 2

"""Shared pieces of the server tests: a tiny model trained to answer one chat with a thinking block
and a tool call, and a running `job=serve` server over it in a background thread."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxagent.models import preset
from jaxagent.models.qwen import init_params, token_logprobs
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.serve.server import PolicyServer, ServerThread, ServeSettings, make_app
from jaxagent.text.chat import ChatRenderer
from jaxagent.text.tokenizer import load_tokenizer

from conftest import FIXTURES

MODEL = "tiny-tool"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
THINKING = "The user wants the weather."
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = f"<think>\n{THINKING}\n</think>\n\n{CALL_TEXT}"


@functools.cache
def tokenizer():
    return load_tokenizer(FIXTURES / "tokenizer_qwen")


def tool_prompt() -> list[int]:
    return prompt_of(TOOL_CHAT, TOOLS)


PROFILE = {"instructions": "You want to return order #W123 because the shoes are too small."}
AGENT_TURN = [{"role": "assistant", "content": "Which order is it about?"}]
USER_REPLY = '{"utterance": "Order W123, please. ###STOP###", "strategy": "answer"}'


def user_sim_messages():
    from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig

    client = LLMUserClient(LLMUserConfig(base_url="http://127.0.0.1:1/v1", model=MODEL))
    return client.build_messages(AGENT_TURN, PROFILE)


def prompt_of(messages, tools=None) -> list[int]:
    r = ChatRenderer(tokenizer(), tools=tools)
    r.add(*messages)
    return r.start_generation()


@functools.cache
def tool_model(steps: int = 150):
    """(config, params) of tiny-qwen2 fitted to two answers, each followed by the end-of-turn
    token: `TOOL_CHAT` with `TOOLS` -> `ANSWER` (thinking and a tool call), and the user
    simulator's prompt for `AGENT_TURN` -> `USER_REPLY`; Adam on the two sequences (~6 s)."""
    tok = tokenizer()
    cfg = preset("tiny-qwen2", vocab_size=1024, max_position_embeddings=16384)
    params = init_params(jax.random.key(0), cfg)
    rows = [(tool_prompt(), tok.encode(ANSWER)), (prompt_of(user_sim_messages()), tok.encode(USER_REPLY))]
    L = max(len(p) + len(a) + 1 for p, a in rows)
    x, y, mask = np.zeros((2, L - 1), np.int32), np.zeros((2, L - 1), np.int32), np.zeros((2, L - 1), np.float32)
    for i, (prompt, answer) in enumerate(rows):
        seq = prompt + answer + [tok.eos_token_ids[0]]
        x[i, : len(seq) - 1], y[i, : len(seq) - 1] = seq[:-1], seq[1:]
        mask[i, len(prompt) - 1: len(seq) - 1] = 1
    opt = optax.adam(1e-2)

    @jax.jit
    def step(p, st):
        def loss(p):
            lp = token_logprobs(p, jnp.asarray(x), config=cfg, targets_BL=jnp.asarray(y))
            return -(lp * mask).sum() / mask.sum()

        value, g = jax.value_and_grad(loss)(p)
        updates, st = opt.update(g, st, p)
        return optax.apply_updates(p, updates), st, value

    state = opt.init(params)
    for _ in range(steps):
        params, state, value = step(params, state)
    assert float(value) < 0.05, f"the fixture model did not fit its answers (loss {float(value):.3f})"
    return cfg, params


def make_server(cfg, params, *, slots: int = 4, capacity: int = 512, decode_steps: int = 4, **settings) -> PolicyServer:
    engine = GenerationEngine(params, cfg, slots=slots, capacity=capacity, park_rows=slots, decode_steps=decode_steps,
                              vocab_limit=tokenizer().vocab_size)
    return PolicyServer(engine, tokenizer(), ServeSettings(model_name=MODEL, **settings))


class Running:
    """A server over ``cfg, params`` in a background thread (``with Running(...) as r: r.url``)."""

    def __init__(self, cfg, params, **kwargs):
        self.server = make_server(cfg, params, **kwargs)
        self.thread = ServerThread(make_app(self.server))
        self.url = self.thread.url

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.thread.stop()


def launch_serve(tmp_path, *overrides: str, timeout_s: float = 120.0):
    """``python -m jaxagent.launch job=serve serve.port=0 serve.model_name=tiny runs_dir=<tmp_path>
    <overrides>`` as a real process: ``(process, base URL, the stderr lines read so far)`` once it
    says where it listens (AssertionError with its stderr if it never does; the caller ends the process)."""
    import os
    import re
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    cmd = [sys.executable, "-m", "jaxagent.launch", "job=serve", "serve.port=0", "serve.model_name=tiny",
           f"runs_dir={tmp_path}", *overrides]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url, lines = None, []
    deadline = time.monotonic() + timeout_s
    while url is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        m = re.search(r"on (http://127\.0\.0\.1:\d+/v1)", line)
        url = m.group(1) if m else None
    if url is None:
        proc.kill()
    assert url is not None, "".join(lines)
    return proc, url, lines

"""Simulator failures never poison training, and every one is counted: a real fault-injecting
OpenAI-compatible server on 127.0.0.1 (an ephemeral port, a thread per connection) answers the
simulator clients with 401, 403, 429 + Retry-After, 5xx, hangs, dropped connections, bad JSON,
empty choices and 5 MB replies; a tiny random policy plays the agent."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler

import jax
import numpy as np
import pytest

from jaxagent import configlib
from jaxagent.jobs.config import load_config
from jaxagent.credit.losses import PPOConfig
from jaxagent.envs.base import AgentMessage
from jaxagent.envs.base import collect_call_stats
from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig, SimulatorError
from jaxagent.envs.user_env import LLMUserEnv
from jaxagent.models import init_params, preset
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.loop import run_episodes
from jaxagent.rollout.runner import EpisodeConfig, call_simulator
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.text import load_tokenizer
from jaxagent.rollout.metrics import episode_metrics, failure_causes
from jaxagent.train.rl import FailureBudget, RLSettings, RLTrainer, SimulatorFailureBudget
from jaxagent.train.step import OptimSettings, TrainState, make_optimizer
from tests.conftest import FIXTURES
from tests.loopback import LoopbackServer

TOK = load_tokenizer(FIXTURES / "tokenizer_qwen")
CFG = preset("tiny-qwen2", vocab_size=TOK.vocab_size, max_position_embeddings=1024)
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=12, stop_tokens=tuple(TOK.eos_token_ids))
TASKS = {"t": {"profile": {"instructions": "You want a flight at noon."}, "opening": "i need a flight"}}
FIVE_MB = 5_000_000


class FaultServer(LoopbackServer):
    """``/v1/chat/completions``; each request takes the next of ``faults``, else ``plan(n, body)``
    (default: a well-formed reply). Records every request's body, size and arrival time."""

    def __init__(self):
        self.faults: collections.deque = collections.deque()
        self.plan = lambda n, body: ("ok",)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # set at teardown: hanging handlers end
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, body: bytes, headers=None):
                try:
                    self.send_response_only(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):  # the client gave up and left
                    self.close_connection = True

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw)
                with server.lock:
                    n = len(server.requests)
                    server.requests.append({"t": time.monotonic(), "size": len(raw), "body": body})
                    fault = server.faults.popleft() if server.faults else server.plan(n, body)
                kind = fault[0]
                if kind == "hang":  # longer than the caller waits, then hang up
                    server.release.wait(fault[1])
                    self.close_connection = True
                    return None
                if kind == "drop":  # the request was read; the connection closes with no response
                    self.close_connection = True
                    return None
                if kind in ("ok", "content"):
                    ok = json.dumps({"utterance": f"reply {n}", "strategy": "inform"})
                    content = ok if kind == "ok" else fault[1]
                    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
                    return self._send(200, json.dumps(reply).encode())
                if kind == "status":
                    return self._send(fault[1], json.dumps({"error": {"message": f"injected {fault[1]}"}}).encode(),
                                      fault[2])
                if kind == "bad_json":
                    return self._send(200, b"<html>502 Bad Gateway</html>")
                if kind == "empty_choices":
                    return self._send(200, b'{"object": "chat.completion", "choices": []}')
                raise AssertionError(f"unknown fault {fault}")

        self._serve(Handler)


@pytest.fixture
def server():
    s = FaultServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def engine():
    return GenerationEngine(init_params(jax.random.key(0), CFG), CFG, slots=4, capacity=1024, park_rows=8,
                            decode_steps=4)


def user_config(url: str, **kw) -> LLMUserConfig:
    base = {"model": "sim", "connect_timeout_s": 2.0, "read_timeout_s": 5.0, "max_retries": 0,
            "backoff_base_s": 0.01, "backoff_max_s": 0.02, "retry_after_max_s": 1.0, "trust_env": False}
    return LLMUserConfig(base_url=url, **(base | kw))


def dead_url() -> str:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def _failed(info: dict | None = None) -> Trajectory:
    return Trajectory(task_id="t", group_id=0, tokens=[], logprobs=[], spans=[], turn_rewards=[], outcome_reward=0.0,
                      reaction_labels=[], termination="simulator_failure", info=dict(info or {}))


def _ok() -> Trajectory:
    return Trajectory(task_id="t", group_id=0, tokens=[], logprobs=[], spans=[], turn_rewards=[], outcome_reward=1.0,
                      reaction_labels=[], termination="done")


# ----------------------------------------------------------------------------- credit batch
def test_failed_episodes_are_left_out_of_the_credit_batch_and_counted(server):
    """Task ``bad`` gets 401 (both episodes fail), task ``half`` a 500 on its first request (one of
    its two episodes fails), task ``ok`` answers: the batch holds the three survivors only, the
    half group is normalised over its one survivor (advantage 0, not +-1 against a failed 0),
    and the PPO epoch runs ceil(3 / 2) = 2 minibatches."""
    half_failed = []

    def plan(n, body):
        system = body["messages"][0]["content"]
        if "MARK-BAD" in system:
            return ("status", 401, {})
        if "MARK-HALF" in system and not half_failed:
            half_failed.append(n)
            return ("status", 500, {})
        return ("ok",)

    server.plan = plan
    tasks = {name: {"profile": {"instructions": f"MARK-{name.upper()} you want a flight"}, "opening": "hi"}
             for name in ("ok", "half", "bad")}
    client = LLMUserClient(user_config(server.base_url))
    scores = itertools.count(1)  # every finished episode gets its own reward: no degenerate group

    def make_env():
        return LLMUserEnv(client, tasks, max_user_turns=1, score=lambda conv: next(scores) / 10)

    params = init_params(jax.random.key(0), CFG)
    # its own engine: the update donates the parameters the engine holds
    engine = GenerationEngine(params, CFG, slots=4, capacity=1024, park_rows=6, decode_steps=4)
    tx = make_optimizer(OptimSettings(lr=1e-3))
    settings = RLSettings(credit="grpo", group_size=2, tasks_per_step=3, ppo_epochs=1, minibatch_size=2)
    trainer = RLTrainer(TrainState.create(params, tx), tx, config=CFG, tokenizer=TOK, make_env=make_env,
                        settings=settings, ppo=PPOConfig(kl_coef=0.0), sampling=SAMPLING,
                        episode=EpisodeConfig(max_turns=2, max_tokens=1024, retries=0, timeout_s=30.0), engine=engine)
    captured = {}
    fuse = trainer._fuse

    def spy(batch, r_info, key):
        A, diag = fuse(batch, r_info, key)
        captured.update(batch=batch, diag=diag)
        return A, diag

    trainer._fuse = spy
    metrics, trajs = trainer.iteration(["ok", "half", "bad"], jax.random.key(0))

    terms = [t.termination for t in trajs]
    assert terms.count("simulator_failure") == 3 and terms[4:] == ["simulator_failure"] * 2
    survivors = [t for t in trajs if t.termination != "simulator_failure"]
    assert [t.task_id for t in survivors] == ["ok", "ok", "half"]
    assert metrics["sim/failed_episodes"] == 3 and metrics["sim/excluded_episodes"] == 3
    assert metrics["sim/fail/401"] == 2 and metrics["sim/fail/5xx"] == 1 and metrics["sim/update_skipped"] == 0
    batch, diag = captured["batch"], captured["diag"]
    has_tokens = np.asarray(batch.pad_mask_BL).any(axis=1)
    assert has_tokens.tolist() == [True] * 3 + [False] * 3  # the same B = 6 rows: the failed are empty
    for row, t in enumerate(survivors):
        assert np.asarray(batch.tokens_BL)[row, : len(t.tokens)].tolist() == t.tokens
    np.testing.assert_allclose(np.asarray(batch.reward_B)[:3], [t.outcome_reward for t in survivors], rtol=1e-6)
    assert all(t.outcome_reward > 0 for t in survivors)
    A = np.asarray(diag["A_ext_B"])
    assert abs(A[0]) > 0.99 and abs(A[1]) > 0.99 and A[0] * A[1] < 0  # the ok group: two members, +-1
    assert A[2] == 0.0  # the half group's lone survivor: a degenerate group, not +-1 against a failed 0
    assert (A[3:] == 0.0).all()
    assert metrics["updates"] + metrics["skipped_updates"] == 2  # ceil(3 kept / minibatch 2), not 6 / 2


# ----------------------------------------------------------------------------- idempotent step
@pytest.mark.parametrize("fault", [("drop",), ("hang", 3.0)])
def test_llm_user_env_step_is_idempotent_under_a_loop_retry(server, fault):
    """The first request is read and then dropped (or hangs past the loop's timeout); the loop
    retries ``step``: the simulator sees the agent's message once, and the conversation holds
    it once."""
    server.faults.append(fault)
    text = "Which day suits you?"

    async def main():
        async with LLMUserClient(user_config(server.base_url)) as client:
            env = LLMUserEnv(client, TASKS, max_user_turns=4)
            await env.reset("t", 0)
            counters = {"simulator_errors": 0}
            step = await call_simulator(lambda: env.step(AgentMessage(text)), EpisodeConfig(retries=2, timeout_s=1.0), counters)
            return env, step, counters

    env, step, counters = asyncio.run(main())
    assert step is not None and step.messages[0].content == "reply 1"
    assert counters["simulator_errors"] == 1 and len(server.requests) == 2
    first, second = (r["body"]["messages"] for r in server.requests)
    assert second == first  # the retry sends exactly what the first attempt sent
    assert second[-1] == {"role": "user", "content": text}
    assert sum(text in m["content"] for m in second) == 1
    assert [m["role"] for m in env.conversation] == ["user", "assistant", "user"]


# ----------------------------------------------------------------------------- not retried
@pytest.mark.parametrize("code", [401, 403])
def test_401_and_403_are_retried_by_neither_the_client_nor_the_loop(server, code):
    server.plan = lambda n, body: ("status", code, {})

    async def main():
        async with LLMUserClient(user_config(server.base_url, max_retries=3)) as client:
            env = LLMUserEnv(client, TASKS)
            await env.reset("t", 0)
            counters = {"simulator_errors": 0}
            with collect_call_stats() as stats:
                step = await call_simulator(lambda: env.step(AgentMessage("hello")), EpisodeConfig(retries=2, timeout_s=10.0),
                                   counters)
            with pytest.raises(SimulatorError) as e:
                await client.respond([{"role": "assistant", "content": "hi"}], TASKS["t"]["profile"])
            return step, counters, stats, e.value

    step, counters, stats, err = asyncio.run(main())
    assert step is None and counters["simulator_errors"] == 1
    assert len(server.requests) == 2  # one for the step (not retried at either level), one for the direct call
    assert err.status == code and err.retryable is False and err.kind == str(code) and err.attempts == 1
    assert stats.as_dict() == {"calls": 1, "attempts": 1, "retries": 0, "failed_calls": 1, "failures": {str(code): 1}}
    assert f"HTTP {code}" in counters["last_error"]


def test_a_retryable_failure_is_retried_by_both_levels(server):
    """The contrast: a 500 is retried by the client (max_retries=1) and then by the loop (retries=1)."""
    server.plan = lambda n, body: ("status", 500, {})

    async def main():
        async with LLMUserClient(user_config(server.base_url, max_retries=1)) as client:
            env = LLMUserEnv(client, TASKS)
            await env.reset("t", 0)
            counters = {"simulator_errors": 0}
            step = await call_simulator(lambda: env.step(AgentMessage("hello")), EpisodeConfig(retries=1, timeout_s=10.0),
                               counters)
            return step, counters, client.stats

    step, counters, stats = asyncio.run(main())
    assert step is None and counters["simulator_errors"] == 2 and len(server.requests) == 4
    assert stats.calls == 2 and stats.attempts == 4 and stats.failures == {"5xx": 4} and stats.failed_calls == 2


# ----------------------------------------------------------------------------- counted by cause
def test_every_fault_kind_is_retried_and_counted_by_cause(server, engine):
    server.faults.extend([("status", 429, {"Retry-After": "0.3"}), ("status", 500, {}), ("status", 503, {}),
                          ("hang", 3.0), ("bad_json",), ("empty_choices",)])
    client = LLMUserClient(user_config(server.base_url, max_retries=6, read_timeout_s=0.3))

    async def main():
        trajs = await run_episodes(engine, lambda: LLMUserEnv(client, TASKS, max_user_turns=1), TOK, ["t"],
                                   group_size=1, sampling=SAMPLING, key=jax.random.key(1),
                                   config=EpisodeConfig(max_turns=2, retries=0, timeout_s=30.0))
        await client.aclose()
        return trajs

    (traj,) = asyncio.run(main())
    assert traj.termination == "done"
    m = episode_metrics([traj])
    assert m["sim/calls"] == 1 and m["sim/attempts"] == 7 and m["sim/retries"] == 6 and m["sim/failed_calls"] == 0
    assert {k: m[f"sim/fail/{k}"] for k in ("429", "5xx", "timeout", "bad_json", "empty_choices", "401")} == {
        "429": 1, "5xx": 2, "timeout": 1, "bad_json": 1, "empty_choices": 1, "401": 0}
    assert m["sim/failed_episodes"] == 0 and m["sim/loop_errors"] == 0
    t = [r["t"] for r in server.requests]
    assert t[1] - t[0] >= 0.3  # the Retry-After was waited out, not cut short
    assert traj.info["sim_failures"] == {"429": 1, "5xx": 2, "timeout": 1, "bad_json": 1, "empty_choices": 1}


# ----------------------------------------------------------------------------- 5 MB replies
@pytest.mark.parametrize("shape", ["json", "text"])
def test_a_5mb_reply_is_cut_and_the_episode_stays_within_max_tokens(server, engine, shape):
    big = ('{"utterance": "' + "word " * (FIVE_MB // 5) + '", "strategy": "inform"}' if shape == "json"
           else "a" * FIVE_MB)
    server.plan = lambda n, body: ("content", big)
    client = LLMUserClient(user_config(server.base_url, read_timeout_s=30.0))
    if shape == "json":  # the reply cut to 64 tokens: the episode goes on, each reply counted
        env_chars, cfg = 8 * 64, EpisodeConfig(max_turns=3, max_tokens=1024, max_reply_tokens=64, timeout_s=60.0)
    else:  # 400 tokens kept (the loop cuts characters first by itself) do not fit in 300: max_tokens
        env_chars, cfg = None, EpisodeConfig(max_turns=3, max_tokens=300, max_reply_tokens=400, timeout_s=60.0)

    async def main():
        trajs = await run_episodes(engine, lambda: LLMUserEnv(client, TASKS, max_user_turns=3,
                                                              max_reply_chars=env_chars),
                                   TOK, ["t"], group_size=1, sampling=SAMPLING, key=jax.random.key(2), config=cfg)
        await client.aclose()
        return trajs

    t0 = time.perf_counter()
    (traj,) = asyncio.run(main())
    assert time.perf_counter() - t0 < 60
    assert len(traj.tokens) <= cfg.max_tokens
    assert traj.info["truncated_replies"] >= 1 and episode_metrics([traj])["sim/truncated_replies"] >= 1
    user = [s for s in traj.spans if s.role == "user"][1:]  # after the opening
    if shape == "json":
        assert traj.termination in ("done", "max_turns", "max_tokens") and len(user) >= 1
        assert traj.info["truncated_replies"] == len(user)
        assert all(s.content_end - s.content_start <= 64 + 2 for s in user)
        assert all(r["size"] < 50_000 for r in server.requests)  # the 5 MB never went back to the simulator
    else:
        assert traj.termination == "max_tokens" and user == []  # not appended: it did not fit


# ----------------------------------------------------------------------------- the timeout rule
LLM_USER = ["job=rl", "env.kind=llm_user", "env.user_tasks=tasks.json", "env.llm_user.base_url=http://127.0.0.1:1/v1",
            "env.llm_user.model=m"]


def test_timeout_budget_rule_names_both_keys_and_derives_the_default():
    from jaxagent.jobs import episode_config

    c = LLMUserConfig(base_url="http://x", model="m")  # 5 x (10 + 120) + 4 x max(min(30, 0.5 * 2**k), 120)
    assert c.call_budget_s() == 5 * 130 + 4 * 120
    with pytest.raises(configlib.ConfigError) as e:
        load_config(None, LLM_USER + ["rollout.timeout_s=60"])
    msg = str(e.value)
    assert msg.startswith("rollout.timeout_s=60") and "env.llm_user.read_timeout_s=120" in msg and "1130" in msg
    assert episode_config(load_config(None, LLM_USER)).timeout_s == 1130 + 30  # null: derived
    assert episode_config(load_config(None, LLM_USER + ["rollout.timeout_s=1130"])).timeout_s == 1130
    small = ["env.llm_user.connect_timeout_s=2", "env.llm_user.read_timeout_s=5", "env.llm_user.max_retries=1",
             "env.llm_user.retry_after_max_s=5"]  # 2 x 7 + max(min(30, 0.5), 5) = 19
    assert episode_config(load_config(None, LLM_USER + small + ["rollout.timeout_s=19"])).timeout_s == 19
    with pytest.raises(configlib.ConfigError, match="rollout.timeout_s=18: .* 19 s"):
        load_config(None, LLM_USER + small + ["rollout.timeout_s=18"])
    assert episode_config(load_config()).timeout_s == 60  # no HTTP call: the plain default


def test_timeout_budget_rule_covers_the_tau2_customer_and_judge():
    tau2 = ["job=eval", "env.kind=tau2_retail", f"tokenizer={FIXTURES / 'tokenizer_qwen'}", "env.tau2.customer=llm",
            "env.tau2.customer_llm.base_url=http://127.0.0.1:1/v1", "env.tau2.customer_llm.model=m"]
    with pytest.raises(configlib.ConfigError) as e:
        load_config(None, tau2 + ["rollout.timeout_s=600"])
    assert "rollout.timeout_s=600" in str(e.value) and "env.tau2.customer_llm.read_timeout_s=120" in str(e.value)
    judge = ["env.tau2.scoring=tau2", "env.tau2.judge.base_url=http://127.0.0.1:1/v1", "env.tau2.judge.model=j"]
    with pytest.raises(configlib.ConfigError, match="env.tau2.judge.read_timeout_s"):  # customer + judge: 2260 s
        load_config(None, tau2 + judge + ["rollout.timeout_s=2000"])
    load_config(None, tau2 + judge + ["rollout.timeout_s=2260"])


def test_failure_settings_are_validated():
    with pytest.raises(configlib.ConfigError, match=r"rl.failure_share=1.5: expected a number in \[0, 1\]"):
        load_config(None, ["rl.failure_share=1.5"])
    with pytest.raises(configlib.ConfigError, match="rl.failure_budget_iters=-1: expected an integer >= 0"):
        load_config(None, ["rl.failure_budget_iters=-1"])
    with pytest.raises(configlib.ConfigError, match="rollout.max_reply_tokens=-1"):
        load_config(None, ["rollout.max_reply_tokens=-1"])


# ----------------------------------------------------------------------------- the failure budget
def test_failure_budget_counts_consecutive_failing_iterations():
    info = {"sim_failures": {"401": 1}, "last_error": "SimulatorError: HTTP 401"}
    budget = FailureBudget(share=0.5, iters=2)
    budget.update([_failed(info), _failed(info), _ok()], 0)  # 2/3 failed: 1
    budget.update([_failed(info), _ok()], 1)  # 1/2: not more than half: back to 0
    budget.update([_failed(info)] * 3 + [_ok()], 2)  # 1
    with pytest.raises(SimulatorFailureBudget) as e:
        budget.update([_failed(info)] * 4, 3)  # 2: stop
    msg = str(e.value)
    assert "rl iteration 3: 4/4" in msg and "rl.failure_budget_iters=2" in msg and "401 x 4" in msg
    assert "\n" not in msg
    never = FailureBudget(share=0.5, iters=0)
    for i in range(5):
        never.update([_failed(info)] * 4, i)  # iters=0: never stops
    assert failure_causes([_failed({"simulator_timeouts": 2, "last_error": "TimeoutError: "})]) == (
        "failed attempts by cause: rollout.timeout_s exceeded x 2; last error: TimeoutError:")


def test_an_evaluation_that_failed_entirely_stops_the_run_before_training(capsys):
    from jaxagent.jobs.evaluate import _check_eval_failures

    failed = [_failed({"sim_failures": {"connection": 3}})] * 2
    _check_eval_failures([_ok(), *failed], "before", 0)  # not all failed: fine
    with pytest.raises(SimulatorFailureBudget, match="eval before .*all 2 episodes.*connection x 6"):
        _check_eval_failures(failed, "before", 0)
    _check_eval_failures(failed, "after", 5)  # later evaluations warn, the run goes on
    assert "WARNING: eval after (step 5): all 2 episodes ended in simulator_failure" in capsys.readouterr().err


def _user_tasks(tmp_path):
    tasks = {"a_test": {"profile": {"instructions": "EVAL-TASK you want a flight"}, "opening": "hi"}}
    tasks |= {f"b{i}": {"profile": {"instructions": f"TRAIN-TASK {i} you want a flight"}, "opening": "hi"}
              for i in range(4)}
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(tasks))
    return path


def _job(url, tmp_path, *extra):
    return ["env.kind=llm_user", f"env.user_tasks={_user_tasks(tmp_path)}", f"env.llm_user.base_url={url}",
            "env.llm_user.model=m", "env.llm_user.connect_timeout_s=2", "env.llm_user.read_timeout_s=5",
            "env.llm_user.backoff_base_s=0.01", "env.llm_user.backoff_max_s=0.02", "env.llm_user.retry_after_max_s=0.1",
            "env.llm_user.trust_env=false", "eval.tasks=1", "eval.every=0", "rollout.max_turns=1", "rollout.slots=4",
            "checkpoint.every=0", f"runs_dir={tmp_path}", *extra]


def test_failure_budget_stops_the_job_with_a_nonzero_exit_naming_the_status(server, tmp_path, capsys):
    """The evaluation's task is answered, every training episode gets 401: two iterations are
    recorded (counted, no update), then the job stops with a one-line message naming HTTP 401."""
    from jaxagent.launch import main

    server.plan = lambda n, body: ("status", 401, {}) if "TRAIN-TASK" in body["messages"][0]["content"] else ("ok",)
    argv = _job(server.base_url, tmp_path, "job=rl", "name=budget", "steps=5", "rl.failure_budget_iters=2",
                "rl.group_size=2", "rl.tasks_per_step=2", "rl.minibatch_size=4", "env.llm_user.max_retries=3",
                "progress=true")
    with pytest.raises(SystemExit) as e:
        main(argv)
    msg = str(e.value.code)
    assert msg.startswith("simulator failure: rl iteration 1: 4/4 episodes ended in simulator_failure")
    assert "\n" not in msg  # one line
    assert "rl.failure_budget_iters=2" in msg and "401 x 4" in msg and "HTTP 401" in msg
    train = [r for r in server.requests if "TRAIN-TASK" in r["body"]["messages"][0]["content"]]
    assert len(train) == 2 * 4  # one request per episode: 401 retried neither by the client nor by the loop
    records = [json.loads(line) for line in (tmp_path / "budget" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in records if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [0, 1]
    for r in rl:
        assert r["sim/failed_episodes"] == 4 and r["sim/excluded_episodes"] == 4 and r["sim/update_skipped"] == 1
        assert r["sim/attempts"] == 4 and r["sim/retries"] == 0 and r["sim/fail/401"] == 4 and r["updates"] == 0
        for k in ("timeout", "429", "5xx", "bad_json", "empty_choices"):
            assert r[f"sim/fail/{k}"] == 0
        assert "sim/truncated_replies" in r and "sim/calls" in r
    (failure,) = [r for r in records if r["phase"] == "failure"]
    assert failure["of"] == "rl" and failure["step"] == 1 and "401 x 4" in failure["reason"]
    assert not (tmp_path / "budget" / "summary.json").exists()
    err = capsys.readouterr().err
    assert "[rl 0] " in err and "failed_episodes=4" in err.split("[rl 0] ")[1].splitlines()[0]  # the progress line


def test_a_dead_simulator_stops_the_eval_job_with_a_nonzero_exit(tmp_path, capsys):
    from jaxagent.launch import main

    with pytest.raises(SystemExit) as e:
        main(_job(dead_url(), tmp_path, "job=eval", "name=dead", "env.llm_user.max_retries=1", "progress=false"))
    msg = str(e.value.code)
    assert msg.startswith("simulator failure: eval before (step 0): all 1 episodes ended in simulator_failure")
    assert "connection x 6" in msg and "\n" not in msg  # 3 loop attempts x 2 client attempts, each counted


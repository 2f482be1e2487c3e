"""job=serve as users launch it, and our own clients pointed at it: the launch command (a real
process, stopped by SIGTERM), a run directory's final policy and a base + LoRA adapter served,
the LLM-user simulator's client, and `job=eval env=tau2_retail agent=endpoint` against our server."""

import asyncio
import dataclasses
import json
import re
import shutil
import signal
from pathlib import Path

import jax
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from jaxagent import configlib  # noqa: E402
from jaxagent.jobs.config import load_config  # noqa: E402
from jaxagent.jobs.serve import build_server, resolve  # noqa: E402
from jaxagent.models import save_pretrained  # noqa: E402
from jaxagent.serve.server import ServerThread, make_app  # noqa: E402
from serve_helpers import (AGENT_TURN, MODEL, PROFILE, THINKING, TOOL_CHAT, TOOLS, Running, launch_serve,  # noqa: E402
                           tokenizer, tool_model)

from conftest import FIXTURES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = str(FIXTURES / "tokenizer_qwen")


def export(tmp_path: Path, cfg, params) -> Path:
    """A run directory whose final policy is ``params`` (hf/ with the tokenizer's files, as jobs write it)."""
    hf = tmp_path / "run" / "hf"
    save_pretrained(hf, cfg, jax.device_get(params))
    for f in Path(TOKENIZER).iterdir():
        shutil.copy2(f, hf / f.name)
    return hf.parent


def test_the_launch_command_serves_until_sigterm_and_exits_0(tmp_path):
    proc, url, _ = launch_serve(tmp_path, f"tokenizer={TOKENIZER}", "rollout.slots=2", "rollout.capacity=512")
    try:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert r.usage.completion_tokens >= 1
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["job"] == "serve" and summary["requests"] == 1 and summary["url"] == url
    assert "stopped (SIGTERM)" in err


def test_serve_settings_are_checked_before_anything_loads(tmp_path, monkeypatch):
    from jaxagent.launch import main

    monkeypatch.delenv("JAXAGENT_TEST_KEY", raising=False)
    with pytest.raises(SystemExit, match=r"serve\.api_key_env='JAXAGENT_TEST_KEY': the environment variable"):
        main(["job=serve", f"tokenizer={TOKENIZER}", "serve.api_key_env=JAXAGENT_TEST_KEY", f"runs_dir={tmp_path}"])
    for override, key in (("serve.port=70000", "serve.port"), ("serve.max_queue=-1", "serve.max_queue"),
                          ("serve.api_key_env=sk-live-1234", "serve.api_key_env"),
                          ("serve.request_timeout_s=0", "serve.request_timeout_s")):
        with pytest.raises(configlib.ConfigError, match=re.escape(key)) as e:
            load_config(None, ["job=serve", override])
        assert "1234" not in str(e.value)  # a key pasted by mistake is never echoed
    with pytest.raises(configlib.ConfigError, match="serve.run"):
        load_config(None, ["job=serve", "serve.run=runs/x", f"model.path={tmp_path}"])
    with pytest.raises(configlib.ConfigError, match="serve.adapter"):
        load_config(None, ["job=serve", "serve.adapter=runs/x/adapter"])
    with pytest.raises(configlib.ConfigError, match=r"serve.run='.*nothing': no hf/config.json"):
        resolve(load_config(None, ["job=serve", f"serve.run={tmp_path / 'nothing'}"]))


def test_a_run_directorys_final_policy_is_served(tmp_path):
    cfg, params = tool_model()
    run = export(tmp_path, cfg, params)
    run_cfg = resolve(load_config(None, ["job=serve", f"serve.run={run}", "rollout.slots=2", "rollout.capacity=512"]))
    assert run_cfg.model.path == str(run / "hf") and run_cfg.tokenizer == str(run / "hf")
    server, what = build_server(run_cfg)
    assert server.settings.model_name == "run" and what["weights"] == "checkpoint"
    thread = ServerThread(make_app(server))
    try:
        client = openai.OpenAI(base_url=thread.url, api_key="x", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="run", messages=TOOL_CHAT, tools=TOOLS, temperature=0)
    finally:
        thread.stop()
    (call,) = r.choices[0].message.tool_calls  # the fitted answer survived the checkpoint round trip
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert r.choices[0].message.model_extra["reasoning_content"] == THINKING


def test_a_base_and_a_lora_adapter_are_served_as_their_merge(tmp_path):
    from jaxagent.models.config import LoraSpec
    from jaxagent.models.lora import init_lora, merge_lora
    from jaxagent.models.lora_hf import save_peft_adapter

    cfg, params = tool_model()
    hf = export(tmp_path, cfg, params) / "hf"
    lcfg = dataclasses.replace(cfg, lora=LoraSpec(rank=4, alpha=8.0, targets=("q", "v", "down")))
    adapter = init_lora(jax.random.key(1), lcfg)
    adapter = jax.tree.map(lambda x: x if x.ndim == 0 else x + 0.05 * jax.random.normal(jax.random.key(2), x.shape),
                           adapter)  # B != 0: the adapter changes the answers
    save_peft_adapter(tmp_path / "adapter", {**params, "lora": adapter}, lcfg, base_model_name_or_path=str(hf))
    served = build_server(load_config(None, ["job=serve", f"model.path={hf}", f"tokenizer={hf}",
                                             f"serve.adapter={tmp_path / 'adapter'}", "rollout.slots=2",
                                             "rollout.capacity=512"]))[0]
    merged, mcfg = merge_lora({**params, "lora": adapter}, lcfg)
    ask = dict(model=served.settings.model_name, prompt=[5, 6, 7, 8], max_tokens=12, temperature=0)
    answers = []
    for server in (served, Running(mcfg, merged).server, Running(cfg, params).server):
        thread = ServerThread(make_app(server))
        try:
            client = openai.OpenAI(base_url=thread.url, api_key="x", max_retries=0, timeout=120)
            answers.append(client.completions.create(**{**ask, "model": server.settings.model_name}).choices[0].text)
        finally:
            thread.stop()
    assert served.engine.config.lora is not None and "lora" in served.engine.params
    assert answers[0] == answers[1]  # base + adapter = the merged model
    assert answers[0] != answers[2]  # and not the base alone


def test_the_llm_user_simulator_plays_through_our_server():
    from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig

    with Running(*tool_model(), capacity=512) as r:
        async def ask():
            client = LLMUserClient(LLMUserConfig(base_url=r.url, model=MODEL, temperature=0.0, max_retries=0,
                                                 trust_env=False, max_tokens=64))
            try:
                return await client.respond(AGENT_TURN, PROFILE)
            finally:
                await client.aclose()

        reply = asyncio.run(ask())
    assert (reply.utterance, reply.strategy, reply.stop, reply.parse_error) == ("Order W123, please.", "answer", True,
                                                                                 None)


def test_tau2_endpoint_eval_against_our_server(tmp_path):
    """Our policy as the agent of `job=eval env=tau2_retail agent=endpoint` (the system prompt and
    tool schemas are ~7k tokens with the fixture tokenizer: blockwise attention, prefix reuse)."""
    from jaxagent.launch import main

    cfg, params = tool_model()
    with Running(dataclasses.replace(cfg, attn_impl="blockwise"), params, slots=2, capacity=12288,
                 decode_steps=8) as r:
        code = main(["job=eval", "env=tau2_retail", "agent=endpoint", "env.tau2.tasks=0:2", "env.tau2.max_steps=6",
                     f"eval.endpoint.base_url={r.url}", f"eval.endpoint.model={MODEL}", "eval.endpoint.max_retries=0",
                     "eval.endpoint.trust_env=false", "eval.endpoint.max_tokens=12", "eval.concurrency=2", "eval.k=1",
                     f"runs_dir={tmp_path}", "name=ep", "progress=false"])
        stats = dict(r.server.stats)
        reused = r.server.sessions.reused
    assert code == 0
    summary = json.loads((tmp_path / "ep" / "summary.json").read_text())
    episodes = [json.loads(line) for line in (tmp_path / "ep" / "episodes.jsonl").read_text().splitlines()]
    # both episodes were played to their step limit by our policy (no agent or simulator failure)
    assert sorted(e["task_id"] for e in episodes) == ["0", "1"]
    assert [e["termination"] for e in episodes] == ["max_steps", "max_steps"]
    assert sum(e["agent_turns"] for e in episodes) == stats["requests"]
    assert stats["errors"] == 0 and stats["requests"] >= 2 and stats["prompt_tokens"] > 2 * 5000
    assert reused >= 1  # a later turn of an episode reused its own prefix
    assert np.isfinite(summary["reward"])

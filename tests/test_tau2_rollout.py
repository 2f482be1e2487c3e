"""tau2 retail end to end with a model: a tiny random Qwen policy plays the scripted customer through
the rollout loop (token-in/token-out), the trajectories' spans and reaction labels go through the
collator and one InfoPO+Faca RL iteration; and the launch path (job=eval with the oracle, the
aliases, the config checks, the training config's dry run)."""

import asyncio
import json

import jax
import numpy as np
import pytest

from jaxagent import configlib
from jaxagent.envs.tau2.spec import Tau2Section
from jaxagent.jobs.config import load_config
from jaxagent.credit.losses import PPOConfig
from jaxagent.credit.reaction import DEFAULT_POLARITY
from jaxagent.envs.tau2.harness import Tau2EnvFactory, per_task, summarize
from jaxagent.launch import expand_alias, main
from jaxagent.models import init_params, preset
from jaxagent.models.generate import SamplingParams
from jaxagent.train.collate import collate
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.loop import run_episodes
from jaxagent.text import load_tokenizer
from jaxagent.train.rl import RLSettings, RLTrainer
from jaxagent.train.step import OptimSettings, TrainState, make_optimizer
from tests.conftest import FIXTURES

TOK = load_tokenizer(FIXTURES / "tokenizer_qwen")
CAP = 4608  # the policy prompt is ~3.7k tokens with this tokenizer (tool schemas not rendered)
CFG = preset("tiny-qwen2", vocab_size=TOK.vocab_size, max_position_embeddings=CAP)
EPISODE = EpisodeConfig(max_turns=4, max_tokens=CAP, tool_schemas_in_prompt=False)


def _engine(params):
    return GenerationEngine(params, CFG, slots=4, capacity=CAP, park_rows=4, decode_steps=4)


def test_tiny_model_episodes_are_well_formed_and_collate():
    factory = Tau2EnvFactory(Tau2Section(tasks="0,1"))
    params = init_params(jax.random.key(0), CFG)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, stop_tokens=tuple(TOK.eos_token_ids))
    trajs = asyncio.run(run_episodes(_engine(params), factory, TOK, factory.task_ids, group_size=2,
                                     sampling=sampling, key=jax.random.key(1), config=EPISODE))
    reports = factory.drain()
    assert len(trajs) == 4 and len(reports) == 4
    labelled = 0
    for t in trajs:
        roles = [s.role for s in t.spans]
        assert roles[:2] == ["system", "user"]
        n_gen = roles.count("assistant")
        assert len(t.action_spans()) == n_gen == len(t.turn_rewards) >= 1
        for i, label in enumerate(t.reaction_labels):
            if label is not None:
                labelled += 1
                assert roles[i] == "user" and label in DEFAULT_POLARITY
        assert t.termination in ("done", "max_turns", "max_tokens")
        assert np.isfinite(t.outcome_reward) and t.outcome_reward in (0.0, 1.0)
    assert labelled >= 1  # the customer answered at least one agent message, with its label
    for r in reports:
        assert r["task_id"] in ("0", "1") and r["messages"][0]["role"] == "user"
    batch, old_lp = collate(trajs, multiple=256)
    batch.check()
    assert old_lp.shape == batch.shape and batch.shape[0] == 4
    # the customer's labels reach the segment polarities (every scripted label has a polarity of +-1)
    assert np.abs(np.asarray(batch.segment_polarity_BQ)).sum() >= 1
    # every agent segment (between two customer messages) is a union of action turns
    for t in trajs:
        for turns, label in t.segments():
            assert turns and all(0 <= i < len(t.action_spans()) for i in turns)


def test_rl_iteration_infopo_faca_on_tau2():
    factory = Tau2EnvFactory(Tau2Section(tasks="0,2"))
    factory.record(False)
    params = init_params(jax.random.key(0), CFG)
    tx = make_optimizer(OptimSettings(lr=1e-3))
    # microbatches=4: the update's ~4k-token rows one at a time (gradient accumulation), so the
    # attention backward holds one row's [heads, L, L] scores, not four (7 GB otherwise)
    settings = RLSettings(credit="infopo+faca", group_size=2, tasks_per_step=2, ppo_epochs=1, minibatch_size=4,
                          microbatches=4, length_multiple=512)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, stop_tokens=tuple(TOK.eos_token_ids))
    trainer = RLTrainer(TrainState.create(params, tx), tx, config=CFG, tokenizer=TOK, make_env=factory,
                        settings=settings, ppo=PPOConfig(kl_coef=0.01, entropy_coef=0.001), sampling=sampling,
                        episode=EpisodeConfig(max_turns=3, max_tokens=CAP, tool_schemas_in_prompt=False),
                        engine=_engine(params))
    metrics, trajs = trainer.iteration(factory.task_ids, jax.random.key(2))
    assert len(trajs) == 4 and metrics["updates"] + metrics["skipped_updates"] == 1
    for k, v in metrics.items():
        if isinstance(v, float):
            assert np.isfinite(v), k
    assert "info/gain_mean" in metrics and any(k.startswith("faca/") for k in metrics)
    assert factory.envs == []  # not recording during RL


def test_summarize_hand_computed():
    reps = [{"task_id": "a", "termination": "user_stop", "score": {"reward": 1.0, "components": {"DB": 1.0, "COMMUNICATE": 1.0}}},
            {"task_id": "a", "termination": "user_stop", "score": {"reward": 0.0, "components": {"DB": 0.0, "COMMUNICATE": 1.0}}},
            {"task_id": "b", "termination": "max_steps", "score": {"reward": 0.0, "components": {"DB": 1.0, "COMMUNICATE": 0.0}}},
            {"task_id": "b", "termination": "user_stop", "score": {"reward": 0.0, "components": {"DB": 0.0, "COMMUNICATE": 0.0}}}]
    rows = per_task(reps)
    assert [(r["task_id"], r["reward"], r["success"], r["db"], r["communicate"]) for r in rows] == [
        ("a", 0.5, 0.5, 0.5, 1.0), ("b", 0.0, 0.0, 0.5, 0.0)]
    assert rows[1]["terminations"] == {"max_steps": 1, "user_stop": 1}
    s = summarize(reps, scoring_mode="offline", k=2)
    assert s["reward"] == 0.25 and s["success"] == 0.25 and s["pass_at_k"] == 0.5
    assert s["db"] == 0.5 and s["communicate"] == 0.5
    assert s["terminations"] == {"user_stop": 3, "max_steps": 1}
    assert s["success_by_task"] == {"a": 0.5, "b": 0.0}
    assert (s["pass_hat_1"], s["pass_hat_2"], s["pass_hat_k"]) == (0.25, 0.0, 0.0)  # a: 1 of 2, b: 0 of 2
    assert s["components"] == {"DB": 0.5, "COMMUNICATE": 0.5}
    assert "not tau2" in s["scoring_note"]
    with pytest.raises(ValueError, match="reports: empty"):
        summarize([], scoring_mode="offline", k=1)


def test_launch_eval_oracle_writes_per_task_results(tmp_path, capsys):
    assert main(["job=eval", "env=tau2_retail", "agent=oracle", "env.tau2.tasks=0:6", "eval.k=2",
                 f"runs_dir={tmp_path}", "name=oracle", "progress=false"]) == 0
    summary = json.loads((tmp_path / "oracle" / "summary.json").read_text())
    assert summary["tasks"] == 6 and summary["episodes"] == 12 and summary["k"] == 2
    assert summary["reward"] == 1.0 and summary["db"] == 1.0 and summary["scoring_mode"] == "offline"
    rows = [json.loads(l) for l in (tmp_path / "oracle" / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {r["seed"] for r in rows} == {0, 1}
    assert all(r["score"]["scoring_mode"] == "offline" and r["termination"] == "user_stop" for r in rows)
    tasks = [json.loads(line) for line in (tmp_path / "oracle" / "tasks.jsonl").read_text().splitlines()]
    assert [t["task_id"] for t in tasks] == ["0", "1", "2", "3", "4", "6"]
    assert all(t["runs"] == 2 and t["reward"] == 1.0 and t["db"] == 1.0 for t in tasks)


def test_launch_eval_prints_a_summary_not_a_line_per_task(tmp_path, capsys):
    assert main(["job=eval", "env=tau2_retail", "agent=oracle", "env.tau2.tasks=0:8", "eval.k=2",
                 f"runs_dir={tmp_path}", "name=brief"]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert "success_by_task" not in printed and printed["tasks"] == 8 and printed["pass_hat_k"] == 1.0
    assert printed["files"]["tasks.jsonl"] == str(tmp_path / "brief" / "tasks.jsonl")
    # no line per task: no task id is a key anywhere in what is printed, no list is as long as the tasks
    def keys_and_lists(x):
        if isinstance(x, dict):
            yield from ((k, None) for k in x)
            for v in x.values():
                yield from keys_and_lists(v)
        elif isinstance(x, list):
            yield None, len(x)
            for v in x:
                yield from keys_and_lists(v)

    found = list(keys_and_lists(printed))
    ids = {"0", "1", "2", "3", "4", "6", "7", "8"}
    assert not ids & {k for k, _ in found} and all(n < 8 for _, n in found if n is not None)
    assert len(out.splitlines()) < 70  # the figures (avg@k, pass^1..k, components, scoring basis) and the files
    lines = [x for x in err.strip().splitlines() if not x.startswith("[launch]")][-5:]  # the launcher's own lines out
    assert lines[0].startswith("tau2 retail/train agent=oracle: 8 tasks x k=2 | avg@2 1.000 success 1.000 pass^2 1.000 "
                               "| DB 1.000 COMMUNICATE 1.000 ACTION 1.000 | offline DB x COMMUNICATE")
    assert lines[1].startswith("  customer scripted, 16 episodes; scoring offline: reward = DB x COMMUNICATE")
    assert lines[2] == "  pass^1 1.000  pass^2 1.000  pass@2 1.000"
    assert lines[3] == "  terminations: user_stop 16" and str(tmp_path / "brief") in lines[4]
    assert not any('"0":' in line or "task_id" in line for line in err.splitlines())
    # the rows stay in the files
    written = json.loads((tmp_path / "brief" / "summary.json").read_text())
    assert len(written["success_by_task"]) == 8
    assert len((tmp_path / "brief" / "tasks.jsonl").read_text().splitlines()) == 8


def test_aliases_and_config_errors():
    assert expand_alias("env=tau2_retail") == "env.kind=tau2_retail"
    assert expand_alias("agent=oracle") == "eval.agent=oracle"
    assert expand_alias("env.gym=telepathy") == "env.gym=telepathy"
    with pytest.raises(configlib.ConfigError, match="builtin:gyms"):
        load_config(None, ["job=eval", "env.kind=tau2_retail"])
    with pytest.raises(configlib.ConfigError, match="eval.agent|agent='oracle'"):
        load_config(None, ["job=rl", "eval.agent=oracle"])
    with pytest.raises(configlib.ConfigError, match="customer_llm"):
        load_config(None, ["job=eval", "env.kind=tau2_retail", "eval.agent=oracle", "env.tau2.customer=llm"])
    with pytest.raises(configlib.ConfigError, match="sft"):
        load_config(None, ["env.kind=llm_user", "env.user_tasks=x.json", "env.llm_user.base_url=http://h",
                           "env.llm_user.model=m"])
    assert load_config(None, ["env.kind=tau2_retail", "tokenizer=x"]).job == "sft+rl"  # SFT on oracle demos
    with pytest.raises(ValueError, match="judge"):
        Tau2EnvFactory(Tau2Section(tasks="2", scoring="tau2"))


def test_training_config_dry_run(capsys):
    assert main(["--config", "configs/tau2_retail_rl.yaml", "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == "valid" and out["credit"] in ("grpo", "infopo", "faca", "infopo+faca")
    cfg = load_config("configs/tau2_retail_rl.yaml")
    assert cfg.env.kind == "tau2_retail" and cfg.env.tau2.customer == "scripted" and cfg.job == "rl"


class OracleEngine:
    """A stand-in for the generation engine that 'generates' the oracle's next message as tokens
    (its text and Qwen ``<tool_call>`` blocks, then the end-of-turn token), so a whole gold episode
    goes through the real loop: renderer, parser, tool execution, customer, trajectory."""

    def __init__(self, task):
        from types import SimpleNamespace

        from jaxagent.envs.base import Reset
        from jaxagent.envs.tau2.agents import OracleAgent

        self.agent = OracleAgent()
        self.agent.start(task.id, Reset(()), SimpleNamespace(task=task))

    async def generate(self, session, prompt, sampling, key):
        from jaxagent.rollout.engine import EngineResult

        msg = await self.agent.act(0)
        text = msg.content + "".join(f"<tool_call>\n{json.dumps(c.to_dict())}\n</tool_call>" for c in msg.tool_calls)
        ids = TOK.encode(text) + [TOK.eos_token_ids[0]]
        return EngineResult(ids, [0.0] * len(ids), [0.0] * len(ids), True, False, len(prompt))

    def release(self, session):
        pass


@pytest.mark.parametrize("task_id", ["0", "14"])
def test_oracle_tokens_through_the_loop_reach_the_gold_db_and_group_tool_calls_in_one_segment(task_id):
    from jaxagent.rollout.loop import run_episode

    factory = Tau2EnvFactory(Tau2Section(tasks=task_id))
    task = factory.tasks[task_id]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=512, stop_tokens=tuple(TOK.eos_token_ids))
    traj = asyncio.run(run_episode(OracleEngine(task), factory(), TOK, task_id=task_id, seed=0, group_id=0,
                                   sampling=sampling, key=jax.random.key(0),
                                   config=EpisodeConfig(max_turns=60, max_tokens=1 << 20,
                                                        tool_schemas_in_prompt=False)))
    report = factory.drain()[0]
    assert traj.termination == "done" and traj.outcome_reward == 1.0
    assert report["score"]["components"]["DB"] == 1.0
    # every gold action was executed from the parsed tokens, in order
    calls = [(c["name"], c["arguments"]) for m in report["messages"] if m["role"] == "assistant"
             for c in m["tool_calls"]]
    assert calls == [(a.name, dict(a.arguments)) for a in task.actions]
    # U2U segments: the agent turns between two customer messages form one segment, labelled by the
    # customer's reaction to its last message; the first segment holds every tool call before the
    # first proposal
    roles = [s.role for s in traj.spans]
    segs = traj.segments()
    first_text = next(i for i, m in enumerate(report["messages"]) if m["role"] == "assistant" and m["content"])
    n_calls_before = sum(1 for m in report["messages"][:first_text] if m["role"] == "assistant")
    assert len(segs[0][0]) == n_calls_before + 1 >= 2
    assert segs[0][1] in ("confirm", "accept")
    assert sum(r == "assistant" for r in roles) == sum(len(t) for t, _ in segs)


def test_tiny_model_against_the_llm_customer_over_http():
    """The LLM customer behind a loopback OpenAI-compatible server: its labels land on the user
    messages of the trajectory, its stop token ends the episode, the batch collates."""
    from jaxagent.envs.llm_user import LLMUserConfig
    from tests.test_user_env import _server

    srv, seen = _server(['{"utterance": "I want to return my order #W2378156.", "strategy": "provide_info"}',
                         '{"utterance": "No, that is wrong.", "strategy": "reject"}',
                         '{"utterance": "Thanks. ###STOP###", "strategy": "accept"}'])
    try:
        section = Tau2Section(tasks="0", customer="llm", customer_llm=LLMUserConfig(
            base_url=f"http://127.0.0.1:{srv.server_address[1]}/v1", model="customer", max_retries=0))
        factory = Tau2EnvFactory(section)
        params = init_params(jax.random.key(0), CFG)
        sampling = SamplingParams(temperature=1.0, max_new_tokens=16, stop_tokens=tuple(TOK.eos_token_ids))
        trajs = asyncio.run(run_episodes(_engine(params), factory, TOK, ["0"], group_size=1, sampling=sampling,
                                         key=jax.random.key(3), config=EPISODE))
    finally:
        srv.shutdown()
    (t,), (report,) = trajs, factory.drain()
    assert "<scenario>" in seen[0]["messages"][0]["content"] and "###TRANSFER###" in seen[0]["messages"][0]["content"]
    assert report["messages"][0]["content"] == "I want to return my order #W2378156."
    labels = [x for x in t.reaction_labels if x is not None]
    texts = [m for m in report["messages"] if m["role"] == "assistant" and m["content"] and not m["tool_calls"]]
    # one customer reply per agent text message; the last one (the stop) ends the episode unrendered
    assert len(seen) == 1 + len(texts)
    assert labels == (["reject"] if texts else [])
    assert len(texts) >= 2  # this seed's random policy talks (no tool call) twice: the stop path runs
    assert t.termination == "done" and report["termination"] == "user_stop"
    assert report["score"]["details"]["stop_token"] == "###STOP###"
    batch, _ = collate([t], multiple=256)
    batch.check()


def test_launch_eval_with_a_local_checkpoint(tmp_path):
    """job=eval env=tau2_retail with model.path: the checkpoint plays through the engine, the run
    directory gets the per-episode reports and the summary the tau2 figures."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from jaxagent.models import save_pretrained

    ckpt = tmp_path / "ckpt"
    save_pretrained(ckpt, CFG, init_params(jax.random.key(0), CFG))
    for f in (FIXTURES / "tokenizer_qwen").iterdir():
        shutil.copy2(f, ckpt / f.name)
    args = ["job=eval", "env=tau2_retail", f"model.path={ckpt}", f"tokenizer={ckpt}", "env.tau2.tasks=0:2",
            "eval.tasks=2", f"rollout.capacity={CAP}", f"rollout.max_tokens={CAP}", "rollout.max_turns=2",
            "rollout.max_new_tokens=8", "rollout.slots=2", f"runs_dir={tmp_path}", "name=local",
            "progress=false", "checkpoint.export_hf=false"]
    # A launch of its own on one CPU device, as a user runs it: on the tests' 8 simulated devices the
    # mesh (fsdp=-1) spans all eight and the engine's two-row ~4k-token prefill runs whole on each of
    # them (8 x 1.3 GB of attention scores in this process).
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    proc = subprocess.run([sys.executable, "-m", "jaxagent.launch", *args], cwd=Path(__file__).parents[1], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "local"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env"] == "tau2_retail" and summary["eval_tasks"] == 2 and summary["success"] == 0.0
    assert summary["eval_k"] == 4  # eval.k null: tau2's default k
    rows = [json.loads(line) for line in (run / "episodes_before_0.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in rows) == ["0"] * 4 + ["1"] * 4
    assert all(r["rollout_termination"] in ("done", "max_turns", "max_tokens") for r in rows)
    per = [json.loads(line) for line in (run / "tasks_before_0.jsonl").read_text().splitlines()]
    assert [t["task_id"] for t in per] == ["0", "1"] and all(t["runs"] == 4 for t in per)
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # both tasks need a write (an exchange) that a random 8-token policy does not make
    assert evals[0]["tau2/scoring_mode"] == "offline" and evals[0]["tau2/db"] == 0.0
    assert [evals[0][f"tau2/pass_hat_{j}"] for j in (1, 2, 3, 4)] == [0.0] * 4


def test_oracle_demos_render_with_the_loss_on_the_agent_turns_only():
    from jaxagent.rollout.demos import render_demo
    from jaxagent.envs.tau2.agents import oracle_plan
    from jaxagent.rollout.demos import play_demos

    factory = Tau2EnvFactory(Tau2Section(tasks="0,14"))
    factory.record(False)
    demos = play_demos(oracle_plan(factory, factory.tasks, factory.task_ids))
    assert [d.reward for d in demos] == [1.0, 1.0]
    for d in demos:
        task = factory.tasks[d.task_id]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for m in d.messages if m["role"] == "assistant"
                 for c in m.get("tool_calls", ())]
        assert calls == [(a.name, dict(a.arguments)) for a in task.actions]
        assert all(t == (m["role"] == "assistant") for m, t in zip(d.messages, d.train))
        ids, mask = render_demo(d, TOK, tool_schemas_in_prompt=False)
        text = TOK.decode([i for i, m in zip(ids, mask) if m])
        # trained: the agent's words and calls; never the policy, the customer or the tool results
        assert "<tool_call>" in text and task.actions[0].name in text
        assert "Retail agent policy" not in text and "Transfer successful" not in text
        assert d.messages[1]["content"] not in text


def test_sft_data_on_tau2_is_the_oracle_demos_of_the_selected_tasks():
    from jaxagent.jobs import build_env, sft_data

    cfg = load_config(None, ["job=sft", "env.kind=tau2_retail", "tokenizer=x", "env.tau2.tasks=0:3", "sft.demos=2",
                             f"rollout.capacity={CAP * 2}", "rollout.tool_schemas_in_prompt=false"])
    make_env, train, _ = build_env(cfg)
    data = sft_data(cfg, TOK, make_env)
    assert len(data) == 2 and train == ["0", "1", "2"]
    for ids, mask in data:
        assert len(ids) == len(mask) and 0 < sum(mask) < len(ids) // 2

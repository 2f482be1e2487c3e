"""The environment-family protocol jobs use (`jaxagent.envs.base.EnvFactory`): the defaults of a
family with nothing to record or close, tau2 retail's recording, reports and summaries, and the
LLM-user family closing its shared client."""

import asyncio

import pytest

from jaxagent.envs.base import CallableEnvFactory, EnvFactory
from jaxagent.envs.gyms import GYMS
from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig
from jaxagent.envs.tau2.agents import OracleAgent
from jaxagent.envs.tau2.harness import Tau2EnvFactory
from jaxagent.envs.user_env import LLMUserEnv, LLMUserEnvFactory
from jaxagent.envs.tau2.spec import Tau2Section
from jaxagent.rollout.runner import play


def test_a_family_without_reports_or_clients():
    envs = CallableEnvFactory(lambda: GYMS["intention"].env(max_steps=3))
    a, b = envs(), envs()
    assert a is not b and isinstance(envs, EnvFactory)
    envs.record(True)
    assert envs.drain() == [] and envs.summarize([], k=1) == {} and envs.per_task([]) == []
    asyncio.run(envs.aclose())


def test_tau2_records_only_while_recording_and_summarises_its_reports():
    envs = Tau2EnvFactory(Tau2Section(tasks="0,1"))
    envs.record(False)

    async def episodes(seed):
        return [await play(envs(), OracleAgent(), tid, seed) for tid in envs.task_ids]

    asyncio.run(episodes(0))
    assert envs.drain() == []  # not recording: nothing kept
    envs.record(True)
    played = asyncio.run(episodes(1))
    reports = envs.drain()
    assert [r["task_id"] for r in reports] == [p["task_id"] for p in played] == envs.task_ids
    assert envs.drain() == []  # drained: forgotten
    # the oracle solves both: DB and COMMUNICATE 1, pass@1 1, under the offline scoring
    assert envs.summarize(reports, k=1) == {"tau2/db": 1.0, "tau2/communicate": 1.0, "tau2/pass_at_k": 1.0,
                                            "tau2/scoring_mode": "offline", "tau2/action": 1.0,
                                            "tau2/pass_hat_1": 1.0}
    rows = envs.per_task(reports)
    assert [(r["task_id"], r["runs"], r["success"]) for r in rows] == [("0", 1, 1.0), ("1", 1, 1.0)]
    asyncio.run(envs.aclose())


def test_llm_user_family_shares_one_client_and_closes_it():
    client = LLMUserClient(LLMUserConfig(base_url="http://127.0.0.1:9/v1", model="m"))
    envs = LLMUserEnvFactory(client, {"t": {"profile": {}, "opening": "hi"}}, max_user_turns=2)
    a, b = envs(), envs()
    assert isinstance(a, LLMUserEnv) and a is not b and a.client is b.client is client
    asyncio.run(envs.aclose())
    with pytest.raises(RuntimeError, match="the client is closed"):
        asyncio.run(client.respond([{"role": "assistant", "content": "hello"}], {"instructions": "buy shoes"}))

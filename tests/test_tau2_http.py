"""tau2 retail over HTTP (LLM customer, NL judge, endpoint agent) against a loopback server, and
its failures: retried, counted, contained."""

import asyncio
import json
import socket

import pytest

from jaxagent.envs.base import AgentMessage
from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig
from jaxagent.envs.tau2 import scoring
from jaxagent.envs.tau2.agents import EndpointAgent, OracleAgent
from jaxagent.envs.tau2.customer import GREETING, STOP_TOKENS, TRANSFER, customer_config
from jaxagent.envs.tau2.domains.retail.customer import ScriptedCustomer, first_person
from jaxagent.envs.tau2.domains.retail.db import load_policy
from jaxagent.envs.tau2.env import Tau2Env, llm_customers, scripted_customers
from jaxagent.envs.tau2.tasks import (
    render_scenario,
)
from jaxagent.envs.tau2.domains.retail.tools import TOOL_NAMES, tool_schemas
from jaxagent.rollout.runner import play
from jaxagent.text.toolcalls import ToolCall

from tests.loopback import chat_server as serve
from tests.tau2_helpers import TASKS, call, episode, reply_text, run


# ============================================================================ HTTP paths
def _config(url):
    return LLMUserConfig(base_url=url, model="sim", temperature=0.0, max_retries=0, connect_timeout_s=2.0,
                         read_timeout_s=10.0, trust_env=False)


def test_llm_customer_end_to_end():
    replies = ['{"utterance": "I want to exchange two items of a delivered order.", "strategy": "provide_info"}',
               '{"utterance": "I do not remember it.", "strategy": "be_vague"}',
               '{"utterance": "###TRANSFER###", "strategy": "accept"}']
    with serve(replies) as (requests, url):
        async def main():
            async with LLMUserClient(customer_config(_config(url))) as client:
                env = Tau2Env(TASKS, customer=llm_customers(client))
                reset = await env.reset("0", 0)
                s1 = await env.step(call("find_user_id_by_name_zip", first_name="Yusuf", last_name="Rossi",
                                         zip="19122"))
                n_after_tool = len(requests)
                s2 = await env.step(AgentMessage("What is your email address?"))
                s3 = await env.step(AgentMessage("Transferring you now.", (
                    ToolCall("transfer_to_human_agents", {"summary": "SUMMARY-7781"}),)))
                s4 = await env.step(AgentMessage("You are now with a human agent."))
                return env, reset, s1, n_after_tool, s2, s3, s4

        env, reset, s1, n_after_tool, s2, s3, s4 = run(main())

    assert len(requests) == 3 and n_after_tool == 1  # tool calls cost no simulator request
    system = requests[0]["messages"][0]
    assert system["role"] == "system" and render_scenario(TASKS["0"]) in system["content"]
    assert all(t in system["content"] for t in STOP_TOKENS)
    for r in requests:
        first_user = next(m for m in r["messages"] if m["role"] == "user")
        assert first_user["content"] == GREETING and r["messages"][1] == first_user
        assert {m["role"] for m in r["messages"]} <= {"system", "user", "assistant"}
        assert all(set(m) == {"role", "content"} for m in r["messages"])
    wire = json.dumps(requests)
    for secret in ("yusuf_rossi_9620", "SUMMARY-7781", "Transfer successful", "find_user_id_by_name_zip",
                   "transfer_to_human_agents", "Transferring you now."):
        assert secret not in wire, secret
    assert [(m["role"], m["content"]) for m in requests[2]["messages"][1:]] == [
        ("user", GREETING),
        ("assistant", json.dumps({"utterance": "I want to exchange two items of a delivered order.",
                                  "strategy": "provide_info"})),
        ("user", "What is your email address?"),
        ("assistant", json.dumps({"utterance": "I do not remember it.", "strategy": "be_vague"})),
        ("user", "You are now with a human agent.")]
    assert (reset.messages[1].content, reset.messages[1].reaction) == (
        "I want to exchange two items of a delivered order.", "provide_info")
    assert [m.role for m in s1.messages] == ["tool"] and s1.messages[0].content == "yusuf_rossi_9620"
    assert reply_text(s2) == ("I do not remember it.", "be_vague") and not s2.done
    assert [m.content for m in s3.messages] == ["Transfer successful"]
    assert reply_text(s4) == (TRANSFER, "accept") and s4.done and s4.info["termination"] == "user_stop"
    assert env.result.details["stop_token"] == TRANSFER and env.result.scored
    assert s4.reward == 0.0 and env.result.components["DB"] == 0.0  # the exchange was not made


@pytest.mark.parametrize("verdicts, reward", [((True, True), 1.0), ((True, False), 0.0)])
def test_tau2_scoring_with_a_judge_server(verdicts, reward):
    task = TASKS["19"]  # two assertions; DB x NL_ASSERTION
    assert len(task.nl_assertions) == 2
    verdict = json.dumps({"results": [{"expectedOutcome": a, "reasoning": "checked", "metExpectation": v}
                                      for a, v in zip(task.nl_assertions, verdicts)]})
    with serve(["Here is my grading:\n" + verdict]) as (requests, url):
        async def main():
            async with LLMUserClient(_config(url)) as judge:
                env = Tau2Env(TASKS, customer=scripted_customers(), scoring_mode="tau2", judge=judge)
                return await play(env, OracleAgent(), "19")

        rep = run(main())

    assert len(requests) == 1
    msgs = requests[0]["messages"]
    assert msgs[0] == {"role": "system", "content": scoring.JUDGE_SYSTEM_PROMPT}
    # tau2's transcript opens with the fixed greeting, then the customer's first message
    assert msgs[1]["content"].startswith("Transcript:\nassistant: Hi! How can I help you today?\nuser: "
                                         + first_person(task.instructions["reason_for_call"]))
    assert "\nassistant: None\n" in msgs[1]["content"]
    assert msgs[1]["content"].endswith("Expected outcomes:\n" + "\n".join("- " + a for a in task.nl_assertions))
    s = rep["score"]
    assert rep["termination"] == "user_stop" and s["scoring_mode"] == "tau2" and s["basis"] == ["DB", "NL_ASSERTION"]
    assert s["components"]["DB"] == 1.0 and s["components"]["NL_ASSERTION"] == reward and s["reward"] == reward
    assert s["details"]["judge"] == {"verdicts": list(verdicts)}


def test_tau2_scoring_without_a_judge():
    said = AgentMessage("Your shirts are polyester and cotton.")

    async def main():
        env = Tau2Env(TASKS, customer=scripted_customers(), scoring_mode="tau2")
        await env.reset("24", 0)
        with pytest.raises(ValueError, match=r"env\.tau2\.judge"):
            await env.step(said)
        # a task without assertions needs no judge: task 10's transfer scores DB 1 x NL 1
        env = Tau2Env(TASKS, customer=scripted_customers(), scoring_mode="tau2")
        _, steps = await episode(env, "10", [call("transfer_to_human_agents", summary="s"), AgentMessage("Done.")])
        return env, steps[-1]

    env, s = run(main())
    assert s.done and s.reward == 1.0 and env.result.mode == "tau2" and env.result.components["NL_ASSERTION"] == 1.0
    with pytest.raises(ValueError, match="scoring_mode='both'"):
        Tau2Env(TASKS, customer=scripted_customers(), scoring_mode="both")


def _tool_call(cid, name, arguments):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_endpoint_agent_plays_through_openai_tool_calls():
    replies = [
        {"role": "assistant", "content": None, "tool_calls": [
            _tool_call("c_A", "find_user_id_by_email", json.dumps({"email": "mia.garcia2723@example.com"}))]},
        {"role": "assistant", "content": None, "tool_calls": [
            _tool_call("c_B", "get_user_details", '{"user_id": ')]},  # truncated JSON arguments
        {"role": "assistant", "content": "", "tool_calls": [
            _tool_call("c_C", "transfer_to_human_agents", json.dumps({"summary": "cross refunds"}))]},
        {"role": "assistant", "content": "You are now with a human agent."},
    ]
    with serve(replies) as (requests, url):
        env = Tau2Env(TASKS, customer=scripted_customers())

        async def main():
            async with LLMUserClient(_config(url)) as client:
                return await play(env, EndpointAgent(client), "10")

        rep = run(main())

    assert len(requests) == 4 and rep["agent_turns"] == 4
    assert rep["termination"] == "user_stop" and rep["score"]["reward"] == 1.0  # task 10: transfer, DB untouched
    first = requests[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]  # the reset messages, once
    assert load_policy() in first["messages"][0]["content"]
    assert first["messages"][1]["content"] == first_person(TASKS["10"].instructions["reason_for_call"]).strip()
    # tau2's own schemas as the endpoint receives them, key order included
    assert json.dumps(first["tools"]) == json.dumps(list(tool_schemas()))
    assert sorted(t["function"]["name"] for t in first["tools"]) == list(TOOL_NAMES)
    # arguments parsed into the call the environment ran
    assert env.calls[0] == {"requestor": "assistant", "name": "find_user_id_by_email",
                            "arguments": {"email": "mia.garcia2723@example.com"}, "error": False,
                            "content": "mia_garcia_4516"}
    # the call id threads into the next request
    asst, tool = requests[1]["messages"][-2:]
    assert asst["role"] == "assistant" and [c["id"] for c in asst["tool_calls"]] == ["c_A"]
    assert json.loads(asst["tool_calls"][0]["function"]["arguments"]) == {"email": "mia.garcia2723@example.com"}
    assert tool == {"role": "tool", "content": "mia_garcia_4516", "name": "find_user_id_by_email",
                    "tool_call_id": "c_A"}
    # bad JSON arguments: no call runs, the agent gets an error tool message (it counts)
    asst, tool = requests[2]["messages"][-2:]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "c_B"  # servers reject a tool message without it
    assert tool["content"].startswith("Error: the tool call could not be parsed (bad_arguments)")
    assert asst["tool_calls"] == [_tool_call("c_B", "get_user_details", "{}")]
    assert [c["name"] for c in env.calls] == ["find_user_id_by_email", "transfer_to_human_agents"]
    assert env.errors == 1
    assert requests[3]["messages"][-1] == {"role": "tool", "content": "Transfer successful",
                                           "name": "transfer_to_human_agents", "tool_call_id": "c_C"}
    assert all("reaction" not in m for r in requests for m in r["messages"])  # labels stay private
    assert rep["messages"][-1] == {"role": "user", "content": TRANSFER, "reaction": "accept"}


def test_endpoint_eval_gives_the_agent_the_environments_prompt_not_the_user_simulators(tmp_path, capsys):
    from jaxagent import configlib
    from jaxagent.jobs.config import load_config
    from jaxagent.envs.user_prompt import DEFAULT_SYSTEM_PROMPT
    from jaxagent.envs.tau2.agents import EndpointConfig
    from jaxagent.envs.tau2.env import system_prompt
    from jaxagent.launch import main

    base = ["job=eval", "env.kind=tau2_retail", "eval.agent=endpoint", "eval.endpoint.base_url=http://127.0.0.1:1/v1",
            "eval.endpoint.model=m"]
    cfg = load_config(None, base)
    assert isinstance(cfg.eval.endpoint, EndpointConfig)
    assert not hasattr(cfg.eval.endpoint, "system_prompt") and not hasattr(cfg.eval.endpoint, "temperature")
    for key in ("system_prompt", "temperature", "opening_message"):   # not silently ignored: refused
        with pytest.raises(configlib.ConfigError, match=f"eval.endpoint.{key}: unknown key"):
            load_config(None, base + [f"eval.endpoint.{key}=x"])
    with pytest.raises(configlib.ConfigError, match="http:// or https://"):
        load_config(None, base + ["eval.endpoint.base_url=ftp://h"])
    assert cfg.eval.endpoint.client_config(0.25).temperature == 0.25

    replies = [{"role": "assistant", "content": None, "tool_calls": [
                   _tool_call("c_A", "transfer_to_human_agents", json.dumps({"summary": "s"}))]},
               {"role": "assistant", "content": "You are now with a human agent."}]
    with serve(replies) as (requests, url):
        assert main(["job=eval", "env=tau2_retail", "agent=endpoint", "env.tau2.tasks=10", "eval.temperature=0.25",
                     f"eval.endpoint.base_url={url}", "eval.endpoint.model=served", "eval.endpoint.max_retries=0",
                     "eval.endpoint.trust_env=false", f"runs_dir={tmp_path}", "name=ep", "progress=false"]) == 0
    first = requests[0]
    assert first["model"] == "served" and first["temperature"] == 0.25
    assert first["messages"][0] == {"role": "system", "content": system_prompt(load_policy())}
    assert all(DEFAULT_SYSTEM_PROMPT[:40] not in m["content"] for m in first["messages"])
    assert json.loads((tmp_path / "ep" / "summary.json").read_text())["reward"] == 1.0


# ============================================================================ failures: retried, counted, contained
class FlakyCustomer:
    """A ScriptedCustomer whose first ``respond`` (or ``opening``) raises (or hangs past a timeout)."""

    def __init__(self, task, view, mode="raise"):
        self.inner, self.mode, self.failed = ScriptedCustomer(task, view), mode, False
        self.heard = []

    async def opening(self):
        return await self.inner.opening()

    async def respond(self, text):
        if not self.failed:
            self.failed = True
            if self.mode == "hang":
                await asyncio.sleep(10)
            raise ConnectionError("injected customer failure")
        self.heard.append(text)
        return await self.inner.respond(text)

    async def aclose(self):
        return None


@pytest.mark.parametrize("mode", ["raise", "hang"])
def test_a_retried_step_after_a_customer_failure_commits_once(mode):
    from jaxagent.rollout.runner import EpisodeConfig, call_simulator

    customers = []

    def make(task, view):
        customers.append(FlakyCustomer(task, view, mode))
        return customers[-1]

    env = Tau2Env(TASKS, customer=make)
    counters = {"simulator_errors": 0}

    async def main():
        await env.reset("0", 0)
        msg = AgentMessage("What is your email address?")
        return await call_simulator(lambda: env.step(msg), EpisodeConfig(retries=2, timeout_s=0.5), counters)

    step = run(main())
    assert counters["simulator_errors"] == 1 and step is not None and not step.done
    assert env.steps == 3  # the opening, the agent's message, the customer's reply: each once
    assert [m["role"] for m in env.messages] == ["user", "assistant", "user"]
    assert customers[0].heard == ["What is your email address?"]


def test_an_llm_customer_failure_leaves_its_conversation_unchanged():
    from jaxagent.envs.llm_user import SimulatorError
    from jaxagent.envs.tau2.customer import LLMCustomer, customer_config

    with socket.socket() as sock:  # a port nobody listens on: every request fails
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    cust = LLMCustomer(LLMUserClient(customer_config(_config(url))), TASKS["0"])
    with pytest.raises(SimulatorError):
        run(cust.respond("hello"))
    assert cust.conversation == []  # a retry sends "hello" once, not twice


def test_a_judge_failure_is_retried_and_the_ending_resumes():
    task = TASKS["19"]
    verdict = json.dumps({"results": [{"expectedOutcome": a, "reasoning": "ok", "metExpectation": True}
                                      for a in task.nl_assertions]})
    with serve([{"role": "assistant", "content": None}, verdict]) as (requests, url):  # 1st: unusable body
        async def main():
            async with LLMUserClient(_config(url)) as judge:
                env = Tau2Env(TASKS, customer=scripted_customers(), scoring_mode="tau2", judge=judge)
                agent = OracleAgent()
                reset = await env.reset("19", 0)
                agent.start("19", reset, env)
                msgs, failures = reset.messages, 0
                while True:
                    msg = await agent.act(0)
                    while True:
                        try:
                            step = await env.step(msg)
                            break
                        except Exception:  # noqa: BLE001 - the loop's retry
                            failures += 1
                    if step.done:
                        return env, step, failures
                    msgs = step.messages

        env, step, failures = run(main())
    assert failures == 1 and len(requests) == 2
    assert env.termination == "user_stop" and step.reward == 1.0 and env.result.components["NL_ASSERTION"] == 1.0
    assert sum(m["role"] == "user" for m in env.messages) == sum(m["role"] == "user" for m in env.report()["messages"])


def test_evaluate_host_contains_a_failing_reset(monkeypatch):
    from jaxagent.envs.tau2.spec import Tau2Section
    from jaxagent.envs.tau2 import env as env_module
    from jaxagent.envs.tau2.harness import Tau2EnvFactory
    from jaxagent.rollout.runner import play_tasks

    real = env_module.scoring.initial_db
    calls = []

    def flaky_initial_db(task, data_dir=None):
        calls.append(task.id)
        if task.id == "1":
            raise OSError("disk gone")
        return real(task, data_dir)

    monkeypatch.setattr(env_module.scoring, "initial_db", flaky_initial_db)
    factory = Tau2EnvFactory(Tau2Section(tasks="0,1,2"))
    factory.record(False)
    reports = run(play_tasks(factory, lambda env, seed: OracleAgent(), factory.task_ids, k=1, concurrency=2))
    by = {r["task_id"]: r for r in reports}
    assert set(by) == {"0", "1", "2"}
    assert by["1"]["termination"] == "simulator_failure" and "disk gone" in by["1"]["error"]
    assert by["0"]["score"]["reward"] == 1.0 and by["2"]["score"]["reward"] == 1.0

"""tau2 telecom with an LLM customer over HTTP: a loopback chat-completions server scripted to return
tool calls plays the customer through an episode. Its device actions run on the phone, their results go
back to it (and never to the agent), the env assertions score the end state, and a turn that fails
after its device actions were done continues on retry without doing them twice."""

import asyncio
import json

import pytest

from jaxagent.envs.base import AgentMessage
from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig, SimulatorError
from jaxagent.envs.tau2.customer import GREETING, TOOLS_GUIDELINES_FILE, customer_config
from jaxagent.envs.tau2.env import Tau2Env, llm_customers
from jaxagent.envs.tau2.tasks import load_task_set, render_scenario
from jaxagent.text.toolcalls import ToolCall
from tests.loopback import chat_server as serve

TASKS = load_task_set(domain="telecom")
# data saver on and data usage over the limit: the fix is the user's toggle_data_saver_mode and the
# agent's refuel_data of 2.0 GB; assertions: mobile data works, speed >= 200 (excellent), 2.0 GB refuelled
TID = next(t for t in TASKS if t.startswith("[mobile_data_issue]data_saver_mode_on|data_usage_exceeded[PERSONA:Easy]"))


def _config(url, retries=0):
    return LLMUserConfig(base_url=url, model="sim", temperature=0.0, max_retries=retries, connect_timeout_s=2.0,
                         read_timeout_s=10.0, trust_env=False, backoff_base_s=0.01)


def tool_call(name, arguments, i):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def said(text, strategy="provide_info"):
    return json.dumps({"utterance": text, "strategy": strategy})


def test_llm_customer_acts_on_its_phone_and_the_env_assertions_score_it():
    replies = [said("My mobile data is very slow."),                          # opening
               tool_call("toggle_data_saver_mode", {}, 1),                    # asked to turn data saver off
               said("Done, data saver is off now."),
               said("Yes, please refuel 2.0 GB.", "confirm"),
               tool_call("run_speed_test", {}, 2),                           # checks after the refuel
               said("The speed test says excellent. ###STOP###", "accept")]
    with serve(replies) as (requests, url):
        async def main():
            async with LLMUserClient(customer_config(_config(url))) as client:
                env = Tau2Env(TASKS, customer=llm_customers(client), domain="telecom")
                reset = await env.reset(TID, 0)
                s1 = await env.step(AgentMessage("Please turn off data saver mode on your phone."))
                s2 = await env.step(AgentMessage("May I refuel 2.0 GB of data for $4.00?"))
                s3 = await env.step(AgentMessage("", (ToolCall("refuel_data", {"customer_id": "C1001",
                                                                               "line_id": "L1002", "gb_amount": 2.0}),)))
                s4 = await env.step(AgentMessage("Done. Please run a speed test."))
                return env, reset, s1, s2, s3, s4

        env, reset, s1, s2, s3, s4 = asyncio.run(main())

    assert len(requests) == 6
    first = requests[0]
    assert first["tools"] and len(first["tools"]) == 30 and first["messages"][1] == {"role": "user", "content": GREETING}
    system = first["messages"][0]["content"]
    # tau2's prompt: the guidelines verbatim (ending in a newline), a blank line, the scenario
    assert system.startswith(TOOLS_GUIDELINES_FILE.read_text() + "\n\n" + render_scenario(TASKS[TID]) + "\n\n")
    # the device action's result went back to the simulator as a tool message answering its call
    tool_msgs = [m for m in requests[2]["messages"] if m["role"] == "tool"]
    assert tool_msgs == [{"role": "tool", "tool_call_id": "c1",
                          "content": tool_msgs[0]["content"]}] and "Data Saver Mode is now OFF." in tool_msgs[0]["content"]
    # ... and never to the agent: its observations are the customer's texts and its own tool's result
    seen = [m.content for s in (s1, s2, s3, s4) for m in s.messages] + [m.content for m in reset.messages]
    assert not any("Data Saver Mode is now" in c or "Speed Test Result" in c for c in seen)
    assert s1.messages[0].content == "Done, data saver is off now." and s1.messages[0].reaction == "provide_info"
    assert s4.done and s4.info["termination"] == "user_stop" and s4.reward == 1.0
    report = env.report()
    assert report["score"]["components"]["ENV_ASSERTION"] == 1.0
    assert report["score"]["details"]["env_assertions"] == [True, True, True]
    user_calls = [c for c in env.calls if c["requestor"] == "user"]
    assert [c["name"] for c in user_calls] == ["toggle_data_saver_mode", "run_speed_test"]
    # no network search since loading: 5G at the loaded "good" signal (spec 4.1: 220, not 275)
    assert "Speed Test Result: 220.00 Mbps (Excellent)" in user_calls[1]["content"]
    roles = [(m["role"], bool(m.get("tool_calls"))) for m in report["messages"]]
    assert roles[:5] == [("user", False), ("assistant", False), ("user", True), ("tool", False), ("user", False)]


def test_a_turn_that_fails_after_its_device_action_continues_on_retry():
    # the second simulator request fails (HTTP 500, not retried by the client): the device action of the
    # first request is done and stays done; the rollout loop's retry of the step continues the same turn
    replies = [said("My mobile data is very slow."), tool_call("toggle_data_saver_mode", {}, 1),
               {"status": 500}, said("Done.")]
    with serve(replies) as (requests, url):
        async def main():
            async with LLMUserClient(customer_config(_config(url))) as client:
                env = Tau2Env(TASKS, customer=llm_customers(client), domain="telecom")
                await env.reset(TID, 0)
                message = AgentMessage("Please turn off data saver mode on your phone.")
                with pytest.raises(SimulatorError):
                    await env.step(message)
                step = await env.step(message)
                return env, step

        env, step = asyncio.run(main())
    assert [c["name"] for c in env.calls] == ["toggle_data_saver_mode"]   # done once
    assert step.messages[0].content == "Done."
    agent_texts = [m for m in env.messages if m["role"] == "assistant"]
    assert len(agent_texts) == 1   # the agent's message committed once, with the turn
    last = requests[-1]["messages"]
    assert [m["role"] for m in last[1:]] == ["user", "assistant", "user", "assistant", "tool"]

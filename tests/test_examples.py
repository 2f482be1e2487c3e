"""examples/pizza_desk.py, a user's environment in one file outside the package: its protocol by
hand (reset, asking, ordering, rewards, errors, the customer leaving), its settings through
env.options, its demonstrations, and the quickstart's own command training and evaluating it."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.pizza_desk import PIZZA_DESK, PizzaDesk, PizzaSettings, task_ids, task_of
from jaxagent import configlib
from jaxagent.envs.base import AgentMessage
from jaxagent.envs.registry import DemoRequest, EnvContext, resolve_env
from jaxagent.jobs.sections import env_settings
from jaxagent.jobs.config import load_config
from jaxagent.rollout.demos import play_demos
from jaxagent.text.toolcalls import ToolCall

KIND = "examples.pizza_desk:PIZZA_DESK"
ROOT = Path(__file__).resolve().parents[1]


def order(size, topping):
    return AgentMessage("", (ToolCall("order_pizza", {"size": size, "topping": topping}),))


def test_asking_then_ordering_right_scores_one():
    async def play():
        env = PizzaDesk(PizzaSettings())
        reset = await env.reset("pizza:train:0:3", 0)
        name, topping, size = task_of("pizza:train:0:3", PizzaSettings().sizes)
        assert reset.messages[1].content == f"hi , i am {name} . i want a {topping} pizza ."
        assert [t["function"]["name"] for t in reset.tools] == ["order_pizza"]
        vague = await env.step(AgentMessage("hello !"))
        assert (vague.messages[0].content, vague.messages[0].reaction, vague.done) == (
            "i just want my pizza .", "be_vague", False)
        asked = await env.step(AgentMessage("which size ?"))
        assert (asked.messages[0].content, asked.messages[0].reaction) == (f"{size} please .", "provide_info")
        done = await env.step(order(size, topping))
        assert done.done and done.reward == 1.0 and env.outcome_reward() == 1.0
        assert done.messages[-1].reaction == "accept"

    asyncio.run(play())


def test_wrong_size_half_wrong_topping_zero_and_the_customer_leaves():
    async def play(msgs, task="pizza:train:0:1"):
        env = PizzaDesk(PizzaSettings(max_turns=3))
        await env.reset(task, 0)
        step = None
        for m in msgs:
            step = await env.step(m)
        return env, step

    _, topping, size = task_of("pizza:train:0:1", PizzaSettings().sizes)
    other = next(s for s in PizzaSettings().sizes if s != size)
    env, step = asyncio.run(play([order(other, topping)]))
    assert step.reward == 0.5 and step.messages[-1].reaction == "complain"
    env, step = asyncio.run(play([order(size, "anchovy")]))
    assert step.reward == 0.0
    env, step = asyncio.run(play([AgentMessage("", (ToolCall("order_pizza", {"size": 3}),))]))
    assert not step.done and step.messages[0].content.startswith("error")
    env, step = asyncio.run(play([AgentMessage("hm")] * 3))  # max_turns=3: the customer leaves
    assert step.done and step.reward == 0.0 and step.messages[-1].content == "never mind , goodbye ."
    assert env.outcome_reward() == 0.0


def test_train_and_test_tasks_never_share_content():
    train = {task_of(t, ("s", "m", "l")) for t in task_ids("train", 300, 0)}
    test = {task_of(t, ("s", "m", "l")) for t in task_ids("test", 100, 0)}
    assert train and test and not train & test


def test_demonstrations_reach_the_top_reward_and_train_on_the_agent_turns():
    setup = PIZZA_DESK.build(EnvContext(settings=PizzaSettings(), train_tasks=8, test_tasks=2))
    demos = play_demos(PIZZA_DESK.demonstrations(EnvContext(settings=PizzaSettings()), setup, DemoRequest(n=5)))
    assert len(demos) == 5 and all(d.reward == 1.0 for d in demos)
    for d in demos:
        assert [m["role"] for m, t in zip(d.messages, d.train) if t] == ["assistant", "assistant"]
        assert d.messages[-1]["tool_calls"][0]["function"]["name"] == "order_pizza"


def test_options_are_the_environments_settings_and_are_checked():
    cfg = load_config(overrides=[f"env.kind={KIND}", "env.options.sizes=[small, large]", "env.options.max_turns=3"])
    assert resolve_env(KIND) is PIZZA_DESK and cfg.env.spec is PIZZA_DESK
    assert env_settings(cfg.env) == PizzaSettings(sizes=("small", "large"), max_turns=3)
    assert cfg.name == "sft+rl-pizza_desk"  # <job>-<the spec's name>
    with pytest.raises(configlib.ConfigError, match=r"env.options.max_turns=1: expected an integer >= 2"):
        load_config(overrides=[f"env.kind={KIND}", "env.options.max_turns=1"])
    with pytest.raises(configlib.ConfigError, match=r"env.options.colour: unknown key"):
        load_config(overrides=[f"env.kind={KIND}", "env.options.colour=red"])
    with pytest.raises(configlib.ConfigError, match=r"has no attribute 'NOPE'.*PIZZA_DESK"):
        load_config(overrides=["env.kind=examples.pizza_desk:NOPE"])


@pytest.mark.slow
def test_the_quickstart_command_trains_and_evaluates_it(tmp_path):
    """The default job (sft+rl) on the example: SFT on its demonstrations alone takes the greedy
    policy from 0 to >= 0.9 success on held-out tasks (measured 1.0 of 16 with these settings)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-m", "jaxagent.launch", f"env.kind={KIND}", f"runs_dir={tmp_path}", "name=pizza",
         "progress=false", "steps=1", "sft.steps=150", "sft.demos=128", "eval.tasks=16", "eval.sampled_k=1",
         "rl.tasks_per_step=2", "rl.minibatch_size=16"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "pizza" / "summary.json").read_text())
    assert summary["env"] == KIND and summary["job"] == "sft+rl" and summary["eval_tasks"] == 16
    assert summary["success_before"] <= 0.2 and summary["success_after_sft"] >= 0.9, summary
    assert (tmp_path / "pizza" / "hf" / "config.json").is_file()

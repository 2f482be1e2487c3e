"""Shared by the tau2 retail tests: the task set, hand-checked constants, and a customer that
records what it was told."""

import asyncio


from jaxagent.credit.reaction import DEFAULT_POLARITY
from jaxagent.envs.base import AgentMessage
from jaxagent.envs.tau2.domains.retail.customer import ScriptedCustomer
from jaxagent.envs.tau2.env import Tau2Env
from jaxagent.envs.tau2.tasks import (
    load_task_set,
)
from jaxagent.text.toolcalls import ToolCall

TASKS = load_task_set()
INITIAL_HASH = "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c"  # spec 4.2
NO_WRITE_TASKS = {"10", "24", "25", "50", "57", "67", "105"}  # spec 4.3: target == initial DB
RFC_0 = ("I received my order #W2378156 and wish to exchange the mechanical keyboard for the same one but with "
         "clicky switches and the smart thermostat for one compatible with Google Home instead of Apple HomeKit. "
         "If there is no keyboard that is clicky, RGB backlight, full size, I'd go for no backlight.")
EXCHANGE_0 = {"order_id": "#W2378156", "item_ids": ["1151293680", "4983901480"],
              "new_item_ids": ["7706410293", "7747408585"], "payment_method_id": "credit_card_9513926"}


def run(coro):
    return asyncio.run(coro)


def call(name, **args):
    return AgentMessage("", (ToolCall(name, args),))


class SpyCustomer:
    """A ScriptedCustomer that records what it was told."""

    def __init__(self, task, view, **kw):
        self.inner = ScriptedCustomer(task, view, **kw)
        self.heard = []

    async def opening(self):
        return await self.inner.opening()

    async def respond(self, text):
        self.heard.append(text)
        return await self.inner.respond(text)

    async def aclose(self):
        return None


def spy_env(**kw):
    spies = []

    def make(task, view):
        spies.append(SpyCustomer(task, view, **kw.pop("customer_kw", {})))
        return spies[-1]

    return Tau2Env(TASKS, customer=make, **kw), spies


async def episode(env, task_id, turns):
    """reset, then each turn in order; returns (reset, [steps])."""
    reset = await env.reset(task_id, 0)
    steps = []
    for t in turns:
        steps.append(await env.step(t))
    return reset, steps


def reply_text(step):
    assert len(step.messages) == 1 and step.messages[0].role == "user"
    m = step.messages[0]
    assert m.reaction in DEFAULT_POLARITY
    return m.content, m.reaction

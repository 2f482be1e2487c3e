"""A complete jaxagent environment in one file: a pizza desk where the order leaves out the size.

The customer says which topping they want but not which size; the agent has to ask, then call the
``order_pizza`` tool with both. Asking is what decides success: an agent that orders at once
guesses one size in three. Train and evaluate it with the quickstart's own command:

    python -m jaxagent.launch env.kind=examples.pizza_desk:PIZZA_DESK
    python -m jaxagent.launch env.kind=examples.pizza_desk:PIZZA_DESK env.options.sizes=[small,large] steps=8

(run from the repository root, so that ``examples`` is importable; any module on ``sys.path``
works the same way). Everything jaxagent needs from an environment is here, and
docs/ENVIRONMENTS.md explains each piece:

- `PizzaDesk`, an `Environment`: ``reset`` (the opening messages and the tool schemas), ``step``
  (a tool result and/or the customer's reply with its private reaction label), ``outcome_reward``
  and ``aclose``;
- `PizzaSettings`, the environment's own settings (``env.options.*`` on the command line);
- `Expert` and `demonstrations`: the expert's episodes for SFT (an `Agent`, played by jaxagent's
  episode runner as every agent is);
- `PIZZA_DESK`, the `EnvSpec` that ``env.kind=examples.pizza_desk:PIZZA_DESK`` names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random

from jaxagent.envs.base import Agent, AgentMessage, CallableEnvFactory, EnvMessage, Environment, Reset, Step
from jaxagent.envs.registry import DemoPlan, DemoRequest, EnvContext, EnvSetup, EnvSpec
from jaxagent.text.toolcalls import ToolCall

NAMES = ("ana", "ben", "carla", "dev", "eli", "fay", "gus", "hana", "ivo", "jun", "kai", "lea")
TOPPINGS = ("cheese", "ham", "olive", "onion", "pepper", "tomato")
TOOL = {
    "type": "function",
    "function": {
        "name": "order_pizza",
        "description": "Place the customer's order. Call it once you know the size and the topping.",
        "parameters": {
            "type": "object",
            "properties": {"size": {"type": "string"}, "topping": {"type": "string"}},
            "required": ["size", "topping"],
        },
    },
}
SYSTEM = "you take pizza orders . ask the customer for what you do not know , then call order_pizza ."
LABELS = ("provide_info", "be_vague", "accept", "complain")  # the customer's private reactions (Faca)


@dataclasses.dataclass(frozen=True)
class PizzaSettings:
    """``env.options``: the sizes a pizza comes in, and the agent messages before the customer leaves."""

    sizes: tuple[str, ...] = ("small", "medium", "large")
    max_turns: int = 4

    def __post_init__(self) -> None:
        if len(self.sizes) < 2 or len(set(self.sizes)) != len(self.sizes):
            raise ValueError(f"sizes={list(self.sizes)}: expected at least two different sizes")
        if self.max_turns < 2:
            raise ValueError(f"max_turns={self.max_turns}: expected an integer >= 2 (one question, one order)")


def task_ids(split: str, n: int, seed: int) -> list[str]:
    """``pizza:<split>:<seed>:<i>``; a task's content comes from its id alone (`task_of`)."""
    return [f"pizza:{split}:{seed}:{i}" for i in range(n)]


def task_of(task_id: str, sizes: tuple[str, ...]) -> tuple[str, str, str]:
    """(name, topping, size) of ``task_id``: drawn from the id until the content's hash puts it in the
    id's split (1 in 5 contents is ``test``), so train and test tasks never share content."""
    _, split, _, _ = task_id.split(":")
    for attempt in range(1000):
        rng = random.Random(f"{task_id}|{attempt}")
        content = (rng.choice(NAMES), rng.choice(TOPPINGS), rng.choice(sizes))
        digest = hashlib.sha256("|".join(content).encode()).digest()[0]
        if ("test" if digest % 5 == 0 else "train") == split:
            return content
    raise RuntimeError(f"no {split} content for {task_id!r}")  # pragma: no cover


class PizzaDesk(Environment):
    """One order. Text goes to the customer; ``order_pizza(size, topping)`` ends the episode with
    reward 1 (both right), 0.5 (the topping right) or 0."""

    def __init__(self, settings: PizzaSettings):
        self.settings = settings
        self.name = self.topping = self.size = ""
        self.turns, self.done, self.reward = 0, False, 0.0

    async def reset(self, task_id: str, seed: int) -> Reset:
        self.name, self.topping, self.size = task_of(task_id, self.settings.sizes)
        self.turns, self.done, self.reward = 0, False, 0.0
        opening = f"hi , i am {self.name} . i want a {self.topping} pizza ."
        return Reset((EnvMessage("system", SYSTEM), EnvMessage("user", opening)), (TOOL,))

    async def step(self, message: AgentMessage) -> Step:
        if self.done:
            return Step((EnvMessage("tool", "error : the order is closed .", name="order_pizza"),), 0.0, True)
        self.turns += 1
        out = [EnvMessage("tool", f"error : {e} .", name="order_pizza") for e in message.call_errors]
        for call in message.tool_calls:
            args = call.arguments if isinstance(call.arguments, dict) else {}
            if call.name != "order_pizza" or not isinstance(args.get("size"), str) \
                    or not isinstance(args.get("topping"), str):
                out.append(EnvMessage("tool", "error : call order_pizza with a size and a topping .",
                                      name="order_pizza"))
                continue
            right = (args["size"].strip().lower() == self.size, args["topping"].strip().lower() == self.topping)
            self.reward = 1.0 if all(right) else 0.5 if right[1] else 0.0
            out.append(EnvMessage("tool", "order placed .", name="order_pizza"))
            out.append(EnvMessage("user", "thanks , that is it !" if all(right) else "that is not what i asked for .",
                                  reaction="accept" if all(right) else "complain"))
            self.done = True
            return Step(tuple(out), self.reward, True)
        if not message.tool_calls and not message.call_errors:  # text: the customer answers
            asked = "size" in message.content.lower() or any(s in message.content.lower() for s in self.settings.sizes)
            out.append(EnvMessage("user", f"{self.size} please ." if asked else "i just want my pizza .",
                                  reaction="provide_info" if asked else "be_vague"))
        if self.turns >= self.settings.max_turns:
            out.append(EnvMessage("user", "never mind , goodbye .", reaction="complain"))
            self.done = True
            return Step(tuple(out), 0.0, True)
        return Step(tuple(out), 0.0, False)

    def outcome_reward(self) -> float:
        return self.reward if self.done else float("nan")

    async def aclose(self) -> None:
        return None  # nothing to release: no HTTP client, no file


def build(ctx: EnvContext) -> EnvSetup:
    settings = ctx.settings or PizzaSettings()
    return EnvSetup(CallableEnvFactory(lambda: PizzaDesk(settings)),
                    task_ids("train", ctx.train_tasks, ctx.task_seed), task_ids("test", ctx.test_tasks, ctx.task_seed))


class Expert(Agent):
    """The demonstrations' agent: asks for the size, then orders what the customer said."""

    def start(self, task_id: str, reset: Reset, env: Environment) -> None:
        self.topping = reset.messages[1].content.split(" want a ")[1].split()[0]  # the opening names it
        self.size = ""

    def observe(self, messages, info) -> bool:
        self.size = messages[-1].content.split()[0]  # "<size> please ."
        return True

    async def act(self, turn: int) -> AgentMessage:
        if turn == 0:
            return AgentMessage("what size do you want ?")
        return AgentMessage("", (ToolCall("order_pizza", {"size": self.size, "topping": self.topping}),))


def demonstrations(ctx: EnvContext, setup: EnvSetup, request: DemoRequest) -> DemoPlan:
    """The expert on the first ``request.n`` train tasks; jaxagent plays them through its episode
    runner, so each demonstration is exactly what an episode shows the agent."""
    return DemoPlan(make_env=setup.factory, episodes=[(t, 0) for t in task_ids("train", request.n, ctx.task_seed)],
                    agent=lambda task_id, seed: Expert(), max_turns=2)


PIZZA_DESK = EnvSpec(
    name="pizza_desk", build=build, settings_type=PizzaSettings, demonstrations=demonstrations, reaction_labels=LABELS,
    description="a pizza desk where the order leaves out the size (examples/pizza_desk.py)")

"""Function gym: a hidden rule f(a,b,c,d) = w1*a + w2*b + w3*c + w4*d + k (w in 0..3, k in 0..5).

The user asks for f on a held-out case. An ``action`` with four numbers from 0 to 5 probes f there
(``provide_info``); the held-out case itself is refused (``reject``), a repeated probe gets a
``complain``, anything else a ``clarify_request``. The ``answer``'s first number must be f of the
held-out case: reward 1, else 0.

Feedback kinds: a probe's value is ``information``; the refusal, the repeat (which restates the
value) and the clarify request are ``corrections``. Replies are not enumerated (no marginal prior).
"""

from __future__ import annotations

import random
import re

from jaxagent.envs.base import AgentMessage, EnvMessage
from jaxagent.envs.gyms.common import ScriptedGym, act, answer, tokenize

LO, HI = 0, 5
WEIGHTS = (0, 1, 2, 3)
OFFSETS = tuple(range(6))
MAX_OUT = 4 * max(WEIGHTS) * HI + max(OFFSETS)
_INT = re.compile(r"\d+")


def apply(task, x) -> int:
    return sum(w * v for w, v in zip(task["w"], x)) + task["k"]


def fmt(x) -> str:
    return "f ( " + " , ".join(str(v) for v in x) + " )"


_TEXTS = ("there is a hidden rule f of four numbers a , b , c and d , each from 0 to 5 . ask for f of "
          "any four numbers with action , then give the number i ask for with answer .",
          "what is ? f ( , , , ) is .", "please give four numbers from 0 to 5 .",
          "that is the question . try other numbers . you asked that already : "
          "yes , that is right . no , the answer is .")


class FunctionGym(ScriptedGym):
    name = "function"
    default_max_steps = 12
    extra_words = frozenset({*(w for text in _TEXTS for w in tokenize(text)),
                             *(str(i) for i in range(MAX_OUT + 1))})

    @staticmethod
    def generate(rng: random.Random):
        w = tuple(rng.choice(WEIGHTS) for _ in range(4))
        k = rng.choice(OFFSETS)
        while True:
            x = tuple(rng.randint(LO, HI) for _ in range(4))
            if sum(v != 0 for v in x) >= 2:   # not a probe the expert makes
                return {"w": w, "k": k, "query": x}

    @staticmethod
    def signature(task) -> str:
        return f"{task['w']}|{task['k']}|{task['query']}"

    def system_prompt(self) -> str:
        return _TEXTS[0]

    def opening(self) -> str:
        return f"what is {fmt(self.task['query'])} ?"

    def init_state(self):
        return {"probes": {}}

    def on_action(self, content: str) -> EnvMessage:
        nums = [int(m) for m in _INT.findall(content)]
        if len(nums) != 4 or not all(LO <= v <= HI for v in nums):
            return self.say("clarify_request", "please give four numbers from 0 to 5 .", kind="correction")
        x = tuple(nums)
        if x == self.task["query"]:
            return self.say("reject", "that is the question . try other numbers .", kind="correction")
        y = apply(self.task, x)
        if x in self.state["probes"]:
            return self.say("complain", f"you asked that already : {fmt(x)} is {y} .", kind="correction")
        self.state["probes"][x] = y
        return self.say("provide_info", f"{fmt(x)} is {y} .", kind="information")

    def on_answer(self, content: str):
        nums = _INT.findall(content)
        target = apply(self.task, self.task["query"])
        if nums and int(nums[0]) == target:
            return 1.0, self.say("accept", "yes , that is right .")
        return 0.0, self.say("reject", f"no , the answer is {target} .")


_BASIS = ((0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1))


def expert_policy(env: FunctionGym) -> AgentMessage:
    """Probes the origin and the four unit vectors, then solves for w and k from the answers."""
    probes = env.state["probes"]
    for x in _BASIS:
        if x not in probes:
            return act(f"what is {fmt(x)} ?")
    k = probes[_BASIS[0]]
    w = [probes[x] - k for x in _BASIS[1:]]
    q = env.task["query"]
    return answer(str(sum(wi * v for wi, v in zip(w, q)) + k))


def random_policy(rng: random.Random | int):
    """Probes random points, or (1 in 5) answers a random number."""
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)

    def policy(env: FunctionGym) -> AgentMessage:
        if rng.random() < 0.2:
            return answer(str(rng.randint(0, MAX_OUT)))
        return act(f"what is {fmt(tuple(rng.randint(LO, HI) for _ in range(4)))} ?")

    return policy

"""Preference gym (travel-like): pick the option the user likes best.

``search`` lists five flights (or hotels), each with one value per aspect. The user has a hidden
preferred value and weight (3, 2 or 1: "a lot", "some", "a little") per aspect; an ``action``
naming one aspect reveals it (``provide_info``); several aspects get a ``complain``, none a
``clarify_request``, a repeat a ``correct``. The best option (highest summed weight of matched
preferences) is unique. The ``answer``'s first number names the chosen option: reward 1 for the
best, else 0.

Feedback kinds: a revealed preference is ``information``; the complaint, the clarify request and
the repeat (which restates the preference) are ``corrections``. Replies are not enumerated (no
marginal prior).
"""

from __future__ import annotations

import random
import re

from jaxagent.envs.base import AgentMessage, EnvMessage
from jaxagent.envs.gyms.common import ScriptedGym, act, answer, pick, search, tokenize

DOMAINS: dict[str, dict[str, tuple[str, ...]]] = {
    "flight": {"price": ("cheap", "medium", "pricey"), "time": ("morning", "noon", "evening"),
               "seat": ("window", "aisle", "middle")},
    "hotel": {"price": ("cheap", "medium", "pricey"), "area": ("center", "beach", "airport"),
              "room": ("single", "double", "suite")},
}
N_OPTIONS = 5
WEIGHT_WORDS = {3: "a lot", 2: "some", 1: "a little"}
_INT = re.compile(r"\d+")

_TEXTS = ("you help the user choose a . search to see the options , ask the user about one aspect at a "
          "time with action , then give the number of the one you choose with answer . the aspects are : .",
          "i need a . please find me a good .", "1 2 3 4 5 :",
          "i want , it matters . please ask about one aspect . please ask one thing at a time . "
          "i already told you . great , i will take it . no , that is not the best for me .",
          "what about the ?", "i choose", "show options")


def utility(task, option) -> int:
    return sum(w for a, (v, w) in task["prefs"].items() if option[a] == v)


class PreferenceGym(ScriptedGym):
    name = "preference"
    default_max_steps = 10
    extra_words = frozenset(
        w for text in (*_TEXTS, *WEIGHT_WORDS.values(), *DOMAINS, *(a for d in DOMAINS.values() for a in d),
                       *(v for d in DOMAINS.values() for vs in d.values() for v in vs))
        for w in tokenize(text))

    @staticmethod
    def generate(rng: random.Random):
        domain = pick(rng, sorted(DOMAINS))
        aspects = DOMAINS[domain]
        weights = [3, 2, 1]
        rng.shuffle(weights)
        prefs = {a: (pick(rng, vs), w) for (a, vs), w in zip(aspects.items(), weights)}
        task = {"domain": domain, "prefs": prefs}
        while True:
            options = [{a: pick(rng, vs) for a, vs in aspects.items()} for _ in range(N_OPTIONS)]
            us = [utility(task, o) for o in options]
            if us.count(max(us)) == 1 and len({tuple(o.values()) for o in options}) == N_OPTIONS:
                task["options"] = options
                task["best"] = us.index(max(us)) + 1
                return task

    @staticmethod
    def signature(task) -> str:
        return "|".join([task["domain"], repr(sorted(task["prefs"].items())),
                         *(",".join(o.values()) for o in task["options"])])

    def system_prompt(self) -> str:
        d = self.task["domain"]
        return (f"you help the user choose a {d} . search to see the options , ask the user about one aspect "
                f"at a time with action , then give the number of the one you choose with answer . "
                f"the aspects are : {' , '.join(DOMAINS[d])} .")

    def opening(self) -> str:
        d = self.task["domain"]
        return self.rng.choice((f"i need a {d} .", f"please find me a good {d} ."))

    def init_state(self):
        return {"revealed": [], "searched": False}

    def on_search(self, content: str) -> str:
        self.state["searched"] = True
        d = self.task["domain"]
        return " ".join(f"{d} {i} : {' , '.join(o.values())} ." for i, o in enumerate(self.task["options"], 1))

    def on_action(self, content: str) -> EnvMessage:
        words = set(tokenize(content))
        asked = [a for a in DOMAINS[self.task["domain"]] if a in words]
        if not asked:
            return self.say("clarify_request", "please ask about one aspect .", kind="correction")
        if len(asked) > 1:
            return self.say("complain", "please ask one thing at a time .", kind="correction")
        a = asked[0]
        v, w = self.task["prefs"][a]
        if a in self.state["revealed"]:
            return self.say("correct", f"i already told you . i want {v} , it matters {WEIGHT_WORDS[w]} .",
                            kind="correction")
        self.state["revealed"].append(a)
        return self.say("provide_info", f"i want {v} , it matters {WEIGHT_WORDS[w]} .", kind="information")

    def on_answer(self, content: str):
        nums = _INT.findall(content)
        if nums and int(nums[0]) == self.task["best"]:
            return 1.0, self.say("accept", "great , i will take it .")
        return 0.0, self.say("reject", "no , that is not the best for me .")


def expert_policy(env: PreferenceGym) -> AgentMessage:
    """Searches, asks about every aspect, then picks the option of highest utility."""
    t, st = env.task, env.state
    if not st["searched"]:
        return search(f"show {t['domain']} options")
    for a in DOMAINS[t["domain"]]:
        if a not in st["revealed"]:
            return act(f"what about the {a} ?")
    us = [utility(t, o) for o in t["options"]]
    return answer(f"i choose {t['domain']} {us.index(max(us)) + 1} .")


def random_policy(rng: random.Random | int):
    """Searches, asks about a random aspect, or (1 in 4) picks a random option."""
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)

    def policy(env: PreferenceGym) -> AgentMessage:
        d = env.task["domain"]
        u = rng.random()
        if u < 0.25:
            return answer(f"i choose {d} {rng.randint(1, N_OPTIONS)} .")
        if u < 0.4:
            return search(f"show {d} options")
        return act(f"what about the {pick(rng, sorted(DOMAINS[d]))} ?")

    return policy

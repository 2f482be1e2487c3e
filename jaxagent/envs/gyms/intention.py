"""Intention gym: an underspecified request; hidden missing details of different importance.

The user states a request and one detail; 2 to 4 of the remaining details are hidden and matter
(importance 3, 2 or 1), the others do not. Asking about one detail (an ``action`` naming one detail
word) reveals it (``provide_info``); a detail that does not matter gets "i do not mind"
(``be_vague``); asking about several at once reveals nothing and costs ``MULTI_PENALTY``
(``complain``). The ``answer`` is the final plan; reward = (importance of the hidden details whose
value the answer states, and no other value of that detail) / (total importance)
- ``MULTI_PENALTY`` per multi-question, floored at 0. A question about a detail the user already
gave gets "i already told you ." (``correct``), without the value again.

Feedback kinds: the detail's value (``provide_info``) and "i do not mind" (``be_vague``) are
``information``; "i already told you", "please ask about one detail" (``clarify_request``) and
"please ask one thing at a time" (``complain``) are ``corrections``. Every reply carries its
alternatives: asked about a detail not yet given, the user could name each of its three values or
not mind; the detail matters with the posterior probability that it is hidden (2 to 4 of the 4
unstated details are, uniformly; those asked so far condition it: `p_matters`), each value then
equally likely.
"""

from __future__ import annotations

import math
import random
from typing import Any

from jaxagent.envs.base import AgentMessage, EnvMessage
from jaxagent.envs.gyms.common import ScriptedGym, act, answer, pick, tokenize

MULTI_PENALTY = 0.25

DOMAINS: dict[str, dict[str, tuple[str, ...]]] = {
    "book a table": {"time": ("noon", "evening", "night"), "people": ("two", "four", "six"),
                     "food": ("pizza", "sushi", "curry"), "area": ("town", "beach", "park"),
                     "budget": ("cheap", "normal", "fancy")},
    "plan a trip": {"city": ("paris", "rome", "tokyo"), "month": ("may", "june", "july"),
                    "transport": ("train", "plane", "car"), "hotel": ("hostel", "inn", "resort"),
                    "budget": ("cheap", "normal", "fancy")},
    "buy a gift": {"person": ("mom", "dad", "friend"), "item": ("book", "watch", "scarf"),
                   "color": ("red", "blue", "green"), "budget": ("cheap", "normal", "fancy"),
                   "day": ("monday", "friday", "sunday")},
    "fix my computer": {"system": ("windows", "linux", "mac"), "problem": ("slow", "crash", "noise"),
                        "device": ("laptop", "desktop", "tablet"), "deadline": ("today", "tomorrow", "later"),
                        "budget": ("cheap", "normal", "fancy")},
}

_TEXTS = ("you help the user . the details are : . ask the user about one detail at a time with action , "
          "then give the final plan with answer , as detail value pairs .",
          "i want to . the is .", "sent", "what is the ?",
          "i do not mind . any is fine . what do you mean ? please ask about one detail . "
          "please ask one thing at a time . i already told you , the is . "
          "that covers it , thank you ! that is not what i wanted . you missed some details .")


def p_matters(important: int, vague: int, unstated: int = 4, hidden: tuple[int, ...] = (2, 3, 4)) -> float:
    """The probability that a detail not asked yet is hidden (matters), given ``important`` asked
    details that mattered and ``vague`` that did not, among ``unstated`` details of which n in
    ``hidden`` (uniformly) are hidden, as a uniformly random subset: P(n | seen) is proportional to
    C(n, important) C(unstated - n, vague), and then (n - important) / (unstated - asked)."""
    left = unstated - important - vague
    if left <= 0:
        return 0.0
    w = {n: math.comb(n, important) * math.comb(unstated - n, vague) for n in hidden}
    total = sum(w.values())
    return sum(w[n] * (n - important) / left for n in hidden) / total


class IntentionGym(ScriptedGym):
    name = "intention"
    default_max_steps = 12
    enumerates_replies = True
    extra_words = frozenset(
        w for text in (*_TEXTS, *DOMAINS, *(s for d in DOMAINS.values() for s in d),
                       *(v for d in DOMAINS.values() for vs in d.values() for v in vs))
        for w in tokenize(text))

    @staticmethod
    def generate(rng: random.Random) -> dict[str, Any]:
        domain = pick(rng, sorted(DOMAINS))
        slots = list(DOMAINS[domain])
        rng.shuffle(slots)
        stated, rest = slots[0], slots[1:]
        n_hidden = rng.randint(2, 4)
        hidden = rest[:n_hidden]
        imps = [rng.randint(1, 3) for _ in hidden]
        return {"domain": domain,
                "values": {s: pick(rng, DOMAINS[domain][s]) for s in slots},
                "stated": stated,
                "importance": dict(zip(hidden, imps))}

    @staticmethod
    def signature(task) -> str:
        return "|".join([task["domain"], task["stated"], *(f"{s}={task['values'][s]}" for s in sorted(task["values"])),
                         *(f"{s}:{i}" for s, i in sorted(task["importance"].items()))])

    def system_prompt(self) -> str:
        slots = list(DOMAINS[self.task["domain"]])
        return (f"you help the user . the details are : {' , '.join(slots)} . ask the user about one detail "
                "at a time with action , then give the final plan with answer , as detail value pairs .")

    def opening(self) -> str:
        t = self.task
        return f"i want to {t['domain']} . the {t['stated']} is {t['values'][t['stated']]} ."

    def init_state(self):
        return {"revealed": [], "asked": [], "multi": 0}

    def on_action(self, content: str) -> EnvMessage:
        words = set(tokenize(content))
        asked = [s for s in DOMAINS[self.task["domain"]] if s in words]
        t, st = self.task, self.state
        if not asked:
            return self.say("clarify_request", "what do you mean ? please ask about one detail .",
                            "please ask about one detail .", kind="correction")
        if len(asked) > 1:
            st["multi"] += 1
            return self.say("complain", "please ask one thing at a time .", kind="correction")
        s = asked[0]
        if s == t["stated"] or s in st["revealed"]:
            if s not in st["asked"]:
                st["asked"].append(s)
            return self.say("correct", "i already told you .", kind="correction")
        vague_now = ("i do not mind .", f"any {s} is fine .")
        if s in st["asked"]:  # asked before and the user did not mind: the same again
            return self.say("be_vague", *vague_now, kind="information")
        important = len(st["revealed"])
        p = p_matters(important, len(st["asked"]) - important - (t["stated"] in st["asked"]))
        values = DOMAINS[t["domain"]][s]
        outcomes = [(p / len(values), (f"the {s} is {v} .",)) for v in values] + [(1.0 - p, vague_now)]
        st["asked"].append(s)
        if s not in t["importance"]:
            return self.say("be_vague", *vague_now, kind="information", outcomes=outcomes)
        st["revealed"].append(s)
        return self.say("provide_info", f"the {s} is {t['values'][s]} .", kind="information", outcomes=outcomes)

    def score(self, content: str) -> float:
        words = set(tokenize(content))
        t = self.task
        got = 0
        for s, imp in t["importance"].items():
            said = words & set(DOMAINS[t["domain"]][s])
            if said == {t["values"][s]}:
                got += imp
        r = got / sum(t["importance"].values()) - MULTI_PENALTY * self.state["multi"]
        return max(0.0, r)

    def on_answer(self, content: str):
        r = self.score(content)
        if r >= 1.0:
            return r, self.say("accept", "that covers it , thank you !")
        return r, self.say("reject", "that is not what i wanted .", "you missed some details .")


def expert_policy(env: IntentionGym) -> AgentMessage:
    """Asks about each hidden detail, most important first, then states every known value."""
    t, st = env.task, env.state
    todo = sorted((s for s in t["importance"] if s not in st["revealed"]),
                  key=lambda s: (-t["importance"][s], list(DOMAINS[t["domain"]]).index(s)))
    if todo:
        return act(f"what is the {todo[0]} ?")
    known = [t["stated"], *st["revealed"]]
    return answer(f"{t['domain']} : " + " , ".join(f"{s} {t['values'][s]}" for s in known) + " .")


def imitable_policy(env: IntentionGym) -> AgentMessage:
    """The expert without privileged knowledge: asks about every detail the user has not yet
    been asked about, in the order the system prompt lists them, then states every value the
    user gave. It reaches the maximum reward too, and each of its turns is a function of what
    the agent sees, so a small model can imitate it exactly.

    Each question carries a running note of the values known so far, newest first ("the plan :
    scarf green . what is the budget ?"; values only, so the user still hears one detail), and the
    answer is the last note. The note is written for a small model to copy: its first value is the
    user's last reply (or, after a vague reply, the first value of the previous note), and every
    later value is the one that followed the value before it in the previous note, so each value
    the agent writes is a copy from the turn just before it, and a plain induction copy (the
    token that followed this token last time) is right everywhere but at the first value. Notes
    in the order values arrive, or with commas between values, break that: the token that
    followed a value differs from note to note, and a 2-layer model then learns the slot of each
    value in minutes but not which of its three values; and without the note the answer needs
    retrieval from anywhere in a 400-token context, which it does not learn in minutes at all
    (docs/BENCHMARKS.md, the quickstart section).
    """
    t, st = env.task, env.state
    todo = [s for s in DOMAINS[t["domain"]] if s != t["stated"] and s not in st["asked"]]
    known = " ".join(t["values"][s] for s in reversed((t["stated"], *st["revealed"])))
    if todo:
        return act(f"the plan : {known} . what is the {todo[0]} ?")
    return answer(f"the plan : {known} .")


def random_policy(rng: random.Random | int):
    """Asks about one or two random details or answers with random values (1 in 4)."""
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)

    def policy(env: IntentionGym) -> AgentMessage:
        slots = DOMAINS[env.task["domain"]]
        names = sorted(slots)
        u = rng.random()
        if u < 0.25:
            chosen = rng.sample(names, rng.randint(1, len(names)))
            return answer(" , ".join(f"{s} {pick(rng, slots[s])}" for s in chosen) + " .")
        if u < 0.4:
            a, b = rng.sample(names, 2)
            return act(f"what is the {a} and the {b} ?")
        return act(f"what is the {pick(rng, names)} ?")

    return policy

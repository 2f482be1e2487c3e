"""Telepathy gym: guess a hidden thing from a known attribute space with yes/no questions.

A thing is one value of each attribute (color, shape, size, material: 4*4*2*4 = 128 things). A
question names one or more values of a single attribute ("is it red or blue ?"): the user answers
yes (``confirm``) or no (``provide_info``), a repeated question again the same way; values of
several attributes, or none, get a ``clarify_request``. The ``answer`` must name exactly one value
of each attribute: reward 1 when it is the hidden thing, else 0.

Feedback kinds: yes and no (first asked or repeated) are ``information``; the two clarify
requests are ``corrections``. Every reply carries its alternatives: a question about values V of
an attribute whose candidates (the values the answers so far leave) are C is answered yes with
probability |V & C| / |C| (the hidden thing uniform over what is left), so a repeated question,
or one about values already ruled in or out, has one possible answer.
"""

from __future__ import annotations

import random

from jaxagent.envs.base import AgentMessage, EnvMessage
from jaxagent.envs.gyms.common import ScriptedGym, act, answer, pick, tokenize

ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "size": ("small", "big"),
    "color": ("red", "blue", "green", "yellow"),
    "shape": ("round", "square", "star", "heart"),
    "material": ("wood", "metal", "glass", "stone"),
}
_VALUE_OF = {v: a for a, vs in ATTRIBUTES.items() for v in vs}


def describe(thing: dict[str, str]) -> str:
    return "a " + " ".join(thing[a] for a in ATTRIBUTES) + " thing"


_TEXTS = ("i am thinking of a thing . it has a size , color , shape and material . ask yes or no questions "
          "with action , then name the thing with answer .",
          "guess what i am thinking of . it is a thing .", "is it or ?",
          "yes . yes , it is . no . no , it is not . please ask a yes or no question about size , color , shape "
          "or material . please ask about one thing at a time . you asked that already . "
          "yes , that is it ! no , it was .")


_YES, _NO = ("yes .", "yes , it is ."), ("no .", "no , it is not .")


class TelepathyGym(ScriptedGym):
    name = "telepathy"
    default_max_steps = 16
    enumerates_replies = True
    extra_words = frozenset(w for text in (*_TEXTS, *ATTRIBUTES, *_VALUE_OF) for w in tokenize(text))

    @staticmethod
    def generate(rng: random.Random):
        return {a: pick(rng, vs) for a, vs in ATTRIBUTES.items()}

    @staticmethod
    def signature(task) -> str:
        return describe(task)

    def system_prompt(self) -> str:
        return _TEXTS[0]

    def opening(self) -> str:
        return self.rng.choice(("guess what i am thinking of .", "i am thinking of a thing . guess it ."))

    def init_state(self):
        return {"asked": []}   # [(attribute, frozenset(values), yes?)]

    def on_action(self, content: str) -> EnvMessage:
        values = {w for w in tokenize(content) if w in _VALUE_OF}
        attrs = {_VALUE_OF[v] for v in values}
        if not values:
            return self.say("clarify_request",
                            "please ask a yes or no question about size , color , shape or material .",
                            kind="correction")
        if len(attrs) > 1:
            return self.say("clarify_request", "please ask about one thing at a time .", kind="correction")
        (attr,) = attrs
        key = frozenset(values)
        cands = candidates(self.state["asked"])[attr]
        p_yes = sum(v in key for v in cands) / len(cands)
        yes = self.task[attr] in values
        if not any(k == key for _, k, _ in self.state["asked"]):
            self.state["asked"].append((attr, key, yes))
        outcomes = ((p_yes, _YES), (1.0 - p_yes, _NO))
        if yes:
            return self.say("confirm", *_YES, kind="information", outcomes=outcomes)
        return self.say("provide_info", *_NO, kind="information", outcomes=outcomes)

    def on_answer(self, content: str):
        words = [w for w in tokenize(content) if w in _VALUE_OF]
        named = {}
        ok = True
        for w in words:
            a = _VALUE_OF[w]
            if named.get(a, w) != w:
                ok = False
            named[a] = w
        self.state["partial"] = sum(named.get(a) == v for a, v in self.task.items()) / len(self.task) if ok else 0.0
        if ok and named == self.task:
            return 1.0, self.say("accept", "yes , that is it !")
        return 0.0, self.say("reject", f"no , it was {describe(self.task)} .")


def candidates(asked) -> dict[str, list[str]]:
    """The values of each attribute consistent with the answers so far."""
    out = {a: list(vs) for a, vs in ATTRIBUTES.items()}
    for attr, key, yes in asked:
        out[attr] = [v for v in out[attr] if (v in key) == yes]
    return out


def expert_policy(env: TelepathyGym) -> AgentMessage:
    """Halves the candidate values of one attribute per question (7 questions), then names it."""
    cands = candidates(env.state["asked"])
    for attr, vs in cands.items():
        if len(vs) > 1:
            return act("is it " + " or ".join(vs[: len(vs) // 2]) + " ?")
    return answer(f"it is {describe({a: vs[0] for a, vs in cands.items()})} .")


def random_policy(rng: random.Random | int):
    """Asks about a random value, or (1 in 5) names a random thing."""
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)

    def policy(env: TelepathyGym) -> AgentMessage:
        if rng.random() < 0.2:
            return answer(f"it is {describe({a: pick(rng, vs) for a, vs in ATTRIBUTES.items()})} .")
        return act(f"is it {pick(rng, sorted(_VALUE_OF))} ?")

    return policy

"""Scripted user gyms: expert reaches the maximum, random is well below, determinism, splits,
tool errors, reaction labels and the closed vocabulary."""

import asyncio
import random

import pytest

from jaxagent.credit.reaction import NEGATIVE_LABELS, POSITIVE_LABELS
from jaxagent.envs.base import AgentMessage, EnvMessage, Environment
from jaxagent.envs.gyms import GYMS, LABELS, MAX_REWARD, TOOL_SCHEMA, act, answer, make_env, make_tasks, tokenize
from jaxagent.rollout.runner import play_policy
from jaxagent.text.toolcalls import ToolCall

NAMES = sorted(GYMS)
N_TEST = 20
RANDOM_MEAN_MAX = 0.35   # random policy's mean reward must stay at or below 35% of MAX_REWARD


def play(spec, policy, task_id, seed=0, **kw):
    return asyncio.run(play_policy(spec.env(**kw), policy, task_id, seed, max_turns=40))


def env_texts(transcript):
    return [m.content for m in transcript if isinstance(m, EnvMessage)]


@pytest.fixture(scope="module")
def episodes():
    """Per gym: expert and random episodes on the first N_TEST test tasks."""
    out = {}
    for name in NAMES:
        spec = GYMS[name]
        tasks = spec.make_tasks("test", N_TEST)
        out[name] = {
            "expert": [play(spec, spec.expert_policy, t, seed=i) for i, t in enumerate(tasks)],
            "random": [play(spec, spec.random_policy(random.Random(100 * i + s)), t, seed=s)
                       for i, t in enumerate(tasks) for s in range(3)],
        }
    return out


def test_registry_and_labels():
    assert NAMES == ["function", "intention", "preference", "telepathy"]
    assert set(LABELS) == set(POSITIVE_LABELS) | set(NEGATIVE_LABELS)
    for spec in GYMS.values():
        assert isinstance(spec.env(), Environment)
    assert make_tasks("telepathy", "test", 2, seed=3) == ["telepathy:test:3:0", "telepathy:test:3:1"]
    assert type(make_env("intention:train:0:5")).__name__ == "IntentionGym"


@pytest.mark.parametrize("name", NAMES)
def test_expert_reaches_max_reward_on_every_test_task(name, episodes):
    rewards = [r for r, _ in episodes[name]["expert"]]
    assert rewards == [MAX_REWARD] * N_TEST


@pytest.mark.parametrize("name", NAMES)
def test_random_policy_is_well_below(name, episodes):
    rewards = [r for r, _ in episodes[name]["random"]]
    assert all(0.0 <= r <= MAX_REWARD for r in rewards)
    assert sum(rewards) / len(rewards) <= RANDOM_MEAN_MAX * MAX_REWARD


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_episode(name):
    spec = GYMS[name]
    for t in spec.make_tasks("train", 3, seed=7):
        assert play(spec, spec.expert_policy, t, 5) == play(spec, spec.expert_policy, t, 5)
        a = play(spec, spec.random_policy(random.Random(1)), t, 2)
        b = play(spec, spec.random_policy(random.Random(1)), t, 2)
        assert a == b
        assert spec.env_cls.task_for(t) == spec.env_cls.task_for(t)


@pytest.mark.parametrize("name", NAMES)
def test_train_and_test_splits_are_disjoint(name):
    cls = GYMS[name].env_cls
    train = [cls.task_for(t) for s in (0, 1) for t in cls.make_tasks("train", 100, seed=s)]
    test = [cls.task_for(t) for t in cls.make_tasks("test", 40)]
    assert {cls.signature(t) for t in train}.isdisjoint({cls.signature(t) for t in test})
    assert {cls.split_of_task(t) for t in train} == {"train"}
    assert {cls.split_of_task(t) for t in test} == {"test"}
    assert len({cls.signature(t) for t in train}) > 20          # the generator varies the tasks
    with pytest.raises(ValueError, match="task_id="):
        cls.task_for(f"{name}:dev:0:0")


@pytest.mark.parametrize("name", NAMES)
def test_reset_gives_the_tool_schema_and_opening(name):
    env = GYMS[name].env()
    reset = asyncio.run(env.reset(GYMS[name].make_tasks("train", 1)[0], 0))
    assert reset.tools == (TOOL_SCHEMA,)
    assert TOOL_SCHEMA["function"]["parameters"]["properties"]["choice"]["enum"] == ["action", "search", "answer"]
    assert [m.role for m in reset.messages] == ["system", "user"]
    assert reset.info["tool_errors"] == 0 and reset.info["max_reward"] == MAX_REWARD


def malformed_messages():
    return [
        AgentMessage("", (), ("invalid_json: expected an object",)),
        AgentMessage("", (ToolCall("get_weather", {"city": "x"}),)),
        AgentMessage("", (ToolCall("interact_with_env", {"choice": "action"}),)),
        AgentMessage("", (ToolCall("interact_with_env", {"choice": "action", "content": "x", "extra": 1}),)),
        AgentMessage("", (ToolCall("interact_with_env", {"choice": "dance", "content": "x"}),)),
        AgentMessage("", (ToolCall("interact_with_env", {"choice": "answer", "content": 3}),)),
    ]


async def _malformed_episode(name):
    spec = GYMS[name]
    env = spec.env()
    transcript = list((await env.reset(spec.make_tasks("test", 1)[0], 0)).messages)
    for i, msg in enumerate(malformed_messages(), 1):
        step = await env.step(msg)
        transcript.extend(step.messages)
        assert not step.done and step.reward == 0.0
        assert [m.role for m in step.messages] == ["tool"]
        assert step.messages[0].content.startswith("error :")
        assert step.info["tool_errors"] == i
    # a valid call next to a bad one: both answered, one more error
    step = await env.step(AgentMessage("", (ToolCall("nope", {}), *answer("0").tool_calls)))
    transcript.extend(step.messages)
    assert step.done and step.info["tool_errors"] == 7
    assert [m.role for m in step.messages] == ["tool", "tool", "user"]
    step = await env.step(act("hello"))   # after the end: an error, still done
    transcript.extend(step.messages)
    assert step.done and step.reward == 0.0 and step.info["tool_errors"] == 8
    return transcript


@pytest.mark.parametrize("name", NAMES)
def test_malformed_and_unknown_tool_calls_are_answered_and_counted(name):
    asyncio.run(_malformed_episode(name))


@pytest.mark.parametrize("name", NAMES)
def test_plain_text_goes_to_the_user_and_time_runs_out(name):
    async def go():
        env = GYMS[name].env(max_steps=3)
        await env.reset(GYMS[name].make_tasks("train", 1)[0], 0)
        steps = [await env.step(AgentMessage("hmm")) for _ in range(3)]
        for s in steps:
            assert s.messages[0].role == "user" and s.messages[0].reaction in LABELS
        assert [s.done for s in steps] == [False, False, True]
        assert steps[-1].messages[-1].reaction == "complain" and env.outcome_reward() == 0.0
    asyncio.run(go())


@pytest.mark.parametrize("name", NAMES)
def test_reaction_labels_on_user_messages_only(name, episodes):
    seen = set()
    for _, transcript in episodes[name]["expert"] + episodes[name]["random"]:
        env_msgs = [m for m in transcript if isinstance(m, EnvMessage)]
        for m in env_msgs[2:]:                      # after the system prompt and the opening request
            if m.role == "user":
                assert m.reaction in LABELS
                seen.add(m.reaction)
            else:
                assert m.reaction is None
        assert isinstance(transcript[-1], EnvMessage) and transcript[-1].role == "user"
    assert {"provide_info", "accept", "reject"} <= seen


@pytest.mark.parametrize("name", NAMES)
def test_vocabulary_covers_every_text(name, episodes):
    vocab = set(GYMS[name].vocabulary())
    texts = []
    for _, transcript in episodes[name]["expert"] + episodes[name]["random"]:
        texts += env_texts(transcript)
    texts += env_texts(asyncio.run(_malformed_episode(name)))
    for _, transcript in episodes[name]["expert"]:   # and what the expert writes
        texts += [c.arguments["content"] for m in transcript if isinstance(m, AgentMessage) for c in m.tool_calls]
    missing = {w for text in texts for w in tokenize(text)} - vocab
    assert not missing
    assert len(vocab) < 250


def test_intention_rewards_importance_and_penalises_several_questions():
    async def go():
        spec = GYMS["intention"]
        env = spec.env()
        tid = spec.make_tasks("test", 1)[0]
        await env.reset(tid, 0)
        task = env.task
        hidden = sorted(task["importance"], key=lambda s: -task["importance"][s])
        step = await env.step(act(f"what is the {hidden[0]} and the {hidden[1]} ?"))
        assert step.messages[-1].reaction == "complain" and env.state["multi"] == 1
        step = await env.step(act(f"what is the {hidden[0]} ?"))
        assert step.messages[-1].reaction == "provide_info"
        assert task["values"][hidden[0]] in step.messages[-1].content
        step = await env.step(answer(f"{hidden[0]} {task['values'][hidden[0]]}"))
        want = task["importance"][hidden[0]] / sum(task["importance"].values()) - 0.25
        assert step.done and step.reward == pytest.approx(max(0.0, want))
    asyncio.run(go())


def test_telepathy_function_preference_answers():
    async def go():
        env = GYMS["telepathy"].env()
        await env.reset("telepathy:test:0:0", 0)
        step = await env.step(act("is it red and round ?"))
        assert step.messages[-1].reaction == "clarify_request"
        step = await env.step(answer("it is a small red round wood thing or a big one"))
        assert step.done and step.reward == 0.0 and step.messages[-1].reaction == "reject"

        env = GYMS["function"].env()
        await env.reset("function:test:0:0", 0)
        q = env.task["query"]
        step = await env.step(act(" ".join(map(str, q))))
        assert step.messages[-1].reaction == "reject"

        env = GYMS["preference"].env()
        await env.reset("preference:test:0:0", 0)
        step = await env.step(act("what about the price ?"))
        assert step.messages[-1].reaction == "provide_info"
        step = await env.step(act("what about the price ?"))
        assert step.messages[-1].reaction == "correct"
        wrong = 1 + (env.task["best"] % 5)
        step = await env.step(answer(f"i choose {wrong}"))
        assert step.done and step.reward == 0.0
    asyncio.run(go())


@pytest.mark.parametrize("name", NAMES)
def test_demo_policy_reaches_max_reward_on_every_test_task(name):
    spec = GYMS[name]
    tasks = spec.make_tasks("test", N_TEST)
    assert [play(spec, spec.demo_policy, t, seed=i)[0] for i, t in enumerate(tasks)] == [MAX_REWARD] * N_TEST


def test_intention_imitable_policy_uses_only_what_the_agent_sees():
    """Two tasks that differ only in which details matter get the same questions from the
    imitable policy (the expert's differ), and it asks every unstated detail once."""
    from jaxagent.envs.gyms.intention import DOMAINS, IntentionGym, expert_policy, imitable_policy

    spec = GYMS["intention"]
    task_id = spec.make_tasks("test", 1)[0]
    base = IntentionGym.task_for(task_id)
    slots = [s for s in DOMAINS[base["domain"]] if s != base["stated"]]
    questions = {}
    for policy in (imitable_policy, expert_policy):
        for hidden in (slots[:2], slots[2:]):
            env = spec.env()
            asyncio.run(env.reset(task_id, 0))
            env.task = dict(base, importance={s: 1 for s in hidden})
            asked = []
            for _ in range(len(slots) + 1):
                msg = policy(env)
                if msg.tool_calls[0].arguments["choice"] == "answer":
                    break
                asked.append(msg.tool_calls[0].arguments["content"])
                asyncio.run(env.step(msg))
            questions[(policy.__name__, tuple(hidden))] = asked
    imitable = [v for (p, _), v in questions.items() if p == "imitable_policy"]
    expert = [v for (p, _), v in questions.items() if p == "expert_policy"]
    question = lambda content: content.rsplit(" . ", 1)[-1]  # noqa: E731 (after the imitable's running note)
    assert [question(q) for q in imitable[0]] == [question(q) for q in imitable[1]] == [
        f"what is the {s} ?" for s in slots]
    assert expert[0] != expert[1]
    # The imitable's running note: the values the user gave, newest first, the stated one last.
    hidden = slots[:2]
    notes = [q.rsplit(" . ", 1)[0] for q in questions[("imitable_policy", tuple(hidden))]]
    given = [base["values"][base["stated"]]] + [base["values"][s] for s in slots if s in hidden]
    assert notes == ["the plan : " + " ".join(reversed(given[: 1 + sum(s in hidden for s in slots[:i])]))
                     for i in range(len(slots))]
    # Each note after the first value is the previous note (the induction copy the model learns).
    for prev, cur in zip(notes, notes[1:]):
        assert cur.endswith(prev[len("the plan :"):])


def test_binary_outcome_keeps_only_full_answers():
    """outcome='binary': a partly right answer scores 0 (graded: its share of the importance); a full
    answer scores MAX_REWARD either way; an unknown mode is refused naming it."""

    task_id = GYMS["intention"].make_tasks("train", 1, seed=0)[0]
    task = GYMS["intention"].env_cls.task_for(task_id)
    imp, values = task["importance"], task["values"]
    first = sorted(imp)[0]
    partial = lambda env: answer(f"{first} {values[first]} .")  # noqa: E731
    full = lambda env: answer(" , ".join(f"{s} {values[s]}" for s in imp) + " .")  # noqa: E731
    graded_r, _ = asyncio.run(play_policy(GYMS["intention"].env(), partial, task_id))
    binary_r, _ = asyncio.run(play_policy(GYMS["intention"].env(outcome="binary"), partial, task_id))
    assert graded_r == pytest.approx(imp[first] / sum(imp.values())) and 0 < graded_r < 1
    assert binary_r == 0.0
    for outcome in ("graded", "binary"):
        env = GYMS["intention"].env(outcome=outcome)
        assert asyncio.run(play_policy(env, full, task_id))[0] == MAX_REWARD == env.outcome_reward()
    with pytest.raises(ValueError, match="outcome='partial'"):
        GYMS["intention"].env(outcome="partial")

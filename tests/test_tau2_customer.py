"""tau2 retail: the scripted and LLM customers (spec section 5)."""

import dataclasses

import pytest

from jaxagent.envs.base import AgentMessage
from jaxagent.envs.tau2.customer import STOP, TRANSFER
from jaxagent.envs.tau2.domains.retail.customer import Identity, ScriptedCustomer, first_person, identity_of
from jaxagent.envs.tau2.env import Tau2Env, scripted_customers
from jaxagent.envs.tau2.tasks import (
    Action,
)

from tests.tau2_helpers import RFC_0, TASKS, call, episode, reply_text, run


# ============================================================================ customer.py
def test_first_person():
    assert first_person("You received your order #W1 and you're unhappy.") == "I received my order #W1 and I'm unhappy."
    assert first_person("If the agent asks you to confirm, you'd rather keep your item.") == \
        "If the agent asks me to confirm, I'd rather keep my item."
    assert first_person("You are Yusuf Rossi in zip code 19122.") == "I am Yusuf Rossi in zip code 19122."
    assert first_person("Tell the agent you want it yourself.") == "Tell the agent I want it myself."
    assert first_person(TASKS["0"].instructions["reason_for_call"]) == RFC_0


def test_identity_of():
    assert identity_of(TASKS["0"]) == Identity(first_name="Yusuf", last_name="Rossi", zip="19122")  # gold lookup
    assert identity_of(TASKS["10"]) == Identity(email="mia.garcia2723@example.com", user_id="mia_garcia_4516")
    assert identity_of(TASKS["57"]) == Identity(zip="92133", user_id="ivan_hernandez_6923")  # known info only
    assert identity_of(TASKS["72"]) == Identity(first_name="Ivan", last_name="Khan", zip="28243")  # "You name is"


def test_scripted_customer_opening_and_identity_answers():
    # task 57 (user id and zip only) has no gold action, so its goal holds from the start and the
    # customer would stop at once; the same customer with a pending write goes on answering
    tasks = dict(TASKS, **{"57": dataclasses.replace(TASKS["57"], actions=(
        Action("57_w", "cancel_pending_order", {"order_id": "#W6247578", "reason": "no longer needed"}),))})

    async def main():
        out = {}
        for tid in ("0", "10", "57"):
            env = Tau2Env(tasks, customer=scripted_customers())
            reset, steps = await episode(env, tid, [AgentMessage("Could you give me your email address?")])
            out[tid] = reset, steps[0]
        return out

    out = run(main())
    reset = out["0"][0]
    assert reset.messages[1].content == RFC_0 and reset.messages[1].reaction == "provide_info"
    assert reply_text(out["0"][1]) == (
        "I do not remember my email address. My name is Yusuf Rossi and my zip code is 19122.", "provide_info")
    assert reply_text(out["10"][1]) == ("My email is mia.garcia2723@example.com.", "provide_info")
    assert reply_text(out["57"][1]) == ("I do not remember my email address.", "be_vague")


def test_scripted_customer_confirms_only_a_matching_proposal():
    ok = ("Shall I exchange items 1151293680 and 4983901480 of order #W2378156 for 7706410293 and 7747408585, "
          "paying the difference with credit_card_9513926? Please confirm.")
    wrong = ok.replace("7747408585", "7747408586")

    async def main(text):
        env = Tau2Env(TASKS, customer=scripted_customers())
        _, steps = await episode(env, "0", [AgentMessage(text)])
        return steps[0]

    s = run(main(ok))
    assert reply_text(s) == ("Yes, please go ahead.", "confirm") and not s.done
    s = run(main(wrong))
    assert reply_text(s) == ("No, that is not what I want. As I said: " + RFC_0, "reject") and not s.done


def test_scripted_customer_gives_up_after_patience_idle_replies():
    async def main():
        env = Tau2Env(TASKS, customer=scripted_customers(patience=2))
        _, steps = await episode(env, "0", [AgentMessage("Hmm."), AgentMessage("Let me think.")])
        return env, steps

    env, (s1, s2) = run(main())
    assert reply_text(s1) == ("As I said: " + RFC_0, "be_vague") and not s1.done
    text, label = reply_text(s2)
    assert label == "complain" and text.endswith(STOP) and s2.done
    assert s2.info["termination"] == "user_stop" and env.result.details["stop_token"] == STOP
    assert s2.reward == 0.0 and env.result.scored and env.result.components["DB"] == 0.0
    with pytest.raises(ValueError, match="patience=0"):
        ScriptedCustomer(TASKS["0"], env, patience=0)


@pytest.mark.parametrize("tid, label, reward", [("0", "complain", 0.0), ("10", "accept", 1.0)])
def test_scripted_customer_answers_a_transfer_with_the_transfer_token(tid, label, reward):
    async def main():
        env = Tau2Env(TASKS, customer=scripted_customers())
        _, steps = await episode(env, tid, [call("transfer_to_human_agents", summary="needs a human"),
                                            AgentMessage("I have transferred you to a human agent.")])
        return env, steps

    env, (s1, s2) = run(main())
    assert [m.content for m in s1.messages] == ["Transfer successful"] and not s1.done
    assert reply_text(s2) == (TRANSFER, label) and s2.done
    assert s2.info["termination"] == "user_stop" and env.result.details["stop_token"] == TRANSFER
    # task 10's target is the untouched DB and it has no communicate strings: the transfer is a success
    assert s2.reward == reward == env.outcome_reward()


def test_scripted_customer_stops_complaining_after_an_unexpected_write():
    async def main():
        env = Tau2Env(TASKS, customer=scripted_customers())
        _, steps = await episode(env, "0", [
            call("cancel_pending_order", order_id="#W6247578", reason="no longer needed"),  # Yusuf's, not gold
            AgentMessage("Done. Anything else?")])
        return env, steps

    env, (s1, s2) = run(main())
    assert '"status": "cancelled"' in s1.messages[0].content
    assert reply_text(s2) == ("That is not what I asked for. " + STOP, "complain") and s2.done
    assert env.unexpected_writes() == [("cancel_pending_order", {"order_id": "#W6247578", "reason": "no longer needed"})]
    assert s2.reward == 0.0 and env.result.components["DB"] == 0.0


def test_llm_customer_prompt_is_taus_guidelines_then_the_scenario_then_our_answer_format():
    """Every domain's text-only LLM customer gets tau2's user-simulator guidelines verbatim (the packaged
    file), then the task's <scenario> block, then the JSON answer that carries the reaction label."""
    from jaxagent.envs.tau2.customer import ANSWER_FORMAT, CUSTOMER_PROMPT, GUIDELINES_FILE
    from jaxagent.envs.tau2.tasks import load_task_set, render_scenario
    from jaxagent.envs.user_prompt import render_system_prompt

    task = load_task_set(domain="airline")["0"]
    text = render_system_prompt(CUSTOMER_PROMPT, {"scenario": render_scenario(task)}, (STOP,))
    guidelines = GUIDELINES_FILE.read_text().strip()
    assert guidelines.startswith("# User Simulation Guidelines") and "'###OUT-OF-SCOPE###'" in guidelines
    assert text.startswith(guidelines + "\n\n<scenario>\n")
    assert "<scenario>\nInstructions:\n\tDomain: airline\n\tReason for call:\n\t\tYou want to cancel reservation EHGLP3." in text
    assert text.endswith(ANSWER_FORMAT.replace("{{", "{").replace("}}", "}"))
    assert text.index("</scenario>") < text.index('{"utterance"')

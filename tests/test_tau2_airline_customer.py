"""tau2 airline: the scripted customer (`jaxagent.envs.tau2.domains.airline.customer`), hand-written cases."""

import pytest

from jaxagent.envs.base import AgentMessage
from jaxagent.envs.tau2.customer import STOP, TRANSFER
from jaxagent.envs.tau2.domains.airline.customer import (
    AUTH_TOOLS,
    ScriptedCustomer,
    names_every_value,
    opening_text,
    reservation_ids,
    to_first_person,
)
from jaxagent.envs.tau2.env import Tau2Env, scripted_customers
from jaxagent.envs.tau2.tasks import load_task_set
from tests.tau2_helpers import call, reply_text, run

TASKS = load_task_set(domain="airline")
OPENING_0 = ("I want to cancel reservation EHGLP3. It may be more than 24 hours after booking, but it is ok because "
             "I was out of town for that time.")
PASSENGERS_40 = [{"first_name": "Anya", "last_name": "Garcia", "dob": "1992-11-12"},
                 {"first_name": "Mei", "last_name": "Garcia", "dob": "1989-12-13"}]
PROPOSAL_40 = ("I will update the passengers of reservation 3RK2T9 to Anya Garcia (born 1992-11-12) and Mei Garcia "
               "(born 1989-12-13). Do you confirm?")


async def _episode(task_id, turns, **customer_kw):
    env = Tau2Env(TASKS, customer=scripted_customers(**customer_kw), domain="airline")
    reset = await env.reset(task_id, 0)
    steps = []
    for t in turns:
        steps.append(await env.step(t))
    return env, reset, steps


def episode(task_id, turns, **customer_kw):
    return run(_episode(task_id, turns, **customer_kw))


# ============================================================================ text helpers
def test_first_person_opening_and_reservation_ids():
    assert AUTH_TOOLS == ("get_user_details",)
    assert to_first_person("They told you that you were out of town.") == "They told me that I was out of town."
    assert to_first_person("the reservation allows you to take 3 bags") == "the reservation allows me to take 3 bags"
    assert opening_text(TASKS["0"]) == OPENING_0
    # the sentence about "the agent" (an instruction to the role-player) is left out
    assert opening_text(TASKS["4"]).startswith("For that I make up a story") and "agent" not in opening_text(TASKS["4"])
    assert reservation_ids("cancel IFOYYZ and NQNU5R, change M20IZO; not HAT045, PLEASE, 123456x") == \
        ["IFOYYZ", "NQNU5R", "M20IZO"]


def test_names_every_value_tolerates_spoken_forms():
    args = {"user_id": "mia_li_3668", "flight_type": "round_trip", "payment_methods": [
        {"payment_id": "credit_card_4421486", "amount": 1786}], "flights": [{"flight_number": "HAT136",
                                                                             "date": "2024-05-20"}]}
    text = "Book a round trip for mia_li_3668 on HAT136 (2024-05-20), $1,786 on credit card 4421486?"
    assert names_every_value(text, args)
    assert not names_every_value(text.replace("HAT136", "HAT137"), args)
    assert not names_every_value(text.replace("2024-05-20", "May 20"), args)  # no paraphrase


# ============================================================================ answers
def test_opening_and_identity_answers():
    _, reset, steps = episode("0", [AgentMessage("Could you give me your user id and the reservation id?"),
                                    AgentMessage("What is your full name and your email?")])
    assert reset.messages[1].content == OPENING_0 and reset.messages[1].reaction == "provide_info"
    assert reply_text(steps[0]) == ("My user id is emma_kim_9957. The reservation id is EHGLP3.", "provide_info")
    assert reply_text(steps[1]) == ("My user id is emma_kim_9957. My name is Emma Kim.", "provide_info")
    # task 21: "You don't remember your reservation id"
    _, _, steps = episode("21", [AgentMessage("May I have your user id and reservation number?")])
    assert reply_text(steps[0]) == ("My user id is sofia_kim_7287. I do not remember the reservation id.",
                                    "provide_info")
    _, _, steps = episode("21", [AgentMessage("Which reservation is it? What is the confirmation code?")])
    assert reply_text(steps[0]) == ("I do not remember the reservation id.", "be_vague")


def test_answers_about_the_pending_writes():
    _, _, steps = episode("20", [
        AgentMessage("Round trip or one way, and from where to where?"),
        AgentMessage("How many passengers, which cabin, how many bags, and do you want insurance? How will you pay?")])
    assert reply_text(steps[0]) == ("It is a one way (one_way) trip. From JFK to SEA.", "provide_info")
    assert reply_text(steps[1]) == (
        ("The passengers are Mia Li (born 1990-04-05). Please use certificate_7504069 for 250, credit_card_4421486 "
         "for 5. I want economy. I want 3 checked bags in total (0 of them paid). No insurance, thank you."),
        "provide_info")
    _, _, steps = episode("21", [AgentMessage("Which flights do you want, in which cabin?")])
    assert reply_text(steps[0]) == (
        ("I want economy. The flights are HAT078 on 2024-05-27, HAT118 on 2024-05-27, HAT290 on 2024-05-27, "
         "HAT175 on 2024-05-27."), "provide_info")
    # task 3: "You do not know the cabin for the upcoming flight."
    _, _, steps = episode("3", [AgentMessage("Which cabin are you flying in?")])
    assert reply_text(steps[0]) == ("I do not know the cabin.", "be_vague")


# ============================================================================ proposals
@pytest.mark.parametrize("text, expected", [
    (PROPOSAL_40, ("Yes, please go ahead.", "confirm")),
    (PROPOSAL_40.replace("1989-12-13", "1989-12-31"),
     (("No, that is not quite what I want. The passengers are Anya Garcia (born 1992-11-12), Mei Garcia "
       "(born 1989-12-13)."), "correct")),
    ("Shall I cancel reservation 3RK2T9 for you? Please confirm.",
     (("No, please do not do that. As I said: I booked the flight  and I want to change the passenger name on the "
       "reservation."), "reject")),
])
def test_confirms_only_a_proposal_naming_every_value_of_a_pending_write(text, expected):
    env, _, steps = episode("40", [AgentMessage(text)])
    assert reply_text(steps[0]) == expected and not steps[0].done
    assert env.pending_writes()[0].arguments == {"reservation_id": "3RK2T9", "passengers": PASSENGERS_40}


def test_confirms_the_oracle_style_proposal_with_nested_flights():
    gold = next(a for a in TASKS["7"].actions if a.name == "update_reservation_flights")
    from jaxagent.envs.tau2.agents import proposal
    _, _, steps = episode("7", [proposal(gold.name, gold.arguments)])
    assert reply_text(steps[0]) == ("Yes, please go ahead.", "confirm")


# ============================================================================ endings
def test_stops_when_the_goal_is_met():
    gold = TASKS["40"].write_actions[0]
    env, _, steps = episode("40", [AgentMessage(PROPOSAL_40), call(gold.name, **gold.arguments),
                                   AgentMessage("Done. Is there anything else I can help with?")])
    assert reply_text(steps[2]) == ("Thank you, that is all I needed. " + STOP, "accept") and steps[2].done
    assert steps[2].info["termination"] == "user_stop" and steps[2].reward == 1.0 == env.outcome_reward()
    # task 3 changes nothing: looking the user up and saying "4" (its communicate string) is the goal
    env, _, steps = episode("3", [call("get_user_details", user_id="anya_garcia_5901"),
                                  AgentMessage("Your reservation allows 4 checked bags in total.")])
    assert reply_text(steps[1]) == ("Thank you, that is all I needed. " + STOP, "accept") and steps[1].reward == 1.0


def test_a_refusal_task_ends_after_the_agent_declines_twice():
    # task 1 changes nothing and needs the user looked up: a refusal before the lookup moves nothing
    decline = AgentMessage("Unfortunately I cannot cancel this reservation.")
    env, _, steps = episode("1", [decline, call("get_user_details", user_id="raj_sanchez_7340"), decline, decline])
    assert reply_text(steps[0])[1] == "be_vague" and not steps[0].done
    text, label = reply_text(steps[2])
    assert label == "challenge" and text.startswith("Are you sure there is nothing you can do?") and not steps[2].done
    assert reply_text(steps[3]) == ("I see. Thank you anyway. " + STOP, "accept") and steps[3].done
    assert steps[3].reward == 1.0 and env.result.components == {"DB": 1.0, "COMMUNICATE": 1.0, "ACTION": 0.0}


@pytest.mark.parametrize("tid, reward", [("0", 1.0), ("40", 0.0)])
def test_a_transfer_is_answered_with_the_transfer_token(tid, reward):
    env, _, (s1, s2) = episode(tid, [call("transfer_to_human_agents", summary="needs a human"),
                                     AgentMessage("YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.")])
    assert [m.content for m in s1.messages] == ["Transfer successful"] and not s1.done
    assert reply_text(s2) == (TRANSFER, "complain") and s2.done  # no airline train task has a gold transfer
    assert s2.info["termination"] == "user_stop" and env.result.details["stop_token"] == TRANSFER
    assert s2.reward == reward  # task 0's goal is to change nothing; task 40's update was not made


def test_an_unexpected_write_ends_the_episode_with_a_complaint():
    # task 46 wants the insurance refunded without cancelling: the cancellation is the wrong write
    env, _, (s1, s2) = episode("46", [call("cancel_reservation", reservation_id="H8Q05L"),
                                      AgentMessage("Done, your reservation is cancelled.")])
    assert '"status": "cancelled"' in s1.messages[0].content
    assert reply_text(s2) == ("That is not what I asked for. " + STOP, "complain") and s2.done
    assert env.unexpected_writes() == [("cancel_reservation", {"reservation_id": "H8Q05L"})]
    assert s2.reward == 0.0 and env.result.scored and env.result.components["DB"] == 0.0


def test_gives_up_after_patience_idle_replies_or_max_replies():
    env, _, (s1, s2) = episode("20", [AgentMessage("Hmm."), AgentMessage("What else?")], patience=2)
    assert reply_text(s1) == ("As I said: I want to fly from New York to Seattle on May 20 (one way).", "be_vague")
    text, label = reply_text(s2)
    assert label == "complain" and text == "This is going nowhere, I give up. " + STOP and s2.done
    assert s2.reward == 0.0 and env.result.scored
    _, _, (s1, s2) = episode("20", [AgentMessage("What is your user id?")] * 2, max_replies=2)
    assert reply_text(s1) == ("My user id is mia_li_3668.", "provide_info")
    assert reply_text(s2) == ("I have to go now. " + STOP, "complain") and s2.done
    with pytest.raises(ValueError, match="patience=0"):
        ScriptedCustomer(TASKS["0"], env, patience=0)

"""tau2 telecom: the scripted customer (`jaxagent.envs.tau2.domains.telecom.customer`), with a fake episode view."""

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from jaxagent.credit.reaction import DEFAULT_POLARITY
from jaxagent.envs.tau2.customer import STOP, TRANSFER
from jaxagent.envs.tau2.domains.telecom.customer import (
    AGENT_WRITE_TOOLS,
    REQUEST_FORMAT,
    USER_TOOL_NAMES,
    ScriptedCustomer,
    device_request,
    names_every_value,
    parse_device_requests,
    requestor,
    to_first_person,
)
from jaxagent.envs.tau2.tasks import Action, parse_task
from jaxagent.envs.tau2.tools import ToolResult

DATA = Path(__file__).resolve().parents[1] / "jaxagent" / "data" / "tau2_telecom"
RAW_TASKS = json.loads((DATA / "tasks_train.json").read_text(encoding="utf-8"))

MMS_ABROAD = ("[mms_issue]bad_network_preference|break_app_sms_permission|data_mode_off|data_usage_exceeded|"
              "user_abroad_roaming_enabled_off[PERSONA:None]")
DATA_REFUEL = "[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]"
TRANSFER_TASK = "[service_issue]airplane_mode_on|break_apn_settings|lock_sim_card_pin[PERSONA:None]"
SERVICE_BILL = "[service_issue]airplane_mode_on|overdue_bill_suspension|unseat_sim_card[PERSONA:Easy]"
REFUEL = {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.0}
FACA_LABELS = {"provide_info", "confirm", "accept", "be_vague", "clarify_request", "correct", "reject",
                   "challenge", "complain"}


@dataclasses.dataclass(frozen=True)
class GoldAction:
    """A gold action with its requestor (the shape `Action` takes once it carries the field)."""

    action_id: str
    name: str
    arguments: Mapping[str, Any]
    compare_args: tuple[str, ...] | None = None
    requestor: str = "assistant"


def _task(raw, i=0):
    task = parse_task(raw, i, domain="telecom")
    acts = tuple(GoldAction(a.action_id, a.name, a.arguments, a.compare_args, r.get("requestor", "assistant"))
                 for a, r in zip(task.actions, raw["evaluation_criteria"]["actions"]))
    return dataclasses.replace(task, actions=acts)


TASKS = {raw["id"]: _task(raw, i) for i, raw in enumerate(RAW_TASKS)}


class FakeView:
    """The episode as the customer sees it: its phone tools answer ``<name> done``; the assertions hold
    once every call of ``fix`` was performed (or from the start with ``holds``)."""

    def __init__(self, task, fix=(), holds=False):
        self.task, self.fix, self.holds = task, list(fix), holds
        self.batches: list[list[tuple[str, dict]]] = []
        self.agent_calls: list[tuple[str, dict]] = []

    def user_tools(self, calls):
        self.batches.append([(n, dict(a)) for n, a in calls])
        return [ToolResult(f"{n} failed" if n == "set_apn_settings" else f"{n} done. Status Bar: ok",
                           n == "set_apn_settings") for n, _ in calls]

    def performed(self):
        return [c for b in self.batches for c in b]

    def assertions_hold(self):
        return self.holds or (bool(self.fix) and all(c in self.performed() for c in self.fix))

    def successful_calls(self):
        return list(self.agent_calls)


def run(coro):
    return asyncio.run(coro)


def customer(task_id, **kw):
    view_kw = {k: kw.pop(k) for k in ("fix", "holds") if k in kw}
    view = FakeView(TASKS[task_id], **view_kw)
    return ScriptedCustomer(TASKS[task_id], view, **kw), view


def talk(cust, *texts):
    return [run(cust.respond(t)) for t in texts]


# ============================================================================ data and helpers
def test_user_tool_names_and_requestor():
    schemas = json.loads((DATA / "user_tool_schemas.json").read_text(encoding="utf-8"))
    assert USER_TOOL_NAMES == tuple(t["function"]["name"] for t in schemas["tools"])
    assert len(USER_TOOL_NAMES) == 30 and USER_TOOL_NAMES[0] == "check_status_bar" and USER_TOOL_NAMES[-1] == \
        "make_payment"
    try:
        from jaxagent.envs.tau2.domains.telecom.phone import USER_TOOL_NAMES as PHONE_NAMES
    except ImportError:
        PHONE_NAMES = USER_TOOL_NAMES
    assert tuple(PHONE_NAMES) == USER_TOOL_NAMES
    assert requestor(Action("a", "refuel_data", {})) == "assistant"
    assert requestor(GoldAction("a", "toggle_data", {}, None, "user")) == "user"
    assert "set_network_mode_preference" in REQUEST_FORMAT and "\n" not in REQUEST_FORMAT
    assert set(AGENT_WRITE_TOOLS) == {"refuel_data", "enable_roaming", "send_payment_request", "resume_line",
                                      "suspend_line", "disable_roaming"}


def test_parse_device_requests_forms():
    assert parse_device_requests('set_network_mode_preference {"mode": "4g_only"}') == \
        [("set_network_mode_preference", {"mode": "4g_only"})]
    assert parse_device_requests('grant_app_permission({"app_name": "messaging", "permission": "sms"})') == \
        [("grant_app_permission", {"app_name": "messaging", "permission": "sms"})]
    assert parse_device_requests('run `set_network_mode_preference` with {"mode": "3g_only"} now') == \
        [("set_network_mode_preference", {"mode": "3g_only"})]
    assert parse_device_requests('set_network_mode_preference: {"mode": "2g_only"}') == \
        [("set_network_mode_preference", {"mode": "2g_only"})]
    assert parse_device_requests("reboot_device() then run_speed_test") == [("reboot_device", {}),
                                                                           ("run_speed_test", None)]
    # whole words only: toggle_data is not inside toggle_data_saver_mode; unparseable JSON -> None
    assert parse_device_requests("toggle_data_saver_mode, then toggle_data") == [("toggle_data_saver_mode", None),
                                                                                ("toggle_data", None)]
    assert parse_device_requests("set_network_mode_preference {mode: 4g}") == [("set_network_mode_preference", None)]
    assert parse_device_requests("turn off airplane mode, reboot") == []
    # repeated: once; a bare name also given with arguments: only with them
    assert parse_device_requests("toggle_data {} and toggle_data {} and toggle_data") == [("toggle_data", {})]
    assert parse_device_requests('grant_app_permission, i.e. grant_app_permission {"app_name": "m", '
                                 '"permission": "sms"} and grant_app_permission {"app_name": "m", '
                                 '"permission": "storage"}') == [
        ("grant_app_permission", {"app_name": "m", "permission": "sms"}),
        ("grant_app_permission", {"app_name": "m", "permission": "storage"})]


def test_device_request_round_trips_every_gold_user_action():
    n = 0
    for raw in RAW_TASKS:
        for a in raw["evaluation_criteria"]["actions"]:
            if a["requestor"] == "user":
                assert a["name"] in USER_TOOL_NAMES
                assert parse_device_requests(device_request(a["name"], a["arguments"])) == \
                    [(a["name"], a["arguments"])], a
                n += 1
    assert n == 272
    assert device_request("set_network_mode_preference", {"mode": "4g_5g_preferred"}) == (
        'Please do this on your phone: set_network_mode_preference {"mode": "4g_5g_preferred"}. Tell me what it shows.')
    assert device_request("toggle_data") == "Please do this on your phone: toggle_data {}. Tell me what it shows."


def test_gold_user_actions_of_every_task_performed_through_device_requests():
    for tid, task in TASKS.items():
        cust, view = customer(tid)
        gold = [(a.name, dict(a.arguments)) for a in task.actions if a.requestor == "user"]
        for name, args in gold:
            turn = run(cust.respond(device_request(name, args)))
            assert turn.label == "provide_info" and turn.stop is None, (tid, turn)
        assert view.performed() == gold and cust.pending_user_actions() == [], tid


def test_names_every_value_numbers():
    assert names_every_value("refuel 2.0 GB for C1001 on L1002", REFUEL)
    assert names_every_value("refuel 2 GB for c1001 on l1002", REFUEL)
    assert not names_every_value("refuel 2.5 GB for C1001 on L1002", REFUEL)
    assert not names_every_value("refuel 5.0 GB for C1001 on L1002", REFUEL)  # the 1002 of L1002 is no number
    assert not names_every_value("refuel 2.0 GB for C1001", REFUEL)


# ============================================================================ opening and questions
def test_opening_in_the_first_person():
    assert to_first_person("You mobile data is not working.") == "My mobile data is not working."
    turn = run(customer(MMS_ABROAD)[0].opening())
    assert turn.text == ("I am unable to send MMS messages using my messaging app for the past few hours. I want to "
                         "fix it and successfully send an MMS message.") and turn.label == "provide_info"
    assert turn.stop is None
    assert run(customer(DATA_REFUEL)[0].opening()).text.startswith("My mobile data is not working properly.")
    assert run(customer(TRANSFER_TASK)[0].opening()).text == \
        "My phone has been showing 'No Service' for the past few hours."


def test_questions_about_itself():
    cust, view = customer(MMS_ABROAD)
    t = talk(cust, "Could you tell me your name and phone number?", "What is your customer id?",
             "Are you currently travelling abroad?", "Which line is it?")
    assert [x.text for x in t] == [
        "My name is John Smith. My phone number is 555-123-2002.",
        "I do not know my customer id. My name is John Smith. My phone number is 555-123-2002.",
        "I am currently abroad in France.", "My phone number is 555-123-2002."]
    assert all(x.label == "provide_info" and x.stop is None for x in t) and view.batches == []
    home = next(tid for tid, t in TASKS.items() if "at home in the United States" in t.instructions["known_info"])
    assert talk(customer(home)[0], "Are you abroad?")[0].text == "I am currently at home in the United States."
    assert talk(customer(TRANSFER_TASK)[0], "Are you abroad?")[0].text == "No, I am not abroad."
    # the agent naming the values is not asking for them
    turn = talk(customer(MMS_ABROAD)[0], "Thanks John Smith, I found your phone number 555-123-2002.")[0]
    assert turn.label == "be_vague" and turn.text.startswith("As I said: I am unable to send MMS")


# ============================================================================ device actions
def test_device_request_with_parsed_gold_and_empty_arguments():
    cust, view = customer(MMS_ABROAD)
    turn = run(cust.respond('Please do this on your phone: set_network_mode_preference {"mode": "3g_only"}. '
                            "Tell me what it shows."))
    assert view.batches == [[("set_network_mode_preference", {"mode": "3g_only"})]]
    assert turn.text == ('I did set_network_mode_preference {"mode": "3g_only"}. It says: '
                         "set_network_mode_preference done. Status Bar: ok") and turn.label == "provide_info"
    # not the gold arguments: the gold action stays pending, and a bare name takes the gold arguments
    turn = run(cust.respond("Now please set_network_mode_preference."))
    assert view.batches[-1] == [("set_network_mode_preference", {"mode": "4g_5g_preferred"})]
    # a non-gold tool without arguments: {}; an error is reported as such
    turn = run(cust.respond("Please toggle_wifi and then set_apn_settings."))
    assert view.batches[-1] == [("toggle_wifi", {}), ("set_apn_settings", {})]
    assert turn.text == ("I did toggle_wifi. It says: toggle_wifi done. Status Bar: ok "
                         "I tried set_apn_settings, but it failed: set_apn_settings failed")
    assert turn.label == "provide_info" and turn.stop is None


def test_two_tools_in_one_message_are_one_call_in_order():
    cust, view = customer(MMS_ABROAD)
    turn = run(cust.respond("First toggle_roaming, then grant_app_permission, then reboot_device please."))
    assert view.batches == [[("toggle_roaming", {}),
                             ("grant_app_permission", {"app_name": "messaging", "permission": "sms"}),
                             ("reboot_device", {})]]
    assert turn.text.count("I did ") == 3 and turn.label == "provide_info"


def test_pending_gold_user_actions_are_consumed_in_order():
    tid = next(t for t, task in TASKS.items()
               if [a.arguments.get("permission") for a in task.actions if a.name == "grant_app_permission"]
               == ["sms", "storage"])
    cust, view = customer(tid)
    talk(cust, "Please grant_app_permission.", "Please grant_app_permission again.", "grant_app_permission once more")
    assert [b[0][1] for b in view.batches] == [{"app_name": "messaging", "permission": "sms"},
                                               {"app_name": "messaging", "permission": "storage"}, {}]


# ============================================================================ confirmation
def test_confirms_the_gold_refuel_and_refuses_another_amount():
    cust, view = customer(DATA_REFUEL)
    t = talk(cust, "I can refuel 5.0 GB of data on line L1002 for customer C1001. Shall I proceed?",
             "I can refuel 2.0 GB of data on line L1002 for customer C1001 at $2.0/GB. Shall I proceed?")
    assert t[0].label == "reject" and t[0].text.startswith("No, please do not do that. I am only willing to refuel "
                                                           "2.0 GB. As I said: My mobile data")
    assert (t[1].text, t[1].label) == ("Yes, please go ahead.", "confirm")
    # "2 GB" names 2.0; a price that happens to equal the amount does not hide another amount
    assert talk(cust, "Refuel 2 GB on L1002 for C1001, is that ok?")[0].label == "confirm"
    assert talk(cust, "Refuel 5 GB at 2.0 per GB on L1002 for C1001, is that ok?")[0].label == "reject"
    # once the agent made it, it is no longer pending
    view.agent_calls.append(("refuel_data", dict(REFUEL)))
    assert talk(cust, "Shall I refuel 2.0 GB on line L1002 for C1001?")[0].label == "reject"
    assert view.batches == []


def test_other_proposals_are_refused_and_questions_are_not_proposals():
    cust, _ = customer(SERVICE_BILL)
    t = talk(cust, "Shall I send a payment request for bill B1234321 to customer C1001?",
             "Shall I enable roaming on L1002 for C1001?",
             "May I have your phone number so I can check your bill?")
    assert [x.label for x in t] == ["confirm", "reject", "provide_info"]
    assert t[2].text == "My phone number is 555-123-2002."
    # the proposal must name the action too, not only its values
    cust, _ = customer("[mms_issue]bad_network_preference|user_abroad_roaming_disabled_on[PERSONA:None]")
    t = talk(cust, "Shall I resume line L1002 for customer C1001?", "Shall I turn on roaming for L1002 of C1001?",
             "Should I proceed with enable_roaming for C1001 / L1002?")
    assert [x.label for x in t] == ["reject", "confirm", "confirm"]
    assert t[0].text.startswith("No, please do not do that. As I said: I am unable to send MMS")


def test_device_action_and_confirmation_in_one_reply():
    cust, view = customer(SERVICE_BILL)
    turn = run(cust.respond("Please check_payment_request. Also, shall I resume_line L1002 for C1001?"))
    assert view.batches == [[("check_payment_request", {})]]
    assert turn.label == "confirm" and turn.text.endswith("Yes, please go ahead.")


# ============================================================================ endings
def test_stops_in_the_reply_whose_action_fixes_the_phone():
    cust, view = customer(DATA_REFUEL, fix=[("toggle_data", {})])
    turn = run(cust.respond(device_request("toggle_data", {})))
    assert view.batches == [[("toggle_data", {})]]
    assert turn.stop == STOP and turn.label == "accept"
    assert turn.text == "I did toggle_data. It says: toggle_data done. Status Bar: ok Thank you, that fixed it! " + STOP


def test_transfer_task_ends_only_by_the_transfer():
    cust, view = customer(TRANSFER_TASK, holds=True)  # no_service holds from the start
    turn = run(cust.respond(device_request("reseat_sim_card", {})))
    assert turn.stop is None and turn.label == "provide_info"
    view.agent_calls.append(("transfer_to_human_agents", {"summary": "I cannot fix the issue."}))
    turn = run(cust.respond("I have transferred you to a human agent."))
    assert (turn.text, turn.label, turn.stop) == (TRANSFER, "accept", TRANSFER)
    # a transfer the task does not want: the customer leaves, complaining
    cust, view = customer(DATA_REFUEL)
    view.agent_calls.append(("transfer_to_human_agents", {"summary": "x"}))
    turn = run(cust.respond("Please reboot_device."))
    assert (turn.text, turn.label, turn.stop) == (TRANSFER, "complain", TRANSFER) and view.batches == []


def test_patience_and_max_replies():
    cust, view = customer(MMS_ABROAD, patience=2)
    t = talk(cust, "Hmm.", "Please toggle_data.", "Okay.", "What does the screen say?")
    assert [x.label for x in t] == ["be_vague", "provide_info", "be_vague", "complain"]
    assert t[-1].stop == STOP and t[-1].text == "This is going nowhere, I give up. " + STOP
    assert t[0].text.startswith("As I said: I am unable")
    cust, _ = customer(MMS_ABROAD, patience=2)
    assert talk(cust, "Can you see it?")[0].label == "clarify_request"
    # a refused proposal moves nothing
    cust, _ = customer(DATA_REFUEL, patience=1)
    assert talk(cust, "Shall I refuel 9 GB for C1001 on L1002?")[0].label == "complain"
    cust, view = customer(MMS_ABROAD, max_replies=3)
    t = talk(cust, "Please toggle_data.", "Please run_speed_test.", "Please can_send_mms.")
    assert [x.stop for x in t] == [None, None, STOP] and t[-1].label == "complain"
    assert t[-1].text == "I did can_send_mms. It says: can_send_mms done. Status Bar: ok I have to go now. " + STOP
    assert len(view.batches) == 3
    with pytest.raises(ValueError, match="patience=0"):
        customer(MMS_ABROAD, patience=0)


def test_every_turn_carries_a_known_label():
    assert FACA_LABELS <= set(DEFAULT_POLARITY)
    for tid in (MMS_ABROAD, DATA_REFUEL, TRANSFER_TASK, SERVICE_BILL):
        cust, _ = customer(tid, patience=50, max_replies=12)
        turns = [run(cust.opening())] + talk(
            cust, "Hello.", "What is your name?", device_request("toggle_airplane_mode", {}), "Are you abroad?",
            "Shall I refuel 2.0 GB for C1001 on L1002?", "Shall I suspend_line L1002?", "Huh?",
            "Please reboot_device and run_speed_test.", "ok", "ok", "ok", "ok")
        assert all(t.label in FACA_LABELS for t in turns), turns
        assert turns[-1].stop == STOP

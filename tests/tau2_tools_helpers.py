"""Shared by the tau2 retail tool tests: real records of the packaged db.json, a fresh database
per test, and tool calls that must succeed."""

import json

import pytest

from jaxagent.envs.tau2.domains.retail.db import (
    load_db,
)
from jaxagent.envs.tau2.domains.retail.tools import (
    execute,
)

INITIAL_HASH = "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c"

# Real records of db.json used below.
PROCESSED = "#W2611340"          # james_li_5688, processed
GC_PENDING = "#W8955613"         # olivia_lopez_9494, pending, paid 585.97 with gift_card_6682391 (balance 35.0)
OLIVIA_GC, OLIVIA_CC = "gift_card_6682391", "credit_card_6044108"
CC_PENDING = "#W1080318"         # omar_kim_3528, pending, paid 53.43 with credit_card_3577130
OMAR_GC, OMAR_CC = "gift_card_3749819", "credit_card_3577130"     # gift card balance 91.0
HOSES = "#W7208030"              # liam_lee_5696, pending, two Garden Hoses 5753502325 (96.35 each)
LIAM_CC = "credit_card_5809636"
MULTI = "#W9093821"              # harper_kovacs_8617, pending: Backpack 3557711149 x2, Wall Clock 8917609800, ...
HARPER_CC = "credit_card_7422485"
DELIVERED = "#W4250821"          # sophia_jackson_6355, delivered, paid with credit_card_8041020
SOPHIA_CC, SOPHIA_CC2, SOPHIA_PP, SOPHIA_GC = ("credit_card_8041020", "credit_card_6547060", "paypal_7425862",
                                               "gift_card_6052478")   # gift card balance 10.0
VACUUM, KEYBOARD, PET_BED = "9970989750", "5222576926", "6857426243"  # 569.43, 249.95, 196.53


@pytest.fixture(scope="module")
def initial_db():
    return load_db()


@pytest.fixture
def db():
    return load_db()


def call(db, name, **arguments):
    return execute(db, name, arguments)


def ok(db, name, **arguments):
    result = execute(db, name, arguments)
    assert result.error is False, result.content
    return json.loads(result.content) if result.content.startswith("{") else result.content


# ------------------------------------------------------------------------------------------------


ADDRESS = {"address1": "1 Elm St", "address2": "", "city": "Austin", "state": "TX", "country": "USA", "zip": "73301"}
CANONICAL_ADDRESS = {k: ADDRESS[k] for k in ("address1", "address2", "city", "country", "state", "zip")}
E = "Error: "
MODIFY_ITEMS = "modify_pending_order_items"
EXCHANGE = "exchange_delivered_order_items"
RETURN = "return_delivered_order_items"

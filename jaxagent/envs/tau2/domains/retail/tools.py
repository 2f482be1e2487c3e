"""The 16 agent tools of tau2-bench retail, on the plain-dict database of :mod:`.db` (host code, no jax).

Behaviour follows tau2-bench (``sierra-research/tau2-bench``) at commit ``a2c0247``, as written down
in the project's retail specification (sections 2 and 3): every check runs in tau2's order and
fails with tau2's exact message, writes happen only after all checks pass, float arithmetic uses
the same operands, order and rounding points (so the database hash after any sequence of calls
equals tau2's), and tau2's quirks are kept on purpose:

* ``cancel_pending_order`` refunds *every* payment-history entry (refunds included);
* ``modify_pending_order_items`` gives every modified item the price and options of the *last*
  new variant of the call, and records an unrounded price difference;
* ``exchange_delivered_order_items`` rounds its difference, has no new-differs-from-old check, and
  stores both id lists sorted independently (an empty exchange stores the integer 0);
* arguments are not validated against the schema: a wrong type simply fails a lookup or raises
  Python's own error, as in tau2.

:class:`RetailTools` holds the database and has one method per tool (tau2's parameter names; the
class name makes Python's own argument errors read like tau2's). :func:`execute` turns one tool call
into the tool message content (spec 3.2) and never raises; :func:`render` is its result
formatting; :func:`tool_schemas` gives the OpenAI function schemas shown to the agent: tau2's own,
byte for byte, from the packaged ``tool_schemas.json`` (checked against the methods on first use).
"""


from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxagent.envs.tau2.domains.retail.db import DEFAULT_DATA_DIR
from jaxagent.envs.tau2.tools import ToolError, ToolResult, calculate, check_schemas, run_tool, schema_file_text

__all__ = [
    "CANCEL_REASONS",
    "ENV_FUNCTIONS",
    "GENERIC_TOOLS",
    "READ_TOOLS",
    "TOOL_NAMES",
    "TOOL_SCHEMAS_FILE",
    "WRITE_TOOLS",
    "RetailTools",
    "check_tool_schemas",
    "execute",
    "tool_schemas",
]

CANCEL_REASONS: tuple[str, ...] = ("no longer needed", "ordered by mistake")
WRITE_TOOLS: frozenset[str] = frozenset({
    "cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
    "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
    "return_delivered_order_items"})
"""The seven tools that change the database (the ones tau2's evaluator replays)."""
READ_TOOLS: frozenset[str] = frozenset({
    "find_user_id_by_email", "find_user_id_by_name_zip", "get_item_details", "get_order_details",
    "get_product_details", "get_user_details", "list_all_product_types"})
GENERIC_TOOLS: frozenset[str] = frozenset({"calculate", "transfer_to_human_agents"})
TOOL_NAMES: tuple[str, ...] = tuple(sorted(WRITE_TOOLS | READ_TOOLS | GENERIC_TOOLS))
"""All 16 tool names, sorted."""
ENV_FUNCTIONS: frozenset[str] = frozenset({
    "_get_order", "_get_user", "_get_product", "_get_item", "_get_variant", "_get_payment_method",
    "_is_pending_order"})
"""The non-tool methods of tau2's ``RetailTools`` (same names and parameters here), which tau2's
environment functions (initialization actions, env assertions) may call."""

ADDRESS_FIELDS: tuple[str, ...] = ("address1", "address2", "city", "country", "state", "zip")


def _validate_address(**fields: Any) -> dict[str, str]:
    """tau2's ``UserAddress(...)``: every field must be a string (pydantic's error text otherwise)."""
    bad = [(name, fields[name]) for name in ADDRESS_FIELDS if not isinstance(fields[name], str)]
    if bad:
        count = f"{len(bad)} validation error{'s' if len(bad) > 1 else ''} for UserAddress"
        lines = [count]
        for name, value in bad:
            lines.append(name)
            lines.append(f"  Input should be a valid string [type=string_type, input_value={value!r}, "
                         f"input_type={type(value).__name__}]")
        raise ToolError("\n".join(lines))
    return {name: fields[name] for name in ADDRESS_FIELDS}


def _is_gift_card(method: dict) -> bool:
    return method.get("source") == "gift_card"


# --------------------------------------------------------------------------------------------------
# the tools

class RetailTools:
    """tau2's retail toolkit over a canonical plain-dict database (mutated in place by write tools)."""

    def __init__(self, db: dict) -> None:
        self.db = db

    # -- shared lookups (spec 2.1) --------------------------------------------------------------------

    def _get_order(self, order_id: str) -> dict:
        if order_id not in self.db["orders"]:
            raise ToolError("Order not found")
        return self.db["orders"][order_id]

    def _get_user(self, user_id: str) -> dict:
        if user_id not in self.db["users"]:
            raise ToolError("User not found")
        return self.db["users"][user_id]

    def _get_product(self, product_id: str) -> dict:
        if product_id not in self.db["products"]:
            raise ToolError("Product not found")
        return self.db["products"][product_id]

    def _get_item(self, item_id: str) -> dict:
        for product in self.db["products"].values():
            if item_id in product["variants"]:
                return product["variants"][item_id]
        raise ToolError("Item not found")

    def _get_variant(self, product_id: str, variant_id: str) -> dict:
        product = self._get_product(product_id)
        if variant_id not in product["variants"]:
            raise ToolError("Variant not found")
        return product["variants"][variant_id]

    def _get_payment_method(self, user_id: str, payment_method_id: str) -> dict:
        user = self._get_user(user_id)
        if payment_method_id not in user["payment_methods"]:
            raise ToolError("Payment method not found")
        return user["payment_methods"][payment_method_id]

    def _is_pending_order(self, order: Any) -> bool:
        """tau2's helper, reached only as an environment function: ``"pending" in order.status`` (a JSON
        object has no ``status`` attribute, so it raises Python's AttributeError there, as tau2's does)."""
        return "pending" in order.status

    # -- generic ----------------------------------------------------------------------------------

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression; the value rounded to 2 decimals, as text."""
        return calculate(expression)

    def transfer_to_human_agents(self, summary: str) -> str:
        """Hand the conversation to a human; changes nothing and does not end the episode."""
        return "Transfer successful"

    # -- reads ------------------------------------------------------------------------------------

    def find_user_id_by_email(self, email: str) -> str:
        """First user (file order) whose email equals ``email`` ignoring case."""
        for user_id, user in self.db["users"].items():
            if user["email"].lower() == email.lower():
                return user_id
        raise ToolError("User not found")

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """First user whose names match ignoring case and whose profile zip equals ``zip`` exactly."""
        for user_id, user in self.db["users"].items():
            if (user["name"]["first_name"].lower() == first_name.lower()
                    and user["name"]["last_name"].lower() == last_name.lower()
                    and user["address"]["zip"] == zip):
                return user_id
        raise ToolError("User not found")

    def get_user_details(self, user_id: str) -> dict:
        """The User record."""
        return self._get_user(user_id)

    def get_order_details(self, order_id: str) -> dict:
        """The Order record (all 14 fields)."""
        return self._get_order(order_id)

    def get_product_details(self, product_id: str) -> dict:
        """The Product record with all its variants."""
        return self._get_product(product_id)

    def get_item_details(self, item_id: str) -> dict:
        """The Variant of the first product (file order) that has it."""
        return self._get_item(item_id)

    def list_all_product_types(self) -> str:
        """JSON text {product name: product id}, keys sorted."""
        product_dict = {product["name"]: product["product_id"] for product in self.db["products"].values()}
        return json.dumps(product_dict, sort_keys=True)

    # -- writes -----------------------------------------------------------------------------------

    def cancel_pending_order(self, order_id: str, reason: str) -> dict:
        """Cancel a ``pending`` order, refunding every payment-history entry (gift cards at once)."""
        order = self._get_order(order_id)
        if order["status"] != "pending":
            raise ToolError("Non-pending order cannot be cancelled")
        if reason not in {"no longer needed", "ordered by mistake"}:
            raise ToolError("Invalid reason")
        # Every owner method exists (all payments are made with the owner's methods), so resolve them
        # all before touching a balance: no partial write can happen.
        methods = [self._get_payment_method(order["user_id"], payment["payment_method_id"])
                   for payment in order["payment_history"]]
        refunds = []
        for payment, method in zip(order["payment_history"], methods):
            refunds.append({"transaction_type": "refund", "amount": payment["amount"],
                            "payment_method_id": payment["payment_method_id"]})
            if _is_gift_card(method):
                method["balance"] = round(method["balance"] + payment["amount"], 2)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return order

    def modify_pending_order_address(self, order_id: str, address1: str, address2: str, city: str,
                                     state: str, country: str, zip: str) -> dict:
        """Replace the shipping address of a pending (or item-modified) order."""
        order = self._get_order(order_id)
        if "pending" not in order["status"]:
            raise ToolError("Non-pending order cannot be modified")
        order["address"] = _validate_address(address1=address1, address2=address2, city=city, state=state,
                                             country=country, zip=zip)
        return order

    def modify_user_address(self, user_id: str, address1: str, address2: str, city: str, state: str,
                            country: str, zip: str) -> dict:
        """Replace a user's profile address (orders untouched)."""
        user = self._get_user(user_id)
        user["address"] = _validate_address(address1=address1, address2=address2, city=city, state=state,
                                            country=country, zip=zip)
        return user

    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> dict:
        """Switch the single payment of a pending order to another of the owner's methods."""
        order = self._get_order(order_id)
        if "pending" not in order["status"]:
            raise ToolError("Non-pending order cannot be modified")
        method = self._get_payment_method(order["user_id"], payment_method_id)
        history = order["payment_history"]
        if len(history) != 1 or history[0]["transaction_type"] != "payment":
            raise ToolError("There should be exactly one payment for a pending order")
        old_id = history[0]["payment_method_id"]
        if old_id == payment_method_id:
            raise ToolError("The new payment method should be different from the current one")
        amount = history[0]["amount"]
        if _is_gift_card(method) and method["balance"] < amount:
            raise ToolError("Insufficient gift card balance to pay for the order")
        old_method = self._get_payment_method(order["user_id"], old_id)   # resolved before any write
        history.extend([
            {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
            {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id},
        ])
        if _is_gift_card(method):
            method["balance"] = round(method["balance"] - amount, 2)
        if _is_gift_card(old_method):
            old_method["balance"] = round(old_method["balance"] + amount, 2)
        return order

    @staticmethod
    def _check_counts(order: dict, item_ids: list[str], message: str) -> None:
        """Each id occurs in ``item_ids`` at most as often as among the order's items (duplicates
        count); else ToolError(``message`` with ``{item_id}`` filled in)."""
        all_item_ids = [item["item_id"] for item in order["items"]]
        for item_id in item_ids:
            if item_ids.count(item_id) > all_item_ids.count(item_id):
                raise ToolError(message.format(item_id=item_id))

    def _swap_variant(self, order: dict, item_id: str, new_item_id: str) -> tuple[dict, dict]:
        """(the first order item with ``item_id``, the available variant ``new_item_id`` of its product)."""
        item = next((item for item in order["items"] if item["item_id"] == item_id), None)
        if item is None:
            raise ToolError(f"Item {item_id} not found")
        variant = self._get_variant(item["product_id"], new_item_id)
        if not variant["available"]:
            raise ToolError(f"New item {new_item_id} not found or available")
        return item, variant

    def modify_pending_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                   payment_method_id: str) -> dict:
        """Swap items of a ``pending`` order for other variants of the same products (once per order)."""
        order = self._get_order(order_id)
        if order["status"] != "pending":
            raise ToolError("Non-pending order cannot be modified")
        self._check_counts(order, item_ids, "{item_id} not found")
        if len(item_ids) != len(new_item_ids):
            raise ToolError("The number of items to be exchanged should match")
        diff_price = 0
        variant = None
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            if item_id == new_item_id:
                raise ToolError("The new item id should be different from the old item id")
            item, variant = self._swap_variant(order, item_id, new_item_id)
            diff_price += variant["price"] - item["price"]
        method = self._get_payment_method(order["user_id"], payment_method_id)
        if _is_gift_card(method) and method["balance"] < diff_price:
            raise ToolError("Insufficient gift card balance to pay for the new item")

        order["payment_history"].append({
            "transaction_type": "payment" if diff_price > 0 else "refund",
            "amount": float(abs(diff_price)),          # unrounded; 0.0 for empty lists
            "payment_method_id": payment_method_id,
        })
        if _is_gift_card(method):
            method["balance"] = round(method["balance"] - diff_price, 2)
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            # tau2's bug, kept: price and options come from the LAST variant looked up above.
            item = next(item for item in order["items"] if item["item_id"] == item_id)
            item["item_id"] = new_item_id
            item["price"] = variant["price"]
            item["options"] = dict(variant["options"])
        order["status"] = "pending (item modified)"
        return order

    def exchange_delivered_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                       payment_method_id: str) -> dict:
        """Request an exchange of delivered items for other variants (once per order; no payment yet)."""
        order = self._get_order(order_id)
        if order["status"] != "delivered":
            raise ToolError("Non-delivered order cannot be exchanged")
        self._check_counts(order, item_ids, "Number of {item_id} not found.")
        if len(item_ids) != len(new_item_ids):
            raise ToolError("The number of items to be exchanged should match.")
        diff_price = 0
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            item, variant = self._swap_variant(order, item_id, new_item_id)
            diff_price += variant["price"] - item["price"]
        diff_price = round(diff_price, 2)     # an int 0 stays an int 0 (empty lists)
        method = self._get_payment_method(order["user_id"], payment_method_id)
        if _is_gift_card(method) and method["balance"] < diff_price:
            raise ToolError("Insufficient gift card balance to pay for the price difference")
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = diff_price
        return order

    def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str) -> dict:
        """Request a return of delivered items, refunded to the original method or a gift card."""
        order = self._get_order(order_id)
        if order["status"] != "delivered":
            raise ToolError("Non-delivered order cannot be returned")
        user = self._get_user(order["user_id"])
        method = self._get_payment_method(user["user_id"], payment_method_id)
        if (not _is_gift_card(method)
                and payment_method_id != order["payment_history"][0]["payment_method_id"]):
            raise ToolError("Payment method should be the original payment method")
        self._check_counts(order, item_ids, "Some item not found")
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return order


# --------------------------------------------------------------------------------------------------
# calling a tool

def execute(db: dict, name: str, arguments: Any) -> ToolResult:
    """Run one retail tool call against ``db`` (mutated in place by write tools); never raises
    (`jaxagent.envs.tau2.tools.run_tool`)."""
    return run_tool(RetailTools(db), TOOL_NAMES, name, arguments)


# --------------------------------------------------------------------------------------------------
# schemas shown to the agent: tau2's own, from the packaged file

TOOL_SCHEMAS_FILE: Path = DEFAULT_DATA_DIR / "tool_schemas.json"
"""tau2's 16 OpenAI function schemas as its own code generates them (``{"source": ..., "tools": [...]}``,
MIT, Sierra Research); :func:`tool_schemas` serves its ``tools`` list unchanged."""


def check_tool_schemas(schemas: Any) -> None:
    """Raise ``ValueError`` unless ``schemas`` describe exactly the implemented tools
    (`jaxagent.envs.tau2.tools.check_schemas` over :class:`RetailTools` and :data:`TOOL_NAMES`)."""
    check_schemas(schemas, RetailTools, TOOL_NAMES)


def tool_schemas() -> tuple[dict, ...]:
    """tau2's 16 OpenAI function schemas, exactly as in :data:`TOOL_SCHEMAS_FILE`: tau2's order
    (not :data:`TOOL_NAMES`'s), tau2's descriptions, key order and quirks (``"title":
    "parameters"``; no ``required`` for ``list_all_product_types``).

    The file is read and checked against the methods (:func:`check_tool_schemas`) once; every
    call returns fresh objects, so a caller may change them.
    """
    return tuple(json.loads(schema_file_text(TOOL_SCHEMAS_FILE, check_tool_schemas)))

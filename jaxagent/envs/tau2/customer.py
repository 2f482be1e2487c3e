"""tau2 customers: the protocol, and an LLM customer over HTTP.

Both play the customer of one task, see only the agent's text messages (never its tool calls or
tool results), speak first after the agent's fixed greeting, and return with every message a
private reaction label (a Faca strategy label, `jaxagent.credit.reaction.DEFAULT_POLARITY`) and,
when they end the episode, the tau2 stop token they used: ``###STOP###`` (goal reached, or given
up), ``###TRANSFER###`` (handed to a human) or ``###OUT-OF-SCOPE###``.

**LLMCustomer** sends tau2's prompt (tau2's own user-simulator guidelines, verbatim, for every
domain's text-only customer, then the task's ``<scenario>`` block, `tasks.render_scenario`) to an
OpenAI-compatible server through `LLMUserClient`, asking for
``{"utterance", "strategy"}`` JSON so each message carries its label.

Each domain has its deterministic stand-in (`Domain.scripted_customer`:
`jaxagent.envs.tau2.domains.<domain>.customer.ScriptedCustomer`), for offline training and tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig
from jaxagent.envs.tau2.tasks import Task, render_scenario
from jaxagent.envs.user_prompt import DEFAULT_SYSTEM_PROMPT

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)
GREETING = "Hi! How can I help you today?"

GUIDELINES_FILE: Path = Path(__file__).resolve().parents[2] / "data" / "tau2_retail" / "user_simulator_guidelines.md"
"""tau2's guidelines for a text-only simulated user, verbatim (MIT, Sierra Research): every domain's
text-only LLM customer gets them (the file lives in the retail data folder, as tau2 ships it)."""

ANSWER_FORMAT = """\
Answer with one JSON object and nothing else:
{{"utterance": "<your message to the agent>", "strategy": "<one label for how you react, one of: \
provide_info, confirm, approve, accept, be_vague, clarify_request, correct, reject, challenge, complain>"}}"""
"""What jaxagent adds after tau2's prompt: the reply as JSON, so that each message carries its private
reaction label (Faca's strategy label)."""


def _customer_prompt() -> str:
    guidelines = GUIDELINES_FILE.read_text(encoding="utf-8").strip().replace("{", "{{").replace("}", "}}")
    return f"{guidelines}\n\n{{scenario}}\n\n{ANSWER_FORMAT}"


CUSTOMER_PROMPT = _customer_prompt()
"""The LLM customer's system prompt template: tau2's guidelines (`GUIDELINES_FILE`), the task's
``<scenario>`` block (``{scenario}``: `tasks.render_scenario`), as tau2 lays them out, then
`ANSWER_FORMAT`."""


@dataclasses.dataclass(frozen=True)
class CustomerTurn:
    """One customer message: its ``text`` (stop tokens included, as tau2 keeps them), its private
    reaction ``label`` and the stop token that ends the episode (None: it goes on)."""

    text: str
    label: str | None
    stop: str | None = None


class EpisodeView(Protocol):
    """What the environment lets a scripted customer check (the LLM customer uses none of it)."""

    task: Task

    def goal_db_reached(self) -> bool: ...

    def unexpected_writes(self) -> list[tuple[str, Mapping[str, Any]]]: ...

    def pending_writes(self) -> list[Any]: ...

    def successful_calls(self) -> list[tuple[str, Mapping[str, Any]]]: ...

    def assistant_texts(self) -> list[str]: ...


class Customer(Protocol):
    async def opening(self) -> CustomerTurn: ...

    async def respond(self, agent_text: str) -> CustomerTurn: ...

    async def aclose(self) -> None: ...


# ----------------------------------------------------------------------------- LLM
def customer_config(config: LLMUserConfig) -> LLMUserConfig:
    """``config`` with the tau2 stop tokens, and the tau2 customer prompt unless it sets its own."""
    prompt = CUSTOMER_PROMPT if config.system_prompt == DEFAULT_SYSTEM_PROMPT else config.system_prompt
    return dataclasses.replace(config, system_prompt=prompt, stop_markers=STOP_TOKENS, opening_message=GREETING)


class LLMCustomer:
    """The task's customer played by an OpenAI-compatible model (see the module docstring). The
    client may be shared by many episodes (it bounds its own concurrency); it must have been built
    from `customer_config` (the tau2 stop tokens)."""

    def __init__(self, client: LLMUserClient, task: Task):
        missing = [t for t in STOP_TOKENS if t not in client.config.stop_markers]
        if missing:
            raise ValueError(f"LLMCustomer: the client's stop_markers lack {missing}; expected a client built "
                             "from customer_config(config)")
        self.client, self.task = client, task
        self.profile = {"scenario": render_scenario(task)}
        self.conversation: list[dict[str, Any]] = []
        self.retries = 0

    async def _turn(self) -> CustomerTurn:
        reply = await self.client.respond(self.conversation, self.profile)
        self.retries += reply.attempts - 1
        stop = next((t for t in STOP_TOKENS if t in reply.raw), None)
        text = (reply.utterance + " " + stop).strip() if stop else reply.utterance
        self.conversation.append({"role": "user", "content": reply.utterance, "strategy": reply.strategy})
        return CustomerTurn(text, reply.strategy, stop)

    async def opening(self) -> CustomerTurn:
        return await self._turn()

    async def respond(self, agent_text: str) -> CustomerTurn:
        self.conversation.append({"role": "assistant", "content": agent_text})
        try:
            return await self._turn()
        except BaseException:  # failed or cancelled: the caller may retry with the same text
            self.conversation.pop()
            raise

    async def aclose(self) -> None:
        return None  # the shared client is closed by its owner


CustomerFactory = Callable[[Task, EpisodeView], Customer]

__all__ = [
    "ANSWER_FORMAT",
    "CUSTOMER_PROMPT",
    "GREETING",
    "GUIDELINES_FILE",
    "OUT_OF_SCOPE",
    "STOP",
    "STOP_TOKENS",
    "TRANSFER",
    "Customer",
    "CustomerFactory",
    "CustomerTurn",
    "EpisodeView",
    "LLMCustomer",
    "customer_config",
]

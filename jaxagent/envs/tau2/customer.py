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

**A customer with tools** (dual control, telecom): the LLM customer is given tau2's guidelines for
a user with tools (`TOOLS_GUIDELINES_FILE`) and the domain's user tools through the OpenAI
function-calling API (``tools`` in every request). A reply with ``tool_calls`` runs them on the
customer's phone (the episode's `EpisodeView.user_tools`), their results go back to the model as
``tool`` messages, and it is asked again, until it answers with text (at most
``max_tool_rounds`` rounds a turn: more is a non-retryable `SimulatorError`, the episode a
simulator failure). HTTP failures are retried by the client; a turn that fails after some of its
device actions ran keeps them (they are done on the phone, and recorded) and a retry with the same
agent text continues the same turn.

Each domain has its deterministic stand-in (`Domain.scripted_customer`:
`jaxagent.envs.tau2.domains.<domain>.customer.ScriptedCustomer`), for offline training and tests.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig, SimulatorError
from jaxagent.envs.tau2 import get_domain
from jaxagent.envs.tau2.tasks import Task, render_scenario
from jaxagent.envs.tau2.tools import ToolResult
from jaxagent.envs.user_prompt import DEFAULT_SYSTEM_PROMPT, render_system_prompt

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


TOOLS_GUIDELINES_FILE: Path = (Path(__file__).resolve().parents[2] / "data" / "tau2_telecom"
                               / "user_simulator_guidelines_tools.md")
"""tau2's guidelines for a simulated user with tools, verbatim (MIT, Sierra Research), for the LLM
customer of a dual-control domain (telecom)."""


def tools_customer_prompt(task: Task) -> str:
    """The system prompt of an LLM customer with tools, as tau2 builds it (spec §6.1): the guidelines
    verbatim (they end with a newline), two newlines, the ``<scenario>`` block; then, jaxagent's
    addition, `ANSWER_FORMAT` for the text replies (so each carries its reaction label)."""
    guidelines = TOOLS_GUIDELINES_FILE.read_text(encoding="utf-8")
    return f"{guidelines}\n\n{render_scenario(task)}\n\n" + ANSWER_FORMAT.replace("{{", "{").replace("}}", "}")


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

    # dual control (a domain whose customer has tools):
    def user_tools(self, calls: Sequence[tuple[str, Any]]) -> list[ToolResult]: ...

    def assertions_hold(self) -> bool: ...


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
    from `customer_config` (the tau2 stop tokens). ``view``: the episode, required when the task's
    domain gives the customer tools (it acts on its phone through ``view.user_tools``)."""

    def __init__(self, client: LLMUserClient, task: Task, *, view: EpisodeView | None = None,
                 max_tool_rounds: int = 16):
        missing = [t for t in STOP_TOKENS if t not in client.config.stop_markers]
        if missing:
            raise ValueError(f"LLMCustomer: the client's stop_markers lack {missing}; expected a client built "
                             "from customer_config(config)")
        if max_tool_rounds < 1:
            raise ValueError(f"LLMCustomer: max_tool_rounds={max_tool_rounds}; expected an integer >= 1")
        self.client, self.task, self.view = client, task, view
        self.profile = {"scenario": render_scenario(task)}
        self.conversation: list[dict[str, Any]] = []
        self.retries = 0
        self.max_tool_rounds = max_tool_rounds
        domain = get_domain(task.domain)
        self.tools = [dict(t) for t in domain.user_tool_schemas()] if domain.has_user_tools else []
        if self.tools and view is None:
            raise ValueError(f"LLMCustomer: the {domain.name} customer acts with tools; expected view=<the episode>")
        # the tool mode's own prompt unless the client's config brings its own
        self.system = (tools_customer_prompt(task) if client.config.system_prompt == CUSTOMER_PROMPT
                       else render_system_prompt(client.config.system_prompt, self.profile, client.config.stop_markers))
        self.wire: list[dict[str, Any]] = [{"role": "user", "content": GREETING}]  # the simulator's side, tool mode
        self._open: str | None = None   # the agent text of a tool-mode turn that failed part-way
        self._ids = self._rounds = 0

    async def _turn(self) -> CustomerTurn:
        reply = await self.client.respond(self.conversation, self.profile)
        self.retries += reply.attempts - 1
        stop = next((t for t in STOP_TOKENS if t in reply.raw), None)
        text = (reply.utterance + " " + stop).strip() if stop else reply.utterance
        self.conversation.append({"role": "user", "content": reply.utterance, "strategy": reply.strategy})
        return CustomerTurn(text, reply.strategy, stop)

    async def _tool_turn(self) -> CustomerTurn:
        """One customer turn with tools: device actions until a text reply (module docstring)."""
        for _ in range(self.max_tool_rounds + 1):
            message, attempts, latency = await self.client.chat(
                [{"role": "system", "content": self.system}, *self.wire], extra={"tools": self.tools},
                require_content=False)
            self.retries += attempts - 1
            calls = [c for c in (message.get("tool_calls") or ()) if isinstance(c, dict)]
            if not calls:
                reply = self.client.parse_turn(message.get("content") or "", attempts, latency)
                stop = next((t for t in STOP_TOKENS if t in reply.raw), None)
                text = (reply.utterance + " " + stop).strip() if stop else reply.utterance
                said = reply.utterance if reply.strategy is None else json.dumps(
                    {"utterance": reply.utterance, "strategy": reply.strategy}, ensure_ascii=False)
                self.wire.append({"role": "assistant", "content": said})   # as the text-only customer's history
                self.conversation.append({"role": "user", "content": reply.utterance, "strategy": reply.strategy})
                return CustomerTurn(text, reply.strategy, stop)
            self._rounds += 1
            if self._rounds > self.max_tool_rounds:
                break
            parsed, wire = [], []
            for c in calls:
                fn = c.get("function") if isinstance(c.get("function"), dict) else {}
                name = fn.get("name") if isinstance(fn.get("name"), str) else "unknown"
                raw = fn.get("arguments", "{}")
                raw = "{}" if isinstance(raw, str) and not raw.strip() else raw   # no-argument tools, some servers
                try:
                    args = json.loads(raw) if isinstance(raw, str) else raw
                except json.JSONDecodeError:
                    args = raw   # not an object: the environment answers it with an error
                self._ids += 1
                call_id = c.get("id") if isinstance(c.get("id"), str) else f"user_call_{self._ids}"
                parsed.append((name, args))
                wire.append({"id": call_id, "type": "function",
                             "function": {"name": name, "arguments": raw if isinstance(raw, str) else json.dumps(raw)}})
            results = self.view.user_tools(parsed)
            self.wire.append({"role": "assistant", "content": message.get("content") or None, "tool_calls": wire})
            self.wire += [{"role": "tool", "tool_call_id": w["id"], "content": r.content}
                          for w, r in zip(wire, results, strict=True)]
        raise SimulatorError(f"user simulator: more than {self.max_tool_rounds} rounds of tool calls in one turn "
                             "without a message to the agent", status=None, attempts=1, reason="tool_loop",
                             kind="other_status", retryable=False)

    def _start_turn(self) -> None:
        self._rounds = 0

    async def opening(self) -> CustomerTurn:
        if not self.tools:
            return await self._turn()
        self._start_turn()
        return await self._tool_turn()

    async def respond(self, agent_text: str) -> CustomerTurn:
        if self.tools:
            if self._open != agent_text:   # a new turn (else: a retry continues the failed one)
                self.wire.append({"role": "user", "content": agent_text})
                self.conversation.append({"role": "assistant", "content": agent_text})
                self._start_turn()
            self._open = agent_text
            turn = await self._tool_turn()
            self._open = None
            return turn
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
    "TOOLS_GUIDELINES_FILE",
    "TRANSFER",
    "Customer",
    "CustomerFactory",
    "CustomerTurn",
    "EpisodeView",
    "LLMCustomer",
    "customer_config",
    "tools_customer_prompt",
]

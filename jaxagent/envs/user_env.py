"""An `Environment` whose user is an LLM simulator over HTTP (`LLMUserClient`).

The task supplies the user's hidden profile (``instructions`` and any other fields the system
prompt names) and the opening request. Each agent message goes to the simulator; its utterance
comes back as the next user message with its private strategy label as the reaction. The episode
ends when the simulator says its stop marker, or after ``max_user_turns`` replies. The reward is
left to a scorer (``score(conversation) -> float``; default 0): this environment is a user, not a
benchmark.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jaxagent.envs.base import AgentMessage, EnvMessage, Environment, Reset, Step
from jaxagent.envs.llm_user import LLMUserClient


EMPTY_AGENT_TURN = "(the assistant said nothing)"


class LLMUserEnv(Environment):
    def __init__(self, client: LLMUserClient, tasks: Mapping[str, Mapping[str, Any]], *,
                 system_prompt: str = "You are a helpful assistant.", max_user_turns: int = 8,
                 score: Callable[[list[dict]], float] | None = None):
        self.client, self.tasks = client, tasks
        self.system_prompt, self.max_user_turns, self.score = system_prompt, max_user_turns, score
        self.conversation: list[dict] = []
        self.profile: Mapping[str, Any] = {}
        self.replies = 0

    async def reset(self, task_id: str, seed: int) -> Reset:
        if task_id not in self.tasks:
            raise KeyError(f"task_id={task_id!r}: not among the {len(self.tasks)} tasks of this environment")
        task = self.tasks[task_id]
        self.profile = task["profile"]
        opening = EnvMessage("user", task["opening"])
        self.conversation = [{"role": "user", "content": task["opening"]}]
        self.replies = 0
        return Reset((EnvMessage("system", self.system_prompt), opening))

    async def step(self, message: AgentMessage) -> Step:
        # An agent turn with no text for the user (only tool calls, or nothing) still gets the
        # user's reaction: the simulator is shown a marker instead of an empty message.
        self.conversation.append({"role": "assistant", "content": message.content.strip() or EMPTY_AGENT_TURN})
        reply = await self.client.respond(self.conversation, self.profile)
        self.replies += 1
        self.conversation.append({"role": "user", "content": reply.utterance, "strategy": reply.strategy})
        done = reply.stop or self.replies >= self.max_user_turns
        reward = float(self.score(self.conversation)) if (done and self.score) else 0.0
        msg = EnvMessage("user", reply.utterance, reaction=reply.strategy)
        return Step((msg,), reward=reward, done=done, info={"parse_error": reply.parse_error,
                                                                "simulator_retries": reply.attempts - 1})

"""An `Environment` whose user is an LLM simulator over HTTP (`LLMUserClient`).

The task supplies the user's hidden profile (``instructions`` and any other fields the system
prompt names) and the opening request. Each agent message goes to the simulator; its utterance
comes back as the next user message with its private strategy label as the reaction. The episode
ends when the simulator says its stop marker, or after ``max_user_turns`` replies. The reward is
left to a scorer (``score(conversation) -> float``; default 0): this environment is a user, not a
benchmark.

- **Retries.** `step` commits nothing before the simulator's reply arrives (the agent's message
  is sent with the conversation so far, and both are appended only once the reply is in), so the
  rollout loop may call it again with the same message after it raised or was cancelled (a
  timeout): the simulator sees the agent's message once, as the tau2 retail environment does.
- **Long replies.** With ``max_reply_chars``, an utterance longer than that is cut to it, both in
  what the agent gets and in the conversation the simulator is shown next (so a runaway reply is
  not sent back to it); ``info["reply_truncated"]`` says so. The rollout loop then cuts the reply
  to its token limit (``rollout.max_reply_tokens``; `jaxagent.jobs` sets
  ``max_reply_chars`` to 8x that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jaxagent.envs.base import AgentMessage, EnvFactory, Environment, EnvMessage, Reset, Step
from jaxagent.envs.llm_user import LLMUserClient
from jaxagent.envs.registry import EnvContext, EnvSetup, EnvSpec

EMPTY_AGENT_TURN = "(the assistant said nothing)"


class LLMUserEnv(Environment):
    def __init__(self, client: LLMUserClient, tasks: Mapping[str, Mapping[str, Any]], *,
                 system_prompt: str = "You are a helpful assistant.", max_user_turns: int = 8,
                 score: Callable[[list[dict]], float] | None = None, max_reply_chars: int | None = None):
        if max_reply_chars is not None and max_reply_chars < 1:
            raise ValueError(f"max_reply_chars={max_reply_chars}: expected None (no limit) or an integer >= 1")
        self.client, self.tasks = client, tasks
        self.system_prompt, self.max_user_turns, self.score = system_prompt, max_user_turns, score
        self.max_reply_chars = max_reply_chars
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
        """The simulator's answer to ``message``. Safe to call again with the same message after it
        raised or was cancelled: nothing is committed before the reply arrives."""
        # An agent turn with no text for the user (only tool calls, or nothing) still gets the
        # user's reaction: the simulator is shown a marker instead of an empty message.
        agent = {"role": "assistant", "content": message.content.strip() or EMPTY_AGENT_TURN}
        reply = await self.client.respond([*self.conversation, agent], self.profile)  # may raise: nothing committed
        utterance, truncated = reply.utterance, False
        if self.max_reply_chars is not None and len(utterance) > self.max_reply_chars:
            utterance, truncated = utterance[: self.max_reply_chars], True
        self.conversation.append(agent)
        self.replies += 1
        self.conversation.append({"role": "user", "content": utterance, "strategy": reply.strategy})
        done = reply.stop or self.replies >= self.max_user_turns
        reward = float(self.score(self.conversation)) if (done and self.score) else 0.0
        msg = EnvMessage("user", utterance, reaction=reply.strategy)
        return Step((msg,), reward=reward, done=done, info={"parse_error": reply.parse_error,
                                                                "simulator_retries": reply.attempts - 1,
                                                                "reply_truncated": truncated})


class LLMUserEnvFactory(EnvFactory):
    """`LLMUserEnv` per episode over one shared client (closed by `aclose`)."""

    def __init__(self, client: LLMUserClient, tasks: Mapping[str, Mapping[str, Any]], **kwargs):
        self.client, self.tasks, self.kwargs = client, tasks, kwargs

    def __call__(self) -> LLMUserEnv:
        return LLMUserEnv(self.client, self.tasks, **self.kwargs)

    async def aclose(self) -> None:
        await self.client.aclose()


# ----------------------------------------------------------------------------- the registered family
def _check(env: Any) -> None:
    if env.llm_user is None or env.user_tasks is None:
        raise ValueError("kind='llm_user': expected env.llm_user (base_url, model, ...) and env.user_tasks")


def _build(ctx: EnvContext) -> EnvSetup:
    """``env.user_tasks`` (a JSON file ``{task_id: {profile, opening}}``) sorted by id: the first fifth
    (at most ``test_tasks``, at least one) is the test split, the rest the train split."""
    import json
    from pathlib import Path

    env = ctx.settings
    path = Path(env.user_tasks)
    try:
        tasks = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"env.user_tasks={str(path)!r}: expected a readable JSON file of "
                         f"{{task_id: {{profile, opening}}}} ({err})") from None
    ids = sorted(tasks)
    n_test = min(ctx.test_tasks, max(1, len(ids) // 5))
    factory = LLMUserEnvFactory(LLMUserClient(env.llm_user), tasks, max_user_turns=ctx.max_turns,
                                max_reply_chars=ctx.max_reply_chars)
    return EnvSetup(factory, ids[n_test:][: ctx.train_tasks], ids[:n_test])


LLM_USER = EnvSpec(
    name="llm_user", build=_build, description="an LLM user simulator over HTTP (env.llm_user, env.user_tasks)",
    check=_check, simulator_clients=lambda env: [("env.llm_user", env.llm_user)] if env.llm_user is not None else [])

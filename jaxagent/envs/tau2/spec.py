"""tau2-bench as a registered family: ``env.kind=tau2`` with ``env.tau2.domain`` (retail, airline, telecom),
and ``env.kind=tau2_retail``, the same family with the domain fixed to retail (today's configs).

Settings are the run's ``env`` section: ``env.tau2`` (`Tau2Section`: data, split, task selection,
customer, scoring, judge, limits) and ``train_tasks`` / ``test_tasks``. Demonstrations are the
gold-action oracle's episodes (one per task); host agents for ``job=eval`` are ``oracle`` and
``endpoint``. Evaluations default to k = 4 runs per task (``EnvSpec.eval_k``; ``eval.k`` sets
another), reported as avg@k and tau2's pass^1..pass^k (`jaxagent.envs.tau2.harness`).

**Splits.** ``env.tau2.split`` is the split that is *evaluated* (``train``, the default, or
``test``, the split the papers report: retail ships it, airline's and telecom's are withheld and
their absence is an error at config load); ``env.tau2.tasks`` selects among its tasks. *Training* (RL tasks, SFT
demonstrations) always draws from the train split, never from the test split: with split=train the
same selection serves both (``env.train_tasks`` / ``env.test_tasks`` of it: no held-out set, the
behaviour before there were splits); with split=test the first ``env.train_tasks`` of all train
tasks train and the first ``env.test_tasks`` of the selected test tasks are the held-out
evaluation, during training as in ``job=eval``.

**Turn limit.** ``env.tau2.max_steps`` counts tau2's steps (each agent message, customer message
and batch of tool results is one); 200 is tau2's default (its command line's ``--max-steps``), and
the papers' limit of 50 is ``env.tau2.max_steps=50``, the same count (a limit of 50 in a tau2 run
can only be tau2's ``--max-steps 50``). ``env.tau2.max_errors`` (10) is tau2's error budget.

**Telecom** (dual control): the customer acts on its own phone; ``customer=llm`` gives the LLM
customer the 30 user tools through function calling, ``customer=scripted`` performs the device
action the agent names. Its tasks need no judge: ``scoring=offline`` scores telecom by tau2's own
basis (env assertions, x ACTION on transfer tasks), the same as ``scoring=tau2``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from jaxagent.envs import tau2
from jaxagent.envs.llm_user import LLMUserConfig
from jaxagent.envs.tau2.tasks import SPLITS, check_split
from jaxagent.envs.registry import (DemoPlan, DemoRequest, EnvContext, EnvSetup, EnvSpec, HostEval, HostEvalRequest,
                                    HostEvalResult, resolve_env)

DOMAINS = tuple(tau2.DOMAINS)
"""The tau2 domains ``env.tau2.domain`` may name (`jaxagent.envs.tau2.DOMAINS`)."""


def _help(default, text: str):
    return dataclasses.field(default=default, metadata={"help": text})


@dataclasses.dataclass(frozen=True)
class Tau2Section:
    """``env.tau2``: which tau2 domain and tasks, the customer, the scoring and the episode limits."""

    domain: str = _help(tau2.DEFAULT_DOMAIN, "the tau2 domain (env.kind=tau2): " + ", ".join(DOMAINS))
    data_dir: str | None = _help(None, "the domain's tau2 data (db.json or telecom's db.toml and user_db.toml, "
                                        "policy.md, tasks_train.json, tasks_test.json); null: the packaged copy")
    split: Literal["train", "test"] = _help(
        "train", "the evaluated split: train (the shipped tasks) or test (the papers' split; retail ships it, airline's "
                 "and telecom's are withheld); training always uses train")
    tasks: str = _help("all", "task selection: all, a slice start:stop of the file order, or ids a,b,c")
    customer: Literal["scripted", "llm"] = _help("scripted", "the deterministic scripted customer, or an LLM one")
    customer_llm: LLMUserConfig | None = _help(None, "customer=llm: the OpenAI-compatible endpoint playing it")
    scoring: Literal["offline", "tau2"] = _help(
        "offline", "offline: DB x COMMUNICATE (classic tau-bench, no model call; telecom: its own basis, which needs "
                   "no judge); tau2: each task's reward basis, NL assertions by env.tau2.judge")
    judge: LLMUserConfig | None = _help(None, "scoring=tau2: the OpenAI-compatible NL-assertion judge")
    max_steps: int = _help(200, "steps (agent messages, customer messages, tool-result batches) per episode: 200 is "
                                "tau2's default (--max-steps), 50 the papers' limit")
    max_errors: int = _help(10, "error tool messages that end an episode (tau2's default)")

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise ValueError(f"domain={self.domain!r}: expected one of {', '.join(map(repr, DOMAINS))}")
        if self.customer == "llm" and self.customer_llm is None:
            raise ValueError("customer='llm': expected env.tau2.customer_llm (base_url, model, ...)")
        if self.max_steps < 1 or self.max_errors < 1:
            raise ValueError(f"max_steps={self.max_steps}, max_errors={self.max_errors}: expected integers >= 1")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise ValueError(f"data_dir={self.data_dir!r}: not a directory; expected one holding db.json, policy.md "
                             "and tasks_train.json (or null for the packaged copy)")
        if self.split not in SPLITS:
            raise ValueError(f"split={self.split!r}: expected one of {', '.join(map(repr, SPLITS))}")
        if self.split != "train":  # train ships for every domain; another split may be withheld
            try:
                check_split(self.data_dir, self.split, self.domain)
            except FileNotFoundError as e:
                raise ValueError(str(e)) from None


def simulator_clients(env: Any) -> list[tuple[str, LLMUserConfig]]:
    """``env.tau2.customer_llm`` (customer=llm) and ``env.tau2.judge`` (scoring=tau2: the episode's
    last step also judges), in the order one step may use them."""
    t = env.tau2
    out = [("env.tau2.customer_llm", t.customer_llm)] if t.customer == "llm" and t.customer_llm else []
    return out + ([("env.tau2.judge", t.judge)] if t.scoring == "tau2" and t.judge is not None else [])


def _build(ctx: EnvContext) -> EnvSetup:
    """The factory over the evaluated split (and the train split), the train ids from the train split
    and the test ids from the evaluated one (the module docstring's **Splits**)."""
    from jaxagent.envs.tau2.harness import Tau2EnvFactory

    factory = Tau2EnvFactory(ctx.settings.tau2)
    factory.record(False)  # evaluations record their own episodes
    return EnvSetup(factory, factory.train_ids[: ctx.train_tasks], factory.task_ids[: ctx.test_tasks])


def _demos(ctx: EnvContext, setup: EnvSetup, request: DemoRequest) -> DemoPlan:
    """The oracle's episode on each of the first ``min(train_tasks, n)`` train tasks (it is deterministic)."""
    from jaxagent.envs.tau2.agents import oracle_plan

    factory = setup.factory
    return oracle_plan(factory, factory.tasks, factory.train_ids[: min(ctx.train_tasks, request.n)])


def _host_eval(ctx: EnvContext, request: HostEvalRequest, setup: EnvSetup) -> HostEval:
    """The oracle or an OpenAI-compatible endpoint (at ``request.temperature``, as the local policy
    samples at eval.temperature) on every selected task of the evaluated split, ``k`` times, at most
    ``max_steps`` turns; summarised by `jaxagent.envs.tau2.harness.summarize` (avg@k, pass^1..pass^k,
    the components, the scoring basis and what it leaves out) with the domain and split."""
    from jaxagent.envs.llm_user import LLMUserClient
    from jaxagent.envs.tau2.agents import EndpointAgent, OracleAgent
    from jaxagent.envs.tau2.harness import per_task, summary_text

    section = ctx.settings.tau2
    factory = setup.factory
    client = LLMUserClient(request.endpoint.client_config(request.temperature)) if request.agent == "endpoint" else None

    def agent(env, seed):
        return EndpointAgent(client) if client is not None else OracleAgent()

    def summarise(reports):
        summary = {"customer": section.customer, **factory.summary(reports, k=request.k)}
        return HostEvalResult(per_task(reports), summary, summary_text)

    async def aclose():
        await factory.aclose()
        if client is not None:
            await client.aclose()

    return HostEval(agent, list(factory.task_ids), section.max_steps, summarise, aclose)


def _check_retail(env: Any) -> None:
    if env.tau2.domain != "retail":
        raise ValueError(f"kind='tau2_retail': the retail domain; expected env.tau2.domain='retail' (got "
                         f"{env.tau2.domain!r}), or env.kind=tau2")


_COMMON = dict(
    build=_build, max_reward=1.0, needs_text_tokenizer=True, sampled_eval=False, demonstrations=_demos,
    host_agents=("oracle", "endpoint"), host_eval=_host_eval, simulator_clients=simulator_clients,
    reaction_labels=("provide_info", "confirm", "approve", "accept", "be_vague", "clarify_request", "correct", "reject",
                     "challenge", "complain"), eval_k=4)

TAU2 = EnvSpec(name="tau2", description="tau2-bench (env.tau2.domain: " + ", ".join(DOMAINS) + ")",
               label=lambda env: f"tau2_{env.tau2.domain}", **_COMMON)
TAU2_RETAIL = EnvSpec(name="tau2_retail", description="tau2-bench retail (env.kind=tau2 with env.tau2.domain=retail)",
                      check=_check_retail, **_COMMON)



def tau2_domain(env: Any) -> str | None:
    """The tau2 domain a run's ``env`` section plays (``env.tau2.domain``), or None when ``env.kind``
    is not a tau2 family."""
    return env.tau2.domain if resolve_env(env.kind) in (TAU2, TAU2_RETAIL) else None


__all__ = ["DOMAINS", "TAU2", "TAU2_RETAIL", "Tau2Section", "simulator_clients", "tau2_domain"]

"""``job=qd_tau2``: the Q&D loop inside a tau2 agent against the same roles without the
questioner (the Q&D spec's §5.4; docs/QD.md, "tau2 transfer"), on the domain ``env.tau2.domain``
(one with a Q&D plug-in: `jaxagent.qd.tau2.QD_DOMAINS`, retail and airline).

    python -m jaxagent.launch job=qd_tau2 env=tau2_retail                       # offline stand-ins, CPU
    python -m jaxagent.launch job=qd_tau2 env=tau2 env.tau2.domain=airline      # the same on airline
    python -m jaxagent.launch --config configs/qd_tau2.yaml qd.questioner=endpoint \\
        qd.questioner_endpoint.base_url=... qd.drafter=endpoint qd.drafter_endpoint.base_url=... \\
        qd.answerer=endpoint qd.answerer_endpoint.base_url=... qd.tau2.selector=endpoint qd.tau2.baseline=endpoint

Two arms over the same tasks (``env.tau2.tasks``) and seeds (``qd.seeds``): the **treatment** is
`jaxagent.qd.tau2.Tau2QDAgent` with ``qd.questioner`` (scripted: the offline
`ScriptedTau2Questioner`; never_ask; policy: the local model; endpoint), the selector
``qd.tau2.selector``, the drafter and answerer ``qd.drafter`` / ``qd.answerer`` (extractive: the
offline lookup stand-ins); the **baseline** (``qd.tau2.baseline``) is the same agent with no
question (never_ask) or the drafter's model as a plain tool-calling agent (endpoint). Per arm:
success (reward 1) and reward, questions per dialogue, follow-up customer turns (customer messages
after the opening), planned tool calls, terminations, failed episodes (a role or the customer
still failing after its retries: counted, kept out of every reading; past ``qd.max_failed_share``
of an arm the job stops non-zero). Paired per task (seeds averaged), BCa intervals, the decided
rule and the MDE (`jaxagent.eval.qd_stats`). Writes ``runs/<name>/``: ``episodes_<arm>.jsonl``
(each episode's report, transcript and the agent's per-turn log), ``tasks_<arm>.jsonl``,
``summary.json``.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from jaxagent.eval.qd_stats import compare_arms
from jaxagent.jobs.config import RunConfig
from jaxagent.jobs.evaluate import write_jsonl
from jaxagent.jobs.qd_eval import LocalPolicy, make_questioner
from jaxagent.qd import tau2
from jaxagent.qd.agents import NeverAsk, describe
from jaxagent.train.step import TrainingFailed

READINGS = ("success", "reward", "questions", "follow_up_turns", "planned_calls")


def _episode_row(report: Mapping[str, Any]) -> dict[str, Any]:
    reward = float((report.get("score") or {}).get("reward", 0.0))
    qd = report.get("qd") or {}
    return {"task_id": str(report["task_id"]), "seed": report["seed"], "termination": report.get("termination"),
            "failed": report.get("termination") == "simulator_failure", "success": float(reward >= 1.0),
            "reward": reward, "questions": qd.get("questions", 0), "follow_up_turns": tau2.follow_up_turns(report),
            "planned_calls": qd.get("planned_calls", 0)}


def arm_readings(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Means over the arm's episodes that did not fail, and the counts."""
    rows = [_episode_row(r) for r in reports]
    kept = [r for r in rows if not r["failed"]]
    out: dict[str, Any] = {"episodes": len(rows), "failed_episodes": len(rows) - len(kept),
                           "terminations": dict(Counter(r["termination"] for r in rows))}
    for k in READINGS:
        out[k] = sum(r[k] for r in kept) / len(kept) if kept else math.nan
    return out


def per_task(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in map(_episode_row, reports):
        if not r["failed"]:
            by.setdefault(r["task_id"], []).append(r)
    return [{"task_id": t, "runs": len(rs), **{k: sum(r[k] for r in rs) / len(rs) for k in READINGS}}
            for t, rs in by.items()]


def compare(treatment: Sequence[Mapping[str, Any]], baseline: Sequence[Mapping[str, Any]], *, resamples: int,
            seed: int) -> dict[str, Any]:
    """Each reading paired at the task (treatment - baseline), failed episodes left out."""
    def values(reports):
        return {(r["task_id"], r["seed"]): r for r in map(_episode_row, reports) if not r["failed"]}

    a, b = values(treatment), values(baseline)
    return {k: compare_arms({key: r[k] for key, r in a.items()}, {key: r[k] for key, r in b.items()}, n=resamples,
                            seed=seed) for k in READINGS}


def _agents(cfg: RunConfig, kind: str, clients: list, model):
    """(a factory ``(env, seed) -> agent`` for the arm, its description)."""
    from jaxagent.envs.llm_user import LLMUserClient
    from jaxagent.envs.tau2.agents import EndpointAgent, EndpointConfig

    q, domain = cfg.qd, cfg.env.tau2.domain
    if kind == "endpoint":  # the drafter's model as a plain tool-calling agent
        e = q.drafter_endpoint
        ep = EndpointConfig(base_url=e.base_url, model=e.model, api_key_env=e.api_key_env, max_tokens=e.max_tokens)
        clients.append(LLMUserClient(ep.client_config(cfg.eval.temperature)))
        client = clients[-1]
        return (lambda env, seed: EndpointAgent(client)), f"endpoint agent:{e.model}"

    def client(endpoint):
        clients.append(LLMUserClient(endpoint))
        return clients[-1]

    questioner = NeverAsk() if kind == "never_ask" else (
        tau2.ScriptedTau2Questioner(domain) if q.questioner == "scripted"
        else make_questioner(cfg, q.questioner, q.questioner_endpoint, model, clients))
    drafter = (tau2.LookupDrafter() if q.drafter == "extractive"
               else tau2.EndpointDrafter(client(q.drafter_endpoint), domain))
    answerer = (tau2.LookupAnswerer(domain) if q.answerer == "extractive"
                else tau2.EndpointAnswerer(client(q.answerer_endpoint), domain))
    selector = (tau2.RuleSelector(domain) if q.tau2.selector == "rules"
                else tau2.EndpointSelector(client(q.tau2.selector_endpoint or q.drafter_endpoint), domain))
    settings = tau2.Tau2QDConfig(questions=q.tau2.questions, tool_calls=q.tau2.tool_calls,
                                 max_decisions=q.tau2.max_decisions, prompt=q.tau2.prompt, retries=q.retries)
    key = jax.random.key(cfg.seed)

    def make(env, seed):
        return tau2.Tau2QDAgent(questioner, selector, drafter, answerer, reader=env.read, key=key, seed=seed,
                                config=settings, domain=domain)

    return make, (f"qd: questioner {describe(questioner)}, selector {describe(selector)}, drafter "
                  f"{describe(drafter)}, answerer {describe(answerer)}")


def run_qd_tau2(cfg: RunConfig) -> dict[str, Any]:
    from jaxagent.envs.tau2.harness import SCORING_NOTE, Tau2EnvFactory
    from jaxagent.jobs.resume import checked_run_dir, record_config
    from jaxagent.rollout.runner import play_tasks

    t0 = time.perf_counter()
    q = cfg.qd
    run_dir = checked_run_dir(cfg)
    record_config(cfg, run_dir)
    model = LocalPolicy(cfg) if q.questioner == "policy" else None
    arms = [("treatment", "qd")] + ([("baseline", q.tau2.baseline)] if q.tau2.baseline != "none" else [])
    reports: dict[str, list[dict[str, Any]]] = {}
    described: dict[str, str] = {}

    def keep_log(agent, report) -> None:
        if isinstance(agent, tau2.Tau2QDAgent):
            report["qd"] = agent.record()

    async def main():
        clients: list = []
        factory = Tau2EnvFactory(cfg.env.tau2)
        factory.record(False)  # the reports come back from `play`
        try:
            for arm, kind in arms:
                make, described[arm] = _agents(cfg, kind, clients, model)
                reports[arm] = await play_tasks(factory, make, factory.task_ids, k=q.seeds, concurrency=q.concurrency,
                                                max_turns=cfg.env.tau2.max_steps, on_report=keep_log)
                if cfg.progress:
                    print(f"[qd_tau2] {arm}: {len(reports[arm])} episodes", file=sys.stderr, flush=True)
        finally:
            await factory.aclose()
            for c in clients:
                await c.aclose()
        return factory

    factory = asyncio.run(main())
    summary: dict[str, Any] = {
        "name": cfg.name, "job": "qd_tau2", "domain": cfg.env.tau2.domain, "customer": cfg.env.tau2.customer,
        "scoring_mode": cfg.env.tau2.scoring, "scoring_note": SCORING_NOTE[cfg.env.tau2.scoring],
        "tasks": len(factory.task_ids), "seeds": q.seeds, "prompt": q.tau2.prompt,
        "budgets": {"questions": q.tau2.questions, "tool_calls": q.tau2.tool_calls},
        "max_steps": cfg.env.tau2.max_steps, "max_errors": cfg.env.tau2.max_errors, "arms": {}}
    failure = None
    for arm, _ in arms:
        write_jsonl(run_dir / f"episodes_{arm}.jsonl", reports[arm])
        write_jsonl(run_dir / f"tasks_{arm}.jsonl", per_task(reports[arm]))
        readings = arm_readings(reports[arm])
        readings["agent"] = described[arm]
        readings["failure_examples"] = [r.get("error") for r in reports[arm]
                                        if r.get("termination") == "simulator_failure"][:3]
        summary["arms"][arm] = readings
        if readings["episodes"] and readings["failed_episodes"] > q.max_failed_share * readings["episodes"]:
            failure = (f"arm {arm}: {readings['failed_episodes']} of {readings['episodes']} episodes failed (a role, "
                       f"the customer or the judge after its retries), over qd.max_failed_share={q.max_failed_share}; "
                       f"first: {readings['failure_examples'][0]}")
    if "baseline" in reports and failure is None:
        summary["comparison"] = compare(reports["treatment"], reports["baseline"], resamples=q.bootstrap, seed=cfg.seed)
    summary["wall_seconds"] = time.perf_counter() - t0
    (run_dir / "summary.json").write_text(json.dumps(_finite(summary), indent=2) + "\n")
    if cfg.progress:
        print(summary_table(summary), file=sys.stderr, flush=True)
    if failure is not None:
        raise TrainingFailed(failure)
    return summary


def _finite(x):
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return x


def summary_table(summary: Mapping[str, Any]) -> str:
    head = (f"qd_tau2 on tau2 {summary['domain']} ({summary['customer']} customer, scoring {summary['scoring_mode']}): "
            f"{summary['tasks']} tasks x {summary['seeds']} seeds, prompt {summary['prompt']}")
    lines = [head]
    for arm, r in summary["arms"].items():
        lines.append(f"  {arm}: {r['agent']}")
        lines.append("    " + "  ".join(f"{k} {r[k]:.3f}" if isinstance(r[k], float) else f"{k} {r[k]}"
                                         for k in READINGS) + f"  failed {r['failed_episodes']}/{r['episodes']}")
    for k, c in (summary.get("comparison") or {}).items():
        lo, hi = c["interval"]
        lines.append(f"  {k}: treatment - baseline {c['mean_diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] over {c['n_tasks']} "
                     f"tasks{' (decided)' if c['decided'] else ''}, MDE {c['mde']:.3f}")
    return "\n".join(lines)


__all__ = ["READINGS", "arm_readings", "compare", "per_task", "run_qd_tau2", "summary_table"]

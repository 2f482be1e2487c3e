"""The tau2 evaluation harness: environments from config, host agents, per-task results.

    python -m jaxagent.launch job=eval env=tau2_retail agent=oracle                 # the gold-action oracle
    python -m jaxagent.launch job=eval env=tau2_retail agent=endpoint \\
        eval.endpoint.base_url=http://127.0.0.1:8000/v1 eval.endpoint.model=Qwen/Qwen2.5-7B-Instruct eval.k=4
    python -m jaxagent.launch job=eval env=tau2_retail model.path=ckpt tokenizer=ckpt eval.tasks=74 \
        rollout.tool_schemas_in_prompt=true rollout.capacity=16384 rollout.max_tokens=16384 \
        rollout.max_turns=60 rollout.max_new_tokens=512                            # a local checkpoint

`Tau2EnvFactory` builds one `Tau2Env` per episode from the ``env.tau2`` section (domain, customer,
scoring mode, judge, limits) and keeps them, so that after a run `Tau2EnvFactory.drain` gives every
episode's report (task, seed, termination, score components, transcript). Every agent plays
through the episode runner (`jaxagent.rollout.runner`): a local model token-in/token-out, host
agents (``oracle``, ``endpoint``: `jaxagent.envs.tau2.spec`) ``eval.concurrency`` episodes at once.

`per_task` gives one row per task (``tasks.jsonl``); `summarize` turns reports into avg@k figures:
``reward`` (mean episode reward), ``success``
(share with reward 1), ``pass_at_k`` (tasks solved by at least one of the k runs), the DB and
COMMUNICATE component means, terminations, and the scoring mode, which every summary carries
(``offline`` = DB x COMMUNICATE, not comparable with tau2's leaderboard).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxagent.envs.base import EnvFactory
from jaxagent.envs.tau2.env import EpisodeLimits, Tau2Env, llm_customers, scripted_customers
from jaxagent.envs.tau2.tasks import load_task_set, select_tasks

SCORING_NOTE = {"offline": "offline: DB x COMMUNICATE (classic tau-bench scoring; not tau2's DB x NL_ASSERTION)",
                "tau2": "tau2: each task's reward basis, NL assertions by an LLM judge"}


class Tau2EnvFactory(EnvFactory):
    """Builds a `Tau2Env` per call from an ``env.tau2`` section (`jaxagent.jobs.config.Tau2Section`)
    and, while recording (the default), remembers it (`drain`). HTTP clients (customer, judge) are
    made once and shared."""

    def __init__(self, section):
        from jaxagent.envs.llm_user import LLMUserClient
        from jaxagent.envs.tau2.customer import customer_config

        self.section = section
        self.tasks = load_task_set(section.data_dir, section.split, domain=section.domain)
        self.task_ids = select_tasks(self.tasks, section.tasks)
        self.customer_client = (LLMUserClient(customer_config(section.customer_llm))
                                if section.customer == "llm" else None)
        self.judge = LLMUserClient(section.judge) if section.scoring == "tau2" and section.judge else None
        if section.scoring == "tau2" and self.judge is None and any(
                self.tasks[t].nl_assertions and "NL_ASSERTION" in self.tasks[t].reward_basis for t in self.task_ids):
            raise ValueError("env.tau2.scoring='tau2': the selected tasks have NL assertions; expected env.tau2.judge "
                             "(an OpenAI-compatible endpoint) or env.tau2.scoring='offline'")
        self.customers = (llm_customers(self.customer_client) if self.customer_client is not None
                          else scripted_customers())
        self.limits = EpisodeLimits(section.max_steps, section.max_errors)
        self.envs: list[Tau2Env] = []
        self.recording = True  # False: environments are not kept (RL rollouts: nothing to report)

    def __call__(self) -> Tau2Env:
        env = Tau2Env(self.tasks, customer=self.customers, data_dir=self.section.data_dir, domain=self.section.domain,
                      scoring_mode=self.section.scoring, limits=self.limits, judge=self.judge)
        if self.recording:
            self.envs.append(env)
        return env

    def drain(self) -> list[dict[str, Any]]:
        """The reports of the episodes played since the last drain (started ones only)."""
        out = [e.report() for e in self.envs if e.task is not None]
        self.envs = []
        return out

    def record(self, on: bool) -> None:
        self.recording = on

    def summarize(self, reports: Sequence[Mapping[str, Any]], *, k: int) -> dict[str, Any]:
        """`summarize`'s DB and COMMUNICATE means, pass@k and the scoring mode, as ``tau2/*``."""
        t2 = summarize(reports, scoring_mode=self.section.scoring, k=k)
        return {f"tau2/{key}": t2[key] for key in ("db", "communicate", "pass_at_k", "scoring_mode")}

    def per_task(self, reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return per_task(reports)

    async def aclose(self) -> None:
        for c in (self.customer_client, self.judge):
            if c is not None:
                await c.aclose()


def summarize(reports: Sequence[Mapping[str, Any]], *, scoring_mode: str, k: int) -> dict[str, Any]:
    """avg@k figures over episode reports (see the module docstring)."""
    if not reports:
        raise ValueError("reports: empty; expected at least one episode")

    def comp(r, name):
        s = r.get("score") or {}
        return float((s.get("components") or {}).get(name, 0.0))

    rewards = [float((r.get("score") or {}).get("reward", 0.0)) for r in reports]
    by_task: dict[str, list[float]] = collections.defaultdict(list)
    for r, x in zip(reports, rewards):
        by_task[str(r["task_id"])].append(x)
    n = len(reports)
    return {"episodes": n, "tasks": len(by_task), "k": k, "scoring_mode": scoring_mode,
            "scoring_note": SCORING_NOTE[scoring_mode],
            "reward": sum(rewards) / n, "success": sum(x >= 1.0 for x in rewards) / n,
            "pass_at_k": sum(any(x >= 1.0 for x in v) for v in by_task.values()) / len(by_task),
            "db": sum(comp(r, "DB") for r in reports) / n,
            "communicate": sum(comp(r, "COMMUNICATE") for r in reports) / n,
            "terminations": dict(collections.Counter(r.get("termination", "unknown") for r in reports)),
            "success_by_task": {t: sum(x >= 1.0 for x in v) / len(v) for t, v in by_task.items()}}


def per_task(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per task (file order of first appearance): its k runs' mean reward, success rate
    (reward 1), DB and COMMUNICATE means and terminations."""
    rows: dict[str, list[Mapping[str, Any]]] = {}
    for r in reports:
        rows.setdefault(str(r["task_id"]), []).append(r)

    def mean(xs):
        return sum(xs) / len(xs)

    out = []
    for tid, rs in rows.items():
        scores = [r.get("score") or {} for r in rs]
        rewards = [float(s.get("reward", 0.0)) for s in scores]
        comps = [s.get("components") or {} for s in scores]
        out.append({"task_id": tid, "runs": len(rs), "reward": mean(rewards),
                    "success": mean([x >= 1.0 for x in rewards]),
                    "db": mean([float(c.get("DB", 0.0)) for c in comps]),
                    "communicate": mean([float(c.get("COMMUNICATE", 0.0)) for c in comps]),
                    "terminations": dict(collections.Counter(r.get("termination", "unknown") for r in rs))})
    return out


def summary_text(summary: Mapping[str, Any]) -> str:
    """A few lines for the terminal: what ran, the avg@k figures, terminations, where the files are."""
    k = summary["k"]
    terms = ", ".join(f"{name} {n}" for name, n in sorted(summary["terminations"].items(), key=lambda x: -x[1]))
    files = summary.get("files", {})
    return "\n".join([
        f"tau2 retail eval (agent={summary['agent']}, customer={summary['customer']}): {summary['tasks']} tasks"
        f" x k={k} = {summary['episodes']} episodes",
        f"  scoring {summary['scoring_note']}",
        f"  reward {summary['reward']:.3f}  success {summary['success']:.3f}  pass^{k} {summary['pass_hat_k']:.3f}"
        f"  pass@{k} {summary['pass_at_k']:.3f}  DB {summary['db']:.3f}  COMMUNICATE {summary['communicate']:.3f}",
        f"  terminations: {terms}",
        *([f"  files in {Path(files['summary.json']).parent}/: summary.json (figures, per-task success),"
           " tasks.jsonl (one row per task), episodes.jsonl (transcripts)"] if files else []),
    ])


__all__ = ["SCORING_NOTE", "Tau2EnvFactory", "per_task", "summarize", "summary_text"]

"""The tau2 evaluation harness: environments from config, host agents, the papers' protocol.

    python -m jaxagent.launch job=eval env=tau2 env.tau2.domain=retail env.tau2.split=test agent=oracle
    python -m jaxagent.launch job=eval env=tau2 env.tau2.domain=airline agent=endpoint \
        eval.endpoint.base_url=http://127.0.0.1:8000/v1 eval.endpoint.model=Qwen/Qwen2.5-7B-Instruct \
        eval.temperature=0.7 env.tau2.max_steps=50               # the papers' turn limit
    python -m jaxagent.launch job=eval env=tau2_retail model.path=ckpt tokenizer=ckpt eval.tasks=74 \
        rollout.tool_schemas_in_prompt=true rollout.capacity=16384 rollout.max_tokens=16384 \
        rollout.max_turns=60 rollout.max_new_tokens=512                            # a local checkpoint
    python -m jaxagent.envs.tau2.table runs/eval-a runs/eval-b     # a Markdown table across runs

`Tau2EnvFactory` builds one `Tau2Env` per episode from the ``env.tau2`` section (domain, split,
customer, scoring mode, judge, limits) and keeps them, so that after a run `Tau2EnvFactory.drain`
gives every episode's report (task, seed, termination, score components, transcript). Every agent
plays through the episode runner (`jaxagent.rollout.runner`): a local model token-in/token-out,
host agents (``oracle``, ``endpoint``: `jaxagent.envs.tau2.spec`) ``eval.concurrency`` episodes at once.

The protocol (tau2's metrics, ``tau2.metrics.agent_metrics`` at commit a2c0247): every selected task
of the split is played k times (``eval.k``; 4 by default on tau2). `summarize` turns the reports
into ``reward`` (avg@k: the mean reward over all k x tasks episodes), ``success`` (the share with
reward 1 within 1e-6, tau2's `is_success`), ``pass_hat_1`` ... ``pass_hat_m`` (tau2's pass^1..pass^m under
tau2's own names, `pass_hat_ks`: for each task with n runs and c successes comb(c, j) / comb(n, j),
averaged over tasks; m = the fewest runs of any task, k when every episode was played; read back by
`pass_hats`) and ``pass_hat_k`` (pass^k), ``pass_at_k``
(tasks solved by at least one run), the mean of each reward component computed (`component_means`:
DB, COMMUNICATE, ACTION; NL_ASSERTION where judged) and the scoring basis (`scoring_basis`: the
reward's components, tau2's basis for the tasks, and what the reward leaves out, e.g. NL_ASSERTION
without a judge). `per_task` gives one row per task (``tasks.jsonl``); `summary_line` is a domain's
one-line summary, `summary_text` a few lines for the terminal, and `jaxagent.envs.tau2.table` the
Markdown table across domains (runs).
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxagent.envs.base import EnvFactory
from jaxagent.envs.tau2.env import EpisodeLimits, Tau2Env, llm_customers, scripted_customers
from jaxagent.envs.tau2.scoring import JUDGE_FREE, OFFLINE_BASIS
from jaxagent.envs.tau2.tasks import REWARD_COMPONENTS, Task, TaskError, load_task_set, select_tasks

SCORING_NOTE = {"offline": "offline: DB x COMMUNICATE (classic tau-bench scoring; not tau2's DB x NL_ASSERTION)",
                "tau2": "tau2: each task's reward basis, NL assertions by an LLM judge"}

#: Why the offline scoring leaves a component of tau2's basis out (`scoring_basis`).
LEFT_OUT_BECAUSE = {"NL_ASSERTION": "no judge configured: env.tau2.scoring=tau2 with env.tau2.judge scores it"}


class Tau2EnvFactory(EnvFactory):
    """Builds a `Tau2Env` per call from an ``env.tau2`` section (`jaxagent.envs.tau2.spec.Tau2Section`)
    and, while recording (the default), remembers it (`drain`). HTTP clients (customer, judge) are
    made once and shared.

    ``task_ids``: the selected tasks of the evaluated split (``env.tau2.split``, ``env.tau2.tasks``);
    ``train_ids``: the tasks training draws from, always of the train split (the selection itself
    when the split is train; every train task otherwise); ``tasks``: every task either names."""

    def __init__(self, section):
        from jaxagent.envs.llm_user import LLMUserClient
        from jaxagent.envs.tau2.customer import customer_config

        self.section = section
        evaluated = load_task_set(section.data_dir, section.split, domain=section.domain)
        self.task_ids = select_tasks(evaluated, section.tasks)
        if section.split == "train":
            self.tasks, self.train_ids = evaluated, list(self.task_ids)
        else:
            train = load_task_set(section.data_dir, "train", domain=section.domain)
            both = sorted(set(train) & set(evaluated), key=str)
            if both:
                raise TaskError(f"split={section.split!r}: task ids {both[:5]} are in both the train and the "
                                f"{section.split} split of tau2 {section.domain}; expected disjoint splits")
            self.tasks, self.train_ids = {**train, **evaluated}, list(train)
        self.customer_client = (LLMUserClient(customer_config(section.customer_llm))
                                if section.customer == "llm" else None)
        self.judge = LLMUserClient(section.judge) if section.scoring == "tau2" and section.judge else None
        if section.scoring == "tau2" and self.judge is None and any(
                self.tasks[t].nl_assertions and "NL_ASSERTION" in self.tasks[t].reward_basis
                for t in [*self.task_ids, *self.train_ids]):
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

    def summary(self, reports: Sequence[Mapping[str, Any]], *, k: int) -> dict[str, Any]:
        """`summarize` of ``reports`` with this factory's domain, split, tasks, scoring mode and limits."""
        t = self.section
        return {"domain": t.domain, "split": t.split, **summarize(reports, scoring_mode=t.scoring, k=k,
                                                                  tasks=self.tasks),
                "max_steps": t.max_steps, "max_errors": t.max_errors}

    def summarize(self, reports: Sequence[Mapping[str, Any]], *, k: int) -> dict[str, Any]:
        """The figures a policy evaluation logs, as ``tau2/*``: the DB, COMMUNICATE and ACTION means,
        pass@k, pass^1..pass^k (where every task had k runs) and the scoring mode."""
        t2 = summarize(reports, scoring_mode=self.section.scoring, k=k)
        out = {f"tau2/{key}": t2[key] for key in ("db", "communicate", "pass_at_k", "scoring_mode")}
        out["tau2/action"] = t2["components"].get("ACTION", 0.0)
        out.update({f"tau2/pass_hat_{j}": v for j, v in pass_hats(t2).items()})
        return out

    def per_task(self, reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return per_task(reports)

    async def aclose(self) -> None:
        for c in (self.customer_client, self.judge):
            if c is not None:
                await c.aclose()


# ----------------------------------------------------------------------------- tau2's metrics
def is_success(reward: float) -> bool:
    """tau2's success: a reward within 1e-6 of 1."""
    return 1 - 1e-6 <= float(reward) <= 1 + 1e-6


def pass_hat_k(n: int, c: int, k: int) -> float:
    """tau2's pass^k of one task with ``n`` runs, ``c`` of them successful: comb(c, k) / comb(n, k),
    the chance that k runs drawn without replacement all succeed (with n == k: 1 when all did,
    else 0). ValueError naming the arguments unless 1 <= k <= n and 0 <= c <= n."""
    if not (isinstance(k, int) and 1 <= k <= n) or not (isinstance(c, int) and 0 <= c <= n):
        raise ValueError(f"pass_hat_k(n={n!r}, c={c!r}, k={k!r}): expected integers with 1 <= k <= n (tau2 needs at "
                         "least k runs of a task) and 0 <= c <= n")
    return math.comb(c, k) / math.comb(n, k)


def pass_hat_ks(successes: Mapping[str, Sequence[bool]]) -> dict[int, float]:
    """``{j: pass^j}`` for j = 1..m over tasks (``{task id: [success of each run]}``), each the mean of
    `pass_hat_k` over the tasks; m is the fewest runs of any task (tau2's max k)."""
    if not successes or not all(successes.values()):
        raise ValueError(f"successes: {dict(successes)!r}; expected at least one task, each with at least one run")
    m = min(len(v) for v in successes.values())
    return {j: sum(pass_hat_k(len(v), sum(map(bool, v)), j) for v in successes.values()) / len(successes)
            for j in range(1, m + 1)}


def _components(report: Mapping[str, Any]) -> Mapping[str, float]:
    return (report.get("score") or {}).get("components") or {}


def component_means(reports: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The mean of each reward component that some episode computed (`REWARD_COMPONENTS` order), over
    the episodes that computed it and those that ended before any scoring (no components: a
    simulator failure, an episode cut by the rollout limits), which count 0. A task whose basis
    lacks NL_ASSERTION has no NL verdict and is left out of that mean."""
    names = [c for c in REWARD_COMPONENTS if any(c in _components(r) for r in reports)]
    out = {}
    for c in names:
        xs = [float(_components(r).get(c, 0.0)) for r in reports if c in _components(r) or not _components(r)]
        out[c] = sum(xs) / len(xs)
    return out


def _basis_name(basis: Sequence[str]) -> str:
    return " x ".join(basis) if basis else "(none)"


def scoring_basis(tasks: Sequence[Task], scoring_mode: str) -> dict[str, Any]:
    """What the reward of ``tasks`` is under ``scoring_mode``: ``reward`` (the product of the components
    it multiplies, e.g. ``"DB x COMMUNICATE"``; ``"tau2's basis"`` in mode tau2), ``tau2_basis``
    (``{basis: tasks}``, tau2's reward basis of the tasks), ``left_out`` (``{component: why}``: the
    components of tau2's basis the reward does not compute), ``in_place`` (those it multiplies that
    tau2's basis does not) and ``note``, one line naming all of it."""
    if scoring_mode not in SCORING_NOTE:
        raise ValueError(f"scoring_mode={scoring_mode!r}: expected one of {', '.join(map(repr, SCORING_NOTE))}")
    counts = collections.Counter(_basis_name(t.reward_basis) for t in tasks)
    tau2_parts = [c for c in REWARD_COMPONENTS if any(c in t.reward_basis for t in tasks)]
    if scoring_mode == "tau2":
        used, left, in_place = tau2_parts, {}, []
        reward = "tau2's basis"
    elif tasks and all(t.domain in JUDGE_FREE for t in tasks):   # no judge needed: tau2's own scoring
        used, left, in_place = tau2_parts, {}, []
        reward = "tau2's basis (no judge needed)"
    else:
        used = list(OFFLINE_BASIS)
        left = {c: LEFT_OUT_BECAUSE.get(c, "not computed by the offline scoring") for c in tau2_parts if c not in used}
        in_place = [c for c in used if c not in tau2_parts]
        reward = _basis_name(used)
    shown = ", ".join(f"{b} ({n} task{'s' if n != 1 else ''})" for b, n in counts.most_common())
    if left:
        gap = "; left out: " + ", ".join(f"{c} ({why})" for c, why in left.items())
        gap += f"; {', '.join(in_place)} in {'its' if len(left) == 1 else 'their'} place" if in_place else ""
    else:
        gap = "; nothing left out"
    note = f"{scoring_mode}: reward = {reward}; tau2's basis: {shown}{gap}"
    return {"mode": scoring_mode, "reward": reward, "tau2_basis": dict(counts), "left_out": left,
            "in_place": in_place, "note": note}


def summarize(reports: Sequence[Mapping[str, Any]], *, scoring_mode: str, k: int,
              tasks: Mapping[str, Task] | None = None) -> dict[str, Any]:
    """The protocol's figures over episode reports (see the module docstring). With ``tasks`` (the
    tasks by id) the summary also carries ``scoring`` (`scoring_basis` of the evaluated tasks) and
    ``scoring_note`` is its note; without, the mode's fixed note (`SCORING_NOTE`)."""
    if not reports:
        raise ValueError("reports: empty; expected at least one episode")
    rewards = [float((r.get("score") or {}).get("reward", 0.0)) for r in reports]
    by_task: dict[str, list[bool]] = collections.defaultdict(list)
    for r, x in zip(reports, rewards):
        by_task[str(r["task_id"])].append(is_success(x))
    n = len(reports)
    hat = pass_hat_ks(by_task)
    comps = component_means(reports)
    out = {"episodes": n, "tasks": len(by_task), "k": k, "scoring_mode": scoring_mode,
           "scoring_note": SCORING_NOTE[scoring_mode],
           "reward": sum(rewards) / n, "success": sum(map(is_success, rewards)) / n,
           **{f"pass_hat_{j}": v for j, v in hat.items()}, "pass_hat_k": hat.get(k),
           "pass_at_k": sum(any(v) for v in by_task.values()) / len(by_task),
           "components": comps, "db": comps.get("DB", 0.0), "communicate": comps.get("COMMUNICATE", 0.0),
           "terminations": dict(collections.Counter(r.get("termination", "unknown") for r in reports)),
           "success_by_task": {t: sum(v) / len(v) for t, v in by_task.items()}}
    if tasks is not None:
        unknown = sorted(set(by_task) - set(tasks))
        if unknown:
            raise ValueError(f"reports: task ids {unknown[:5]} are not among the {len(tasks)} tasks given; expected "
                             "the tasks the episodes played")
        out["scoring"] = scoring_basis([tasks[t] for t in by_task], scoring_mode)
        out["scoring_note"] = out["scoring"]["note"]
    return out


def per_task(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per task (file order of first appearance): its runs, successes (tau2's `is_success`),
    mean reward, success rate, the mean of each component (``components``, `component_means`; DB and
    COMMUNICATE also as ``db``, ``communicate``) and terminations."""
    rows: dict[str, list[Mapping[str, Any]]] = {}
    for r in reports:
        rows.setdefault(str(r["task_id"]), []).append(r)

    out = []
    for tid, rs in rows.items():
        rewards = [float((r.get("score") or {}).get("reward", 0.0)) for r in rs]
        comps = component_means(rs)
        wins = sum(map(is_success, rewards))
        out.append({"task_id": tid, "runs": len(rs), "successes": wins, "reward": sum(rewards) / len(rs),
                    "success": wins / len(rs), "components": comps, "db": comps.get("DB", 0.0),
                    "communicate": comps.get("COMMUNICATE", 0.0),
                    "terminations": dict(collections.Counter(r.get("termination", "unknown") for r in rs))})
    return out


def pass_hats(summary: Mapping[str, Any]) -> dict[int, float]:
    """``{j: pass^j}`` from a summary's ``pass_hat_<j>`` keys (`summarize`), in order of j."""
    found = {int(m.group(1)): v for key, v in summary.items() if (m := re.fullmatch(r"pass_hat_(\d+)", key))}
    return dict(sorted(found.items()))


def _f(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"


def summary_line(summary: Mapping[str, Any]) -> str:
    """A domain's evaluation in one line: domain, split, agent, tasks x k, avg@k, success, pass^k,
    the component means, and the scoring basis with what it leaves out."""
    k = summary["k"]
    comps = " ".join(f"{c} {_f(v)}" for c, v in (summary.get("components") or {}).items())
    scoring = summary.get("scoring") or {}
    basis = f"{summary['scoring_mode']} {scoring.get('reward', '')}".rstrip()
    if scoring.get("left_out"):
        basis += ", " + ", ".join(scoring["left_out"]) + " left out"
    return (f"tau2 {summary.get('domain', '?')}/{summary.get('split', '?')} agent={summary.get('agent', 'policy')}: "
            f"{summary['tasks']} tasks x k={k} | avg@{k} {_f(summary['reward'])} success {_f(summary['success'])} "
            f"pass^{k} {_f(summary.get('pass_hat_k'))} | {comps} | {basis}")


def summary_text(summary: Mapping[str, Any]) -> str:
    """A few lines for the terminal: `summary_line`, the scoring note, pass^1..pass^k and pass@k,
    terminations, where the files are."""
    k = summary["k"]
    terms = ", ".join(f"{name} {n}" for name, n in sorted(summary["terminations"].items(), key=lambda x: -x[1]))
    files = summary.get("files", {})
    hats = "  ".join(f"pass^{j} {_f(v)}" for j, v in pass_hats(summary).items())
    return "\n".join([
        summary_line(summary),
        f"  customer {summary.get('customer', '?')}, {summary['episodes']} episodes; scoring {summary['scoring_note']}",
        f"  {hats}  pass@{k} {_f(summary['pass_at_k'])}",
        f"  terminations: {terms}",
        *([(f"  files in {Path(files['summary.json']).parent}/: summary.json (figures, per-task success),"
            " tasks.jsonl (one row per task), episodes.jsonl (transcripts)")] if files else []),
    ])


__all__ = ["LEFT_OUT_BECAUSE", "SCORING_NOTE", "Tau2EnvFactory", "component_means", "is_success", "pass_hat_k",
           "pass_hat_ks", "pass_hats", "per_task", "scoring_basis", "summarize", "summary_line", "summary_text"]

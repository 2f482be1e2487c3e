"""The tau2 oracle and its broken variants on every shipped task of each domain and split, against
the scripted customer.

    python3 scripts/eval_tau2_oracle.py [--domain retail|airline|telecom|all] [--split train|test|all] [--k 1]
                                        [--data-dir DIR] [--out runs/tau2_oracle.jsonl]

For each domain and split (``all``: every registered domain, every split its package ships; a split
it does not ship is skipped with a note, or an error when that domain was named): the oracle agent
(the gold actions, each write confirmed by the customer first) plays every task ``--k`` times and
must score reward 1 (offline: DB x COMMUNICATE; telecom, which needs no judge: tau2's basis,
ENV_ASSERTION x ACTION); each broken variant the task admits (a wrong argument, a missing write, an
extra write: the domain's `Domain.broken_plans`) must score 0, DB included (except in telecom, where
DB is a diagnostic: tau2's target skips the sync). Prints one line per domain and split (`jaxagent.envs.tau2.harness.summary_line`: avg@k,
pass^k, components, scoring basis) and the broken variants' counts, then the Markdown table across
them (`jaxagent.envs.tau2.table.markdown_table`), then one JSON line: per run ``domain``, ``split``,
``tasks``, the oracle's ``reward`` and ``db`` means, ``pass_hat_1``.., terminations, ``broken_variants``
(episodes), ``broken_by_kind``, ``broken_variants_scored_zero``, ``broken_reward_max``; ``missed``
and ``leaked`` (counts) and the wall time. Writes one JSONL row per episode with ``--out`` (and says
where). Progress goes to stderr: a line every 5 s and one per domain and split (tasks done, the
oracle's wins, the broken variants at 0, the ETA).
Exit status 1 when the oracle misses a task or a broken variant scores above 0; 2 for a bad argument
(an unknown domain, a split the named domain does not ship). Scoring mode: offline, not tau2's
leaderboard scoring where a task's basis holds NL_ASSERTION (the summary names what it leaves out).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxagent.envs.tau2 import DOMAINS, get_domain
from jaxagent.envs.tau2.agents import OracleAgent, ScriptedAgent, broken_plans
from jaxagent.envs.tau2.env import Tau2Env, scripted_customers
from jaxagent.envs.tau2.harness import is_success, pass_hats, summarize, summary_line
from jaxagent.envs.tau2.scoring import JUDGE_FREE
from jaxagent.envs.tau2.table import markdown_table
from jaxagent.envs.tau2.tasks import SPLITS, check_split, load_task_set
from jaxagent.rollout.runner import play

PROGRESS_EVERY_S = 5.0
"""Seconds between progress lines on stderr (and one when a domain's split is done)."""


async def run(domain: str, split: str, data_dir: str | None, k: int) -> tuple[list[dict], list[dict], bool]:
    """The oracle's reports (k per task) and the broken variants' rows of one domain and split, and
    whether the domain defines broken variants."""
    tasks = load_task_set(data_dir, split, domain=domain)
    has_broken = get_domain(domain).broken_plans is not None

    def env():
        return Tau2Env(tasks, customer=scripted_customers(), data_dir=data_dir, domain=domain)

    oracle, broken = [], []
    print(f"[{domain}/{split}] {len(tasks)} tasks: the oracle x k={k}"
          + (" and each task's broken variants" if has_broken else "") + "; a line every "
          f"{PROGRESS_EVERY_S:.0f} s", file=sys.stderr, flush=True)
    start = last = time.perf_counter()
    for i, (tid, task) in enumerate(tasks.items(), 1):
        for seed in range(k):
            oracle.append(await play(env(), OracleAgent(), tid, seed))
        for variant, turns in (broken_plans(task, data_dir) if has_broken else {}).items():
            broken.append(dict(_row(await play(env(), ScriptedAgent(turns), tid)), agent=variant))
        now = time.perf_counter()
        if now - last >= PROGRESS_EVERY_S or i == len(tasks):   # long work is never silent
            last = now
            wins = sum(is_success((r["score"] or {}).get("reward", 0.0)) for r in oracle)
            eta = (now - start) / i * (len(tasks) - i)
            print(f"[{domain}/{split}] {i}/{len(tasks)} tasks: oracle {wins}/{len(oracle)} at reward 1, broken "
                  f"variants {sum(r['reward'] == 0.0 for r in broken)}/{len(broken)} at 0; {now - start:.0f} s, "
                  f"ETA {eta:.0f} s", file=sys.stderr, flush=True)
    return oracle, broken, has_broken


def _row(rep: dict) -> dict:
    s = rep["score"] or {}
    return {"task_id": rep["task_id"], "termination": rep["termination"], "reward": s.get("reward", 0.0),
            "components": s.get("components", {}), "scoring_mode": s.get("scoring_mode"),
            "agent_turns": rep.get("agent_turns")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--domain", default="all", choices=[*DOMAINS, "all"], help="a tau2 domain, or all of them")
    ap.add_argument("--split", default="all", choices=[*SPLITS, "all"], help="a split, or every shipped one")
    ap.add_argument("--k", type=int, default=1, help="oracle runs per task (it is deterministic: pass^k = pass^1)")
    ap.add_argument("--data-dir", default=None, help="the domain's data (default: the packaged copy; one domain only)")
    ap.add_argument("--out", default=None, help="JSONL of every episode")
    args = ap.parse_args(argv)
    if args.k < 1:
        ap.error(f"--k={args.k}: expected an integer >= 1")
    if args.data_dir is not None and args.domain == "all":
        ap.error("--data-dir: one domain's data; expected --domain naming it")
    domains = list(DOMAINS) if args.domain == "all" else [args.domain]
    splits = list(SPLITS) if args.split == "all" else [args.split]
    t0 = time.perf_counter()
    plan = []
    for d in domains:
        for s in splits:
            try:
                check_split(args.data_dir, s, d)
            except FileNotFoundError as e:
                if args.domain != "all" and args.split != "all":
                    print(f"error: {e}", file=sys.stderr)
                    return 2
                print(f"note: {d}/{s} skipped: {e}", file=sys.stderr)
                continue
            plan.append((d, s))
    summaries, results, rows, missed, leaked = [], [], [], [], []
    for d, s in plan:
        oracle, broken, has_broken = asyncio.run(run(d, s, args.data_dir, args.k))
        tasks = load_task_set(args.data_dir, s, domain=d)
        summary = {"domain": d, "split": s, "agent": "oracle", "customer": "scripted",
                   **summarize(oracle, scoring_mode="offline", k=args.k, tasks=tasks)}
        summaries.append(summary)
        rows += [dict(_row(r), agent="oracle", domain=d, split=s) for r in oracle]
        rows += [dict(r, domain=d, split=s) for r in broken]
        missed += [(d, s, r["task_id"]) for r in oracle if not is_success((r["score"] or {}).get("reward", 0.0))]
        # DB must fail too, except in a judge-free domain (telecom), where it is a diagnostic only
        strict_db = d not in JUDGE_FREE
        leaked += [(d, s, r["task_id"], r["agent"]) for r in broken
                   if r["reward"] > 0.0 or (strict_db and r["components"].get("DB", 1.0) != 0.0)]
        print(summary_line(summary))
        kinds = collections.Counter(r["agent"] for r in broken)
        zero = sum(r["reward"] == 0.0 and (not strict_db or r["components"].get("DB") == 0.0) for r in broken)
        print(f"  broken variants: {len(broken)} ({', '.join(f'{v} {n}' for v, n in sorted(kinds.items()))}), "
              f"{zero} scored 0" if has_broken else f"  broken variants: none defined for {d}")
        results.append({"domain": d, "split": s, "tasks": summary["tasks"], "reward": summary["reward"],
                        "db": summary["components"].get("DB"), **{f"pass_hat_{j}": v for j, v in pass_hats(summary).items()},
                        "oracle_terminations": summary["terminations"], "broken_variants": len(broken),
                        "broken_by_kind": dict(kinds), "broken_variants_scored_zero": zero,
                        "broken_reward_max": max((r["reward"] for r in broken), default=0.0),
                        "scoring_note": summary["scoring_note"]})
    if not plan:
        print("error: nothing to evaluate (no shipped split selected)", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"episodes written to {args.out} ({len(rows)} rows)", file=sys.stderr)
    for d, s, t in missed:
        print(f"oracle missed reward 1 on {d}/{s} task {t}", file=sys.stderr)
    for d, s, t, v in leaked:
        print(f"broken variant {v} scored above 0 on {d}/{s} task {t}", file=sys.stderr)
    print()
    print(markdown_table(summaries))
    print()
    print(json.dumps({"runs": results, "missed": len(missed), "leaked": len(leaked),
                      "wall_s": round(time.perf_counter() - t0, 1)}), flush=True)
    where = f"; episodes in {args.out}" if args.out else " (--out FILE keeps every episode)"
    print(f"eval_tau2_oracle: done in {time.perf_counter() - t0:.0f} s; results above (table and JSON on stdout)"
          f"{where}", file=sys.stderr)
    return 1 if missed or leaked else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The tau2 retail oracle and its broken variants on every train task, against the scripted customer.

    python3 scripts/eval_tau2_oracle.py [--data-dir DIR] [--out runs/tau2_oracle.jsonl]

For each task: the oracle agent (the gold actions, each write confirmed by the customer first)
must reach DB reward 1; each broken variant the task admits (a wrong argument, a missing write,
an extra write; `jaxagent.envs.tau2.agents.broken_plans`) must score DB 0. Writes one JSONL
row per episode (task, agent, termination, components, reward) when ``--out`` is given, and ends
with one JSON line: ``tasks``, ``db_reward_mean`` (the oracle's), ``broken_variants`` (episodes),
``broken_variants_scored_zero`` (how many scored DB 0), the oracle's offline reward mean and its
terminations. Exit status 1 when the oracle misses a task or a broken variant scores DB 1.
Scoring mode: offline (DB x COMMUNICATE), not tau2's leaderboard scoring.
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

from jaxagent.envs.tau2.agents import OracleAgent, ScriptedAgent, broken_plans
from jaxagent.rollout.runner import play
from jaxagent.envs.tau2.env import Tau2Env, scripted_customers
from jaxagent.envs.tau2.tasks import load_task_set


async def run(data_dir: str | None) -> list[dict]:
    tasks = load_task_set(data_dir)
    rows = []
    for tid, task in tasks.items():
        env = lambda: Tau2Env(tasks, customer=scripted_customers(), data_dir=data_dir)
        rep = await play(env(), OracleAgent(), tid)
        rows.append(dict(_row(rep), agent="oracle"))
        for variant, turns in broken_plans(task, data_dir).items():
            rep = await play(env(), ScriptedAgent(turns), tid)
            rows.append(dict(_row(rep), agent=variant))
    return rows


def _row(rep: dict) -> dict:
    s = rep["score"]
    return {"task_id": rep["task_id"], "termination": rep["termination"], "reward": s["reward"],
            "components": s["components"], "scoring_mode": s["scoring_mode"], "agent_turns": rep["agent_turns"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=None, help="tau2 retail data (default: the packaged copy)")
    ap.add_argument("--out", default=None, help="JSONL of every episode")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = asyncio.run(run(args.data_dir))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    oracle = [r for r in rows if r["agent"] == "oracle"]
    broken = [r for r in rows if r["agent"] != "oracle"]
    missed = [r["task_id"] for r in oracle if r["components"]["DB"] != 1.0]
    leaked = [(r["task_id"], r["agent"]) for r in broken if r["components"]["DB"] != 0.0]
    for r in missed:
        print(f"oracle missed the gold database on task {r}", file=sys.stderr)
    for t, v in leaked:
        print(f"broken variant {v} scored DB 1 on task {t}", file=sys.stderr)
    summary = {
        "tasks": len(oracle),
        "db_reward_mean": sum(r["components"]["DB"] for r in oracle) / len(oracle),
        "oracle_reward_mean": sum(r["reward"] for r in oracle) / len(oracle),
        "oracle_terminations": dict(collections.Counter(r["termination"] for r in oracle)),
        "broken_variants": len(broken),
        "broken_by_kind": dict(collections.Counter(r["agent"] for r in broken)),
        "broken_variants_scored_zero": sum(r["components"]["DB"] == 0.0 for r in broken),
        "broken_reward_max": max((r["reward"] for r in broken), default=0.0),
        "scoring_mode": "offline (DB x COMMUNICATE; not tau2's DB x NL_ASSERTION)",
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(summary))
    return 1 if missed or leaked else 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""What asynchronous RL buys when the user is slow: sync against ``rl.max_staleness`` = 1 and 2.

The user answers over HTTP: every environment call (the reset, each step) of the quickstart's gym
goes on to a latency proxy on 127.0.0.1 (an aiohttp server in this process) that holds the call
for a time drawn from a log-normal distribution (median ``--latency-median`` s, p95 ``--latency-p95``
s; the draw depends on the task, the episode's seed and the call's number only, so every arm meets
the same latencies) and then answers; the gym's reply is passed back after it. Episodes have
variable length (the gym ends an episode when it is solved, else at ``rollout.max_turns``).

One SFT warm start (the quickstart's, ``--sft-steps``), shared by every run. Then for every seed
and arm (``sync``: the synchronous loop; ``K``: ``rl.max_staleness=K``) one RL run of ``--iters``
iterations of ``--tasks-per-step`` x ``--group-size`` episodes from it (GRPO, the quickstart's RL
settings otherwise), and an evaluation of its final policy on ``--eval-tasks`` held-out tasks at
the training temperature (``--eval-k`` runs each, without the proxy: learning is compared, not the
proxy's speed).

Figures per run: the wall time of the RL run per 1,000 trained episodes (the engine's programs are
compiled by a throwaway run before the first timed one; each run compiles its own update in its
first iteration, every arm alike), the engine's busy share (its device time over that wall),
the staleness and dropped groups, and the bound: the engine's device time plus the credit and
update time against the synchronous wall (what the waits for the user cost; a loop that hid every
wait could not beat ``wall / (engine + update)``).

The last line of stdout is one JSON object with ``speedup_k1_vs_sync`` and ``speedup_k2_vs_sync``
(the synchronous time per 1,000 episodes over the asynchronous one, median over seeds; per seed
beside it), ``paired_success_async_minus_sync`` with ``paired_success_async_minus_sync_ci95`` (K = 1
minus sync, held-out success at the training temperature, paired per (seed, task), BCa 95%), the
same for K = 2, the bound, and per run its figures. Progress goes to stderr.

    python3 scripts/bench_async_rl.py                                   # seeds 0,1,2; sync, 1, 2
    python3 scripts/bench_async_rl.py --seeds 0 --iters 4 --sft-steps 200 --eval-tasks 16   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import math
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from jaxagent.eval.progress import heartbeat  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench_async_rl] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the latency proxy
def lognormal_sigma(median: float, p95: float) -> float:
    """The log-normal's sigma whose median is ``median`` and 95th percentile ``p95``."""
    if not 0 < median < p95:
        raise ValueError(f"latency median={median}, p95={p95}: expected 0 < median < p95")
    return math.log(p95 / median) / 1.6448536269514722


def draw_latency(key: str, median: float, p95: float) -> float:
    """The latency of the call named ``key`` (deterministic in the key: every arm meets the same)."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    z = np.random.default_rng(seed).standard_normal()
    return float(median * math.exp(lognormal_sigma(median, p95) * z))


class LatencyProxy:
    """An aiohttp server on 127.0.0.1 (its own thread and event loop): ``POST /call`` with
    ``{"key": ...}`` answers after `draw_latency` of the key, with the latency it held."""

    def __init__(self, median: float, p95: float):
        self.median, self.p95 = median, p95
        self.calls, self.held_s = 0, 0.0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name="latency-proxy")
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        from aiohttp import web

        async def call(request):
            body = await request.json()
            d = draw_latency(str(body["key"]), self.median, self.p95)
            await asyncio.sleep(d)
            self.calls += 1
            self.held_s += d
            return web.json_response({"latency_s": d})

        async def serve():
            app = web.Application()
            app.router.add_post("/call", call)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/call"
            self._ready.set()
            await asyncio.Event().wait()

        asyncio.run(serve())


class SlowUserEnv:
    """An environment whose every reset and step waits for the latency proxy after the inner
    environment answered (the user's reply goes over HTTP)."""

    def __init__(self, inner, url: str):
        self.inner, self.url = inner, url
        self.session = None
        self.key, self.calls = "", 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def _wait(self) -> None:
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession()
        async with self.session.post(self.url, json={"key": f"{self.key}/{self.calls}"}) as r:
            r.raise_for_status()
            await r.json()
        self.calls += 1

    async def reset(self, task_id: str, seed: int):
        out = await self.inner.reset(task_id, seed)
        self.key, self.calls = f"{task_id}/{seed}", 0
        await self._wait()
        return out

    async def step(self, message):
        out = await self.inner.step(message)
        await self._wait()
        return out

    def outcome_reward(self) -> float:
        return self.inner.outcome_reward()

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.inner.aclose()


class SlowUsers:
    """The run's environment factory with every environment behind the proxy."""

    def __init__(self, inner, url: str):
        self.inner, self.url = inner, url

    def __call__(self):
        return SlowUserEnv(self.inner(), self.url)

    def __getattr__(self, name):
        return getattr(self.inner, name)


# ----------------------------------------------------------------------------- runs
def base_overrides(args) -> list[str]:
    return [f"runs_dir={args.runs_dir}", "progress=false", f"rollout.max_turns={args.max_turns}",
            "rollout.max_tokens=512", "env.train_tasks=4096", "checkpoint.every=0", "eval.every=0",
            f"eval.tasks={args.eval_tasks}", f"eval.sampled_k={args.eval_k}"]


def warm_start(args):
    """The SFT policy (the quickstart's SFT, ``--sft-steps``)."""
    from jaxagent.jobs.build import prepare
    from jaxagent.jobs.config import load_config
    from jaxagent.jobs.phases import run_sft

    cfg = load_config(None, base_overrides(args) + [f"name={args.prefix}_sft", "overwrite=true", "job=sft",
                                                      f"sft.steps={args.sft_steps}"])
    run = prepare(cfg)
    log(f"SFT warm start: {args.sft_steps} steps into {run.run_dir}")
    t0 = time.perf_counter()
    with heartbeat("SFT", log):
        params = run_sft(run, run.params)
    run.log.close()
    log(f"SFT done in {time.perf_counter() - t0:.0f} s")
    return params


def compile_engine(args, params) -> None:
    """A throwaway synchronous run of 2 iterations without the proxy, before any timed run: the
    engine's programs are shared by every run of this process (compiled per shape), so the first
    timed run would otherwise pay for most of the compilations alone. (Each run's update, scoring
    and credit programs are its own: every arm compiles them in its first iteration. Compiling
    every shape the engine can meet, `GenerationEngine.warmup`, takes over 4 minutes at 32 lanes x
    1,024 tokens here; a shape first met in a timed run is compiled there.)"""
    import jax
    import jax.numpy as jnp

    from jaxagent.jobs.build import prepare
    from jaxagent.jobs.config import load_config
    from jaxagent.jobs.phases import run_rl

    cfg = load_config(None, base_overrides(args) + rl_overrides(args, seed=0, k=0) + [
        f"name={args.prefix}_compile", "overwrite=true", "steps=2"])
    run = prepare(cfg)
    log("compiling: a synchronous run of 2 iterations without the proxy")
    t0 = time.perf_counter()
    with heartbeat("compiling", log):
        run_rl(run, jax.tree.map(jnp.copy, params))
    run.log.close()
    log(f"compiled in {time.perf_counter() - t0:.0f} s")


def rl_overrides(args, *, seed: int, k: int) -> list[str]:
    return ["job=rl", f"seed={seed}", f"steps={args.iters}", "rl.credit=grpo", f"rl.tasks_per_step={args.tasks_per_step}",
            f"rl.group_size={args.group_size}", f"rl.minibatch_size={args.tasks_per_step * args.group_size}",
            f"rl.max_staleness={k}", f"rollout.slots={args.slots}"] + args.overrides


def rl_run(args, params, seed: int, arm: str, proxy: LatencyProxy) -> dict[str, Any]:
    """One RL run from ``params`` behind the proxy, then its held-out evaluation without it."""
    import jax
    import jax.numpy as jnp

    from jaxagent.jobs.build import prepare
    from jaxagent.jobs.config import load_config
    from jaxagent.jobs.evaluate import run_eval
    from jaxagent.jobs.phases import run_rl

    k = 0 if arm == "sync" else int(arm)
    name = f"{args.prefix}_s{seed}_{arm}"
    cfg = load_config(None, base_overrides(args) + rl_overrides(args, seed=seed, k=k) + [
        f"name={name}", "overwrite=true"])
    run = prepare(cfg)
    inner = run.make_env
    run.make_env = SlowUsers(inner, proxy.url)
    calls0, held0 = proxy.calls, proxy.held_s
    device0 = run.engine.stats["device_s"]
    log(f"{name}: {args.iters} iterations of {args.tasks_per_step * args.group_size} episodes, users over HTTP")
    t0 = time.perf_counter()
    with heartbeat(name, log):
        final, _ = run_rl(run, jax.tree.map(jnp.copy, params))  # the update donates its state
    wall_all = time.perf_counter() - t0
    device = run.engine.stats["device_s"] - device0
    run.make_env = inner
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = sorted((r for r in rows if r.get("phase") == "rl"), key=lambda r: r["step"])
    episodes = sum(r["episodes"] for r in rl)
    compute = sum(r.get("time/credit_s", 0.0) + r.get("time/update_s", 0.0) for r in rl)
    log(f"{name}: RL {wall_all:.0f} s ({wall_all / max(episodes, 1) * 1000:.0f} s per 1,000 trained episodes); "
        "evaluating without the proxy")
    with heartbeat(f"{name} evaluation", log):
        ev = run_eval(run, final, "after", args.iters)
    run.log.close()
    out = {"name": name, "seed": seed, "arm": arm, "max_staleness": k, "wall_s": wall_all, "episodes": episodes,
           "s_per_1000_episodes": wall_all / max(episodes, 1) * 1000,
           "engine_busy_share": device / max(wall_all, 1e-9), "engine_device_s": device,
           "credit_update_s": compute, "proxy_calls": proxy.calls - calls0, "proxy_held_s": proxy.held_s - held0,
           "train_success": float(np.mean([r["success"] for r in rl])),
           "eval_success": ev.get("sampled/success", ev.get("success")),
           "success_by_task": ev.get("sampled/success_by_task", ev.get("success_by_task")),
           "run_dir": str(run.run_dir)}
    if k:
        out.update({"staleness_mean": float(np.mean([r["async/staleness_mean"] for r in rl])),
                    "staleness_max": int(max(r["async/staleness_max"] for r in rl)),
                    "dropped_groups": int(rl[-1]["async/dropped_total"]),
                    "partial_episodes": int(sum(r["async/partial_episodes"] for r in rl)),
                    "update_wait_share": float(np.mean([r["async/update_wait_share"] for r in rl]))})
    return out


def paired(runs: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    """Held-out success of ``arm`` minus sync, paired per (seed, task), with a BCa 95% interval."""
    from jaxagent.eval.stats import paired_bca

    a, b = [], []
    for s in sorted({r["seed"] for r in runs}):
        x = next((r for r in runs if r["seed"] == s and r["arm"] == arm), None)
        y = next((r for r in runs if r["seed"] == s and r["arm"] == "sync"), None)
        if x is None or y is None or not x["success_by_task"]:
            continue
        for task, v in x["success_by_task"].items():
            if task in y["success_by_task"]:
                a.append(float(v))
                b.append(float(y["success_by_task"][task]))
    if len(a) < 2:
        return {"mean": None, "ci95": None, "pairs": len(a)}
    if np.all(np.asarray(a) - np.asarray(b) == (a[0] - b[0])):  # a constant difference: no interval to draw
        return {"mean": a[0] - b[0], "ci95": [a[0] - b[0], a[0] - b[0]], "pairs": len(a)}
    mean, lo, hi = paired_bca(a, b, rng=np.random.default_rng(0))
    return {"mean": mean, "ci95": [lo, hi], "pairs": len(a)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2", help="RL seeds (comma-separated)")
    ap.add_argument("--arms", default="sync,1,2", help="sync and/or rl.max_staleness values (comma-separated)")
    ap.add_argument("--iters", type=int, default=8, help="RL iterations per run")
    ap.add_argument("--tasks-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--slots", type=int, default=32, help="rollout.slots (engine lanes)")
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--sft-steps", type=int, default=1000)
    ap.add_argument("--eval-tasks", type=int, default=64)
    ap.add_argument("--eval-k", type=int, default=2, help="evaluation runs per task at the training temperature")
    ap.add_argument("--latency-median", type=float, default=0.5, help="seconds")
    ap.add_argument("--latency-p95", type=float, default=2.0, help="seconds")
    ap.add_argument("--runs-dir", default="runs", help="where the runs go")
    ap.add_argument("--prefix", default="async_bench")
    ap.add_argument("--out", default=None, help="also write the final JSON here")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for the RL runs")
    args = ap.parse_args(argv)
    lognormal_sigma(args.latency_median, args.latency_p95)
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = args.arms.split(",")
    for a in arms:
        if a != "sync" and not (a.isdigit() and int(a) >= 1):
            ap.error(f"--arms: {a!r}: expected sync or an integer >= 1")
    n = len(seeds) * len(arms)
    log(f"start: SFT warm start ({args.sft_steps} steps), then {n} RL runs ({len(seeds)} seeds x arms {arms}) of "
        f"{args.iters} x {args.tasks_per_step * args.group_size} episodes; users over HTTP, latency median "
        f"{args.latency_median} s, p95 {args.latency_p95} s")
    t0 = time.perf_counter()
    proxy = LatencyProxy(args.latency_median, args.latency_p95)
    params = warm_start(args)
    compile_engine(args, params)
    runs = []
    for seed in seeds:
        for arm in arms:
            runs.append(rl_run(args, params, seed, arm, proxy))
            log(f"{len(runs)}/{n} runs done ({time.perf_counter() - t0:.0f} s): {runs[-1]['name']} "
                f"{runs[-1]['s_per_1000_episodes']:.0f} s per 1,000 episodes, held-out success "
                f"{runs[-1]['eval_success']}")
    out: dict[str, Any] = {"bench": "async_rl", "date": datetime.date.today().isoformat(),
                           "machine": f"{platform.machine()} {platform.system()}, {__import__('os').cpu_count()} cores",
                           "latency_median_s": args.latency_median, "latency_p95_s": args.latency_p95,
                           "seeds": seeds, "arms": arms, "iters": args.iters,
                           "episodes_per_iter": args.tasks_per_step * args.group_size}
    sync = {r["seed"]: r for r in runs if r["arm"] == "sync"}
    if sync:
        bounds = [r["wall_s"] / max(r["engine_device_s"] + r["credit_update_s"], 1e-9) for r in sync.values()]
        out["bound_speedup_sync"] = float(np.median(bounds))
        out["engine_busy_share_sync"] = float(np.median([r["engine_busy_share"] for r in sync.values()]))
    for arm in arms:
        if arm == "sync" or not sync:
            continue
        ratios = [sync[r["seed"]]["s_per_1000_episodes"] / r["s_per_1000_episodes"]
                  for r in runs if r["arm"] == arm and r["seed"] in sync]
        out[f"speedup_k{arm}_vs_sync"] = float(np.median(ratios)) if ratios else None
        out[f"speedup_k{arm}_vs_sync_per_seed"] = ratios
        p = paired(runs, arm)
        suffix = "" if arm == "1" else f"_k{arm}"
        out[f"paired_success_async_minus_sync{suffix}"] = p["mean"]
        out[f"paired_success_async_minus_sync{suffix}_ci95"] = p["ci95"]
        out[f"paired_success_async_minus_sync{suffix}_pairs"] = p["pairs"]
    out["runs"] = [{k: v for k, v in r.items() if k != "success_by_task"} for r in runs]
    out["wall_s"] = time.perf_counter() - t0
    line = json.dumps(out)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line, flush=True)
    log(f"done in {out['wall_s']:.0f} s: runs in {args.runs_dir}/{args.prefix}_*" +
        (f", the JSON also in {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

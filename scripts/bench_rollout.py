#!/usr/bin/env python3
"""Rollout throughput: our in-flight loop against a lockstep loop on the same episodes.

A local OpenAI-compatible user simulator (an HTTP server on 127.0.0.1 started here) answers
every call after ``--user-delay`` seconds. The same episodes (``--tasks`` x ``--group`` episodes,
``--turns`` user replies each) are run twice with the same model:

- **ours**: `run_episodes` through the `GenerationEngine` (``--slots`` decode slots, requests
  admitted as they arrive, prefix reuse across turns);
- **lockstep**: episodes in batches of ``--slots`` (the same device batch): every episode of a
  batch takes its turn together (one batched generation from a fresh cache, full prefill, the
  whole turn in one jitted ``while_loop``; prompt lengths and cache sizes bucketed to powers of
  two and every bucket compiled before the clock starts), then every user answers
  (concurrently), turn by turn; then the next batch.

The simulator client allows one request in flight per episode by default
(``--user-concurrency``): with fewer, the simulator's throughput (connections / delay) can bound
the run rather than the loop. Reports episodes/s of each and their ratio, the fraction of our wall
time the device was busy, and of the engine's span (its first call's start to its last call's end:
before it the first prompts are made, after it only the last users' answers are awaited), the
most a loop with no host time at all could read with the same engine calls
(``device_busy_bound``: device time / (device time + one user delay), since every episode ends
with its user's answer to its last turn), prefill tokens with prefix reuse against without (the
whole prompt every turn), and, for both
loops, the episodes that failed and the simulator's HTTP attempts, retries and failed attempts by
cause (``--fault-rate`` makes the server fail that share of calls with a 500; those are retried,
and an episode fails when its retries run out: in the lockstep loop it stops there, counted as
``lockstep_failed_episodes``). The last line of stdout is one JSON object.

    python3 scripts/bench_rollout.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import jaxagent  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT))

import jax
import numpy as np

from jaxagent.envs.base import AgentMessage
from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig
from jaxagent.envs.user_env import LLMUserEnv
from jaxagent.models import init_params, preset, preset_names
from jaxagent.models.generate import SamplingParams, init_cache, jit_extend, jit_generate, row_keys
from jaxagent.rollout import EpisodeConfig, GenerationEngine, run_episodes
from jaxagent.rollout import engine as engine_module
from jaxagent.rollout.loop import turn_key_data
from jaxagent.text import ChatRenderer, load_tokenizer
from jaxagent.text.toolcalls import parse_assistant

REPLIES = ["tell me more", "yes please", "no , the red one", "at noon", "ok"]
LABELS = ["provide_info", "confirm", "correct", "provide_info", "accept"]


def serve(delay: float, fault_rate: float, seed: int = 0):
    rng = random.Random(seed)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers: no stale pooled connections

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(delay)
            with lock:
                fail = rng.random() < fault_rate
                i = rng.randrange(len(REPLIES))
            if fail:
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            content = json.dumps({"utterance": REPLIES[i], "strategy": LABELS[i]})
            body = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    ThreadingHTTPServer.request_queue_size = 256  # many concurrent episodes: no refused connections
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _serve_in_child(ports, delay: float, fault_rate: float) -> None:
    server = serve(delay, fault_rate)
    ports.put(server.server_address[1])
    threading.Event().wait()  # until the parent terminates this process


def start_simulator(delay: float, fault_rate: float, where: str) -> tuple[int, object]:
    """The simulator's port, and its process (``where="process"``: a process of its own, as a
    remote simulator is; its HTTP handling then takes no time from the loop's process) or its
    in-process server (``"thread"``)."""
    if where == "thread":
        server = serve(delay, fault_rate)
        return server.server_address[1], server
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ports = ctx.Queue()
    proc = ctx.Process(target=_serve_in_child, args=(ports, delay, fault_rate), daemon=True)
    proc.start()
    return ports.get(timeout=120), proc


class TimedEngine(GenerationEngine):
    """Stamps the start of its first call and the end of its last one: the span in which the
    device could be kept busy (before it, the first prompts are being made; after it, the last
    users are answering and nothing is left to generate); and times what the engine does between
    its calls: the settle (event-loop turns given to sessions on their way back, in which their
    host work runs) and its own bookkeeping (dropping cancelled requests, releases, admission)."""

    first_call: float | None = None
    last_call_end: float | None = None

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.between = {"settle_s": 0.0, "bookkeeping_s": 0.0}

    async def _settle(self):
        t = time.perf_counter()
        await super()._settle()
        self.between["settle_s"] += time.perf_counter() - t

    def _timed(self, method):
        t = time.perf_counter()
        try:
            return method()
        finally:
            self.between["bookkeeping_s"] += time.perf_counter() - t

    def _drop_cancelled(self):
        return self._timed(super()._drop_cancelled)

    def _apply_releases(self):
        return self._timed(super()._apply_releases)

    def _admit(self):
        return self._timed(super()._admit)

    def _step(self, admitted):
        if self.first_call is None:
            self.first_call = time.perf_counter()
        try:
            return super()._step(admitted)
        finally:
            self.last_call_end = time.perf_counter()


def log(msg: str) -> None:
    """Progress on stderr (stdout holds only the JSON line)."""
    print(f"bench_rollout: {msg}", file=sys.stderr, flush=True)


def heartbeat(what: str, every_s: float = 10.0):
    """A line on stderr every ``every_s`` seconds while ``what`` runs (`jaxagent.eval.progress.heartbeat`)."""
    from jaxagent.eval.progress import heartbeat as beat

    return beat(what, log, every_s)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="tiny-qwen2", choices=preset_names())
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--slots", type=int, default=8, help="decode slots (ours) = batch size (lockstep)")
    ap.add_argument("--park-rows", type=int, default=None,
                    help="cache rows that keep waiting sessions' prefixes (default: one per episode)")
    ap.add_argument("--decode-steps", type=int, default=8, help="decode steps per engine call (ours)")
    ap.add_argument("--capacity", type=int, default=1024, help="KV-cache positions per row")
    ap.add_argument("--no-reuse", action="store_true", help="ours without parking (sessions > slots lose prefixes)")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--user-delay", type=float, default=0.2)
    ap.add_argument("--fault-rate", type=float, default=0.0)
    ap.add_argument("--user-concurrency", type=int, default=None,
                    help="the simulator client's max_concurrency (default: one request in flight per episode)")
    ap.add_argument("--simulator", choices=("process", "thread"), default="process",
                    help="where the user simulator's HTTP server runs: its own process (as a remote simulator), or "
                         "a thread of this one (its request handling then competes with the loop for the GIL)")
    ap.add_argument("--settle-turns", type=int, default=None,
                    help="an experiment: the event-loop turns the engine gives sessions on their way back after "
                         "each call (default: the engine's own, 16; 0 turns the settle off)")
    ap.add_argument("--no-lockstep", action="store_true", help="run ours only (the lockstep keys are null)")
    ap.add_argument("--tokenizer", default=str(ROOT / "tests" / "fixtures" / "tokenizer_qwen"))
    args = ap.parse_args(argv)
    if args.settle_turns is not None:
        engine_module._SETTLE_TURNS = args.settle_turns
    t_start = time.perf_counter()
    log(f"{args.tasks} tasks x {args.group} episodes x {args.turns} turns, {args.shape}, {args.slots} slots, user "
        f"delay {args.user_delay} s; ours" + ("" if args.no_lockstep else ", then the lockstep loop")
        + " (each compiles first)")

    tok = load_tokenizer(args.tokenizer)
    cfg = preset(args.shape, vocab_size=tok.vocab_size, max_position_embeddings=max(2048, args.capacity))
    params = jax.jit(init_params, static_argnums=1)(jax.random.key(0), cfg)
    port, simulator = start_simulator(args.user_delay, args.fault_rate, args.simulator)
    url = f"http://127.0.0.1:{port}"
    user_cfg = LLMUserConfig(base_url=url, model="sim", max_retries=2, backoff_base_s=0.05, backoff_max_s=0.2,
                             read_timeout_s=10.0,
                             max_concurrency=args.user_concurrency or args.tasks * args.group)
    tasks = {f"task{i}": {"profile": {"instructions": f"you want trip {i}"}, "opening": "i need a trip"}
             for i in range(args.tasks)}
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, stop_tokens=tuple(tok.eos_token_ids))
    # the loop's per-call timeout covers the client's own retries (jaxagent.jobs.config.check_timeout)
    ep_cfg = EpisodeConfig(max_turns=args.turns, max_tokens=args.capacity, retries=1,
                           timeout_s=user_cfg.call_budget_s() + 30.0)
    n_episodes = args.tasks * args.group
    park_rows = 0 if args.no_reuse else (n_episodes if args.park_rows is None else args.park_rows)
    stop_ids = np.full((args.slots, max(1, len(sp.stop_tokens))), -1, np.int32)
    stop_ids[:, : len(sp.stop_tokens)] = sp.stop_tokens
    gen = jit_generate(cfg, sp.max_new_tokens)
    ext = jit_extend(cfg)

    def bucket(n: int) -> int:
        return max(16, 1 << max(0, n - 1).bit_length())

    def lockstep_generate(prompts, key):
        """One batched turn from a fresh cache: prompts padded to a power-of-two length."""
        B = args.slots  # a fixed batch: short last batches are padded with a dummy row
        T = bucket(max(len(p) for p in prompts))
        toks = np.zeros((B, T), np.int32)
        lengths = np.ones(B, np.int32)
        for i, p in enumerate(prompts):
            toks[i, : len(p)], lengths[i] = p, len(p)
        cache = init_cache(cfg, B, T + sp.max_new_tokens)
        logits, cache = ext(params, cache, toks, lengths)
        return gen(params, cache, logits, row_keys(key, B), temperature_B=np.full(B, sp.temperature, np.float32),
                   top_k_B=np.full(B, sp.top_k, np.int32), top_p_B=np.full(B, sp.top_p, np.float32),
                   stop_tokens_BS=stop_ids)

    async def ours():
        client = LLMUserClient(user_cfg)
        engine = TimedEngine(params, cfg, slots=args.slots, capacity=args.capacity, park_rows=park_rows,
                                  decode_steps=args.decode_steps)
        make = lambda: LLMUserEnv(client, tasks, max_user_turns=args.turns)  # noqa: E731
        log("ours: compiling the engine's shapes")
        with heartbeat("ours: compiling"):
            engine.warmup()  # every shape compiled before the clock starts
        turn_key_data(jax.random.key(1), range(n_episodes), args.turns)  # as is the episodes' key derivation
        log(f"ours: {n_episodes} episodes (timed)")
        t0 = time.perf_counter()
        trajs = await run_episodes(engine, make, tok, list(tasks), group_size=args.group, sampling=sp,
                                   key=jax.random.key(1), config=ep_cfg)
        wall = time.perf_counter() - t0
        log(f"ours: {n_episodes / wall:.1f} episodes/s ({wall:.1f} s)")
        await client.aclose()
        span = {"head_s": engine.first_call - t0, "span_s": engine.last_call_end - engine.first_call,
                "tail_s": t0 + wall - engine.last_call_end}
        span.update(engine.between)
        return trajs, wall, dict(engine.stats), client.stats.as_dict(), span

    async def lockstep_chunk(client, chunk, turn_key, failures):
        envs, chats = [], []
        for task in chunk:
            env = LLMUserEnv(client, tasks, max_user_turns=args.turns)
            reset = await env.reset(task, 0)
            chat = ChatRenderer(tok)
            chat.add(*[m.to_chat() for m in reset.messages])
            envs.append(env)
            chats.append(chat)
        alive = list(range(len(chats)))
        prefill = 0
        for turn in range(args.turns):
            prompts = [chats[i].start_generation() for i in alive]
            prefill += sum(len(p) for p in prompts)
            out = lockstep_generate(prompts, jax.random.fold_in(turn_key, turn))
            msgs = []
            for row, i in enumerate(alive):
                n = int(out.num_tokens[row])
                ids = np.asarray(out.tokens[row, :n]).tolist()
                chats[i].append_generated(ids)
                text = tok.decode([x for x in ids if x not in sp.stop_tokens])
                msgs.append(AgentMessage(parse_assistant(text).content))

            async def answer(i, m):
                try:
                    return await envs[i].step(m)
                except Exception as e:  # noqa: BLE001 - counted: the episode ends here as a failure
                    failures["errors"] += 1
                    failures["last_error"] = f"{type(e).__name__}: {e}"[:300]
                    return None

            steps = await asyncio.gather(*(answer(i, m) for i, m in zip(alive, msgs)))
            nxt = []
            for i, st in zip(alive, steps):
                if st is None:
                    failures["episodes"] += 1
                    continue
                if st.done:
                    continue
                chats[i].add(*[m.to_chat() for m in st.messages])
                nxt.append(i)
            alive = nxt
            if not alive:
                break
        return prefill

    async def lockstep():
        """Episodes in batches of --slots (the same device batch as ours): every episode of a
        batch takes its turn together, then every user answers, turn by turn."""
        client = LLMUserClient(user_cfg)
        episodes = [task for task in tasks for _ in range(args.group)]
        log("lockstep: compiling every prompt-length bucket")
        with heartbeat("lockstep: compiling"):
            for T in (16, 32, 64, 128, 256, 512, 1024):  # compile every bucket before the clock starts
                if T + sp.max_new_tokens <= args.capacity:
                    lockstep_generate([[1] * T], jax.random.key(0)).tokens.block_until_ready()
        prefill = 0
        failures = {"episodes": 0, "errors": 0, "last_error": None}
        log(f"lockstep: {len(episodes)} episodes in batches of {args.slots} (timed)")
        t0 = time.perf_counter()
        for c in range(0, len(episodes), args.slots):
            prefill += await lockstep_chunk(client, episodes[c : c + args.slots],
                                            jax.random.fold_in(jax.random.key(1), c), failures)
        wall = time.perf_counter() - t0
        log(f"lockstep: {len(episodes) / wall:.1f} episodes/s ({wall:.1f} s)")
        await client.aclose()
        return wall, prefill, failures, client.stats.as_dict()

    trajs, wall_ours, stats, sim_ours, span = asyncio.run(ours())
    if args.no_lockstep:
        wall_lock, prefill_lock, lock_failures = None, None, {"episodes": None, "errors": None, "last_error": None}
        sim_lock = {"attempts": None, "retries": None, "failures": None}
    else:
        wall_lock, prefill_lock, lock_failures, sim_lock = asyncio.run(lockstep())
    if args.simulator == "thread":
        simulator.shutdown()
    else:
        simulator.terminate()
    without_reuse = sum(s.content_start for t in trajs for s in t.spans if s.generated)
    failed = sum(t.termination == "simulator_failure" for t in trajs)
    res = {
        "bench": "rollout",
        "device": f"{jax.default_backend()}:{jax.devices()[0].device_kind}",
        "shape": args.shape,
        "episodes": n_episodes,
        "turns": args.turns,
        "slots": args.slots,
        "user_delay_s": args.user_delay,
        "fault_rate": args.fault_rate, "simulator": args.simulator,
        "episodes_per_s": n_episodes / wall_ours,
        "lockstep_episodes_per_s": n_episodes / wall_lock if wall_lock else None,
        "speedup_vs_lockstep": wall_lock / wall_ours if wall_lock else None,
        "device_busy_fraction": stats["device_s"] / wall_ours,
        # the same over the engine's span: from its first call's start to its last call's end
        "device_busy_in_span": stats["device_s"] / span["span_s"],
        "engine_span_s": span["span_s"], "head_s": span["head_s"], "tail_s": span["tail_s"],
        # the most any loop could read with these engine calls: every episode ends with its user's
        # answer to its last turn, so at least one user delay follows the last generation
        "device_busy_bound": stats["device_s"] / (stats["device_s"] + args.user_delay),
        # between the engine's calls: the settle (sessions' host work runs in its turns) and its bookkeeping
        "settle_s": span["settle_s"], "bookkeeping_s": span["bookkeeping_s"],
        "settle_turns_setting": engine_module._SETTLE_TURNS,
        "user_concurrency": user_cfg.max_concurrency,
        "prefill_tokens_with_reuse": stats["prefill_tokens"],
        "prefill_tokens_without_reuse": without_reuse,
        "prefill_tokens_ratio_with_reuse": stats["prefill_tokens"] / max(without_reuse, 1),
        "lockstep_prefill_tokens": prefill_lock,
        "failed_episodes_counted": int(failed),
        "simulator_errors_counted": int(sum(t.info["simulator_errors"] for t in trajs)),
        "simulator_retries_counted": int(sum(t.info["simulator_retries"] for t in trajs)),
        "simulator_attempts": sim_ours["attempts"],
        "simulator_failed_attempts": sim_ours["failures"],
        "lockstep_failed_episodes": lock_failures["episodes"],
        "lockstep_simulator_errors": lock_failures["errors"],
        "lockstep_simulator_attempts": sim_lock["attempts"],
        "lockstep_simulator_retries": sim_lock["retries"],
        "lockstep_simulator_failed_attempts": sim_lock["failures"],
        "lockstep_last_error": lock_failures["last_error"],
        "decode_steps": stats["decode_steps"],
        "engine_calls": stats["engine_calls"],
        "park_rows": park_rows,
        "parked": stats["parked"],
        "restored": stats["restored"],
        "decode_steps_per_call": args.decode_steps,
        "jax_version": jax.__version__,
    }
    print(json.dumps(res), flush=True)
    log(f"done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record them in "
        "docs/BENCHMARKS.md")
    return res


if __name__ == "__main__":
    main()

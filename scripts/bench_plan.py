"""Validates ``--plan`` (`jaxagent.jobs.memplan`) against measured memory on this CPU.

For each small preset: plans the RL update (its compiled memory analysis: arguments + transient =
state + batch + temp), then runs that same update once in a fresh process on real arrays and
measures its peak RSS (VmHWM), minus the peak RSS of a process that imported JAX, started its CPU
backend and loaded nothing else. Two measured figures per preset:

- ``measured_bytes``: peak RSS of the run minus the bare process's (as the issue asks: this
  includes the XLA compiler's own memory while compiling the step, which the plan does not model);
- ``measured_runtime_bytes``: the peak RSS reached while executing, above the RSS just before the
  state was allocated (after compiling; ``/proc/self/clear_refs`` resets the peak): the memory the
  plan describes.

The plan is made in a fresh process too (`plan_memory` measures the host memory planning grew that
process by, ``host_bytes``: the tokenizer, traced programs, compiler heap and executables), and
gives two figures:

- ``planned_bytes``: the update's arguments + transient (XLA's memory analysis): the device memory,
  compared with ``measured_runtime_bytes``;
- ``planned_cpu_run_bytes``: that + ``host_bytes``: what a CPU run reaches above a bare JAX
  process, compared with ``measured_bytes`` (the issue's figure).

Prints one JSON line per preset and a final one with the ratios for each.

    python scripts/bench_plan.py                # tiny-qwen2 (the quickstart's) and small-qwen2
    python scripts/bench_plan.py --presets tiny-qwen2 --capacity 512
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def overrides(preset: str, capacity: int, rows: int, micro: int) -> list[str]:
    return [f"model.preset={preset}", "mesh.fsdp=1", f"rollout.capacity={capacity}", f"rl.minibatch_size={rows}",
            f"rl.microbatches={micro}"]


def child_bare() -> dict:
    import jax
    import jax.numpy as jnp

    jnp.zeros(1).block_until_ready()
    return {"peak": _status("VmHWM"), "devices": len(jax.devices())}


def child_run(ov: list[str]) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxagent.jobs.config import load_config
    from jaxagent.jobs.build import planning_model_config
    from jaxagent.jobs.plan_programs import compile_program
    from jaxagent.models import LogicalRules, make_mesh
    from jaxagent.models.qwen import init_params, param_logical_axes
    from jaxagent.train.step import TrainState, make_optimizer

    cfg = load_config(None, ov)
    qcfg = planning_model_config(cfg)[0]
    import dataclasses

    qcfg = dataclasses.replace(qcfg, remat=cfg.model.remat, attn_impl=cfg.model.attn_impl)
    rules = LogicalRules(make_mesh(dataclasses.replace(cfg.mesh, fsdp=1), jax.devices()[:1]))
    abstract = jax.eval_shape(lambda k: init_params(k, qcfg), jax.random.key(0))
    axes = param_logical_axes(qcfg)
    p_shard = jax.tree.map(lambda ax, x: rules.sharding(ax, x.shape), axes, abstract,
                           is_leaf=lambda x: isinstance(x, tuple))
    p_abs = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, p_shard)
    rows, L = cfg.rl.minibatch_size, cfg.rollout.capacity
    compiled = compile_program("update", cfg, qcfg, rules, p_abs, rows=rows, L=L, park=0, micro=cfg.rl.microbatches,
                               trained=abstract)
    import gc

    gc.collect()
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    tx = make_optimizer(cfg.optim)
    params = jax.jit(lambda k: init_params(k, qcfg), out_shardings=p_shard)(jax.random.key(0))
    state = jax.jit(lambda p: TrainState.create(p, tx))(params)
    del params
    rng = np.random.default_rng(0)
    batch = {"tokens": jnp.asarray(rng.integers(0, qcfg.vocab_size, (rows, L)), jnp.int32),
             "loss_mask": jnp.ones((rows, L), jnp.float32), "advantages": jnp.ones((rows, L), jnp.float32),
             "old_logp": jnp.full((rows, L), -1.0, jnp.float32)}
    if cfg.ppo.kl_coef > 0:
        batch["ref_logp"] = jnp.full((rows, L), -1.0, jnp.float32)
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    return {"peak": _status("VmHWM"), "runtime_peak_above": _status("VmHWM") - before,
            "finite": float(metrics["finite"])}


def child_plan(ov: list[str]) -> dict:
    from jaxagent.jobs.config import load_config
    from jaxagent.jobs.memplan import plan_memory

    plan = plan_memory(load_config(None, ov), programs=("update",))
    m = plan["programs"]["update"]
    return {**{k: m[k] for k in ("argument", "transient", "temp", "host_compile_bytes")}, "host_bytes": plan["host_bytes"]}


def run_child(kind: str, ov: list[str]) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, __file__, "--child", kind, *ov], capture_output=True, text=True, env=env,
                         cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tiny-qwen2", "small-qwen2"])
    ap.add_argument("--capacity", type=int, default=1024, help="sequence length of the update (rollout.capacity)")
    ap.add_argument("--rows", type=int, default=32, help="rl.minibatch_size (the quickstart's)")
    ap.add_argument("--microbatches", type=int, default=2, help="rl.microbatches (the quickstart's)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *ov = args.child
        print(json.dumps({"bare": child_bare, "plan": child_plan, "run": child_run}[kind](*([ov] if ov else []))))
        return
    bare = run_child("bare", [])
    results = {}
    for preset in args.presets:
        ov = overrides(preset, args.capacity, args.rows, args.microbatches)
        print(f"# {preset}: planning the update in a fresh process", file=sys.stderr, flush=True)
        m = run_child("plan", ov)
        planned = m["argument"] + m["transient"]  # the state and the batch, plus what the call adds
        print(f"# {preset}: running it once", file=sys.stderr, flush=True)
        run = run_child("run", ov)
        measured = run["peak"] - bare["peak"]
        host = m["host_bytes"]
        row = {"preset": preset, "capacity": args.capacity, "rows": args.rows, "microbatches": args.microbatches,
               "planned_bytes": planned, "plan_temp_bytes": m["temp"], "plan_host_bytes": host, "plan_host_compile_bytes": m["host_compile_bytes"],
               "planned_cpu_run_bytes": None if host is None else planned + host, "bare_jax_peak_rss": bare["peak"],
               "run_peak_rss": run["peak"], "measured_bytes": measured,
               "measured_runtime_bytes": run["runtime_peak_above"],
               "ratio_plan_over_measured_runtime": round(planned / run["runtime_peak_above"], 3),
               "ratio_cpu_run_plan_over_measured": None if host is None else round((planned + host) / measured, 3),
               "ratio_device_plan_over_measured": round(planned / measured, 3),
               "update_finite": run["finite"]}
        results[preset] = row
        print(json.dumps(row), flush=True)
    final = {"bench": "plan", "machine": f"{os.cpu_count()}-core CPU"}
    for key in ("ratio_cpu_run_plan_over_measured", "ratio_plan_over_measured_runtime",
                "ratio_device_plan_over_measured"):
        final.update({f"{key}_{p}": r[key] for p, r in results.items()})
    print(json.dumps(final))
    print("# results: the JSON lines above; recorded in docs/PODS.md, 'Validation against measured memory'",
          file=sys.stderr)


if __name__ == "__main__":
    main()

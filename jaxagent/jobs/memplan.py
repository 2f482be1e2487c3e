"""``python -m jaxagent.launch --config FILE --plan``: will the job fit? A memory plan before launch.

For a run config (the paper-scale ones included) this lowers and compiles, with abstract shapes
(`jax.ShapeDtypeStruct` carrying `NamedSharding`s on the configured mesh), the jitted programs the
job runs, and reads XLA's memory analysis of each (`jax.stages.Compiled.memory_analysis`:
argument, output, alias and temp bytes, per device of the partitioned program):

- ``update``: the RL update (`jaxagent.train.step.make_update` of `ppo_loss_fn`, or `sft_loss_fn`
  for job=sft) at ``rl.minibatch_size`` rows x ``rollout.capacity`` tokens, ``rl.microbatches``
  microbatches scanned (the rows and microbatches the trainer builds it with);
- ``prefill`` / ``decode``: the engine's `_prefill` (all ``rollout.slots`` rows admitted at once,
  a ``rollout.capacity``-token chunk: the worst call) and `_decode` (``rollout.decode_steps`` steps
  of every slot over the whole window);
- ``scorer``: teacher-forced scoring without gradient (`sequence_scores`, ``rl.score_rows`` rows at
  a time) at ``rl.minibatch_size`` rows x capacity: what the reference log-probs run;
- ``infogain`` (a credit term of ``rl.credit`` needs ``r_info``, e.g. ``infopo``): InfoPO's
  info-gain program itself, the jitted call `jaxagent.train.infogain.compute_infogain` makes
  (``infopo.mode``: the shared-prefix pass, or the vmapped one), at the iteration's episodes x
  capacity x ``rollout.max_turns`` and, for the shared-prefix pass, the worst packed length
  (`jaxagent.jobs.plan_programs.infogain_shapes`: 2 x capacity + turns x placeholder tokens).
  ``infopo.prior=marginal`` scores the enumerated replies with the scorer's program (planned as
  ``scorer``); ``infopo.mode=naive`` is planned as ``vmapped`` (the same histories, a call each).

Besides the compiled programs, the terms are also computed analytically (per device, from the
parameter shapes and their shardings): parameters, optimizer state (AdamW: two fp32 moments of each
trained parameter, the LoRA adapter alone with ``model.lora``), gradients (fp32 accumulators, one
more with ``rl.microbatches >= 2`` for the halves' cosine), and the engine's resident buffers: its
KV cache (layers x 2 x slots x capacity x kv_heads x head_dim x dtype bytes), its park cache
(``rollout.park_rows`` (+1) rows of the same capacity, default group_size x tasks_per_step) and its
pending logits (slots x vocab x 4). With ``rollout.cache_sharding=replicated`` (the default) each
device holds all of the caches; with ``heads`` each holds kv_heads / devices of every row
(`jaxagent.rollout.engine.engine_cache_sharding`; planned so when the device count divides the KV
heads, else replicated with a note, as the run would refuse it).

The job's peak per device is the resident set (parameters + optimizer state + engine caches, alive
all run long) plus the largest transient of one program (XLA's temp bytes + outputs not aliased to
a donated input). A device kind ``fits`` when that peak times (1 + margin) is within its memory
(margin 10% by default: runtime, allocator fragmentation, the framework's own buffers).

Caveats, printed with the plan:
- Where the shapes come from (`jaxagent.jobs.build.planning_model_config`): the checkpoint's
  config.json, or the preset when ``model.path`` is not downloaded yet.
- The programs are compiled on this host's CPU backend (fake devices: ``XLA_FLAGS=
  --xla_force_host_platform_device_count=N``, which the launcher sets before the backend starts;
  set it yourself when calling `plan_memory` from Python). A CPU compile's buffer assignment,
  fusion and rematerialisation differ from a GPU's or a TPU's: temp bytes are an estimate of the
  accelerator's, not its measurement.
- Attention that cannot lower on a CPU (``cudnn``, ``splash``) is planned with ``blockwise``
  (the memory-efficient XLA implementation, closest in memory to a flash kernel), and the plan says so.
- With fewer host devices than the mesh needs, nothing is compiled: the analytic terms alone.

Host memory: XLA's analysis describes the device buffers, not what the process itself holds: the
tokenizer and model config it reads, the traced programs, the compiler's heap (kept by the
allocator after compiling) and the executables. The plan measures that as it goes (Linux): the
growth of this process's RSS from the call to the end of the last compile, executables alive,
``host_bytes`` (and each program's compile, ``host_compile_bytes``). On an accelerator that is
host RAM; on a CPU backend it is the same memory as the buffers, so ``cpu_run_peak`` (peak +
host_bytes) is what a CPU run reaches above a process that only imported JAX
(`scripts/bench_plan.py` checks both figures against a run). It is measured, not predicted, and in
the planning process: one that read or compiled before reuses freed heap, so plan in a fresh one.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from typing import Any

from jaxagent.jobs.plan_programs import compile_program, infogain_shapes, match_shardings, row_split_notes

#: Named device kinds and their memory (bytes, nominal GB as 1e9: conservative against GiB).
DEVICE_KINDS: dict[str, int] = {"A800/H100 80GB": 80 * 10**9, "H200 141GB": 141 * 10**9, "TPU v4 32GB": 32 * 10**9,
                                "TPU v5e 16GB": 16 * 10**9, "TPU v5p 95GB": 95 * 10**9}
MARGIN = 0.10
GB = 1e9


def _gb(n: float) -> float:
    return round(n / GB, 3)


def planning_devices(cfg) -> int:
    """The device count the config's mesh asks for (an axis of -1 counts as 1)."""
    return math.prod(d for d in (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor) if d != -1)


def _per_device_bytes(leaf, sharding) -> int:
    """Bytes one device holds of an array of ``leaf``'s shape/dtype laid out by ``sharding``."""
    n = int(math.prod(leaf.shape)) * leaf.dtype.itemsize
    mesh = sharding.mesh
    for entry in sharding.spec:
        for a in (entry,) if isinstance(entry, str) else (entry or ()):
            n //= mesh.shape[a]
    return n


def _tree_bytes(tree, shardings) -> int:
    import jax

    return sum(_per_device_bytes(x, s) for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))


def kv_cache_bytes(qcfg, rows: int, capacity: int) -> int:
    """K and V of ``rows`` rows: layers x 2 x rows x capacity x kv_heads x head_dim x dtype bytes."""
    import numpy as np

    return (qcfg.num_hidden_layers * 2 * rows * capacity * qcfg.num_key_value_heads * qcfg.head_dim
            * np.dtype(qcfg.dtype.compute).itemsize)


def _rss() -> int | None:
    """This process's resident set now (bytes; Linux ``/proc/self/status``), None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return None


def _memory(compiled) -> dict[str, int]:
    m = compiled.memory_analysis()
    out = {k: int(getattr(m, f"{k}_size_in_bytes", 0) or 0)
           for k in ("argument", "output", "alias", "temp", "generated_code")}
    out["transient"] = out["temp"] + max(0, out["output"] - out["alias"])  # what the call adds to what is resident
    return out


def update_shape(cfg) -> tuple[str, int, int, int]:
    """(section, rows, microbatches, length) of the job's update: the RL trainer's
    (``rl.minibatch_size`` rows, default group_size x tasks_per_step, of ``rollout.capacity``),
    job=sft's (``sft.batch_size`` rows of at most ``sft.max_len``) or job=dpo's (``dpo.batch_size``
    pairs of ``dpo.max_len``); ``<section>.microbatches`` of them (at least 1)."""
    if cfg.job == "sft":
        return "sft", cfg.sft.batch_size, max(1, cfg.sft.microbatches), cfg.sft.max_len or cfg.rollout.capacity
    if cfg.job == "dpo":
        return "dpo", cfg.dpo.batch_size, max(1, cfg.dpo.microbatches), cfg.dpo.max_len
    return ("rl", cfg.rl.minibatch_size or cfg.rl.group_size * cfg.rl.tasks_per_step, max(1, cfg.rl.microbatches),
            cfg.rollout.capacity)


def plan_memory(cfg, *, compile: bool = True, margin: float = MARGIN, programs: tuple[str, ...] | None = None,
                reuse: dict[str, dict] | None = None) -> dict[str, Any]:
    """The memory plan of ``cfg`` (a `RunConfig`): see the module docstring. ``compile=False``:
    the analytic terms only. ``programs``: a subset of ("update", "prefill", "decode", "scorer", "infogain").
    ``reuse``: programs' entries of an earlier plan whose shapes this config does not change (not
    compiled again; `jaxagent.jobs.planfit`); the host memory is then not measured (None)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import AbstractMesh, NamedSharding

    from jaxagent.jobs.build import planning_model_config
    from jaxagent.models import LogicalRules, make_mesh
    from jaxagent.models.qwen import init_params, param_logical_axes
    from jaxagent.models.sharding import MESH_AXES

    notes: list[str] = []
    rss_entry, executables = _rss(), []
    qcfg, shapes_from = planning_model_config(cfg)
    qcfg = dataclasses.replace(qcfg, remat=cfg.model.remat, attn_impl=cfg.model.attn_impl)  # a preset's are its own
    attn = qcfg.attn_impl
    if attn in ("cudnn", "splash"):
        notes.append(f"model.attn_impl={attn!r} cannot lower on this CPU host: planned with 'blockwise' (the "
                     "memory-efficient XLA attention, closest in memory to the fused kernel)")
        qcfg = dataclasses.replace(qcfg, attn_impl="blockwise")
    elif attn == "auto":
        notes.append("model.attn_impl='auto' resolves per backend: planned with what it picks on this CPU host")
    lora_spec = cfg.model.lora.spec() if cfg.model.lora.rank else None
    if lora_spec is not None:
        qcfg = dataclasses.replace(qcfg, lora=lora_spec)

    wanted = planning_devices(cfg)
    if -1 in (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor):
        notes.append("a mesh axis of -1 takes every device there is: planned with it = 1 (one device per row "
                     "of the plan; set the axis to plan for more)")
    shape = cfg.mesh.shape(wanted)
    cpus = jax.devices("cpu")
    can_compile = compile and len(cpus) >= wanted
    if compile and not can_compile:
        notes.append(f"the mesh needs {wanted} devices and this host has {len(cpus)} CPU device(s): nothing compiled "
                     f"(set XLA_FLAGS=--xla_force_host_platform_device_count={wanted} before JAX starts; the "
                     "launcher's --plan does it)")
    mesh = make_mesh(dataclasses.replace(cfg.mesh, **dict(zip(MESH_AXES, shape))), cpus[:wanted]) if can_compile \
        else AbstractMesh(shape, MESH_AXES)
    rules = LogicalRules(mesh)
    shard = (lambda ax, shp: rules.sharding(ax, shp)) if can_compile else \
        (lambda ax, shp: NamedSharding(mesh, rules.spec(ax, shp)))

    # ---- parameters, optimizer state, gradients (analytic, per device)
    abstract = jax.eval_shape(lambda k: init_params(k, qcfg), jax.random.key(0))
    axes = param_logical_axes(qcfg)
    is_axes = lambda x: isinstance(x, tuple)
    p_shard = jax.tree.map(lambda ax, x: shard(ax, x.shape), axes, abstract, is_leaf=is_axes)
    params_b = _tree_bytes(abstract, p_shard)
    trained = {"lora": abstract["lora"]} if lora_spec is not None else abstract
    t_shard = {"lora": p_shard["lora"]} if lora_spec is not None else p_shard
    trained_b = _tree_bytes(trained, t_shard)
    trained_f32 = sum(_per_device_bytes(jax.ShapeDtypeStruct(x.shape, jnp.float32), s)
                      for x, s in zip(jax.tree.leaves(trained), jax.tree.leaves(t_shard)))
    moments = 2 if cfg.optim.name == "adamw" else 0  # optax sgd without momentum keeps no state
    opt_b = moments * trained_f32 * 1  # AdamW's mu and nu in fp32 (optax keeps them in the params' dtype: see below)
    mu_dtype_note = None
    if moments:
        from jaxagent.train.step import make_optimizer

        opt_abs = jax.eval_shape(make_optimizer(cfg.optim).init, trained)
        opt_b_actual = sum(_per_device_bytes(x, s) for x, s in zip(
            [x for x in jax.tree.leaves(opt_abs) if x.ndim], [s for s in match_shardings(opt_abs, trained, t_shard)]))
        if opt_b_actual != opt_b:
            mu_dtype_note = (f"optax keeps AdamW's moments in the trained parameters' dtype "
                             f"({cfg.model.param_dtype}): {_gb(opt_b_actual)} GB, not 2 x fp32 = {_gb(opt_b)} GB")
            opt_b = opt_b_actual
    if mu_dtype_note:
        notes.append(mu_dtype_note)
    # the update's rows, microbatches and length: the RL trainer's, job=sft's (sft.batch_size rows of
    # at most sft.max_len, sft.microbatches) or job=dpo's (dpo.batch_size pairs of at most dpo.max_len)
    sec, rows, micro, L = update_shape(cfg)
    grads_b = trained_f32 * (2 if micro >= 2 else 1) + trained_b  # fp32 accumulator(s) + the combined gradient

    # ---- the engine's resident buffers (analytic; replicated, or split over the KV heads)
    r = cfg.rollout
    # park rows as each job's engine is built: the run's (`jobs.build.prepare`: group_size x
    # tasks_per_step by default), serve's (slots by default), the Q&D jobs' local policy (none)
    if cfg.job.startswith("qd_"):
        park = 0
    elif cfg.job == "serve":
        park = r.park_rows if r.park_rows >= 0 else r.slots
    else:
        park = r.park_rows if r.park_rows >= 0 else cfg.rl.group_size * cfg.rl.tasks_per_step
    split = 1  # devices the caches are split over (rollout.cache_sharding=heads)
    if r.cache_sharding == "heads" and math.prod(shape) > 1:
        if qcfg.num_key_value_heads % math.prod(shape):
            notes.append(f"rollout.cache_sharding='heads': the model's {qcfg.num_key_value_heads} KV heads do not "
                         f"split over {math.prod(shape)} devices (the run refuses it): planned replicated")
        else:
            split = math.prod(shape)
    kv_b = kv_cache_bytes(qcfg, r.slots, r.capacity) // split
    park_b = kv_cache_bytes(qcfg, park + 1, r.capacity) // split if park else 0
    logits_b = r.slots * qcfg.vocab_size * 4
    uses_engine = cfg.job in ("rl", "sft+rl", "eval", "serve", "qd_eval", "qd_label", "qd_tau2")
    trains = cfg.job in ("rl", "sft+rl", "sft", "dpo", "offline")
    terms = {"parameters": params_b, "optimizer_state": opt_b if trains else 0,
             "kv_cache": kv_b if uses_engine else 0, "park_cache": park_b if uses_engine else 0,
             "engine_logits": logits_b if uses_engine else 0}
    if cfg.rl.max_staleness and cfg.job in ("rl", "sft+rl"):  # asynchronous RL: the engine decodes with its own copy
        terms["engine_params"] = params_b
    resident = sum(terms.values())

    # ---- the compiled programs
    compiled: dict[str, Any] = {}
    from jaxagent.credit.registry import CREDIT_TERMS, parse_credit

    info = cfg.job in ("rl", "sft+rl") and cfg.infopo.prior == "placeholder" and any(
        "r_info" in CREDIT_TERMS[n].needs for n in parse_credit(cfg.rl.credit, key="rl.credit"))
    notes += row_split_notes(cfg, rules, rows=rows, micro=micro, info=info)
    if info and cfg.infopo.mode == "naive":
        notes.append("infopo.mode='naive' scores each counterfactual history in its own call: planned as 'vmapped' "
                     "(all of them in one call, an upper bound)")
    want = programs or (("update", "prefill", "decode", "scorer") + (("infogain",) if info else ())
                        if uses_engine and trains else ("update",) if trains else ("prefill", "decode"))
    if can_compile:
        p_abs = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, p_shard)
        for name in want:
            if name in (reuse or {}):
                compiled[name] = reuse[name]
                continue
            t0, rss0 = time.perf_counter(), _rss()
            try:
                c = compile_program(name, cfg, qcfg, rules, p_abs, rows=rows, L=L, park=park, micro=micro, trained=trained)
            except Exception as e:  # noqa: BLE001 (a program that does not lower here is reported, not fatal)
                compiled[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                continue
            executables.append(c)
            gc.collect()
            rss1 = _rss()
            compiled[name] = {**_memory(c), "compile_s": round(time.perf_counter() - t0, 1),
                              "host_compile_bytes": None if rss0 is None or rss1 is None else max(0, rss1 - rss0)}
        if "update" in compiled and "argument" in compiled["update"]:
            compiled["update"]["gradients_analytic"] = grads_b

    # ---- peak per device, verdicts, knobs
    transients = {k: v["transient"] for k, v in compiled.items() if "transient" in v}
    if not transients:  # analytic fallback: gradients for an update, nothing else known
        transients = {"update (analytic: gradients only, no activations)": grads_b} if trains else {}
    worst = max(transients, key=transients.get) if transients else None
    peak = resident + (transients[worst] if worst else 0)
    parts = {**terms, **({f"transient of {worst}": transients[worst]} if worst else {})}
    dominant = max(parts, key=parts.get)
    length = {"sft": "sft.max_len", "dpo": "dpo.max_len"}.get(cfg.job, "rollout.capacity")
    knobs = {
        "parameters": "mesh.fsdp (shard the weights over more devices) or mesh.tensor",
        "optimizer_state": "mesh.fsdp (shard the moments), or model.lora.rank (train an adapter: no full-model moments)",
        "kv_cache": "rollout.cache_sharding=heads (split over the devices), rollout.slots (linear) or "
                    "rollout.capacity (linear)",
        "park_cache": "rollout.cache_sharding=heads, or rollout.park_rows (linear; default group_size x "
                      "tasks_per_step rows of rollout.capacity)",
        "engine_logits": "rollout.slots",
        "engine_params": "rl.max_staleness=0 (the synchronous loop decodes with the trained weights themselves)",
    }
    knobs.update({
        "transient of update": (f"{sec}.microbatches (activations scale with the rows / microbatches), model.remat=full, "
                                f"{length} (the update's sequence length)"),
        "transient of prefill": "rollout.slots and rollout.capacity (the largest prefill: every slot admitted with "
                                "a capacity-long chunk, a shape the engine's warmup compiles)",
        "transient of decode": "rollout.slots (every running row's window is gathered per call), rollout.capacity",
        "transient of scorer": "rl.score_rows (rows scored at a time), rollout.capacity",
        "transient of infogain": ("rl.score_rows (packed rows scored at a time: each holds a packed_len^2 attention "
                                  "mask), rollout.capacity and rollout.max_turns (the packed length), "
                                  "or infopo.placeholder_mode=overwrite (no placeholder tokens added per turn)"),
    })
    knob = knobs.get(dominant, "rl.microbatches, model.remat")
    verdicts = {}
    for kind, mem in DEVICE_KINDS.items():
        fits = peak * (1 + margin) <= mem
        verdicts[kind] = "fits" if fits else "does not fit"
    rss_end = _rss()
    host_bytes = None if not executables or rss_entry is None or rss_end is None or reuse else max(0, rss_end - rss_entry)
    del executables
    return {"shapes_from": shapes_from, "mesh": dict(zip(MESH_AXES, shape)), "devices": wanted,
            "compiled_on": f"{len(cpus)} CPU device(s) of this host" if can_compile else None,
            "attn_impl_planned": qcfg.attn_impl, "notes": notes, "margin": margin,
            "per_device_bytes": {**terms, "gradients": grads_b if trains else 0},
            "programs": compiled, "resident": resident, "largest_transient": worst, "peak_per_device": peak,
            "dominant_term": dominant, "knob": knob, "terms_ranked": sorted(parts, key=parts.get, reverse=True),
            "verdicts": verdicts, "host_bytes": host_bytes,
            "cpu_run_peak": None if host_bytes is None else peak + host_bytes,
            "shapes": {"update_rows": rows, "update_length": L, "microbatches": micro, "capacity": r.capacity,
                       "slots": r.slots, "park_rows": park,
                       "decode_steps": r.decode_steps,
                       **({"infogain": infogain_shapes(cfg, r.capacity)} if info else {})}}


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as the table ``--plan`` prints."""
    lines = [f"memory plan (per device; GB = 1e9 bytes): mesh {plan['mesh']} = {plan['devices']} device(s)",
             f"  shapes from: {plan['shapes_from']}",
             (f"  compiled on: {plan['compiled_on'] or 'nothing compiled (analytic terms only)'}; attention planned "
              f"as {plan['attn_impl_planned']!r}"),
             f"  shapes: {plan['shapes']}"]
    lines += [f"  note: {n}" for n in plan["notes"]]
    lines.append("  resident (alive all run long):")
    for k, v in plan["per_device_bytes"].items():
        if k != "gradients":
            lines.append(f"    {k:<18} {_gb(v):>10.3f} GB")
    lines.append(f"    {'total':<18} {_gb(plan['resident']):>10.3f} GB")
    lines.append(f"  gradients (analytic: fp32 accumulators + the combined gradient, inside the update's temp): "
                 f"{_gb(plan['per_device_bytes']['gradients']):.3f} GB")
    if plan["programs"]:
        lines.append("  programs (XLA memory analysis of the CPU compile, per device):")
        lines.append(f"    {'program':<9} {'arguments':>10} {'outputs':>10} {'aliased':>10} {'temp':>10} "
                     f"{'transient':>10} {'compile':>8}")
        for name, m in plan["programs"].items():
            if "error" in m:
                lines.append(f"    {name:<9} did not compile here: {m['error']}")
                continue
            lines.append(f"    {name:<9} {_gb(m['argument']):>10.3f} {_gb(m['output']):>10.3f} {_gb(m['alias']):>10.3f} "
                         f"{_gb(m['temp']):>10.3f} {_gb(m['transient']):>10.3f} {m['compile_s']:>7.1f}s")
    lines.append(f"  peak per device = resident + largest transient ({plan['largest_transient']}) = "
                 f"{_gb(plan['peak_per_device']):.3f} GB; with a {plan['margin']:.0%} margin "
                 f"{_gb(plan['peak_per_device'] * (1 + plan['margin'])):.3f} GB")
    if plan.get("host_bytes") is not None:
        lines.append(f"  host memory planning grew this process by (RSS: the tokenizer, the traced programs, the "
                     f"compiler's heap, the executables; measured): {_gb(plan['host_bytes']):.3f} GB. On an "
                     f"accelerator it is host RAM; on "
                     f"a CPU backend it adds to the device figures: a CPU run peaks near "
                     f"{_gb(plan['cpu_run_peak']):.3f} GB above a bare JAX process")
    lines.append(f"  dominant term: {plan['dominant_term']}; the knob that scales it: {plan['knob']}")
    lines.append(f"  terms, largest first: {', '.join(plan['terms_ranked'])}")
    lines.append("  device kind          memory    verdict")
    for kind, v in plan["verdicts"].items():
        lines.append(f"    {kind:<18} {DEVICE_KINDS[kind] / GB:>6.0f} GB  {v}")
    lines.append("  caveat: compiled for this host's CPU backend; a GPU/TPU compile assigns buffers differently "
                 "(temp bytes are an estimate)")
    return "\n".join(lines)


__all__ = ["DEVICE_KINDS", "MARGIN", "format_plan", "kv_cache_bytes", "plan_memory", "planning_devices",
           "update_shape"]

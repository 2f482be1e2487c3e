"""``--plan --fit KIND``: the overrides that bring a config under a device's memory.

`plan_memory` names the dominant term and the knob that scales it; `fit_plan` turns that into
settings. From the config's own plan it applies, one at a time, a step that shrinks a term of the
peak (the resident terms and the largest transient): the cheapest kind of step first (`COST`: a
cache split, then the credit's and the update's rows at a time, then prefix reuse and
recomputation, last the rollout lanes), on the largest term among those; it re-plans (the programs
whose shapes the step changes compiled again) and stops when the peak with the margin fits the
budget, or when no step is left:

==========================================  ======================================================
term                                        its steps
==========================================  ======================================================
park_cache                                  ``rollout.cache_sharding=heads`` on several devices,
                                            then ``rollout.park_rows=0`` (a returning session is
                                            then prefilled again)
kv_cache, transient of prefill, transient   ``rollout.cache_sharding=heads`` on several devices
of decode                                   (each holds kv_heads / devices), then ``rollout.slots``
                                            halved (fewer lanes decode at once)
engine_logits                               ``rollout.slots`` halved
transient of update                         the job's ``microbatches`` raised: for RL to the next
                                            count whose rows per microbatch split over the batch
                                            devices (data x fsdp: each device then runs its own
                                            rows), else doubled while it divides the update's
                                            rows; then ``model.remat=full``
transient of scorer, transient of infogain  ``rl.score_rows`` halved (from the iteration's
                                            episodes when it is 0 or more)
engine_params                               ``rl.max_staleness=0``
parameters, optimizer_state                 none that keeps the model, the optimizer and the
                                            hardware: the result says so (``mesh.fsdp`` over more
                                            devices, or ``model.lora.rank``)
==========================================  ======================================================

Each step keeps the model, the data, the algorithm and the mesh: what it gives up is speed (lanes,
prefix reuse, larger microbatches, a cache split that adds collectives) or, for
``rl.max_staleness=0``, asynchrony. A step the config refuses (its validation), or that does not
lower the peak (e.g. KV heads the devices do not divide), is not kept.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from jaxagent.jobs.memplan import DEVICE_KINDS, GB, MARGIN, plan_memory, update_shape

#: What a step gives up, cheapest first: nothing but collectives (0); speed of the credit or the
#: update (1); prefix reuse, recomputation, asynchrony (2); rollout lanes (3).
COST: dict[str, int] = {"rollout.cache_sharding": 0, "rl.score_rows": 1, "rl.microbatches": 1, "sft.microbatches": 1,
                        "dpo.microbatches": 1, "rollout.park_rows": 2, "model.remat": 2, "rl.max_staleness": 2,
                        "rollout.slots": 3}

#: The programs each step's key changes the shapes of (the others are reused, not compiled again).
RECOMPILES: dict[str, tuple[str, ...]] = {
    "rollout.park_rows": (), "rl.max_staleness": (), "rollout.slots": ("prefill", "decode"),
    "rl.microbatches": ("update",), "sft.microbatches": ("update",), "dpo.microbatches": ("update",),
    "model.remat": ("update", "scorer", "infogain"), "rl.score_rows": ("scorer", "infogain"),
    "rollout.cache_sharding": ("prefill", "decode"),
}


def device_budget(fit: str) -> tuple[str, int]:
    """``fit``: a device kind of `DEVICE_KINDS` (any unambiguous piece of its name, e.g. ``H100``,
    ``v5e``) or a memory in GB (``24`` or ``24GB``). Returns (its name, bytes). ValueError naming
    ``--fit`` otherwise."""
    text = str(fit).strip()
    num = text[:-2].strip() if text.lower().endswith("gb") else text
    try:
        gb = float(num)
    except ValueError:
        hits = [k for k in DEVICE_KINDS if text.lower() in k.lower()]
        if len(hits) != 1:
            raise ValueError(f"--fit {fit!r}: expected one device kind ({', '.join(DEVICE_KINDS)}; any unambiguous "
                             f"part of a name) or a memory in GB (e.g. 24GB)"
                             + (f"; it matches {len(hits)} kinds" if hits else "")) from None
        return hits[0], DEVICE_KINDS[hits[0]]
    if not gb > 0 or gb != gb or gb == float("inf"):
        raise ValueError(f"--fit {fit!r}: expected a memory above 0 GB")
    return f"{gb:g} GB", int(gb * GB)


def next_steps(term: str, cfg) -> list[tuple[str, Any]]:
    """The overrides (key, value) that shrink ``term`` of ``cfg``'s plan, in the order to try them
    (the module's table); empty when none is left."""
    from jaxagent.jobs.memplan import planning_devices

    r = cfg.rollout
    split = [("rollout.cache_sharding", "heads")] if r.cache_sharding != "heads" and planning_devices(cfg) > 1 else []
    if term == "park_cache":
        return split + ([("rollout.park_rows", 0)] if r.park_rows != 0 else [])
    if term in ("kv_cache", "transient of prefill", "transient of decode"):
        return split + ([("rollout.slots", r.slots // 2)] if r.slots > 1 else [])
    if term == "engine_logits":
        return [("rollout.slots", r.slots // 2)] if r.slots > 1 else []
    if term == "transient of update":
        sec, rows, micro, _ = update_shape(cfg)
        data, fsdp, _ = cfg.mesh.shape(planning_devices(cfg))
        n = data * fsdp  # RL's update runs its rows on their own devices when they split over these
        split = [d for d in range(micro + 1, rows + 1) if rows % d == 0 and (rows // d) % n == 0] \
            if sec == "rl" and n > 1 and not cfg.mesh.distributed else []
        out = [(f"{sec}.microbatches", split[0])] if split else \
            [(f"{sec}.microbatches", 2 * micro)] if rows % (2 * micro) == 0 else []
        return out + ([("model.remat", "full")] if cfg.model.remat != "full" else [])
    if term in ("transient of scorer", "transient of infogain"):  # halved from the rows scored at a time
        rows = cfg.rl.rows_scored_at_a_time(cfg.rl.group_size * cfg.rl.tasks_per_step)
        return [("rl.score_rows", rows // 2)] if rows > 1 else []
    if term == "engine_params":
        return [("rl.max_staleness", 0)] if cfg.rl.max_staleness else []
    return []


def fit_plan(cfg, budget: int, *, name: str | None = None, margin: float = MARGIN, first: dict | None = None,
             max_steps: int = 16, programs: tuple[str, ...] | None = None,
             log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Steps ``cfg`` (a `RunConfig`) under ``budget`` bytes per device (module docstring).
    ``first``: ``cfg``'s plan when already made; ``programs``: as `plan_memory`'s. Returns ``fits``
    (bool), ``overrides`` (the ``key=value`` list, in the order applied), ``peak_with_margin``
    (bytes), ``steps`` (each: the override, the term it shrank and its size, the peak with the
    margin after it), ``plan`` (the last plan) and, when it does not fit, ``blocked_by`` (the
    largest term no step can shrink, None after ``max_steps``) with ``what_would``."""
    from jaxagent import configlib
    from jaxagent.jobs.config import RunConfig

    say = log or (lambda s: print(s, file=sys.stderr, flush=True))
    label = name or f"{budget / GB:g} GB"
    plan = first or plan_memory(cfg, margin=margin, programs=programs)
    applied: dict[str, Any] = {}
    steps: list[dict[str, Any]] = []
    spent: set[tuple[str, Any]] = set()

    def peak(p):
        return p["peak_per_device"] * (1 + margin)

    while peak(plan) > budget and len(steps) < max_steps:
        # the terms of the peak: the resident ones and the largest transient (a smaller program's
        # transient is not in the peak: shrinking it would change nothing)
        sizes = {k: v for k, v in plan["per_device_bytes"].items() if k != "gradients"}
        if plan["largest_transient"]:
            sizes[f"transient of {plan['largest_transient']}"] = plan["peak_per_device"] - plan["resident"]
        step = new_cfg = None
        # the cheapest step first (COST), then the one on the largest term
        options = sorted(((COST[k], -sizes[t], t, k, v) for t in sizes if sizes[t] > 0 for k, v in next_steps(t, cfg)),
                         key=lambda o: o[:2])
        for _, _, term, key, value in options:
            if (key, value) in spent:
                continue
            spent.add((key, value))
            try:
                new_cfg = configlib.load(RunConfig, None, [f"{key}={value}"], base=configlib.to_dict(cfg))
            except (configlib.ConfigError, ValueError):  # the config refuses it: spent
                continue
            step = {"override": f"{key}={value}", "term": term, "term_bytes": sizes[term]}
            break
        if step is None:
            blocked = max(sizes, key=sizes.get)
            say(f"[plan] fit {label}: no step left; the largest term is {blocked} ({sizes[blocked] / GB:.3g} GB)")
            return {"device": label, "budget": budget, "fits": False, "overrides": _as_list(applied),
                    "peak_with_margin": peak(plan), "steps": steps, "plan": plan, "blocked_by": blocked,
                    "what_would": "mesh.fsdp (more devices) or model.lora.rank" if blocked in (
                        "parameters", "optimizer_state") else f"{plan['knob']}; or mesh.fsdp (more devices)"}
        key, value = step["override"].split("=", 1)
        say(f"[plan] fit {label}: step {len(steps) + 1}: {step['override']} (largest shrinkable term: {step['term']}, "
            f"{step['term_bytes'] / GB:.3g} GB); planning again")
        keep = {k: v for k, v in plan["programs"].items() if k not in RECOMPILES[key] and "error" not in v}
        tried = plan_memory(new_cfg, margin=margin, programs=programs, reuse=keep)
        broke = sorted(k for k, v in tried["programs"].items() if "error" in v and "error" not in plan["programs"].get(k, {}))
        if broke or peak(tried) >= peak(plan):  # a program that no longer compiles would look like a lower peak
            say(f"[plan] fit {label}: {step['override']} " + (f"stops {', '.join(broke)} compiling" if broke else
                f"does not lower the peak ({peak(tried) / GB:.3g} GB)") + ": not kept")
            continue
        applied[key], cfg, plan = value, new_cfg, tried
        steps.append({**step, "peak_with_margin": peak(plan)})
        say(f"[plan] fit {label}: step {len(steps)}: peak with the margin {peak(plan) / GB:.3g} GB")
    fits = peak(plan) <= budget
    say(f"[plan] fit {label}: {'fits' if fits else 'does not fit'} at {peak(plan) / GB:.3g} GB with the margin"
        + (f" with {' '.join(_as_list(applied))}" if applied else " as written"))
    out = {"device": label, "budget": budget, "fits": fits, "overrides": _as_list(applied),
           "peak_with_margin": peak(plan), "steps": steps, "plan": plan}
    if not fits:  # max_steps taken
        out.update(blocked_by=None, what_would=f"more than {max_steps} steps: plan again from these overrides")
    return out


def _as_list(applied: dict[str, Any]) -> list[str]:
    return [f"{k}={v}" for k, v in applied.items()]


def format_fit(fit: dict[str, Any]) -> str:
    """The search as ``--plan --fit`` prints it."""
    lines = [f"fit {fit['device']} ({fit['budget'] / GB:.3g} GB per device):"]
    for i, s in enumerate(fit["steps"], 1):
        lines.append(f"  {i}. {s['override']:<28} shrinks {s['term']} ({s['term_bytes'] / GB:.3g} GB): "
                     f"peak {s['peak_with_margin'] / GB:.3g} GB with the margin")
    if fit["fits"]:
        lines.append(f"  fits at {fit['peak_with_margin'] / GB:.3g} GB with: "
                     + (" ".join(fit["overrides"]) or "the config as written"))
    else:
        why = (f"the largest term, {fit['blocked_by']}, has no step left" if fit["blocked_by"] else
               "the steps ran out")
        lines.append(f"  does not fit ({fit['peak_with_margin'] / GB:.3g} GB after the steps above): {why}; "
                     f"{fit['what_would']}")
    return "\n".join(lines)


__all__ = ["COST", "RECOMPILES", "device_budget", "fit_plan", "format_fit", "next_steps"]

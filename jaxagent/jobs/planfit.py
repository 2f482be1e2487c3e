"""``--plan --fit KIND``: the overrides that bring a config under a device's memory.

`plan_memory` names the dominant term and the knob that scales it; `fit_plan` turns that into
settings. From the config's own plan it applies, one at a time, the step that shrinks the largest
term a step can shrink, re-plans (the programs whose shapes the step changes compiled again), and stops when the peak with the
margin fits the budget, or when no step is left:

==========================================  ======================================================
term                                        step (tried in this order; the next when one is spent)
==========================================  ======================================================
park_cache                                  ``rollout.park_rows=0`` (a returning session is then
                                            prefilled again: no model change)
kv_cache, engine_logits, transient of       ``rollout.slots`` halved (fewer lanes decode at once)
prefill, transient of decode
transient of update                         the job's ``microbatches`` doubled while it divides
                                            the update's rows, then ``model.remat=full``
transient of scorer, transient of infogain  ``rl.score_rows`` halved (0, all rows at once: 8)
engine_params                               ``rl.max_staleness=0``
parameters, optimizer_state                 none that keeps the model, the optimizer and the
                                            hardware: the result says so (``mesh.fsdp`` over more
                                            devices, or ``model.lora.rank``)
==========================================  ======================================================

Each step keeps the model, the data, the algorithm and the mesh: what it gives up is speed (lanes,
prefix reuse, larger microbatches) or, for ``rl.max_staleness=0``, asynchrony. A step the config
refuses (its validation) counts as spent.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from jaxagent.jobs.memplan import DEVICE_KINDS, GB, MARGIN, plan_memory

#: The programs each step's key changes the shapes of (the others are reused, not compiled again).
RECOMPILES: dict[str, tuple[str, ...]] = {
    "rollout.park_rows": (), "rl.max_staleness": (), "rollout.slots": ("prefill", "decode"),
    "rl.microbatches": ("update",), "sft.microbatches": ("update",), "dpo.microbatches": ("update",),
    "model.remat": ("update", "scorer", "infogain"), "rl.score_rows": ("scorer", "infogain"),
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


def _microbatch_key(cfg) -> tuple[str, int, int]:
    """(key, microbatches, rows of the update) of the job's update."""
    if cfg.job == "sft":
        return "sft.microbatches", cfg.sft.microbatches, cfg.sft.batch_size
    if cfg.job == "dpo":
        return "dpo.microbatches", cfg.dpo.microbatches, cfg.dpo.batch_size
    return "rl.microbatches", cfg.rl.microbatches, cfg.rl.minibatch_size or cfg.rl.group_size * cfg.rl.tasks_per_step


def next_steps(term: str, cfg) -> list[tuple[str, Any]]:
    """The overrides (key, value) that shrink ``term`` of ``cfg``'s plan, in the order to try them
    (the module's table); empty when none is left."""
    r = cfg.rollout
    if term == "park_cache":
        return [("rollout.park_rows", 0)] if r.park_rows != 0 else []
    if term in ("kv_cache", "engine_logits", "transient of prefill", "transient of decode"):
        return [("rollout.slots", r.slots // 2)] if r.slots > 1 else []
    if term == "transient of update":
        key, micro, rows = _microbatch_key(cfg)
        out = [(key, 2 * micro)] if rows % (2 * max(1, micro)) == 0 and 2 * micro <= rows else []
        return out + ([("model.remat", "full")] if cfg.model.remat != "full" else [])
    if term in ("transient of scorer", "transient of infogain"):
        rows = cfg.rl.score_rows
        return [("rl.score_rows", 8 if rows == 0 else rows // 2)] if rows != 1 else []
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
        for term in sorted((t for t in sizes if sizes[t] > 0), key=sizes.get, reverse=True):
            for key, value in next_steps(term, cfg):
                if (key, value) in spent:
                    continue
                spent.add((key, value))
                try:
                    new_cfg = configlib.load(RunConfig, None, [f"{key}={value}"], base=configlib.to_dict(cfg))
                except (configlib.ConfigError, ValueError):  # the config refuses it: spent
                    continue
                step = {"override": f"{key}={value}", "term": term, "term_bytes": sizes[term]}
                break
            if step:
                break
        if step is None:
            blocked = max(sizes, key=sizes.get)
            say(f"[plan] fit {label}: no step left; the largest term is {blocked} ({sizes[blocked] / GB:.3g} GB)")
            return {"device": label, "budget": budget, "fits": False, "overrides": _as_list(applied),
                    "peak_with_margin": peak(plan), "steps": steps, "plan": plan, "blocked_by": blocked,
                    "what_would": "mesh.fsdp (more devices) or model.lora.rank" if blocked in (
                        "parameters", "optimizer_state") else f"{plan['knob']}; or mesh.fsdp (more devices)"}
        key, value = step["override"].split("=", 1)
        applied[key] = value
        cfg = new_cfg
        say(f"[plan] fit {label}: step {len(steps) + 1}: {step['override']} (largest shrinkable term: {step['term']}, "
            f"{step['term_bytes'] / GB:.3g} GB); planning again")
        keep = {k: v for k, v in plan["programs"].items() if k not in RECOMPILES[key] and "error" not in v}
        plan = plan_memory(cfg, margin=margin, programs=programs, reuse=keep)
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


__all__ = ["RECOMPILES", "device_budget", "fit_plan", "format_fit", "next_steps"]

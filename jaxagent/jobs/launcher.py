"""What ``python -m jaxagent.launch`` does once the command line is parsed: load and check the
config (a Hugging Face Hub id in ``model.path`` / ``tokenizer`` becomes its local snapshot:
`resolve_paths`), run the job (or ``--dry-run``: plan it), and turn what stops a run into a `JobError` whose
kind heads the message the launcher exits with (``config error``, ``error``, ``simulator
failure``, ``training failed``). `help_epilog` is the ``--help`` text after the options: the
registered jobs, environments and credit terms, presets, config files and every key."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxagent import configlib
from jaxagent.jobs.config import RunConfig, load_config
from jaxagent.jobs.registry import JOBS, job_spec

ROOT = Path(__file__).resolve().parents[2]


class JobError(Exception):
    """A run refused or stopped for a reason the user can act on; ``kind`` heads the message."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def help_width(width: int | None = None) -> int:
    """`configlib.help_width`: ``width``, or the terminal's."""
    return configlib.help_width(width)


def config_files() -> list[str]:
    d = ROOT / "configs"
    return sorted(str(p.relative_to(ROOT)) for p in d.glob("*.yaml")) if d.is_dir() else []


def help_epilog(width: int) -> str:
    """The registries (jobs, environments, credit terms), the model presets, the config files and
    every key of the run config, wrapped to ``width``."""
    import textwrap

    from jaxagent.credit.registry import credit_term_names
    from jaxagent.envs.registry import env_names
    from jaxagent.models import preset_names

    def para(label, items):
        return textwrap.fill(label + ", ".join(items), width, subsequent_indent="    ", break_on_hyphens=False)

    jobs = [f"  {name:<9} {spec.help}" for name, spec in JOBS.items()]
    return "\n".join([
        "jobs (job=NAME):", *[textwrap.fill(j, width, subsequent_indent=" " * 12) for j in jobs],
        para("environments (env.kind=NAME, or package.module:NAME for your own): ", env_names()),
        para("credit terms (rl.credit=NAME or NAME+NAME..., the outcome term grpo always in): ", credit_term_names()),
        "short forms: env=K (env.kind=K), agent=A (eval.agent=A)",
        para("model presets (model.preset=NAME): ", preset_names()),
        para("config files: ", config_files() or ["(none found)"]), "",
        "keys (key=value overrides; types and defaults):", configlib.describe(RunConfig, width)])


def launch(config_file: str | None, overrides: Sequence[str], *, dry_run: bool = False,
           memory_plan: bool = False, fit: str | None = None) -> dict[str, Any]:
    """Loads the config, checks what needs the files and devices, and runs the job (or plans it:
    `plan`; ``memory_plan``: with the memory plan, a dry run; ``fit``: with the overrides that bring
    it under that device's memory, `jaxagent.jobs.planfit`); the summary (or the plan) comes back.
    Raises `JobError`."""
    dry_run = dry_run or memory_plan
    from jaxagent.models.hf import CheckpointError
    from jaxagent.rollout.loop import EpisodeBudgetError
    from jaxagent.text.tokenizer import TokenizerError
    from jaxagent.train.checkpoint import CheckpointDamaged
    from jaxagent.train.rl import SimulatorFailureBudget
    from jaxagent.train.step import TrainingFailed

    try:
        cfg = load_config(config_file, overrides, fresh_name=True)
    except configlib.ConfigError as e:
        raise JobError("config error", str(e)) from None
    if cfg.progress and not dry_run:  # the first line within a second: what runs and where it writes
        where = "serves over HTTP" if cfg.job == "serve" else f"writes {Path(cfg.runs_dir) / cfg.name}/"
        print(f"[launch] job={cfg.job} env.kind={cfg.env.kind} {where}; building the model and environment",
              file=sys.stderr, flush=True)
    try:
        cfg, paths = resolve_paths(cfg, dry_run=dry_run)
        check_paths(cfg, dry_run=dry_run, pending=[k for k, r in paths.items() if r.is_hub and r.path is None])
        from jaxagent.jobs.wandb_log import check_wandb

        check_wandb(cfg)  # log.wandb=true without the package: refused here (a dry run too), before any build
        if dry_run:
            return plan(cfg, paths, memory=memory_plan or fit is not None, fit=fit)
        from jaxagent.models.sharding import initialize_distributed

        initialize_distributed(cfg.mesh)  # multi-host runs (docs/PODS.md): before any other JAX call
        check_processes(cfg)
        check_mesh(cfg)
        from jaxagent.jobs.run import run_job

        out = run_job(cfg)
        run_dir = Path(cfg.runs_dir) / cfg.name
        if run_dir.is_dir() and isinstance(out, dict):  # every job but serve writes a run directory
            out.setdefault("run_dir", str(run_dir))
        return out
    except (configlib.ConfigError, EpisodeBudgetError) as e:  # found once files, devices or the first prompt are seen
        raise JobError("config error", str(e)) from None
    except (CheckpointError, TokenizerError, CheckpointDamaged) as e:  # a damaged or foreign input file, named
        raise JobError("error", str(e)) from None
    except SimulatorFailureBudget as e:  # the user simulator kept failing (rl.failure_budget_iters, eval before)
        raise JobError("simulator failure", str(e)) from None
    except TrainingFailed as e:  # updates skipped past {rl,sft}.max_skipped_share, a collapse (rl.fail_on_collapse)
        raise JobError("training failed", str(e)) from None


def fake_host_devices(config_file: str | None, overrides: list[str]) -> None:
    """``--plan`` compiles on this host's CPU with as many (fake) devices as the config's mesh
    asks for: sets ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX's backends
    start (they read it once). Leaves a count the user set alone; when a backend is already up
    (JAX used earlier in this process) it sets nothing and the plan reports what it could not
    compile. `main` restores ``XLA_FLAGS`` afterwards."""
    import os

    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():  # too late: the plan compiles what the devices here allow
        return
    from jaxagent.jobs.memplan import planning_devices

    try:
        n = planning_devices(load_config(config_file, overrides))
    except configlib.ConfigError:
        return  # the launch reports it
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip()


def plan(cfg: RunConfig, paths: dict[str, Any] | None = None, *, memory: bool = False, fit: str | None = None) -> dict:
    """Config valid, mesh shape, parameter count and per-device parameter bytes, through
    `jax.eval_shape`; works for meshes larger than this machine (an abstract mesh). ``paths`` (from
    `resolve_paths`) adds how each of ``model.path``, ``tokenizer`` ... resolves (``"paths"``: local,
    hub-cache, hub: a run downloads it, missing). Before a download the shapes are the preset's,
    and ``shapes_from`` says so. ``verdict`` (first) is ``"valid"``, or ``"valid, with caveats: ..."``
    naming shapes planned from a preset and paths a run must download or will refuse; the config
    itself is valid either way (``"config": "valid"``, exit 0). ``memory`` (``--plan``): adds the
    memory plan, `jaxagent.jobs.memplan.plan_memory` (``"memory"``); ``fit`` (``--fit DEVICE``): then
    the overrides that bring it under that device (`jaxagent.jobs.planfit.fit_plan`, ``"fit"``)."""
    import dataclasses

    import jax
    import numpy as np
    from jax.sharding import AbstractMesh

    from jaxagent.models import LogicalRules, make_mesh
    from jaxagent.models.qwen import init_params, param_logical_axes
    from jaxagent.models.sharding import MESH_AXES

    here = len(jax.devices())
    dims = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor]
    known = math.prod(d for d in dims if d != -1)
    wanted = known if -1 not in dims or known > here else here
    shape = cfg.mesh.shape(wanted)
    mesh = make_mesh(cfg.mesh, jax.devices()[:wanted]) if wanted <= here else AbstractMesh(shape, MESH_AXES)
    rules = LogicalRules(mesh)
    from jaxagent.jobs.build import planning_model_config

    qcfg, shapes_from = planning_model_config(cfg)
    abstract = jax.eval_shape(lambda k: init_params(k, qcfg), jax.random.key(0))
    axes = param_logical_axes(qcfg)
    per_device = 0
    for leaf, ax in zip(jax.tree.leaves(abstract), jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))):
        spec = rules.spec(ax, leaf.shape)
        n = int(np.prod(leaf.shape)) * leaf.dtype.itemsize
        for entry in spec:
            for a in (entry,) if isinstance(entry, str) else (entry or ()):
                n //= mesh.shape[a]
        per_device += n
    count = int(sum(np.prod(x.shape) for x in jax.tree.leaves(abstract)))
    lora = {}
    if cfg.model.lora.rank:  # what an update trains and keeps optimizer state for
        from jaxagent.models.lora import num_lora_params

        n = num_lora_params(dataclasses.replace(qcfg, lora=cfg.model.lora.spec()))
        lora = {"lora_rank": cfg.model.lora.rank, "lora_targets": list(cfg.model.lora.targets),
                "trained_parameters": n, "trained_share": round(n / count, 5)}
    caveats = [] if shapes_from in ("model.path", "model.preset") else [f"shapes from {shapes_from}"]
    for key, r in (paths or {}).items():
        if r.status == "missing":
            caveats.append(f"{key} is missing (a run refuses it)")
        elif r.status == "hub":
            caveats.append(f"{key} is downloaded by the run")
    verdict = "valid" + (f", with caveats: {'; '.join(caveats)}" if caveats else "")
    if memory:  # --plan: the jitted programs compiled with abstract shapes, per device (jaxagent.jobs.memplan)
        from jaxagent.jobs.memplan import plan_memory

        lora["memory"] = plan_memory(cfg)
        if fit is not None:
            from jaxagent.jobs.planfit import device_budget, fit_plan

            try:
                name, budget = device_budget(fit)
            except ValueError as e:
                raise configlib.ConfigError(str(e)) from None
            found = fit_plan(cfg, budget, name=name, first=lora["memory"])
            lora["fit"] = {k: v for k, v in found.items() if k != "plan"}  # the last plan: too long for the summary
    return {"verdict": verdict, "config": "valid", "job": cfg.job, "name": cfg.name, "mesh": dict(zip(MESH_AXES, shape)),
            "devices_needed": math.prod(shape), "devices_here": here, "abstract_mesh": wanted > here,
            "parameters": count, "parameters_millions": round(count / 1e6, 2),
            "param_bytes_per_device": per_device, "shapes_from": shapes_from, "credit": cfg.rl.credit, **lora,
            **({"paths": {k: r.describe() for k, r in paths.items()}} if paths else {})}


def hub_refs(cfg: RunConfig) -> dict[str, str]:
    """The keys set in ``cfg`` that may name a Hugging Face Hub id, with their values: ``model.path``,
    ``tokenizer`` (not the builtin one), ``serve.adapter`` (job=serve), ``qd.baseline_model`` (job=qd_eval)."""
    from jaxagent.jobs.sections import BUILTIN_TOKENIZER

    refs = {"model.path": cfg.model.path, "tokenizer": None if cfg.tokenizer == BUILTIN_TOKENIZER else cfg.tokenizer,
            "serve.adapter": cfg.serve.adapter if cfg.job == "serve" else None,
            "qd.baseline_model": cfg.qd.baseline_model if cfg.job == "qd_eval" else None}
    return {k: v for k, v in refs.items() if v is not None}


def resolve_paths(cfg: RunConfig, *, dry_run: bool = False) -> tuple[RunConfig, dict[str, Any]]:
    """Each of `hub_refs` that is a Hugging Face Hub id (``org/name[@revision]``, not a path here)
    becomes its local snapshot directory, from the Hub cache or downloaded now (`jaxagent.hub.resolve`;
    ``--dry-run`` downloads nothing), so that everything downstream reads local directories; job=serve
    then names the model by its Hub id (unless ``serve.model_name`` is set). A Hub id that cannot be
    had is a config error naming the key (a dry run reports it instead); a local path that does not
    exist is left to `check_paths`. Returns the config and each key's `jaxagent.hub.Resolution`."""
    import dataclasses

    from jaxagent import hub

    found: dict[str, hub.Resolution] = {}
    for key, ref in hub_refs(cfg).items():
        same = next((r for r in found.values() if r.ref == ref and r.status != "missing"), None)  # resolved once
        res = dataclasses.replace(same, what=key) if same else hub.resolve(ref, what=key, download=not dry_run)
        if res.status == "missing" and res.is_hub and not dry_run:
            raise configlib.ConfigError(res.reason)
        found[key] = res
    for key, res in found.items():
        if res.is_hub and res.path is not None and res.status != "missing":
            section, _, name = key.rpartition(".")
            value = dataclasses.replace(getattr(cfg, section), **{name: res.path}) if section else res.path
            cfg = dataclasses.replace(cfg, **{section or name: value})
    model = found.get("model.path")
    if cfg.job == "serve" and cfg.serve.model_name is None and model is not None and model.is_hub:
        cfg = dataclasses.replace(cfg, serve=dataclasses.replace(cfg.serve, model_name=model.repo_id))
    return cfg, found


def check_paths(cfg: RunConfig, *, dry_run: bool = False, pending: Sequence[str] = ()) -> None:
    """``model.path`` and ``tokenizer`` exist (after `resolve_paths`: Hub ids are local directories
    by now). Before a download (``--dry-run``) a checkpoint directory that is not here yet is let
    through, with the tokenizer when it is that same directory or a Hub id not downloaded yet (its
    key in ``pending``): `plan` then takes the preset's shapes and says so."""
    from jaxagent.jobs.sections import BUILTIN_TOKENIZER

    m = cfg.model
    model_absent = m.path is not None and not Path(m.path).is_dir()
    if model_absent and not dry_run:
        raise configlib.ConfigError(f"model.path={m.path!r}: not a directory; expected a Hugging Face checkpoint "
                                    "directory (config.json + *.safetensors), a Hub id org/name[@revision], or null "
                                    "for model.preset")
    if cfg.tokenizer != BUILTIN_TOKENIZER and not Path(cfg.tokenizer).is_dir():
        same = m.path is not None and Path(cfg.tokenizer).resolve() == Path(m.path).resolve()
        if not (dry_run and (model_absent and same or "tokenizer" in pending)):
            raise configlib.ConfigError(f"tokenizer={cfg.tokenizer!r}: not a directory; expected a tokenizer (or "
                                        f"checkpoint) directory holding tokenizer.json, tokenizer_config.json or "
                                        f"tokenizer.model, a Hub id org/name[@revision], or {BUILTIN_TOKENIZER!r}")


def check_processes(cfg: RunConfig) -> None:
    """A multi-process run (``mesh.distributed``, docs/PODS.md) runs the policy jobs: each process
    plays its share of the episodes on its own copy of the policy, all train on all of them on the
    global mesh (`jaxagent.rollout.processes`). The host agents of ``job=eval`` (the tau2 oracle,
    an endpoint) use no mesh: they run in one process."""
    import jax

    spec = job_spec(cfg.job)
    if jax.process_count() > 1 and not spec.multi_process:
        raise configlib.ConfigError(f"job={cfg.job!r}: this launch is one of {jax.process_count()} processes; "
                                    f"{spec.why_single} (mesh.distributed=false)")
    if jax.process_count() > 1 and cfg.job == "eval" and cfg.eval.agent != "policy":
        raise configlib.ConfigError(
            f"eval.agent={cfg.eval.agent!r}: this launch is one of {jax.process_count()} processes, and a host agent "
            "uses no devices; expected one process (mesh.distributed=false) or eval.agent=policy")


def check_mesh(cfg: RunConfig) -> None:
    """``mesh.*`` can be laid on the run's devices (all processes' in a multi-host run;
    ``--dry-run`` instead builds an abstract mesh of the size asked for)."""
    import jax

    try:
        cfg.mesh.shape(len(jax.devices()))
    except ValueError as e:
        raise configlib.ConfigError(f"{e} (on {len(jax.devices())} {jax.default_backend()} device(s) here; "
                                    "expected a mesh whose product is the device count, or -1 on one axis)") from None


__all__ = ["JobError", "check_mesh", "check_paths", "check_processes", "config_files", "fake_host_devices",
           "help_epilog", "help_width", "hub_refs", "launch", "plan", "resolve_paths"]

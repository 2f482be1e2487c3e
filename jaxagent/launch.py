"""``python -m jaxagent.launch [--config FILE] [key=value ...]``: the project's entry point.

With no arguments it runs the quickstart (the defaults of `jaxagent.jobs.config.RunConfig`): a tiny
Qwen-architecture model over the gyms' small tokenizer, an SFT warm start on expert
demonstrations mixed with noise, then InfoPO RL on the intention gym, evaluated on held-out
tasks before and after, everything written to ``runs/quickstart/``.

    python -m jaxagent.launch                                   # the quickstart
    python -m jaxagent.launch --config configs/faca_telepathy.yaml steps=50
    python -m jaxagent.launch --config configs/infopo_7b.yaml --dry-run
    python -m jaxagent.launch resume=true                       # continue runs/quickstart/
    python -m jaxagent.launch job=eval env=tau2_retail agent=oracle   # tau2 retail, the gold-action oracle
    python -m jaxagent.launch job=qd_eval qd.benchmark=musique qd.baseline=never_ask   # Q&D questioners
    python -m jaxagent.launch --help                            # jobs, config files, every key

Jobs (``job=``): ``sft`` (masked cross-entropy on the gym's expert demonstrations), ``rl``
(rollouts -> credit (``rl.credit``: grpo, infopo, faca, infopo+faca) -> PPO), ``sft+rl`` (the
default), ``eval`` (avg@k on held-out tasks; on tau2 retail also with ``agent=oracle`` or
``agent=endpoint``, an OpenAI-compatible server), ``qd_eval`` (questioners on a retrieval QA suite:
MuSiQue, StrategyQA, 2Wiki; docs/QD.md), ``qd_label`` (Q&D forks labelled by their consequences),
``dpo`` (preference pairs), ``qd_tau2`` (the Q&D loop inside a tau2 retail agent). Short forms: ``env=K`` is ``env.kind=K``,
``agent=A`` is ``eval.agent=A``. ``python -m jaxagent.tour`` is a tour of the model
stack alone (HF round trip, scoring, KV-cache generation).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from jaxagent import configlib
from jaxagent.jobs.config import JOBS, RunConfig, load_config
from jaxagent.models.hf import CheckpointError
from jaxagent.rollout.loop import EpisodeBudgetError
from jaxagent.text.tokenizer import TokenizerError
from jaxagent.train.rl import SimulatorFailureBudget
from jaxagent.train.step import TrainingFailed

ROOT = Path(__file__).resolve().parents[1]


def _config_files() -> list[str]:
    d = ROOT / "configs"
    return sorted(str(p.relative_to(ROOT)) for p in d.glob("*.yaml")) if d.is_dir() else []


def build_parser(width: int | None = None) -> argparse.ArgumentParser:
    """The command line; ``--help`` fits ``width`` columns (default: the terminal's, 100 without one)."""
    import textwrap

    from jaxagent.models import preset_names

    width = configlib.help_width(width)

    class Formatter(argparse.RawDescriptionHelpFormatter):
        """Keeps the description's and epilog's line breaks, wrapping any line wider than the
        terminal (continuations indented under it)."""

        def __init__(self, prog):
            super().__init__(prog, width=width)

        def _fill_text(self, text, text_width, indent):
            out = []
            for line in text.splitlines():
                lead = " " * (len(line) - len(line.lstrip()))
                out += textwrap.wrap(line, text_width - len(indent), initial_indent=indent, subsequent_indent=(
                    indent + lead + "    "), break_on_hyphens=False, break_long_words=True) or [indent]
            return "\n".join(out)

    def para(label, items):
        return textwrap.fill(label + ", ".join(items), width, subsequent_indent="    ", break_on_hyphens=False)

    epilog = "\n".join([
        para("jobs: ", JOBS), "short forms: env=K (env.kind=K), agent=A (eval.agent=A)",
        para("model presets (model.preset=NAME): ", preset_names()),
        para("config files: ", _config_files() or ["(none found)"]), "",
        "keys (key=value overrides; types and defaults):", configlib.describe(RunConfig, width)])
    ap = argparse.ArgumentParser(prog="python -m jaxagent.launch", description=__doc__,
                                 formatter_class=Formatter, epilog=epilog)
    ap.add_argument("--config", help="a YAML file (see configs/); overrides follow as key=value")
    ap.add_argument("--dry-run", action="store_true",
                    help="validate the config, build the mesh and count parameters (no weights, no run)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=3e-7")
    return ap


def dry_run(cfg: RunConfig) -> dict:
    """Config valid, mesh shape, parameter count and per-device parameter bytes, through
    `jax.eval_shape`; works for meshes larger than this machine (an abstract mesh)."""
    import jax
    import numpy as np
    from jax.sharding import AbstractMesh

    from jaxagent.models import LogicalRules, make_mesh
    from jaxagent.models.qwen import init_params, param_logical_axes
    from jaxagent.models.sharding import MESH_AXES
    from jaxagent.jobs import model_config

    here = len(jax.devices())
    dims = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor]
    known = math.prod(d for d in dims if d != -1)
    wanted = known if -1 not in dims or known > here else here
    shape = cfg.mesh.shape(wanted)
    mesh = make_mesh(cfg.mesh, jax.devices()[:wanted]) if wanted <= here else AbstractMesh(shape, MESH_AXES)
    rules = LogicalRules(mesh)
    shapes_from = "model.path" if cfg.model.path else "model.preset"
    if cfg.model.path is not None and (Path(cfg.model.path) / "config.json").exists():
        qcfg = model_config(cfg, 0)
    elif cfg.model.path is not None:
        # The checkpoint is not here yet (the usual case before downloading it): check the
        # rest with the preset's architecture and say so.
        import dataclasses

        from jaxagent.models import preset

        shapes_from = f"model.preset={cfg.model.preset!r} (model.path={cfg.model.path!r} has no config.json here)"
        qcfg = preset(cfg.model.preset, dtype=model_config(dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, path=None)), 64).dtype)
    else:
        from jaxagent.jobs import build_tokenizer

        qcfg = model_config(cfg, build_tokenizer(cfg).vocab_size)
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
    return {"config": "valid", "job": cfg.job, "name": cfg.name, "mesh": dict(zip(MESH_AXES, shape)),
            "devices_needed": math.prod(shape), "devices_here": here, "abstract_mesh": wanted > here,
            "parameters": count, "parameters_millions": round(count / 1e6, 2),
            "param_bytes_per_device": per_device, "shapes_from": shapes_from, "credit": cfg.rl.credit, **lora}


#: Short forms: ``env=tau2_retail`` is ``env.kind=tau2_retail``, ``agent=oracle`` is ``eval.agent=oracle``.
ALIASES = {"env": "env.kind", "agent": "eval.agent"}


def expand_alias(override: str) -> str:
    key, _, value = override.partition("=")
    return f"{ALIASES[key]}={value}" if key in ALIASES else override


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise SystemExit(f"argument {bad[0]!r}: expected key=value (see --help for the keys)")
    args.overrides = [expand_alias(o) for o in args.overrides]
    try:
        cfg = load_config(args.config, args.overrides)
    except configlib.ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    try:
        check_paths(cfg, dry_run=args.dry_run)
        if args.dry_run:
            print(json.dumps(dry_run(cfg), indent=2))
            return 0
        from jaxagent.models.sharding import initialize_distributed

        initialize_distributed(cfg.mesh)  # multi-host runs (docs/PODS.md): before any other JAX call
        check_processes(cfg)
        check_mesh(cfg)
        from jaxagent.jobs import run_job

        summary = run_job(cfg)
    except (configlib.ConfigError, EpisodeBudgetError) as e:  # found once files, devices or the first prompt are seen
        raise SystemExit(f"config error: {e}") from None
    except (CheckpointError, TokenizerError) as e:  # a damaged or foreign input file, named
        raise SystemExit(f"error: {e}") from None
    except SimulatorFailureBudget as e:  # the user simulator kept failing (rl.failure_budget_iters, eval before)
        raise SystemExit(f"simulator failure: {e}") from None
    except TrainingFailed as e:  # updates skipped past {rl,sft}.max_skipped_share, a collapse (rl.fail_on_collapse)
        raise SystemExit(f"training failed: {e}") from None
    except FileNotFoundError as e:  # resume: no checkpoint step restores (CheckpointDamaged names each error)
        from jaxagent.train.checkpoint import CheckpointDamaged

        if isinstance(e, CheckpointDamaged):
            raise SystemExit(f"error: {e}") from None
        raise
    print(json.dumps(summary, indent=2))
    return 0


def check_paths(cfg: RunConfig, *, dry_run: bool = False) -> None:
    """``model.path`` and ``tokenizer`` exist. Before a download (``--dry-run``) a checkpoint
    directory that is not here yet is let through, with the tokenizer when it is that same
    directory: `dry_run` then takes the preset's shapes and says so."""
    from jaxagent.jobs.config import BUILTIN_TOKENIZER

    m = cfg.model
    model_absent = m.path is not None and not Path(m.path).is_dir()
    if model_absent and not dry_run:
        raise configlib.ConfigError(f"model.path={m.path!r}: not a directory; expected a Hugging Face checkpoint "
                                    "directory (config.json + *.safetensors), or null for model.preset")
    if cfg.tokenizer != BUILTIN_TOKENIZER and not Path(cfg.tokenizer).is_dir():
        same = m.path is not None and Path(cfg.tokenizer).resolve() == Path(m.path).resolve()
        if not (dry_run and model_absent and same):
            raise configlib.ConfigError(f"tokenizer={cfg.tokenizer!r}: not a directory; expected a tokenizer (or "
                                        f"checkpoint) directory holding tokenizer.json, tokenizer_config.json or "
                                        f"tokenizer.model, or {BUILTIN_TOKENIZER!r}")


def check_processes(cfg: RunConfig) -> None:
    """A multi-process run (``mesh.distributed``, docs/PODS.md) runs the policy jobs: each process
    plays its share of the episodes on its own copy of the policy, all train on all of them on the
    global mesh (`jaxagent.rollout.processes`). The host agents of ``job=eval`` (the tau2 oracle,
    an endpoint) use no mesh: they run in one process."""
    import jax

    if jax.process_count() > 1 and cfg.job in ("qd_eval", "qd_label", "qd_tau2", "serve"):
        what = "a server runs" if cfg.job == "serve" else "the Q&D evaluation and labelling run"
        raise configlib.ConfigError(f"job={cfg.job!r}: this launch is one of {jax.process_count()} processes; {what} "
                                    "in one process (mesh.distributed=false)")
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


if __name__ == "__main__":
    sys.exit(main())

"""``python -m jaxagent.launch [--config FILE] [key=value ...]``: the project's entry point.

With no arguments it runs the quickstart (the defaults of `jaxagent.jobs.config.RunConfig`): a tiny
Qwen-architecture model over the gyms' small tokenizer, an SFT warm start on expert
demonstrations mixed with noise, then RL (GRPO) on the intention gym, evaluated on held-out
tasks before and after, everything written to ``runs/quickstart/``.

    python -m jaxagent.launch                                   # the quickstart
    python -m jaxagent.launch --config configs/faca_telepathy.yaml steps=50
    python -m jaxagent.launch --config configs/infopo_7b.yaml --dry-run
    python -m jaxagent.launch --config configs/infopo_7b.yaml --plan       # will it fit? (docs/PODS.md)
    python -m jaxagent.launch --config configs/infopo_7b.yaml --fit H100   # what makes it fit an 80 GB device
    python -m jaxagent.launch resume=true                       # continue runs/quickstart/
    python -m jaxagent.launch job=eval env=tau2_retail agent=oracle   # tau2 retail, the gold-action oracle
    python -m jaxagent.launch job=qd_eval qd.benchmark=musique qd.baseline=never_ask   # Q&D questioners
    python -m jaxagent.launch --help                            # jobs, config files, every key

Jobs (``job=``), environments (``env.kind=``) and credit terms (``rl.credit=``) come from their
registries, listed by ``--help``; ``env.kind=package.module:NAME`` names your own environment
(docs/ENVIRONMENTS.md). Short forms: ``env=K`` is ``env.kind=K``, ``agent=A`` is ``eval.agent=A``.
``python -m jaxagent.tour`` is a tour of the model stack alone (HF round trip, scoring, KV-cache
generation).

This module only parses the command line; `jaxagent.jobs.launcher` loads the config and runs the job.
"""

from __future__ import annotations

import argparse
import json
import sys


def build_parser(width: int | None = None) -> argparse.ArgumentParser:
    """The command line; ``--help`` fits ``width`` columns (default: the terminal's, 100 without one)."""
    import textwrap

    from jaxagent.jobs.launcher import help_epilog, help_width

    width = help_width(width)

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

    ap = argparse.ArgumentParser(prog="python -m jaxagent.launch", description=__doc__,
                                 formatter_class=Formatter, epilog=help_epilog(width))
    ap.add_argument("--config", help="a YAML file (see configs/); overrides follow as key=value")
    ap.add_argument("--dry-run", action="store_true",
                    help="validate the config, build the mesh and count parameters (no weights, no run)")
    ap.add_argument("--plan", action="store_true",
                    help="--dry-run plus a memory plan: every jitted program of the job compiled with abstract shapes "
                         "on the configured mesh (fake CPU devices), per-device bytes, a verdict per device kind")
    ap.add_argument("--fit", metavar="DEVICE",
                    help="--plan plus the overrides that bring the job under DEVICE's memory per device (a device kind, "
                         "e.g. H100, v5e, or a size, e.g. 24GB): the step that shrinks the largest term, planned "
                         "again, until it fits (jaxagent.jobs.planfit)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=3e-7")
    return ap


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
    overrides = [expand_alias(o) for o in args.overrides]
    if args.fit is not None:
        from jaxagent.jobs.planfit import device_budget

        try:
            device_budget(args.fit)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        args.plan = True
    import os

    saved = os.environ.get("XLA_FLAGS")
    if args.plan:
        from jaxagent.jobs.launcher import fake_host_devices

        fake_host_devices(args.config, overrides)
    from jaxagent.jobs.launcher import JobError, launch

    try:
        out = launch(args.config, overrides, dry_run=args.dry_run, memory_plan=args.plan, fit=args.fit)
    except JobError as e:
        raise SystemExit(f"{e.kind}: {e}") from None
    finally:  # the fake devices were for this process's backend only: not for subprocesses started later
        if saved is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = saved
    if args.plan:  # the table on stderr, above the JSON
        from jaxagent.jobs.memplan import format_plan

        print(format_plan(out["memory"]), file=sys.stderr, flush=True)
        if "fit" in out:
            from jaxagent.jobs.planfit import format_fit

            print(format_fit(out["fit"]), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=2), flush=True)
    if not args.dry_run and out.get("run_dir"):  # last, below the summary: where everything is
        print(f"[launch] results in {out['run_dir']}/ (summary.json and the run's files)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

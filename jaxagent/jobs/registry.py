"""The job registry: what ``job=`` may name, what each runs, and how.

A `JobSpec` names the function that runs the job (``module:function``, imported when the job
runs, so listing jobs costs nothing), a line of help for ``--help``, and whether the job may run as
one of several processes of a multi-host run (docs/PODS.md). `run_job` (`jaxagent.jobs.run`) looks
the job up here; `jaxagent.jobs.config.RunConfig` checks ``job`` against `job_names`.

Adding a job: write ``run_<job>(cfg: RunConfig) -> dict`` (the summary) in a module of
``jaxagent/jobs/`` and add its `JobSpec` to `JOBS` below (or `register_job` from code that runs
before the launch): two files.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """``run``: ``"module:function"``, the function of a `RunConfig` returning the summary;
    ``help``: one line; ``multi_process``: it may run as one of several processes (the policy
    jobs: each process plays its share of the episodes); ``why_single``: what the refusal of a
    multi-process launch says otherwise."""

    name: str
    run: str
    help: str
    multi_process: bool = True
    why_single: str = ""

    def function(self) -> Callable[[Any], dict[str, Any]]:
        """The job's function, imported."""
        module, _, attr = self.run.partition(":")
        return getattr(importlib.import_module(module), attr)


_POLICY = "jaxagent.jobs.run:run_policy_job"

JOBS: dict[str, JobSpec] = {spec.name: spec for spec in (
    JobSpec("sft", "jaxagent.jobs.run:run_sft_job",
            "masked cross-entropy on the environment's demonstrations (or on sft.data rows)"),
    JobSpec("rl", _POLICY, "rollouts -> credit (rl.credit: registered credit terms) -> PPO"),
    JobSpec("sft+rl", _POLICY, "SFT then RL, evaluated before, after SFT and after (the default)"),
    JobSpec("eval", "jaxagent.jobs.run:run_eval_job",
            "avg@k on held-out tasks: the policy, or a host agent the environment offers (eval.agent)"),
    JobSpec("qd_eval", "jaxagent.jobs.qd_eval:run_qd_eval",
            "Q&D questioners on a retrieval QA suite (MuSiQue, StrategyQA, 2Wiki)", False,
            "the Q&D evaluation and labelling run in one process"),
    JobSpec("qd_label", "jaxagent.jobs.qd_label:run_qd_label", "Q&D forks labelled by their consequences", False,
            "the Q&D evaluation and labelling run in one process"),
    JobSpec("dpo", "jaxagent.jobs.offline:run_dpo",
            "DPO on preference pairs (job=qd_label's pairs.jsonl, or TRL's format: docs/DATA.md)"),
    JobSpec("qd_tau2", "jaxagent.jobs.qd_tau2:run_qd_tau2",
            "the Q&D loop inside a tau2 agent (env.tau2.domain: retail, airline)", False,
            "the Q&D evaluation and labelling run in one process"),
    JobSpec("serve", "jaxagent.jobs.serve:run_serve", "the policy behind an OpenAI-compatible HTTP API", False,
            "a server runs in one process"),
)}


def job_names() -> tuple[str, ...]:
    """The registered jobs, in registration order."""
    return tuple(JOBS)


def register_job(spec: JobSpec, *, replace: bool = False) -> JobSpec:
    """Adds ``spec`` (refused for a name already taken, unless ``replace``)."""
    if spec.name in JOBS and JOBS[spec.name] != spec and not replace:
        raise ValueError(f"job={spec.name!r}: already registered; pass replace=True to replace it")
    JOBS[spec.name] = spec
    return spec


def job_spec(name: str) -> JobSpec:
    """The spec of ``job=name``; ValueError naming the choices otherwise."""
    if name not in JOBS:
        raise ValueError(f"job={name!r}: expected one of {', '.join(map(repr, JOBS))}")
    return JOBS[name]


__all__ = ["JOBS", "JobSpec", "job_names", "job_spec", "register_job"]

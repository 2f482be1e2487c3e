"""The environment registry: every family of environments a run can name with ``env.kind``.

An `EnvSpec` says what a family offers: how to build it (`EnvSpec.build`: the per-episode
factory and the train / test task ids), its settings (its own section of the run config, or for a
plug-in ``env.options`` checked against ``settings_type``), the most reward an episode can get, its
reaction labels (Faca's polarity map reads them), whether its user acts with tools of its own,
demonstrations for SFT, host agents that ``job=eval`` can play besides the policy, and the HTTP
simulator clients whose worst case bounds the rollout loop's timeout.

    spec = resolve_env("gym")                                  # a built-in
    spec = resolve_env("examples.guess_word:ENV")              # a user's module, imported once
    setup = spec.build(EnvContext(settings=..., train_tasks=512, test_tasks=64))

The built-ins (``gym``, ``llm_user``, ``tau2``, ``tau2_retail``) are listed here by import path and
imported on first use, so naming one costs nothing until it is built. `register_env` adds one
under its name; ``env.kind=package.module:NAME`` imports ``package.module`` and takes its
attribute ``NAME`` (an `EnvSpec`, or a function of no arguments returning one). docs/ENVIRONMENTS.md
documents the protocol.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from jaxagent.envs.base import Agent, Demo, EnvFactory, Environment

#: Built-in families by name -> "module:attribute" of their `EnvSpec` (imported on first use).
BUILTIN_ENVS: dict[str, str] = {
    "gym": "jaxagent.envs.gyms.spec:GYM",
    "llm_user": "jaxagent.envs.user_env:LLM_USER",
    "tau2": "jaxagent.envs.tau2.spec:TAU2",
    "tau2_retail": "jaxagent.envs.tau2.spec:TAU2_RETAIL",
}

_PLUGIN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


@dataclasses.dataclass(frozen=True)
class EnvContext:
    """What a family is built from: its ``settings`` (a built-in's: the run's ``env`` section; a
    plug-in's: ``env.options`` checked against `EnvSpec.settings_type`, or None without one), the
    number of train and test tasks asked for, the task seed, and rollout limits some simulators
    need (``max_turns``: an LLM user's replies; ``max_reply_chars``: a reply cut before it goes
    back to the simulator, None for no limit)."""

    settings: Any = None
    train_tasks: int = 512
    test_tasks: int = 64
    task_seed: int = 0
    max_turns: int = 8
    max_reply_chars: int | None = None


@dataclasses.dataclass
class EnvSetup:
    """A built family: the factory (called once per episode) and the task ids of each split."""

    factory: EnvFactory
    train_tasks: list[str]
    test_tasks: list[str]


@dataclasses.dataclass(frozen=True)
class DemoRequest:
    """What SFT asks for: ``n`` demonstrations on train tasks; ``noise`` (the share of turns a
    random policy takes, not trained on) and ``policy`` (``expert`` or ``imitable``) where the
    family has such policies; ``seed`` picks the tasks where it draws them."""

    n: int
    noise: float = 0.0
    policy: str = "imitable"
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class HostEvalRequest:
    """``job=eval`` with a host agent (`EnvSpec.host_agents`): which agent, ``k`` runs per task,
    ``concurrency`` episodes at once, the agent's sampling ``temperature``, and ``endpoint`` (the
    agent's OpenAI-compatible server settings, for ``endpoint``)."""

    agent: str
    k: int = 1
    concurrency: int = 8
    temperature: float = 0.0
    endpoint: Any = None


@dataclasses.dataclass
class HostEvalResult:
    """What a host evaluation reports beside its episodes: one ``rows`` entry per task, the
    ``summary`` figures (avg@k and the family's own), and ``text``: a few lines for the terminal."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    text: Callable[[Mapping[str, Any]], str] | None = None


@dataclasses.dataclass
class HostEval:
    """A family's host agents for one evaluation (`EnvSpec.host_eval`): ``agent(env, seed)`` makes
    the agent of one episode; ``task_ids`` are played ``k`` times each, at most ``max_turns`` agent
    turns; ``summarize(reports)`` reads the episodes' reports (`Environment.report`, one per
    episode, failures included); ``aclose()`` releases the agents' clients."""

    agent: Callable[[Environment, int], Agent]
    task_ids: list[str]
    max_turns: int
    summarize: Callable[[list[dict[str, Any]]], HostEvalResult]
    aclose: Callable[[], Awaitable[None]] | None = None


@dataclasses.dataclass(frozen=True)
class DemoPlan:
    """Demonstrations to play through the episode runner: for each ``(task_id, seed)`` of
    ``episodes`` a fresh environment (``make_env()``) and a fresh ``agent(task_id, seed)``, at most
    ``max_turns`` agent turns (or ``max_turns(task_id)``). An agent with a ``train_turns`` list (one
    bool per turn) says which of its turns a loss trains on (default: all of them).
    `jaxagent.rollout.demos.play_demos` turns it into `Demo` objects."""

    make_env: Callable[[], Environment]
    episodes: Sequence[tuple[str, int]]
    agent: Callable[[str, int], Agent]
    max_turns: int | Callable[[str], int] = 32


def _no_clients(settings: Any) -> list:
    return []


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """A family of environments (module docstring). Only ``name`` and ``build`` are required.

    - ``build(ctx) -> EnvSetup``.
    - ``settings_type``: a plug-in's settings dataclass, filled from ``env.options`` (None: a
      built-in reading the ``env`` section itself, or a plug-in without settings).
    - ``max_reward``: the most outcome reward of one episode (a number, or a function of the settings).
    - ``reaction_labels``: the private labels its users attach to their messages (Faca).
    - ``user_tools``: whether its user acts with tools of its own (dual control).
    - ``reply_alternatives``: whether it enumerates the replies its feedback could have been
      (`EnvMessage.alternatives`; a bool, or a function of the settings): InfoPO's
      ``infopo.prior=marginal`` needs them.
    - ``demonstrations(ctx, setup, request)``: SFT data, a list of `Demo` or a `DemoPlan` (an expert
      agent's episodes, played through the runner); None: ``job=sft`` refused.
    - ``host_agents`` / ``host_eval(ctx, request, setup) -> HostEval``: agents other than the policy
      that ``job=eval`` can play (``eval.agent``), and how their reports are summarised.
    - ``needs_text_tokenizer``: its text is more than the quickstart tokenizer can spell well
      (``tokenizer=builtin:gyms`` is refused for it).
    - ``sampled_eval``: policy evaluations also sample ``eval.sampled_k`` runs per task.
    - ``simulator_clients(settings)``: (dotted key, `LLMUserConfig`) of the HTTP clients one
      environment call may use, in order (the rollout timeout must cover their worst case).
    - ``check(settings)``: cross-field checks, raising ValueError naming the key.
    - ``label(settings)``: the name in default run names (``<job>-<label>``).
    - ``eval_k``: runs per task of its evaluations when ``eval.k`` is null (tau2: 4, the papers'
      avg@4 / pass^4; the others: 1).
    """

    name: str
    build: Callable[[EnvContext], EnvSetup]
    description: str = ""
    settings_type: type | None = None
    max_reward: float | Callable[[Any], float] = 1.0
    reaction_labels: tuple[str, ...] = ()
    user_tools: bool = False
    reply_alternatives: bool | Callable[[Any], bool] = False
    demonstrations: Callable[[EnvContext, EnvSetup, DemoRequest], Sequence[Demo] | DemoPlan] | None = None
    host_agents: tuple[str, ...] = ()
    host_eval: Callable[[EnvContext, HostEvalRequest, EnvSetup], HostEval] | None = None
    needs_text_tokenizer: bool = False
    sampled_eval: bool = True
    simulator_clients: Callable[[Any], Sequence[tuple[str, Any]]] = _no_clients
    check: Callable[[Any], None] | None = None
    label: Callable[[Any], str] | None = None
    eval_k: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", self.name):
            raise ValueError(f"EnvSpec.name={self.name!r}: expected letters, digits, '_', '-' or '.' (a run "
                             "directory name part)")
        if not callable(self.build):
            raise ValueError(f"EnvSpec.build={self.build!r}: expected a function of an EnvContext")
        if isinstance(self.eval_k, bool) or not isinstance(self.eval_k, int) or self.eval_k < 1:
            raise ValueError(f"EnvSpec {self.name!r}: eval_k={self.eval_k!r}; expected an integer >= 1 (runs per task "
                             "when eval.k is null)")
        if self.host_agents and self.host_eval is None:
            raise ValueError(f"EnvSpec {self.name!r}: host_agents={self.host_agents} without host_eval")

    def top_reward(self, settings: Any) -> float:
        """`max_reward` for ``settings``."""
        return float(self.max_reward(settings) if callable(self.max_reward) else self.max_reward)

    def enumerates_replies(self, settings: Any) -> bool:
        """`reply_alternatives` for ``settings``."""
        r = self.reply_alternatives
        return bool(r(settings) if callable(r) else r)

    def run_label(self, settings: Any) -> str:
        return self.label(settings) if self.label is not None else self.name


_REGISTRY: dict[str, EnvSpec] = {}
_LOCK = threading.Lock()


def register_env(spec: EnvSpec, *, name: str | None = None, replace: bool = False) -> EnvSpec:
    """Adds ``spec`` under ``name`` (default ``spec.name``). A name already taken by another spec is
    refused unless ``replace``."""
    if not isinstance(spec, EnvSpec):
        raise TypeError(f"{spec!r}: expected a jaxagent.envs.registry.EnvSpec")
    key = name or spec.name
    with _LOCK:
        old = _REGISTRY.get(key)
        if old is not None and old is not spec and not replace:
            raise ValueError(f"env.kind={key!r}: already registered; pass replace=True to replace it")
        _REGISTRY[key] = spec
    return spec


def env_names() -> tuple[str, ...]:
    """The built-in names and those registered since, sorted."""
    return tuple(sorted(set(BUILTIN_ENVS) | set(_REGISTRY)))


def _load(target: str, kind: str) -> EnvSpec:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"env.kind={kind!r}: cannot import module {module_name!r} ({e}); expected an importable "
                         "module (run from the directory that holds it, or install it)") from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise ValueError(f"env.kind={kind!r}: module {module_name!r} has no attribute {attr!r}; expected an EnvSpec "
                         f"there (names in it: {', '.join(n for n in dir(module) if not n.startswith('_'))[:300]})")
    if not isinstance(obj, EnvSpec) and callable(obj):
        obj = obj()
    if not isinstance(obj, EnvSpec):
        raise ValueError(f"env.kind={kind!r}: {module_name}.{attr} is a {type(obj).__name__}; expected a "
                         "jaxagent.envs.registry.EnvSpec (or a function of no arguments returning one)")
    return obj


def resolve_env(kind: str) -> EnvSpec:
    """The spec ``env.kind`` names: a registered or built-in name, or ``package.module:NAME`` (imported,
    then registered under that string). ValueError naming ``env.kind`` otherwise."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"env.kind={kind!r}: expected one of {', '.join(env_names())} or package.module:NAME")
    with _LOCK:
        spec = _REGISTRY.get(kind)
    if spec is not None:
        return spec
    if kind in BUILTIN_ENVS:
        return register_env(_load(BUILTIN_ENVS[kind], kind), name=kind, replace=True)
    if ":" in kind:
        if not _PLUGIN.match(kind):
            raise ValueError(f"env.kind={kind!r}: expected package.module:NAME (dotted module path, a colon, an "
                             "attribute name)")
        return register_env(_load(kind, kind), name=kind, replace=True)
    import difflib

    close = difflib.get_close_matches(kind, env_names(), n=1)
    raise ValueError(f"env.kind={kind!r}: expected one of {', '.join(env_names())} or package.module:NAME (a user's "
                     f"EnvSpec)" + (f"; did you mean {close[0]!r}?" if close else ""))


__all__ = ["BUILTIN_ENVS", "DemoPlan", "DemoRequest", "EnvContext", "EnvSetup", "EnvSpec", "HostEval",
           "HostEvalRequest", "HostEvalResult", "env_names", "register_env", "resolve_env"]

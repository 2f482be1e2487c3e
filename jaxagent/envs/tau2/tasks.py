"""tau2-bench tasks: parsed, validated and rendered (behaviour of tau2-bench at commit a2c0247).

A task carries the customer's scenario (``user_scenario.instructions``: reason for call, known and
unknown info, task instructions), the gold actions the evaluator replays (each with its requestor:
the customer's own device actions in telecom), the strings the agent must communicate, the
natural-language assertions for an LLM judge, the env assertions (telecom: functions of either
side's toolkit that must return the expected bool), and the reward basis (which components gate
the reward). `load_task_set` reads a domain's split file (`SPLITS`: ``train``,
``test``; the file is the domain's ``task_files`` entry, else ``tasks_<split>.json``) from the data
directory (default: the domain's packaged copy) and checks every field it uses; a malformed file
fails with an error that names the task, the field, the value and what was expected, and a split
the package does not ship (airline's withheld test tasks) with one that names the missing file
(`split_file`, `check_split`).
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxagent.envs.tau2 import DEFAULT_DOMAIN, get_domain

REWARD_COMPONENTS = ("DB", "NL_ASSERTION", "COMMUNICATE", "ACTION", "ENV_ASSERTION")
#: tau2's task splits (``env.tau2.split``): ``train`` ships for every domain; ``test`` where its file is there.
SPLITS = ("train", "test")
INSTRUCTION_FIELDS = ("domain", "reason_for_call", "known_info", "unknown_info", "task_instructions")


class TaskError(ValueError):
    """A task file or task that does not have the expected shape."""


REQUESTORS = ("assistant", "user")


@dataclasses.dataclass(frozen=True)
class Action:
    """A gold action: tool ``name`` with ``arguments``; ``compare_args`` as tau2's action check
    uses it (None: the keys of the agent's call; ``()``: the name alone); ``requestor``: whose tool
    it is (``"user"``: the customer's own, in a dual-control domain)."""

    action_id: str
    name: str
    arguments: Mapping[str, Any]
    compare_args: tuple[str, ...] | None = None
    requestor: str = "assistant"


@dataclasses.dataclass(frozen=True)
class EnvAssertion:
    """An env assertion (tau2's ``EnvAssertion``): ``func_name`` of the ``env_type`` side's toolkit
    called with ``arguments`` must return a bool equal to ``assert_value``."""

    env_type: str
    func_name: str
    arguments: Mapping[str, Any]
    assert_value: bool = True
    message: str | None = None


@dataclasses.dataclass(frozen=True)
class Task:
    id: str
    instructions: Mapping[str, str | None]
    persona: str | None
    actions: tuple[Action, ...]
    communicate_info: tuple[str, ...]
    nl_assertions: tuple[str, ...]
    reward_basis: tuple[str, ...]
    initial_state: Mapping[str, Any] | None = None
    domain: str = DEFAULT_DOMAIN  # the domain whose task file it came from
    env_assertions: tuple[EnvAssertion, ...] = ()

    @property
    def write_actions(self) -> tuple[Action, ...]:
        """The gold actions that write, either requestor's (`Domain.writes`)."""
        domain = get_domain(self.domain)
        return tuple(a for a in self.actions if domain.writes(a.requestor, a.name))


def _where(i: int, tid: Any, field: str) -> str:
    return f"task[{i}] (id={tid!r}).{field}"


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise TaskError(f"{where}={value!r}: expected a list of strings or null")
    return tuple(value)


def parse_task(raw: Mapping[str, Any], i: int = 0, domain: str = DEFAULT_DOMAIN) -> Task:
    """One task dict of ``tasks_*.json`` of ``domain`` -> `Task` (raises `TaskError` naming the bad field)."""
    if not isinstance(raw, Mapping):
        raise TaskError(f"task[{i}]={type(raw).__name__}: expected a JSON object")
    tid = raw.get("id")
    if not isinstance(tid, str) or not tid:
        raise TaskError(f"task[{i}].id={tid!r}: expected a non-empty string")
    scen = raw.get("user_scenario")
    if not isinstance(scen, Mapping) or not isinstance(scen.get("instructions"), Mapping):
        raise TaskError(f"{_where(i, tid, 'user_scenario.instructions')}: expected an object with "
                        f"{', '.join(INSTRUCTION_FIELDS)}")
    ins = scen["instructions"]
    for f in INSTRUCTION_FIELDS:
        v = ins.get(f)
        required = f in ("domain", "reason_for_call", "task_instructions")
        if (v is None and required) or (v is not None and not isinstance(v, str)):
            raise TaskError(f"{_where(i, tid, 'user_scenario.instructions.' + f)}={v!r}: expected a string"
                            + ("" if required else " or null"))
    crit = raw.get("evaluation_criteria")
    if not isinstance(crit, Mapping):
        raise TaskError(f"{_where(i, tid, 'evaluation_criteria')}={crit!r}: expected an object")
    actions = []
    for j, a in enumerate(crit.get("actions") or ()):
        w = _where(i, tid, f"evaluation_criteria.actions[{j}]")
        if not isinstance(a, Mapping) or not isinstance(a.get("name"), str):
            raise TaskError(f"{w}={a!r}: expected an object with a string 'name'")
        args = a.get("arguments", {})
        if not isinstance(args, Mapping):
            raise TaskError(f"{w}.arguments={args!r}: expected an object")
        cmp = a.get("compare_args")
        requestor = a.get("requestor") or "assistant"
        if requestor not in REQUESTORS:
            raise TaskError(f"{w}.requestor={requestor!r}: expected one of {', '.join(map(repr, REQUESTORS))}")
        actions.append(Action(str(a.get("action_id", f"{tid}_{j}")), a["name"], dict(args),
                              None if cmp is None else _str_list(cmp, w + ".compare_args"), requestor))
    assertions = []
    for j, e in enumerate(crit.get("env_assertions") or ()):
        w = _where(i, tid, f"evaluation_criteria.env_assertions[{j}]")
        if not isinstance(e, Mapping) or not isinstance(e.get("func_name"), str):
            raise TaskError(f"{w}={e!r}: expected an object with a string 'func_name'")
        if e.get("env_type") not in REQUESTORS:
            raise TaskError(f"{w}.env_type={e.get('env_type')!r}: expected one of {', '.join(map(repr, REQUESTORS))}")
        args = e.get("arguments") or {}
        if not isinstance(args, Mapping):
            raise TaskError(f"{w}.arguments={args!r}: expected an object")
        value = e.get("assert_value", True)
        if not isinstance(value, bool):
            raise TaskError(f"{w}.assert_value={value!r}: expected true or false")
        message = e.get("message")
        if message is not None and not isinstance(message, str):
            raise TaskError(f"{w}.message={message!r}: expected a string or null")
        assertions.append(EnvAssertion(e["env_type"], e["func_name"], dict(args), value, message))
    basis = _str_list(crit.get("reward_basis") or ["DB", "COMMUNICATE"], _where(i, tid, "evaluation_criteria.reward_basis"))
    bad = [b for b in basis if b not in REWARD_COMPONENTS]
    if bad:
        raise TaskError(f"{_where(i, tid, 'evaluation_criteria.reward_basis')}={list(basis)!r}: expected names "
                        f"among {', '.join(REWARD_COMPONENTS)}")
    init = raw.get("initial_state")
    if init is not None and not isinstance(init, Mapping):
        raise TaskError(f"{_where(i, tid, 'initial_state')}={init!r}: expected an object or null")
    persona = scen.get("persona")
    return Task(id=tid, instructions={f: ins.get(f) for f in INSTRUCTION_FIELDS},
                persona=persona if isinstance(persona, str) else None, actions=tuple(actions),
                communicate_info=_str_list(crit.get("communicate_info"),
                                           _where(i, tid, "evaluation_criteria.communicate_info")),
                nl_assertions=_str_list(crit.get("nl_assertions"), _where(i, tid, "evaluation_criteria.nl_assertions")),
                reward_basis=basis, initial_state=init, domain=domain, env_assertions=tuple(assertions))


_CACHE: dict[tuple[str, str, str], dict[str, Task]] = {}


def split_file(data_dir: str | Path | None, split: str, domain: str = DEFAULT_DOMAIN) -> Path:
    """The task file of ``domain``'s ``split`` (one of `SPLITS`): its ``Domain.task_files`` entry, else
    tau2's name ``tasks_<split>.json``, in ``data_dir`` (None: the domain's packaged data). The file
    need not exist (`check_split`). `TaskError` naming the split and the choices for another name."""
    if split not in SPLITS:
        raise TaskError(f"split={split!r}: expected one of {', '.join(map(repr, SPLITS))}")
    d = get_domain(domain)
    return Path(data_dir or d.data_dir) / d.task_files.get(split, f"tasks_{split}.json")


def check_split(data_dir: str | Path | None, split: str, domain: str = DEFAULT_DOMAIN) -> Path:
    """`split_file` when it exists; else `FileNotFoundError` naming the file and saying whether the
    package does not ship that split (``data_dir`` None) or the given directory lacks it."""
    path = split_file(data_dir, split, domain)
    if path.is_file():
        return path
    if data_dir is None:
        shipped = [s for s in SPLITS if split_file(None, s, domain).is_file()]
        raise FileNotFoundError(
            f"split={split!r}: the tau2 {domain} {split} split is not shipped with the package ({path} does not "
            f"exist; shipped: {', '.join(shipped) or 'none'}); expected split={shipped[0] if shipped else 'train'!r}, "
            f"or env.tau2.data_dir naming a directory that holds {path.name}")
    raise FileNotFoundError(f"split={split!r}: {path} does not exist, no tau2 {domain} task file (env.tau2.data_dir="
                            f"{str(data_dir)!r}; expected a directory holding {path.name})")


def load_task_set(data_dir: str | Path | None = None, split: str = "train", *,
                  domain: str = DEFAULT_DOMAIN) -> dict[str, Task]:
    """``{task id: Task}`` in file order for ``domain``'s ``split`` (`split_file`), from ``data_dir``
    (default: the domain's packaged data). A missing file is `check_split`'s `FileNotFoundError`."""
    path = split_file(data_dir, split, domain)
    key = (str(path.resolve()), split, domain)
    if key not in _CACHE:
        check_split(data_dir, split, domain)
        _CACHE[key] = parse_task_list(json.loads(path.read_text()), str(path), domain)
    return dict(_CACHE[key])


def parse_task_list(raw: Any, source: str, domain: str = DEFAULT_DOMAIN) -> dict[str, Task]:
    """A task file's content (a JSON list of tau2 task objects) of ``domain`` -> ``{task id: Task}`` in
    order; `TaskError` naming ``source`` for another top level or a repeated id (and `parse_task`'s)."""
    if not isinstance(raw, list):
        raise TaskError(f"{source}: top level is {type(raw).__name__}; expected a list of tasks")
    tasks = [parse_task(t, i, domain) for i, t in enumerate(raw)]
    ids = [t.id for t in tasks]
    dup = sorted({x for x in ids if ids.count(x) > 1})
    if dup:
        raise TaskError(f"{source}: task ids {dup} occur more than once; expected unique ids")
    return {t.id: t for t in tasks}


def select_tasks(tasks: Mapping[str, Task], spec: str | Sequence[str] | None) -> list[str]:
    """Task ids from ``spec``: None/"all" (every task, file order), ``"a:b"`` (a slice of the file
    order), or ids separated by commas (or a list). Unknown ids are an error naming them."""
    ids = list(tasks)
    if spec is None or spec == "all":
        return ids
    if isinstance(spec, str) and ":" in spec:
        a, _, b = spec.partition(":")
        try:
            return ids[int(a) if a else None: int(b) if b else None]
        except ValueError:
            raise TaskError(f"tasks={spec!r}: expected 'all', a slice 'start:stop' or task ids") from None
    want = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s) for s in spec]
    unknown = [t for t in want if t not in tasks]
    if unknown:
        raise TaskError(f"tasks={spec!r}: unknown task ids {unknown}; expected ids among {ids[:5]}... "
                        f"({len(ids)} tasks)")
    return want


def render_instructions(task: Task) -> str:
    """The instruction block of the customer's scenario, as tau2 renders it (each label on its own
    line, its text on the next, indented by one tab)."""
    ins = task.instructions
    lines = [f"Domain: {ins['domain']}"]
    for label, f in (("Reason for call", "reason_for_call"), ("Known info", "known_info"),
                     ("Unknown info", "unknown_info"), ("Task instructions", "task_instructions")):
        if ins.get(f) is not None:
            lines.append(f"{label}:\n" + textwrap.indent(str(ins[f]), "\t"))
    return "\n".join(lines)


def render_scenario(task: Task) -> str:
    """``<scenario>`` block of the customer's system prompt: optional persona, then the instructions
    indented by one tab."""
    parts = []
    if task.persona is not None:
        parts += ["Persona:", textwrap.indent(task.persona, "\t")]
    parts += ["Instructions:", textwrap.indent(render_instructions(task), "\t")]
    return "<scenario>\n" + "\n".join(parts) + "\n</scenario>"


__all__ = [
    "INSTRUCTION_FIELDS",
    "REQUESTORS",
    "REWARD_COMPONENTS",
    "SPLITS",
    "Action",
    "EnvAssertion",
    "Task",
    "TaskError",
    "check_split",
    "load_task_set",
    "parse_task",
    "parse_task_list",
    "render_instructions",
    "render_scenario",
    "select_tasks",
    "split_file",
]

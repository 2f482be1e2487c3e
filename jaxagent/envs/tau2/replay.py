"""The replay tool: our tau2 implementation driven line by line, to compare with tau2-bench's own outputs.

    python -m jaxagent.envs.tau2.replay --domain retail|airline|telecom [--tasks FILE] < lines.jsonl > answers.jsonl
    python -m jaxagent.envs.tau2.replay --domain telecom --schemas

It reads JSON lines on stdin and writes exactly one JSON line per input line on stdout (flushed after
each); anything else goes to stderr. Lines are split on ``\\n`` only and decoded as UTF-8 here, so no
input can make the line counts differ. `handle` is the pure line handler (``handle(state, line) ->
dict``); `serve` is the loop around it. The tool is written against `Domain`
(`jaxagent.envs.tau2.domain`): ``--domain`` takes any name of `jaxagent.envs.tau2.DOMAINS`.

**Dual control** (telecom): the state holds the provider's database and the user's phone. ``user``
calls run on the user's toolkit (the 30 device tools), ``assistant`` calls on the agent's (each
side's tools only: another name is ``Tool '<name>' not found.``); after every successful call, every
environment function and the initialization, the state is synced as tau2's ``sync_tools`` syncs it
(`Domain.sync`); every answer carries both hashes (``user_db_hash`` is tau2's ``get_user_db_hash``,
null for retail and airline, which have no user database).

Commands (one key per line):

- ``{"episode": {"task_id": ID}}`` | ``{"episode": {"init": [ACTIONS]}}`` | ``{"episode": {}}`` -> ``{"db_hash",
  "user_db_hash"}``. A fresh state: with ``task_id`` the task's initial database (`scoring.initial_db`, as
  `Tau2Env.reset` builds it: the domain's data, then the task's ``initial_state``, each initialization
  action synced, then one more sync); with ``init`` the domain's data and then each action
  ``{"env_type", "func_name", "arguments"}`` run in order as tau2's ``Environment.run_env_function_call``
  runs it (`run_env_function`, synced), then the final sync of tau2's ``set_state``; with neither the
  bare data.
  Tasks come from ``--tasks FILE`` (tau2's task format: a JSON list of task objects) or else the
  domain's packaged task files. An ``episode`` line always ends the previous episode; if it fails (an
  unknown task, an initialization action that raises: tau2's ``set_state`` stops there) there is none.
- ``{"call": {"requestor", "name", "arguments"}}`` -> ``{"content", "error", "db_hash", "user_db_hash"}``.
  One tool call, executed as `Tau2Env.step` executes it (`Domain.call`: the requestor's toolkit on the
  live state, then the sync after a success; retail and airline have no sync). ``requestor`` defaults
  to ``"assistant"`` and ``arguments`` must be an object, as tau2's ``ToolCall`` requires. A ``"user"``
  call runs on the user's toolkit (telecom's phone); on a domain without user tools (retail,
  airline) it gets what tau2's ``Environment.get_response`` answers:
  ``use_user_tool`` raises ``ValueError("User tools not available")``, so the content is ``"Error: User
  tools not available"`` with error true and nothing changes (``environment/environment.py``). Either
  requestor's arguments named ``self``, ``tool_name`` or ``requestor`` get the error of tau2's
  ``make_tool_call(name, requestor=..., **arguments)`` first (`tools.make_tool_call_error`).
- ``{"env_function": {"env_type", "func_name", "arguments"}}`` -> ``{"result", "raised", "db_hash",
  "user_db_hash"}``. tau2's ``run_env_function_call`` does ``getattr(toolkit, func_name)(**arguments)``
  on the assistant's toolkit (``env_type`` ``"assistant"``) or the user's (``"user"``; None when the
  domain has no user tools, so ``'NoneType' object has no attribute ...``), returning the raw value.
  Mirrored here: the toolkit's tools (raw values before rendering: records as JSON objects, strings as
  strings), the non-tool methods of tau2's toolkit class that the domain reproduces
  (`Domain.env_functions`, `Domain.user_env_functions`; telecom: the provider's ``set_data_usage``,
  ``suspend_line_for_overdue_bill`` and its ``assert_*``, the phone's initialization functions
  (``set_user_info``, ``turn_airplane_mode_on``, ``break_apn_settings``...) and its ``assert_*``;
  each followed by the sync; retail: ``_get_order``, ``_get_user``, ``_get_product``, ``_get_item``,
  ``_get_variant``, ``_get_payment_method``, ``_is_pending_order``; airline: ``_get_user``,
  ``_get_reservation``, ``_get_flight``, ``_get_flight_instance``, ``_get_flights_from_flight_infos``,
  ``_get_new_reservation_id``, ``_get_new_payment_id``, ``_get_datetime``, ``_search_direct_flight``,
  ``_payment_for_update``), and the functions of tau2's
  ``ToolKitBase`` that read (`ToolKitBase` here: ``has_tool`` and ``tool_type`` by name, ``use_tool``,
  ``get_statistics``, ``get_db_hash``; ``_func_tools``, a dict-valued property of tau2's toolkit
  metaclass, raises ``TypeError: 'dict' object is not callable`` as there). ``result`` is the return value as JSON (a bool stays a bool);
  ``raised`` is null, or ``"<exception type>: <message>"`` when the function raised (our tools' refusals
  are reported as tau2's ``ValueError``, a record that fails validation — retail's address, airline's
  flights, passengers, payments, reservation, certificate — as pydantic's ``ValidationError``); any other attribute is tau2's ``AttributeError``. ``update_db``, ``get_tools``,
  ``tools``, ``db`` and dunder names exist on tau2's class but are not reproduced (tau2 revalidates
  the whole database through its pydantic models, or returns Python objects): those get an error line.
- ``{"score": {"task_id": ID, "messages": [{"role", "content"}, ...]}}`` -> ``{"reward", "components"}``.
  The episode's ``call`` lines (each as a tool-call message of its requestor and its tool message),
  then the given messages (role ``"assistant"`` or ``"user"``, content a string or null), scored as
  task ID's trajectory ended by the customer (termination ``user_stop``) through `scoring.score`, the
  code the episodes use. The final database is tau2's predicted state (`scoring.replay_db`: task ID's
  initial state, then the episode's calls to mutating tools of their requestor's toolkit re-executed,
  each synced and its output checked against the recorded one, then a final sync; user calls on a
  domain without user tools change nothing, so they are left out). A mismatch, which tau2's strict evaluation raises on (e.g. the
  episode did not start from task ID's initial state), is an error line. ``env_function`` lines are no
  part of the trajectory (tau2's evaluator rebuilds its state from the task and the messages only).

  Components (tau2's ``evaluator/evaluator.py``, evaluation type ``all``, the default): tau2 runs the
  environment (DB), action and communicate evaluators on every task and the NL-assertion judge only
  when ``NL_ASSERTION`` is in the task's ``reward_basis``; the reward is the product of the basis
  components. So ``components`` holds ``DB``, ``COMMUNICATE`` and ``ACTION`` always,
  ``ENV_ASSERTION`` when the task has env assertions (telecom: each run as tau2's
  ``run_env_assertion`` on the final state), and ``NL_ASSERTION`` when the basis holds it: 1.0 when the task has no assertions (tau2 makes no model
  call then), else null, since this tool has no judge. **Reward without a judge (our choice):** an
  NL_ASSERTION that cannot be computed is left out of the product, so ``reward`` is the product of the
  other basis components (DB for retail; airline's basis, DB x COMMUNICATE, and telecom's,
  ENV_ASSERTION (x ACTION), need no judge). In telecom, DB is tau2's diagnostic: both hashes against
  the gold actions replayed without the sync, as tau2's evaluator builds its target. That equals tau2's reward wherever tau2 needs no LLM (tasks
  whose assertions are empty; tau2's ``env`` evaluation type otherwise), and is an upper bound of its
  judged reward. It is NOT the offline scoring mode's DB x COMMUNICATE (`scoring.OFFLINE_BASIS`), which
  is the classic tau-bench stand-in the episodes use.
- ``--schemas`` (no stdin) -> one line ``{"tools": [...], "user_tools": [...]}``: `Domain.tool_schemas()`
  exactly as served to the agent (tau2's order and bytes), and `Domain.user_tool_schemas()` as served to
  the LLM customer (telecom's 30; ``[]`` for retail and airline).

Hashes are tau2's (`jaxagent.envs.tau2.db.db_hash` of each part); ``user_db_hash`` is null for retail and
airline (no user database). A bad line (not JSON, not UTF-8, NaN or Infinity, an
unknown command or field, a missing or mistyped field, an unknown task id, a call before any episode,
...) gets ``{"error": "..."}`` naming the field, the value and what was expected, and the tool goes on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from jaxagent.envs.tau2 import DEFAULT_DOMAIN, DOMAINS, functions, get_domain, scoring
from jaxagent.envs.tau2.domain import USER_TOOLS_UNAVAILABLE, Domain
from jaxagent.envs.tau2.functions import ToolKitBase
from jaxagent.envs.tau2.tasks import Task, load_task_set, parse_task_list
from jaxagent.envs.tau2.tools import ToolError

__all__ = ["COMMANDS", "USER_TOOLS_UNAVAILABLE", "BadLine", "ReplayState", "ToolKitBase", "encode", "handle",
           "load_tasks", "main", "new_state", "run_env_function", "schemas_line", "serve"]

COMMANDS = ("episode", "call", "env_function", "score")
REQUESTORS = ("assistant", "user")
MESSAGE_ROLES = ("assistant", "user")

_PYDANTIC_ERROR = re.compile(r"\d+ validation errors? for ")


class BadLine(ValueError):
    """A line the protocol cannot answer; its text goes back as ``{"error": ...}``."""


class NotReproduced(BadLine):
    """An environment function tau2's toolkit has that is not reproduced here."""


@dataclasses.dataclass
class ReplayState:
    """What the line handler keeps between lines: the domain, its tasks by id, and the current episode
    (``db`` None before the first ``episode`` line or after a failed one; ``calls``: the episode's
    ``call`` lines with their results, each ``{"requestor", "name", "arguments", "content", "error"}``)."""

    domain: Domain
    tasks: Mapping[str, Task]
    db: dict | None = None
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def load_tasks(domain: str = DEFAULT_DOMAIN, path: str | Path | None = None) -> dict[str, Task]:
    """``{task id: Task}`` of ``domain``: the tasks of ``path`` (tau2's task format, a JSON list of task
    objects, or an object with such a ``tasks`` list, as tau2's ``load_tasks`` reads) or, without one, of every packaged task file of the domain. Raises `TaskError` (or
    ``OSError`` / ``ValueError`` for an unreadable file) naming what is wrong."""
    if path is None:
        tasks: dict[str, Task] = {}
        for split in get_domain(domain).task_files:
            try:
                tasks.update(load_task_set(split=split, domain=domain))
            except FileNotFoundError:   # a split the package does not ship
                continue
        return tasks
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(raw, dict) and isinstance(raw.get("tasks"), list):   # tau2's load_tasks takes {"tasks": [...]} too
        raw = raw["tasks"]
    return parse_task_list(raw, str(path), domain)


def new_state(domain: str = DEFAULT_DOMAIN, tasks_file: str | Path | None = None) -> ReplayState:
    """A `ReplayState` for ``domain`` with its tasks (`load_tasks`) and no episode yet."""
    return ReplayState(get_domain(domain), load_tasks(domain, tasks_file))


# ----------------------------------------------------------------------------- environment functions
def run_env_function(domain: Domain, db: dict, env_type: str, func_name: str, arguments: Mapping[str, Any]) -> Any:
    """`functions.run_env_function` (tau2's ``run_env_function_call``, then the sync), with a function
    tau2 has that is not reproduced here reported as a bad line (`NotReproduced`)."""
    try:
        return functions.run_env_function(domain, db, env_type, func_name, arguments)
    except functions.NotReproduced as e:
        raise NotReproduced(str(e)) from None


def _raised(exc: BaseException) -> str:
    """``"<type>: <message>"`` as tau2 would raise it (our `ToolError` is tau2's ValueError, or pydantic's
    ValidationError for a record that fails validation)."""
    name = type(exc).__name__
    if isinstance(exc, ToolError):
        name = "ValidationError" if _PYDANTIC_ERROR.match(str(exc)) else "ValueError"
    return f"{name}: {exc}"


# ----------------------------------------------------------------------------- line parsing
def _reject_constant(name: str) -> Any:
    raise BadLine(f"the line holds {name}: expected standard JSON (no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadLine(f"the number {text[:40]} overflows a float: expected a finite number")
    return value


def _parse(line: str | bytes) -> Any:
    if isinstance(line, (bytes, bytearray)):
        try:
            line = bytes(line).decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadLine(f"the line is not UTF-8 ({e}): expected a JSON object") from None
    if not line.strip():
        raise BadLine("empty line: expected a JSON object with one of the keys " + ", ".join(COMMANDS))
    try:
        return json.loads(line, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise BadLine(f"the line is not JSON ({e}): expected an object with one of the keys "
                      + ", ".join(COMMANDS)) from None
    except ValueError as e:   # e.g. an integer past Python's digit limit
        if isinstance(e, BadLine):
            raise
        raise BadLine(f"the line is not usable JSON ({e})") from None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fields(body: Mapping[str, Any], where: str, required: Sequence[str], optional: Sequence[str] = ()) -> None:
    unknown = [k for k in body if k not in required and k not in optional]
    if unknown:
        raise BadLine(f"{where}: unknown field(s) {unknown}; expected {list(required) + list(optional)}")
    missing = [k for k in required if k not in body]
    if missing:
        raise BadLine(f"{where}: missing field(s) {missing}; expected {list(required) + list(optional)}")


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BadLine(f"{where}={_show(value)}: expected a string")
    return value


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise BadLine(f"{where}={_show(value)}: expected a JSON object")
    return value


def _choice(value: Any, where: str, choices: Sequence[str]) -> str:
    if value not in choices or not isinstance(value, str):
        raise BadLine(f"{where}={_show(value)}: expected one of {', '.join(map(repr, choices))}")
    return value


def _task(state: ReplayState, value: Any, where: str) -> Task:
    tid = _string(value, where)
    if tid not in state.tasks:
        ids = list(state.tasks)
        raise BadLine(f"{where}={tid!r}: unknown task id; expected one of {ids[:8]}{'...' if len(ids) > 8 else ''} "
                      f"({len(ids)} {state.domain.name} tasks)")
    return state.tasks[tid]


def _env_call(value: Any, where: str) -> tuple[str, str, dict]:
    body = _object(value, where)
    _fields(body, where, ("env_type", "func_name", "arguments"))
    return (_choice(body["env_type"], where + ".env_type", REQUESTORS),
            _string(body["func_name"], where + ".func_name"),
            _copy(_object(body["arguments"], where + ".arguments")))


def _copy(value: Any) -> Any:
    """An independent copy of a parsed JSON value (tools may keep what they are given)."""
    return json.loads(json.dumps(value))


def _jsonable(value: Any) -> Any:
    """A raw return value as a JSON value, taken now (before later calls mutate the records)."""
    return json.loads(json.dumps(value, default=str, allow_nan=False))


def _no_episode(state: ReplayState, cmd: str) -> None:
    if state.db is None:
        raise BadLine(f"{cmd} before any episode: expected an {{\"episode\": ...}} line first (or the last one failed)")


def _hashes(state: ReplayState) -> dict[str, str | None]:
    # tau2's get_db_hash and get_user_db_hash (None for a domain without a user database).
    return {"db_hash": state.domain.db_hash(state.db), "user_db_hash": state.domain.user_db_hash(state.db)}


# ----------------------------------------------------------------------------- commands
def _episode(state: ReplayState, body: dict) -> dict:
    state.db, state.calls = None, []
    _fields(body, "episode", (), ("task_id", "init"))
    if "task_id" in body and "init" in body:
        raise BadLine("episode: both task_id and init given; expected at most one of them")
    domain = state.domain
    if "task_id" in body:
        task = _task(state, body["task_id"], "episode.task_id")
        try:
            db = scoring.initial_db(task)
        except Exception as e:   # noqa: BLE001 — a task whose initial state cannot be applied
            raise BadLine(f"episode.task_id={task.id!r}: the task's initial_state failed: {e}") from None
    else:
        init = body.get("init", [])
        if not isinstance(init, list):
            raise BadLine(f"episode.init={_show(init)}: expected a list of {{env_type, func_name, arguments}} objects")
        actions = [_env_call(a, f"episode.init[{j}]") for j, a in enumerate(init)]
        db = domain.load_db(None)
        for j, (env_type, func_name, args) in enumerate(actions):
            try:
                run_env_function(domain, db, env_type, func_name, args)
            except NotReproduced as e:
                raise BadLine(f"episode.init[{j}]: {e}") from None
            except Exception as e:   # noqa: BLE001 — tau2's set_state raises: no episode
                raise BadLine(f"episode.init[{j}] ({func_name}) raised {_raised(e)}: tau2's set_state stops there, "
                              "so there is no episode") from None
        if domain.sync is not None:   # set_state's final sync
            domain.sync(db)
    state.db = db
    return _hashes(state)


def _call(state: ReplayState, body: dict) -> dict:
    _fields(body, "call", ("name", "arguments"), ("requestor",))
    requestor = _choice(body.get("requestor", "assistant"), "call.requestor", REQUESTORS)
    name = _string(body["name"], "call.name")
    args = _copy(_object(body["arguments"], "call.arguments"))
    _no_episode(state, "call")
    res = state.domain.call(state.db, requestor, name, args)   # routed per side, synced after a success
    content, error = res.content, res.error
    state.calls.append({"requestor": requestor, "name": name, "arguments": args, "content": content, "error": error})
    return {"content": content, "error": error, **_hashes(state)}


def _env_function(state: ReplayState, body: dict) -> dict:
    env_type, func_name, args = _env_call(body, "env_function")
    _no_episode(state, "env_function")
    try:
        value, raised = run_env_function(state.domain, state.db, env_type, func_name, args), None
    except NotReproduced:
        raise
    except Exception as e:   # noqa: BLE001 — what tau2's function would raise
        value, raised = None, _raised(e)
    return {"result": _jsonable(value), "raised": raised, **_hashes(state)}


def _score(state: ReplayState, body: dict) -> dict:
    _fields(body, "score", ("task_id", "messages"))
    task = _task(state, body["task_id"], "score.task_id")
    given = body["messages"]
    if not isinstance(given, list):
        raise BadLine(f"score.messages={_show(given)}: expected a list of {{role, content}} objects")
    messages = []
    for j, m in enumerate(given):
        where = f"score.messages[{j}]"
        _fields(_object(m, where), where, ("role",), ("content",))
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise BadLine(f"{where}.content={_show(content)}: expected a string or null")
        messages.append({"role": _choice(m["role"], where + ".role", MESSAGE_ROLES), "content": content})
    _no_episode(state, "score")
    transcript: list[dict[str, Any]] = []
    for c in state.calls:
        transcript.append({"role": c["requestor"], "content": None,
                           "tool_calls": [{"name": c["name"], "arguments": c["arguments"]}]})
        transcript.append({"role": "tool", "content": c["content"], "name": c["name"]})
    transcript += messages
    try:
        final = scoring.replay_db(task, state.calls)
    except scoring.ReplayMismatch as e:
        raise BadLine(f"score: {e}; tau2's strict evaluation raises here (did the episode start from task "
                      f"{task.id!r}'s initial state?)") from None
    except ValueError as e:   # the task's initial state cannot be applied
        raise BadLine(f"score: {e}") from None
    needs_judge = "NL_ASSERTION" in task.reward_basis and bool(task.nl_assertions)
    try:
        # an NL_ASSERTION that needs a judge counts as 1.0, the product's identity: left out (module docstring)
        result = scoring.score(task, final_db=final, messages=transcript, termination="user_stop", mode="tau2",
                               nl=1.0 if needs_judge else None)
    except ValueError as e:
        raise BadLine(f"score: {e}") from None
    components: dict[str, float | None] = dict(result.components)
    if needs_judge:
        components["NL_ASSERTION"] = None
    return {"reward": result.reward, "components": components}


_HANDLERS = {"episode": _episode, "call": _call, "env_function": _env_function, "score": _score}


def handle(state: ReplayState, line: str | bytes) -> dict[str, Any]:
    """The answer to one input line (a str, or bytes decoded as UTF-8) as a JSON-ready dict; updates
    ``state``. Never raises: a bad line, or anything that goes wrong on it, is ``{"error": "..."}``."""
    try:
        msg = _parse(line)
        if not isinstance(msg, dict):
            raise BadLine(f"the line is a JSON {type(msg).__name__} ({_show(msg)}): expected an object with one "
                          f"of the keys {', '.join(COMMANDS)}")
        if len(msg) != 1:
            raise BadLine(f"the line has the keys {_show(list(msg))}: expected exactly one of {', '.join(COMMANDS)}")
        cmd, body = next(iter(msg.items()))
        if cmd not in _HANDLERS:
            raise BadLine(f"unknown command {_show(cmd)}: expected one of {', '.join(COMMANDS)}")
        return _HANDLERS[cmd](state, _object(body, cmd))
    except BadLine as e:
        return {"error": str(e)}
    except RecursionError:
        return {"error": "the line is nested too deeply to handle: expected a flatter JSON object"}
    except Exception as e:   # noqa: BLE001 — the tool must go on whatever a line holds
        return {"error": f"internal error on this line ({type(e).__name__}: {e})"}


def encode(answer: Mapping[str, Any]) -> str:
    """``answer`` as one line of standard JSON (ASCII, no newline inside; an answer that cannot be encoded
    becomes an error object)."""
    try:
        return json.dumps(answer, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        return json.dumps({"error": f"internal error: the answer is not JSON-encodable ({type(e).__name__}: {e})"})


def schemas_line(domain: Domain) -> dict[str, list]:
    """``{"tools": [...], "user_tools": [...]}``: the domain's tool schemas exactly as served to the agent
    (`Domain.tool_schemas`), and its user tools (none for any domain here)."""
    return {"tools": list(domain.tool_schemas()), "user_tools": list(domain.user_tool_schemas())}


def serve(state: ReplayState, stdin: IO[bytes], stdout: IO[str]) -> int:
    """Answers every line of ``stdin`` (split on ``\\n`` only) with one line on ``stdout``, flushed after
    each; returns the number of lines answered."""
    n = 0
    for raw in stdin:
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        stdout.write(encode(handle(state, raw)) + "\n")
        stdout.flush()
        n += 1
    return n


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m jaxagent.envs.tau2.replay",
                                     description="Replay tau2 tool calls, environment functions and scoring line by "
                                                 "line (JSON lines in, one JSON line out per line).")
    parser.add_argument("--domain", default=DEFAULT_DOMAIN, choices=list(DOMAINS), help="the tau2 domain")
    parser.add_argument("--tasks", metavar="FILE", help="tasks in tau2's format (default: the packaged ones)")
    parser.add_argument("--schemas", action="store_true", help="print the served tool schemas and exit")
    args = parser.parse_args(argv)
    domain = get_domain(args.domain)
    if args.schemas:
        sys.stdout.write(encode(schemas_line(domain)) + "\n")
        sys.stdout.flush()
        return 0
    try:
        state = new_state(args.domain, args.tasks)
    except (OSError, ValueError) as e:
        print(f"replay: --tasks={args.tasks!r}: {e}", file=sys.stderr)
        return 2
    try:
        serve(state, sys.stdin.buffer, sys.stdout)
    except BrokenPipeError:   # the reader went away
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

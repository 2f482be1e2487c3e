"""tau2-bench scoring, every domain (behaviour of tau2-bench at commit a2c0247; the retail spec's §4,
the airline spec's §5).

Components, each 0 or 1:

- **DB**: the episode's final state hashed (`Domain.state_hash`: the database, and the user's
  database in a dual-control domain) equals the target: a fresh state on which the task's gold
  actions were executed in order (failing gold actions change nothing; tau2 replays them without
  the sync between the two databases, so in telecom the target often differs from the gold run's
  end state and DB is a diagnostic there).
- **ENV_ASSERTION** (telecom): every env assertion of the task holds on the final state
  (`functions.run_assertion`); 1 when the task has none.
- **COMMUNICATE**: every ``communicate_info`` string, lower-cased, is a substring of some assistant
  text message lower-cased with its commas removed (1 when the list is empty).
- **ACTION** (diagnostic in retail): every gold action is matched by some call of the episode.
- **NL_ASSERTION**: an LLM judge reads the transcript and says whether each assertion is met (1
  when the list is empty, without a call).

Scoring modes (every report carries its mode):

- ``"tau2"``: the task's ``reward_basis`` (DB x NL_ASSERTION for most retail tasks; DB x COMMUNICATE
  for every airline task, which needs no judge; ENV_ASSERTION, x ACTION on transfer tasks, for
  telecom), the NL component from an OpenAI-compatible judge. Comparable with tau2 runs of the
  same task set.
- ``"offline"``: DB x COMMUNICATE, the classic tau-bench scoring, with no model call. A project
  choice (spec §4.6), NOT tau2's scoring: never compare it with tau2 leaderboard numbers. A domain
  whose tasks need no judge at all (telecom: env assertions and actions only, `JUDGE_FREE`) is
  scored by its ``reward_basis`` in this mode too: tau2's own scoring, with no model call.

Only episodes that ended by a customer stop (or an agent stop) are scored; any other ending
(max steps, too many tool errors, an agent protocol error, a simulator failure) gets reward 0
(the components are still computed, as diagnostics).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxagent.envs.tau2 import get_domain
from jaxagent.envs.tau2.functions import run_assertion, run_env_function
from jaxagent.envs.tau2.tasks import Task

SCORING_MODES = ("offline", "tau2")
SCORED_TERMINATIONS = ("user_stop", "agent_stop")
OFFLINE_BASIS = ("DB", "COMMUNICATE")
JUDGE_FREE = frozenset({"telecom"})
"""Domains whose tasks never need a judge (no NL assertions, no communicate strings: env assertions
and actions): their ``reward_basis`` is tau2's scoring in every mode."""


class InitialStateError(ValueError):
    """A task's ``initial_state`` that cannot be applied."""


def _merge(dst: dict, src: Mapping[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, Mapping) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = json.loads(json.dumps(v))


def initial_db(task: Task, data_dir: str | Path | None = None) -> dict:
    """A fresh state for ``task``: the domain's database (and the user's, in a dual-control
    domain), then the task's ``initial_state`` when present (``initialization_data.agent_data``
    merged in, then ``initialization_actions`` run in order as tau2's environment functions,
    `functions.run_env_function`, each followed by the sync; then one more sync; a failing action is
    an error naming it). No retail or airline task at this release has one; every telecom task has."""
    domain = get_domain(task.domain)
    db = domain.load_db(data_dir)
    init = task.initial_state
    if not init:
        return db
    history = init.get("message_history")
    if history:
        raise InitialStateError(f"task {task.id!r}: initial_state.message_history with {len(history)} messages; "
                                "expected none (episodes start from the greeting)")
    data = (init.get("initialization_data") or {}).get("agent_data")
    if init.get("initialization_data") and domain.has_user_tools:
        raise InitialStateError(f"task {task.id!r}: initial_state.initialization_data in the dual-control domain "
                                f"{domain.name!r}: not supported (no tau2 task has it); expected initialization_actions")
    if data:
        _merge(db, data)
    for j, act in enumerate(init.get("initialization_actions") or ()):
        name, args = act.get("func_name") or act.get("name"), act.get("arguments", {})
        try:
            run_env_function(domain, db, act.get("env_type") or "assistant", name, args)
        except Exception as e:   # noqa: BLE001 — tau2's set_state raises: the task cannot start
            raise InitialStateError(f"task {task.id!r}: initial_state.initialization_actions[{j}] ({name}) failed: "
                                    f"{type(e).__name__}: {e}") from None
    if domain.sync is not None:
        domain.sync(db)
    return db


def target_db(task: Task, data_dir: str | Path | None = None) -> dict:
    """The gold end state: `initial_db` with the task's gold actions executed in order by their
    requestors, failures ignored, without the sync (tau2's ``make_tool_call``; spec §4.3)."""
    db = initial_db(task, data_dir)
    domain = get_domain(task.domain)
    for a in task.actions:
        domain.call(db, a.requestor, a.name, dict(a.arguments), sync=False)
    return db


class ReplayMismatch(RuntimeError):
    """Re-executing a recorded write gave another output than the episode recorded (tau2's strict
    evaluation aborts on it)."""


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def replay_db(task: Task, calls: Sequence[Mapping[str, Any]], data_dir: str | Path | None = None, *,
              strict: bool = True) -> dict:
    """tau2's predicted state (spec §4.3): a fresh `initial_db`, then every recorded call to a
    mutating tool of its requestor's toolkit re-executed in order, each synced after a success
    (unknown tools and reads skipped), then a final sync. Each call is a mapping with ``name``,
    ``arguments``, the recorded ``content`` and optionally ``requestor`` (default ``"assistant"``);
    in ``strict`` mode an output that differs from the recorded one (both parsed as JSON when
    possible) raises `ReplayMismatch`."""
    domain = get_domain(task.domain)
    db = initial_db(task, data_dir)
    for i, c in enumerate(calls):
        requestor = c.get("requestor") or "assistant"
        if not domain.writes(requestor, c["name"]):
            continue
        res = domain.call(db, requestor, c["name"], c["arguments"])
        if strict and "content" in c and _parsed(res.content) != _parsed(c["content"]):
            raise ReplayMismatch(f"task {task.id!r}: call {i} ({c['name']}) re-executed to {res.content[:200]!r}; "
                                 f"the episode recorded {str(c['content'])[:200]!r}")
    if domain.sync is not None:
        domain.sync(db)
    return db


_TARGET_HASHES: dict[tuple[str, str, str], str] = {}


def target_hash(task: Task, data_dir: str | Path | None = None) -> str:
    """`Domain.state_hash` of `target_db`, cached per (data directory, task id, gold actions, initial
    state)."""
    what = json.dumps([[a.requestor, a.name, a.arguments] for a in task.actions] + [task.initial_state],
                      sort_keys=True)
    domain = get_domain(task.domain)
    key = (str(Path(data_dir or domain.data_dir).resolve()), task.id, what)
    if key not in _TARGET_HASHES:
        _TARGET_HASHES[key] = domain.state_hash(target_db(task, data_dir))
    return _TARGET_HASHES[key]


def env_assertion_reward(task: Task, state: dict) -> tuple[float, list[bool]]:
    """ENV_ASSERTION: 1.0 when every env assertion of ``task`` holds on ``state`` (each run as
    tau2's ``run_env_assertion``, which syncs ``state``: pass a state that may be synced, e.g. the
    replayed final one), and which held. An assertion whose function raises counts as not held."""
    domain = get_domain(task.domain)
    held = []
    for a in task.env_assertions:
        try:
            held.append(run_assertion(domain, state, a))
        except Exception:   # noqa: BLE001 — tau2 would abort the evaluation: no credit
            held.append(False)
    return float(all(held)), held


def _norm(text: str) -> str:
    return text.lower().replace(",", "")


def communicate_reward(task: Task, assistant_texts: Iterable[str]) -> float:
    """1.0 when every ``communicate_info`` string occurs in some assistant text (spec §4.5)."""
    texts = [_norm(t) for t in assistant_texts if t]
    return float(all(any(s.lower() in t for t in texts) for s in task.communicate_info))


def action_matches(gold_name: str, gold_args: Mapping[str, Any], compare_args: Sequence[str] | None,
                   name: str, args: Mapping[str, Any]) -> bool:
    """tau2's action match: same name, and the two argument dicts restricted to the compared keys
    are equal (None: the keys of the episode's call, so an extra key there fails the match; a key
    absent from both compares equal)."""
    if name != gold_name or not isinstance(args, Mapping):
        return False
    keys = set(args) if compare_args is None else set(compare_args)
    return {k: v for k, v in gold_args.items() if k in keys} == {k: v for k, v in args.items() if k in keys}


def action_reward(task: Task, calls: Iterable[tuple[str, Mapping[str, Any]]]) -> float:
    """1.0 when every gold action is matched by some call (spec §4.4; diagnostic in retail)."""
    calls = list(calls)
    return float(all(any(action_matches(a.name, a.arguments, a.compare_args, n, c) for n, c in calls)
                     for a in task.actions))


# ----------------------------------------------------------------------------- NL assertions judge
JUDGE_SYSTEM_PROMPT = """\
You grade a customer-service conversation between an agent and a customer. You are given the
transcript, one message per line as "role: content", and a list of expected outcomes. For each
expected outcome decide, from the transcript alone, whether the conversation satisfies it.

Answer with one JSON object and nothing else:
{"results": [{"expectedOutcome": "<the outcome, verbatim>", "reasoning": "<one or two sentences>", \
"metExpectation": true or false}, ...]}
with one entry per expected outcome, in the order given."""


def transcript_lines(messages: Sequence[Mapping[str, Any]]) -> str:
    """One line per message, ``role: content`` (a tool-call message with no text shows ``None``)."""
    out = []
    for m in messages:
        content = m.get("content")
        out.append(f"{m['role']}: {content if content else None}")
    return "\n".join(out)


def judge_messages(task: Task, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    user = ("Transcript:\n" + transcript_lines(messages) + "\n\nExpected outcomes:\n"
            + "\n".join(f"- {a}" for a in task.nl_assertions))
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_verdicts(text: str, n: int) -> tuple[list[bool] | None, str | None]:
    """The judge's ``metExpectation`` flags (None and a reason when the reply is not usable)."""
    m = re.search(r"\{.*\}", text, re.DOTALL)
    if m is None:
        return None, "no JSON object in the judge's reply"
    try:
        data = json.loads(m.group(0))
    except json.JSONDecodeError as e:
        return None, f"judge reply is not valid JSON ({e})"
    results = data.get("results") if isinstance(data, Mapping) else None
    if not isinstance(results, list) or len(results) != n:
        return None, f"judge reply has {len(results) if isinstance(results, list) else 'no'} results; expected {n}"
    flags = [r.get("metExpectation") if isinstance(r, Mapping) else None for r in results]
    if not all(isinstance(f, bool) for f in flags):
        return None, "judge reply: every result needs a boolean metExpectation"
    return flags, None


async def judge_nl(client, task: Task, messages: Sequence[Mapping[str, Any]]) -> tuple[float, dict[str, Any]]:
    """NL_ASSERTION through an OpenAI-compatible judge (`LLMUserClient.complete`): 1.0 when every
    assertion is met. An unusable reply scores 0 and says why; an HTTP failure raises."""
    if not task.nl_assertions:
        return 1.0, {"verdicts": []}
    text, _ = await client.complete(judge_messages(task, messages))
    flags, err = parse_verdicts(text, len(task.nl_assertions))
    if flags is None:
        return 0.0, {"error": err, "raw": text[:500]}
    return float(all(flags)), {"verdicts": flags}


# ----------------------------------------------------------------------------- the report
@dataclasses.dataclass(frozen=True)
class Score:
    """An episode's score. ``reward`` is the product of the ``basis`` components when the episode
    ended in a scored way (``scored``), else 0. ``components`` holds every component computed
    (DB, COMMUNICATE, ACTION always; NL_ASSERTION when judged), diagnostics included."""

    reward: float
    mode: str
    basis: tuple[str, ...]
    scored: bool
    termination: str
    components: Mapping[str, float]
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"reward": self.reward, "scoring_mode": self.mode, "basis": list(self.basis), "scored": self.scored,
                "termination": self.termination, "components": dict(self.components), "details": dict(self.details)}


def score(task: Task, *, final_db: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], termination: str,
          mode: str = "offline", nl: float | None = None, data_dir: str | Path | None = None,
          details: Mapping[str, Any] | None = None) -> Score:
    """Scores one episode from its final database and transcript (OpenAI-format messages:
    assistant messages with ``content`` and ``tool_calls`` [{name, arguments}]). In mode ``tau2``
    the NL component ``nl`` must be given when the basis holds NL_ASSERTION."""
    if mode not in SCORING_MODES:
        raise ValueError(f"mode={mode!r}: expected one of {', '.join(SCORING_MODES)}")
    texts = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
    # every tool call of the trajectory, the agent's and (dual control) the customer's own
    calls = [(c["name"], c["arguments"]) for m in messages for c in (m.get("tool_calls") or ())]
    domain = get_domain(task.domain)
    comps = {"DB": float(domain.state_hash(final_db) == target_hash(task, data_dir)),
             "COMMUNICATE": communicate_reward(task, texts), "ACTION": action_reward(task, calls)}
    if task.env_assertions or "ENV_ASSERTION" in task.reward_basis:
        comps["ENV_ASSERTION"], held = env_assertion_reward(task, final_db)
        details = {**(details or {}), "env_assertions": held}
    basis = OFFLINE_BASIS if mode == "offline" and task.domain not in JUDGE_FREE else tuple(task.reward_basis)
    if "NL_ASSERTION" in basis or nl is not None:
        if nl is None:
            nl = 1.0 if not task.nl_assertions else None
        if nl is None:
            raise ValueError(f"task {task.id!r}: scoring mode 'tau2' needs the NL_ASSERTION judge's verdict "
                             "(configure env.tau2.judge) or scoring mode 'offline'")
        comps["NL_ASSERTION"] = float(nl)
    missing = [b for b in basis if b not in comps]
    if missing:
        raise ValueError(f"task {task.id!r}: reward_basis component(s) {missing} cannot be computed here (tau2 "
                         f"{task.domain}); expected components among {sorted(comps)}")
    scored = termination in SCORED_TERMINATIONS
    reward = 1.0
    for b in basis:
        reward *= comps[b]
    return Score(reward=reward if scored else 0.0, mode=mode, basis=tuple(basis), scored=scored,
                 termination=termination, components=comps, details=dict(details or {}))


__all__ = [
    "JUDGE_FREE",
    "JUDGE_SYSTEM_PROMPT",
    "OFFLINE_BASIS",
    "SCORED_TERMINATIONS",
    "SCORING_MODES",
    "InitialStateError",
    "ReplayMismatch",
    "Score",
    "action_matches",
    "action_reward",
    "communicate_reward",
    "env_assertion_reward",
    "initial_db",
    "judge_messages",
    "judge_nl",
    "parse_verdicts",
    "replay_db",
    "score",
    "target_db",
    "target_hash",
    "transcript_lines",
]

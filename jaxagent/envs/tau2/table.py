"""A Markdown table across tau2 evaluations (domains, splits, agents), from their ``summary.json``.

    python -m jaxagent.envs.tau2.table runs/eval-tau2_retail runs/eval-tau2_airline [runs/x/summary.json ...]

Each argument is a ``job=eval`` run directory of a tau2 host evaluation (``agent=oracle|endpoint``)
or its ``summary.json`` (`jaxagent.envs.tau2.harness.summarize` wrote it). One row per run:
domain, split, agent, tasks, k, avg reward (avg@k), pass^1..pass^K (K the largest k; ``-`` where a
run has fewer), the mean of DB and COMMUNICATE (and NL_ASSERTION / ENV_ASSERTION where some run
computed them), and the scoring basis with what it left out. `markdown_table` is the function,
`load_summary` reads one run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxagent.envs.tau2.harness import pass_hats

#: The keys a row needs (a summary of this version's `jaxagent.envs.tau2.harness.summarize`).
REQUIRED = ("domain", "split", "tasks", "k", "reward", "pass_hat_1", "components", "scoring_mode")
#: The component columns: always DB and COMMUNICATE; these where some run computed them.
OPTIONAL_COMPONENTS = ("NL_ASSERTION", "ENV_ASSERTION")


def load_summary(path: str | Path) -> dict[str, Any]:
    """The summary of one run: ``path`` is its directory (holding ``summary.json``) or the file.
    ValueError naming the file and the keys it lacks when it is not a tau2 evaluation's summary."""
    p = Path(path)
    f = p / "summary.json" if p.is_dir() else p
    if not f.is_file():
        raise ValueError(f"{path}: no summary.json there; expected a job=eval run directory or its summary.json")
    data = json.loads(f.read_text(encoding="utf-8"))
    missing = [k for k in REQUIRED if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{f}: lacks {', '.join(missing)}; expected the summary.json of a tau2 job=eval with "
                         "agent=oracle or endpoint (written by jaxagent.envs.tau2.harness.summarize)")
    return dict(data, source=str(f))


def _num(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"


def _scoring(s: Mapping[str, Any]) -> str:
    sc = s.get("scoring") or {}
    text = f"{s['scoring_mode']}: {sc.get('reward', '?')}"
    if sc.get("left_out"):
        text += f" ({', '.join(sc['left_out'])} left out)"
    return text


def markdown_table(summaries: Sequence[Mapping[str, Any]]) -> str:
    """The Markdown table of ``summaries`` (module docstring), one row each, in the given order."""
    if not summaries:
        raise ValueError("summaries: empty; expected at least one evaluation summary")
    top = max(int(s["k"]) for s in summaries)
    comps = ["DB", "COMMUNICATE"] + [c for c in OPTIONAL_COMPONENTS if any(c in s["components"] for s in summaries)]
    head = ["domain", "split", "agent", "tasks", "k", "avg reward", *(f"pass^{j}" for j in range(1, top + 1)),
            *comps, "scoring"]
    rows = [head, ["---"] * len(head)]
    for s in summaries:
        hat = pass_hats(s)
        rows.append([str(s["domain"]), str(s["split"]), str(s.get("agent", "?")), str(s["tasks"]), str(s["k"]),
                     _num(s["reward"]), *(_num(hat.get(j)) for j in range(1, top + 1)),
                     *(_num(s["components"].get(c)) for c in comps), _scoring(s)])
    return "\n".join("| " + " | ".join(cell.replace("|", "/") for cell in r) + " |" for r in rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxagent.envs.tau2.table", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="job=eval run directories (or their summary.json)")
    args = ap.parse_args(argv)
    try:
        table = markdown_table([load_summary(r) for r in args.runs])
    except ValueError as e:  # json.JSONDecodeError included
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table)
    return 0


__all__ = ["load_summary", "main", "markdown_table"]

if __name__ == "__main__":
    raise SystemExit(main())

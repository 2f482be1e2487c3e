#!/usr/bin/env python3
"""RL that learns: GRPO from an SFT warm start against an lr = 0 control with identical rollouts.

The code is `jaxagent.jobs.experiments.rl_learns` (its docstring has the options); this file keeps the
documented command `python3 scripts/bench_rl_learns.py ...` working from a source checkout."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxagent.jobs.experiments.rl_learns import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

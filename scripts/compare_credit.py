#!/usr/bin/env python3
"""Credit assignment compared: GRPO vs InfoPO vs Faca vs InfoPO+Faca, the InfoPO ablations and the controls.

The code is `jaxagent.jobs.experiments.credit_grid` (its docstring has the options); this file keeps the
documented command `python3 scripts/compare_credit.py ...` working from a source checkout."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxagent.jobs.experiments.credit_grid import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

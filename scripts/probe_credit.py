#!/usr/bin/env python3
"""Where does a turn-level credit term push? A diagnostic of InfoPO's information-gain term.

The code is `jaxagent.jobs.experiments.probe_credit` (its docstring has the options); this file keeps the
documented command `python3 scripts/probe_credit.py ...` working from a source checkout."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxagent.jobs.experiments.probe_credit import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

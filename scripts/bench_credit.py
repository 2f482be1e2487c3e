#!/usr/bin/env python3
"""The credit methods compared where their mechanisms are active: InfoPO on telepathy (binary
outcome, a weak warm start: most groups all-zero), Faca on intention (reactions that differ inside
failing groups).

The code is `jaxagent.jobs.experiments.credit_bench` (its docstring has the settings, conditions
and output); this file keeps the documented command working from a source checkout:

    python3 scripts/bench_credit.py --setting infopo_telepathy
    python3 scripts/bench_credit.py --setting faca_intention
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxagent.jobs.experiments.credit_bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

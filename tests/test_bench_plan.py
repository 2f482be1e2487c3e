"""scripts/bench_plan.py runs end to end on a small shape (it broke once silently when a helper it
imports moved): the plan and the measured run of the same compiled update, in fresh processes."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_plan_plans_and_measures_the_same_update():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_plan.py"), "--presets", "tiny-qwen2",
                          "--capacity", "512", "--rows", "8"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    run, summary = rows[0], rows[-1]
    assert run["preset"] == "tiny-qwen2" and run["update_finite"] == 1.0
    assert run["planned_bytes"] > run["plan_temp_bytes"] > 0 and run["measured_runtime_bytes"] > 0
    assert run["run_peak_rss"] > run["bare_jax_peak_rss"] > 0
    assert run["plan_host_bytes"] >= run["plan_host_compile_bytes"] > 0  # the plan's own process measured (Linux)
    assert run["planned_cpu_run_bytes"] == run["planned_bytes"] + run["plan_host_bytes"]
    assert summary["bench"] == "plan" and "ratio_cpu_run_plan_over_measured_tiny-qwen2" in summary
    assert summary["ratio_plan_over_measured_runtime_tiny-qwen2"] > 0

"""`scripts/bench_serve.py --soak`: a few seconds of mixed traffic (good, bad, abandoned, large)
against one tiny server give the JSON line's keys, no server error, no request left in flight
and a clean exit; and the soak's mix and outcome classes by hand. Latency figures are the
benchmark's (docs/BENCHMARKS.md), never asserted here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_serve.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_serve", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_mix_and_the_outcome_classes():
    b = _module()
    assert b.parse_mix("good=3,bad=1") == {"good": 0.75, "bad": 0.25, "abandoned": 0.0, "large": 0.0}
    for bad in ("good=1,evil=1", "good=x", "good=-1", "good=0"):
        with pytest.raises(SystemExit, match="--soak-mix"):
            b.parse_mix(bad)
    S = b.Soak
    assert S.is_server_error("500") and S.is_server_error("504") and S.is_server_error("stream_error")
    assert not S.is_server_error("413") and not S.is_server_error("hung_up")
    assert S.is_conn_error("conn_error:ConnectionResetError") and S.is_conn_error("client_timeout")
    assert S.expected("good", "chat", "200") and S.expected("good", "chat", "429")
    assert not S.expected("good", "chat", "400")
    assert S.expected("bad", "lone_surrogate", "400") and not S.expected("bad", "garbage_tools", "200")
    assert S.expected("large", "over_chunked", "413") and not S.expected("large", "over_chunked", "200")
    assert S.expected("large", "under_padded", "200") and S.expected("large", "under_long_prompt", "400")
    assert S.expected("abandoned", "after_send", "hung_up")
    code, at, continued = S._parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 413 Too Large\r\nA: b\r\n\r\n{}")
    assert (code, continued) == (413, True) and at == len(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 413 Too Large"
                                                          b"\r\nA: b\r\n\r\n")
    assert S._parse(b"HTTP/1.1 200 OK\r\n")[0] is None
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0 and "--soak-clients" in out.stdout, out.stderr[-2000:]


@pytest.mark.slow
def test_a_short_soak_reports_its_outcomes_and_leaves_nothing_in_flight(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    cmd = [sys.executable, str(SCRIPT), "--soak", "0.1", "--soak-clients", "4", "--soak-baseline-s", "2",
           "--soak-settle-s", "10", "--slots", "2", "--runs-dir", str(tmp_path),
           "--set", "serve.warmup=false"]  # the engine compiles on demand: a quicker start
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == "serve_soak" and result["minutes"] == 0.1 and result["clients"] == 4
    for key in ("outcomes", "by_kind", "server_errors", "connection_errors", "client_timeouts", "unexpected",
                "samples", "good_latency_s", "health_latency_s", "end", "inflight", "lanes_busy", "leaked_lanes",
                "server", "bars", "requests", "requests_per_s", "mix", "max_body_bytes"):
        assert key in result, key
    assert set(result["outcomes"]) == set(result["by_kind"]) == {"good", "bad", "abandoned", "large"}
    assert result["requests"] == sum(sum(v.values()) for v in result["by_kind"].values()) > 0
    assert set(result["good_latency_s"]) >= {"baseline", "soak", "p50_ratio", "p95_ratio"}
    assert set(result["health_latency_s"]) >= {"quiet", "baseline", "soak", "p95_ratio_to_quiet"}
    assert result["health_latency_s"]["soak"]["n"] > 0 and result["good_latency_s"]["baseline"]["n"] > 0
    assert result["server_errors"] == 0, result["samples"]
    assert result["leaked_lanes"] == 0 and result["end"]["lanes_busy"] == 0, result["end"]
    server = result["server"]
    assert server["exit_code"] == 0 and not server["traceback"] and not server["task_destroyed"], server
    assert Path(server["stderr_log"]).is_file() and "jaxagent serve:" in Path(server["stderr_log"]).read_text()
    assert server["summary"]["requests"] >= 1
    err = proc.stderr
    assert "bench_serve: soak: tiny-qwen2, one server" in err
    assert "bench_serve:   server: jaxagent serve: stopped (SIGTERM)" in err  # the server's lines forwarded
    assert "results above (JSON on stdout); record them in docs/BENCHMARKS.md" in err.splitlines()[-1]

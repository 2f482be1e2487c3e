"""scripts/bench_async_rl.py's user latency: the distribution it claims, the same for every arm,
and the proxy holding a call over real HTTP."""

import asyncio
import importlib.util
import math
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_async_rl", ROOT / "scripts" / "bench_async_rl.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_latency_has_the_stated_median_and_p95_and_depends_on_the_key_only():
    d = np.asarray([bench.draw_latency(f"task/{i}/0", 0.5, 2.0) for i in range(20000)])
    # 20,000 draws: the sample quantiles' standard errors are about 1% (median) and 2% (p95)
    assert abs(np.median(d) / 0.5 - 1) < 0.04 and abs(np.quantile(d, 0.95) / 2.0 - 1) < 0.08
    assert bench.draw_latency("a/0/3", 0.5, 2.0) == bench.draw_latency("a/0/3", 0.5, 2.0)
    assert math.isclose(bench.lognormal_sigma(0.5, 2.0), math.log(4) / 1.6448536269514722)
    with pytest.raises(ValueError, match="median=2.0, p95=0.5"):
        bench.lognormal_sigma(2.0, 0.5)


class _Inner:
    def __init__(self):
        self.closed = False

    async def reset(self, task_id, seed):
        return "reset"

    async def step(self, message):
        return f"step {message}"

    def outcome_reward(self):
        return 1.0

    async def aclose(self):
        self.closed = True


def test_a_slow_user_answers_after_the_proxy_held_the_call():
    proxy = bench.LatencyProxy(0.05, 0.2)
    env = bench.SlowUsers(lambda: _Inner(), proxy.url)()

    async def main():
        t0 = time.perf_counter()
        r = await env.reset("t1", 0)
        s = await env.step("hi")
        await env.aclose()
        return r, s, time.perf_counter() - t0

    r, s, wall = asyncio.run(main())
    held = bench.draw_latency("t1/0/0", 0.05, 0.2) + bench.draw_latency("t1/0/1", 0.05, 0.2)
    assert (r, s) == ("reset", "step hi") and env.inner.closed and env.outcome_reward() == 1.0
    assert proxy.calls == 2 and math.isclose(proxy.held_s, held) and wall >= held

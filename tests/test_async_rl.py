"""Asynchronous RL (`jaxagent.train.async_rl`, ``rl.max_staleness``): the truncated importance
weights and the weighted policy loss by hand, the batch bookkeeping, the synchronous loop kept bit
for bit at K = 0, and a real asynchronous job with partial rollouts and an evaluation in between."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.credit.losses import PPOConfig, policy_loss, truncated_is_weights
from jaxagent.launch import main
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.train.async_rl import Group, take_fresh
from jaxagent.train.rl import RLSettings


def test_truncated_is_weights_by_hand():
    prox = jnp.log(jnp.asarray([[0.5, 0.3, 0.9, 0.7]]))
    mu = jnp.log(jnp.asarray([[0.25, 0.6, 0.1, 0.01]]))
    mask = jnp.asarray([[1, 1, 1, 0]])
    w, cut = truncated_is_weights(prox, mu, mask, cap=3.0)
    # ratios 2, 0.5, 9 (cut to 3); the unmasked token weighs 1 whatever its ratio (70)
    np.testing.assert_allclose(np.asarray(w), [[2.0, 0.5, 3.0, 1.0]], rtol=1e-6)
    assert np.asarray(cut).tolist() == [[False, False, True, False]]
    with pytest.raises(ValueError, match="cap=0"):
        truncated_is_weights(prox, mu, mask, cap=0)


def test_policy_loss_weights_each_token_by_its_importance_weight():
    logp = jnp.log(jnp.asarray([[0.5, 0.3, 0.9]]))
    adv = jnp.asarray([[1.0, -2.0, 0.5]])
    mask = jnp.ones((1, 3))
    w = jnp.asarray([[2.0, 0.5, 3.0]])
    cfg = PPOConfig()
    loss, m = policy_loss(logp, logp, adv, mask, config=cfg, is_weight_BL=w)
    # ratio 1 everywhere: the token loss is -A * w, token-mean aggregated
    assert math.isclose(float(loss), -(1 * 2 + (-2) * 0.5 + 0.5 * 3) / 3, rel_tol=1e-6)
    assert math.isclose(float(m["is_weight_mean"]), (2 + 0.5 + 3) / 3, rel_tol=1e-6)
    # d loss / d logp = -A * w * ratio / n (the weight is a constant: no gradient through it)
    g = jax.grad(lambda lp: policy_loss(lp, logp, adv, mask, config=cfg, is_weight_BL=w)[0])(logp)
    np.testing.assert_allclose(np.asarray(g), -np.asarray(adv * w) / 3, rtol=1e-6)
    # weights of 1 are the unweighted loss
    same, _ = policy_loss(logp, logp, adv, mask, config=cfg, is_weight_BL=jnp.ones((1, 3)))
    plain, _ = policy_loss(logp, logp, adv, mask, config=cfg)
    assert float(same) == float(plain)


def _group(index, versions, started=0):
    trajs = [Trajectory(task_id="t", group_id=index, tokens=[], logprobs=[], spans=[], turn_rewards=[],
                        outcome_reward=0.0, reaction_labels=[], termination="done", info={"policy_versions": v})
             for v in versions]
    return Group(index, trajs, started)


def test_take_fresh_takes_in_finish_order_and_drops_what_is_too_old():
    ready = [_group(3, [[4, 5], [5]]), _group(1, [[3, 4]]), _group(0, [[], []], started=5),
             _group(2, [[5, 5]]), _group(4, [[4]])]
    assert [g.oldest() for g in ready] == [4, 3, 5, 5, 4]
    taken, dropped = take_fresh(ready, 5, 1, 2)
    assert [g.index for g in taken] == [3, 0]  # staleness 1 and 0 (no turn: its start version)
    assert [g.index for g in dropped] == [1]  # staleness 2 > 1
    assert [g.index for g in ready] == [2, 4]  # kept for the next batch, in order
    taken, dropped = take_fresh(ready, 6, 1, 5)
    assert [g.index for g in taken] == [2] and [g.index for g in dropped] == [4]
    assert ready == []


@pytest.mark.parametrize("field, value, needle", [
    ("max_staleness", -1, "max_staleness=-1"), ("max_staleness", 1.5, "max_staleness=1.5"),
    ("behaviour_correction", "is", "behaviour_correction='is'"), ("is_cap", 0.0, "is_cap=0.0"),
    ("is_cap", float("inf"), "is_cap=inf"),
])
def test_async_settings_are_validated(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        RLSettings(**{field: value})


BASE = ["job=rl", "steps=2", "rl.tasks_per_step=2", "rl.group_size=2", "rl.minibatch_size=2", "rollout.max_turns=3",
        "rollout.slots=4", "eval.tasks=2", "rl.credit=infopo", "progress=false"]
TIMES = ("time/", "tokens_per_s", "wall", "elapsed")


def _rl_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and not any(t in k for t in TIMES)}
            for r in rows if r.get("phase") == "rl"]


def test_max_staleness_0_is_the_synchronous_loop_bit_for_bit(tmp_path, capsys):
    assert main(BASE + [f"runs_dir={tmp_path}", "name=sync", "eval.every=0"]) == 0
    assert main(BASE + [f"runs_dir={tmp_path}", "name=k0", "eval.every=0", "rl.max_staleness=0"]) == 0
    sync, k0 = _rl_rows(tmp_path / "sync"), _rl_rows(tmp_path / "k0")
    assert len(sync) == 2 and sync == k0
    assert not any(k.startswith("async/") for k in sync[0])
    assert any(r["update/grad_norm"] > 0 for r in sync)  # an update that moved something


def test_an_asynchronous_job_trains_on_partial_rollouts_within_the_staleness_bound(tmp_path, capsys):
    argv = BASE + [f"runs_dir={tmp_path}", "name=k1", "steps=3", "eval.every=2", "rl.max_staleness=1",
                   "rl.behaviour_correction=truncated_is", "rl.is_cap=2"]
    assert main(argv) == 0
    rows = _rl_rows(tmp_path / "k1")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["async/staleness_max"] <= 1 and sum(r["async/staleness_hist"]) == 2  # tasks_per_step groups
        assert 0.0 <= r["async/engine_idle_share"] <= 1.0 and 0.0 <= r["async/update_wait_share"] <= 1.0
        assert 0.0 < r["update/is_weight_mean"] <= 2.0 and 0.0 <= r["update/is_truncated_share"] <= 1.0
        assert math.isfinite(r["update/loss"])
    # the first batch is all version 0; later ones were sampled while the previous update ran
    assert rows[0]["async/staleness_hist"] == [2, 0] and rows[1]["async/staleness_mean"] > 0
    versions = [json.loads(line)["info"]["policy_versions"]
                for line in (tmp_path / "k1" / "trajectories" / "iter_00002.jsonl").read_text().splitlines()]
    assert versions and all(len(v) >= 1 and min(v) >= 1 and max(v) <= 3 for v in versions)
    summary = json.loads((tmp_path / "k1" / "summary.json").read_text())
    assert summary["updates"] == 3 if "updates" in summary else True
    evals = [json.loads(line) for line in (tmp_path / "k1" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("phase") == "eval"]
    assert any(r.get("label") == "during" for r in evals)  # the producer paused for it and resumed


class _Engine:
    def __init__(self):
        self.stats, self.version, self.published = {"device_s": 0.0}, None, []

    def set_params(self, params, version=None):
        self.version = version

    def publish(self, params, version):
        self.published.append(version)


def _fake_trainer(P=2, G=2):
    from types import SimpleNamespace

    return SimpleNamespace(settings=SimpleNamespace(tasks_per_step=P, group_size=G), engine=_Engine(),
                           state=SimpleNamespace(model_params={"w": jnp.zeros(2)}), processes=None,
                           episode=SimpleNamespace(max_turns=2), make_env=lambda: None, tok=None, sampling=None)


def _plan(i):
    return ["a", "b"], jax.random.key(i)


def test_the_producer_starts_at_most_k_iterations_ahead_and_close_cancels_what_runs(monkeypatch):
    import time as _time

    import jaxagent.train.async_rl as ar

    async def never(*args, **kwargs):  # an episode whose user never answers
        import asyncio

        await asyncio.sleep(3600)

    monkeypatch.setattr(ar, "run_episode", never)
    loop = ar.AsyncRL(_fake_trainer(), _plan, max_staleness=1, start=3)
    _time.sleep(0.5)
    assert loop.trainer.engine.version == 3  # the producer's engine starts at the run's version
    assert loop.started_groups == (1 + 1) * 2  # iterations 3 and 4's groups: K = 1 ahead, no more
    t0 = _time.perf_counter()
    loop.close()  # cancels the running groups: no hour-long wait
    assert _time.perf_counter() - t0 < 10 and loop.ready == []


def test_an_agent_error_in_the_rollouts_reaches_the_trainer(monkeypatch):
    import jaxagent.train.async_rl as ar

    async def broken(*args, **kwargs):
        raise RuntimeError("rollout.max_tokens too small")

    monkeypatch.setattr(ar, "run_episode", broken)
    loop = ar.AsyncRL(_fake_trainer(), _plan, max_staleness=1)
    with pytest.raises(ar.ProducerFailed, match="rollout.max_tokens too small"):
        loop.take(0)
    loop.close()


def test_max_staleness_is_refused_below_1_and_with_several_processes():
    from types import SimpleNamespace

    import jaxagent.train.async_rl as ar

    with pytest.raises(ValueError, match="max_staleness=0"):
        ar.AsyncRL(_fake_trainer(), _plan, max_staleness=0)
    tr = _fake_trainer()
    tr.processes = SimpleNamespace(multi=True, count=2)
    with pytest.raises(ValueError, match="one process"):
        ar.AsyncRL(tr, _plan, max_staleness=1)

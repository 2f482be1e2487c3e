"""Episodes end to end: a tiny model through the engine against a scripted gym, with injected
simulator faults; every episode returns a consistent record and every failure is counted."""

import asyncio
import random

import jax
import numpy as np

from jaxagent.envs.gyms import GYMS
from jaxagent.models import init_params, preset
from jaxagent.models.generate import SamplingParams
from jaxagent.train.collate import collate
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.loop import run_episodes
from jaxagent.text import load_tokenizer
from tests.conftest import FIXTURES

TOK = load_tokenizer(FIXTURES / "tokenizer_qwen")


class Flaky:
    """Wraps an environment; each reset/step call raises with probability ``p``."""

    def __init__(self, env, rng, p):
        self.env, self.rng, self.p = env, rng, p
        self.failures = 0

    def _maybe_fail(self):
        if self.rng.random() < self.p:
            self.failures += 1
            raise ConnectionError("injected simulator failure")

    async def reset(self, task_id, seed):
        self._maybe_fail()
        return await self.env.reset(task_id, seed)

    async def step(self, message):
        self._maybe_fail()
        return await self.env.step(message)

    def outcome_reward(self):
        return self.env.outcome_reward()

    async def aclose(self):
        await self.env.aclose()


def test_episodes_with_faults_complete_and_count_failures():
    cfg = preset("tiny-qwen2", vocab_size=TOK.vocab_size, max_position_embeddings=1024)
    params = init_params(jax.random.key(0), cfg)
    engine = GenerationEngine(params, cfg, slots=3, capacity=1024)
    spec = GYMS["intention"]
    tasks = spec.make_tasks("train", 3, seed=0)
    rng = random.Random(0)
    envs = []

    def make_env():
        envs.append(Flaky(spec.env(), rng, 0.2))
        return envs[-1]

    sp = SamplingParams(temperature=1.0, max_new_tokens=12, stop_tokens=tuple(TOK.eos_token_ids))
    trajs = asyncio.run(run_episodes(engine, make_env, TOK, tasks, group_size=3, sampling=sp,
                                     key=jax.random.key(1), config=EpisodeConfig(max_turns=4, retries=0)))
    assert len(trajs) == 9
    injected = sum(e.failures for e in envs)
    counted = sum(t.info["simulator_errors"] for t in trajs)
    assert injected > 0 and counted == injected  # every injected failure is counted in a record
    terms = [t.termination for t in trajs]
    assert set(terms) <= {"done", "max_turns", "max_tokens", "simulator_failure"}
    assert "simulator_failure" in terms  # with retries=0 a failed call ends its episode
    for t in trajs:
        mask = t.loss_mask()
        assert len(t.turn_rewards) == len(t.action_spans())
        assert (np.asarray(t.logprobs)[mask == 0] == 0).all()
        if t.termination == "simulator_failure":
            assert t.outcome_reward == 0.0
    batch, old_lp = collate(trajs)
    assert batch.tokens_BL.shape[0] == 9 and old_lp.shape == batch.tokens_BL.shape
    assert sorted(set(np.asarray(batch.group_id_B).tolist())) == [0, 1, 2]


def test_a_failed_call_is_retried_and_counted():
    cfg = preset("tiny-qwen2", vocab_size=TOK.vocab_size, max_position_embeddings=1024)
    engine = GenerationEngine(init_params(jax.random.key(0), cfg), cfg, slots=1, capacity=1024)
    spec = GYMS["telepathy"]

    class FailOnce(Flaky):
        async def step(self, message):
            if not self.failures:
                self.failures += 1
                raise TimeoutError("injected")
            return await self.env.step(message)

    env = FailOnce(spec.env(), random.Random(0), 0.0)
    sp = SamplingParams(temperature=0.0, max_new_tokens=6)
    (traj,) = asyncio.run(run_episodes(engine, lambda: env, TOK, spec.make_tasks("test", 1), group_size=1,
                                       sampling=sp, key=jax.random.key(0), config=EpisodeConfig(max_turns=2)))
    assert traj.info["simulator_errors"] == 1 and traj.termination != "simulator_failure"
    assert len(traj.action_spans()) == 2


def test_turn_keys_made_at_once_are_the_fold_ins_of_each_episode_and_turn():
    from jaxagent.rollout.loop import turn_key_data

    key = jax.random.key(7)
    data = turn_key_data(key, [0, 3, 12], 4)
    assert data.shape == (3, 4, 2) and data.dtype == np.uint32
    for a, e in enumerate([0, 3, 12]):
        for t in range(4):
            want = jax.random.key_data(jax.random.fold_in(jax.random.fold_in(key, e), t))
            np.testing.assert_array_equal(data[a, t], np.asarray(want))

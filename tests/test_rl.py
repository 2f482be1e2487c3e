"""One RL iteration end to end on a scripted gym (tiny random policy, fixture tokenizer): every
credit method runs, updates the policy, and reports finite metrics; settings errors name the
field."""

import jax
import numpy as np
import pytest

from jaxagent.credit.losses import PPOConfig
from jaxagent.envs.gyms import GYMS
from jaxagent.models import init_params, preset
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.text import load_tokenizer
from jaxagent.rollout.metrics import episode_metrics
from jaxagent.train.rl import RLSettings, RLTrainer
from jaxagent.train.step import OptimSettings, TrainState, make_optimizer
from tests.conftest import FIXTURES

TOK = load_tokenizer(FIXTURES / "tokenizer_qwen")
CFG = preset("tiny-qwen2", vocab_size=TOK.vocab_size, max_position_embeddings=1024)


def _trainer(credit, rules=None, **kw):
    params = init_params(jax.random.key(0), CFG)
    tx = make_optimizer(OptimSettings(lr=1e-3))
    settings = RLSettings(credit=credit, group_size=2, tasks_per_step=2, ppo_epochs=2, minibatch_size=2, **kw)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, stop_tokens=tuple(TOK.eos_token_ids))
    engine = GenerationEngine(params, CFG, slots=4, capacity=1024, park_rows=4, decode_steps=4)
    return RLTrainer(TrainState.create(params, tx), tx, config=CFG, tokenizer=TOK,
                     make_env=lambda: GYMS["telepathy"].env(max_steps=3), settings=settings,
                     ppo=PPOConfig(kl_coef=0.01, entropy_coef=0.001), sampling=sampling,
                     episode=EpisodeConfig(max_turns=3, max_tokens=1024), engine=engine, rules=rules)


@pytest.mark.parametrize("credit", ["grpo", "infopo+faca"])
def test_one_iteration_updates_the_policy_with_finite_metrics(credit):
    trainer = _trainer(credit)
    before = jax.tree.map(np.asarray, trainer.state.params)
    tasks = GYMS["telepathy"].make_tasks("train", 2, seed=0)
    metrics, trajs = trainer.iteration(tasks, jax.random.key(1))
    assert len(trajs) == 4 and metrics["episodes"] == 4
    assert metrics["updates"] + metrics["skipped_updates"] == 4  # 2 epochs x 2 minibatches
    assert metrics["updates"] >= 1
    changed = any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before),
                                                           jax.tree.leaves(trainer.state.params)))
    assert changed
    for k, v in metrics.items():
        if isinstance(v, float):
            assert np.isfinite(v), k
    assert "update/kl_ref" in metrics and "update/entropy" in metrics
    if credit == "infopo+faca":
        assert "info/gain_mean" in metrics and "info/gate_mean" in metrics
        assert len(metrics["info/gain_by_turn"]) >= 1
        assert any(k.startswith("faca/") for k in metrics)
    else:
        assert "info/gain_mean" not in metrics


def test_iteration_is_rollout_then_train_on():
    tasks = GYMS["telepathy"].make_tasks("train", 2, seed=0)
    key = jax.random.key(3)
    a, b = _trainer("infopo"), _trainer("infopo")
    m_a, trajs_a = a.iteration(tasks, key)
    trajs_b = b.rollout(tasks, jax.random.split(key, 3)[0])
    # credit() is train_on's credit without the update: the same figures, the policy untouched
    step0 = int(b.state.step)
    batch, A_BL, diag = b.credit(trajs_b, key)
    assert A_BL.shape == batch.tokens_BL.shape and int(b.state.step) == step0
    m_b = b.train_on(trajs_b, key)
    for k in ("cover/info", "cover/ext", "zero_adv_group_share"):
        assert m_b[f"credit/{k}"] == float(diag[k]), k
    # each record holds its turns' credit: the advantage's mean over the turn's tokens (checked by a
    # loop over tokens here), and InfoPO's information gain of the turn
    A, idx, mask = np.asarray(A_BL), np.asarray(batch.turn_idx_BL), np.asarray(batch.loss_mask_BL)
    for row, t in enumerate(trajs_b):
        credit = t.info["credit"]
        turns = len(t.action_spans())
        assert set(credit) == {"advantage", "r_info"} and len(credit["advantage"]) == len(credit["r_info"]) == turns
        for k in range(turns):
            vals = [A[row, j] for j in range(A.shape[1]) if idx[row, j] == k and mask[row, j] > 0]
            assert credit["advantage"][k] == pytest.approx(float(np.mean(vals)), abs=1e-6)
    assert [t.tokens for t in trajs_a] == [t.tokens for t in trajs_b]
    for x, y in zip(jax.tree.leaves(a.state.params), jax.tree.leaves(b.state.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert "time/rollout_s" in m_a and "time/rollout_s" not in m_b
    for k, v in m_b.items():
        if not k.startswith("time/") and k != "tokens_per_s":
            assert m_a[k] == v, k


def test_on_a_mesh_the_credit_rows_are_split_and_the_information_gain_is_the_same():
    """``rules`` (a run on several devices): the iteration's rows are split over the mesh's batch
    axes for the credit (InfoPO's info gain, the reference scorer), each device scoring its own;
    each turn's information gain is the one-device trainer's. (The advantages are compared through
    it only: this tiny policy's gains are ~7e-4, and a group of two normalises them by their spread,
    which turns float32 noise of 1e-6 into 2e-3.)"""
    import copy

    from jaxagent.models import LogicalRules, MeshConfig, make_mesh

    rules = LogicalRules(make_mesh(MeshConfig(data=1, fsdp=4, tensor=1), devices=jax.devices()[:4]))
    tasks = GYMS["telepathy"].make_tasks("train", 2, seed=0)
    key = jax.random.key(5)
    one, split = _trainer("infopo"), _trainer("infopo", rules=rules)
    assert one.rules is None and split.rules == rules
    assert split.score_rules == rules  # 4 rows at a time (score_rows=8 > the 4 rows) over 4 devices
    trajs = one.rollout(tasks, jax.random.split(key, 3)[0])
    batch, _, _ = split.credit(trajs, key)
    assert batch.tokens_BL.sharding.spec[0] == "fsdp" and len(batch.tokens_BL.sharding.device_set) == 4
    t1, t2 = copy.deepcopy(trajs), copy.deepcopy(trajs)
    one.train_on(t1, key)
    m = split.train_on(t2, key)
    for a, b in zip(t1, t2):
        gains = a.info["credit"]["r_info"]
        assert len(gains) >= 1 and max(abs(g) for g in gains) > 0
        # measured: at most 1.3e-6 apart (the fsdp matmuls sum in another order)
        np.testing.assert_allclose(b.info["credit"]["r_info"], gains, atol=1e-5)
    assert m["updates"] >= 1 and all(np.isfinite(v) for v in m.values() if isinstance(v, float))
    # one device: no rules kept (nothing to split)
    solo = LogicalRules(make_mesh(MeshConfig(data=1, fsdp=1, tensor=1), devices=jax.devices()[:1]))
    assert _trainer("grpo", rules=solo).rules is None


def test_episode_metrics_hand_computed():
    class T:  # the fields episode_metrics reads
        def __init__(self, reward, spans, n, term="done"):
            self.outcome_reward, self._spans, self.tokens, self.termination = reward, spans, [0] * n, term
            self.info = {"format_errors": 1, "tool_errors": 0}

        def action_spans(self):
            return self._spans

    m = episode_metrics([T(1.0, [(0, 4), (10, 12)], 20), T(0.0, [(0, 2)], 10, "max_turns")])
    assert m["success"] == 0.5 and m["reward"] == 0.5 and m["turns"] == 1.5
    assert m["response_tokens"] == pytest.approx((3 + 2) / 2)  # per-turn means 6/2 and 2/1
    assert m["episode_tokens"] == 15 and m["format_errors"] == 2
    assert m["termination/done"] == 1 and m["termination/max_turns"] == 1
    assert m["length_reward_corr"] == pytest.approx(1.0)


def test_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="credit='gpro'"):
        RLSettings(credit="gpro")
    with pytest.raises(ValueError, match="minibatch_size=3"):
        RLSettings(group_size=2, tasks_per_step=2, minibatch_size=3)
    with pytest.raises(ValueError, match="microbatches=3"):
        RLSettings(group_size=2, tasks_per_step=2, microbatches=3)


def test_evaluate_averages_k_runs_per_task():
    from jaxagent.eval.rollouts import evaluate

    params = init_params(jax.random.key(0), CFG)
    engine = GenerationEngine(params, CFG, slots=4, capacity=1024, decode_steps=4)
    tasks = GYMS["telepathy"].make_tasks("test", 2, seed=0)
    sp = SamplingParams(temperature=0.0, max_new_tokens=8, stop_tokens=tuple(TOK.eos_token_ids))
    m, trajs = evaluate(params, engine, lambda: GYMS["telepathy"].env(max_steps=2), TOK, tasks, k=2, sampling=sp,
                        key=jax.random.key(0), episode=EpisodeConfig(max_turns=2, max_tokens=1024))
    assert len(trajs) == 4 and m["k"] == 2 and m["tasks"] == 2
    assert set(m["success_by_task"]) == set(tasks)
    # k runs per task, grouped (the runs differ only through the user's paraphrases: reset seeds)
    assert [t.task_id for t in trajs] == [tasks[0], tasks[0], tasks[1], tasks[1]]
    assert trajs[0].group_id == trajs[1].group_id != trajs[2].group_id
    assert m["success"] == 0.0  # a random tiny policy does not name the hidden thing
    with pytest.raises(ValueError, match="k=0"):
        evaluate(params, engine, lambda: GYMS["telepathy"].env(), TOK, tasks, k=0, sampling=sp, key=jax.random.key(0))


def test_turn_means_hand_computed():
    from jaxagent.train.rl import turn_means

    values = np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    turn = np.array([[-1, 0, 0, 1, 1], [0, 0, -1, -1, -1]])
    mask = np.array([[0, 1, 1, 1, 0], [1, 0, 0, 0, 0]])  # row 0: token 4 is off the loss mask
    out = turn_means(values, turn, mask, 3)
    np.testing.assert_allclose(out[0], [2.5, 4.0, np.nan])
    np.testing.assert_allclose(out[1], [1.0, np.nan, np.nan])


def test_rows_scored_at_a_time_by_hand():
    assert [RLSettings(score_rows=k).rows_scored_at_a_time(16) for k in (8, 0, 16, 40, 1)] == [8, 16, 16, 16, 1]

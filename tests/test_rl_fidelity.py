"""Two fidelity properties of RL (issue 15):

- the user's reaction to the episode's last segment (the verdict on the final answer) reaches Faca:
  the final step's messages are not appended to the tokens, but their label is kept
  (``Trajectory.final_reaction``) and labels the last U2U segment, so A_proc covers the answer;
- PPO trains the distribution that sampled: with ``rollout.temperature != 1`` (and a tokenizer
  smaller than the model's vocabulary) the old log-probs are the sampler's, the trainer scores at
  the same temperature and limit, and the first update's ratio is 1; top-k / top-p / greedy
  sampling are refused for training, naming the key.
"""

import asyncio
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.jobs.config import load_config
from jaxagent.configlib import ConfigError
from jaxagent.credit.fusion import fuse
from jaxagent.credit.losses import PPOConfig
from jaxagent.credit.reaction import FacaConfig
from jaxagent.envs.gyms import GYMS
from jaxagent.envs.gyms.common import act, answer
from jaxagent.envs.gyms.intention import DOMAINS
from jaxagent.models import init_params, preset
from jaxagent.models.generate import SamplingParams
from jaxagent.train.collate import collate
from jaxagent.rollout.engine import EngineResult, GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.loop import run_episode
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.text import load_tokenizer
from jaxagent.jobs import tokenizer_path
from jaxagent.train.rl import RLSettings, RLTrainer, sampler_view
from jaxagent.train.step import OptimSettings, TrainState, make_optimizer, sequence_scores
from tests.conftest import FIXTURES

GYM_TOK = load_tokenizer(tokenizer_path("builtin:gyms"))


class ScriptEngine:
    """Stands in for the generation engine: 'generates' the given agent messages in order, as the
    tokens a model would emit (text, Qwen ``<tool_call>`` blocks, the end-of-turn token)."""

    def __init__(self, messages):
        self.messages = list(messages)

    async def generate(self, session, prompt, sampling, key):
        msg = self.messages.pop(0)
        text = msg.content + "".join(f"<tool_call>\n{json.dumps(c.to_dict())}\n</tool_call>" for c in msg.tool_calls)
        ids = GYM_TOK.encode(text) + [GYM_TOK.eos_token_ids[0]]
        return EngineResult(ids, [0.0] * len(ids), [0.0] * len(ids), True, False, len(prompt))

    def release(self, session):
        pass


def _intention_episode(task_id: str, *, right: bool) -> Trajectory:
    """Asks about one hidden detail, then answers with every value (right) or a wrong one."""
    task = GYMS["intention"].env_cls.task_for(task_id)
    hidden = sorted(task["importance"])
    values = task["values"]
    if right:
        plan = " , ".join(f"{s} {values[s]}" for s in [task["stated"], *hidden])
    else:  # every hidden detail with a value other than the user's
        plan = " , ".join(f"{s} {next(v for v in DOMAINS[task['domain']][s] if v != values[s])}" for s in hidden)
    script = [act(f"what is the {hidden[0]} ?"), answer(f"{task['domain']} : {plan} .")]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=96, stop_tokens=tuple(GYM_TOK.eos_token_ids))
    return asyncio.run(run_episode(ScriptEngine(script), GYMS["intention"].env(), GYM_TOK, task_id=task_id, seed=0,
                                   group_id=0, sampling=sampling, key=jax.random.key(0),
                                   config=EpisodeConfig(max_turns=4, max_tokens=2048, tool_schemas_in_prompt=False)))


def test_the_answer_segment_carries_the_users_verdict():
    task_id = GYMS["intention"].make_tasks("train", 1, seed=0)[0]
    good, bad = _intention_episode(task_id, right=True), _intention_episode(task_id, right=False)
    assert (good.termination, good.outcome_reward) == ("done", 1.0)
    assert bad.termination == "done" and bad.outcome_reward < 1.0
    # the verdict is not in the tokens (no action follows it), but it labels the answer's segment
    assert good.final_reaction == "accept" and bad.final_reaction == "reject"
    assert good.segments() == [([0], "provide_info"), ([1], "accept")]
    assert bad.segments() == [([0], "provide_info"), ([1], "reject")]
    assert "that covers it" not in GYM_TOK.decode(good.tokens)  # the verdict's text is not rendered
    # the round trip through JSON keeps it
    assert Trajectory.from_dict(json.loads(json.dumps(good.to_dict()))).final_reaction == "accept"

    batch, _ = collate([good, bad])
    assert np.asarray(batch.segment_valid_BQ).tolist() == [[True, True], [True, True]]
    np.testing.assert_array_equal(np.asarray(batch.segment_polarity_BQ), [[1.0, 1.0], [1.0, -1.0]])
    A_BL, diag = fuse(batch, None, None, FacaConfig(), key=jax.random.key(0))
    A_proc = np.asarray(diag["A_proc_BQ"])
    # normalised per segment index over the group: the questions' reactions are equal (0), the
    # answers' are +1 and -1 (mean 0, population std 1)
    np.testing.assert_allclose(A_proc, [[0.0, 1.0], [0.0, -1.0]], atol=1e-5)
    # the reaction credit reaches exactly the answers' tokens
    turn = np.asarray(batch.turn_idx_BL)
    agent = np.asarray(batch.loss_mask_BL) > 0
    assert float(diag["cover/proc"]) == pytest.approx((turn[agent] == 1).mean())
    A = np.asarray(A_BL)
    assert np.all(A[0][turn[0] == 1] > 0) and np.all(A[1][turn[1] == 1] < 0)


def test_an_episode_cut_by_its_token_budget_keeps_the_dropped_reaction():
    """The user's reply that no longer fits (termination max_tokens) still labels the segment."""
    task_id = GYMS["intention"].make_tasks("train", 1, seed=0)[0]
    task = GYMS["intention"].env_cls.task_for(task_id)
    hidden = sorted(task["importance"])[0]
    script = [act(f"what is the {hidden} ?")]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, stop_tokens=tuple(GYM_TOK.eos_token_ids))

    async def play(max_tokens):
        return await run_episode(ScriptEngine(list(script)), GYMS["intention"].env(), GYM_TOK, task_id=task_id,
                                 seed=0, group_id=0, sampling=sampling, key=jax.random.key(0),
                                 config=EpisodeConfig(max_turns=1, max_tokens=max_tokens, tool_schemas_in_prompt=False))

    full = asyncio.run(play(4096))
    assert full.termination == "max_turns" and full.segments() == [([0], "provide_info")]
    cut = asyncio.run(play(len(full.tokens) - 1))  # the reply no longer fits
    assert cut.termination == "max_tokens"
    assert cut.final_reaction == "provide_info" and cut.segments() == [([0], "provide_info")]


# ----------------------------------------------------------------------------- tempered log-probs
QTOK = load_tokenizer(FIXTURES / "tokenizer_qwen")
# the model's vocabulary is larger than the tokenizer's: the sampler never draws the extra ids
BIG = preset("tiny-qwen2", vocab_size=QTOK.vocab_size + 64, max_position_embeddings=1024)


def _trainer(temperature: float, **settings):
    params = init_params(jax.random.key(0), BIG)
    tx = make_optimizer(OptimSettings(lr=1e-3))
    sampling = SamplingParams(temperature=temperature, max_new_tokens=12, stop_tokens=tuple(QTOK.eos_token_ids))
    engine = GenerationEngine(params, BIG, slots=4, capacity=1024, park_rows=4, decode_steps=4,
                              vocab_limit=QTOK.vocab_size)
    return RLTrainer(TrainState.create(params, tx), tx, config=BIG, tokenizer=QTOK,
                     make_env=lambda: GYMS["telepathy"].env(max_steps=3),
                     settings=RLSettings(credit="grpo", group_size=2, tasks_per_step=2, **settings),
                     ppo=PPOConfig(kl_coef=0.01, entropy_coef=0.01), sampling=sampling,
                     episode=EpisodeConfig(max_turns=3, max_tokens=1024), engine=engine)


@pytest.mark.parametrize("temperature", [0.6, 1.7])
def test_tempered_sampling_gives_ratio_one_under_the_tempered_log_probs(temperature):
    trainer = _trainer(temperature)
    tasks = GYMS["telepathy"].make_tasks("train", 2, seed=0)
    trajs = trainer.rollout(tasks, jax.random.key(1))
    batch, old_lp = collate(trajs, multiple=64)
    mask = np.asarray(batch.loss_mask_BL) > 0
    assert mask.sum() > 20
    params = trainer.state.params
    score = lambda **kw: np.asarray(sequence_scores(params, batch.tokens_BL, config=BIG, **kw))  # noqa: E731
    tempered = score(temperature=temperature, vocab_limit=QTOK.vocab_size)
    np.testing.assert_allclose(tempered[mask], old_lp[mask], atol=2e-4)
    # the raw policy (the old behaviour) is another distribution: the test can tell them apart
    assert np.abs(score()[mask] - old_lp[mask]).max() > 0.05
    # and the update itself: one epoch, the whole batch in one minibatch: ratio exactly 1
    m = trainer.train_on(trajs, jax.random.key(1))
    assert abs(m["update/ratio_min"] - 1) < 1e-3 and abs(m["update/ratio_max"] - 1) < 1e-3
    assert m["update/approx_kl_k3"] < 1e-7
    # the excluded ids' -inf logits leave the loss and its gradient (entropy term included) finite
    assert m["update/finite"] == 1.0 and np.isfinite(m["update/grad_norm"]) and m["update/skipped"] == 0


def test_sampler_view_of_a_smaller_tokenizer_limits_the_vocabulary():
    sp = SamplingParams(temperature=0.8)
    assert sampler_view(sp, 100, 164) == {"temperature": 0.8, "vocab_limit": 100}
    assert sampler_view(sp, 164, 164) == {"temperature": 0.8, "vocab_limit": None}


@pytest.mark.parametrize("kw,key", [({"top_p": 0.9}, "rollout.top_p=0.9"), ({"top_k": 5}, "rollout.top_k=5"),
                                    ({"temperature": 0.0}, "rollout.temperature=0.0")])
def test_samplers_training_cannot_score_are_refused_naming_the_key(kw, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        sampler_view(SamplingParams(**{"temperature": 1.0, **kw}), 10, 10)
    override = [f"rollout.{k}={v}" for k, v in kw.items()]
    with pytest.raises(ConfigError, match=r"rollout\.(top_p|top_k|temperature)"):
        load_config(None, override)
    # an evaluation may filter or decode greedily
    assert load_config(None, ["job=eval", *override]).job == "eval"


def test_teacher_forced_temperature_and_limit_match_a_numpy_reference():
    cfg = preset("tiny-qwen2", vocab_size=96, max_position_embeddings=64)
    params = init_params(jax.random.key(2), cfg)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 80, (2, 12)), jnp.int32)
    from jaxagent.models import forward

    logits = np.asarray(forward(params, tokens, config=cfg), np.float64)[:, :-1] / 0.7
    logits[..., 80:] = -np.inf
    ref = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    picked = np.take_along_axis(ref, np.asarray(tokens)[:, 1:, None], -1)[..., 0]
    p = np.exp(ref)
    ent = -(p * np.where(p > 0, ref, 0.0)).sum(-1)
    lp, e = sequence_scores(params, tokens, config=cfg, entropy=True, temperature=0.7, vocab_limit=80)
    grads = jax.grad(lambda p: jnp.sum(sum(sequence_scores(p, tokens, config=cfg, entropy=True, temperature=0.7,
                                                           vocab_limit=80))))(params)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    np.testing.assert_allclose(np.asarray(lp)[:, 1:], picked, atol=1e-4)
    np.testing.assert_allclose(np.asarray(e)[:, 1:], ent, atol=1e-4)
    assert np.isfinite(np.asarray(e)).all()

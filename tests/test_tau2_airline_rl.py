"""tau2 airline under training: the oracle's demonstrations render for SFT, and one RL iteration with
Faca credit on a tiny random Qwen policy against the scripted customer, whose reaction labels reach
the agent's tokens as A_proc (what ``job=sft+rl env=tau2 env.tau2.domain=airline rl.credit=faca`` runs)."""

import jax
import numpy as np

from jaxagent.credit.losses import PPOConfig
from jaxagent.envs.tau2.agents import oracle_plan
from jaxagent.envs.tau2.harness import Tau2EnvFactory
from jaxagent.envs.tau2.spec import Tau2Section
from jaxagent.models import init_params, preset
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.demos import play_demos, render_demo
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.text import load_tokenizer
from jaxagent.train.rl import RLSettings, RLTrainer
from jaxagent.train.step import OptimSettings, TrainState, make_optimizer
from tests.conftest import FIXTURES

TOK = load_tokenizer(FIXTURES / "tokenizer_qwen")
CAP = 6144  # the airline policy prompt is ~4.3k tokens with this tokenizer (tool schemas not rendered)
CFG = preset("tiny-qwen2", vocab_size=TOK.vocab_size, max_position_embeddings=CAP)


def test_oracle_demos_on_airline_reach_the_gold_db_and_train_only_the_agent():
    factory = Tau2EnvFactory(Tau2Section(domain="airline", tasks="14,20"))   # bookings (with a cancel first)
    factory.record(False)
    demos = play_demos(oracle_plan(factory, factory.tasks, factory.task_ids))
    assert [d.reward for d in demos] == [1.0, 1.0]
    for d in demos:
        ids, mask = render_demo(d, TOK, tool_schemas_in_prompt=False)
        text = TOK.decode([i for i, m in zip(ids, mask) if m])
        assert "book_reservation" in text and "HATHAT" not in text   # the tool's reply is not trained


def test_rl_iteration_with_faca_on_airline_reaches_agent_tokens():
    factory = Tau2EnvFactory(Tau2Section(domain="airline", tasks="1"))
    factory.record(False)
    params = init_params(jax.random.key(0), CFG)
    tx = make_optimizer(OptimSettings(lr=1e-3))
    settings = RLSettings(credit="faca", group_size=2, tasks_per_step=1, ppo_epochs=1, minibatch_size=2,
                          microbatches=2, length_multiple=512)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, stop_tokens=tuple(TOK.eos_token_ids))
    engine = GenerationEngine(params, CFG, slots=4, capacity=CAP, park_rows=4, decode_steps=4)
    trainer = RLTrainer(TrainState.create(params, tx), tx, config=CFG, tokenizer=TOK, make_env=factory,
                        settings=settings, ppo=PPOConfig(kl_coef=0.01, entropy_coef=0.001), sampling=sampling,
                        episode=EpisodeConfig(max_turns=3, max_tokens=CAP, tool_schemas_in_prompt=False),
                        engine=engine)
    metrics, trajs = trainer.iteration(factory.task_ids, jax.random.key(2))
    assert len(trajs) == 2 and metrics["updates"] == 1
    assert all(np.isfinite(v) for v in metrics.values() if isinstance(v, float))
    # the customer answered the agent's text with labels of nonzero polarity, and within a group the
    # labels differ, so A_proc is nonzero on agent tokens
    assert metrics["faca/nonzero_proc_token_share"] > 0 and metrics["faca/proc_l1_share"] > 0

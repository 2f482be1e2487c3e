"""tau2 telecom under training: the oracle's demonstrations (its requests for device actions, the
customer's tool calls kept off the agent's tokens) render for SFT, and one RL iteration with Faca
credit on a tiny random Qwen policy against the scripted customer, whose reaction labels enter the
trajectories (what ``job=sft+rl env=tau2 env.tau2.domain=telecom rl.credit=faca`` runs)."""

import shutil

import jax
import numpy as np

from jaxagent.credit.losses import PPOConfig
from jaxagent.envs.tau2 import get_domain
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
# tau2's telecom policy is ~13.6k tokens with this tokenizer: the RL iteration runs on the packaged data
# with a one-paragraph policy instead (the mechanism under test is the same; 150 s -> a few seconds)
CAP = 2048
CFG = preset("tiny-qwen2", vocab_size=TOK.vocab_size, max_position_embeddings=CAP)
SHORT_POLICY = ("You are a telecom support agent. Ask the customer to perform actions on their phone by naming the "
                "tool and its JSON arguments; use your tools on the customer's account.")


def test_oracle_demos_on_telecom_score_and_train_only_the_agent():
    factory = Tau2EnvFactory(Tau2Section(domain="telecom", tasks="57:59"))   # data off + roaming; data saver
    factory.record(False)
    demos = play_demos(oracle_plan(factory, factory.tasks, factory.task_ids))
    assert [d.reward for d in demos] == [1.0, 1.0]
    for d in demos:
        ids, mask = render_demo(d, TOK, tool_schemas_in_prompt=False)
        assert len(ids) > 13_000   # tau2's own policy is the system prompt
        trained = TOK.decode([i for i, m in zip(ids, mask) if m])
        # the agent's requests are trained; the customer's device results (its own tool calls) are not
        assert "Please do this on your phone" in trained and "Status Bar" not in trained
        assert "Status Bar" in TOK.decode(ids)   # they reach the agent only through the customer's text


def test_rl_iteration_with_faca_on_telecom_reaches_agent_tokens(tmp_path):
    data = tmp_path / "telecom"
    shutil.copytree(get_domain("telecom").data_dir, data)
    (data / "policy.md").write_text(SHORT_POLICY)
    factory = Tau2EnvFactory(Tau2Section(domain="telecom", tasks="58:59", data_dir=str(data)))
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
    # every customer turn carries a label; a random policy never names a device action, so the scripted
    # customer restates its problem (be_vague) and gives up (complain) alike in both episodes: the
    # group is homogeneous and Faca's group-normalised A_proc is exactly 0 (A_proc reaching the agent's
    # tokens once the policy's requests differ: the sft+rl run of docs/TAU2.md, and the airline test)
    for t in trajs:
        labels = [x for x in t.reaction_labels if x is not None]
        assert labels == ["be_vague", "be_vague"] and t.final_reaction == "complain"
    assert metrics["faca/homogeneous_group_share"] == 1.0 and metrics["faca/proc_l1_share"] == 0.0

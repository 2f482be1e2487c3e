"""Credit terms as plug-ins: a term defined and registered here (no module of jaxagent.credit
edited) is fused by hand-checked arithmetic, named in rl.credit, and trains an RL step; the
registry's parsing and refusals name what is wrong."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.credit import (CREDIT_TERMS, CreditTerm, GRPOConfig, GRPOTerm, InfoPOConfig, fuse, fuse_terms,
                             make_terms, parse_credit, register_credit_term)
from jaxagent.credit.losses import PPOConfig
from jaxagent.envs.gyms import GYMS
from jaxagent.models import init_params, preset
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.text import load_tokenizer
from jaxagent.train.rl import RLSettings, RLTrainer
from jaxagent.train.step import OptimSettings, TrainState, make_optimizer
from tests.conftest import FIXTURES
from tests.credit_helpers import A_EXT, BATCH, R_INFO


@dataclasses.dataclass(frozen=True)
class TurnCostSettings:
    weight: float = 0.25


@dataclasses.dataclass(frozen=True)
class TurnCost(CreditTerm):
    """-weight * (t + 1) on the tokens of action turn t: later turns cost more."""

    settings: TurnCostSettings = TurnCostSettings()
    name: ClassVar[str] = "turncost"
    cover: ClassVar[str] = "turncost"
    settings_type: ClassVar[type] = TurnCostSettings

    def advantage(self, ctx):
        turn_BL = jnp.asarray(ctx.batch.turn_idx_BL, jnp.float32)
        part = jnp.where(ctx.agent_BL & (turn_BL >= 0), -self.settings.weight * (turn_BL + 1.0), 0.0)
        return part, {"turncost/mean": jnp.sum(part) / jnp.maximum(jnp.sum(ctx.agent_BL), 1)}


@pytest.fixture
def registered():
    register_credit_term(TurnCost)
    yield TurnCost
    del CREDIT_TERMS[TurnCost.name]


def test_a_registered_term_adds_its_contribution_by_hand(registered):
    names = parse_credit("turncost")
    assert names == ("grpo", "turncost")  # the outcome term first
    A, d = fuse_terms(BATCH, make_terms(names, {"turncost": TurnCostSettings(weight=0.5)}))
    A_grpo, _ = fuse(BATCH, None, None, None, GRPOConfig())
    agent = np.asarray(BATCH.loss_mask_BL) != 0
    turn = np.asarray(BATCH.turn_idx_BL)
    by_hand = np.where(agent & (turn >= 0), -0.5 * (turn + 1), 0.0)
    np.testing.assert_allclose(A, np.asarray(A_grpo) + by_hand, rtol=1e-6)
    # rollout 0's first action token: A_ext = 1, turn 0 costs 0.5
    first = int(np.argmax(agent[0]))
    assert float(A[0, first]) == pytest.approx(A_EXT[0] - 0.5)
    np.testing.assert_allclose(d["A_ext_B"], A_EXT, rtol=1e-6)
    assert float(d["cover/turncost"]) == pytest.approx(np.mean(by_hand[agent] != 0))
    assert float(d["turncost/mean"]) == pytest.approx(by_hand[agent].sum() / agent.sum())


def test_registry_order_is_fusion_order_and_builtins_are_unchanged(registered):
    assert parse_credit("turncost+infopo") == ("grpo", "infopo", "turncost")
    A3, d3 = fuse_terms(BATCH, make_terms(parse_credit("infopo"), {"infopo": InfoPOConfig()}), {"r_info": R_INFO})
    A_ref, d_ref = fuse(BATCH, R_INFO, InfoPOConfig(), None, GRPOConfig())
    np.testing.assert_array_equal(A3, A_ref)
    assert set(d3) == set(d_ref)


def test_a_registered_term_trains_an_rl_step(registered):
    tok = load_tokenizer(FIXTURES / "tokenizer_qwen")
    cfg = preset("tiny-qwen2", vocab_size=tok.vocab_size, max_position_embeddings=1024)
    params = init_params(jax.random.key(0), cfg)
    tx = make_optimizer(OptimSettings(lr=1e-3))
    settings = RLSettings(credit="turncost", group_size=2, tasks_per_step=2, minibatch_size=4)
    engine = GenerationEngine(params, cfg, slots=4, capacity=1024, park_rows=4, decode_steps=4)
    trainer = RLTrainer(TrainState.create(params, tx), tx, config=cfg, tokenizer=tok,
                        make_env=lambda: GYMS["telepathy"].env(max_steps=3), settings=settings,
                        ppo=PPOConfig(kl_coef=0.0), engine=engine,
                        sampling=SamplingParams(temperature=1.0, max_new_tokens=12, stop_tokens=tuple(tok.eos_token_ids)),
                        episode=EpisodeConfig(max_turns=3, max_tokens=1024),
                        term_settings={"turncost": TurnCostSettings(weight=1.0)})
    assert [t.name for t in trainer.terms] == ["grpo", "turncost"]
    assert trainer.terms[1].settings.weight == 1.0
    before = jax.tree.leaves(jax.tree.map(np.asarray, trainer.state.params))
    metrics, trajs = trainer.iteration(GYMS["telepathy"].make_tasks("train", 2, seed=0), jax.random.key(1))
    assert metrics["updates"] == 1 and len(trajs) == 4
    assert metrics["turncost/mean"] < 0 and metrics["credit/cover/turncost"] == 1.0
    assert any(not np.array_equal(a, np.asarray(b)) for a, b in zip(before, jax.tree.leaves(trainer.state.params)))


def test_unknown_repeated_and_malformed_terms_are_refused(registered):
    with pytest.raises(ValueError, match="'gpro' is not one of 'grpo', 'infopo', 'faca', 'turncost'"):
        parse_credit("gpro")
    with pytest.raises(ValueError, match="names a credit term twice"):
        parse_credit("faca+faca")
    with pytest.raises(ValueError, match=r"credit: 'infopo\+nope' is not one of .*'nope' is not a registered credit term"):
        RLSettings(credit="infopo+nope")
    with pytest.raises(ValueError, match="already registered"):
        register_credit_term(dataclasses.make_dataclass("Other", [], bases=(TurnCost,), frozen=True))

    @dataclasses.dataclass  # not frozen: not a static jit argument
    class Loose(CreditTerm):
        name: ClassVar[str] = "loose"
        cover: ClassVar[str] = "loose"

        def advantage(self, ctx):
            return ctx.before_BL, {}

    with pytest.raises(TypeError, match="frozen dataclass"):
        register_credit_term(Loose)
    with pytest.raises(TypeError, match="subclass of jaxagent.credit.terms.CreditTerm"):
        register_credit_term(GRPOConfig)


def test_a_term_whose_input_nobody_provides_is_refused_at_construction(registered):
    @dataclasses.dataclass(frozen=True)
    class NeedsOracle(TurnCost):
        name: ClassVar[str] = "needs_oracle"
        needs: ClassVar[tuple[str, ...]] = ("oracle_value",)

    register_credit_term(NeedsOracle)
    try:
        tok = load_tokenizer(FIXTURES / "tokenizer_qwen")
        cfg = preset("tiny-qwen2", vocab_size=tok.vocab_size, max_position_embeddings=256)
        params = init_params(jax.random.key(0), cfg)
        tx = make_optimizer(OptimSettings(lr=1e-3))
        with pytest.raises(ValueError, match=r"need inputs \['oracle_value'\].*register_credit_input"):
            RLTrainer(TrainState.create(params, tx), tx, config=cfg, tokenizer=tok, make_env=lambda: None,
                      settings=RLSettings(credit="needs_oracle", group_size=2, tasks_per_step=1), ppo=PPOConfig(),
                      sampling=SamplingParams(temperature=1.0), episode=EpisodeConfig(), engine=None)
    finally:
        del CREDIT_TERMS["needs_oracle"]


def test_grpo_term_alone_is_the_outcome_advantage():
    (term,) = make_terms(("grpo",), {"grpo": GRPOConfig(normalize_std=False)})
    assert isinstance(term, GRPOTerm) and term.settings.normalize_std is False
    A, _ = fuse_terms(BATCH, (term,))
    agent = np.asarray(BATCH.loss_mask_BL) != 0
    np.testing.assert_allclose(np.asarray(A)[0][agent[0]], 0.5, rtol=1e-6)  # rewards 1 and 0: R - mean = 0.5

"""Feedback that is information: the gyms' kinds and reply alternatives (telepathy answers a repeated
question again, intention's redundant-question reply restates nothing, the probabilities by hand),
their way through the policy's records into the credit batch, InfoPO's marginal prior against a
naive loop over replies, the sampler's vocabulary limit in the info gain, and Faca's polarity map
in the trainer's credit."""

import asyncio

import jax
import numpy as np
import pytest

from jaxagent.credit.infopo import InfoPOConfig
from jaxagent.credit.losses import PPOConfig
from jaxagent.credit.reaction import FacaConfig, reaction_advantage
from jaxagent.envs.base import EnvMessage
from jaxagent.envs.gyms import GYMS, act
from jaxagent.envs.gyms.intention import DOMAINS, p_matters
from jaxagent.models import init_params, preset
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.metrics import feedback_metrics
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.text import load_tokenizer
from jaxagent.train import rl as rl_mod
from jaxagent.train.batch import Row, build_batch
from jaxagent.train.collate import collate_host
from jaxagent.train.infogain import compute_infogain, marginal_infogain, marginal_naive
from jaxagent.train.rl import RLSettings, RLTrainer
from jaxagent.train.step import OptimSettings, TrainState, make_optimizer
from tests.conftest import FIXTURES


def _user(step) -> EnvMessage:
    return [m for m in step.messages if m.role == "user"][-1]


# ----------------------------------------------------------------------------- the gyms
def test_telepathy_answers_a_repeated_question_and_gives_its_probabilities():
    async def go():
        env = GYMS["telepathy"].env()
        await env.reset("telepathy:test:0:0", 0)
        color = env.task["color"]
        other = next(c for c in ("red", "blue", "green", "yellow") if c != color)
        first = _user(await env.step(act(f"is it {color} or {other} ?")))
        assert first.reaction == "confirm" and first.kind == "information"
        alts = dict(first.alternatives)  # 2 of 4 colours: yes 1/2, each paraphrase 1/4
        assert alts == pytest.approx({"yes .": 0.25, "yes , it is .": 0.25, "no .": 0.25, "no , it is not .": 0.25})
        again = _user(await env.step(act(f"is it {other} or {color} ?")))
        assert again.reaction == "confirm" and again.content.startswith("yes")  # answered again
        assert dict(again.alternatives) == pytest.approx({"yes .": 0.5, "yes , it is .": 0.5})  # determined
        ruled_in = _user(await env.step(act(f"is it {color} ?")))  # candidates {color, other}: 1/2
        assert dict(ruled_in.alternatives)["yes ."] == pytest.approx(0.25)
        bad = _user(await env.step(act("is it red and round ?")))
        assert bad.kind == "correction" and dict(bad.alternatives) == {bad.content: 1.0}
    asyncio.run(go())


def test_intention_redundant_question_restates_nothing():
    async def go():
        env = GYMS["intention"].env()
        await env.reset("intention:test:0:0", 0)
        stated = env.task["stated"]
        reply = _user(await env.step(act(f"what is the {stated} ?")))
        assert reply.reaction == "correct" and reply.kind == "correction"
        assert reply.content == "i already told you ." and env.task["values"][stated] not in reply.content
        many = _user(await env.step(act("what is the " + " and the ".join(list(env.task["importance"])[:2]) + " ?")))
        assert many.reaction == "complain" and many.kind == "correction"
    asyncio.run(go())


def test_p_matters_by_hand():
    assert p_matters(0, 0) == pytest.approx((2 + 3 + 4) / 12)  # E[n] / 4
    # one important and one vague seen: P(n) ~ C(n,1) C(4-n,1) = 4, 3, 0 -> 4/7, 3/7; (n - 1) / 2 left
    assert p_matters(1, 1) == pytest.approx(4 / 7 * 1 / 2 + 3 / 7 * 2 / 2)
    assert p_matters(0, 2) == pytest.approx(1.0)  # two vague of four: both others are hidden
    assert p_matters(4, 0) == 0.0


def test_intention_alternatives_follow_the_posterior():
    async def go():
        env = GYMS["intention"].env()
        await env.reset("intention:test:3:1", 0)
        t = env.task
        unstated = [s for s in DOMAINS[t["domain"]] if s != t["stated"]]
        seen_imp = seen_vague = 0
        for s in unstated:
            reply = _user(await env.step(act(f"what is the {s} ?")))
            p = p_matters(seen_imp, seen_vague)
            alts = dict(reply.alternatives)
            for v in DOMAINS[t["domain"]][s]:
                assert alts.get(f"the {s} is {v} .", 0.0) == pytest.approx(p / 3)
            assert alts.get("i do not mind .", 0.0) == pytest.approx((1 - p) / 2)
            assert reply.kind == "information"
            seen_imp += s in t["importance"]
            seen_vague += s not in t["importance"]
    asyncio.run(go())


def test_every_gym_marks_corrections_and_information():
    async def go():
        for name in GYMS:
            env = GYMS[name].env()
            await env.reset(GYMS[name].make_tasks("test", 1)[0], 0)
            step = await env.step(act("hello ?"))  # names nothing: a clarify request
            assert _user(step).kind == "correction", name
            from jaxagent.envs.base import AgentMessage
            err = await env.step(AgentMessage("", (), ("unreadable",)))
            assert err.messages[0].kind == "correction", name
    asyncio.run(go())


def test_env_message_checks_its_alternatives():
    with pytest.raises(ValueError, match="sum to"):
        EnvMessage("user", "a", alternatives=(("a", 0.5),))
    with pytest.raises(ValueError, match="not among them"):
        EnvMessage("user", "a", alternatives=(("b", 1.0),))
    with pytest.raises(ValueError, match="kind"):
        EnvMessage("user", "a", kind="praise")


# ----------------------------------------------------------------------------- records and batches
TOK = load_tokenizer(FIXTURES / "tokenizer_qwen")


def _trainer(credit="grpo", vocab_extra=0, faca=None, infopo=None):
    cfg = preset("tiny-qwen2", vocab_size=TOK.vocab_size + vocab_extra, max_position_embeddings=1024)
    params = init_params(jax.random.key(0), cfg)
    tx = make_optimizer(OptimSettings(lr=1e-3))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, stop_tokens=tuple(TOK.eos_token_ids))
    engine = GenerationEngine(params, cfg, slots=4, capacity=1024, park_rows=4, decode_steps=4)
    return RLTrainer(TrainState.create(params, tx), tx, config=cfg, tokenizer=TOK,
                     make_env=lambda: GYMS["telepathy"].env(max_steps=3),
                     settings=RLSettings(credit=credit, group_size=2, tasks_per_step=2, minibatch_size=2),
                     ppo=PPOConfig(), sampling=sampling, episode=EpisodeConfig(max_turns=3, max_tokens=1024),
                     engine=engine, faca=faca, infopo=infopo)


@pytest.fixture(scope="module")
def episodes():
    """Telepathy episodes of a tiny random policy (random text: clarify requests, mostly)."""
    trainer = _trainer()
    return trainer.rollout(GYMS["telepathy"].make_tasks("train", 2, seed=0), jax.random.key(3))


def test_records_keep_kinds_and_alternatives_that_render_as_the_actual_reply(episodes):
    seen = 0
    for t in episodes:
        assert len(t.message_kinds) == len(t.spans)
        for i, replies in t.alternatives:
            s = t.spans[i]
            assert [list(map(int, ids)) for ids, _ in replies].count(t.tokens[s.content_start:s.content_end]) >= 1
            assert sum(p for _, p in replies) == pytest.approx(1.0)
            seen += 1
        again = Trajectory.from_dict(t.to_dict())
        assert again.feedback_kinds() == t.feedback_kinds()
        assert again.feedback_alternatives() == t.feedback_alternatives()
    assert seen > 0
    host = collate_host(episodes)
    assert host.feedback_kind_BT is not None and host.alternatives is not None
    kinds = [k for t in episodes for k in t.feedback_kinds()]
    assert (np.asarray(host.feedback_kind_BT)[np.asarray(host.turn_valid_BT)] == kinds).all()
    m = feedback_metrics(episodes)
    n2, n1 = kinds.count(2), kinds.count(1)
    assert m["feedback/correction_share"] == pytest.approx(n2 / (n1 + n2))


def _alt_batch():
    """Two rows by hand: row 0 has two turns whose feedback (positions 5-6) had two alternatives
    (the actual [11, 12] and [13]) and a last turn; row 1's feedback is deterministic."""
    toks0 = [1, 2, 3, 4, 9, 11, 12, 9, 20, 21, 22, 9, 30, 31]
    toks1 = [1, 2, 3, 4, 9, 14, 9, 20, 21, 22]
    r0 = Row(tokens=toks0, actions=[(2, 4), (8, 11), (12, 14)], feedback=[(5, 7), (11, 12), (14, 14)],
             alternatives=[[((5, 7), [([11, 12], 0.7), ([13], 0.3)])],
                           [((11, 12), [([9], 0.5), ([15, 16, 17], 0.25), ([18], 0.25)])], None])
    r1 = Row(tokens=toks1, actions=[(2, 4), (7, 10)], feedback=[(5, 6), (10, 10)], alternatives=None)
    return build_batch([r0, r1], length=32, turns=3)


def test_marginal_prior_equals_a_naive_loop_over_replies():
    cfg = preset("tiny-qwen3", vocab_size=64, max_position_embeddings=256)
    params = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, init_params(jax.random.key(0), cfg))
    host = _alt_batch()
    out = marginal_infogain(params, host, config=cfg, rows=3, multiple=16)
    ref = marginal_naive(params, host, config=cfg)
    np.testing.assert_allclose(np.asarray(out.r_info_BT), ref, atol=2e-5)
    assert abs(ref[0, 0]) > 1e-3 and abs(ref[0, 1]) > 1e-3
    assert float(out.r_info_BT[1, 0]) == 0.0  # deterministic feedback: no information
    assert not bool(out.valid_BT[0, 2]) and float(out.r_info_BT[0, 2]) == 0.0  # the last turn
    # 1 factual + 2 alternatives, 1 factual + 3 alternatives: 7 histories in rows of 3
    assert out.tokens_processed == 3 * 3 * 16
    t3 = marginal_infogain(params, host, config=cfg, rows=2, multiple=16, temperature=0.5)
    np.testing.assert_allclose(np.asarray(t3.r_info_BT), marginal_naive(params, host, config=cfg, temperature=0.5),
                               atol=2e-5)


def test_a_single_alternative_gives_no_gain():
    cfg = preset("tiny-qwen3", vocab_size=64, max_position_embeddings=256)
    params = init_params(jax.random.key(1), cfg)
    r = Row(tokens=[1, 2, 3, 9, 11, 9, 20, 21], actions=[(1, 3), (6, 8)], feedback=[(4, 5), (8, 8)],
            alternatives=[[((4, 5), [([11], 1.0)])], None])
    out = marginal_infogain(params, build_batch([r], length=16), config=cfg)
    assert abs(float(out.r_info_BT[0, 0])) < 1e-6


def test_vocab_limit_reaches_the_info_gain(episodes):
    trainer = _trainer("infopo", vocab_extra=64)
    assert trainer.view["vocab_limit"] == TOK.vocab_size
    host = collate_host(episodes, multiple=128, turns=3)
    batch = host.credit_batch()
    got = rl_mod.CREDIT_INPUTS["r_info"](trainer, batch, host, trainer.terms[1])
    ph = trainer.ph_ids
    limited = compute_infogain(trainer.state.model_params, batch, ph, config=trainer.config, host=host,
                               vocab_limit=TOK.vocab_size, packed_multiple=128)
    raw = compute_infogain(trainer.state.model_params, batch, ph, config=trainer.config, host=host,
                           packed_multiple=128)
    np.testing.assert_allclose(np.asarray(got), np.asarray(limited.r_info_BT), atol=1e-5)
    assert np.abs(np.asarray(limited.r_info_BT) - np.asarray(raw.r_info_BT)).max() > 1e-6
    naive = compute_infogain(trainer.state.model_params, batch, ph, config=trainer.config, mode="naive",
                             vocab_limit=TOK.vocab_size)
    np.testing.assert_allclose(np.asarray(naive.r_info_BT), np.asarray(limited.r_info_BT), atol=1e-5)


def test_marginal_prior_in_the_trainer(episodes):
    trainer = _trainer("infopo", infopo=InfoPOConfig(prior="marginal"))
    host = collate_host(episodes, multiple=128, turns=3)
    got = rl_mod.CREDIT_INPUTS["r_info"](trainer, host.credit_batch(), host, trainer.terms[1])
    want = marginal_naive(trainer.state.model_params, host, config=trainer.config)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


def test_polarity_map_reaches_faca(episodes):
    default = _trainer("faca", faca=FacaConfig())
    muted = _trainer("faca", faca=FacaConfig(polarity={"clarify_request": 0}))
    key = jax.random.key(0)
    b0, _, _, _, _ = default._credit(list(episodes), key, 3)
    b1, _, _, d1, _ = muted._credit(list(episodes), key, 3)
    pol0, pol1 = np.asarray(b0.segment_polarity_BQ), np.asarray(b1.segment_polarity_BQ)
    muted_cells = (pol0 == -1) & (pol1 == 0)  # the random policy's text draws clarify requests
    assert muted_cells.any() and ((pol0 == pol1) | muted_cells).all()
    want = reaction_advantage(b1.segment_polarity_BQ, b1.segment_valid_BQ, b1.group_id_B, muted.terms[1].settings)
    np.testing.assert_allclose(np.asarray(d1["A_proc_BQ"]), np.asarray(want), atol=1e-6)


def test_why_metrics_by_hand():
    from types import SimpleNamespace

    from jaxagent.train.why import why_metrics

    # group 0 (rows 0-2) all failed, graded 0.2 / 0.5 / 0.8; group 1 (rows 3-4) has a success
    host = SimpleNamespace(reward_B=np.array([0, 0, 0, 1, 0.0]), group_id_B=np.array([0, 0, 0, 1, 1]),
                           pad_mask_BL=np.ones((5, 4), np.int32),
                           feedback_kind_BT=np.array([[1, 2], [1, 1], [2, 1], [1, 1], [1, 1]]))
    credited = np.array([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1]], bool)
    A = np.array([[0.5, 0.5], [0.0, 7.0], [-0.5, -0.5], [1.0, 1.0], [-1.0, -1.0]])  # sums 1, 0, -1 in group 0
    r = np.array([[0.1, 0.9], [0.3, 0.0], [0.2, 0.4], [0.0, 0.0], [0.0, 0.0]])
    P = np.array([[1.0], [0.0], [-1.0], [0.0], [0.0]])
    m = why_metrics({"A_info_BT": A, "info_valid_BT": credited, "r_info_BT": r, "A_proc_BQ": P}, host,
                    [0.2, 0.5, 0.8, 1.0, None])
    assert m["why/all_zero_rows"] == 3
    assert m["why/info_partial_corr"] == pytest.approx(-1.0) and m["why/proc_partial_corr"] == pytest.approx(-1.0)
    # credited correction turns: (0,1) and (2,0): r 0.9, 0.2; A 0.5, -0.5
    assert m["why/r_info/correction"] == pytest.approx(0.55) and m["why/A_info/correction"] == pytest.approx(0.0)
    # positive credited A mass: 0.5 + 0.5 (row 0) + 1 + 1 (row 3) = 3; on corrections 0.5
    assert m["why/A_info_pos_share/correction"] == pytest.approx(0.5 / 3)
    assert m["why/A_info_pos_share/information"] == pytest.approx(2.5 / 3)


def test_config_checks_the_credit_settings_against_the_environment():
    from jaxagent.configlib import ConfigError
    from jaxagent.jobs.config import load_config

    cfg = load_config(None, ["faca.polarity.be_vague=0", "infopo.prior=marginal", "env.gym=telepathy"])
    assert cfg.faca.polarity_map()["be_vague"] == 0 and cfg.infopo.prior == "marginal"
    with pytest.raises(ConfigError, match="faca.polarity.bogus: not a reaction label of env.kind='gym'"):
        load_config(None, ["faca.polarity.bogus=0"])
    with pytest.raises(ConfigError, match="infopo.prior='marginal': env.kind='gym' does not enumerate"):
        load_config(None, ["infopo.prior=marginal", "env.gym=function"])
    with pytest.raises(ConfigError, match=r"polarity\['be_vague'\]=2"):
        load_config(None, ["faca.polarity.be_vague=2"])

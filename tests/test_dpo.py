"""DPO training (jaxagent/train/dpo.py): the loss against a hand computation from the model's own
log-probs, the completion masks, the reference computed once, weights, microbatching, learning a toy
preference, resuming, the sharded step, and the errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxagent.credit.losses import dpo_loss
from jaxagent.models import ConfigError, LogicalRules, MeshConfig, forward, init_params, make_mesh, preset
from jaxagent.models.sharding import batch_sharding
from jaxagent.models.placement import param_shardings
from jaxagent.train.dpo import (
    DPO_AGG,
    DPOSettings,
    PairTokens,
    as_step_batch,
    check_pairs,
    dpo_loss_fn,
    dpo_steps,
    pair_batch,
    pair_order,
    reference_logps,
    step_pairs,
    train_dpo,
)
from jaxagent.train.step import (
    SKIP_CHECK_MIN_UPDATES,
    StepShardings,
    TrainingFailed,
    TrainState,
    make_update,
    place_on_mesh,
)

CFG = preset("tiny-qwen2", vocab_size=48, max_position_embeddings=64)
PAIRS = [  # different prompt and completion lengths: padding in every batch
    PairTokens([1, 2, 3], [4, 5], [6, 7, 8]),
    PairTokens([9, 10], [11, 12, 13, 14], [15]),
    PairTokens([16], [17, 18, 19], [20, 21]),
    PairTokens([22, 23, 24, 25], [26], [27, 28]),
    PairTokens([29, 30], [31, 32], [33, 34, 35]),
]


_forward = jax.jit(functools.partial(forward, config=CFG))


def _params(seed):
    return init_params(jax.random.key(seed), CFG)


def _naive_logp(params, prompt, completion):
    """Sum over the completion of log softmax(logits at t - 1)[token t], one unpadded row, float64."""
    seq = [*prompt, *completion]
    logits = np.asarray(_forward(params, jnp.asarray([seq], jnp.int32))[0], np.float64)
    lsm = logits - logits.max(-1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(-1, keepdims=True))
    return sum(lsm[t - 1, seq[t]] for t in range(len(prompt), len(seq)))


def _naive_pairs(params, pairs):
    return np.asarray([[_naive_logp(params, p.prompt, p.chosen), _naive_logp(params, p.prompt, p.rejected)]
                       for p in pairs])


def _log_sigmoid(x):
    return -np.log1p(np.exp(-x))


# ----------------------------------------------------------------------------- the loss
@pytest.mark.parametrize("loss_type,smoothing", [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0)])
def test_loss_and_metrics_hand_computed_from_the_models_log_probs(loss_type, smoothing):
    pairs, beta = PAIRS[:2], 0.5
    policy, reference = _params(0), _params(1)
    pol, ref = _naive_pairs(policy, pairs), _naive_pairs(reference, pairs)
    logits = (pol[:, 0] - pol[:, 1]) - (ref[:, 0] - ref[:, 1])
    if loss_type == "sigmoid":
        losses = -(1 - smoothing) * _log_sigmoid(beta * logits) - smoothing * _log_sigmoid(-beta * logits)
    else:
        losses = (logits - 1 / (2 * beta)) ** 2
    chosen, rejected = beta * (pol[:, 0] - ref[:, 0]), beta * (pol[:, 1] - ref[:, 1])
    assert np.all(np.abs(chosen - rejected) > 1e-3)  # the accuracy below cannot flip on rounding

    batch = pair_batch(pairs, [0, 1], multiple=8, ref=ref.astype(np.float32))
    loss, m = jax.jit(dpo_loss_fn(CFG, beta, loss_type, smoothing))(policy, batch)
    np.testing.assert_allclose(loss, losses.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m["loss"], losses.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m["logp_chosen"], pol[:, 0].mean(), rtol=1e-5)
    np.testing.assert_allclose(m["logp_rejected"], pol[:, 1].mean(), rtol=1e-5)
    np.testing.assert_allclose(m["rewards_chosen"], chosen.mean(), atol=1e-5)
    np.testing.assert_allclose(m["rewards_rejected"], rejected.mean(), atol=1e-5)
    np.testing.assert_allclose(m["reward_margin"], (chosen - rejected).mean(), atol=1e-5)
    np.testing.assert_allclose(m["logits"], logits.mean(), atol=1e-5)
    assert float(m["reward_accuracy"]) == pytest.approx(np.mean(chosen > rejected))
    assert float(m["num_seqs"]) == 2.0
    assert float(m["num_tokens"]) == sum(len(p.chosen) + len(p.rejected) for p in pairs)


def test_masks_cover_exactly_the_completion_tokens():
    ref = np.arange(10, dtype=np.float32).reshape(5, 2)
    b = pair_batch(PAIRS, [3, 0, 2], multiple=8, ref=ref)
    assert b["chosen_tokens"].shape == b["rejected_tokens"].shape == (3, 8)
    assert b["chosen_mask"].dtype == np.bool_ and b["chosen_tokens"].dtype == np.int32
    for row, i in enumerate([3, 0, 2]):
        p = PAIRS[i]
        for name in ("chosen", "rejected"):
            seq = [*p.prompt, *getattr(p, name)]
            want = np.zeros(8, bool)
            want[len(p.prompt):len(seq)] = True
            np.testing.assert_array_equal(b[f"{name}_mask"][row], want)
            np.testing.assert_array_equal(b[f"{name}_tokens"][row], seq + [0] * (8 - len(seq)))
    np.testing.assert_array_equal(b["ref_chosen"], [6.0, 0.0, 4.0])
    np.testing.assert_array_equal(b["ref_rejected"], [7.0, 1.0, 5.0])
    np.testing.assert_array_equal(b["weight"], [1.0, 1.0, 1.0])
    assert pair_batch(PAIRS, [0], multiple=64)["chosen_tokens"].shape == (1, 64)
    assert "ref_chosen" not in pair_batch(PAIRS, [0])

    # what sits in the padding never reaches the scores (right padding, causal attention)
    params = _params(0)
    loss_fn = jax.jit(dpo_loss_fn(CFG))
    b = pair_batch(PAIRS, [0, 1, 2, 3, 4], multiple=8, ref=ref)
    _, m = loss_fn(params, b)
    noisy = dict(b)
    rng = np.random.default_rng(0)
    for name in ("chosen", "rejected"):
        pad = np.zeros_like(b[f"{name}_mask"])
        for row, p in enumerate(PAIRS):
            pad[row, len(p.prompt) + len(getattr(p, name)):] = True
        noisy[f"{name}_tokens"] = np.where(pad, rng.integers(1, CFG.vocab_size, pad.shape), b[f"{name}_tokens"])
        noisy[f"{name}_tokens"] = noisy[f"{name}_tokens"].astype(np.int32)
    assert not np.array_equal(noisy["chosen_tokens"], b["chosen_tokens"])
    _, m2 = loss_fn(params, noisy)
    for k in ("logp_chosen", "logp_rejected", "loss"):
        np.testing.assert_allclose(m2[k], m[k], rtol=1e-6)


def test_reference_logps_equal_a_naive_per_pair_computation():
    params = _params(2)
    want = _naive_pairs(params, PAIRS)
    got = reference_logps(params, CFG, PAIRS, batch_size=2, multiple=8)  # batched by length, the last filled
    assert got.shape == (5, 2) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(reference_logps(params, CFG, PAIRS, batch_size=5, multiple=8), got, rtol=1e-6)


def test_unit_weights_are_exactly_the_plain_mean_and_weights_weigh_pairs():
    params, ref = _params(0), _naive_pairs(_params(1), PAIRS).astype(np.float32)
    loss_fn = jax.jit(dpo_loss_fn(CFG, beta=0.3))
    b = pair_batch(PAIRS, [0, 1, 2, 3], multiple=8, ref=ref)
    l1, m1 = loss_fn(params, b)
    l0, m0 = loss_fn(params, {k: v for k, v in b.items() if k != "weight"})  # no weights: all 1
    assert float(l1) == float(l0) and all(float(m1[k]) == float(m0[k]) for k in m0)
    # ... and credit.losses.dpo_loss's plain mean over the pairs' log-probs
    pol = jnp.asarray(_naive_pairs(params, PAIRS[:4]), jnp.float32)
    plain, pm = dpo_loss(pol[:, 0], pol[:, 1], jnp.asarray(ref[:4, 0]), jnp.asarray(ref[:4, 1]), beta=0.3)
    np.testing.assert_allclose(l1, plain, rtol=1e-5)
    for k in ("reward_accuracy", "reward_margin", "rewards_chosen", "logits"):
        np.testing.assert_allclose(m1[k], pm[k], rtol=1e-5, atol=1e-6)
    # weights: (2 * l_0 + 0 * l_1 + 1 * l_2 + 1 * l_3) / 4 is the mean of l_0, l_0, l_2, l_3
    weighted = dict(b, weight=np.asarray([2.0, 0.0, 1.0, 1.0], np.float32))
    lw, mw = loss_fn(params, weighted)
    ls, ms = loss_fn(params, pair_batch(PAIRS, [0, 0, 2, 3], multiple=8, ref=ref))
    np.testing.assert_allclose(lw, ls, rtol=1e-5)
    assert float(mw["num_seqs"]) == 4.0
    for k in ("reward_margin", "reward_accuracy", "logp_chosen"):
        np.testing.assert_allclose(mw[k], ms[k], rtol=1e-5, atol=1e-6)
    # [B, 1] per-pair leaves (as_step_batch) read as [B]
    lb, _ = loss_fn(params, as_step_batch(weighted))
    np.testing.assert_allclose(lb, lw, rtol=1e-6)


def test_two_microbatches_give_the_same_update_as_one():
    params, ref = _params(0), _naive_pairs(_params(1), PAIRS[:4]).astype(np.float32)
    b = as_step_batch(pair_batch(PAIRS[:4], range(4), multiple=8, ref=ref))
    b["weight"] = np.asarray([[1.0], [2.0], [0.5], [0.0]], np.float32)  # uneven microbatch weights: 3 and 0.5
    tx = optax.sgd(0.5)
    out = {}
    for mb in (1, 2):
        state = TrainState.create(jax.tree.map(jnp.copy, params), tx)
        out[mb] = make_update(dpo_loss_fn(CFG, beta=0.5), tx, microbatches=mb, agg=DPO_AGG)(state, b)
    for a, c in zip(jax.tree.leaves(out[1][0].params), jax.tree.leaves(out[2][0].params)):
        np.testing.assert_allclose(a, c, atol=1e-5)
    for k in ("loss", "reward_margin", "logp_chosen"):
        np.testing.assert_allclose(out[2][1][k], out[1][1][k], rtol=1e-5, atol=1e-6)
    assert float(out[2][1]["num_seqs"]) == float(out[1][1]["num_seqs"]) == 3.5
    assert any(not np.allclose(a, c) for a, c in zip(jax.tree.leaves(params), jax.tree.leaves(out[1][0].params)))


# ----------------------------------------------------------------------------- training
def test_dpo_learns_a_toy_preference_against_the_frozen_initial_reference():
    pair = PairTokens([1, 2, 3], [4, 5], [6, 7])
    params = _params(3)
    initial = jax.tree.map(jnp.copy, params)
    ref0 = _naive_pairs(initial, [pair])[0]
    settings = DPOSettings(beta=0.1, lr=1e-2, warmup_ratio=0.0, epochs=30, batch_size=1)
    logged = []
    trained, history = train_dpo(params, CFG, [pair], settings, log=lambda i, m: logged.append(i), multiple=8)
    assert logged == list(range(30)) and [h["step"] for h in history] == logged
    assert history[0]["logits"] == pytest.approx(0.0, abs=1e-5)  # the policy starts as the reference
    assert history[0]["reward_accuracy"] == 0.0 and history[0]["lr"] == pytest.approx(1e-2)
    assert history[-1]["reward_accuracy"] == 1.0 and history[-1]["loss"] < history[0]["loss"]
    # every step scored against the initial params' log-probs: ref = logp - reward / beta
    for h in history:
        assert h["logp_chosen"] - h["rewards_chosen"] / 0.1 == pytest.approx(ref0[0], abs=2e-4)
        assert h["logp_rejected"] - h["rewards_rejected"] / 0.1 == pytest.approx(ref0[1], abs=2e-4)
    now = _naive_pairs(trained, [pair])[0]
    margin = (now[0] - now[1]) - (ref0[0] - ref0[1])
    assert margin > 1.0
    assert now[0] > ref0[0] and now[1] < ref0[1]
    np.testing.assert_allclose(_naive_pairs(initial, [pair])[0], ref0)  # the reference's params untouched


def test_order_is_a_pure_function_of_seed_and_epoch_and_every_pair_trains_once_an_epoch():
    s = DPOSettings(batch_size=2, epochs=3, seed=7)
    assert dpo_steps(5, s) == 9
    for epoch in range(3):
        seen = []
        for j in range(3):
            idx, live = step_pairs(epoch * 3 + j, 5, s)
            assert idx.shape == live.shape == (2,)
            seen += idx[live].tolist()
        assert sorted(seen) == list(range(5))
        assert step_pairs(epoch * 3 + 2, 5, s)[1].tolist() == [True, False]  # the short batch: one filler
    np.testing.assert_array_equal(pair_order(7, 1, 5), pair_order(7, 1, 5))
    assert not all(np.array_equal(pair_order(7, 0, 50), pair_order(7, e, 50)) for e in (1, 2))
    assert not np.array_equal(pair_order(7, 0, 50), pair_order(8, 0, 50))
    # a batch larger than the pairs: each pair once, the rest fillers
    idx, live = step_pairs(0, 3, DPOSettings(batch_size=8))
    assert sorted(idx[live].tolist()) == [0, 1, 2] and live.sum() == 3


def test_a_resumed_run_equals_the_uninterrupted_one():
    settings = DPOSettings(lr=1e-2, warmup_ratio=0.5, epochs=2, batch_size=2, seed=1)  # 6 steps, warmup 3
    params = _params(4)
    ref = reference_logps(params, CFG, PAIRS, 2, multiple=8)
    saved = {}

    def keep(step, state):
        saved[step] = jax.tree.map(jnp.copy, state)

    full, hist = train_dpo(jax.tree.map(jnp.copy, params), CFG, PAIRS, settings, on_step=keep, multiple=8)
    assert sorted(saved) == list(range(1, 7))
    again, rest = train_dpo(params, CFG, PAIRS, settings, state=saved[4], start_step=4, ref_logps=ref, multiple=8)
    assert [h["step"] for h in rest] == [4, 5]
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(again)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert rest[-1]["loss"] == pytest.approx(hist[-1]["loss"], rel=1e-5)
    assert [h["epoch"] for h in hist] == [0, 0, 0, 1, 1, 1]


def test_refuses_when_every_update_is_skipped():
    bad = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), _params(0))
    settings = DPOSettings(lr=1e-2, epochs=10, batch_size=1)
    with pytest.raises(ValueError, match=r"pair 0: reference log-probs .* not finite"):
        train_dpo(bad, CFG, PAIRS[:1], settings, multiple=8)
    logged = []
    with pytest.raises(TrainingFailed, match=r"dpo: all 4 updates .* skipped"):
        train_dpo(bad, CFG, PAIRS[:1], settings, ref_logps=np.zeros((1, 2), np.float32),
                  log=lambda i, m: logged.append(m["skipped"]), multiple=8)
    assert logged == [1.0] * SKIP_CHECK_MIN_UPDATES


def test_sharded_training_equals_single_device():
    pairs = [PairTokens([1 + i, 2], [3, 4 + i], [5 + i]) for i in range(8)]
    settings = DPOSettings(batch_size=8, microbatches=2, beta=0.5)
    params = _params(5)
    tx = optax.sgd(0.5)
    want, wh = train_dpo(jax.tree.map(jnp.copy, params), CFG, pairs, settings, tx=tx, multiple=8)
    rules = LogicalRules(make_mesh(MeshConfig(data=2, fsdp=4, tensor=1)))
    sp = jax.device_put(params, param_shardings(CFG, rules))
    ref = reference_logps(sp, CFG, pairs, 8, multiple=8, sharding=batch_sharding(rules, shape=(16, 1)))
    np.testing.assert_allclose(ref, reference_logps(params, CFG, pairs, 8, multiple=8), rtol=1e-5)
    state = place_on_mesh(TrainState.create(sp, tx), rules.mesh)
    shardings = StepShardings.of(state, batch_sharding(rules, shape=(8, 1)))
    got, gh = train_dpo(sp, CFG, pairs, settings, tx=tx, shardings=shardings, state=state, multiple=8)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(a, b, atol=2e-6)
    assert len(jax.tree.leaves(got)[0].sharding.device_set) == 8
    assert gh[0]["loss"] == pytest.approx(wh[0]["loss"], rel=1e-5)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs,message", [
    (dict(beta=0), "dpo.beta=0: expected a number > 0"),
    (dict(loss_type="hinge"), "dpo.loss_type='hinge': expected one of"),
    (dict(label_smoothing=0.5), r"dpo.label_smoothing=0.5: expected a number in \[0, 0.5\)"),
    (dict(loss_type="ipo", label_smoothing=0.1), "dpo.label_smoothing=0.1: expected 0 with dpo.loss_type='ipo'"),
    (dict(lr=-1.0), "dpo.lr=-1.0: expected a finite number >= 0"),
    (dict(lr=float("nan")), "dpo.lr=nan"),
    (dict(epochs=0), "dpo.epochs=0: expected an int >= 1"),
    (dict(epochs=1.5), "dpo.epochs=1.5"),
    (dict(batch_size=0), "dpo.batch_size=0"),
    (dict(batch_size=8, microbatches=3), "dpo.microbatches=3: expected a divisor of dpo.batch_size=8"),
    (dict(warmup_ratio=1.5), r"dpo.warmup_ratio=1.5: expected a number in \[0, 1\]"),
    (dict(max_len=1), "dpo.max_len=1: expected an int >= 2"),
    (dict(seed=-1), "dpo.seed=-1: expected an int >= 0"),
])
def test_settings_errors_name_the_dotted_key_the_value_and_what_was_expected(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DPOSettings(**kwargs)


def test_pair_errors_name_the_pair():
    with pytest.raises(ValueError, match=r"pair 2: prompt \+ rejected completion is 6 tokens \(4 \+ 2\) > "
                                         r"dpo.max_len=5"):
        train_dpo(_params(0), CFG, [PAIRS[2], PAIRS[4], PAIRS[3]], DPOSettings(max_len=5))
    with pytest.raises(ValueError, match="pair 1: empty prompt"):
        check_pairs([PAIRS[0], PairTokens([], [1], [2])])
    with pytest.raises(ValueError, match="pair 0: empty rejected completion"):
        check_pairs([PairTokens([1], [2], [])])
    with pytest.raises(ValueError, match=r"pair 0: weight=-1.0; expected a finite number >= 0"):
        check_pairs([PairTokens([1], [2], [3], -1.0)])
    with pytest.raises(ValueError, match="all 1 weights are 0"):
        check_pairs([PairTokens([1], [2], [3], 0.0)])
    with pytest.raises(ValueError, match="pairs: empty"):
        check_pairs([])
    with pytest.raises(ValueError, match=r"ref_logps: shape \(2, 2\); expected \(5, 2\)"):
        train_dpo(_params(0), CFG, PAIRS, DPOSettings(), ref_logps=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="start_step=9"):
        train_dpo(_params(0), CFG, PAIRS, DPOSettings(), ref_logps=np.zeros((5, 2)), start_step=9)
    with pytest.raises(ConfigError, match="beta=0"):
        dpo_loss_fn(CFG, beta=0.0)

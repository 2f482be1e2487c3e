"""The training step: schedules, gradient accumulation equal to the full batch, non-finite
updates skipped, log-prob alignment, SFT learning, and the sharded update."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxagent.credit.losses import PPOConfig
from jaxagent.models import LogicalRules, MeshConfig, init_params, make_mesh, preset, token_logprobs
from jaxagent.models.sharding import batch_sharding
from jaxagent.models.placement import param_shardings
from jaxagent.train.step import (OptimSettings, StepShardings, TrainState, learning_rate, make_optimizer, make_update,
                                 place_on_mesh, ppo_loss_fn, sequence_scores, sft_loss_fn)

CFG = preset("tiny-qwen2", vocab_size=48, max_position_embeddings=64)


def _batch(B=8, L=16, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CFG.vocab_size, (B, L)).astype(np.int32)
    mask = np.zeros((B, L), np.float32)
    for b in range(B):  # rows with different numbers of trained tokens (row 3 has none)
        if b != 3:
            mask[b, L - 2 - b : L] = 1
    return {"tokens": jnp.asarray(tokens), "loss_mask": jnp.asarray(mask)}


def test_learning_rate_schedule_hand_computed():
    lr = learning_rate(OptimSettings(lr=1.0, warmup_steps=10, schedule="cosine", decay_steps=10, final_lr_fraction=0.1))
    assert float(lr(0)) == 0.0
    assert float(lr(5)) == pytest.approx(0.5)
    assert float(lr(10)) == pytest.approx(1.0)
    # cosine: 0.1 + 0.9 * (1 + cos(pi * 5 / 10)) / 2 = 0.55 half way through the decay
    assert float(lr(15)) == pytest.approx(0.55, abs=1e-6)
    assert float(lr(30)) == pytest.approx(0.1)
    assert float(learning_rate(OptimSettings(lr=0.3))(1000)) == pytest.approx(0.3)


def test_optimizer_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="lr=-1"):
        make_optimizer(OptimSettings(lr=-1.0))
    with pytest.raises(ValueError, match="decay_steps=0"):
        make_optimizer(OptimSettings(schedule="cosine"))
    with pytest.raises(ValueError, match="clip_norm=0"):
        make_optimizer(OptimSettings(clip_norm=0.0))


def test_sequence_scores_align_entry_t_with_token_t():
    params = init_params(jax.random.key(0), CFG)
    tokens = _batch()["tokens"]
    lp = token_logprobs(params, tokens, config=CFG)
    got, ent = sequence_scores(params, tokens, config=CFG, entropy=True)
    np.testing.assert_array_equal(got[:, 0], 0.0)
    np.testing.assert_allclose(got[:, 1:], lp[:, :-1], atol=1e-6)
    assert bool(jnp.all(ent[:, 1:] > 0)) and bool(jnp.all(ent[:, 0] == 0))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_accumulated_update_equals_the_full_batch_update(agg):
    params = init_params(jax.random.key(1), CFG)
    tx = optax.sgd(0.5)
    loss = sft_loss_fn(CFG, agg=agg)
    batch = _batch()
    out = {}
    for m in (1, 4):
        state = TrainState.create(jax.tree.map(jnp.copy, params), tx)
        state, metrics = make_update(loss, tx, microbatches=m, agg=agg)(state, batch)
        out[m] = (state, metrics)
    for a, b in zip(jax.tree.leaves(out[1][0].params), jax.tree.leaves(out[4][0].params)):
        np.testing.assert_allclose(a, b, atol=2e-6)
    np.testing.assert_allclose(out[4][1]["loss"], out[1][1]["loss"], rtol=1e-5)
    assert float(out[4][1]["num_tokens"]) == float(np.asarray(batch["loss_mask"]).sum())
    changed = any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(out[1][0].params)))
    assert changed


def test_non_finite_updates_are_skipped_and_counted():
    params = init_params(jax.random.key(2), CFG)
    tx = make_optimizer(OptimSettings(lr=0.1))
    ppo = PPOConfig()
    batch = _batch()
    B, L = batch["tokens"].shape
    old = sequence_scores(params, batch["tokens"], config=CFG)
    adv = np.ones((B, L), np.float32)
    bad = dict(batch, old_logp=old, advantages=jnp.asarray(adv))
    adv_nan = adv.copy()
    adv_nan[0, L - 1] = np.nan  # on a trained token: the loss is nan
    update = make_update(ppo_loss_fn(CFG, ppo), tx, microbatches=2)
    state = TrainState.create(jax.tree.map(jnp.copy, params), tx)
    state, m = update(state, dict(bad, advantages=jnp.asarray(adv_nan)))
    assert int(state.step) == 0 and int(state.skipped) == 1 and float(m["finite"]) == 0.0
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)
    state, m = update(state, bad)
    assert int(state.step) == 1 and int(state.skipped) == 1 and float(m["finite"]) == 1.0
    # nan on an untrained token never reaches the loss
    adv_nan_off = adv.copy()
    adv_nan_off[3, 0] = np.nan
    state, m = update(state, dict(bad, advantages=jnp.asarray(adv_nan_off)))
    assert int(state.step) == 2 and int(state.skipped) == 1


def test_sft_steps_fit_a_small_batch():
    params = init_params(jax.random.key(3), CFG)
    tx = make_optimizer(OptimSettings(lr=3e-3))
    update = make_update(sft_loss_fn(CFG), tx, lr_schedule=learning_rate(OptimSettings(lr=3e-3)))
    state = TrainState.create(params, tx)
    batch = _batch(B=4, seed=5)
    first = None
    for _ in range(60):
        state, m = update(state, batch)
        first = float(m["loss"]) if first is None else first
    assert float(m["loss"]) < 0.25 * first
    assert float(m["lr"]) == pytest.approx(3e-3)
    assert int(state.step) == 60


def _single_device_sgd_update(seed):
    """(params, tx, loss, batch, the single-device update's state and metrics) for a sharded run to
    match. SGD: the comparison checks gradients; Adam's g / sqrt(v) would blow the last-ulp
    differences of a different reduction order up to lr-sized steps on near-zero gradients."""
    params = init_params(jax.random.key(seed), CFG)
    tx = optax.sgd(0.5)
    loss = sft_loss_fn(CFG)
    batch = _batch()
    ref_state, ref_m = make_update(loss, tx, microbatches=2)(TrainState.create(jax.tree.map(jnp.copy, params), tx),
                                                             batch)
    return params, tx, loss, batch, ref_state, ref_m


def test_sharded_update_equals_single_device():
    params, tx, loss, batch, ref_state, ref_m = _single_device_sgd_update(4)
    mesh = make_mesh(MeshConfig(data=2, fsdp=4, tensor=1))
    rules = LogicalRules(mesh)
    sp = jax.device_put(params, param_shardings(CFG, rules))
    sb = jax.tree.map(lambda x: jax.device_put(x, batch_sharding(rules, shape=x.shape)), batch)
    state, m = make_update(loss, tx, microbatches=2)(TrainState.create(sp, tx), sb)
    for a, b in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(state.params)):
        np.testing.assert_allclose(a, b, atol=2e-6)
    leaf = jax.tree.leaves(state.params)[0]
    assert len(leaf.sharding.device_set) == 8
    np.testing.assert_allclose(m["loss"], ref_m["loss"], rtol=1e-5)


def test_declared_shardings_keep_the_state_where_it_was():
    # One jitted step with in/out shardings (StepShardings): the update equals the undeclared
    # one, and every leaf of the returned state (the replicated counters and norm weights too)
    # comes back on the sharding it went in with, update after update.
    params, tx, loss, batch, ref_state, ref_m = _single_device_sgd_update(5)
    rules = LogicalRules(make_mesh(MeshConfig(data=2, fsdp=4, tensor=1)))
    state = place_on_mesh(TrainState.create(jax.device_put(params, param_shardings(CFG, rules)), tx), rules.mesh)
    shardings = StepShardings.of(state, batch_sharding(rules, shape=batch["tokens"].shape))
    update = make_update(loss, tx, microbatches=2, shardings=shardings)
    before = jax.tree.map(lambda x: x.sharding, state)
    state, m = update(state, shardings.put_batch(batch))
    for a, b in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(state.params)):
        np.testing.assert_allclose(a, b, atol=2e-6)
    np.testing.assert_allclose(m["loss"], ref_m["loss"], rtol=1e-5)
    assert jax.tree.map(lambda x: x.sharding, state) == before
    assert m["loss"].sharding.is_fully_replicated
    state, _ = update(state, shardings.put_batch(batch))  # the same program again: no re-placement
    assert jax.tree.map(lambda x: x.sharding, state) == before and update._cache_size() == 1
    with pytest.raises(ValueError, match="not on a mesh"):
        StepShardings.of(TrainState.create(params, tx), shardings.batch)  # counters not yet placed

"""RL diagnostics (issue 15): the gradient signal-to-noise of an update (cosine of the even and odd
microbatches' gradients), credit coverage and the share of groups the outcome does not
discriminate, the diagnostics plot, and the summary's attribution of gains to SFT and to RL."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxagent.jobs.config import load_config
from jaxagent.credit.grpo import zero_advantage_group_share
from jaxagent.jobs import attribution
from jaxagent.eval.report import diagnostics_figure, plot_run, summary_table
from jaxagent.train.step import TrainState, make_update


def _linear_update(microbatches):
    """loss = sum over the microbatch's rows of w . x (a constant normaliser): each microbatch's
    gradient is the sum of its rows' x."""

    def loss_fn(params, batch):
        loss = jnp.sum(batch["x"] @ params["w"])
        return loss, {"num_tokens": jnp.float32(batch["x"].shape[0]), "num_seqs": jnp.float32(batch["x"].shape[0])}

    tx = optax.sgd(0.1)
    state = TrainState.create({"w": jnp.zeros(2)}, tx)
    return state, make_update(loss_fn, tx, microbatches=microbatches, agg="seq_mean_token_sum_norm")


@pytest.mark.parametrize("rows,cos", [([[1, 0], [0, 1]], 0.0), ([[1, 0], [2, 0]], 1.0), ([[1, 1], [-1, -1]], -1.0),
                                      ([[3, 0], [0, 4], [0, 1], [1, 0]], 7 / np.sqrt(170))])
def test_grad_cos_halves_by_hand(rows, cos):
    """One row per microbatch; the even microbatches' summed gradient against the odd ones'. Four
    rows: even = [3, 0] + [0, 1] = [3, 1], odd = [0, 4] + [1, 0] = [1, 4]: cos = 7 / sqrt(10 * 17)."""
    x = jnp.asarray(rows, jnp.float32)
    state, update = _linear_update(len(rows))
    _, m = update(state, {"x": x})
    assert float(m["grad_cos_halves"]) == pytest.approx(cos, abs=1e-6)


def test_one_microbatch_has_no_halves():
    state, update = _linear_update(1)
    _, m = update(state, {"x": jnp.ones((2, 2))})
    assert "grad_cos_halves" not in m


def test_zero_advantage_group_share_by_hand():
    # groups: 0 all zero (counted), 1 mixed, 2 one member with 0 (counted), 3 only a padding row (absent)
    A = jnp.asarray([0.0, 0.0, 1.0, -1.0, 0.0, 0.7])
    gid = jnp.asarray([0, 0, 1, 1, 2, 3])
    valid = jnp.asarray([True, True, True, True, True, False])
    assert float(zero_advantage_group_share(A, gid, valid)) == pytest.approx(2 / 3)
    assert float(zero_advantage_group_share(A, gid, jnp.zeros(6, bool))) == 0.0
    assert float(jax.jit(zero_advantage_group_share)(A, gid, valid)) == pytest.approx(2 / 3)


def test_attribution_splits_the_gains_by_stage():
    before = {"success": 0.0, "sampled/success": 0.05}
    after_sft = {"success": 0.8, "sampled/success": 0.5}
    after = {"success": 0.9, "sampled/success": 0.7}
    out = attribution(before, after_sft, after, load_config(None, []))
    assert out["success_after_sft"] == 0.8 and out["gain_sft"] == pytest.approx(0.8)
    assert out["gain_rl"] == pytest.approx(0.1)
    assert out["sampled_success_after_sft"] == 0.5 and out["sampled_gain_rl"] == pytest.approx(0.2)
    assert out["sampled_success_before"] == 0.05 and out["sampled_success_after"] == 0.7
    rl_only = attribution({"success": 0.3}, None, {"success": 0.2}, load_config(None, ["job=rl"]))
    assert rl_only == {"gain_rl": pytest.approx(-0.1)}


def test_summary_table_with_the_sft_stage():
    table = summary_table({"success": 0.0, "sampled/success": 0.1}, {"success": 0.9, "sampled/success": 0.7},
                          after_sft={"success": 0.8, "sampled/success": 0.5}, keys=("success", "sampled/success"))
    cells = [[c.strip() for c in line.split("|")] for line in table.splitlines()]
    assert cells[0] == ["metric", "before", "after SFT", "after", "SFT", "RL"]
    assert cells[2] == ["success", "0.000", "0.800", "0.900", "+0.800", "+0.100"]
    assert cells[3] == ["sampled/success", "0.100", "0.500", "0.700", "+0.400", "+0.200"]


def _rl(i, **kw):
    return {"phase": "rl", "step": i, "success": 0.1 * i, "reward": 0.1 * i, **kw}


def test_diagnostics_plot(tmp_path):
    recs = [_rl(i, **{"update/grad_cos_halves": 0.2, "update/approx_kl_k3": 1e-3, "update/kl_ref": 0.01 * i,
                      "update/clip_frac": 0.01, "update/entropy": 0.3, "credit/zero_adv_group_share": 0.25,
                      "credit/cover/ext": 0.75}) for i in range(4)]
    fig = diagnostics_figure(recs)
    assert len(fig.axes) == 4
    assert [p.name for p in plot_run(recs, tmp_path)] == ["reward.png", "rl_diagnostics.png"]
    # panels without data are left out; no RL records, no figure
    assert len(diagnostics_figure([_rl(0, **{"update/entropy": 0.3})]).axes) == 1
    assert diagnostics_figure([_rl(0)]) is None and diagnostics_figure([]) is None
    json.dumps(recs)  # the records are plain JSON

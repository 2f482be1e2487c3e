"""`jaxagent.jobs.memplan`: the ``--plan`` memory plan. Hand-computed parameter, optimizer and KV
bytes for the tiny preset; one compiled update cross-checked against them; the paper-scale InfoPO
config planned on an abstract mesh (more devices than this host) with a verdict per device kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxagent.jobs.config import load_config
from jaxagent.jobs.memplan import DEVICE_KINDS, format_plan, kv_cache_bytes, plan_memory

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.preset=tiny-qwen2", "mesh.fsdp=1", "rollout.slots=4", "rollout.capacity=128", "rollout.max_tokens=128", "rollout.park_rows=3",
        "rl.group_size=2", "rl.tasks_per_step=2", "rl.minibatch_size=4", "rl.microbatches=2"]


def tiny_layer_params(D=64, N=4, K=2, H=16, F=128) -> int:
    q = D * N * H + N * H  # weight + bias (qwen2)
    kv = 2 * (D * K * H + K * H)
    o = N * H * D
    mlp = 3 * D * F
    norms = 2 * D
    return q + kv + o + mlp + norms


def test_tiny_terms_by_hand():
    cfg = load_config(None, TINY)
    plan = plan_memory(cfg, compile=False)
    from jaxagent.jobs.build import planning_model_config

    V = planning_model_config(cfg)[0].vocab_size  # the builtin tokenizer's, rounded up to 64
    count = 2 * tiny_layer_params() + 64 + V * 64  # two layers, the final norm, tied embeddings
    b = plan["per_device_bytes"]
    assert b["parameters"] == 4 * count  # float32
    assert b["optimizer_state"] == 2 * 4 * count  # AdamW: mu and nu, float32 like the parameters
    assert b["gradients"] == 2 * 4 * count + 4 * count  # two fp32 accumulators (microbatches=2) + the gradient
    kv = 2 * 2 * 4 * 128 * 2 * 16 * 4  # layers x (K, V) x slots x capacity x kv_heads x head_dim x 4 bytes
    assert b["kv_cache"] == kv
    assert b["park_cache"] == 2 * 2 * (3 + 1) * 128 * 2 * 16 * 4  # park_rows + the spare row
    assert b["engine_logits"] == 4 * V * 4
    assert set(plan["verdicts"]) == set(DEVICE_KINDS) and set(plan["verdicts"].values()) == {"fits"}


def test_tiny_update_compiles_and_matches_the_analytic_state():
    cfg = load_config(None, TINY)
    plan = plan_memory(cfg, programs=("update",))
    m = plan["programs"]["update"]
    assert "error" not in m, m
    b = plan["per_device_bytes"]
    state = b["parameters"] + b["optimizer_state"]
    # the update's arguments: the state (+ counters) and the batch (4 rows x 128 positions, 5 arrays of 4 bytes)
    batch = 5 * 4 * 128 * 4
    assert state + batch <= m["argument"] <= state + batch + 1024
    assert m["alias"] >= state  # donated: the new state is written where the old one was
    assert m["temp"] > 0 and plan["largest_transient"] == "update"
    assert plan["peak_per_device"] == plan["resident"] + m["transient"]


def test_paper_scale_plan_on_an_abstract_mesh():
    cfg = load_config(str(ROOT / "configs/infopo_7b.yaml"), [])
    plan = plan_memory(cfg, compile=False)  # 4 devices asked, fewer here: the analytic terms, and it says so
    assert plan["devices"] == 4 and plan["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    assert "not downloaded" in plan["shapes_from"]
    assert any("cudnn" in n and "blockwise" in n for n in plan["notes"])
    b = plan["per_device_bytes"]
    assert b["kv_cache"] == kv_cache_bytes_7b(64) and b["park_cache"] == kv_cache_bytes_7b(32 * 5 + 1)
    assert set(plan["verdicts"]) == set(DEVICE_KINDS)
    assert all(v in ("fits", "does not fit") for v in plan["verdicts"].values())
    assert plan["verdicts"]["TPU v5e 16GB"] == "does not fit"  # a 7B with 160 parked 8k rows: nowhere near
    assert plan["dominant_term"] == "park_cache" and "rollout.park_rows" in plan["knob"]
    text = format_plan(plan)
    for kind in DEVICE_KINDS:
        assert kind in text


def kv_cache_bytes_7b(rows: int) -> int:
    # Qwen2.5-7B: 28 layers, 4 KV heads of 128, bfloat16; capacity 8192
    return 28 * 2 * rows * 8192 * 4 * 128 * 2


def test_kv_cache_bytes_formula():
    from jaxagent.models import DTypePolicy, preset

    q = preset("qwen2.5-7b", dtype=DTypePolicy("bfloat16", "bfloat16"))
    assert kv_cache_bytes(q, 64, 8192) == kv_cache_bytes_7b(64) == 30_064_771_072  # 30.1 GB for 64 slots


def test_asynchronous_rl_plans_the_engines_own_copy_of_the_weights():
    sync = plan_memory(load_config(None, TINY), compile=False)["per_device_bytes"]
    asyn = plan_memory(load_config(None, TINY + ["rl.max_staleness=1"]), compile=False)["per_device_bytes"]
    assert "engine_params" not in sync
    assert asyn["engine_params"] == sync["parameters"] > 0


def test_tiny_dpo_pair_update_compiles_with_its_pairs_as_arguments():
    cfg = load_config(None, TINY + ["job=dpo", "dpo.batch_size=4", "dpo.microbatches=2", "dpo.max_len=128",
                                     f"dpo.data={Path(__file__).parent / 'fixtures' / 'data' / 'dpo_pairs.jsonl'}"])
    plan = plan_memory(cfg)
    assert set(plan["programs"]) == {"update"} and "error" not in plan["programs"]["update"]
    assert not any("not compiled" in n for n in plan["notes"])
    m, b = plan["programs"]["update"], plan["per_device_bytes"]
    state = b["parameters"] + b["optimizer_state"]
    # 4 pairs x 128 positions: chosen and rejected tokens (int32) and masks (bool), weight and both references [4, 1]
    batch = 2 * 4 * 128 * 4 + 2 * 4 * 128 + 3 * 4 * 4
    assert state + batch <= m["argument"] <= state + batch + 1024
    assert m["temp"] > 0 and plan["largest_transient"] == "update"
    assert "dpo.microbatches" in plan["knob"] or plan["dominant_term"] != "transient of update"


def _tiny_planning_setup(cfg):
    """The tiny config's planning model, one-device rules and abstract parameters, as `plan_memory` builds them."""
    import dataclasses

    import jax

    from jaxagent.jobs.build import planning_model_config
    from jaxagent.models import LogicalRules, make_mesh
    from jaxagent.models.qwen import init_params, param_logical_axes

    qcfg = dataclasses.replace(planning_model_config(cfg)[0], remat=cfg.model.remat, attn_impl=cfg.model.attn_impl)
    rules = LogicalRules(make_mesh(cfg.mesh, jax.devices()[:1]))
    abstract = jax.eval_shape(lambda k: init_params(k, qcfg), jax.random.key(0))
    shard = jax.tree.map(lambda ax, x: rules.sharding(ax, x.shape), param_logical_axes(qcfg), abstract,
                         is_leaf=lambda x: isinstance(x, tuple))
    p_abs = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shard)
    return qcfg, rules, p_abs, shard


@pytest.mark.parametrize("mode", ["shared_prefix", "vmapped"])
def test_planned_infogain_program_is_the_one_the_trainer_runs(mode):
    """--plan compiles InfoPO's info-gain call itself: run on a batch of the planned shapes, the
    program it compiled gives what `compute_infogain` (the trainer's call) gives, bit for bit."""
    import jax
    import numpy as np

    from jaxagent.jobs.plan_programs import compile_program, infogain_shapes
    from jaxagent.models.qwen import init_params
    from jaxagent.train.infogain import compute_infogain
    from jaxagent.train.synthetic import synthetic_batch

    cfg = load_config(None, TINY + ["rl.credit=infopo", f"infopo.mode={mode}", "rl.score_rows=2"])
    sh = infogain_shapes(cfg, 128)
    # 2 x 2 episodes of 128 tokens, 6 turns (rollout.max_turns), "No information found." <= 21 tokens
    assert sh == {"rows": 4, "length": 128, "turns": 6, "placeholder_tokens": 21, "packed_len": 384}  # 256 + 126 -> 384
    qcfg, rules, p_abs, shard = _tiny_planning_setup(cfg)
    compiled = compile_program("infogain", cfg, qcfg, rules, p_abs, rows=4, L=128, park=0, micro=2, trained=None)
    params = jax.jit(lambda k: init_params(k, qcfg), out_shardings=shard)(jax.random.key(1))
    batch = synthetic_batch(np.random.default_rng(0), batch=4, length=128, turns=6, vocab=qcfg.vocab_size,
                            action_len=(4, 12), feedback_len=(2, 10))
    ph = np.arange(1, 22, dtype=np.int32)
    got = compiled(params, batch, ph)
    want = compute_infogain(params, batch, ph, config=qcfg, mode=mode, packed_len=sh["packed_len"], row_chunk=2)
    assert np.abs(np.asarray(want.r_info_BT)).max() > 0
    np.testing.assert_array_equal(np.asarray(got.r_info_BT), np.asarray(want.r_info_BT))
    np.testing.assert_array_equal(np.asarray(got.counterfactual_sum_BT), np.asarray(want.counterfactual_sum_BT))


def test_infopo_runs_plan_the_infogain_program_and_name_its_knob():
    plan = plan_memory(load_config(None, TINY + ["rl.credit=infopo"]))
    assert set(plan["programs"]) == {"update", "prefill", "decode", "scorer", "infogain"}
    m, b = plan["programs"]["infogain"], plan["per_device_bytes"]
    assert "error" not in m, m
    # its arguments: the parameters and what the program reads of the batch (jit drops the unused ones):
    # tokens and pad mask [4, 128] int32, action and feedback spans [4, 6, 2] int32, turn_valid [4, 6]
    # bool, and the 21 placeholder ids
    batch = 2 * 4 * 128 * 4 + 2 * 4 * 6 * 2 * 4 + 4 * 6 + 21 * 4
    assert m["argument"] == b["parameters"] + batch
    assert plan["shapes"]["infogain"]["packed_len"] == 384
    # 4 rows x a 384 x 384 mask alone is 0.6 MB: the packed pass is this tiny run's largest program
    assert plan["largest_transient"] == "infogain" and "rl.score_rows" in plan["knob"]
    grpo = plan_memory(load_config(None, TINY), programs=None, compile=False)
    assert "infogain" not in grpo["shapes"]


def test_infogain_packed_length_bound_holds_and_is_nearly_reached():
    """`infogain_shapes`' worst packed length (2 L + T x P) against `packed_length` of real layouts:
    random batches never exceed it, and one of back-to-back actions with empty feedback nearly reaches it."""
    import numpy as np

    from jaxagent.train.batch import Row, build_batch, packed_length
    from jaxagent.train.synthetic import synthetic_batch

    L, T, P = 128, 6, 5
    for seed in range(40):
        b = synthetic_batch(np.random.default_rng(seed), batch=6, length=L, turns=T, vocab=64,
                            action_len=(1, 40), feedback_len=(0, 20), template_len=(0, 3))
        for mode, bound in (("replace", 2 * L + T * P), ("overwrite", 2 * L)):
            assert packed_length(b, P, mode, multiple=1) <= bound
    a = 20  # 6 actions of 20 tokens, each followed by a 1-token feedback: each turn's suffix is P + the next action
    row = Row(tokens=list(range(1, T * (a + 1) + 1)), actions=[(t * (a + 1), t * (a + 1) + a) for t in range(T)],
              feedback=[(t * (a + 1) + a, (t + 1) * (a + 1)) for t in range(T)], segments=[], reward=0.0, group=0)
    hb = build_batch([row], length=L, turns=T)
    got = packed_length(hb, P, "replace", multiple=1)
    assert got == T * (a + 1) + (T - 1) * (P + a) == 251  # the bound is 2 x 128 + 6 x 5 = 286


if __name__ == "__main__":
    pytest.main([__file__, "-q"])

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


if __name__ == "__main__":
    pytest.main([__file__, "-q"])

"""`jaxagent.jobs.planfit` (``--plan --fit DEVICE``): the budget a --fit names, the step each term
takes (by hand), a search that fits the tiny InfoPO run under a budget it exceeds (each step
re-planned, its overrides giving the same plan afresh), one that cannot, and the command line."""

from __future__ import annotations

import json

import pytest

from jaxagent.jobs.config import load_config
from jaxagent.jobs.memplan import MARGIN, plan_memory
from jaxagent.jobs.planfit import device_budget, fit_plan, format_fit, next_steps

TINY = ["model.preset=tiny-qwen2", "mesh.fsdp=1", "rollout.slots=4", "rollout.capacity=128", "rollout.max_tokens=128",
        "rollout.park_rows=3", "rl.group_size=2", "rl.tasks_per_step=2", "rl.minibatch_size=4", "rl.microbatches=2",
        "rl.credit=infopo"]


def test_device_budget_names_a_kind_or_a_size():
    assert device_budget("H100") == ("A800/H100 80GB", 80 * 10**9)
    assert device_budget("v5e") == ("TPU v5e 16GB", 16 * 10**9)
    assert device_budget("24GB") == ("24 GB", 24 * 10**9)
    assert device_budget(" 0.5 gb") == ("0.5 GB", 5 * 10**8)
    with pytest.raises(ValueError, match=r"--fit 'TPU'.*matches 3 kinds"):
        device_budget("TPU")
    with pytest.raises(ValueError, match=r"--fit 'B200'.*expected one device kind"):
        device_budget("B200")
    for bad in ("0GB", "-4", "nan", "inf"):
        with pytest.raises(ValueError, match="--fit"):
            device_budget(bad)


def test_next_steps_by_hand():
    cfg = load_config(None, TINY)
    assert next_steps("park_cache", cfg) == [("rollout.park_rows", 0)]
    assert next_steps("park_cache", load_config(None, TINY + ["rollout.park_rows=0"])) == []
    for term in ("kv_cache", "engine_logits", "transient of prefill", "transient of decode"):
        assert next_steps(term, cfg) == [("rollout.slots", 2)]
    assert next_steps("kv_cache", load_config(None, TINY + ["rollout.slots=1"])) == []
    # 4 update rows in 2 microbatches: 4 divides them; in 4, 8 would not: remat only
    assert next_steps("transient of update", cfg) == [("rl.microbatches", 4), ("model.remat", "full")]
    assert next_steps("transient of update", load_config(None, TINY + ["rl.microbatches=4"])) == [("model.remat", "full")]
    assert next_steps("transient of update", load_config(None, TINY + ["rl.microbatches=4", "model.remat=full"])) == []
    # 8 rows at a time by default, of 2 x 2 episodes: all 4 at once, halved
    assert next_steps("transient of infogain", cfg) == [("rl.score_rows", 2)]
    assert next_steps("transient of scorer", load_config(None, TINY + ["rl.score_rows=0"])) == [("rl.score_rows", 2)]
    assert next_steps("transient of scorer", load_config(None, TINY + ["rl.score_rows=3"])) == [("rl.score_rows", 1)]
    assert next_steps("transient of infogain", load_config(None, TINY + ["rl.score_rows=1"])) == []
    assert next_steps("engine_params", load_config(None, TINY + ["rl.max_staleness=1"])) == [("rl.max_staleness", 0)]
    assert next_steps("parameters", cfg) == next_steps("optimizer_state", cfg) == []
    # on several devices the engine's caches can be split over the KV heads first
    two = load_config(None, TINY + ["mesh.fsdp=2"])
    assert next_steps("kv_cache", two) == [("rollout.cache_sharding", "heads"), ("rollout.slots", 2)]
    assert next_steps("park_cache", two) == [("rollout.cache_sharding", "heads"), ("rollout.park_rows", 0)]
    assert next_steps("engine_logits", two) == [("rollout.slots", 2)]  # the logits are not split
    split = load_config(None, TINY + ["mesh.fsdp=2", "rollout.cache_sharding=heads"])
    assert next_steps("transient of prefill", split) == [("rollout.slots", 2)]
    # RL's update on 4 batch devices: 40 rows in 4 microbatches (10 rows each, not split) -> 5 (8 rows,
    # 2 per device), then 10 (4 rows), then no count splits further: doubled (kept by the search only if
    # it lowers the peak); one device doubles; across processes (no split) doubles
    forty = TINY[:-4] + ["rl.group_size=4", "rl.tasks_per_step=10", "rl.minibatch_size=0", "rl.microbatches=4"]
    on4 = lambda *extra: load_config(None, forty + ["mesh.fsdp=4", *extra])  # noqa: E731
    assert next_steps("transient of update", on4())[0] == ("rl.microbatches", 5)
    assert next_steps("transient of update", on4("rl.microbatches=5"))[0] == ("rl.microbatches", 10)
    assert next_steps("transient of update", on4("rl.microbatches=10")) == [("rl.microbatches", 20),
                                                                            ("model.remat", "full")]
    assert next_steps("transient of update", load_config(None, forty))[0] == ("rl.microbatches", 8)
    assert next_steps("transient of update", on4("mesh.distributed=true"))[0] == ("rl.microbatches", 8)


def test_the_plan_says_which_rows_do_not_split_over_the_batch_devices():
    from jaxagent.jobs.plan_programs import row_split_notes
    from jaxagent.models import LogicalRules, MeshConfig, make_mesh

    import jax

    rules = LogicalRules(make_mesh(MeshConfig(data=1, fsdp=4, tensor=1), devices=jax.devices()[:4]))
    cfg = load_config(None, TINY)  # 4 episodes, 8 rows scored at a time (so all 4); 4 update rows in 2 microbatches
    (note,) = row_split_notes(cfg, rules, rows=4, micro=2, info=True)
    assert note.startswith("the update's rows per microbatch (2) do not split over the 4 batch devices")
    assert row_split_notes(cfg, rules, rows=4, micro=1, info=True) == []
    (note,) = row_split_notes(load_config(None, TINY + ["rl.score_rows=2"]), rules, rows=4, micro=1, info=True)
    assert note.startswith("rl.score_rows=2: 2 rows at a time do not split over the 4 batch devices: the scorer "
                           "and the info gain")
    one = LogicalRules(make_mesh(MeshConfig(data=1, fsdp=1, tensor=1), devices=jax.devices()[:1]))
    assert row_split_notes(cfg, one, rows=4, micro=2, info=True) == []
    (note,) = row_split_notes(load_config(None, TINY + ["mesh.distributed=true"]), rules, rows=4, micro=2, info=True)
    assert note.startswith("mesh.distributed=true")


def test_fit_steps_the_tiny_infopo_run_under_a_budget_and_the_overrides_replan_the_same():
    cfg = load_config(None, TINY)
    first = plan_memory(cfg)
    assert first["largest_transient"] == "infogain"
    budget = int(first["peak_per_device"] * (1 + MARGIN) * 0.6)  # 40% under what it needs as written
    said: list[str] = []
    fit = fit_plan(cfg, budget, first=first, log=said.append)
    assert fit["fits"] and fit["peak_with_margin"] <= budget
    # the largest term first: the info-gain pass's rows, halved from all 4 at once
    assert fit["steps"][0]["override"] == "rl.score_rows=2" and fit["steps"][0]["term"] == "transient of infogain"
    peaks = [first["peak_per_device"] * (1 + MARGIN)] + [s["peak_with_margin"] for s in fit["steps"]]
    assert all(b <= a for a, b in zip(peaks, peaks[1:]))  # no step made it worse
    assert len(said) == 2 * len(fit["steps"]) + 1 and "fits" in said[-1]  # progress: each step, then the verdict
    # each step compiled again only the programs its key reshapes: a plan made afresh agrees
    again = plan_memory(load_config(None, TINY + fit["overrides"]))
    assert again["peak_per_device"] * (1 + MARGIN) == pytest.approx(fit["peak_with_margin"], rel=1e-9)
    assert {k: v["transient"] for k, v in again["programs"].items()} == {
        k: v["transient"] for k, v in fit["plan"]["programs"].items()}
    assert "fits at" in format_fit(fit) and " ".join(fit["overrides"]) in format_fit(fit)


def test_fit_that_cannot_says_which_term_blocks_it():
    cfg = load_config(None, TINY + ["rl.credit=grpo"])
    first = plan_memory(cfg, programs=("update",))
    b = first["per_device_bytes"]
    budget = b["parameters"] + b["optimizer_state"] // 2  # less than the weights and their moments
    fit = fit_plan(cfg, budget, first=first, programs=("update",), log=lambda s: None)
    assert not fit["fits"] and fit["peak_with_margin"] > budget
    # it went as far as the steps go: the update's microbatches (2 -> 4, its rows) and remat, then the
    # engine's lanes and parked rows; what is left is named, the largest term
    took = [s["override"] for s in fit["steps"]]
    assert {"rl.microbatches=4", "model.remat=full", "rollout.park_rows=0", "rollout.slots=1"} <= set(took)
    assert fit["blocked_by"] == "transient of update" and "mesh.fsdp" in fit["what_would"]
    assert "does not fit" in format_fit(fit) and "transient of update" in format_fit(fit)
    short = fit_plan(cfg, budget, first=first, programs=("update",), max_steps=1, log=lambda s: None)
    assert not short["fits"] and len(short["steps"]) == 1 and short["blocked_by"] is None
    assert "the steps ran out" in format_fit(short)


def test_launch_fit_prints_the_search_and_refuses_a_bad_device(capsys):
    from jaxagent.launch import main

    assert main(["--fit", "v5e", *TINY]) == 0
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert summary["fit"]["device"] == "TPU v5e 16GB" and summary["fit"]["fits"]
    assert summary["fit"]["overrides"] == [] and "the config as written" in out.err
    assert "memory plan (per device" in out.err  # --fit is --plan with the search after it
    with pytest.raises(SystemExit, match="--fit 'B200'"):
        main(["--fit", "B200", *TINY])


def test_every_step_names_the_programs_it_reshapes():
    from jaxagent.jobs.planfit import RECOMPILES

    cfg = load_config(None, TINY + ["rl.max_staleness=1", "rl.score_rows=0"])
    terms = ("park_cache", "kv_cache", "engine_logits", "transient of prefill", "transient of decode",
             "transient of update", "transient of scorer", "transient of infogain", "engine_params")
    keys = {k for t in terms for k, _ in next_steps(t, cfg)}
    keys |= {k for k, _ in next_steps("transient of update", load_config(None, TINY + ["job=sft", "sft.microbatches=1"]))}
    keys |= {k for k, _ in next_steps("kv_cache", load_config(None, TINY + ["mesh.fsdp=2"]))}
    assert keys <= set(RECOMPILES) and len(keys) == 8


def test_a_step_that_does_not_lower_the_peak_is_not_kept():
    """On 4 devices the tiny model's 2 KV heads cannot be split 4 ways: the plan notes it and plans
    the caches replicated, so the split does not lower the peak and the search leaves it out."""
    cfg = load_config(None, TINY + ["mesh.fsdp=4", "rl.credit=grpo"])
    first = plan_memory(cfg, programs=("prefill",))
    b = first["per_device_bytes"]
    budget = int((first["peak_per_device"] - b["park_cache"] // 2) * (1 + MARGIN))
    said: list[str] = []
    fit = fit_plan(cfg, budget, first=first, programs=("prefill",), log=said.append)
    assert any("rollout.cache_sharding=heads does not lower the peak" in line for line in said)
    assert "rollout.cache_sharding=heads" not in fit["overrides"]
    assert fit["fits"] and fit["overrides"][0] in ("rollout.park_rows=0", "rollout.slots=2")


def test_split_caches_are_planned_split():
    whole = plan_memory(load_config(None, TINY + ["mesh.fsdp=2"]), compile=False)["per_device_bytes"]
    split = plan_memory(load_config(None, TINY + ["mesh.fsdp=2", "rollout.cache_sharding=heads"]),
                        compile=False)["per_device_bytes"]
    assert split["kv_cache"] * 2 == whole["kv_cache"] and split["park_cache"] * 2 == whole["park_cache"]
    assert split["engine_logits"] == whole["engine_logits"] and split["parameters"] == whole["parameters"]

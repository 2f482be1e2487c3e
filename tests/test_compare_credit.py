"""The credit comparison grid (`jaxagent.jobs.experiments.credit_grid`, run as scripts/compare_credit.py): the
statistics against hand-computed cases, the figures read from a metrics file, the grid's
overrides, skipping and failures (with a fake launcher), and one real end-to-end --quick run (SFT
warm start -> two RL conditions from its HF export -> RESULTS.md)."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from jaxagent.jobs.experiments import credit_grid as cc


# ----------------------------------------------------------------------------- steps_to_threshold
def test_steps_to_threshold_first_step_reaching_it():
    assert cc.steps_to_threshold([(0, 0.1), (4, 0.95), (8, 0.5)], 0.9) == 4
    assert cc.steps_to_threshold([(8, 0.95), (0, 0.1), (4, 0.5)], 0.9) == 8  # order does not matter
    assert cc.steps_to_threshold([(0, 0.9)], 0.9) == 0  # reaching = >=, before RL counts as 0
    assert cc.steps_to_threshold([(0, 0.9 - 1e-12)], 0.9) == 0  # float tolerance
    assert cc.steps_to_threshold([(0, 0.1), (4, 0.89)], 0.9) is None  # censored
    assert cc.steps_to_threshold([], 0.9) is None
    assert cc.steps_to_threshold([(0, None), (2, float("nan")), (3, 1.0)], 0.9) == 3
    # a step logged twice (a resumed run) keeps its last value
    assert cc.steps_to_threshold([(2, 1.0), (2, 0.0), (3, 0.95)], 0.9) == 3


# ----------------------------------------------------------------------------- paired_bootstrap
def test_paired_bootstrap_constant_differences_give_a_point_interval():
    assert cc.paired_bootstrap([1, 2, 3], [0.5, 1.5, 2.5], n=500) == (0.5, 0.5, 0.5)


def test_paired_bootstrap_pairs_not_pools():
    # Units differ a lot, conditions not at all: paired, the interval is exactly 0 (an unpaired
    # bootstrap of the same numbers would span about +-0.5).
    a = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert cc.paired_bootstrap(a, list(a), n=2000) == (0.0, 0.0, 0.0)


def test_paired_bootstrap_hand_computed_interval():
    # differences [1, 0, 0, 0]: a resample's mean is k/4 with k ~ Binomial(4, 1/4);
    # P(k=0) = 0.316 > 0.025, so lo = 0; P(k<=2) = 0.949 < 0.975 <= P(k<=3) = 0.996, so hi = 3/4.
    diff, lo, hi = cc.paired_bootstrap([1, 1, 0, 0], [0, 1, 0, 0], n=20_000, rng=np.random.default_rng(1))
    assert (diff, lo, hi) == (0.25, 0.0, 0.75)
    # differences [0, 1]: mean 1/2; resampled means 0, 1/2, 1 with P 1/4, 1/2, 1/4
    assert cc.paired_bootstrap([0, 1], [0, 0], n=20_000) == (0.5, 0.0, 1.0)
    # the sign follows a - b
    assert cc.paired_bootstrap([0, 0], [0, 1], n=20_000) == (-0.5, -1.0, 0.0)


def test_paired_bootstrap_rejects_bad_input():
    with pytest.raises(ValueError, match="one length"):
        cc.paired_bootstrap([1, 2], [1])
    with pytest.raises(ValueError, match="empty"):
        cc.paired_bootstrap([], [])


# ----------------------------------------------------------------------------- figures of one run
def _records():
    return [
        {"phase": "eval", "step": 0, "label": "before", "success": 0.25, "success_by_task": {"t0": 0.0, "t1": 0.5}},
        {"phase": "rl", "step": 0, "success": 0.2},
        {"phase": "rl", "step": 1, "success": 0.95},
        {"phase": "rl", "step": 1, "success": 0.5},  # resumed: step 1 re-logged, the last one counts
        {"phase": "eval", "step": 2, "label": "during", "success": 0.5},
        {"phase": "rl", "step": 2, "success": 0.92},
        {"phase": "rl", "step": 3, "success": 1.0},
        {"phase": "eval", "step": 4, "label": "after", "success": 0.95, "reward": 0.97,
         "success_by_task": {"t0": 1.0, "t1": 0.9}},
    ]


def test_run_figures_reads_series_final_and_per_task():
    f = cc.run_figures(_records(), threshold=0.9, rl_steps=4)
    assert f["train_success"] == [(0, 0.2), (1, 0.5), (2, 0.92), (3, 1.0)]
    assert f["eval_success"] == [(0, 0.25, "before"), (2, 0.5, "during"), (4, 0.95, "after")]
    assert (f["before"], f["final"], f["final_reward"], f["steps"]) == (0.25, 0.95, 0.97, 4)
    assert f["final_by_task"] == {"t0": 1.0, "t1": 0.9}
    assert f["steps_to_threshold"] == 4  # the evaluations: first >= 0.9 after 4 iterations
    assert cc.run_figures(_records(), threshold=0.9, threshold_on="train")["steps_to_threshold"] == 2
    assert cc.run_figures(_records(), threshold=0.99)["steps_to_threshold"] is None
    with pytest.raises(ValueError, match="threshold_on"):
        cc.run_figures(_records(), threshold=0.9, threshold_on="both")


# ----------------------------------------------------------------------------- comparisons
def _fig(final, by_task, hit, steps=8):
    return {"final": final, "final_by_task": by_task, "steps_to_threshold": hit, "steps": steps, "before": 0.0,
            "wall_seconds": 1.0}


def test_compare_pairs_seed_task_units_and_counts_censored_runs_as_steps_plus_one():
    by_cond = {
        "grpo": {0: _fig(0.5, {"a": 1.0, "b": 0.0}, 4), 1: _fig(0.0, {"a": 0.0, "b": 0.0}, None)},
        "infopo": {0: _fig(1.0, {"a": 1.0, "b": 1.0}, 2), 1: _fig(0.5, {"a": 1.0, "b": 0.0}, 4)},
        "faca": {0: _fig(0.5, {"a": 1.0, "b": 0.0}, None), 1: _fig(0.0, {"a": 0.0, "b": 0.0}, None)},
    }
    out = cc.compare(by_cond, n_boot=20_000)
    s = out["infopo"]["success"]
    # pairs (s0,a) (s0,b) (s1,a) (s1,b): differences 0, 1, 1, 0
    assert (s["unit"], s["pairs"], s["diff"], s["lo"], s["hi"]) == ("(seed, task)", 4, 0.5, 0.0, 1.0)
    # steps: infopo [2, 4] vs grpo [4, censored -> 9]: differences -2, -5
    st = out["infopo"]["steps"]
    assert (st["diff"], st["lo"], st["hi"], st["censored"]) == (-3.5, -5.0, -2.0, 1)
    # faca never reached it, grpo did once: a bound from [9 - 4, 9 - 9]
    assert out["faca"]["steps"]["diff"] == 2.5 and out["faca"]["steps"]["censored"] == 3
    assert out["faca"]["success"]["diff"] == 0.0 and "grpo" not in out


def test_compare_falls_back_to_seed_units_and_skips_unreached_steps():
    by_cond = {"grpo": {0: _fig(0.25, {}, None), 1: _fig(0.5, {}, None)},
               "faca": {0: _fig(0.75, {}, None), 1: _fig(0.5, {}, None)}}
    out = cc.compare(by_cond, n_boot=1000)["faca"]
    assert out["success"]["unit"] == "seed" and out["success"]["diff"] == 0.25
    assert out["steps"] is None  # no run of either reached the threshold: nothing to compare
    table = cc.gym_table(by_cond, {"faca": out}, 0.9)
    assert "| faca | 0.625 | 0.75, 0.50 | +0.250 [" in table and "n/a (no run reached it)" in table
    assert ">8, >8" in table


# ----------------------------------------------------------------------------- the grid's jobs
def test_overrides_pass_through_and_condition_keys_win():
    user = ["steps=16", "model.hidden_size=128", "eval.tasks=8"]
    sft = cc.sft_overrides(user, runs_dir="R", prefix="p", gym="telepathy", seed=2)
    assert sft[:3] == user and "job=sft" in sft and "name=p_telepathy_s2_sft" in sft and "seed=2" in sft
    assert sft.index("eval.tasks=1") > sft.index("eval.tasks=8") and "checkpoint.export_hf=true" in sft
    rl = cc.rl_overrides(user, runs_dir="R", prefix="p", gym="telepathy", seed=2, condition="infopo/no-gate")
    assert "model.hidden_size=128" not in rl  # the shape comes from the SFT checkpoint
    assert f"model.path={Path('R') / 'p_telepathy_s2_sft' / 'hf'}" in rl
    assert {"job=rl", "name=p_telepathy_s2_infopo-no-gate", "rl.credit=infopo", "infopo.use_gate=false",
            "env.gym=telepathy", "steps=16"} <= set(rl)
    # every condition is a valid config, and the ablations are what they say
    from jaxagent.jobs.config import load_config

    for cond in cc.CONDITIONS:
        cfg = load_config(None, cc.rl_overrides(user[:1], runs_dir="R", prefix="p", gym="intention", seed=0,
                                                condition=cond))
        assert cfg.job == "rl" and cfg.model.path is not None and cfg.steps == 16
        assert cfg.rl.credit == ("grpo" if cond == "control" else cond.split("/")[0])
        assert (cfg.optim.lr == 0) == (cond == "control")  # the control learns nothing, the rest do
    cfg = load_config(None, cc.rl_overrides([], runs_dir="R", prefix="p", gym="intention", seed=0,
                                            condition="faca/reversed"))
    assert cfg.faca.ablation == "reverse" and cfg.infopo.use_ext
    cfg = load_config(None, cc.rl_overrides([], runs_dir="R", prefix="p", gym="intention", seed=0,
                                            condition="infopo/pos-info"))
    assert cfg.infopo.negative_weight == 0 and cfg.infopo.normalize_by == "group"  # the info term's sign only
    assert len(cc.GRID) == 11 and not set(cc.DIAGNOSTICS) & set(cc.GRID)  # diagnostics: not in the default grid
    cfg = load_config(None, cc.rl_overrides([], runs_dir="R", prefix="p", gym="intention", seed=0,
                                            condition="infopo/by-turn"))
    assert cfg.infopo.normalize_by == "group_turn" and cfg.infopo.negative_weight == 1


def test_parse_args_quick_and_errors(tmp_path):
    a = cc.parse_args(["--quick", "--seeds", "3,4", f"--runs-dir={tmp_path}", "steps=2"])
    assert a.seeds == [3] and a.conditions == ["grpo", "infopo"] and a.prefix == "credit_quick"
    assert a.overrides[-1] == "steps=2" and "steps=1" in a.overrides  # the user's value comes last, wins
    assert a.out == tmp_path / "credit_quick_RESULTS.md"
    a = cc.parse_args(["--conditions", "faca/random,grpo"])
    assert a.conditions == ["grpo", "faca/random"] and a.out == cc.ROOT / "docs" / "RESULTS.md"
    assert a.gyms == ["intention", "telepathy"] and a.seeds == [0, 1, 2]
    for argv in (["rl.credit=faca"], ["--conditions", "gpro"], ["steps"]):
        with pytest.raises(SystemExit):
            cc.parse_args(argv)


def _fake_launcher(calls, fail=()):
    def launch(overrides, config_file, run_dir):
        calls.append(run_dir.name)
        if run_dir.name in fail:
            run_dir.mkdir(parents=True, exist_ok=True)
            return {"rc": 1, "process_s": 0.0}
        run_dir.mkdir(parents=True, exist_ok=True)
        from jaxagent import configlib
        from jaxagent.jobs.config import load_config

        (run_dir / "config.yaml").write_text(configlib.dump_yaml(load_config(config_file, overrides)))
        recs = [{"phase": "eval", "step": 0, "label": "before", "success": 0.0},
                {"phase": "rl", "step": 0, "success": 0.5},
                {"phase": "eval", "step": 1, "label": "after", "success": 1.0, "success_by_task": {"t": 1.0}}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (run_dir / "summary.json").write_text(json.dumps({"steps": 1, "wall_seconds": 2.0}))
        return {"rc": 0, "process_s": 0.0}
    return launch


def test_grid_skips_finished_runs_and_keeps_going_past_failures(tmp_path):
    kw = {"gyms": ["intention", "telepathy"], "seeds": [0], "conditions": ["grpo", "faca"], "user": ["steps=1"],
          "config_file": None, "runs_dir": str(tmp_path), "prefix": "x"}
    calls = []
    jobs = cc.run_grid(**kw, launcher=_fake_launcher(calls, fail={"x_telepathy_s0_sft"}))
    assert calls == ["x_intention_s0_sft", "x_telepathy_s0_sft", "x_intention_s0_grpo", "x_intention_s0_faca"]
    assert jobs[("rl", "telepathy", 0, "grpo")]["error"] == "its SFT warm start failed"
    assert jobs[("sft", "telepathy", 0, None)]["rc"] == 1
    calls.clear()
    jobs = cc.run_grid(**kw, launcher=_fake_launcher(calls))  # resumes: only what did not finish runs
    assert calls == ["x_telepathy_s0_sft", "x_telepathy_s0_grpo", "x_telepathy_s0_faca"]
    assert jobs[("rl", "intention", 0, "faca")]["skipped"]
    data = cc.collect(gyms=kw["gyms"], seeds=[0], conditions=kw["conditions"], runs_dir=str(tmp_path), prefix="x",
                      threshold=0.9, threshold_on="eval")
    assert data["telepathy"]["faca"][0]["steps_to_threshold"] == 1
    # the same names with another configuration: refused before anything runs
    with pytest.raises(SystemExit, match="another configuration.*steps"):
        cc.run_grid(**dict(kw, user=["steps=2"]), launcher=_fake_launcher(calls))


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path, capsys):
    """SFT warm start exported as HF, two RL conditions from it (model.path + builtin tokenizer), the
    Markdown report and the JSON line; a second invocation finds every run done."""
    argv = ["--quick", "--in-process", "--gyms", "intention", "--runs-dir", str(tmp_path), "--bootstrap", "500",
            "sft.steps=2", "steps=1", "rl.tasks_per_step=2", "rl.group_size=2", "eval.tasks=2",
            "rollout.max_new_tokens=16"]
    assert cc.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["failed"] == [] and {r["condition"] for r in out["runs"]} == {"grpo", "infopo"}
    sft = tmp_path / "credit_quick_intention_s0_sft"
    assert (sft / "hf" / "config.json").exists() and (sft / "hf" / "model.safetensors").exists()
    for r in out["runs"]:
        assert r["steps"] == 1 and r["seed"] == 0 and len(r["final_by_task"]) == 2
        assert [e[2] for e in r["eval_success"]] == ["before", "after"]
        assert json.loads((tmp_path / r["name"] / "summary.json").read_text())["credit"] == r["condition"]
    # paired: both conditions started from the same checkpoint and were evaluated on the same tasks
    a, b = out["runs"]
    assert a["before"] == b["before"] and set(a["final_by_task"]) == set(b["final_by_task"])
    assert out["comparisons"]["intention"]["infopo"]["success"]["unit"] == "(seed, task)"
    md = (tmp_path / "credit_quick_RESULTS.md").read_text()
    assert "python3 scripts/compare_credit.py --quick --in-process" in md
    assert "## intention" in md and "| grpo |" in md and "| infopo |" in md and "## What we see" in md
    # a second invocation skips every finished run
    assert cc.main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("done before, skipped") == 3


# ----------------------------------------------------------------------------- reuse of run dirs
def _stored(tmp_path: Path, name: str, d: dict) -> Path:
    import yaml

    run = tmp_path / name
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(d))
    return run


def test_check_existing_new_keys_at_their_default_and_sft_runs_rl_sections(tmp_path):
    from jaxagent import configlib

    rl = cc.plain_config(None, cc.rl_overrides([], runs_dir="R", prefix="p", gym="intention", seed=0,
                                               condition="grpo"))
    sft = cc.plain_config(None, cc.sft_overrides([], runs_dir="R", prefix="p", gym="intention", seed=0))
    tmp = tmp_path
    cc.check_existing(tmp / "absent", rl)  # nothing stored: nothing to check
    cc.check_existing(_stored(tmp, "same", rl), rl)
    # a key the stored run predates, expected at its default: the same run
    old = copy.deepcopy(rl)
    del old["infopo"]["negative_weight"]
    cc.check_existing(_stored(tmp, "older", old), rl)
    # ... but not when the expected value is another one
    pos = configlib.deep_merge(rl, {"infopo": {"negative_weight": 0.0}})
    with pytest.raises(SystemExit, match="infopo.negative_weight"):
        cc.check_existing(tmp / "older", pos)
    # a stored value that differs is a difference, missing or not
    with pytest.raises(SystemExit, match=r"differs in optim\.lr"):
        cc.check_existing(_stored(tmp, "lr", configlib.deep_merge(rl, {"optim": {"lr": 0.5}})), rl)
    # an SFT warm start: the RL-only sections do not count, the rest does
    other_rl = configlib.deep_merge(sft, {"steps": 99, "rl": {"credit": "faca"}, "grpo": {"negative_weight": 1.0}})
    cc.check_existing(_stored(tmp, "sft", other_rl), sft)
    for change, key in (({"rl": {"success_threshold": 0.5}}, "rl.success_threshold"),
                        ({"sft": {"steps": 7}}, "sft.steps"), ({"optim": {"lr": 0.5}}, "optim.lr")):
        with pytest.raises(SystemExit, match=key.replace(".", r"\.")):
            cc.check_existing(_stored(tmp, f"sft_{key}", configlib.deep_merge(sft, change)), sft)
    # an RL run's rl section is compared
    with pytest.raises(SystemExit, match=r"rl\.credit"):
        cc.check_existing(_stored(tmp, "rl_credit", configlib.deep_merge(rl, {"rl": {"credit": "faca"}})), rl)


def test_a_rerun_replaces_only_the_generated_part(tmp_path):
    from jaxagent.jobs.experiments.grid_report import BEGIN, END, replace_generated
    path = tmp_path / "RESULTS.md"
    replace_generated(path, "table one\n")  # a new file: the block alone
    assert path.read_text() == f"{BEGIN}\ntable one\n{END}\n"
    path.write_text("# lead, by hand\n\n" + path.read_text() + "\n## after, by hand\n")
    replace_generated(path, "table two\n")
    assert path.read_text() == f"# lead, by hand\n\n{BEGIN}\ntable two\n{END}\n\n## after, by hand\n"
    path.write_text("no markers\n")  # a file without both markers is written whole
    replace_generated(path, "t\n")
    assert path.read_text() == f"{BEGIN}\nt\n{END}\n"

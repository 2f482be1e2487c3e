"""`jaxagent.jobs.experiments.rl_learns` (scripts/bench_rl_learns.py): the paired figures against hand-computed
cases, the per-iteration curves, the identical-rollouts check, and which overrides reach the warm starts and the RL
runs."""


import pytest

from jaxagent.jobs.experiments import rl_learns as b


def _run(after_by_task, rl=(), first=None, greedy=None):
    after = {"sampled/success_by_task": after_by_task, "sampled/reward_by_task": after_by_task,
             "success_by_task": greedy or after_by_task, "reward_by_task": greedy or after_by_task,
             "sampled/success": sum(after_by_task.values()) / len(after_by_task)}
    return {"rl": [dict(r) for r in rl], "before": None, "after": after, "first_tokens": first}


def test_paired_gain_is_the_mean_over_seed_task_pairs_and_per_seed():
    runs = {
        0: {"grpo": _run({"t0": 1.0, "t1": 0.5}), "control": _run({"t0": 0.5, "t1": 0.5})},
        1: {"grpo": _run({"t0": 0.25, "t1": 1.0, "t9": 1.0}), "control": _run({"t0": 0.25, "t1": 0.75})},
    }
    p = b.paired(runs, "sampled/success_by_task", n_boot=2000)
    # pairs: seed 0 (+0.5, 0), seed 1 (0, +0.25); t9 has no control twin and is left out
    assert p["pairs"] == 4
    assert p["gain"] == pytest.approx(0.1875)
    assert p["per_seed"] == {0: pytest.approx(0.25), 1: pytest.approx(0.125)}
    lo, hi = p["ci95"]
    assert lo <= 0.1875 <= hi and hi <= 0.5


def test_paired_without_any_final_evaluation_is_none():
    runs = {0: {"grpo": {"after": None}, "control": _run({"t0": 1.0})}}
    assert b.paired(runs, "sampled/success_by_task", n_boot=100) is None


def test_curves_pair_iterations_and_stop_at_the_shortest_run():
    g = [{"success": 0.5, "reward": 0.6, "update/entropy": 0.1}, {"success": 0.75, "reward": 0.8, "update/entropy": 0.3}]
    c = [{"success": 0.5, "reward": 0.5}, {"success": 0.5, "reward": 0.5}, {"success": 0.0, "reward": 0.0}]
    runs = {0: {"grpo": _run({"t": 1.0}, rl=g), "control": _run({"t": 1.0}, rl=c)},
            1: {"grpo": _run({"t": 1.0}, rl=g), "control": _run({"t": 1.0}, rl=c[:2])}}
    rows = b.curves(runs, n_boot=200)
    assert [r["iteration"] for r in rows] == [0, 1]
    assert rows[0]["train_success_gain"] == 0.0
    assert rows[1]["train_success_gain"] == pytest.approx(0.25)
    assert rows[1]["train_reward_gain"] == pytest.approx(0.3)
    assert rows[1]["train_success_gain_per_seed"] == {0: pytest.approx(0.25), 1: pytest.approx(0.25)}
    assert rows[1]["grpo_entropy"] == pytest.approx(0.3)


def test_summarize_reports_whether_the_first_rollouts_were_identical():
    same = {0: {"grpo": _run({"t": 1.0}, first=[[1, 2]]), "control": _run({"t": 0.0}, first=[[1, 2]])}}
    s = b.summarize(same, n_boot=200)
    assert s["identical_first_rollouts"] is True
    assert s["paired_success_gain"] == 1.0 and s["paired_success_pairs"] == 1
    differ = {0: {"grpo": _run({"t": 1.0}, first=[[1, 2]]), "control": _run({"t": 0.0}, first=[[1, 3]])}}
    assert b.summarize(differ, n_boot=200)["identical_first_rollouts"] is False
    missing = {0: {"grpo": _run({"t": 1.0}, first=None), "control": _run({"t": 0.0}, first=None)}}
    assert b.summarize(missing, n_boot=200)["identical_first_rollouts"] is False


def test_rl_overrides_do_not_reach_the_warm_starts(monkeypatch, tmp_path, capsys):
    seen = {}

    def fake_grid(**kw):
        seen.update(kw)
        return {}

    monkeypatch.setattr(b.cc, "run_grid", fake_grid)
    rc = b.main(["--seeds", "0", "--runs-dir", str(tmp_path), "--sft", "sft.steps=50", "optim.lr=1e-4"])
    assert rc == 1  # no run finished: nothing to report
    assert seen["user"] == [*b.SFT_SETTINGS, "sft.steps=50"]
    assert seen["rl_only"] == [*b.LEARNING, "optim.lr=1e-4"]


@pytest.mark.parametrize("argv, msg", [(["optim.lr"], "expected key=value"), (["--sft", "sft.steps"], "expected key=value"),
                                       (["name=x"], "set by the script"), (["--sft", "seed=3"], "set by the script")])
def test_parse_args_errors(argv, msg, capsys):
    with pytest.raises(SystemExit):
        b.parse_args(argv)
    assert msg in capsys.readouterr().err


def test_steps_to_threshold_uses_the_moving_average_and_censors():
    rl = [{"success": v} for v in (0.5, 1.0, 1.0, 1.0, 0.9)]
    # windows of 4: 0.5, 0.75, 0.833.., 0.875 -> first >= 0.85 at iteration 3
    assert b.steps_to_threshold(rl, threshold=0.85, smooth=4) == 3
    assert b.steps_to_threshold(rl, threshold=0.85, smooth=1) == 1
    assert b.steps_to_threshold(rl, threshold=0.99, smooth=4) is None
    assert b.steps_to_threshold([], threshold=0.5) is None


def test_credit_table_against_control_and_grpo_with_censored_steps():
    hi = [{"success": 1.0, "credit/cover/info": 0.5}] * 4
    lo = [{"success": 0.0, "credit/cover/info": 0.25}] * 4
    runs = {s: {"grpo": _run({"t0": 0.5, "t1": 0.5}, rl=lo), "control": _run({"t0": 0.25, "t1": 0.5}, rl=lo),
                "infopo": _run({"t0": 1.0, "t1": 0.5}, rl=hi)} for s in (0, 1)}
    t = b.credit_table(runs, ["grpo", "control", "infopo"], n_boot=500)
    assert set(t) == {"grpo", "infopo"}
    assert t["grpo"]["success_vs_control"]["gain"] == pytest.approx(0.125)
    assert "success_vs_grpo" not in t["grpo"] and "steps_vs_grpo" not in t["grpo"]
    assert t["infopo"]["success_vs_control"]["gain"] == pytest.approx(0.375)
    assert t["infopo"]["success_vs_grpo"]["gain"] == pytest.approx(0.25)
    assert t["infopo"]["success_vs_grpo"]["pairs"] == 4
    # infopo reaches the threshold at its 4th iteration (index 3); grpo never: censored as 4 + 1
    assert t["infopo"]["steps_to_threshold"] == {0: 3, 1: 3}
    assert t["grpo"]["censored"] == {0: True, 1: True} and t["grpo"]["steps_to_threshold"] == {0: 5, 1: 5}
    assert t["infopo"]["steps_vs_grpo"]["gain"] == -2.0
    assert t["infopo"]["credit/cover/info"] == pytest.approx(0.5)
    assert t["infopo"]["credit/cover/proc"] is None


def test_conditions_always_include_grpo_and_control():
    assert b.parse_args(["--conditions", "infopo,grpo"]).conditions == ["grpo", "control", "infopo"]
    with pytest.raises(SystemExit):
        b.parse_args(["--conditions", "nonsense"])


def test_warm_starts_report_each_seed_and_flag_a_collapse(tmp_path):
    good = {"success": 0.9, "sampled/success": 0.8}
    runs = {0: {"grpo": {**_run({"t": 1.0}), "before": good}},
            2: {"grpo": {**_run({"t": 1.0}), "before": {"success": 0.16, "sampled/success": 0.1}}}}
    w = b.warm_starts(runs, {0: 0.001, 2: 0.043})
    assert w["warm_start"][2] == {"sft_final_loss": 0.043, "greedy_success": 0.16, "sampled_success": 0.1}
    assert w["warm_start_min_greedy_success"] == 0.16 and w["warm_start_ok"] is False
    assert b.warm_starts({0: runs[0]}, {0: 0.001})["warm_start_ok"] is True
    (tmp_path / "metrics.jsonl").write_text('{"phase": "sft", "step": 0, "loss": 6.9}\n'
                                           '{"phase": "sft", "step": 599, "loss": 0.002}\n'
                                           '{"phase": "eval", "step": 600, "success": 1.0}\n')
    assert b.sft_final_loss(tmp_path) == 0.002 and b.sft_final_loss(tmp_path / "none") is None

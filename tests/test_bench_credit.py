"""`jaxagent.jobs.experiments.credit_bench` (scripts/bench_credit.py): the JSON line's keys and figures
on hand-made runs, the settings' configs load, and the command line's errors."""

import pytest

from jaxagent.jobs.config import load_config
from jaxagent.jobs.experiments import credit_bench as b
from jaxagent.jobs.experiments import credit_grid as cc


def _run(after_by_task, rl=()):
    after = {"sampled/success_by_task": after_by_task, "success_by_task": after_by_task,
             "sampled/success": sum(after_by_task.values()) / len(after_by_task)}
    return {"rl": [dict(r) for r in rl], "before": None, "after": after, "first_tokens": None}


IT = [{"success": 0.0, "credit/all_zero_group_share": 0.75, "faca/nonconstant_cell_share": 0.25,
       "why/info_partial_corr": None},
      {"success": 1.0, "credit/all_zero_group_share": 0.25, "faca/nonconstant_cell_share": 0.5,
       "why/info_partial_corr": 0.5}]


def test_summary_keys_and_figures_by_hand():
    runs = {0: {"grpo": _run({"a": 0.5, "b": 0.0}, IT), "control": _run({"a": 0.0, "b": 0.0}, IT),
                "infopo/marginal": _run({"a": 1.0, "b": 0.5}, IT), "faca": _run({"a": 0.5, "b": 0.5}, IT)},
            1: {"grpo": _run({"a": 0.5, "b": 0.5}, IT), "control": _run({"a": 0.5, "b": 0.5}, IT),
                "infopo/marginal": _run({"a": 0.5, "b": 0.5}, IT), "faca": _run({"a": 0.5, "b": 1.0}, IT)}}
    s = b.summarize(runs, ["grpo", "control", "infopo/marginal", "faca"], b.SETTINGS["infopo_telepathy"], n_boot=500)
    assert s["all_zero_group_share"] == pytest.approx(0.75)  # the first iteration's, over seeds
    assert s["nonconstant_reaction_cell_share"] == pytest.approx(0.25)
    # pairs (seed, task): marginal - grpo = +0.5, +0.5, 0, 0
    assert s["infopo_marginal_minus_grpo"] == pytest.approx(0.25)
    lo, hi = s["infopo_marginal_minus_grpo_ci95"]
    assert lo <= 0.25 <= hi
    assert s["grpo_minus_control"] == pytest.approx(0.125)
    row = s["conditions"]["infopo/marginal"]
    assert row["credit/all_zero_group_share"] == pytest.approx(0.5)  # the run mean, over seeds
    assert row["why/info_partial_corr"] == pytest.approx(0.5)  # None iterations left out
    # training success 0, 1 never reaches a smoothed 0.3 in full windows of 4: censored at 2 + 1
    assert row["steps_to_threshold"] == {0: 3, 1: 3} and row["steps_vs_grpo"]["gain"] == 0.0
    # the Markdown table: one row per condition, the figures of the JSON line
    md = b.markdown_table({**s, "threshold": 0.3}).splitlines()
    assert len(md) == 2 + 4 and md[0].count("|") == md[1].count("|") == md[2].count("|") == 11
    cells = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in md[2:]}
    assert cells["grpo"][2] == "(baseline)" and cells["control"][3] == "(baseline)"
    lo, hi = s["infopo_marginal_minus_grpo_ci95"]
    assert cells["infopo/marginal"][2] == f"+0.250 [{lo:+.3f}, {hi:+.3f}]"
    assert cells["infopo/marginal"][5] == "3, 3" and cells["infopo/marginal"][6] == "0.50"
    assert cells["faca"][8] == "+0.50 / n/a"  # why/info_partial_corr's run mean; no proc figure


@pytest.mark.parametrize("setting", sorted(b.SETTINGS))
def test_every_setting_config_loads_with_its_conditions(setting):
    s = b.SETTINGS[setting]
    for cond in (*s.conditions, *s.extra):
        cfg = load_config(str(cc.ROOT / s.config), ["job=rl", *cc.CONDITIONS[cond]])
        assert cfg.env.gym == s.gym and cfg.env.outcome == "binary"


def test_the_baselines_always_run_and_errors_name_the_argument(monkeypatch, tmp_path):
    args = b.parse_args(["--setting", "faca_intention", "--conditions", "faca"])
    assert args.conditions == ["grpo", "control", "faca"]
    for argv, msg in ((["--setting", "faca_intention", "x"], "expected key=value"),
                      (["--setting", "faca_intention", "seed=1"], "set by the script"),
                      (["--setting", "faca_intention", "--conditions", "nope"], "not one of")):
        with pytest.raises(SystemExit):
            b.parse_args(argv)
    monkeypatch.setattr(b.cc, "run_grid", lambda **kw: {})
    assert b.main(["--setting", "faca_intention", "--runs-dir", str(tmp_path)]) == 1  # nothing finished

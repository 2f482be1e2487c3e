"""The run directory's guards (`jaxagent.jobs.resume`) and the runs that must not end well.

- a resume with a changed config is refused, the differing dotted keys listed (old -> new),
  unless ``resume_overrides`` names them; every config a run used is kept (``config.yaml``,
  then ``config.resume-<n>.yaml``), and a resume compares with the newest;
- ``resume=true`` with nothing to resume, and a run name holding another job's results, are
  errors naming the key (``resume``, ``name``); names default from the job and environment;
- ``metrics.jsonl`` is cut back (atomically) to the restored checkpoint: no record twice;
- updates skipped for non-finite values past ``{sft,rl}.max_skipped_share``, and a fired
  collapse diagnostic (``rl.fail_on_collapse``), end the launch with a non-zero exit.

The launches are in-process (`jaxagent.launch.main`), small, on the CPU. Non-finite updates come
from a loss that is NaN (the jitted update then refuses every update: `jaxagent.train.step`).
"""

import json
from pathlib import Path

import jax.numpy as jnp
import pytest
import yaml

from jaxagent import configlib
from jaxagent.jobs.config import load_config
from jaxagent.launch import main
from jaxagent import jobs
from jaxagent.eval import report
from jaxagent.jobs import phases
from jaxagent.train import rl, step
from jaxagent.jobs.resume import (ResumeError, after_checkpoint, check_not_shortened, check_run_dir, config_diff,
                                   record_config, truncate_metrics)

SMALL = ["eval.tasks=2", "rollout.max_turns=3", "rollout.slots=4", "rollout.max_new_tokens=32",
         "checkpoint.every=1", "checkpoint.export_hf=false", "progress=false"]
SFT = ["job=sft", "sft.steps=2", "sft.demos=8", "sft.batch_size=4", *SMALL]
RL = ["job=rl", "rl.tasks_per_step=2", "rl.group_size=2", "rl.minibatch_size=2", "eval.every=0",
      "rollout.max_tokens=256", "rollout.capacity=256", *SMALL]


def _records(run: Path) -> list[dict]:
    return report.read_metrics(run / "metrics.jsonl")


def _results(run: Path) -> list[tuple]:
    return [(r["phase"], r["step"], r.get("label")) for r in _records(run) if r["phase"] in ("sft", "rl", "eval")]


def _cfg(run: Path, name: str) -> dict:
    return yaml.safe_load((run / name).read_text())


# ----------------------------------------------------------------------------- config on resume
def test_resume_refuses_a_changed_config_unless_named_and_keeps_every_config(tmp_path):
    argv = SFT + [f"runs_dir={tmp_path}", "name=h"]
    run = tmp_path / "h"
    assert main(argv) == 0
    first = (run / "config.yaml").read_text()
    # A changed learning rate and model shape: refused, each key listed with both values.
    with pytest.raises(SystemExit) as info:
        main(argv + ["resume=true", "optim.lr=0.002", "model.hidden_size=96", "rl.credit=infopo"])
    msg = str(info.value)
    assert msg.startswith("config error: resume=true:") and "\n" not in msg
    assert "optim.lr: 0.0003 -> 0.002" in msg and "model.hidden_size: None -> 96" in msg
    assert "rl.credit: 'grpo' -> 'infopo'" in msg and "3 key(s)" in msg
    assert "resume_overrides=[model.hidden_size,rl.credit,optim.lr]" in msg
    assert sorted(p.name for p in run.glob("config*")) == ["config.yaml"]  # nothing written
    # Named, the change is allowed (a section covers its keys); the first config stays.
    assert main(argv + ["resume=true", "eval.tasks=3", "eval.k=2", "resume_overrides=[eval]"]) == 0
    assert (run / "config.yaml").read_text() == first
    summary = json.loads((run / "summary.json").read_text())  # the values this launch ran with
    assert (summary["eval_tasks"], summary["eval_k"], summary["config_file"]) == (3, 2, "config.resume-1.yaml")
    assert (summary["eval_tasks_before"], summary["eval_k_before"]) == (2, 1)  # the evaluation before is the first's
    assert _cfg(run, "config.resume-1.yaml")["eval"]["tasks"] == 3
    assert _cfg(run, "config.resume-1.yaml")["resume_overrides"] == ["eval"]
    # The next resume compares with the newest config: the same eval.tasks passes, going back is a change.
    assert main(argv + ["resume=true", "eval.tasks=3", "eval.k=2", "steps=9", "progress=true"]) == 0
    assert _cfg(run, "config.resume-2.yaml")["steps"] == 9  # steps, progress: always allowed
    with pytest.raises(SystemExit, match=r"config.resume-2.yaml\) in 2 key\(s\): eval.k: 2 -> None; eval.tasks: 3 -> 2"):
        main(argv + ["resume=true"])
    # Each launch logged the final evaluation again: only the last one is left.
    results = _results(run)
    assert results == [("eval", 0, "before"), ("sft", 0, None), ("sft", 1, None), ("eval", 2, "after")]
    events = [r for r in _records(run) if r["phase"] == "resume"]
    assert [(e["of"], e["checkpoint"], e["dropped_records"]) for e in events] == [("sft", 2, 1), ("sft", 2, 1)]


def test_resume_with_nothing_to_resume_is_an_error(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(SFT + [f"runs_dir={tmp_path}", "name=nothing", "resume=true"])
    msg = str(info.value)
    assert "resume=true" in msg and str(tmp_path / "nothing") in msg and "drop resume=true" in msg
    assert "name=" in msg and not (tmp_path / "nothing").exists()


def test_a_run_of_another_job_is_never_overwritten(tmp_path):
    record_config(load_config(None, [f"runs_dir={tmp_path}", "name=q"]), tmp_path / "q")  # an sft+rl run
    before = (tmp_path / "q" / "config.yaml").read_text()
    for argv in (["job=eval"], ["job=eval", "env=tau2_retail", "agent=oracle"], ["env.gym=telepathy"]):
        with pytest.raises(SystemExit) as info:
            main(argv + SMALL + [f"runs_dir={tmp_path}", "name=q"])
        msg = str(info.value)
        assert msg.startswith("config error: name='q':") and "holds the results of another run" in msg, msg
        assert "job='sft+rl'" in msg and "pick another name=" in msg
    assert (tmp_path / "q" / "config.yaml").read_text() == before
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == ["config.yaml"]
    # nor by the same job without resume=true or overwrite=true: the error names the ways out
    with pytest.raises(ResumeError, match=r"holds a run already \(config.yaml\); a launch never overwrites one "
                                          r"silently: set name= .* overwrite=true .* resume=true"):
        check_run_dir(load_config(None, [f"runs_dir={tmp_path}", "name=q"]), tmp_path / "q")
    check_run_dir(load_config(None, [f"runs_dir={tmp_path}", "name=q", "overwrite=true"]), tmp_path / "q")
    check_run_dir(load_config(None, [f"runs_dir={tmp_path}", "name=q", "job=eval", "overwrite=true"]), tmp_path / "q")


def test_a_rerun_gets_a_numbered_directory_or_is_refused_or_replaces_when_asked(tmp_path, capsys):
    argv = ["job=eval", *SMALL, f"runs_dir={tmp_path}"]
    assert main(argv) == 0 and main(argv) == 0  # no name given: the second run is numbered
    err = capsys.readouterr().err
    assert f"{tmp_path / 'eval-intention'} holds an earlier run; this one writes {tmp_path / 'eval-intention-2'}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval-intention", "eval-intention-2"]
    assert json.loads((tmp_path / "eval-intention-2" / "summary.json").read_text())["name"] == "eval-intention-2"
    # a given name is refused, naming the ways out; the run stays as it was
    first = (tmp_path / "eval-intention" / "summary.json").read_text()
    with pytest.raises(SystemExit, match=r"config error: name='eval-intention': .* overwrite=true"):
        main(argv + ["name=eval-intention"])
    assert (tmp_path / "eval-intention" / "summary.json").read_text() == first
    # overwrite=true replaces it: what the old run left is gone
    (tmp_path / "eval-intention" / "stale.txt").write_text("old")
    assert main(argv + ["name=eval-intention", "overwrite=true"]) == 0
    assert not (tmp_path / "eval-intention" / "stale.txt").exists()
    assert (tmp_path / "eval-intention" / "summary.json").exists()
    with pytest.raises(SystemExit, match="overwrite=true: resume=true continues"):
        main(argv + ["resume=true", "overwrite=true"])


def test_an_eval_jobs_summary_holds_only_evaluation_fields(tmp_path):
    assert main(["job=eval", *SMALL, f"runs_dir={tmp_path}", "name=e"]) == 0
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert set(summary) == {"name", "job", "gym", "env", "model_params", "success", "reward", "turns", "eval_tasks",
                            "eval_k", "wall_seconds", "devices"}
    assert summary["eval_tasks"] == 2 and not (tmp_path / "e" / "plots").exists()


def test_default_names_follow_the_job_and_environment(tmp_path):
    assert load_config().name == "quickstart"
    assert load_config(None, ["rl.credit=grpo"]).name == "quickstart"
    assert load_config(None, ["job=eval", "env.kind=tau2_retail", "eval.agent=oracle"]).name == "eval-tau2_retail"
    assert load_config(None, ["job=rl"]).name == "rl-intention"
    assert load_config(None, ["env.gym=telepathy"]).name == "sft+rl-telepathy"
    assert load_config(None, ["job=rl", "name=quickstart"]).name == "quickstart"  # given: kept (and guarded)
    assert load_config("configs/faca_telepathy.yaml").name == "faca-telepathy"
    (tmp_path / "c.yaml").write_text("job: sft\n")
    assert load_config(tmp_path / "c.yaml").name == "sft-intention"


def test_unknown_resume_override_is_named():
    with pytest.raises(SystemExit, match=r"resume_overrides: 'optim.lrr' is not a config key \(did you mean "
                                         r"'optim.lr'\?\)"):
        main(["resume_overrides=[optim.lrr]", "--dry-run"])
    assert load_config(None, ["resume_overrides=[steps,eval.every,rollout]"]).resume_overrides == (
        "steps", "eval.every", "rollout")


def test_config_diff_lists_dotted_leaves():
    old = {"a": 1, "s": {"x": 1.0, "y": [1, 2], "n": float("nan")}, "opt": None, "gone": 3}
    new = {"a": 1, "s": {"x": 1.5, "y": [1, 2], "n": float("nan"), "z": True}, "opt": {"u": 1}}
    defaults = {"s": {"z": False}}
    assert config_diff(old, new, defaults) == [("s.x", 1.0, 1.5), ("s.z", False, True), ("opt", None, {"u": 1})]
    assert config_diff(old, new, {"s": {"z": True}}) == [("s.x", 1.0, 1.5), ("opt", None, {"u": 1})]
    assert config_diff({"b": 1}, {"b": True}) == [("b", 1, True)]
    assert config_diff({"f": 1}, {"f": 1.0}) == []


def test_a_resume_cannot_shorten_a_run():
    cfg = load_config(None, ["steps=2"])
    check_not_shortened(cfg, "rl", 2, 2, "steps")
    with pytest.raises(ResumeError, match=r"steps=2: the run's rl checkpoint is at step 4 already"):
        check_not_shortened(cfg, "rl", 4, 2, "steps")


# ----------------------------------------------------------------------------- metrics.jsonl
def test_metrics_are_truncated_back_to_the_checkpoint_atomically(tmp_path):
    path = tmp_path / "metrics.jsonl"
    recs = [{"phase": "eval", "step": 0, "label": "before"}, {"phase": "rl", "step": 0}, {"phase": "rl", "step": 1},
            {"phase": "eval", "step": 2, "label": "during"}, {"phase": "rl", "step": 2},
            {"phase": "resume", "step": 2, "of": "rl"}, {"phase": "rl", "step": 3},
            {"phase": "eval", "step": 4, "label": "during"}, {"phase": "eval", "step": 5, "label": "after"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"phase": "rl", "st')  # a crash mid-write
    assert truncate_metrics(path, after_checkpoint("rl", 2)) == 5
    assert [json.loads(x) for x in path.read_text().splitlines()] == recs[:4] + [recs[5]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temporary file left
    assert truncate_metrics(path, after_checkpoint("rl", 2)) == 0
    # an SFT resume keeps RL's evaluations; the RunLog appends to the rewritten file
    log = jobs.RunLog(tmp_path, progress=False)
    assert log.truncate(after_checkpoint("sft", 0)) == 0
    assert log.truncate(after_checkpoint("rl", 1)) == 2  # rl 1 and the during evaluation at 2
    log.log("rl", 1, {"x": 1.0})
    log.close()
    assert [(r["phase"], r["step"]) for r in report.read_metrics(path)] == [
        ("eval", 0), ("rl", 0), ("resume", 2), ("rl", 1)]


# ----------------------------------------------------------------------------- runs that fail
def _nan(loss_fn):
    def loss(params, batch):
        value, metrics = loss_fn(params, batch)
        return value * jnp.nan, metrics

    return loss


def test_sft_whose_updates_are_skipped_exits_non_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(phases, "sft_loss_fn", lambda *a, **k: _nan(step.sft_loss_fn(*a, **k)))
    argv = SFT + ["sft.steps=5", f"runs_dir={tmp_path}", "name=nan"]
    with pytest.raises(SystemExit) as info:
        main(argv)
    msg = str(info.value)
    assert msg.startswith("training failed: sft: 5 of 5 updates were skipped") and "\n" not in msg
    assert "sft.max_skipped_share=0.5" in msg
    recs = _records(tmp_path / "nan")
    sft = [r for r in recs if r["phase"] == "sft"]
    assert [(r["step"], r["skipped"], r["skipped_total"], r["finite"]) for r in sft] == [(0, 1.0, 1.0, 0.0),
                                                                                       (4, 1.0, 5.0, 0.0)]
    [fail] = [r for r in recs if r["phase"] == "failure"]
    assert fail["of"] == "sft" and fail["reason"] == msg.removeprefix("training failed: ")
    assert not (tmp_path / "nan" / "summary.json").exists()


def test_rl_skipped_updates_are_counted_per_iteration_and_stop_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(rl, "ppo_loss_fn", lambda *a, **k: _nan(step.ppo_loss_fn(*a, **k)))
    with pytest.raises(SystemExit, match=r"^training failed: rl: 4 of 4 updates were skipped .*"
                                         r"rl.max_skipped_share=0.5"):
        main(RL + ["steps=3", f"runs_dir={tmp_path}", "name=nan"])
    it = [r for r in _records(tmp_path / "nan") if r["phase"] == "rl"]
    # two minibatch updates per iteration, both refused: counted per iteration, and in all
    assert [(r["step"], r["update/skipped"], r["update/skipped_total"], r["updates"]) for r in it] == [
        (0, 2.0, 2, 0), (1, 2.0, 4, 0)]  # stopped after iteration 1 (4 updates made), not at the end
    assert it[0]["update/finite"] == 0.0 and it[1]["update/finite"] == 0.0


def test_a_collapse_exits_non_zero_after_the_summary(tmp_path, monkeypatch):
    real = report.infopo_diagnostics

    def collapsed(metrics):
        return dict(real(metrics), collapse=True, collapse_reasons=["eval success fell 0.5 from its best 0.5"])

    monkeypatch.setattr(report, "infopo_diagnostics", collapsed)
    argv = RL + ["steps=1", f"runs_dir={tmp_path}", "name=c"]
    with pytest.raises(SystemExit) as info:
        main(argv)
    msg = str(info.value)
    assert msg.startswith("training failed: ") and "RL collapsed (eval success fell 0.5" in msg
    assert "rl.fail_on_collapse=false" in msg
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["diagnostics"]["collapse"] is True and summary["failure"] in msg
    # Told not to fail on it, the same (finished) run exits 0 and keeps the diagnosis.
    assert main(argv + ["resume=true", "rl.fail_on_collapse=false", "resume_overrides=[rl.fail_on_collapse]"]) == 0
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["diagnostics"]["collapse"] is True and "failure" not in summary


def test_skip_share_rule():
    step.check_skipped_share(0, 3, 0.5, phase="rl", key="k")  # fewer than 4 updates: not judged yet
    with pytest.raises(step.TrainingFailed, match="3 of 3"):
        step.check_skipped_share(0, 3, 0.5, phase="rl", key="k", final=True)
    step.check_skipped_share(2, 2, 0.5, phase="rl", key="k")  # 50% is not more than 0.5
    with pytest.raises(step.TrainingFailed, match=r"3 of 5 .* 60% > k=0.5"):
        step.check_skipped_share(2, 3, 0.5, phase="rl", key="k")
    step.check_skipped_share(0, 9, 1.0, phase="rl", key="k", final=True)  # 1: never
    with pytest.raises(configlib.ConfigError, match="max_skipped_share"):
        load_config(None, ["rl.max_skipped_share=1.5"])
    with pytest.raises(configlib.ConfigError, match="max_skipped_share"):
        load_config(None, ["sft.max_skipped_share=-0.1"])


def test_the_evaluation_after_sft_is_dropped_only_when_sft_resumes_before_its_end():
    rec = {"phase": "eval", "step": 600, "label": "after_sft"}
    assert after_checkpoint("sft", 400)(rec)  # SFT redoes steps 400..599: its evaluation is stale
    assert not after_checkpoint("sft", 600)(rec)  # SFT complete: the record stands
    assert not after_checkpoint("rl", 0)(rec)  # an RL resume never drops it

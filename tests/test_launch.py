"""`python -m jaxagent.launch`: config errors name the key, --dry-run checks paper-scale configs
without weights, and a small sft+rl job writes the run directory, checkpoints, an HF export and
the summary, and resumes from its checkpoints."""

import json
from pathlib import Path

import pytest

from jaxagent.launch import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["sft.steps=3", "sft.demos=8", "sft.batch_size=4", "steps=2", "eval.tasks=2", "eval.every=1",
         "rl.tasks_per_step=2", "rl.group_size=2", "rl.minibatch_size=4", "rollout.max_turns=3", "rollout.slots=4",
         "checkpoint.every=1", "rl.credit=infopo", "progress=false"]


def test_paper_scale_config_passes_dry_run(capsys):
    assert main(["--config", str(ROOT / "configs" / "infopo_7b.yaml"), "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == "valid" and out["parameters_millions"] == 7615.62
    assert out["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1} and out["devices_needed"] == 4
    # bf16 weights split four ways (embeddings and layers are fsdp-sharded, norms and biases tiny)
    assert abs(out["param_bytes_per_device"] - 2 * 7615616512 / 4) / (2 * 7615616512 / 4) < 0.01


@pytest.mark.parametrize("name", ["qd_label_musique", "qd_stage1_sft", "qd_stage2_dpo", "qd_stage3_dpo"])
def test_qd_paper_scale_configs_pass_dry_run(name, capsys):
    assert main(["--config", str(ROOT / "configs" / f"{name}.yaml"), "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == "valid" and out["parameters_millions"] == 8190.74  # Qwen3-8B
    if name != "qd_label_musique":
        # LoRA r 32 on the 7 projections of 36 layers: r * (in + out) summed, about 1.07% of the model
        per_layer = 32 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 12288) + (12288 + 4096))
        assert out["trained_parameters"] == 36 * per_layer == 87293952 and out["lora_rank"] == 32


def test_quickstart_dry_run(capsys):
    assert main(["--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["job"] == "sft+rl" and out["credit"] == "grpo" and 0 < out["parameters"] < 1_000_000


@pytest.mark.parametrize("argv, needle", [
    (["rl.credit=gpro"], "rl.credit: 'gpro' is not one of"),
    (["optim.lrr=1"], "did you mean 'lr'"),
    (["steps"], "argument 'steps': expected key=value"),
    (["--config", "nope.yaml"], "nope.yaml"),
])
def test_config_errors_are_named(argv, needle):
    with pytest.raises(SystemExit, match=needle):
        main(argv + ["--dry-run"])


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_small_job_writes_the_run_and_resumes(tmp_path, capsys):
    argv = SMALL + [f"runs_dir={tmp_path}", "name=r"]
    assert main(argv) == 0
    run = tmp_path / "r"
    summary = json.loads((run / "summary.json").read_text())
    for k in ("success_before", "success_after", "wall_seconds", "steps", "credit"):
        assert k in summary
    assert summary["steps"] == 5 and summary["credit"] == "infopo"
    assert (run / "config.yaml").exists() and (run / "hf" / "config.json").exists()
    assert (run / "hf" / "tokenizer.json").exists()
    assert sorted(p.name for p in (run / "trajectories").iterdir()) == ["iter_00000.jsonl", "iter_00001.jsonl"]
    assert {"reward.png", "turns_length.png", "infogain_heatmap.png", "sft_loss.png"} <= {
        p.name for p in (run / "plots").iterdir()}
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "tb").iterdir())
    assert "best_to_final_drop" in summary["diagnostics"]
    phases = [m["phase"] for m in _metrics(run)]
    # before, after SFT, during (after iteration 1), after
    assert phases.count("rl") == 2
    assert [m["label"] for m in _metrics(run) if m["phase"] == "eval"] == ["before", "after_sft", "during", "after"]
    evals = {m["label"]: m for m in _metrics(run) if m["phase"] == "eval"}
    assert "sampled/success" not in evals["before"]  # a random initialisation is not sampled
    assert all(len(evals[k]["sampled/success_by_task"]) == 2 for k in ("after_sft", "during", "after"))
    assert summary["success_after_sft"] == evals["after_sft"]["success"]
    assert summary["gain_rl"] == pytest.approx(summary["success_after"] - summary["success_after_sft"])
    assert summary["sampled_gain_rl"] == pytest.approx(evals["after"]["sampled/success"]
                                                       - evals["after_sft"]["sampled/success"])
    # A second launch of the same name without resume refuses to overwrite it...
    with pytest.raises(SystemExit, match="holds a run already .* overwrite=true .* resume=true"):
        main(argv)
    # ... and with resume it finds both phases complete: no new SFT or RL step, same final eval.
    assert main(argv + ["resume=true"]) == 0
    again = _metrics(run)
    assert [m["phase"] for m in again].count("rl") == 2
    assert [m.get("label") for m in again if m["phase"] == "eval"].count("after_sft") == 1  # found, not re-run
    assert json.loads((run / "summary.json").read_text())["success_after"] == summary["success_after"]


@pytest.mark.parametrize("tty", [True, False])
def test_run_log_shows_live_figures_and_reads_back_past_a_cut_record(tmp_path, capsys, tty):
    from jaxagent.jobs import RunLog

    log = RunLog(tmp_path / "run", progress=True, tty=tty)
    log.start("rl", 3)
    log.log("rl", 0, {"success": 0.5, "info/gain_mean": 0.25, "loss": 1.0}, show=("success", "info/gain_mean"))
    log.log("rl", 1, {"success": 0.75, "info/gain_mean": 0.125}, show=("success", "info/gain_mean"))
    log.end("rl")
    err = capsys.readouterr().err
    assert "success=0.75" in err and "gain_mean=0.125" in err and "loss" not in err
    if tty:  # a bar at 2 of 3 steps
        assert "2/3" in err and "[rl 1]" not in err
    else:  # one plain line per logged step
        assert "[rl 0] success=0.5 gain_mean=0.25" in err and "\r" not in err
    log.close()
    path = tmp_path / "run" / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"phase": "rl", "step": 2, "succ')  # a crash mid-write
    log = RunLog(tmp_path / "run", progress=False)
    assert [(r["phase"], r["step"], r["success"]) for r in log.read()] == [("rl", 0, 0.5), ("rl", 1, 0.75)]
    log.close()


# --------------------------------------------------------------------------------------------- --help


def test_help_fits_the_terminal_and_lists_presets_once_each():
    import os
    import subprocess
    import sys

    from jaxagent.models import preset_names

    env = dict(os.environ, COLUMNS="100")
    out = subprocess.run([sys.executable, "-m", "jaxagent.launch", "--help"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300, check=True).stdout
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    presets = out[out.index("\nmodel presets"):out.index("\nconfig files:")]
    assert all(name in presets for name in preset_names())
    # the user simulator's long prompt is elided and its section (four keys use it) listed once
    assert "You are playing a human user" not in out
    assert out.count("system_prompt") == 1 and "env.llm_user.system_prompt" in out
    # customer_llm, judge, the four Q&D endpoints (questioner, baseline, drafter, answerer) and the tau2 selector
    assert " ".join(out.split()).count("keys and defaults as env.llm_user.*") == 7
    assert "qd.tau2.selector_endpoint" in out
    assert "qd.drafter_endpoint" in out and "qd.drafter_endpoint.system_prompt" not in out
    assert "eval.endpoint.base_url" in out and "eval.endpoint.system_prompt" not in out


@pytest.mark.parametrize("width", [60, 80, 132])
def test_help_width_argument(width):
    from jaxagent.launch import build_parser

    text = build_parser(width).format_help()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "model.preset" in text and "tiny-qwen2" in text and "--dry-run" in text

"""The model-stack tour (python -m jaxagent.tour) runs end to end on the CPU and fails loudly on bad arguments."""

import json

import pytest

from jaxagent.tour import main, weights_note


def test_demo_runs_and_reports(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--model", "tiny-qwen3", "--out", str(out), "--batch", "8", "--seq", "16",
                 "--prompt-len", "4", "--new-tokens", "3", "--mesh", "2,2,2"]) == 0
    report = json.loads((out / "demo.json").read_text())
    assert report["hf_round_trip_exact"] and report["greedy_consistent"]
    assert report["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    assert len(report["continuation_row0"]) == 3
    assert (out / "model" / "config.json").exists()
    assert report["weights"] == "random"
    done = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[done]")]
    assert len(done) == 1 and "This is a random model (preset 'tiny-qwen3'" in done[0]
    # The checkpoint it wrote loads back as a demo model too, and is not called random.
    assert main(["--model", str(out / "model"), "--out", str(tmp_path / "again"), "--batch", "2", "--seq", "8",
                 "--prompt-len", "2", "--new-tokens", "2", "--mesh", "1,-1,1"]) == 0
    text = capsys.readouterr().out
    assert "loaded HF checkpoint" in text and "random model" not in text
    done = [line for line in text.splitlines() if line.startswith("[done]")]
    assert len(done) == 1 and f"the weights of the checkpoint {out / 'model'}" in done[0]
    assert json.loads((tmp_path / "again" / "demo.json").read_text())["weights"] == "checkpoint"


def test_weights_note_follows_the_weights():
    assert weights_note(False, "tiny-qwen2").startswith("This is a random model (preset 'tiny-qwen2'")
    note = weights_note(True, "runs/x/hf")
    assert "random model" not in note and "runs/x/hf" in note


def test_dry_run_allocates_nothing(tmp_path, capsys):
    assert main(["--model", "qwen2.5-7b", "--dry-run", "--out", str(tmp_path / "x")]) == 0
    text = capsys.readouterr().out
    assert "7615.62M parameters" in text
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--mesh", "2,2"], "--mesh='2,2'"),
    (["--batch", "0"], "--batch=0"),
    (["--prompt-len", "9", "--seq", "8"], "--prompt-len=9"),
    (["--model", "gpt2"], "model preset 'gpt2'"),
])
def test_bad_arguments_are_named(argv, needle):
    with pytest.raises((SystemExit, ValueError), match=needle.replace("[", r"\[")):
        main(argv)

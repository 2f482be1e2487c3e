"""The model-stack tour (python -m jaxagent.tour) runs end to end on the CPU and fails loudly on bad arguments."""

import json

import pytest

from jaxagent.tour import main


def test_demo_runs_and_reports(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--model", "tiny-qwen3", "--out", str(out), "--batch", "8", "--seq", "16",
                 "--prompt-len", "4", "--new-tokens", "3", "--mesh", "2,2,2"]) == 0
    report = json.loads((out / "demo.json").read_text())
    assert report["hf_round_trip_exact"] and report["greedy_consistent"]
    assert report["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    assert len(report["continuation_row0"]) == 3
    assert (out / "model" / "config.json").exists()
    # The checkpoint it wrote loads back as a demo model too.
    assert main(["--model", str(out / "model"), "--out", str(tmp_path / "again"), "--batch", "2", "--seq", "8",
                 "--prompt-len", "2", "--new-tokens", "2", "--mesh", "1,-1,1"]) == 0
    assert "loaded HF checkpoint" in capsys.readouterr().out


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

"""Settings that cannot work are refused before any work starts, as one ``config error:`` line that
names the full dotted key, the value and what is expected (issue 14, section 2)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxagent import configlib
from jaxagent.jobs.config import load_config
from jaxagent.launch import main
from jaxagent.models import preset, save_pretrained
from jaxagent.models.hf import CheckpointError, load_pretrained
from jaxagent.models.qwen import init_params

ROOT = Path(__file__).resolve().parents[1]
GYM_TOKENIZER = ROOT / "jaxagent" / "data" / "tokenizers" / "gyms"


def _refused(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    message = str(e.value.code)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("override, needles", [
    ("rollout.temperature=-1", ["rollout.temperature=-1.0", ">= 0"]),
    ("rollout.top_p=0", ["rollout.top_p=0.0", "(0, 1]"]),
    ("rollout.top_p=1.5", ["rollout.top_p=1.5", "(0, 1]"]),
    ("rollout.top_k=-3", ["rollout.top_k=-3", ">= 0"]),
    ("eval.temperature=-0.5", ["eval.temperature=-0.5", ">= 0"]),
    ("rollout.retries=-1", ["rollout.retries=-1", ">= 0"]),
    ("rollout.timeout_s=-1", ["rollout.timeout_s=-1.0", "> 0"]),
    ("rollout.timeout_s=.nan", ["rollout.timeout_s=nan", "finite"]),
    ("checkpoint.keep=0", ["checkpoint.keep=0", ">= 1"]),
    ("checkpoint.every=-1", ["checkpoint.every=-1", ">= 0"]),
    ("mesh.data=0", ["mesh.data=0", "positive integer or -1"]),
    ("mesh={data: -1, fsdp: -1}", ["mesh=", "at most one axis"]),
    ("rl.success_threshold=1.5", ["rl.success_threshold=1.5", "[0, 1.0]"]),
    ("rl.success_threshold=-0.1", ["rl.success_threshold=-0.1", "[0, 1.0]"]),
    ("grpo.eps=0", ["grpo.eps=0.0", "> 0"]),
    ("sft.noise=1.5", ["sft.noise=1.5"]),
])
def test_dry_run_refuses_with_the_dotted_key(override, needles):
    message = _refused(["--dry-run", override])
    assert message.startswith("config error: "), message
    for n in needles:
        assert n in message, (n, message)


def test_a_group_of_one_is_refused_for_every_group_normalised_credit():
    for credit in ("grpo", "infopo", "faca", "infopo+faca"):
        message = _refused(["--dry-run", "rl.group_size=1", "rl.minibatch_size=0", f"rl.credit={credit}"])
        assert "rl.group_size=1" in message and credit in message and ">= 2" in message
    # an eval or SFT job has no groups: the same setting is fine there
    assert load_config(overrides=["job=sft", "rl.group_size=1", "rl.minibatch_size=0"]).rl.group_size == 1


@dataclasses.dataclass(frozen=True)
class Inner:
    x: int = 0

    def __post_init__(self):
        if self.x < 0:
            raise ValueError(f"x={self.x}: expected >= 0")
        if self.x == 7:
            raise ValueError("something else went wrong")
        if self.x == 8:
            raise ValueError(f"Inner.x={self.x}: class-named")


@dataclasses.dataclass(frozen=True)
class Outer:
    inner: Inner = dataclasses.field(default_factory=Inner)


def test_the_dotted_prefix_is_only_added_to_a_field_of_the_section():
    for x, expected in ((-1, "inner.x=-1: expected >= 0"), (7, "inner: something else went wrong"),
                        (8, "inner.x=8: class-named")):
        with pytest.raises(configlib.ConfigError) as e:
            configlib.load(Outer, overrides=[f"inner.x={x}"])
        assert str(e.value) == expected


def test_a_duplicate_yaml_key_names_its_dotted_path_and_both_lines(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text("name: dup\nrl:\n  credit: grpo\n  group_size: 4\n  credit: faca\n")
    message = _refused(["--dry-run", "--config", str(f)])
    assert "duplicate key rl.credit" in message and "line 5" in message and "line 3" in message
    top = tmp_path / "top.yaml"
    top.write_text("steps: 3\nname: a\nsteps: 4\n")
    assert "duplicate key steps" in _refused(["--dry-run", "--config", str(top)])
    # the same key in two different mappings is not a duplicate
    ok = tmp_path / "ok.yaml"
    ok.write_text("name: ok\nrollout: {temperature: 0.5}\neval: {temperature: 0.0}\n")
    assert main(["--dry-run", "--config", str(ok)]) == 0


def test_a_mesh_that_cannot_be_laid_on_the_devices_is_refused_before_any_work(tmp_path):
    n = len(jax.devices())
    message = _refused([f"runs_dir={tmp_path}", f"mesh.data={n + 1}", "mesh.fsdp=1"])
    assert message.startswith("config error: mesh=") and f"{n} cpu device" in message
    assert not any(tmp_path.iterdir())  # nothing was written
    # --dry-run still plans larger meshes on an abstract mesh
    assert main(["--dry-run", f"mesh.data={n + 1}", "mesh.fsdp=1"]) == 0


def test_a_tokenizer_path_that_does_not_exist_is_refused(tmp_path):
    missing = tmp_path / "no-such-tokenizer"
    for argv in ([f"tokenizer={missing}", f"runs_dir={tmp_path}"], ["--dry-run", f"tokenizer={missing}"]):
        message = _refused(argv)
        assert message.startswith(f"config error: tokenizer='{missing}'") and "not a directory" in message
    assert not (tmp_path / "quickstart").exists()
    # before a download, --dry-run lets a tokenizer through that is the (absent) checkpoint itself
    assert main(["--dry-run", "--config", str(ROOT / "configs" / "infopo_7b.yaml")]) == 0
    message = _refused([f"model.path={missing}", f"tokenizer={missing}", f"runs_dir={tmp_path}", "job=eval"])
    assert message.startswith(f"config error: model.path='{missing}'")


def _checkpoint(path: Path, vocab_size: int) -> Path:
    cfg = preset("tiny-qwen2", vocab_size=vocab_size)
    save_pretrained(path, cfg, init_params(jax.random.key(0), cfg))
    return path


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_at_load(tmp_path):
    ckpt = _checkpoint(tmp_path / "vocab96", 96)
    message = _refused([f"runs_dir={tmp_path}", "job=eval", f"model.path={ckpt}", f"tokenizer={GYM_TOKENIZER}",
                        "eval.tasks=1"])
    assert message.startswith(f"config error: tokenizer='{GYM_TOKENIZER}'"), message
    assert "vocab_size=96" in message and "943" in message and str(ckpt) in message


def test_a_truncated_safetensors_file_is_named(tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt", 1024)
    f = ckpt / "model.safetensors"
    data = f.read_bytes()
    for cut in (len(data) // 2, 40):
        f.write_bytes(data[:cut])
        with pytest.raises(CheckpointError) as e:
            load_pretrained(ckpt)
        assert "'model.safetensors'" in str(e.value) and f"({cut} bytes)" in str(e.value)
    message = _refused([f"runs_dir={tmp_path}", "job=eval", f"model.path={ckpt}", f"tokenizer={GYM_TOKENIZER}"])
    assert message.startswith("error: ") and "model.safetensors" in message and "truncated" in message
    f.write_bytes(data)  # the intact file loads
    cfg, params = load_pretrained(ckpt)
    assert np.asarray(params["embed"]).shape[0] == 1024


def test_an_episode_budget_below_the_first_prompt_fails_at_the_first_reset(tmp_path):
    message = _refused([f"runs_dir={tmp_path}", "job=eval", "eval.tasks=1", "rollout.max_tokens=100"])
    assert message.startswith("config error: rollout.max_tokens=100:"), message
    assert "rollout.max_new_tokens=96" in message and "expected rollout.max_tokens >= " in message
    need = int(message.rsplit(">= ", 1)[1])
    assert main([f"runs_dir={tmp_path}", "name=fits", "job=eval", "eval.tasks=1", f"rollout.max_tokens={need}",
                 "checkpoint.export_hf=false", "progress=false"]) == 0

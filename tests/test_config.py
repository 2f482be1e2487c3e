"""The run configuration: the defaults are a valid quickstart, every file in configs/ loads,
and bad values are errors that name the key."""

from pathlib import Path

import pytest

from jaxagent import configlib
from jaxagent.configlib import ConfigError
from jaxagent.jobs.config import RunConfig, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_the_quickstart():
    cfg = load_config()
    assert cfg == RunConfig()
    assert cfg.job == "sft+rl" and cfg.rl.credit == "grpo" and cfg.env.gym == "intention" and not cfg.rollout.tool_schemas_in_prompt
    assert configlib.from_dict(RunConfig, configlib.to_dict(cfg)) == cfg


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_file_loads(path):
    cfg = load_config(path)
    assert cfg.name != RunConfig().name  # each file names its run


def test_paper_scale_config():
    cfg = load_config(ROOT / "configs" / "infopo_7b.yaml")
    assert cfg.model.path and cfg.env.kind == "llm_user" and cfg.env.llm_user.api_key_env == "USER_SIM_API_KEY"
    assert (cfg.rl.group_size, cfg.infopo.beta, cfg.ppo.kl_coef, cfg.optim.lr) == (5, 0.5, 1e-3, 1e-6)


@pytest.mark.parametrize("override, words", [
    ("rl.credit=gpro", ["rl.credit", "'gpro'", "'infopo'"]),
    ("optim.lrr=1", ["optim.lrr", "unknown key", "did you mean 'lr'"]),
    ("model.preset=qwen9", ["model", "qwen9", "tiny-qwen2"]),
    ("rollout.max_tokens=4096", ["rollout", "max_tokens=4096", "capacity=1024"]),
    ("rl.minibatch_size=7", ["rl", "minibatch_size=7", "64"]),
    ("ppo.clip_low=-1", ["ppo", "clip_low=-1"]),
    ("sft.noise=1.5", ["sft", "noise=1.5"]),
    ("env.kind=llm_user", ["env", "llm_user"]),
    ("name=a/b", ["name='a/b'"]),
    ("steps=many", ["steps", "'many'", "int"]),
    ("model.initializer_range=0", ["model", "initializer_range=0", "positive"]),
    # every learning rate is checked as optim.lr is: finite and >= 0
    ("sft.lr=-0.1", ["sft.lr=-0.1", "finite number >= 0"]),
    ("sft.lr=nan", ["sft.lr=nan", "finite number >= 0"]),
    ("dpo.lr=-1", ["dpo.lr=-1", "finite number >= 0"]),
    ("dpo.lr=inf", ["dpo.lr=inf", "finite number >= 0"]),
    ("optim.lr=nan", ["optim.lr=nan", "finite number >= 0"]),
    ("log.wandb_mode=cloud", ["log.wandb_mode", "'cloud'", "'offline'"]),
])
def test_bad_values_name_the_key(override, words):
    with pytest.raises(configlib.ConfigError) as e:
        load_config(overrides=[override])
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_overrides_reach_nested_sections():
    cfg = load_config(overrides=["optim.lr=3e-7", "rl.group_size=4", "rl.minibatch_size=32", "infopo.beta=0.3",
                                 "mesh={data: 2, fsdp: 4}"])
    assert cfg.optim.lr == 3e-7 and cfg.rl.group_size == 4 and cfg.infopo.beta == 0.3
    assert (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor) == (2, 4, 1)


def test_initializer_range_reaches_the_random_weights():
    """``model.initializer_range`` sets the std of a preset's random matrices (the quickstart
    draws them at 0.05; null keeps the preset's 0.02)."""
    import jax
    import numpy as np

    from jaxagent.models import LogicalRules, make_mesh
    from jaxagent import jobs

    assert RunConfig().model.initializer_range == 0.05
    stds = {}
    for r in (None, 0.05, 0.2):
        cfg = load_config(overrides=[f"model.initializer_range={'null' if r is None else r}", "mesh={data: 1}"])
        tok = jobs.build_tokenizer(cfg)
        qcfg, params = jobs.build_model(cfg, tok, LogicalRules(make_mesh(cfg.mesh)))
        assert qcfg.initializer_range == (0.02 if r is None else r)
        stds[r] = float(np.std(np.asarray(jax.device_get(params["embed"]))))
    for r, std in stds.items():
        assert abs(std - (0.02 if r is None else r)) < 0.05 * (0.02 if r is None else r), stds


def test_sft_optimizer_has_its_own_warmup():
    """The SFT phase warms up by sft.warmup_steps whatever the RL optimizer's warmup (the quickstart's
    SFT needs 10 steps for the copy circuit to form; its RL phase has none); null: optim's."""
    from jaxagent.jobs import sft_optim

    o = sft_optim(load_config())
    assert (o.lr, o.warmup_steps, o.schedule, o.decay_steps) == (1e-2, 10, "cosine", 990)
    assert load_config().optim.warmup_steps == 0
    o = sft_optim(load_config(None, ["sft.warmup_steps=null", "optim.warmup_steps=3", "sft.steps=100"]))
    assert (o.warmup_steps, o.decay_steps) == (3, 97)
    with pytest.raises(ConfigError, match="warmup_steps"):
        load_config(None, ["sft.warmup_steps=-1"])


def test_quickstart_rl_is_the_benchmark_settings():
    """The quickstart's RL phase is the bench's LEARNING (jaxagent/jobs/experiments/rl_learns.py, run as scripts/bench_rl_learns.py): every key LEARNING sets
    has its default value (the bench's sampled evaluation and checkpoint cadence aside)."""
    from jaxagent.jobs.experiments import rl_learns as bench_rl_learns

    keys = [o.split("=", 1)[0] for o in bench_rl_learns.LEARNING if not o.startswith(("eval.sampled_k", "checkpoint."))]
    assert len(keys) == len(bench_rl_learns.LEARNING) - 2
    d, b = configlib.to_dict(load_config()), configlib.to_dict(load_config(None, [*bench_rl_learns.LEARNING]))

    def get(tree, key):
        for part in key.split("."):
            tree = tree[part]
        return tree

    assert {k: get(d, k) for k in keys} == {k: get(b, k) for k in keys}

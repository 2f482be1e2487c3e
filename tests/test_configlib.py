"""configlib: typed dataclass configs from dicts, YAML files (with include) and dotted overrides."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Literal

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxagent import configlib
from jaxagent.configlib import ConfigError

Method = Literal["grpo", "infopo", "faca", "infopo+faca"]


@dataclasses.dataclass(frozen=True)
class Optim:
    lr: float = 3e-4
    b1: float = 0.9
    b2: float = 0.95
    clip_norm: float | None = 1.0
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "cosine"


@dataclasses.dataclass(frozen=True)
class RL:
    group_size: int = 8
    batch_size: int = 32
    minibatch_size: int = 8
    stop: tuple[str, ...] = ("</answer>",)
    temperatures: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        if self.batch_size % self.minibatch_size:
            raise ValueError(f"minibatch_size ({self.minibatch_size}) must divide batch_size ({self.batch_size})")


@dataclasses.dataclass(frozen=True)
class Credit:
    method: Method = "grpo"
    horizon: Literal[1, 2, 4] = 2
    gamma: float = dataclasses.field(default=1.0, metadata={"help": "turn-level discount"})


@dataclasses.dataclass(frozen=True)
class Eval:
    every: int = 100
    split: str = "test"


@dataclasses.dataclass(frozen=True)
class Config:
    name: str = "run"
    seed: int = 0
    debug: bool = False
    eval_every: int | None = None
    optim: Optim = dataclasses.field(default_factory=Optim)
    rl: RL = dataclasses.field(default_factory=RL)
    credit: Credit = dataclasses.field(default_factory=Credit)
    eval: Eval | None = None
    rewards: dict[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.credit.method == "faca" and self.rl.group_size < 2:
            raise ValueError("credit.method 'faca' needs rl.group_size >= 2")


def _err(data) -> str:
    with pytest.raises(ConfigError) as info:
        configlib.from_dict(Config, data)
    return str(info.value)


# ----------------------------------------------------------------------------- from_dict


def test_defaults():
    cfg = configlib.from_dict(Config, {})
    assert cfg == Config()
    assert cfg.optim.lr == 3e-4 and cfg.rl.stop == ("</answer>",) and cfg.eval is None and cfg.rewards == {}


def test_nested_from_dict_converts_and_keeps_unset_defaults():
    cfg = configlib.from_dict(
        Config,
        {
            "seed": 3,
            "eval_every": 50,
            "optim": {"lr": 1, "clip_norm": None},
            "rl": {"stop": ["a", "b"], "temperatures": [1, 0.5]},
            "credit": {"method": "infopo+faca", "horizon": 4},
            "eval": {"split": "dev"},
            "rewards": {"success": 1, "ask": -0.1},
        },
    )
    assert cfg.seed == 3 and cfg.eval_every == 50
    assert cfg.optim.lr == 1.0 and type(cfg.optim.lr) is float and cfg.optim.clip_norm is None
    assert cfg.optim.b1 == 0.9  # not given: default kept
    assert cfg.rl.stop == ("a", "b") and cfg.rl.temperatures == (1.0, 0.5)
    assert type(cfg.rl.temperatures[0]) is float
    assert cfg.credit == Credit(method="infopo+faca", horizon=4)
    assert cfg.eval == Eval(every=100, split="dev")
    assert cfg.rewards == {"success": 1.0, "ask": -0.1} and type(cfg.rewards["success"]) is float


def test_type_error_message_exact():
    assert _err({"rl": {"group_size": "five"}}) == "rl.group_size: expected int, got 'five' (str)"


def test_literal_error_message_exact():
    assert (
        _err({"credit": {"method": "gpro"}})
        == "credit.method: 'gpro' is not one of 'grpo', 'infopo', 'faca', 'infopo+faca'"
    )


def test_unknown_key_lists_sorted_allowed_keys_and_suggests():
    msg = _err({"optim": {"lrr": 0.1}})
    assert msg.startswith("optim.lrr: unknown key; allowed keys: b1, b2, clip_norm, lr, schedule, warmup_steps")
    assert "did you mean 'lr'?" in msg


def test_unknown_key_without_close_match_has_no_hint():
    msg = _err({"zzzzqqq": 1})
    assert msg.startswith("zzzzqqq: unknown key; allowed keys: credit, debug, eval, eval_every,")
    assert "did you mean" not in msg


@pytest.mark.parametrize(
    "data, parts",
    [
        ({"rl": {"group_size": True}}, ["rl.group_size", "True", "expected int"]),
        ({"optim": {"lr": False}}, ["optim.lr", "False", "expected float"]),
        ({"optim": {"lr": "fast"}}, ["optim.lr", "'fast'", "expected float"]),
        ({"rl": {"group_size": 8.0}}, ["rl.group_size", "8.0", "expected int"]),
        ({"debug": "true"}, ["debug", "'true'", "expected bool"]),
        ({"debug": 1}, ["debug", "1 (int)", "expected bool"]),
        ({"name": 5}, ["name", "5 (int)", "expected str"]),
        ({"eval_every": "x"}, ["eval_every", "'x'", "expected int | None"]),
        ({"optim": {"clip_norm": "x"}}, ["optim.clip_norm", "'x'", "expected float | None"]),
        ({"credit": {"horizon": 3}}, ["credit.horizon", "3", "is not one of 1, 2, 4"]),
        ({"credit": {"horizon": True}}, ["credit.horizon", "True", "is not one of 1, 2, 4"]),
        ({"optim": {"schedule": None}}, ["optim.schedule", "None", "is not one of 'constant', 'cosine'"]),
        ({"rl": {"stop": ["a", 7]}}, ["rl.stop[1]", "7 (int)", "expected str"]),
        ({"rl": {"stop": "a"}}, ["rl.stop", "'a'", "expected tuple[str, ...]"]),
        ({"rewards": {"success": "high"}}, ["rewards.success", "'high'", "expected float"]),
        ({"rewards": {1: 1.0}}, ["rewards", "1 (int)", "keys must be str"]),
        ({"rewards": [1.0]}, ["rewards", "[1.0]", "expected dict[str, float]"]),
        ({"optim": 3}, ["optim", "3 (int)", "expected a mapping for Optim"]),
        ({"eval": {"every": "often"}}, ["eval.every", "'often'", "expected int"]),
        ({"eval": {"spilt": "dev"}}, ["eval.spilt", "unknown key", "did you mean 'split'?"]),
    ],
)
def test_error_messages_name_key_value_and_expectation(data, parts):
    msg = _err(data)
    for part in parts:
        assert part in msg, (part, msg)


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"^expected a mapping for Config, got \[1\] \(list\)$"):
        configlib.from_dict(Config, [1])


def test_validate_error_is_prefixed_with_section_path():
    msg = _err({"rl": {"batch_size": 10, "minibatch_size": 3}})
    assert msg == "rl: minibatch_size (3) must divide batch_size (10)"


def test_validate_on_root_and_with_path_argument():
    assert _err({"credit": {"method": "faca"}, "rl": {"group_size": 1}}) == (
        "credit.method 'faca' needs rl.group_size >= 2"
    )
    with pytest.raises(ConfigError, match=r"^train\.rl: minibatch_size"):
        configlib.from_dict(RL, {"batch_size": 10, "minibatch_size": 3}, path="train.rl")
    with pytest.raises(ConfigError, match=r"^train\.rl\.group_size: expected int"):
        configlib.from_dict(RL, {"group_size": "x"}, path="train.rl")


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        configlib.from_dict(Config, {"seed": "x"})


# ----------------------------------------------------------------------------- to_dict / YAML


def _custom() -> Config:
    return Config(
        name="exp-1",
        seed=7,
        debug=True,
        eval_every=20,
        optim=Optim(lr=1e-6, clip_norm=None, schedule="constant"),
        rl=RL(stop=("x", "y"), temperatures=(0.7, 1.0)),
        credit=Credit(method="infopo", horizon=4),
        eval=Eval(split="dev"),
        rewards={"success": 1.0},
    )


def test_to_dict_is_plain_and_round_trips():
    cfg = _custom()
    d = configlib.to_dict(cfg)
    assert d["rl"]["stop"] == ["x", "y"] and isinstance(d["rl"]["stop"], list)
    assert d["optim"] == {
        "lr": 1e-6,
        "b1": 0.9,
        "b2": 0.95,
        "clip_norm": None,
        "warmup_steps": 0,
        "schedule": "constant",
    }
    assert json.loads(json.dumps(d)) == d
    assert configlib.from_dict(Config, d) == cfg
    assert configlib.from_dict(Config, d) != Config()


def test_to_dict_rejects_non_dataclass():
    with pytest.raises(TypeError):
        configlib.to_dict({"a": 1})
    with pytest.raises(TypeError):
        configlib.to_dict(Config)


def test_dump_yaml_round_trip():
    cfg = _custom()
    text = configlib.dump_yaml(cfg)
    assert "lr: 1.0e-06" in text
    assert configlib.from_dict(Config, yaml.safe_load(text)) == cfg


def test_dump_yaml_quotes_strings_that_look_like_other_types():
    cfg = Config(name="true", rl=RL(stop=("null", "3e-7", "1", "a: b", "- x", "")))
    assert configlib.from_dict(Config, yaml.safe_load(configlib.dump_yaml(cfg))) == cfg


def test_dump_yaml_keeps_unicode_readable_and_survives_yaml_quirks():
    assert "name: héllo ✓" in configlib.dump_yaml(Config(name="héllo ✓"))
    cfg = Config(name="a\x85b", eval=Eval(split="\u2028 x\n"))  # PyYAML writes U+0085 raw and reads it back as a space
    assert configlib.from_dict(Config, yaml.safe_load(configlib.dump_yaml(cfg))) == cfg


# ----------------------------------------------------------------------------- overrides


def _ov(*overrides: str, data=None) -> Config:
    return configlib.from_dict(Config, configlib.apply_overrides(data or {}, overrides, schema=Config))


@pytest.mark.parametrize(
    "override, attr, expected",
    [
        ("seed=3", ("seed",), 3),
        ("optim.lr=3e-7", ("optim", "lr"), 3e-7),
        ("optim.lr=1e-6", ("optim", "lr"), 1e-6),
        ("optim.lr=1.5e-3", ("optim", "lr"), 1.5e-3),
        ("optim.lr=2", ("optim", "lr"), 2.0),
        ("optim.clip_norm=1e3", ("optim", "clip_norm"), 1000.0),
        ("optim.clip_norm=null", ("optim", "clip_norm"), None),
        ("debug=true", ("debug",), True),
        ("debug=false", ("debug",), False),
        ("rl.stop=[a, b]", ("rl", "stop"), ("a", "b")),
        ("rl.temperatures=[1e-1, 2]", ("rl", "temperatures"), (0.1, 2.0)),
        ("eval_every=null", ("eval_every",), None),
        ("eval_every=5", ("eval_every",), 5),
        ("credit.method=infopo+faca", ("credit", "method"), "infopo+faca"),
        ("credit.horizon=4", ("credit", "horizon"), 4),
        ("name=hello world", ("name",), "hello world"),
        ("name=2024", ("name",), "2024"),
        ("name=yes", ("name",), "yes"),
        ("rewards.success=1e-2", ("rewards",), {"success": 0.01}),
        ("eval.split=dev", ("eval",), Eval(split="dev")),
        ("optim={lr: 0.1, b1: 0.5}", ("optim",), Optim(lr=0.1, b1=0.5)),
        ("optim={lr: 3e-7}", ("optim", "lr"), 3e-7),
    ],
)
def test_override_values(override, attr, expected):
    obj = _ov(override)
    for a in attr:
        obj = getattr(obj, a)
    assert obj == expected and type(obj) is type(expected)


def test_override_section_mapping_merges_with_existing_values():
    cfg = _ov("optim={lr: 0.1}", data={"optim": {"b1": 0.5, "lr": 0.2}})
    assert cfg.optim == Optim(lr=0.1, b1=0.5)


def test_later_overrides_win_and_input_is_not_mutated():
    data = {"optim": {"lr": 0.2}, "rl": {"stop": ["z"]}}
    out = configlib.apply_overrides(data, ["optim.lr=0.3", "optim.lr=0.4", "rl.stop=[q]"], schema=Config)
    assert out == {"optim": {"lr": 0.4}, "rl": {"stop": ["q"]}}
    assert data == {"optim": {"lr": 0.2}, "rl": {"stop": ["z"]}}


def test_override_int_field_rejects_float_and_bad_string():
    with pytest.raises(ConfigError, match=r"^rl\.group_size: expected int, got 2\.5 \(float\)$"):
        _ov("rl.group_size=2.5")
    with pytest.raises(ConfigError, match=r"^seed: expected int, got 'abc' \(str\)$"):
        _ov("seed=abc")


@pytest.mark.parametrize(
    "override, parts",
    [
        ("optim.lrr=0.1", ["optim.lrr=0.1", "optim.lrr: unknown key", "allowed keys: b1, b2, clip_norm, lr,", "'lr'?"]),
        ("sed=1", ["sed: unknown key", "allowed keys: credit, debug,", "did you mean 'seed'?"]),
        ("eval.nope=1", ["eval.nope: unknown key", "allowed keys: every, split"]),
        ("seed.x=1", ["seed.x=1", "seed is a int, not a section"]),
        ("rl.stop.0=a", ["rl.stop is a tuple[str, ...], not a section"]),
        ("optim.lr", ["'optim.lr'", "expected key=value"]),
        ("=3", ["'=3'", "empty key"]),
        ("optim..lr=3", ["'optim..lr=3'", "empty key"]),
        ("rl.stop=[a, b", ["rl.stop=[a, b", "not valid YAML"]),
    ],
)
def test_bad_overrides(override, parts):
    with pytest.raises(ConfigError) as info:
        configlib.apply_overrides({}, [override], schema=Config)
    for part in parts:
        assert part in str(info.value), (part, str(info.value))


def test_overrides_without_schema_accept_any_key():
    assert configlib.apply_overrides({"a": {"b": 1}}, ["a.c=2", "x.y=[1]"]) == {"a": {"b": 1, "c": 2}, "x": {"y": [1]}}


def test_deep_merge():
    base = {"a": {"b": 1, "c": {"d": 2}}, "l": [1, 2], "s": {"x": 1}}
    out = configlib.deep_merge(base, {"a": {"c": {"e": 3}}, "l": [3], "s": 5})
    assert out == {"a": {"b": 1, "c": {"d": 2, "e": 3}}, "l": [3], "s": 5}
    assert base == {"a": {"b": 1, "c": {"d": 2}}, "l": [1, 2], "s": {"x": 1}}


# ----------------------------------------------------------------------------- load


def test_load_precedence_base_include_file_overrides(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "base.yaml").write_text("seed: 1\noptim:\n  lr: 1.0e-3\n  b1: 0.5\nrl:\n  group_size: 4\n")
    (tmp_path / "run.yaml").write_text("include: sub/base.yaml\noptim:\n  lr: 2.0e-3\nrl:\n  group_size: 16\n")
    cfg = configlib.load(
        Config, tmp_path / "run.yaml", ["rl.group_size=2"], base={"seed": 9, "name": "embedded", "optim": {"b2": 0.8}}
    )
    assert cfg.name == "embedded"  # only in base
    assert cfg.seed == 1  # include over base
    assert cfg.optim == Optim(lr=2e-3, b1=0.5, b2=0.8)  # file over include over base, merged per key
    assert cfg.rl.group_size == 2  # overrides last


def test_load_without_file_and_with_dataclass_base():
    assert configlib.load(Config) == Config()
    assert configlib.load(Config, None, ["seed=4"], base=_custom()) == dataclasses.replace(_custom(), seed=4)


def test_load_empty_file_gives_defaults(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    assert configlib.load(Config, str(tmp_path / "empty.yaml")) == Config()


def test_load_include_cycle(tmp_path):
    (tmp_path / "a.yaml").write_text("include: b.yaml\nseed: 1\n")
    (tmp_path / "b.yaml").write_text("include: a.yaml\nseed: 2\n")
    with pytest.raises(ConfigError, match="include cycle") as info:
        configlib.load(Config, tmp_path / "a.yaml")
    assert "a.yaml -> " in str(info.value) and "b.yaml -> " in str(info.value)
    (tmp_path / "self.yaml").write_text("include: self.yaml\n")
    with pytest.raises(ConfigError, match="include cycle"):
        configlib.load(Config, tmp_path / "self.yaml")


def test_load_file_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        configlib.load(Config, missing)
    assert str(missing) in str(info.value)

    bad = tmp_path / "bad.yaml"
    bad.write_text("optim: {lr: 1\n")
    with pytest.raises(ConfigError, match="invalid YAML") as info:
        configlib.load(Config, bad)
    assert str(bad) in str(info.value)

    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping, got list") as info:
        configlib.load(Config, lst)
    assert str(lst) in str(info.value)

    inc = tmp_path / "inc.yaml"
    inc.write_text("include: missing.yaml\n")
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        configlib.load(Config, inc)
    assert "missing.yaml" in str(info.value)


def test_load_reports_schema_errors_from_file(tmp_path):
    (tmp_path / "run.yaml").write_text("credit:\n  method: gpro\n")
    with pytest.raises(ConfigError, match=r"^credit\.method: 'gpro' is not one of"):
        configlib.load(Config, tmp_path / "run.yaml")


def test_dumped_config_loads_back(tmp_path):
    cfg = _custom()
    (tmp_path / "resolved.yaml").write_text(configlib.dump_yaml(cfg))
    assert configlib.load(Config, tmp_path / "resolved.yaml") == cfg


# ----------------------------------------------------------------------------- describe


def test_describe_lists_every_dotted_key_with_type_and_default():
    lines = {line.split()[0]: line for line in configlib.describe(Config).splitlines()}
    expected_keys = {f"optim.{f.name}" for f in dataclasses.fields(Optim)} | {"seed", "credit.method", "eval.split"}
    assert expected_keys <= set(lines)
    assert "optim" not in lines and "rl" not in lines  # sections are expanded, not listed
    assert "eval" in lines and "Eval | None" in lines["eval"] and lines["eval"].endswith("= None")
    assert "float" in lines["optim.lr"] and "= 0.0003" in lines["optim.lr"]
    assert "'grpo' | 'infopo' | 'faca' | 'infopo+faca'" in lines["credit.method"]
    assert "tuple[str, ...]" in lines["rl.stop"] and "('</answer>',)" in lines["rl.stop"]
    assert "int | None" in lines["eval_every"]
    assert "dict[str, float]" in lines["rewards"]
    assert lines["credit.gamma"].endswith("# turn-level discount")


@dataclasses.dataclass(frozen=True)
class Client:
    base_url: str
    prompt: str = "You are playing a human user who is talking to an AI assistant (the agent)."
    markers: tuple[str, ...] = tuple(f"###MARKER_{i}###" for i in range(8))
    retries: int = dataclasses.field(default=4, metadata={"help": "attempts after the first " * 12})


@dataclasses.dataclass(frozen=True)
class Clients:
    user: Client | None = None
    judge: Client | None = dataclasses.field(default=None, metadata={"help": "the judge"})
    other: Client = dataclasses.field(default_factory=lambda: Client("http://h", retries=1))
    long_section_for_narrow_terms: Credit = dataclasses.field(default_factory=Credit)


@pytest.mark.parametrize("width", [40, 60, 80, 100, 140])
def test_describe_fits_the_width_and_keeps_every_key(width):
    text = configlib.describe(Clients, width)
    assert all(len(line) <= width for line in text.splitlines())
    for key in ("user.base_url", "user.prompt", "other.retries", "long_section_for_narrow_terms.gamma"):
        assert key in text
    assert "(required)" in text and "attempts after the first" in text


def test_describe_elides_long_defaults_and_lists_a_repeated_section_once():
    lines = {line.split()[0]: line for line in configlib.describe(Clients, 200).splitlines()}
    prompt = Client.prompt
    assert lines["user.prompt"].endswith(f"= <{len(prompt)} chars: 'You are play...'>") and prompt not in str(lines)
    assert f"(long; see Client in {__name__.replace('.', '/')}.py)" in lines["user.markers"]
    assert configlib.describe(Clients, 200).count("chars: 'You are play") == 2   # user.*, other.* (other defaults)
    assert not any(k.startswith("judge.") for k in lines)                       # same class and defaults as user
    assert lines["judge"].endswith("= None  # the judge; keys and defaults as user.*")
    assert lines["other.retries"].split("=")[1].split()[0] == "1"               # its own defaults: expanded
    assert "= 1.0" in lines["long_section_for_narrow_terms.gamma"]
    # the long-but-fitting rows of the older test schema stay one line each
    one = {line.split()[0]: line for line in configlib.describe(Config, 200).splitlines()}
    assert one["credit.gamma"].endswith("# turn-level discount") and "= 0.0003" in one["optim.lr"]


def test_describe_default_width_is_the_terminals(monkeypatch):
    monkeypatch.setenv("COLUMNS", "50")
    assert configlib.help_width() == 50
    assert max(len(line) for line in configlib.describe(Clients).splitlines()) <= 50
    monkeypatch.setenv("COLUMNS", "10")
    assert configlib.help_width() == 40          # a floor: narrower terminals get 40 columns


# ----------------------------------------------------------------------------- properties

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_floats = st.floats(allow_nan=False)
_ints = st.integers(-(2**63), 2**63 - 1)


def _strategy(tp):
    """Random valid values for a field type (mirrors the supported types)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return _ints
    if tp is float:
        return _floats
    if tp is str:
        return _text
    if origin is Literal:
        return st.sampled_from(args)
    if origin is tuple:
        return st.lists(_strategy(args[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(_text, _strategy(args[1]), max_size=3)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return st.builds(tp, **{f.name: _strategy(hints[f.name]) for f in dataclasses.fields(tp)})
    if type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | _strategy(inner)
    raise TypeError(tp)


def _valid_configs():
    """Random configs that pass the construction checks: RL's batch size is a multiple of its
    minibatch size; the faca / group-size combination the root refuses is drawn and dropped."""
    rl_hints = typing.get_type_hints(RL)
    rl_rest = st.fixed_dictionaries({f.name: _strategy(rl_hints[f.name]) for f in dataclasses.fields(RL)
                                     if f.name not in ("batch_size", "minibatch_size")})
    rl = st.tuples(rl_rest, st.integers(1, 64), st.integers(-8, 8)).map(
        lambda t: RL(**t[0], minibatch_size=t[1], batch_size=t[1] * t[2])
    )
    hints = typing.get_type_hints(Config)
    fields = {name: _strategy(tp) for name, tp in hints.items() if name != "rl"}

    def build(kwargs):
        try:
            return Config(**kwargs)
        except ValueError:  # faca with rl.group_size < 2
            return None

    return st.fixed_dictionaries({"rl": rl, **fields}).map(build).filter(lambda cfg: cfg is not None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_valid_configs())
def test_property_round_trip_to_dict_and_yaml(cfg):
    d = configlib.to_dict(cfg)
    assert configlib.from_dict(Config, d) == cfg
    assert configlib.from_dict(Config, yaml.safe_load(configlib.dump_yaml(cfg))) == cfg


@settings(max_examples=100, deadline=None)
@given(st.floats(allow_nan=False), _ints)
def test_property_numeric_overrides_from_python_text(lr, seed):
    cfg = _ov(f"optim.lr={lr!r}", f"seed={seed}")
    assert cfg.optim.lr == lr and cfg.seed == seed
    assert math.copysign(1.0, cfg.optim.lr) == math.copysign(1.0, lr)

"""Every command README.md and docs/*.md tell a user to type still runs as written (issue 37).

- ``python -m jaxagent.launch ...``: each one, exactly as written, passes the launcher's ``--dry-run``
  (in-process, through `jaxagent.launch.main`, with ``HF_HUB_OFFLINE=1``: a Hub id is reported, not
  downloaded): every key exists, every value parses, the config file is there, every job,
  environment and credit term is registered, the keys agree with each other. (A dry run lets a
  checkpoint directory that is not here yet through: the docs' ``/ckpt/...`` stand for yours.)
- ``python scripts/NAME.py ...``, ``python -m jaxagent.<module> ...`` (other than the launcher) and
  ``scripts/NAME.sh``: the script or module exists, and every ``--flag`` the docs give it is one
  its ``--help`` lists (a shell script: every ``NAME=value`` prefix is a variable it reads); the
  dotted ``key=value`` overrides passed to the scripts that forward them to the run config are
  keys of that config.

Commands come from fenced code blocks (continuation lines joined, trailing ``# comments`` dropped)
and from inline code spans (which may wrap across a line). A command is split at ``&&``, ``;``,
``|`` and redirections; an env-var prefix (``HF_HUB_OFFLINE=1 python ...``) and a wrapper
(``/usr/bin/time -v``, ``taskset -c 1``) before ``python`` are dropped.

Not dry-run, because they are templates rather than commands (their keys, values and config file
are still checked by `test_templated_launch_command_names_real_keys`, their flags where they call a
script):
- ``...`` anywhere (an elided rest of the command), ``<name>`` placeholders, ``[--optional]``
  usage synopses and ``a|b`` alternatives;
- an upper-case placeholder word as a value or argument (``model.path=BASE``, ``--config C``,
  ``FILE``, ``CKPT``, ``HOST0:PORT``, ``sft.steps=S``);
- a shell variable (``seed=$s``).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Command:
    """One command found in a doc: where, the text as written (joined), and its argv from the
    program on (``python -m MOD`` becomes ``["-m", MOD, ...]``, ``python scripts/x.py`` becomes
    ``["scripts/x.py", ...]``, a shell script ``["scripts/x.sh", ...]``), with its env prefix."""

    doc: str
    line: int
    text: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def target(self) -> str:
        return self.argv[1] if self.argv[0] == "-m" else self.argv[0]

    @property
    def args(self) -> tuple[str, ...]:
        return self.argv[2:] if self.argv[0] == "-m" else self.argv[1:]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


# ---------------------------------------------------------------------------------------------------
# Extraction

_FENCE = re.compile(r"^([ \t]*)```[^\n]*\n(.*?)^\1```[ \t]*$", re.DOTALL | re.MULTILINE)
_SPAN = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)*?)`(?!`)")
_PROGRAM = re.compile(r"(?:(?<=\s)|^)(?:python3?|scripts/[\w.-]+\.sh)(?=\s|$)")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


def _strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment (a ``#`` at a word start, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _block_lines(body: str, first_line: int) -> list[tuple[int, str]]:
    """A fenced block's logical lines (continuations joined, comments dropped), each with the doc
    line it starts on."""
    out, buf, start = [], [], None
    for i, raw in enumerate(body.splitlines()):
        line = _strip_comment(raw) if not buf else _strip_comment(" " + raw.strip())
        if start is None:
            start = first_line + i
        cont = line.endswith("\\")
        buf.append(line[:-1].rstrip() if cont else line)
        if not cont:
            out.append((start, " ".join(s.strip() for s in buf).strip()))
            buf, start = [], None
    if buf:
        out.append((start, " ".join(s.strip() for s in buf).strip()))
    return out


def _split_shell(text: str) -> list[str]:
    """``text`` cut at ``&&``, ``||``, ``;``, a spaced ``|`` (``a|b`` is a docs' alternative, not a
    pipe) and a ``<``/``>`` redirection (each piece one command; the redirection's target goes with
    it). Quotes, ``[...]`` and ``<placeholder>`` are kept whole."""
    pieces, cur, quote, depth, i = [], [], None, 0, 0
    while i < len(text):
        ch = text[i]
        prev = text[i - 1] if i else " "
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == "<" and re.match(r"<[^\s<>][^<>]*>", text[i:]):  # a <placeholder>
            j = text.index(">", i) + 1
            cur.append(text[i:j])
            i = j
            continue
        elif depth == 0 and (ch in ";&" or (ch in "|<>" and prev.isspace())):
            pieces.append("".join(cur))
            cur = []
            if ch in "<>":  # drop the redirection and its target
                m = re.match(r"[<>&]+\s*\S*", text[i:])
                i += m.end()
                continue
            i += 1
            continue
        cur.append(ch)
        i += 1
    pieces.append("".join(cur))
    return [p.strip() for p in pieces if p.strip()]


def _parse(doc: str, line: int, text: str) -> list[Command]:
    """The python / shell-script commands in one logical line (or code span) of a doc."""
    out = []
    for piece in _split_shell(text):
        m = _PROGRAM.search(piece)
        if not m:
            continue
        prefix = piece[:m.start()].split()
        env = tuple(tuple(w.split("=", 1)) for w in prefix if _ENV.match(w))
        rest = piece[m.start():]
        try:
            words = shlex.split(rest)
        except ValueError:  # an unbalanced quote: prose, not a command
            continue
        if words[0].endswith(".sh"):
            argv = tuple(words)
        elif (len(words) >= 3 and words[1] == "-m" and re.fullmatch(r"jaxagent(?:\.\w+)*", words[2])) or (
                len(words) >= 2 and re.fullmatch(r"scripts/[\w.-]+\.py", words[1])):
            argv = tuple(words[1:])
        else:
            continue  # python -m pip, pytest, a bare python, ...
        out.append(Command(doc, line, " ".join(piece.split()), argv, env))
    return out


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def extract(path: Path) -> list[Command]:
    """Every python / shell-script command in one markdown file, in order of appearance."""
    text = path.read_text(encoding="utf-8")
    doc = str(path.relative_to(ROOT))
    found = []
    for m in _FENCE.finditer(text):
        first = _line_of(text, m.start(2))
        for line, logical in _block_lines(m.group(2), first):
            found += _parse(doc, line, logical)
    prose = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keep line numbers
    for para_m in re.finditer(r"(?:[^\n]+\n?)+", prose):  # a code span never crosses a blank line
        para = para_m.group(0)
        for m in _SPAN.finditer(para):
            found += _parse(doc, _line_of(prose, para_m.start() + m.start()), " ".join(m.group(1).split()))
    return sorted(found, key=lambda c: c.line)


@functools.cache
def all_commands() -> tuple[Command, ...]:
    return tuple(c for p in DOCS for c in extract(p))


# ---------------------------------------------------------------------------------------------------
# Placeholders

_PLACEHOLDER_WORD = re.compile(r"(?<![\w./-])[A-Z][A-Z0-9_]*(?::[A-Z][A-Z0-9_]*)?(?![\w./-])")


def placeholder(cmd: Command) -> str | None:
    """Why ``cmd`` is a template and not a command to run, or None."""
    t = cmd.text
    if "..." in t or "…" in t:
        return "'...' elides the rest"
    if re.search(r"<[^>]*>", t):
        return "a <placeholder>"
    if re.search(r"\[--", t) or any("|" in a for a in cmd.args):
        return "a usage synopsis ([--optional], a|b)"
    if "$" in t:
        return "a shell variable"
    for a in cmd.args:
        value = a.split("=", 1)[1] if "=" in a and not a.startswith("-") else a
        if _PLACEHOLDER_WORD.fullmatch(value) or re.fullmatch(r"[A-Z][A-Z0-9_]*:[A-Z]+", value):
            return f"an upper-case placeholder {value!r}"
    return None


def launch_commands() -> list[Command]:
    """The distinct launcher commands (the first place each is written), placeholders included."""
    seen, out = set(), []
    for c in all_commands():
        if c.argv[:2] == ("-m", "jaxagent.launch") and (c.args, c.env) not in seen:
            seen.add((c.args, c.env))
            out.append(c)
    return out


def _id(c: Command) -> str:
    return f"{c.doc}:{c.line}"


def script_commands() -> dict[str, list[Command]]:
    """Every command of a script (``scripts/*.py``, ``scripts/*.sh``) or of a ``jaxagent.<module>``
    other than the launcher, by target, placeholders included (their flags are checked too)."""
    out: dict[str, list[Command]] = {}
    for c in all_commands():
        if c.argv[:2] != ("-m", "jaxagent.launch"):
            out.setdefault(c.target, []).append(c)
    return out


def _flags(cmd: Command) -> list[str]:
    """The ``--flags`` a command passes (``[--opt`` of a synopsis included, ``--`` itself not)."""
    out = []
    for a in cmd.args:
        m = re.match(r"^\[?(--[A-Za-z][\w-]*)", a)
        if m:
            out.append(m.group(1))
    return out


_KEY_VALUE = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)=(.*)$")


def _overrides(cmd: Command) -> list[str]:
    """The dotted ``key=value`` run-config overrides a script command passes (positional, after
    ``--``, or as the value of ``--set`` / ``--sft``): every script that takes them forwards them
    to the run config (`jaxagent.jobs.config.RunConfig`)."""
    return [a for a in cmd.args if _KEY_VALUE.match(a) and not re.match(r"^\w+:", a)]


def _script_path(target: str) -> Path:
    if target.startswith("jaxagent"):
        base = ROOT.joinpath(*target.split("."))
        return base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__main__.py"
    return ROOT / target


@functools.cache
def help_text(target: str) -> tuple[int, str]:
    """``--help`` of a script or module, run once (a subprocess: the scripts parse sys.argv at
    import time); (exit status, output)."""
    argv = ["-m", target] if target.startswith("jaxagent") else [target]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    p = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    return p.returncode, p.stdout + p.stderr


def known_flags(target: str) -> set[str]:
    """The flags a script accepts: those its ``--help`` lists; for a script without argparse
    (its ``--help`` fails), the ``"--flag"`` literals of its source."""
    rc, text = help_text(target)
    if rc == 0 and "usage:" in text:
        return set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", text))
    src = _script_path(target).read_text(encoding="utf-8")
    return set(re.findall(r"[\"'](--[A-Za-z][\w-]*)[\"'=]", src))


def _check_override(arg: str) -> str | None:
    """Why a dotted ``key=value`` is not a run-config override, or None. A placeholder value
    (``S``, ``<warm start>/hf``, ``$s``) is not checked, only its key."""
    import yaml

    from jaxagent import configlib
    from jaxagent.jobs.config import RunConfig

    key, raw = arg.split("=", 1)
    try:  # the key's type, then the value against it (configlib's own steps for one override, without
        # RunConfig's checks across keys, which need the rest of the command)
        tp = configlib._target_type(RunConfig, key.split("."), arg)
        if not (re.search(r"[<>$]|\.\.\.", raw) or _PLACEHOLDER_WORD.fullmatch(raw)):
            configlib._convert(tp, configlib._coerce(tp, yaml.safe_load(raw), raw), key)
    except (configlib.ConfigError, yaml.YAMLError) as e:
        return f"{arg}: {e}"
    return None


# ---------------------------------------------------------------------------------------------------
# Tests


def test_extraction_finds_the_commands():
    """The docs hold dozens of commands; a broken extractor (a regex gone wrong) finds none."""
    launches = launch_commands()
    runnable = [c for c in launches if placeholder(c) is None]
    scripts = script_commands()
    assert len(launches) >= 40 and len(runnable) >= 30, (len(launches), len(runnable))
    assert len(scripts) >= 10, sorted(scripts)
    texts = {c.text for c in all_commands()}
    # one of each shape: a fenced line, a joined continuation, an inline span wrapped across lines,
    # an env prefix, a wrapper before python
    assert "python -m jaxagent.launch --config configs/infopo_7b.yaml --dry-run" in texts
    assert any(c.argv[-1] == "progress=false" and "name=airline_smoke" in c.args for c in all_commands())
    assert any(c.target == "scripts/bench_decode.py" and "--no-torch" in c.args for c in all_commands())
    assert any(dict(c.env).get("BENCH") == "2wiki" for c in all_commands())
    assert any(c.text.startswith("/usr/bin/time") and c.target == "jaxagent.launch" for c in all_commands())


@pytest.mark.parametrize(
    "argv, env, reason",
    [
        ("python -m jaxagent.launch --config configs/x.yaml steps=5 # a comment", "", None),
        ("HF_HUB_OFFLINE=1 python -m jaxagent.launch ... model.path=Qwen/Qwen3-8B@<commit>", "HF_HUB_OFFLINE=1",
         "'...' elides the rest"),
        ("python scripts/a.py --shape <shape> --batch 8", "", "a <placeholder>"),
        ("python scripts/a.py [--domain retail|airline]", "", "a usage synopsis ([--optional], a|b)"),
        ("python -m jaxagent.launch job=sft model.path=BASE tokenizer=BASE", "", "an upper-case placeholder 'BASE'"),
        ("python -m jaxagent.launch --config C mesh.coordinator_address=HOST0:PORT", "",
         "an upper-case placeholder 'C'"),
        ("for s in 0 1; do python3 scripts/p.py seed=$s; done", "", "a shell variable"),
        ("python -m jaxagent.launch job=eval env=tau2 agent=oracle", "", None),
    ],
)
def test_placeholder_rules(argv, env, reason):
    (cmd,) = _parse("x.md", 1, _strip_comment(argv))
    assert dict(cmd.env) == dict([env.split("=", 1)] if env else [])
    assert placeholder(cmd) == reason
    assert "#" not in " ".join(cmd.argv)


def test_fenced_block_joins_continuations_and_drops_comments():
    body = "# a comment\npython -m jaxagent.launch job=sft \\\n  sft.steps=3   # note\necho done | tee x\n"
    lines = _block_lines(body, 10)
    assert lines[1] == (11, "python -m jaxagent.launch job=sft sft.steps=3")
    assert _split_shell("python -m jaxagent.envs.tau2.replay --domain telecom < lines.jsonl") == [
        "python -m jaxagent.envs.tau2.replay --domain telecom"]
    assert _split_shell("pip install . && python -m jaxagent.launch") == ["pip install .", "python -m jaxagent.launch"]


@pytest.fixture
def dry_env(monkeypatch):
    """The launcher as a new user runs it: from the repository root (the docs' paths are relative to
    it), no network for the Hub (a Hub id is reported, not downloaded)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return monkeypatch


#: Paths a doc's block creates on the lines before its command (``cp -r SRC DST``): the test makes
#: the same copy under its tmp_path and points the command there.
PREPARED_PATHS = {"/tmp/telecom_short": "jaxagent/data/tau2_telecom"}  # docs/TAU2.md, the telecom smoke run

#: Commands that are right but that the code refuses, each with its bug (strict: when the code is
#: fixed the test says so, and the entry goes).
KNOWN_CODE_BUGS: dict[str, str] = {}  # command text -> why it fails (an xfail, strict: fixed means remove it)


def _launch_params():
    for c in launch_commands():
        if placeholder(c) is not None:
            continue
        bug = next((why for k, why in KNOWN_CODE_BUGS.items() if k in c.text), None)
        yield pytest.param(c, id=_id(c), marks=[pytest.mark.xfail(reason=bug, strict=True)] if bug else [])


@pytest.mark.parametrize("cmd", list(_launch_params()))
def test_launch_command_passes_dry_run(cmd, dry_env, capsys, tmp_path):
    """``python -m jaxagent.launch ARGS`` as the doc writes it passes ``--dry-run``. (``resume=true``
    is planned like any run: the dry run does not look for the run to resume.)"""
    import json
    import shutil

    from jaxagent.launch import main

    for k, v in cmd.env:
        dry_env.setenv(k, v)
    args = list(cmd.args)
    for made, src in PREPARED_PATHS.items():
        if any(made in a for a in args):
            shutil.copytree(ROOT / src, tmp_path / "prepared")
            args = [a.replace(made, str(tmp_path / "prepared")) for a in args]
    if "--help" in args:
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code in (0, None), f"{cmd}\n--help exited {e.value.code}"
        assert "keys (key=value overrides" in capsys.readouterr().out
        return
    try:
        rc = main([*args, "--dry-run"] if "--dry-run" not in args else args)
    except SystemExit as e:
        pytest.fail(f"{cmd}\n--dry-run refused it: {e.code}")
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["config"] == "valid", plan


@pytest.mark.parametrize("cmd", [c for c in launch_commands() if placeholder(c) is not None], ids=_id)
def test_templated_launch_command_names_real_keys(cmd):
    """A launcher command with placeholders cannot be dry-run, but its keys must exist (and its values
    parse where they are not placeholders), and its ``--config`` file (``<name>`` as a wildcard) too."""
    from jaxagent.launch import expand_alias

    problems = []
    args = list(cmd.args)
    for i, a in enumerate(args):
        if a == "--config" and i + 1 < len(args):
            pattern = re.sub(r"<[^>]*>", "*", args[i + 1])
            if not _PLACEHOLDER_WORD.fullmatch(pattern) and not list(ROOT.glob(pattern)):
                problems.append(f"--config {args[i + 1]}: no such file")
        elif _KEY_VALUE.match(a) and (i == 0 or args[i - 1] != "--config"):
            why = _check_override(expand_alias(a))
            if why:
                problems.append(why)
    assert not problems, f"{cmd}\n" + "\n".join(problems)


def test_the_checks_catch_a_wrong_key_flag_and_value(dry_env, capsys):
    """The checkers can fail: an unknown key, a badly typed value, a flag a script lacks."""
    from jaxagent.launch import main

    assert "no_such_key" in (_check_override("rl.no_such_key=1") or "")
    assert _check_override("rl.group_size=many") is not None
    assert _check_override("rl.group_size=S") is None  # a placeholder value: only the key is checked
    with pytest.raises(SystemExit, match="config error"):
        main(["rl.minibatch_size=7", "--dry-run"])
    flags = known_flags("scripts/bench_serve.py")
    assert "--clients" in flags and "--no-such-flag" not in flags
    (cmd,) = _parse("x.md", 1, "python3 scripts/probe_sft.py --note in-order sft.steps=5")
    assert _flags(cmd) == ["--note"] and _overrides(cmd) == ["sft.steps=5"]
    assert "--note" in known_flags("scripts/probe_sft.py")  # no argparse: its source's flag literals


@pytest.mark.parametrize("target", sorted(script_commands()), ids=str)
def test_script_command_exists_and_takes_its_flags(target):
    """A script (or ``python -m jaxagent.<module>``) the docs run exists, and every flag they pass
    it is one it accepts; every ``key=value`` they pass is a run-config key."""
    cmds = script_commands()[target]
    path = _script_path(target)
    assert path.is_file(), f"{cmds[0]}: {path.relative_to(ROOT)} does not exist"
    problems = []
    if target.endswith(".sh"):
        assert os.access(path, os.X_OK), f"{cmds[0]}: {target} is not executable (the docs run it directly)"
        src = path.read_text(encoding="utf-8")
        for c in cmds:
            for name, _ in c.env:
                if not re.search(rf"\${{?{name}\b", src):
                    problems.append(f"{c}: the script reads no variable {name}")
    else:
        flags = known_flags(target)
        for c in cmds:
            for f in _flags(c):
                if f not in flags and f != "--help":
                    problems.append(f"{c}: {f} is not a flag of {target} (it takes {sorted(flags)})")
            for o in _overrides(c):
                why = _check_override(o)
                if why:
                    problems.append(f"{c}: {why}")
    assert not problems, "\n".join(problems)


if __name__ == "__main__":  # a listing, for a look by eye
    for c in all_commands():
        print(f"{c}\n    argv={list(c.argv)} env={dict(c.env)} skip={placeholder(c)}")

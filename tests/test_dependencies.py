"""Every third-party module that ``jaxagent/`` imports is provided by a distribution that
``pyproject.toml`` declares in ``[project].dependencies``: installed only as some other package's
dependency is not enough (that other package may drop it), nor is being in the test extra (the
base install has no extras).

Imports are collected with ``ast`` from every file, at any depth (lazy imports inside functions
count: they run when the feature does). An import inside ``try: ... except ImportError`` is
guarded (the code works without it) and may instead come from an optional extra. Relative imports,
the standard library and ``jaxagent`` itself are skipped.
"""

from __future__ import annotations

import ast
import importlib.metadata
import keyword
import logging
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "jaxagent"

_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError"})


def normalize(name: str) -> str:
    """A distribution name per PEP 503: lower case, runs of ``-``, ``_`` and ``.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The normalised distribution name of a PEP 508 requirement string
    (``"PyYAML[x]>=6; python_version<'4'"`` -> ``"pyyaml"``)."""
    m = re.match(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)", requirement)
    if m is None:
        raise ValueError(f"requirement {requirement!r}: no distribution name at its start")
    return normalize(m.group(1))


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    t = handler.type
    if t is None:  # a bare except
        return True
    names = t.elts if isinstance(t, ast.Tuple) else [t]
    return any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names)


def imported_modules(source: str) -> dict[str, bool]:
    """Top-level names of the absolute imports in ``source`` (at any depth), each mapped to whether
    every import of it is guarded by a ``try`` whose handlers catch ImportError."""
    tree = ast.parse(source)
    guarded_nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                guarded_nodes.update(id(n) for n in ast.walk(stmt))
    found: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            found[top] = found.get(top, True) and id(node) in guarded_nodes
    return found


def third_party_imports(files: Iterable[Path], root: Path) -> dict[str, dict[str, bool]]:
    """``{module: {relative file: guarded}}`` for every import that is not the stdlib or ``jaxagent``."""
    out: dict[str, dict[str, bool]] = {}
    for f in sorted(files):
        for mod, guarded in imported_modules(f.read_text(encoding="utf-8")).items():
            if mod in sys.stdlib_module_names or mod == PACKAGE:
                continue
            out.setdefault(mod, {})[f.relative_to(root).as_posix()] = guarded
    return out


def undeclared(imports: Mapping[str, Mapping[str, bool]], providers: Mapping[str, Iterable[str]],
               required: Iterable[str], optional: Iterable[str] = ()) -> list[str]:
    """One line per import no declared distribution provides: an unguarded import needs one in
    ``required``; a guarded one, one in ``required`` or ``optional``. ``providers`` maps a module
    to the distributions that install it (``importlib.metadata.packages_distributions()``)."""
    required = {normalize(d) for d in required}
    optional = {normalize(d) for d in optional}
    problems = []
    for mod in sorted(imports):
        dists = {normalize(d) for d in providers.get(mod, ())}
        for file, guarded in sorted(imports[mod].items()):
            allowed = required | optional if guarded else required
            if dists & allowed:
                continue
            if not dists:
                why = "no installed distribution provides it"
            else:
                why = f"provided by {', '.join(sorted(dists))}, not declared in [project].dependencies"
                if dists & optional:
                    why += " (only in an optional extra; guard the import with try/except ImportError)"
            problems.append(f"{file}: imports {mod!r}: {why}")
    return problems


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_every_third_party_import_is_a_declared_dependency():
    project = _pyproject()["project"]
    required = [requirement_name(r) for r in project["dependencies"]]
    optional = [requirement_name(r) for reqs in project.get("optional-dependencies", {}).values() for r in reqs]
    imports = third_party_imports((ROOT / PACKAGE).rglob("*.py"), ROOT)
    assert "jax" in imports and "transformers" in imports, "the scan found none of the known imports"
    problems = undeclared(imports, importlib.metadata.packages_distributions(), required, optional)
    assert not problems, "imports without a declared distribution:\n" + "\n".join(problems)


def test_declared_dependencies_are_installed():
    """The declared names are real distributions here (a typo would make the check above vacuous)."""
    for r in _pyproject()["project"]["dependencies"]:
        name = requirement_name(r)
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"[project].dependencies: {r!r}: distribution {name!r} is not installed")


# --- the base install has no torch: no transformers advice about it -----------------------------

_NO_TORCH = "import sys; sys.modules['torch'] = None\n"  # find_spec('torch') is None: transformers sees no torch
_ADVICE = ("PyTorch was not found", "None of PyTorch")


def _run_without_torch(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", _NO_TORCH + code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_launch_without_torch_prints_no_pytorch_advice(tmp_path):
    # The control: with torch hidden, a plain import of transformers does print the advice.
    plain = _run_without_torch("import transformers", tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert any(a in plain.stderr for a in _ADVICE), f"the torch shim did not take: {plain.stderr!r}"
    run = _run_without_torch("import runpy\nsys.argv = ['jaxagent.launch', '--dry-run']\n"
                             "runpy.run_module('jaxagent.launch', run_name='__main__')", tmp_path)
    assert run.returncode == 0, run.stderr
    assert '"config": "valid"' in run.stdout
    assert not any(a in run.stderr for a in _ADVICE), run.stderr


def test_the_advice_filter_passes_other_transformers_records():
    from jaxagent.text.tokenizer import _NoTorchAdvice

    def record(msg):
        return logging.LogRecord("transformers", logging.WARNING, __file__, 1, msg, None, None)

    f = _NoTorchAdvice()
    assert not f.filter(record("PyTorch was not found. Models won't be available and only tokenizers, ..."))
    assert not f.filter(record("None of PyTorch, TensorFlow >= 2.0, or Flax have been found. Models won't ..."))
    assert f.filter(record("Token indices sequence length is longer than the specified maximum sequence length"))
    assert f.filter(record("Disabling PyTorch because PyTorch >= 2.6 is required but found 2.1"))


# --- the helpers themselves -------------------------------------------------------------------

_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1, max_size=6)
_sep = st.text(alphabet="-_.", min_size=1, max_size=3)


@given(st.lists(_word, min_size=1, max_size=4), st.data())
def test_normalize_ignores_case_and_separator_spelling(words, data):
    """Any spelling of a name (case, each separator run) normalises to one PEP 503 form."""
    spelled = words[0] + "".join(data.draw(_sep) + w for w in words[1:])
    canonical = "-".join(w.lower() for w in words)
    assert normalize(spelled) == canonical
    assert normalize(spelled.upper()) == canonical
    assert normalize(canonical) == canonical
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", canonical)
    assert requirement_name(f"{spelled}[extra]>=1.0; python_version >= '3'") == canonical


@given(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), st.booleans(), st.booleans())
def test_an_undeclared_module_is_always_reported(mod, lazy, installed):
    """A fake import of a module no declared distribution provides is reported, naming the module
    and the file, whether it is installed (as some other package's dependency) or not, lazy or not."""
    if mod in sys.stdlib_module_names or mod == PACKAGE or keyword.iskeyword(mod):  # 'as' is no module name
        return
    src = f"def f():\n    import {mod}\n" if lazy else f"from {mod}.sub import thing\n"
    imports = {m: {"jaxagent/fake.py": g} for m, g in imported_modules(src).items()}
    providers = {mod: [f"{mod}-dist"]} if installed else {}
    problems = undeclared(imports, providers, required=["jax", "numpy"])
    assert len(problems) == 1 and problems[0].startswith(f"jaxagent/fake.py: imports {mod!r}: ")
    # Declaring the providing distribution (in any spelling) clears it.
    if installed:
        assert undeclared(imports, providers, required=[f"{mod.upper()}.DIST"]) == []


@pytest.mark.parametrize("raw, expected", [
    ("PyYAML", "pyyaml"), ("orbax_checkpoint", "orbax-checkpoint"), ("Foo.Bar--baz__Qux", "foo-bar-baz-qux"),
    ("ml_dtypes", "ml-dtypes"), ("tensorboardX", "tensorboardx"), ("a", "a"),
])
def test_normalize(raw, expected):
    assert normalize(raw) == expected
    assert normalize(normalize(raw)) == normalize(raw)


@pytest.mark.parametrize("req, expected", [
    ("jax>=0.6", "jax"), ("orbax-checkpoint>=0.11", "orbax-checkpoint"), ("PyYAML >= 6", "pyyaml"),
    ("sentencepiece[protobuf]>=0.2", "sentencepiece"), ("torch>=2.4,<2.14; python_version >= '3.11'", "torch"),
    ("ml_dtypes", "ml-dtypes"), ("pkg @ https://example.com/pkg.whl", "pkg"),
])
def test_requirement_name(req, expected):
    assert requirement_name(req) == expected


def test_imported_modules_sees_lazy_and_guarded_imports():
    src = (
        "import os, numpy.linalg as la\n"
        "from jax import numpy as jnp\n"
        "from . import sibling\n"
        "from .x import y\n"
        "def f():\n"
        "    import yaml\n"
        "    from tqdm.auto import tqdm\n"
        "try:\n"
        "    import torch\n"
        "except (ImportError, RuntimeError):\n"
        "    torch = None\n"
        "try:\n"
        "    import httpx\n"
        "except ValueError:\n"
        "    pass\n"
    )
    assert imported_modules(src) == {"os": False, "numpy": False, "jax": False, "yaml": False, "tqdm": False,
                                     "torch": True, "httpx": False}


def test_a_module_imported_both_guarded_and_unguarded_counts_as_unguarded():
    src = "try:\n    import torch\nexcept ImportError:\n    pass\ndef f():\n    import torch\n"
    assert imported_modules(src) == {"torch": False}


def test_undeclared_reports_missing_transitive_and_extra_only_modules(tmp_path):
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "a.py").write_text("import os\nimport jax\nfrom jaxagent import b\n\ndef f():\n    import jinja2\n")
    (pkg / "b.py").write_text("import markupsafe\nimport torch\ntry:\n    import torch\nexcept ImportError:\n"
                              "    pass\n")
    (pkg / "c.py").write_text("try:\n    import torch\nexcept ImportError:\n    torch = None\n"
                              "import not_a_real_module_xyz\n")
    imports = third_party_imports(pkg.rglob("*.py"), tmp_path)
    assert set(imports) == {"jax", "jinja2", "markupsafe", "torch", "not_a_real_module_xyz"}
    providers = {"jax": ["jax"], "jinja2": ["Jinja2"], "markupsafe": ["MarkupSafe"], "torch": ["torch"]}
    problems = undeclared(imports, providers, required=["jax", "jinja2"], optional=["torch"])
    assert problems == [
        f"{PACKAGE}/b.py: imports 'markupsafe': provided by markupsafe, not declared in [project].dependencies",
        f"{PACKAGE}/c.py: imports 'not_a_real_module_xyz': no installed distribution provides it",
        (f"{PACKAGE}/b.py: imports 'torch': provided by torch, not declared in [project].dependencies "
         "(only in an optional extra; guard the import with try/except ImportError)"),
    ]
    # jinja2 declared under another spelling is still declared; dropping it is reported.
    assert undeclared({"jinja2": {"x.py": False}}, providers, required=["JINJA2"]) == []
    assert undeclared({"jinja2": {"x.py": False}}, providers, required=["jax"]) == [
        "x.py: imports 'jinja2': provided by jinja2, not declared in [project].dependencies"]
    # A namespace shared by several distributions: one declared provider is enough.
    assert undeclared({"google": {"x.py": False}}, {"google": ["protobuf", "googleapis-common-protos"]},
                      required=["protobuf"]) == []

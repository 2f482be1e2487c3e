"""The layer contracts of pyproject.toml ([tool.importlinter]) hold, and the checker fails on a
violation (a throwaway package that breaks the same kind of contract)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(config)!r}, no_cache=True, no_logo=True))")
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_project_contracts_are_kept():
    out = _lint(ROOT / "pyproject.toml", ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout and "KEPT" in out.stdout


def test_a_violation_is_reported(tmp_path):
    pkg = tmp_path / "layered"
    for sub in ("core", "host"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "host" / "io.py").write_text("X = 1\n")
    (pkg / "core" / "math.py").write_text("from layered.host.io import X\n")  # the pure core reaching up
    cfg = tmp_path / "contracts.toml"
    cfg.write_text(textwrap.dedent("""
        [tool.importlinter]
        root_package = "layered"

        [[tool.importlinter.contracts]]
        name = "core imports no host code"
        type = "forbidden"
        source_modules = ["layered.core"]
        forbidden_modules = ["layered.host"]
    """))
    out = _lint(cfg, tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "BROKEN" in out.stdout and "layered.core.math -> layered.host.io" in out.stdout


def test_tests_never_import_scripts():
    # scripts/ are command lines; what tests check lives in the package (or in tests/ helpers)
    import ast

    offenders = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "scripts"]
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.path.insert", "sys.path.append") \
                    and "scripts" in ast.unparse(node):
                offenders.append(f"{path.name}:{node.lineno} puts scripts/ on sys.path")
    assert not offenders, offenders

"""README.md stays a two-screen page whose figures can be trusted (issue 37).

- at most 200 lines;
- every figure in the status table (`| area | works | measured figure | doc |`) occurs verbatim in
  the doc its row cites, so a figure changes in one place, the doc, and the README follows it;
- every relative link points to an existing file;
- the test command is one `.ci/run` runs, and the main command installs and launches.

Plain text checks, no JAX: this file runs in well under a second.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"
MAX_LINES = 200


# A number: optional sign, digits with thousands commas, decimals, an exponent, a unit glued to it
# (4.25x, 31%, 8k, 56.6M, 7B) or after a space (3.6 MB, 134 s). Not preceded by a letter, digit or
# dot, nor followed by a letter, so "qwen2", "Qwen2.5" or "2Wiki" inside a name is no figure.
_NUM = r"[+\-−]?\d[\d,]*(?:\.\d+)?(?:e[+\-]?\d+)?(?:[x%kMB](?![A-Za-z])|(?![A-Za-z]))(?: (?:MB|GB|GiB|ms|s)\b)?"
_FIGURE = re.compile(
    r"(?<![\w.])(?:"
    # a value with its interval: +0.022 [+0.001, +0.048]
    rf"{_NUM} \[{_NUM}, {_NUM}\]"
    # a bare interval
    rf"|\[{_NUM}, {_NUM}\]"
    # a chain of values: 0.00 -> 0.97, 0.93 -> 0.94
    rf"|{_NUM}(?: -> {_NUM})+"
    # durations: 9 min 19 s, 37:20
    r"|\d+ min \d+ s|\d+:\d\d"
    # ranges: 1.1-3.0x
    rf"|\d+(?:\.\d+)?-\d+(?:\.\d+)?(?:x|%)?"
    # anything else numeric, with its unit (4.25x, 31%, 3.6 MB)
    rf"|{_NUM}"
    r")"
)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_DOC = re.compile(r"\(((?:docs/|configs/)[^)#\s]+\.md)(?:#[^)]*)?\)")


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def figures(cell: str) -> list[str]:
    """The figures of a "measured figure" cell, each as it must occur in the cited doc.

    Code spans (`examples/pizza_desk.py`, `generate`) are names, not figures; trailing sentence
    punctuation is dropped."""
    cell = re.sub(r"`[^`]*`", " ", cell)
    out = []
    for m in _FIGURE.finditer(cell):
        f = m.group(0).rstrip(".,;:")
        if f:
            out.append(f)
    return out


def status_rows(text: str) -> list[dict[str, str]]:
    """The rows of the table whose header is `| area | works | measured figure | doc |`."""
    lines = text.splitlines()
    header = [i for i, ln in enumerate(lines)
              if [c.strip() for c in ln.strip().strip("|").split("|")] == ["area", "works", "measured figure", "doc"]]
    assert len(header) == 1, f"README.md needs exactly one status table header, found {len(header)}"
    rows = []
    for ln in lines[header[0] + 2:]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a status row needs 4 cells, got {len(cells)}: {ln}"
        rows.append(dict(zip(["area", "works", "figure", "doc"], cells)))
    return rows


def cited_doc(row: dict[str, str]) -> Path:
    m = _DOC.search(row["doc"])
    assert m, f"row {row['area']!r}: the doc cell names no docs/*.md link: {row['doc']!r}"
    return ROOT / m.group(1)


def missing_figures(text: str) -> list[str]:
    """Every (row, figure) of the status table that its cited doc does not contain verbatim."""
    missing = []
    for row in status_rows(text):
        doc = cited_doc(row)
        body = doc.read_text(encoding="utf-8") if doc.is_file() else ""
        for f in figures(row["figure"]):
            if f not in body:
                missing.append(f"{row['area']}: {f!r} not in {doc.relative_to(ROOT)}")
    return missing


def broken_links(text: str) -> list[str]:
    out = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in this page
        path = target.split("#", 1)[0]
        if not (ROOT / path).exists():
            out.append(target)
    return out


def code_blocks(section: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def two_commands(text: str) -> list[str]:
    m = re.search(r"^## Two commands\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert m, "README.md has no '## Two commands' section"
    return code_blocks(m.group(1))


# ---------------------------------------------------------------------------------------------------


def test_readme_fits_two_screens():
    n = len(_readme().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; at most {MAX_LINES} (move detail into docs/)"


def test_status_table_has_a_row_per_area_each_citing_an_existing_doc():
    rows = status_rows(_readme())
    assert len(rows) >= 10, f"the status table has {len(rows)} rows"
    for row in rows:
        assert cited_doc(row).is_file(), f"row {row['area']!r} cites a missing doc: {row['doc']}"
    with_figures = [r for r in rows if figures(r["figure"])]
    assert len(with_figures) == len(rows), [r["area"] for r in rows if r not in with_figures]


def test_status_figures_are_verbatim_in_the_cited_doc():
    missing = missing_figures(_readme())
    assert not missing, "status figures not found verbatim in their docs:\n" + "\n".join(missing)


def test_relative_links_point_to_existing_files():
    broken = broken_links(_readme())
    assert not broken, f"README.md links to missing files: {broken}"


def test_two_commands_are_the_main_job_and_the_ci_test_command():
    commands = two_commands(_readme())
    assert len(commands) == 2, commands
    main, tests = commands
    assert main.startswith("python3 -m pip install -e . && ") and main.endswith("-m jaxagent.launch"), main
    assert tests.startswith("python3 -m pip install -e '.[test]' && ") and "-m pytest" in tests, tests
    ci = CI.read_text(encoding="utf-8")
    # a line .ci/run executes, not a comment that mentions it
    assert any(ln.strip().startswith(tests) for ln in ci.splitlines()), f".ci/run does not run {tests!r}"


# The checkers above must be able to fail: each one against a deliberately broken README text.


def test_the_checks_catch_a_changed_figure_a_dead_link_and_a_long_page():
    text = _readme()
    row = next(r for r in status_rows(text) if figures(r["figure"]))
    f = figures(row["figure"])[0]
    bad = f + "9" if f[-1].isdigit() else f.replace("0", "7", 1) + "17"
    changed = text.replace(row["figure"], row["figure"].replace(f, bad, 1), 1)
    assert missing_figures(changed), f"changing {f!r} to {bad!r} went unnoticed"
    assert "docs/NO_SUCH_FILE.md" in broken_links(text + "\n[gone](docs/NO_SUCH_FILE.md)\n")
    assert len((text + "\n" * MAX_LINES).splitlines()) > MAX_LINES


@pytest.mark.parametrize("cell, expected", [
    ("9 min 19 s wall; greedy 0.00 -> 0.97 (SFT) -> 0.98 (RL)", ["9 min 19 s", "0.00 -> 0.97", "0.98"]),
    ("+0.022 [+0.001, +0.048] over the control, 3 seeds", ["+0.022 [+0.001, +0.048]", "3"]),
    ("tiny-qwen2 at 1.50 times; 4.25x, 31% of turns, 1.1-3.0x", ["1.50", "4.25x", "31%", "1.1-3.0x"]),
    ("3.6 MB against 170.0 MB on a 56.6M-parameter model, 134 s in all, 3 seeds, 2Wiki",
     ["3.6 MB", "170.0 MB", "56.6M", "134 s", "3"]),
    ("1,651 tests in 37:20; `examples/pizza_desk.py` 9.5e-7", ["1,651", "37:20", "9.5e-7"]),
])
def test_figure_extraction(cell, expected):
    assert figures(cell) == expected

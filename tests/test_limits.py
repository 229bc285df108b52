"""The project's size rules, checked so they cannot rot ("a module stays under 400 lines and
a function under 80": a stage is one module you can read top to bottom; the README is the
front door, not the lab notebook): a module under src/rlany/, benchmarks/ or research/ has
at most 400 lines and a function or method at most 80 (its `def` line to its last line,
decorators not counted); README.md has at most 250 lines of at most 200 characters each (a
line a reader can take in: a results line of thousands of characters passed a line count),
and its "## Results at a glance" section at most 30 (one generated table, a row per result:
tests/test_readme_results.py; the readings live in benchmarks/ and research/).

Pure file reads and `ast`: nothing here imports the code it measures. Each failure names
every offender with its line count; split by responsibility, not into layers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("src/rlany", "benchmarks", "research")
MODULE_LINES, FUNCTION_LINES = 400, 80
README_LINES, README_WIDTH, RESULTS_LINES = 250, 200, 30
RESULTS_HEADING = "## Results at a glance"


def modules() -> list[Path]:
    """Every .py file under SOURCES, sorted."""
    return sorted(f for d in SOURCES if (ROOT / d).is_dir() for f in (ROOT / d).rglob("*.py"))


def where(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_sources_found():
    """The limits below are not vacuous: the folders they scan hold the code."""
    names = {where(f) for f in modules()}
    assert "src/rlany/training/trainer.py" in names
    assert any(n.startswith("benchmarks/") for n in names)
    assert "research/learning.py" in names


def test_module_lines():
    too_long = [f"{where(f)}: {n} lines" for f in modules()
                if (n := len(f.read_text().splitlines())) > MODULE_LINES]
    assert not too_long, (f"modules over {MODULE_LINES} lines (split by responsibility):\n"
                          + "\n".join(too_long))


def test_function_lines():
    too_long = []
    for f in modules():
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES:
                    too_long.append(f"{where(f)}:{node.lineno}: {node.name} {n} lines")
    assert not too_long, (f"functions over {FUNCTION_LINES} lines (extract coherent steps):\n"
                          + "\n".join(too_long))


def results_section(text: str) -> list[str]:
    """The lines of README's results section: after its heading, before the next `## `."""
    lines = text.splitlines()
    assert RESULTS_HEADING in lines, f"README.md has no {RESULTS_HEADING!r} section"
    start = lines.index(RESULTS_HEADING) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def test_results_section_measured():
    """The section's bounds: its heading and the next one are not counted."""
    text = f"# t\n\n{RESULTS_HEADING}\n\none\ntwo\n### sub\n\n## Next\nafter\n"
    assert results_section(text) == ["", "one", "two", "### sub", ""]
    assert results_section(f"{RESULTS_HEADING}\nlast\n") == ["last"]


def test_readme_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_LINES, (f"README.md: {n} lines, over {README_LINES}: the README is the "
                               "front door; results and history belong in benchmarks/, "
                               "research/ and docs/")


def too_wide(text: str, width: int = README_WIDTH) -> list[str]:
    """`README.md:LINE: N characters` for each line over `width`."""
    return [f"README.md:{i}: {len(line)} characters" for i, line in
            enumerate(text.splitlines(), 1) if len(line) > width]


def test_readme_width():
    wide = too_wide((ROOT / "README.md").read_text())
    assert not wide, (f"README.md lines over {README_WIDTH} characters (wrap prose; a table "
                      "row that long holds too much):\n" + "\n".join(wide))


def test_a_planted_wide_line_is_caught():
    text = (ROOT / "README.md").read_text()
    planted = text.replace(f"{RESULTS_HEADING}\n", f"{RESULTS_HEADING}\n- {'0.1 ' * 1230}\n")
    assert [w.split(": ")[1] for w in too_wide(planted)] == ["4922 characters"]


def test_readme_results_lines():
    n = len(results_section((ROOT / "README.md").read_text()))
    assert n <= RESULTS_LINES, (f"README.md {RESULTS_HEADING!r}: {n} lines, over "
                                f"{RESULTS_LINES}: link to benchmarks/ or research/ for the "
                                "numbers")

"""README's figures come from their files: its results table and its test-suite line are
what docs/results_table.py makes from the committed results (a number edited by hand, or a
results file rewritten without `make docs`, fails here), each row names a file that
exists, and no measured figure stands in the README's prose (or in its code comments)
outside those generated blocks, where nothing would hold it to a file.

Pure reads of README.md and the results JSONs: no model runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# a measured figure: a decimal, or a number with a unit of time, size, speed or ratio
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:\s?(?:x|min|minutes|s|seconds|MiB|GiB|MB|GB|"
                    r"k|tokens/s)\b|%)|(?<![\w.])\d+\.\d+\b")
NOT_FIGURES = {"2602.02488": "the paper's arXiv id", "95%": "an interval's level"}


def _results_table():
    return load_script("docs/results_table.py")


def block(text: str, name: str) -> str:
    return text.split(f"<!-- {name}:begin -->\n", 1)[1].split(f"<!-- {name}:end -->", 1)[0]


def prose_figures(text: str) -> list[str]:
    """The measured figures of a README outside its generated blocks: in prose (inline code
    and link targets aside) and in the comments of its code blocks."""
    text = re.sub(r"<!-- ([\w.-]+):begin -->.*?<!-- \1:end -->", "", text, flags=re.S)
    comments = [line.split("#", 1)[1] for code in re.findall(r"```.*?```", text, flags=re.S)
                for line in code.splitlines() if "#" in line]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", prose))
    return [f for part in [prose, *comments] for f in FIGURE.findall(part)
            if f not in NOT_FIGURES]


def test_the_results_blocks_are_their_files():
    rt = _results_table()
    doc = README.read_text()
    assert rt.render(doc) == doc, ("README.md's results table or test-suite line is stale or "
                                   "edited by hand: python docs/results_table.py")


def test_each_row_names_a_file_that_holds_it():
    rt = _results_table()
    rows = [line for line in block(README.read_text(), "results-table").splitlines()
            if line.startswith("| ") and not line.startswith("| setting")]
    assert len(rows) == len(rt.ROWS) >= 10
    for line, (_, file, _, _) in zip(rows, rt.ROWS):
        assert line.endswith(f"| [{Path(file).name}]({file}) |"), line
        assert (ROOT / file).is_file(), file


def test_the_cpu_rows_ran_on_two_cores():
    """The table says "on 2 cores" once, for every CPU row: each file records it, for
    itself and for each of its runs (a run without a machine ran on the file's)."""
    rt = _results_table()
    assert "SmolLM2-135M on 2 cores (GPU rows aside)" in README.read_text()
    for _, file, kind, _ in rt.ROWS:
        if kind.__name__ in ("prime_rl", "clone", "install"):  # a GPU; no CPU work
            continue
        r = rt.load(file)
        runs = [x for v in r.get("runs", {}).values() if isinstance(v, list) for x in v]
        machines = [r["machine"]] + [x.get("machine", r["machine"]) for x in runs]
        assert {m["cpus"] for m in machines} == {2}, file


@pytest.mark.parametrize("edit", ["0.047 -> 0.422", "| 1.62x-1.95x |", "6.7 min"])
def test_a_number_edited_by_hand_is_caught(edit):
    rt = _results_table()
    doc = README.read_text()
    assert edit in doc
    planted = doc.replace(edit, re.sub(r"\d(?=\D*$)", lambda m: str((int(m[0]) + 1) % 10),
                                       edit), 1)
    assert planted != doc and rt.render(planted) == doc


def test_no_figure_stands_in_the_prose():
    bad = prose_figures(README.read_text())
    assert not bad, ("README.md states figures outside its generated blocks, where no file "
                     f"holds them (give them a results file and a row, or drop them): {bad}")


def test_a_planted_figure_in_prose_is_caught():
    doc = README.read_text()
    assert prose_figures(doc + "\nA real AVX2 CPU took 21.4 minutes.\n") == ["21.4 minutes"]
    assert prose_figures(doc + "\n```bash\nmake test   # 864 tests in 6.6 min\n```\n") == [
        "6.6 min"]
    assert prose_figures(doc + "\nShared prefixes: 1.78x faster (`torch==2.13.0`).\n") == [
        "1.78x"]
    assert prose_figures("<!-- x:begin -->\n0.5 -> 0.7\n<!-- x:end -->\n") == []

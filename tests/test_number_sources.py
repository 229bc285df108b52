"""Every number with its source (issue 49, item 5): a generated table names the CPU each row's
results file records, and no README claims one CPU for every committed figure while the
files record several.

The committed tables are compared with what their scripts make from the committed results
(`benchmarks/readme_table.py` for the speed table; `research/learning_summary.py` for the
learning tables, from each file's run records as `learning.py --report-only` reads them),
so a table edited by hand, or left stale after its results changed, fails here. Pure reads:
no model runs."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "research"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import learning_summary  # noqa: E402
import readme_table  # noqa: E402

BENCH_RESULTS, RESEARCH_RESULTS = ROOT / "benchmarks" / "results", ROOT / "research" / "results"
READMES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "research" / "README.md"]


def _results() -> dict[str, dict]:
    return {f"{p.parent.parent.name}/{p.name}": json.loads(p.read_text())
            for d in (BENCH_RESULTS, RESEARCH_RESULTS) for p in sorted(d.glob("*.json"))}


def _machines(r: dict) -> list[dict | None]:
    """The machines a results file records: its own, and each of its runs' (a run record
    without one ran where the file says: learning_summary.with_recorded's rule)."""
    runs = r.get("runs")
    records = [x for v in runs.values() for x in v if isinstance(x, dict)] \
        if isinstance(runs, dict) and all(isinstance(v, list) for v in runs.values()) else []
    return [r.get("machine")] + [x.get("machine", r.get("machine")) for x in records]


def _block(readme: Path, name: str) -> str:
    doc = readme.read_text()
    return doc.split(f"<!-- {name}:begin -->\n", 1)[1].split(f"<!-- {name}:end -->", 1)[0]


def test_the_cpu_label_reads_the_recorded_profile():
    def machine(cap, flags, bf16=False):
        return {"profile": {"cpu_capability": cap, "cpu_flags": flags, "cpu_bf16": bf16}}
    label = readme_table.cpu_label
    assert label(machine("AVX512", ["avx2", "avx512_bf16", "avx512f"], True)) == "AVX-512+bf16"
    assert label(machine("AVX512", ["avx2", "avx512f"])) == "AVX-512"
    assert label(machine("AVX2", ["avx2"])) == "AVX2"
    assert label(machine("AVX2", ["avx2", "avx512_bf16", "avx512f"])) == "AVX2 forced"
    assert label(None) == label({"cpus": 2}) == "unknown"


def test_both_tables_label_every_committed_record_alike():
    """The learning and speed tables read one cpu_label (benchmarks/common.py)."""
    files = {Path(f.__code__.co_filename).resolve()
             for f in (learning_summary.cpu_label, readme_table.cpu_label)}
    assert files == {(ROOT / "benchmarks" / "common.py").resolve()}, files
    machines = [m for r in _results().values() for m in _machines(r)]
    assert len(machines) > 20
    for m in machines:
        assert learning_summary.cpu_label(m) == readme_table.cpu_label(m), m


def test_forced_kernels_are_named_where_the_file_records_the_switches():
    for name, r in _results().items():
        if "isa_switches" in r:  # bench_*.py's `common.cpu_setting`
            forced = any(r["isa_switches"].values())
            assert (readme_table.cpu_label(r["machine"]) == "AVX2 forced") == forced, name


def test_the_speed_table_is_its_results_and_names_each_rows_cpu():
    block = _block(ROOT / "benchmarks" / "README.md", "bench-table")
    assert block == readme_table.table(BENCH_RESULTS), \
        "benchmarks/README.md's bench-table is stale: python benchmarks/readme_table.py"
    rows = [line.split(" | ") for line in block.splitlines()[2:]]
    for cells in rows:
        r = json.loads((BENCH_RESULTS / f"{cells[0].lstrip('| ')}.json").read_text())
        assert readme_table.cpu_label(r["machine"]) in cells[-1], cells[0]


def _learning_tables() -> list[tuple[str, Path, str]]:
    """(the results file's name, the file with the table, the table) of every committed
    learning table: research/README.md's blocks and results/*.md."""
    readme = ROOT / "research" / "README.md"
    blocks = re.findall(r"<!-- (learning[\w.-]*)-table:begin -->", readme.read_text())
    return ([(b, readme, _block(readme, f"{b}-table")) for b in blocks
             if (RESEARCH_RESULTS / f"{b}.json").exists()]
            + [(p.stem, p, p.read_text()) for p in sorted(RESEARCH_RESULTS.glob("learning*.md"))])


def _rendered(r: dict) -> str:
    """The table `learning.py --report-only` makes from a results file's run records."""
    ls = learning_summary
    by_arm = {arm: [x if "machine" in x else {**x, "machine": r.get("machine")} for x in runs]
              for arm, runs in r["runs"].items()}
    arms = {arm: ls.arm_summary(runs) for arm, runs in by_arm.items()}
    return ls.table(arms) + ls.versus(ls.headline(by_arm), ls.cost_ratios(arms))


@pytest.mark.parametrize("bench,where,text", _learning_tables(),
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "")
def test_each_learning_table_is_its_results_and_names_where_its_runs_ran(bench, where, text):
    r = json.loads((RESEARCH_RESULTS / f"{bench}.json").read_text())
    assert text == _rendered(r), (f"{where.name}'s {bench} table is stale: python "
                                  f"research/learning.py --bench {bench} --report-only ...")
    for arm, runs in r["runs"].items():  # the CPU column, against the records themselves
        row = next(line for line in text.splitlines() if line.startswith(f"| {arm} |"))
        for x in runs:
            cpu = readme_table.cpu_label(x.get("machine", r.get("machine")))
            seeds = re.search(rf"([\d, ]*\b{x['seed']}\b[\d, ]*) \(([^,)]+),", row.split(" | ")[1])
            assert seeds and seeds[2] == cpu, (bench, arm, x["seed"], cpu)


ONE_CPU = re.compile(r"\b(every|all)\b(\s+\S+){0,3}?\s+(figures?|results?|numbers?|measurements?)"
                     r"\b[^.]*?\b(AVX-?512|AVX2)", re.IGNORECASE)


def one_cpu_claims(text: str) -> list[str]:
    """The sentences that say every (or all) figure, result, number or measurement came
    from one named CPU."""
    prose = re.sub(r"\s+", " ", re.sub(r"```.*?```", "", text, flags=re.S))
    return [s for s in re.split(r"(?<=[.!?])\s+", prose) if ONE_CPU.search(s)]


def test_no_readme_claims_one_cpu_for_results_that_record_several():
    cpus = {readme_table.cpu_label(m) for r in _results().values() for m in _machines(r)
            if m and m.get("profile")}
    assert len(cpus) > 1, cpus  # else such a sentence could be true
    assert one_cpu_claims("**The machine.** Every committed figure so far comes from a 2-core "
                          "CPU **with AVX-512 and AVX512_BF16** (bf16).")  # the old text
    for readme in READMES:
        assert not one_cpu_claims(readme.read_text()), (readme, cpus)


def test_the_ratios_against_prime_rl_are_the_recorded_runs():
    """benchmarks/README.md's ratios against prime-rl's published row are computed from
    gpu.json's h100_anchor runs (gpu_anchor.versus_prime_rl), not by hand."""
    import gpu_anchor
    v = gpu_anchor.versus_prime_rl(json.loads((BENCH_RESULTS / "gpu.json").read_text())
                                   ["h100_anchor"]["runs"])
    speed, memory = v["speed"], v["memory"]
    text = " ".join((ROOT / "benchmarks" / "README.md").read_text().split())
    full = sorted(speed[s] for s in ("full:100:15900:gc", "full:12000:4000:gc"))
    assert f"rlany's full step ran {full[0]:.1f}x" in text
    assert f"to {full[1]:.1f}x (on a 4k-token response only" in text
    assert f"LoRA {speed['lora:12000:4000:gc']:.1f}x, in {min(memory.values()):.1f}-" \
           f"{max(memory.values()):.1f}x its memory" in text
    assert f"for {v['grad_checkpointing_tokens_per_s_lost']:.0%} fewer tokens/s" in text

"""benchmarks/bench_demo.py reads make demo's rollouts' seconds per generated token from the
run's sidecars, and states what make demo takes from the committed results file matching
this CPU setting (examples/demo.sh's first line). No model runs."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_demo import avx2_estimate, expected, per_token, rollout_figures  # noqa: E402

from rlany.files.outputs import write_meta  # noqa: E402


def fake_run(run: Path, rollouts: dict[int, tuple[float, int] | None]) -> Path:
    """runs/NAME/iter_NNN/ with each rollout's sidecar as the rollout stage writes it:
    (generate seconds, completion tokens), or None for an iteration without one yet."""
    for it, figures in rollouts.items():
        d = run / f"iter_{it:03d}"
        d.mkdir(parents=True)
        if figures is None:
            continue
        (d / "trajectories.jsonl").write_text("{}\n")
        write_meta(d / "trajectories.jsonl", stage="rollout", flags={}, inputs=[],
                   counts={"trajectories": 128, "completion_tokens": figures[1],
                           "generate_calls": 4, "generate_seconds": figures[0],
                           "prefill_seconds": 1.0}, started=time.time())
    return run


def test_rollout_seconds_per_token_against_iteration_0(tmp_path):
    run = fake_run(tmp_path / "demo", {0: (24.4, 1000), 1: (25.5, 1000), 2: (33.0, 3000),
                                       3: None})
    figures = rollout_figures(run)
    assert [f["iteration"] for f in figures] == [0, 1, 2]  # iter_003: no rollout yet
    assert figures[0] == {"iteration": 0, "generate_seconds": 24.4, "completion_tokens": 1000,
                          "seconds_per_token": 0.0244}
    tokens = per_token(figures)
    assert tokens["over_iteration_0"] == {"iter_001": 1.045, "iter_002": 0.451}
    assert tokens["target"] == "<= 1.05" and tokens["met"] is True
    assert tokens["rollouts"] == figures


def test_one_slow_iteration_misses_and_without_iteration_0_nothing_is_claimed(tmp_path):
    slow = per_token(rollout_figures(fake_run(tmp_path / "a", {0: (20.0, 1000),
                                                               1: (21.2, 1000),
                                                               2: (19.0, 1000)})))
    assert slow["over_iteration_0"]["iter_001"] == 1.06 and slow["met"] is False
    # a rollout that generated nothing (resumed whole) gives no figure to compare
    none = per_token(rollout_figures(fake_run(tmp_path / "b", {0: (0.0, 0), 1: (20.0, 1000)})))
    assert none["over_iteration_0"] == {} and none["met"] is None
    assert per_token([])["met"] is None


def _scale_files(results: Path, real: dict, forced: dict) -> Path:
    results.mkdir(exist_ok=True)
    for name, steps in (("shared_prefix-avx2-float32.json", real),
                        ("shared_prefix-avx2forced-float32.json", forced)):
        (results / name).write_text(json.dumps({"seconds_per_step": steps}))
    return results


def test_the_avx2_goal_is_an_estimate_scaled_by_the_measured_ratio(tmp_path):
    """The forced minutes x real/forced seconds of the same training steps (two files)."""
    res = _scale_files(tmp_path / "r", {"shared": 6.0, "plain": 15.0},
                       {"shared": 5.0, "plain": 10.0})  # ratios 1.2 and 1.5
    e = avx2_estimate(6.0, resumed=False, results=res)
    assert e["minutes"] == [7.2, 9.0] and e["met"] is True and e["estimate"] is True
    assert "<= 10 min on a real AVX2 CPU" == e["goal"] and "not a measurement" in e["how"]
    assert avx2_estimate(7.0, resumed=False, results=res)["met"] is False  # 10.5 at the top
    assert avx2_estimate(5.0, resumed=True, results=res)["met"] is None  # a rerun claims none
    assert avx2_estimate(5.0, False, results=tmp_path / "none")["minutes"] is None


def _machine(**profile) -> dict:
    return {"cpus": 2, "cpu_model": "AMD EPYC 9B14", "date": "2026-11-30T01:02:03Z",
            "profile": {"cpu_flags": ["avx2", "avx512_bf16", "avx512f"], **profile}}


def test_demo_states_the_measured_minutes_of_this_cpu_setting_or_none(tmp_path):
    (tmp_path / "demo-avx512-bfloat16.json").write_text(json.dumps({
        "minutes": 9.6, "machine": _machine(cpu_capability="AVX512", cpu_bf16=True)}))
    line = expected("avx512-bfloat16", tmp_path)
    assert line == ("demo: about 10 minutes on this CPU setting: 9.6 measured (2 cores, "
                    "AMD EPYC 9B14, AVX-512+bf16, 2026-11-30, "
                    "benchmarks/results/demo-avx512-bfloat16.json)")
    assert expected("avx2-float32", tmp_path) == \
        "demo: no measured time for this CPU setting (avx2-float32)"
    # a real AVX2 CPU without its own file: the AVX2-forced run's estimate, said as one
    (tmp_path / "demo-avx2forced-float32.json").write_text(json.dumps({
        "minutes": 8.2, "machine": _machine(cpu_capability="AVX2"),
        "avx2_estimate": avx2_estimate(8.2, resumed=False, results=_scale_files(
            tmp_path / "r", {"shared": 6.0, "plain": 15.0}, {"shared": 5.0, "plain": 10.0}))}))
    line = expected("avx2-float32", tmp_path)
    assert line.startswith("demo: no measured time for this CPU setting (avx2-float32); "
                           "estimated 9.8-12.3 min from AVX2 kernels forced") and "estimate" in line
    assert "AVX2 forced" in expected("avx2forced-float32", tmp_path)


def test_demo_sh_prints_the_committed_results_line():
    """examples/demo.sh's first line is `bench_demo.py --expected` over benchmarks/results."""
    from common import cpu_setting

    from rlany.compat import resolve_dtype

    assert "bench_demo.py --expected" in (ROOT / "examples/demo.sh").read_text()
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_demo.py"), "--expected"],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")}).stdout
    assert out == expected(cpu_setting(resolve_dtype("auto"))[0]) + "\n"


def test_the_speed_tables_demo_row_shows_the_per_token_ratios_and_the_estimate(tmp_path):
    import readme_table

    tokens = per_token(rollout_figures(fake_run(tmp_path / "demo", {0: (20.0, 1000),
                                                                    1: (21.2, 1000)})))
    r = {"benchmark": "demo-avx2forced-float32", "metric": "m", "minutes": 8.2,
         "base": {"successes": 3, "episodes": 64}, "final": {"successes": 16, "episodes": 64},
         "gain": 0.2031, "gain_ci95": [0.08, 0.33], "resumed": False, "target": "t",
         "met": True, "machine": _machine(cpu_capability="AVX2")}
    plain = readme_table.row(r)
    assert "s/token" not in plain and "estimated" not in plain  # files before issue 65
    row = readme_table.row({**r, "per_token": tokens,
                            "avx2_estimate": avx2_estimate(8.2, resumed=False, results=_scale_files(
                                tmp_path / "r", {"shared": 6.0, "plain": 15.0},
                                {"shared": 5.0, "plain": 10.0}))})
    assert row.replace(
        "; rollout s/token over iteration 0's: iter_001 1.06 (<= 1.05: **not met**); real "
        "AVX2 estimated 9.8-12.3 min (<= 10 min on a real AVX2 CPU: **not met**, an estimate)",
        "") == plain

"""How long `make test` takes: the default suite as the Makefile runs it (two pytest-xdist
workers, one torch thread each), timed as a whole, with the machine and its instruction-set
switches recorded (set ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2 on an AVX-512 CPU for the AVX2 proxy). Target: <= 8 minutes on
2 AVX2 cores. Run it alone on the machine.

    python benchmarks/bench_suite.py      # -> benchmarks/results/suite-<cpu setting>.json
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_setting, save  # noqa: E402

ARGS = ["-q", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider"]  # the Makefile's
SLOWEST = 25  # the slowest tests are recorded (pytest --durations): where to trim first
_DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(.+?)\s*$")


def slowest(stdout: str) -> list[dict]:
    """pytest's --durations lines ("12.34s call     tests/test_x.py::test_y") as records."""
    return [{"seconds": float(m[1]), "phase": m[2], "test": m[3]}
            for m in map(_DURATION.match, stdout.splitlines()) if m]


def main() -> dict:
    setting, switches = cpu_setting("float32")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    args = [*ARGS, f"--durations={SLOWEST}"]
    done = subprocess.run([sys.executable, "-m", "pytest", *args], env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail)}
    failures = [ln for ln in done.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    result = {"metric": "wall minutes of the default test suite (make test's pytest)",
              "minutes": round(seconds / 60, 2), "target": "<= 8 min, every test passing",
              "met": done.returncode == 0 and seconds <= 8 * 60, "counts": counts,
              "failures": failures,
              "returncode": done.returncode, "pytest_args": args, "omp_num_threads": 1,
              "isa_switches": switches, "slowest": slowest(done.stdout)}
    path = save(f"suite-{setting}", result)
    # the speed table shows this file: regenerated with it, so the two never disagree
    subprocess.run([sys.executable, str(Path(__file__).parent / "readme_table.py")],
                   check=True, capture_output=True)
    print(f"{tail}\n{result['minutes']} min -> {path} (and benchmarks/README.md's table)")
    return result


if __name__ == "__main__":
    main()

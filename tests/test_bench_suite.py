"""benchmarks/bench_suite.py records the slowest tests from pytest's --durations lines."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_suite import slowest  # noqa: E402


def test_durations_lines_become_records_and_nothing_else_does():
    out = ("....\n===== slowest 25 durations =====\n"
           "12.34s call     tests/test_loop.py::test_x[a b]\n"
           "0.50s setup    tests/test_env.py::test_y\n"
           "(3 durations < 0.005s hidden.  Use -vv to show these durations.)\n"
           "864 passed in 393.21s (0:06:33)\n")
    assert slowest(out) == [
        {"seconds": 12.34, "phase": "call", "test": "tests/test_loop.py::test_x[a b]"},
        {"seconds": 0.5, "phase": "setup", "test": "tests/test_env.py::test_y"}]

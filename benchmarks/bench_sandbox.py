"""sandbox: test executions/s, many tests in one sandboxed process vs one process per test
(the naive runner). Target >= 2x."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402

from rlany.sandbox import Limits, isolation, run_one, run_tests  # noqa: E402

PROGRAMS = [
    "a, b = map(int, input().split())\nprint(a + b)",
    "n = int(input().split()[0])\nprint(sum(range(n)))",
    "s = input()\nprint(s[::-1])",
    "import math\nprint(math.gcd(*map(int, input().split())))",
]


def main(tests_per_program: int = 20) -> dict:
    inputs = [f"{i} {i + 7}" for i in range(tests_per_program)]
    limits = Limits()
    start = time.perf_counter()
    shared = [run_tests(p, inputs, limits) for p in PROGRAMS]
    t_shared = time.perf_counter() - start
    start = time.perf_counter()
    naive = [[run_one(p, x, limits) for x in inputs] for p in PROGRAMS]
    t_naive = time.perf_counter() - start
    same = all(a.stdout == b.stdout for rs, ns in zip(shared, naive) for a, b in zip(rs, ns))
    n = len(PROGRAMS) * tests_per_program
    ratio = (n / t_shared) / (n / t_naive)
    result = {"metric": "test executions/s, shared process / one process per test",
              "ratio": round(ratio, 2), "target": ">= 2", "met": ratio >= 2,
              "shared_per_s": round(n / t_shared, 1), "naive_per_s": round(n / t_naive, 1),
              "executions": n, "outputs_identical": same, "isolation": isolation()}
    save("sandbox", result)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))

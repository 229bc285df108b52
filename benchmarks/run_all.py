"""`make bench`: run the benchmarks side by side and print one table.

Fast ones by default; `--all` adds the model benchmarks (minutes: SmolLM2 on the CPU).
Results: benchmarks/results/<name>.json (machine and versions included). Whether the loop
learns is research/'s (`make bench-learning`: hours; research/README.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

FAST = ["bench_score", "bench_sandbox"]
SLOW = ["bench_training", "bench_generation", "bench_engines", "bench_loop", "bench_trl",
        "bench_memory"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--all", action="store_true", help="also the model benchmarks")
    parser.add_argument("names", nargs="*", help="run only these (e.g. bench_score)")
    parser.add_argument("--readme", action="store_true",
                        help="regenerate benchmarks/README.md's speed table from "
                        "results/*.json")
    args = parser.parse_args()
    names = args.names or (FAST + SLOW if args.all else FAST)
    rows = []
    for name in names:
        module = __import__(name)
        print(f"running {name} ...", file=sys.stderr, flush=True)
        result = module.main()
        rows.append((name, result["metric"], result["ratio"], result["target"], result["met"]))
    print(f"{'benchmark':<18} {'ratio':>8} {'target':>8} {'met':>5}  metric")
    for name, metric, ratio, target, met in rows:
        print(f"{name:<18} {ratio:>8} {target:>8} {str(met):>5}  {metric}")
    if args.readme:
        import readme_table
        from common import write_readme_block
        write_readme_block("bench-table", readme_table.table())


if __name__ == "__main__":
    main()

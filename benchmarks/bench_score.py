"""score streams: peak memory at 10x the input / at 1x (target <= 1.2), and records/s.

Each size runs `rlany score` in its own process; peak RSS is that process's ru_maxrss.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).parent))

from common import save  # noqa: E402

from conftest import make_judgment, make_traj  # noqa: E402
from rlany.files.jsonl import dumps  # noqa: E402

PEAK = ("import resource, sys, runpy; sys.argv = ['rlany'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('rlany', run_name='__main__')\n"
        "except SystemExit: pass\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)")


def write_inputs(folder: Path, tasks: int, n: int = 8, steps: int = 3) -> tuple[Path, Path]:
    traj, judg = folder / "traj.jsonl", folder / "judg.jsonl"
    with open(traj, "w") as t, open(judg, "w") as j:
        for k in range(tasks):
            for i in range(n):
                tr = make_traj(f"task{k}", i, 1 if (i + k) % 3 else -1, n_steps=steps)
                t.write(dumps(tr) + "\n")
                j.write(dumps(make_judgment(tr, [[1, -1, (i + s) % 3 - 1]
                                                 for s in range(steps)])) + "\n")
    return traj, judg


def run(traj: Path, judg: Path, out: Path) -> tuple[int, float]:
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", PEAK, "score", "-i", str(traj), "-j", str(judg),
                        "-o", str(out)], capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - start
    return int(r.stderr.strip().splitlines()[-1]), seconds


def main() -> dict:
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for scale, tasks in (("1x", 500), ("10x", 5000)):
            d = Path(tmp) / scale
            d.mkdir()
            traj, judg = write_inputs(d, tasks)
            kib, seconds = run(traj, judg, d / "scored.jsonl")
            records = tasks * 8
            rows[scale] = {"tasks": tasks, "trajectories": records, "peak_rss_mib":
                           round(kib / 1024, 1), "seconds": round(seconds, 2),
                           "records_per_s": round(records / seconds, 1)}
    ratio = rows["10x"]["peak_rss_mib"] / rows["1x"]["peak_rss_mib"]
    result = {"metric": "peak memory 10x / 1x", "ratio": round(ratio, 3), "target": "<= 1.2",
              "met": ratio <= 1.2, "runs": rows}
    save("score", result)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))

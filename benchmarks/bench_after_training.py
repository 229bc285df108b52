"""The engine after training as fast as a fresh one: a loop iteration's rollout, which ran
inside `rlany loop` on the engine whose network the trainers had borrowed, replayed with the
loop's own command in a fresh process. Reports the generate seconds of both (the sidecars'
`generate_seconds`), their ratio against the fastest fresh round (target <= 1.05), and
whether the trajectories are byte for byte the loop's. Run it alone on the machine, right
after the loop, on the same machine:

    make demo 2> demo.log    # or any `rlany loop` whose stderr was kept
    python benchmarks/bench_after_training.py --log demo.log --iteration 2 --rounds 2

Writes results/after_training-itN-SETTING.json (SETTING as `common.cpu_setting` names it;
the AVX2 switches, set for both the loop and this, reach the fresh processes).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_setting, save  # noqa: E402


def loop_command(log: Path, iteration: int) -> list[str]:
    """The `rlany rollout` command the loop printed for `iteration`."""
    mark = f"iter_{iteration:03d}/trajectories.jsonl"
    for line in log.read_text().splitlines():
        if line.startswith("loop: $ rlany rollout ") and mark in line:
            return shlex.split(line[len("loop: $ "):])
    raise SystemExit(f"{log}: no rollout command for iteration {iteration}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, required=True, help="the loop's stderr")
    ap.add_argument("--iteration", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    cmd = loop_command(args.log, args.iteration)
    out = Path(cmd[cmd.index("--output") + 1])
    loop_meta = json.loads(out.with_name("trajectories.meta.json").read_text())["counts"]
    fresh = []
    with tempfile.TemporaryDirectory() as tmp:
        mine = Path(tmp) / "trajectories.jsonl"
        for _ in range(args.rounds):
            mine.unlink(missing_ok=True)
            argv_ = [a if a != str(out) else str(mine) for a in cmd]
            subprocess.run([sys.executable, "-m", "rlany", *argv_[1:]], check=True,
                           capture_output=True)
            meta = json.loads(mine.with_name("trajectories.meta.json").read_text())["counts"]
            fresh.append({"generate_seconds": meta["generate_seconds"],
                          "completion_tokens": meta["completion_tokens"],
                          "identical": mine.read_bytes() == out.read_bytes()})
            print(fresh[-1], file=sys.stderr, flush=True)
    fastest = min(f["generate_seconds"] for f in fresh)  # the fairest fresh figure
    ratio = loop_meta["generate_seconds"] / fastest
    from rlany.compat import resolve_dtype

    setting = cpu_setting(resolve_dtype("auto"))[0]  # AVX2 forced: the switches, inherited
    print(save(f"after_training-it{args.iteration}-{setting}", {
        "metric": "generate seconds of one loop rollout: inside the loop after training / "
                  "in a fresh process",
        "command": shlex.join(cmd), "loop": {k: loop_meta[k] for k in (
            "generate_seconds", "completion_tokens")},
        "fresh": fresh, "ratio": round(ratio, 3), "target": "<= 1.05", "met": ratio <= 1.05,
        "note": "run alone on the machine, after the loop, on the machine it ran on"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

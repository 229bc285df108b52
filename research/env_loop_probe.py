"""The environment loop's cheap probe (issue: "The environment loop as the paper's own code
makes it", item 4): which of the household env's easier edits of mid.toml's pool tasks land
where acceptance can take them, with a given policy.

For each of the 64 pool tasks, the first edit of each kind the env offers in the easier
direction (as `rlany adapt-tasks` deals them, goal kind excluded: it is opt-in) becomes a
variant; every variant is rolled out N times (`rlany rollout`, mid.toml's rollout settings)
with the base model or with an adapter (the warm start). Per kind: variants, episodes,
successes, the mean shortening of the plan, and how many variants' success lands inside
(alpha_low, alpha_high) = (0.2, 0.8), where a candidate can be accepted by either rule.

    python research/env_loop_probe.py --tag base
    python research/env_loop_probe.py --tag warm --adapter runs/warm/warm_start/sft
    python research/env_loop_probe.py --tag warm-22 --pool-tasks 22 --adapter ...  # a part
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
from lab import save  # noqa: E402

POOL = ROOT / "examples" / "household" / "mid_tasks.jsonl"
ROLLOUT = ["--n", "{n}", "--max-steps", "8", "--max-tokens", "16", "--temperature", "1.0",
           "--history-turns", "1", "--constrain-actions", "--seed", "0"]


def variants(pool) -> list:
    """(task, kind, plan shortening) for the first easier edit of each kind of each task."""
    from rlany.api import make_env

    env, out = make_env("household"), []
    for task in pool:
        seen = set()
        before = env.difficulty(task.spec)["plan_length"]
        for edit in env.edits(task.spec, "easier"):
            if edit.kind in seen:
                continue
            seen.add(edit.kind)
            shorter = before - env.difficulty(edit.spec)["plan_length"]
            out.append((replace(task, task_id=f"{task.task_id}.p{len(seen)}", spec=edit.spec),
                        edit.kind, shorter))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", required=True)
    ap.add_argument("--adapter")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--pool-tasks", type=int, help="only the first K pool tasks in file order "
                    "(the base probe's partial file covers 22)")
    args = ap.parse_args(argv)
    import jsonlines

    from rlany.api import Task, from_json, to_json

    pool = [from_json(Task, r) for r in jsonlines.open(POOL)][:args.pool_tasks]
    made = variants(pool)
    with tempfile.TemporaryDirectory() as tmp:
        tasks, trajs = Path(tmp) / "tasks.jsonl", Path(tmp) / "trajectories.jsonl"
        tasks.write_text("".join(json.dumps(to_json(t)) + "\n" for t, _, _ in made))
        cmd = [sys.executable, "-m", "rlany", "rollout", "-i", str(tasks), "-o", str(trajs),
               "--model", "smollm2", *[a.format(n=args.n) for a in ROLLOUT]]
        if args.adapter:
            cmd += ["--adapter", args.adapter]
        subprocess.run(cmd, check=True)
        wins = defaultdict(int)
        for t in jsonlines.open(trajs):
            wins[t["task_id"]] += t["outcome"] > 0
        meta = json.loads(trajs.with_name("trajectories.meta.json").read_text())
    by_kind: dict = defaultdict(lambda: {"variants": 0, "episodes": 0, "successes": 0,
                                         "plan_shortened": 0, "inside_0.2_0.8": 0})
    for task, kind, shorter in made:
        row, p = by_kind[kind], wins[task.task_id] / args.n
        row["variants"] += 1
        row["episodes"] += args.n
        row["successes"] += wins[task.task_id]
        row["plan_shortened"] += shorter
        row["inside_0.2_0.8"] += 0.2 < p < 0.8
    for row in by_kind.values():
        row["success"] = round(row["successes"] / row["episodes"], 3)
        row["plan_shortened"] = round(row["plan_shortened"] / row["variants"], 2)
    print(save(f"env-loop-probe-{args.tag}", {
        "metric": f"success of the easier edits' variants of mid.toml's first {len(pool)} "
                  "pool tasks, by kind",
        "pool_tasks": len(pool),
        "policy": args.adapter or "base model", "n": args.n, "by_kind": dict(by_kind),
        "variants": len(made), "rollout_seconds": meta.get("wall_time_s"),
        "generate_seconds": meta["counts"].get("generate_seconds")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The base model on MiniWoB pages before and after BrowserGym's action set (issue "The GUI
and served envs"): the same 40 pages (the 20 with an expert), the same flags, the env's code
at two commits. Runs `rlany eval` once per source tree (PYTHONPATH=TREE/src), then saves
success per page and the gain's Newcombe interval.

    git worktree add /tmp/before 0e7a5f7          # click and type only
    git worktree add /tmp/after HEAD
    python research/miniwob_actions.py --before /tmp/before --after /tmp/after --save
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from lab import machine, save

from rlany.api import gain_interval

PAGES = ("click-test,click-test-2,click-button,click-button-sequence,click-link,click-tab,"
         "focus-text,focus-text-2,enter-text,enter-text-2,enter-password,login-user,"
         "click-dialog,click-option,click-checkboxes,choose-list,enter-date,enter-time,"
         "click-collapsible,terminal")
EVAL = ["--engine", "hf", "--model", "smollm2", "--n", "4", "--max-tokens", "24",
        "--constrain-actions"]


def run(tree: str, name: str, tasks: Path, out: Path) -> dict:
    """`rlany eval` with TREE's code, or its summary where an earlier call wrote it."""
    if (out / f"{name}.json").exists():
        return json.loads((out / f"{name}.json").read_text())
    env = {**os.environ, "PYTHONPATH": f"{tree}/src"}
    subprocess.run([sys.executable, "-m", "rlany", "eval", "-i", str(tasks),
                    "-o", str(out / f"{name}.json"), "--trajectories",
                    str(out / f"{name}.traj.jsonl"), *EVAL], env=env, check=True)
    return json.loads((out / f"{name}.json").read_text())


def per_page(tasks: Path, trajectories: Path) -> dict:
    page = {json.loads(ln)["task_id"]: json.loads(ln)["spec"]["task"]
            for ln in tasks.read_text().splitlines()}
    counts = defaultdict(lambda: [0, 0])
    for ln in trajectories.read_text().splitlines():
        t = json.loads(ln)
        if t.get("finish") == "error":  # the browser failed: no episode of the policy
            continue
        counts[page[t["task_id"]]][0] += t.get("outcome", 0) > 0
        counts[page[t["task_id"]]][1] += 1
    return {k: f"{a}/{b}" for k, (a, b) in sorted(counts.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a checkout with click and type only")
    ap.add_argument("--after", required=True, help="a checkout with BrowserGym's actions")
    ap.add_argument("--out", default="runs/miniwob-actions")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = out / "pages40.jsonl"
    if not tasks.exists():
        subprocess.run([sys.executable, "-m", "rlany", "envs", "make-tasks", "miniwob", "--n",
                        "40", "--seed", "11", "--knob", f"tasks={PAGES}", "-o", str(tasks)],
                       check=True)
    result: dict = {"benchmark": "miniwob-actions", "machine": machine(), "eval_flags": EVAL,
                    "tasks": "make-tasks miniwob --n 40 --seed 11 --knob tasks=<the 20 pages>"}
    counts = {}
    for name, tree in (("before", args.before), ("after", args.after)):
        summary = run(tree, name, tasks, out)
        n = summary["trajectories"] - summary["errored"]
        counts[name] = (round(summary["success_rate"] * n), n)
        result[name] = {"tree": tree, "success": summary["success_rate"],
                        "ci95": summary["success_ci95"], "errored": summary["errored"],
                        "per_page": per_page(tasks, out / f"{name}.traj.jsonl")}
    (k1, n1), (k0, n0) = counts["after"], counts["before"]
    result["gain"] = round(k1 / n1 - k0 / n0, 3)
    result["gain_ci95"] = gain_interval(k1, n1, k0, n0)
    print(json.dumps({k: result[k] for k in ("gain", "gain_ci95")}))
    if args.save:
        print(f"wrote {save('miniwob-actions', result)}")


if __name__ == "__main__":
    main()

"""Does the model's choice of edit beat a uniformly random one? (The environment loop's
`random` control, issue "The environment loop earns its place", item 3.)

From iterations that loop runs already made (a pool, its stats and its trajectories), both
rewriters propose for the same tasks: `adapt-tasks --rewrite edits` (the model picks one of
the env's numbered edits, reading the env's account of the episodes) and `--rewrite random`
(a uniformly random edit of the same menu). Both sets of candidates are then rolled out
together by the same policy (the base model unless --adapter), n episodes each, and judged
by the paper's acceptance rule against their parent's accuracy. Reported: candidates
accepted and their mean success, per rewriter, paired by parent, with a Newcombe 95%
interval on the difference of the acceptance rates.

    python research/edit_choice.py --from runs/learning-adapt-mid/adapt-s0/iter_000 \
        --config examples/household/mid.toml --out runs/edit-choice

Writes research/results/edit-choice.json (with the machine). CPU cost: one rollout of
2 x (targets) x n episodes; run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import save  # noqa: E402

ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}


def rlany(*args: str) -> None:
    print("$ rlany " + " ".join(args), file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "rlany", *args], check=True, env=ENV)


def propose(src: Path, out: Path, rewrite: str, seed: int) -> Path:
    """One rewriter's candidates of the iteration in `src` (done once: resumable)."""
    cands = out / f"{rewrite}.jsonl"
    if not cands.exists():
        rlany("adapt-tasks", "-i", str(src / "tasks.jsonl"), "--stats",
              str(src / "task_stats.jsonl"), "--trajectories", str(src / "trajectories.jsonl"),
              "--critic", "env", "--rewrite", rewrite, "--samples", "1", "--seed", str(seed),
              "-o", str(out / f"{rewrite}.pool.jsonl"), "--candidates", str(cands))
    return cands


def compare(out: Path, rewriters: tuple[str, ...], alpha_high: float) -> dict:
    """Per rewriter: candidates, accepted (0 < acc < alpha_high and above the parent's), the
    mean success; paired by parent task."""
    stats = {}
    for line in (out / "task_stats.jsonl").read_text().splitlines():
        s = json.loads(line)
        if (s.get("extra") or {}).get("ran", 1) > 0:  # every episode errored: no accuracy
            stats[s["task_id"]] = s["acc"]
    rows = {}
    for rw in rewriters:
        for line in (out / f"{rw}.jsonl").read_text().splitlines():
            c = json.loads(line)
            parent = c["lineage"]["parent_id"]
            pacc = c["candidate"]["parent_acc"]
            if c["task_id"] not in stats:  # never ran: the pair is left out, not a zero
                continue
            acc = stats[c["task_id"]]
            ok = acc > 0 and pacc < acc < alpha_high if c["lineage"]["direction"] == "easier" \
                else 0.2 < acc < pacc
            rows.setdefault(parent, {})[rw] = {"acc": acc, "accepted": ok,
                                                "edit": c["candidate"].get("edit")}
    return rows


def main() -> None:
    from rlany.api import gain_interval

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="sources", type=Path, nargs="+", required=True,
                        help="loop iteration directories (tasks, task_stats, trajectories)")
    parser.add_argument("--config", default="examples/household/mid.toml")
    parser.add_argument("--out", type=Path, default=Path("runs/edit-choice"))
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--adapter", help="the policy that rolls the candidates out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rewriters = ("edits", "random")
    merged = args.out / "candidates.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    if not merged.exists():
        parts = []
        for k, src in enumerate(args.sources):
            sub = args.out / f"src{k}"
            sub.mkdir(exist_ok=True)
            parts += [propose(src, sub, rw, args.seed) for rw in rewriters]
        for rw in rewriters:  # one file per rewriter over every source; ids told apart
            lines = [json.loads(x) for p in parts if p.name == f"{rw}.jsonl"
                     for x in p.read_text().splitlines()]
            (args.out / f"{rw}.jsonl").write_text("".join(
                json.dumps({**c, "task_id": f"{c['task_id']}.{rw}"}) + "\n" for c in lines))
        merged.write_text("".join((args.out / f"{rw}.jsonl").read_text() for rw in rewriters))
    traj = args.out / "trajectories.jsonl"
    if not (args.out / "task_stats.meta.json").exists():
        rlany("rollout", "-i", str(merged), "-o", str(traj), "--n", str(args.n),
              "--max-steps", "8", "--max-tokens", "16", "--history-turns", "1",
              "--constrain-actions", "--seed", str(args.seed),
              *(["--adapter", args.adapter] if args.adapter else []))
        rlany("score", "-i", str(traj), "-o", str(args.out / "scored.jsonl"), "--stats",
              str(args.out / "task_stats.jsonl"))
    rows = compare(args.out, rewriters, 0.8)
    paired = {p: r for p, r in rows.items() if all(rw in r for rw in rewriters)}
    k = {rw: sum(r[rw]["accepted"] for r in paired.values()) for rw in rewriters}
    n = len(paired)
    result = {"metric": "easier candidates accepted under the paper's rule, model's edit "
              "choice vs a uniformly random edit of the same menu, same parents and policy",
              "sources": [str(s) for s in args.sources], "pairs": n, "accepted": k,
              "mean_acc": {rw: round(sum(r[rw]["acc"] for r in paired.values()) / max(n, 1), 4)
                           for rw in rewriters},
              "same_edit": sum(r["edits"]["edit"] == r["random"]["edit"]
                               for r in paired.values()),
              "edits_minus_random": {"value": round((k["edits"] - k["random"]) / max(n, 1), 4),
                                     "ci95": gain_interval(k["edits"], n, k["random"], n)},
              "rows": paired, "n_episodes": args.n}
    save("edit-choice", result)  # with the machine it ran on (research/lab.py)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()

"""Why the environment loop's easier pool does or does not become held-out success: what
the accepted rewrites are, and whether the policy progresses on the original tasks.

For each run of the household env-loop benchmark (`make bench-learning-adapt`'s
runs/learning-adapt-mid/ARM-sSEED):
- the decided candidates by edit (the edit kind the candidate records, e.g. "start
  holding"; in older runs the edit's name before its ':', e.g. "goal kind", or its verb,
  "remove"), accepted and rejected, and the goal kinds of the accepted ones
  (the held-out tasks are all "pick_and_place"); the edits that keep the task's kind,
  accepted of decided, by the kind; per direction and edit, decided, accepted, the mean
  success of the candidates (acc(q')) and how many never succeeded; how many candidates
  repeat a spec an earlier iteration proposed;
- per iteration, the pool episodes of *original* tasks (never rewritten): how many, the
  share that picked up the goal object (an "take OBJ ..." action the env answered with
  "You pick up": the first half of "put X in/on Y"), and the share that succeeded.

    python research/env_loop_why.py runs/learning-adapt-mid --seeds 0 1 2
    python research/env_loop_why.py runs/learning-adapt-learn --name learning-adapt-learn-why

Writes research/results/NAME.json (with the machine) and prints one line per run, then a
line per direction of its decided candidates. Reads
files only: seconds, no model.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import read_rows, save  # noqa: E402


def edit_name(edit: str) -> str:
    """'goal kind: pick_and_place -> pick' -> 'goal kind'; 'remove table 1' -> 'remove'."""
    return edit.split(":", 1)[0] if ":" in edit else edit.split(" ", 1)[0]


def edits(run: Path) -> dict:
    """Decided candidates by edit name, accepted and rejected, and the accepted goal kinds."""
    cands = {c["task_id"]: c for f in sorted(run.glob("iter_*/candidates.jsonl"))
             for c in read_rows(f)}
    accepted, rejected, kinds = (collections.Counter() for _ in range(3))
    by_kind: dict[str, list[int]] = {}  # "KIND: EDIT" -> [accepted, decided]
    by_dir: dict[str, dict[str, list]] = {}  # DIRECTION -> EDIT -> [decided, accepted, accs]
    overwritten = 0
    for f in sorted(run.glob("iter_*/decisions.jsonl")):
        rows = [d for d in read_rows(f) if d.get("kind", "decision") == "decision"]
        # the candidate the pool took per parent: before a parent took one candidate an
        # iteration (adapt_tasks.decide), a later accepted one overwrote an earlier
        took = {d.get("parent_id"): d["task_id"] for d in rows if d["accepted"]}
        for d in rows:
            c = cands.get(d["task_id"], {})
            info = c.get("candidate", {})  # its recorded kind, else (older runs) the edit's head
            name = info.get("edit_kind") or edit_name(info.get("edit") or "?")
            if d["accepted"] and took[d.get("parent_id")] != d["task_id"]:
                overwritten += 1
                d = {**d, "accepted": False}
            (accepted if d["accepted"] else rejected)[name] += 1
            n = by_dir.setdefault(d.get("direction") or "?", {}).setdefault(name, [0, 0, []])
            n[0], n[1] = n[0] + 1, n[1] + bool(d["accepted"])
            n[2] += [] if d.get("acc") is None else [d["acc"]]
            if d["accepted"] and c:
                kinds[c["spec"]["goal"]["kind"]] += 1
            if c and name != "goal kind":  # an edit that keeps the task's kind
                n = by_kind.setdefault(f"{c['spec']['goal']['kind']}: {name}", [0, 0])
                n[0], n[1] = n[0] + bool(d["accepted"]), n[1] + 1
    return {"accepted": dict(accepted.most_common()), "rejected": dict(rejected.most_common()),
            "accepted_goal_kinds": dict(kinds.most_common()),
            "kind_kept_accepted_of_decided": dict(sorted(by_kind.items())),
            "accepted_then_overwritten": overwritten,
            "by_direction": {k: {e: {"decided": n, "accepted": a,
                                     "mean_acc": round(sum(x) / len(x), 3) if x else None,
                                     "acc_zero": sum(v == 0 for v in x)}
                                 for e, (n, a, x) in sorted(v.items(), key=lambda i: -i[1][0])}
                             for k, v in sorted(by_dir.items())}}


def repeats(run: Path) -> dict:
    """Candidates, and those whose spec an earlier iteration had already proposed (each
    is rolled out again: adapt-tasks remembers only this iteration's proposals)."""
    seen: set[str] = set()
    n = repeated = 0
    for f in sorted(run.glob("iter_*/candidates.jsonl")):
        specs = [json.dumps(c["spec"], sort_keys=True) for c in read_rows(f)]
        n, repeated = n + len(specs), repeated + sum(x in seen for x in specs)
        seen.update(specs)
    return {"candidates": n, "spec_proposed_earlier": repeated}


def took_goal_object(traj: dict, obj: str) -> bool:
    take = re.compile(rf"take {re.escape(obj)} \d+ ")
    return any(take.match(s.get("action") or "") and "you pick up" in
               (s.get("next_obs") or "").lower() for s in traj["steps"])


def originals(run: Path) -> list[dict]:
    """Per iteration: the original tasks' pool episodes, the share that picked up the goal
    object, the share that succeeded."""
    out = []
    for d in sorted(run.glob("iter_*")):
        if not (d / "trajectories.jsonl").exists():
            break
        tasks = {t["task_id"]: t for t in read_rows(d / "rollout_tasks.jsonl")
                 if not (t.get("lineage") or {}).get("version")}  # version 0: never rewritten
        trajs = [t for t in read_rows(d / "trajectories.jsonl") if t["task_id"] in tasks
                 and t.get("finish") != "error"]  # an env failure is no episode of the policy
        n = len(trajs)
        took = sum(took_goal_object(t, tasks[t["task_id"]]["spec"]["goal"]["object"])
                   for t in trajs)
        won = sum((t.get("outcome") or 0) > 0 for t in trajs)
        out.append({"iteration": int(d.name[5:]), "episodes": n, "took": took, "succeeded": won})
    return out


def summary(runs_dir: Path, late: int, seeds: list[int] | None = None) -> dict:
    runs = {}
    for run in sorted(p for p in runs_dir.iterdir() if (p / "metrics.jsonl").exists()
                      and (seeds is None or any(p.name.endswith(f"-s{s}") for s in seeds))):
        per_iter = originals(run)
        tail = per_iter[-late:]
        n = sum(r["episodes"] for r in tail)
        planned = json.loads((run / "config.json").read_text()).get("iterations") \
            if (run / "config.json").exists() else None
        done = len((run / "metrics.jsonl").read_text().splitlines())  # iterations finished
        runs[run.name] = {"iterations": done, "planned_iterations": planned,
                          "edits": edits(run), "repeats": repeats(run),
                          "originals": per_iter,
                          f"took_share_last_{late}": round(sum(r["took"] for r in tail)
                                                           / max(n, 1), 3),
                          f"episodes_last_{late}": n}
    pooled: dict[str, list[int]] = {}  # ARM -> [took, episodes] over its runs' last iterations
    for name, r in runs.items():
        n = pooled.setdefault(name.rsplit("-s", 1)[0], [0, 0])
        n[0] += sum(x["took"] for x in r["originals"][-late:])
        n[1] += sum(x["episodes"] for x in r["originals"][-late:])
    return {"runs_dir": str(runs_dir), "late_iterations": late, "seeds": seeds, "runs": runs,
            f"took_pooled_last_{late}": {a: {"took": t, "episodes": e,
                                              "share": round(t / max(e, 1), 3)}
                                          for a, (t, e) in pooled.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("--name", default="learning-adapt-mid-why")
    parser.add_argument("--late", type=int, default=4, help="the last N iterations pooled")
    parser.add_argument("--seeds", type=int, nargs="+", help="only these seeds' runs "
                        "(ARM-sSEED; default: every run, finished or not)")
    args = parser.parse_args()
    result = summary(args.runs_dir, args.late, args.seeds)
    for name, r in result["runs"].items():
        acc = r["edits"]["accepted"]
        done = "" if r["planned_iterations"] in (None, r["iterations"]) else \
            f" (unfinished: {r['iterations']} of {r['planned_iterations']} iterations)"
        print(f"{name}{done}: accepted {sum(acc.values())} ({acc}; goal kinds "
              f"{r['edits']['accepted_goal_kinds']}); originals' goal object picked up in "
              f"the last {args.late} iterations: {r[f'took_share_last_{args.late}']} of "
              f"{r[f'episodes_last_{args.late}']} episodes; of {r['repeats']['candidates']} "
              f"candidates {r['repeats']['spec_proposed_earlier']} repeat an earlier one")
        for way, by in r["edits"]["by_direction"].items():
            print(f"  {way}: " + ", ".join(f"{e} {v['accepted']}/{v['decided']} accepted "
                                           f"(acc(q') {v['mean_acc']}, 0 in {v['acc_zero']})"
                                           for e, v in by.items()))
    print(save(args.name, result), file=sys.stderr)


if __name__ == "__main__":
    main()

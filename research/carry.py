"""Carry unfinished loop runs from one machine to the next: a long ablation (12 iterations a
run, several runs) outlives a session, and a run directory (runs/ is not in git) does not
survive a fresh clone. `pack` writes what the loop needs to resume, and what the summary
reads, into one small archive to commit; `unpack` restores it on the next machine, where
`research/learning.py` (the same command) resumes each run at its first unfinished
iteration.

Kept per run: its config, base/init evaluations and metrics; a finished warm start
(`warm_start/`: the demos and the sft adapter, which `kl_ref = "init"` reads as its
reference and sibling runs copy); per finished iteration (one with done.json) its small
files (pool, stats, candidates, decisions, evaluation, sidecars, skip and prune markers),
and the newest policy/rm checkpoint (the loop reads no older one once a newer exists).
Left out:
trajectories, judgments and scored steps (the bulk: only on-plan shares and judge views
read them), and an unfinished iteration (it reruns from its start).

    python research/carry.py pack runs/learning-adapt-mid \
        -o research/inflight/learning-adapt-mid.tar.gz
    python research/carry.py unpack research/inflight/learning-adapt-mid.tar.gz
"""

from __future__ import annotations

import argparse
import tarfile
from pathlib import Path

SMALL = ("done.json", "eval.json", "eval.meta.json", "tasks.jsonl", "task_stats.jsonl",
         "task_stats.meta.json", "next_tasks.jsonl", "next_tasks.meta.json",
         "candidates.jsonl", "candidates.meta.json", "decisions.jsonl", "decisions.meta.json")
BIG = ("trajectories", "judgments", "scored", "rm_input", "rollout_tasks")


def members(run: Path) -> list[Path]:
    """The files of one run directory to carry (see the module docstring): of the
    checkpoints, only each kind's newest (the one the next iteration starts from)."""
    out = [p for p in run.iterdir() if p.is_file() and not p.name.startswith(".")]
    warm = run / "warm_start"
    if (warm / "sft" / "rlany.json").exists():  # finished; an unfinished one is remade
        out += [f for f in sorted(warm.rglob("*")) if f.is_file() and not any(
            part.startswith(".") or part.endswith(".partial")
            for part in f.relative_to(warm).parts)]
    finished = [it for it in sorted(run.glob("iter_*")) if (it / "done.json").exists()]
    newest = {kind: next((it / kind for it in reversed(finished)
                          if (it / kind / "rlany.json").exists()), None)
              for kind in ("policy", "rm")}
    for it in finished:  # an unfinished iteration reruns from its start
        for p in it.iterdir():
            keep = (p.name in SMALL or p.name.endswith((".skipped.json", ".pruned"))
                    or p in newest.values())
            if keep and not p.name.startswith(BIG):
                out += [f for f in ([p] if p.is_file() else sorted(p.rglob("*")))
                        if f.is_file()]
    return out


def pack(runs_dir: Path, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for run in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
            for f in members(run):
                tar.add(f, arcname=str(f))
    tmp.replace(output)
    print(f"carry: {output} ({output.stat().st_size / 1e6:.1f} MB)")


def unpack(archive: Path) -> None:
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            if Path(m.name).exists():
                raise SystemExit(f"carry: {m.name} exists here: not overwritten (remove "
                                 "the run directory first, or resume it as it is)")
        tar.extractall(".", filter="data")
    print(f"carry: restored {archive}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("runs_dir", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    u = sub.add_parser("unpack")
    u.add_argument("archive", type=Path)
    args = parser.parse_args()
    if args.command == "pack":
        pack(args.runs_dir, args.output)
    else:
        unpack(args.archive)


if __name__ == "__main__":
    main()

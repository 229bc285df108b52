"""Replay a loop run's reward-model training on its own saved rollouts with other `train-rm`
options, then score every replayed judge on the held-out labelled steps (judge_heldout.py).

Under the outcome target (`score`'s default `rm_target`), what the judge is trained toward
does not depend on the judge: each scored step's target is its episode's outcome. So a
run's `iter_*/scored.jsonl` files fix the reward model's whole data stream, and a replay
with other options is an exact counterfactual for the judge's training on those rollouts
(in a live loop the judge's verdicts would also steer the policy, hence the rollouts: a
replay selects options; live runs confirm them). Costs the train-rm and held-out minutes
only (~5 + 4 per iteration on 2 cores), not the rollout, judge and policy ones.

Each replayed iteration starts from the replay's previous adapter; `--from-iteration K`
starts from the run's own `iter_{K-1}/rm` (it must still be on disk) instead of the base
model. The original options come from each run adapter's `rlany.json` where it is on disk,
else from the nearest later one; `--set key=value` overrides them (train-rm's option names,
snake_case).

    python research/rm_replay.py runs/learning-judge/rm-s2 replay/s2-linear \\
        --from-iteration 2 --set lr_schedule=linear

`--buffer K` trains each iteration on the scored steps of the last K iterations (its own and
the K-1 before it, concatenated into OUT/iter_*/rm_input.jsonl; trajectory ids carry their
iteration, so none repeats): more steps per update of the verdict's bias, which one
iteration's 137-207 steps place poorly (LOG.md, 2026-11-25).

`--summary NAME RUN=REPLAY ...` writes research/results/NAME.json (and .md): for each
pair, the run's final judge and the replay's on the held-out steps, and the mean gain over
the pairs (seeds) with its 95% t-interval, for the run as it ran and for the replay; and
train-rm's seconds, as run over replayed (each optimizer step's own time summed, model
loading left out; the run's train-rm ran inside its loop process).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
SKIP = ("input", "output", "adapter", "iteration")  # the replay's own


def original_options(run: Path, iteration: int) -> dict:
    """train-rm's options of `iteration` (or of the nearest later iteration whose adapter
    the loop kept: the loop passes the same table every iteration)."""
    for it_dir in sorted(run.glob("iter_*")):
        if int(it_dir.name.split("_")[1]) >= iteration:
            meta = it_dir / "rm" / "rlany.json"
            if meta.exists():
                return json.loads(meta.read_text())["options"]
    raise SystemExit(f"{run}: no iter_*/rm/rlany.json at or after iteration {iteration}")


def flags(options: dict) -> list[str]:
    """The train-rm command-line flags of `options` (the I/O ones left out)."""
    out = []
    for key, value in options.items():
        if key in SKIP or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


def _buffered(run: Path, k: int, buffer: int, out_dir: Path) -> Path:
    """Iteration k's training data: its own scored.jsonl, or with buffer > 1 that of the
    last `buffer` iterations (those on disk) concatenated into OUT_DIR/rm_input.jsonl."""
    own = run / f"iter_{k:03d}" / "scored.jsonl"
    if buffer == 1:
        return own
    files = [run / f"iter_{j:03d}" / "scored.jsonl" for j in range(max(0, k - buffer + 1), k + 1)]
    data = out_dir / "rm_input.jsonl"
    texts = [f.read_text() for f in files if f.exists()]
    data.write_text("".join(t if t.endswith("\n") else t + "\n" for t in texts if t))
    return data


def final_judge(run: Path) -> dict:
    d = json.loads((run / "judge_heldout.json").read_text())
    return {"judge": d["final"], **{k: v for k, v in d["judges"][d["final"]].items()
                                    if k != "p_positive"},
            "base_bal_acc": d["judges"]["base"]["bal_acc"]}


def train_seconds(run: Path) -> dict:
    """train-rm's optimizer steps and their seconds (the sum of each step's own time, model
    loading left out) over every iteration of a run or replay (iter_*/rm.metrics.jsonl)."""
    rows = [json.loads(line) for f in sorted(run.glob("iter_*/rm.metrics.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]
    return {"steps": len(rows), "seconds": round(sum(r["seconds"] for r in rows), 1)}


def summary(name: str, pairs: list[str]) -> int:
    """research/results/NAME.json and .md from RUN=REPLAY pairs (one per seed)."""
    from lab import save

    from rlany.api import t_interval

    rows = []
    for pair in pairs:
        run, replay = (Path(x) for x in pair.split("=", 1))
        timed = {"as_run": train_seconds(run), "replayed": train_seconds(replay)}
        if timed["as_run"]["seconds"] and timed["replayed"]["seconds"]:
            timed["speedup"] = round(timed["as_run"]["seconds"] / timed["replayed"]["seconds"], 3)
        rows.append({"run": str(run), "replay": str(replay),
                     "overrides": json.loads((replay / "replay.json").read_text())["overrides"],
                     "as_run": final_judge(run), "replayed": final_judge(replay),
                     "train_rm": timed})

    def mean_gain(key):
        gains = [r[key]["gain"] for r in rows]
        return {"value": round(sum(gains) / len(gains), 4), "ci95": t_interval(gains),
                "per_seed": gains}

    result = {"what": "held-out judge step accuracy (judge_heldout.py), final minus base: each "
                      "run's reward-model training as it ran, and replayed on the same saved "
                      "rollouts with other train-rm options (rm_replay.py)",
              "pairs": rows, "judge_gain_as_run": mean_gain("as_run"),
              "judge_gain_replayed": mean_gain("replayed"),
              # the run's train-rm ran inside its loop, the replay's in its own process, on
              # this machine unless the pairs say otherwise: compare on one host only
              "train_rm_speedup": {
                  "value": round(sum(r["train_rm"]["speedup"] for r in rows) / len(rows), 3),
                  "per_seed": [r["train_rm"]["speedup"] for r in rows]}
              if all(r["train_rm"].get("speedup") for r in rows) else None}
    path = save(name, result)
    lines = ["| run | as run: bal. acc (AUC) | replayed: bal. acc (AUC) | train-rm s: as run / "
             "replayed (steps) | replay options |", "|---|---|---|---|---|"]
    for r in rows:
        a, b, t = r["as_run"], r["replayed"], r["train_rm"]
        lines.append(f"| {Path(r['run']).name} | {a['bal_acc']:.3f} ({a.get('auc', '-')}) | "
                     f"{b['bal_acc']:.3f} ({b.get('auc', '-')}) | "
                     f"{t['as_run']['seconds']:.0f} / {t['replayed']['seconds']:.0f} "
                     f"({t['replayed']['steps']}) | "
                     f"{' '.join(f'{k}={v}' for k, v in r['overrides'].items())} |")
    for key, label in (("judge_gain_as_run", "as run"), ("judge_gain_replayed", "replayed")):
        g = result[key]
        ci = "-" if g["ci95"] is None else f"{g['ci95'][0]:+.3f} to {g['ci95'][1]:+.3f}"
        lines.append(f"\njudge_gain {label}: {g['value']:+.3f} (95% {ci}, {len(rows)} seeds)")
    if result["train_rm_speedup"]:
        lines.append(f"\ntrain-rm seconds, as run over replayed: "
                     f"{result['train_rm_speedup']['value']:.2f}x (per seed "
                     f"{', '.join(f'{v:.2f}' for v in result['train_rm_speedup']['per_seed'])})")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--summary"]:
        if len(argv) < 3:
            raise SystemExit("usage: rm_replay.py --summary NAME RUN=REPLAY [RUN=REPLAY ...]")
        return summary(argv[1], argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a loop run directory (RUN/iter_*/scored.jsonl)")
    ap.add_argument("out", type=Path, help="the replay's directory (OUT/iter_*/rm)")
    ap.add_argument("--from-iteration", type=int, default=0)
    ap.add_argument("--iterations", type=int, help="replay this many (default: all saved)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--buffer", type=int, default=1, metavar="K",
                    help="train each iteration on the last K iterations' scored steps")
    ap.add_argument("--no-heldout", action="store_true", help="train only")
    ap.add_argument("--heldout", choices=("final", "all"), default="final",
                    help="score the last replayed judge only (the default), or each one "
                    "(~4 minutes a judge on 2 cores)")
    args = ap.parse_args(argv)
    overrides = dict(s.split("=", 1) for s in args.set)
    todo = [d for d in sorted(args.run.glob("iter_*"))
            if int(d.name.split("_")[1]) >= args.from_iteration
            and (d / "scored.jsonl").exists()][:args.iterations]
    if not todo:
        raise SystemExit(f"{args.run}: no iter_*/scored.jsonl from iteration "
                         f"{args.from_iteration}")
    first = args.from_iteration
    adapter = (args.run / f"iter_{first - 1:03d}" / "rm") if first else None
    if adapter is not None and not (adapter / "adapter_config.json").exists():
        raise SystemExit(f"{adapter}: not on disk (the loop keeps the last keep_last)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.buffer < 1:
        raise SystemExit("--buffer: at least 1 (the iteration's own steps)")
    if args.buffer > 1:
        overrides["buffer"] = args.buffer  # recorded with the replay's options
    record = {"run": str(args.run), "from_iteration": first, "overrides": overrides,
              "iterations": []}
    for it_dir in todo:
        k = int(it_dir.name.split("_")[1])
        options = {**original_options(args.run, k), **overrides}
        options.pop("buffer", None)  # the replay's, not train-rm's
        out = args.out / it_dir.name / "rm"
        if not (out / "adapter_config.json").exists():
            (args.out / it_dir.name).mkdir(exist_ok=True)
            data = _buffered(args.run, k, args.buffer, args.out / it_dir.name)
            cmd = [sys.executable, "-m", "rlany", "train-rm", "-i", str(data),
                   "-o", str(out), "--iteration", str(k), *flags(options)]
            if adapter is not None:
                cmd += ["--adapter", str(adapter)]
            subprocess.run(cmd, check=True)  # its metrics: OUT/iter_*/rm.metrics.jsonl
        adapter = out
        record["iterations"].append({"iteration": k, "options": options})
    (args.out / "replay.json").write_text(json.dumps(record, indent=1) + "\n")
    if not args.no_heldout:
        base = args.run.parent / "judge_heldout_base.json"
        mine = args.out.parent / "judge_heldout_base.json"
        if base.exists() and not mine.exists():
            mine.write_text(base.read_text())
        only = [] if args.heldout == "all" else ["--only", todo[-1].name]
        subprocess.run([sys.executable, str(HERE / "judge_heldout.py"), str(args.out), *only],
                       check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

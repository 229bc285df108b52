"""Defaults from evidence: policy-only RL runs of one loop config, one knob varied at a
time around the config's values, each run the loop's own (resumable) run directory.

    python research/sweep.py --vary train_policy.lr=1e-4,1e-3 --vary rollout.n=4
    python research/sweep.py --vary train_policy.target_modules=all-linear --seeds 0 1
    python research/sweep.py --report-only --readme

Every knob value is one run per seed (runs/sweep/KEY=VALUE-sSEED), plus the config as it is
(runs/sweep/default-sSEED), all policy-only (outcome reward, fixed judge and tasks) so the
knob is the only difference. Reports per run: train accuracy per iteration, held-out success
(base and final, 95% Wilson), the difference to the default run of the same seed (95%
Newcombe) and the stage minutes. A knob value is better only where that interval is clear
of 0; with 128 held-out episodes per evaluation, differences under ~0.1 are not resolved.
Writes research/results/sweep.json and sweep.md; `--readme` puts the table into
research/README.md.
Run it alone on the machine: two CPU-heavy processes on 2 cores each run ~7x slower.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import RESULTS, check_name, save, write_readme_block  # noqa: E402
from learning import ARMS, run_loop  # noqa: E402
from learning_summary import summarize_run  # noqa: E402

from rlany.api import gain_interval  # noqa: E402

DEFAULT = "default"
# what a policy-only run's outcome depends on; a default run borrowed from elsewhere
# (--default-from) must agree on all of it
POLICY_KEYS = ("iterations", "eval_every", "tasks", "eval_tasks", "run", "step_feedback",
               "rm_training", "env_adaptation")
EVAL_KEYS = ("n", "max_steps", "max_tokens", "temperature", "history_turns",
             "constrain_actions")


def policy_config(c: dict) -> dict:
    t = c.get("tables", {})
    score = {k: v for k, v in (t.get("score") or {}).items() if k != "lam"}  # lam: no judge
    return {**{k: c.get(k) for k in POLICY_KEYS}, "rollout": t.get("rollout"),
            "train_policy": t.get("train_policy"), "score": score,
            "eval": {k: t.get("eval", {}).get(k) for k in EVAL_KEYS}}


RUN = re.compile(r"^(.+)-s(\d+)$")


def knob_value(config: dict | None, knob: str, fallback: str) -> str:
    """A knob's value in a run's resolved config (TABLE.KEY, a top-level key, or run.KEY)."""
    if not config:
        return fallback
    section, _, key = knob.partition(".")
    if key:
        value = config.get("tables", {}).get(section, {}).get(key)
    else:
        value = config.get(knob, config.get("run", {}).get(knob))
    return fallback if value is None else str(value)


def run_name(knob: str | None, value: str | None, seed: int) -> str:
    if knob is None:
        return f"{DEFAULT}-s{seed}"
    return re.sub(r"[^A-Za-z0-9_.=-]", "+", f"{knob}={value}") + f"-s{seed}"


def parse_vary(items: list[str]) -> list[tuple[str, str]]:
    points = []
    for item in items:
        knob, sep, values = item.partition("=")
        if not sep or not knob or not values:
            raise SystemExit(f"--vary {item!r}: expected KEY=V1[;V2...]")
        # values split on ';' where given (LoRA targets contain commas), else on ','
        points += [(knob, v.strip()) for v in values.split(";" if ";" in values else ",")
                   if v.strip()]
    return points


def check_default(default: Path, config: str, seed: int) -> None:
    """The borrowed default run must have this config's policy settings (its judge and
    reward-model settings are unused in a policy-only run and may differ)."""
    import dataclasses

    from rlany.api import load_config

    if not (default / "config.json").exists():
        raise SystemExit(f"--default-from: no run {default} (its config.json is missing)")
    cfg = load_config(config, {"seed": seed, "step_feedback": False, "rm_training": False,
                               "env_adaptation": False})
    fresh = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    a = policy_config(json.loads((default / "config.json").read_text()))
    b = policy_config(fresh)
    if a != b:
        diff = sorted(k for k in a if a[k] != b[k])
        raise SystemExit(f"{default} is not this sweep's default run: it differs from "
                         f"{config} in {', '.join(diff)}")


def row(knob: str | None, value: str | None, run: dict, default: dict | None) -> dict:
    f, b = run["final"], run["base"]
    out = {"knob": knob or DEFAULT, "value": value, "seed": run["seed"], "run": run["run"],
           "iterations": f["iteration"] + 1, "train_acc": run["train_acc"],
           "base": b["success"], "final": f["success"], "episodes": f["episodes"],
           "gain": f["success"] - b["success"],
           "gain_ci95": gain_interval(f["successes"], f["episodes"], b["successes"],
                                      b["episodes"]),
           "minutes": round(run["seconds"] / 60, 1)}
    if default is not None and knob is not None:
        d = default["final"]
        out["vs_default"] = f["success"] - d["success"]
        out["vs_default_ci95"] = gain_interval(f["successes"], f["episodes"], d["successes"],
                                               d["episodes"])
    return out


def table(rows: list[dict]) -> str:
    lines = ["| knob | value | seed | iterations | train accuracy per iteration | held-out "
             "base -> final | gain (95%) | vs default (95%) | stage min |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = " / ".join("-" if a is None else f"{a:.2f}" for a in r["train_acc"])
        vs = (f"{r['vs_default']:+.3f} ({r['vs_default_ci95'][0]:+.2f} to "
              f"{r['vs_default_ci95'][1]:+.2f})" if "vs_default" in r else "")
        lines.append(f"| {r['knob']} | {r['value'] or '(config)'} | {r['seed']} | "
                     f"{r['iterations']} | {acc} | {r['base']:.3f} -> {r['final']:.3f} | "
                     f"{r['gain']:+.3f} ({r['gain_ci95'][0]:+.2f} to {r['gain_ci95'][1]:+.2f})"
                     f" | {vs} | {r['minutes']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="examples/household/learn.toml")
    parser.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                        help="a loop config key and its values (';'-separated where a value "
                        "has commas); repeatable, one knob varied at a time")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--bench", default="sweep",
                        help="the results' name: research/results/BENCH.json and .md, "
                        "runs/BENCH, research/README.md block BENCH-table; another config "
                        "needs its own, e.g. --bench sweep-reasoning")
    parser.add_argument("--runs-dir", help="default: runs/BENCH")
    parser.add_argument("--default-from", metavar="DIR",
                        help="take the default runs from DIR/policy-only-sSEED (the learning "
                        "benchmark's) instead of running them; their policy settings must "
                        "equal a fresh default run's")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: summarize the runs under --runs-dir")
    parser.add_argument("--readme", action="store_true",
                        help="write the table into research/README.md")
    args = parser.parse_args()
    check_name(parser, "--bench", args.bench)
    if args.bench == "sweep" and args.config != parser.get_default("config"):
        parser.error("another --config needs its own --bench (its results would replace "
                     "the household sweep's)")
    points = parse_vary(args.vary)
    runs_dir = Path(args.runs_dir or f"runs/{args.bench}")
    seeds = list(args.seeds)
    if args.report_only:  # every run the directory holds, whatever was varied, every seed
        points, seeds = [], sorted({int(m[2]) for d in runs_dir.glob("*-s*")
                                    if (m := RUN.match(d.name))})
        for d in sorted(runs_dir.glob("*-s*")):
            m = RUN.match(d.name)
            if m and m[1] != DEFAULT and "=" in m[1]:
                point = tuple(m[1].split("=", 1))
                if point not in points:
                    points.append(point)
    started = time.perf_counter()
    rows = []
    for seed in seeds:
        default = None
        for knob, value in [(None, None)] + points:
            name = run_name(knob, value, seed)
            run = runs_dir / name
            if knob is None and args.default_from:
                run = Path(args.default_from) / f"policy-only-s{seed}"
                check_default(run, args.config, seed)
            elif not args.report_only:
                run_loop(args.config, name, seed, ARMS["policy-only"], str(runs_dir),
                         [] if knob is None else [f"{knob}={value}"])
            summary = summarize_run(run)
            if not summary or len(summary["curve"]) < 2:
                continue
            summary["seed"] = seed
            if knob is None:
                default = summary
            else:  # the value the run ran with (a directory name cannot hold every value)
                value = knob_value(summary["config"], knob, value)
            rows.append(row(knob, value, summary, default))
    if not rows:
        raise SystemExit(f"no evaluated runs under {runs_dir}")
    text = table(rows)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.bench}.md").write_text(text)
    if args.readme:
        write_readme_block(f"{args.bench}-table", text)
    result = {"metric": "held-out success of policy-only runs, one knob varied at a time",
              "config": args.config, "rows": rows,
              "seconds": round(time.perf_counter() - started, 1),
              "note": "run alone on the machine (one CPU-heavy process at a time)"}
    save(args.bench, result)
    return result


if __name__ == "__main__":
    main()

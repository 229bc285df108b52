"""The ablation experiment (the paper's Table 1, at CPU scale): does each dynamic component
help? Four runs of the same loop config per seed, each adding one component:

    policy-only   outcome reward only (lambda = 0), fixed judge, fixed tasks
    +step         + integrated step feedback from the (fixed) reward model
    +rm           + reward-model training (consistency feedback)
    +env          + environment adaptation (the full RLAnything loop)

All four start from the same base model and evaluate on the same held-out tasks
(`eval_base.json` is the base model, the first row of the table). Writes
bench-results/learning.json and a comparison report (`rlany report`, plots + table).

    python benchmarks/learning.py --config examples/household/loop.toml --iterations 2 --seeds 0
It takes a while (each run is a full loop: ~10-15 min per run on 2 CPU cores with the
household demo config). Report what happens, whatever it is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, save  # noqa: E402

VARIANTS = {
    "policy-only": ["--no-step-feedback", "--no-rm-training", "--no-env-adaptation"],
    "+step": ["--step-feedback", "--no-rm-training", "--no-env-adaptation"],
    "+rm": ["--step-feedback", "--rm-training", "--no-env-adaptation"],
    "+env": ["--step-feedback", "--rm-training", "--env-adaptation"],
}


def run_loop(config: str, name: str, iterations: int, seed: int, flags: list[str],
             runs_dir: str) -> float:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "rlany", "loop", config, "--name", name, "--iterations",
           str(iterations), "--seed", str(seed), "--runs-dir", runs_dir, *flags]
    print("$ " + " ".join(cmd[2:]), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0:
        raise SystemExit(f"the {name} run failed (exit {r.returncode}); rerun to resume it")
    return time.perf_counter() - t0


def summarize(run: Path, iterations: int) -> dict:
    base = json.loads((run / "eval_base.json").read_text())
    last = json.loads((run / f"iter_{iterations - 1:03d}" / "eval.json").read_text())
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    def pick(e: dict) -> dict:
        return {k: e.get(k) for k in ("success_rate", "pass@1", "pass@4", "mean_steps",
                                      "judge_step_accuracy", "judge_outcome_agreement",
                                      "judge_parse_fail_rate")}
    return {"base": pick(base), "final": pick(last),
            "accepted_tasks": sum(m.get("accepted_tasks", 0) or 0 for m in metrics),
            "train_acc": [m.get("train_acc") for m in metrics]}


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="examples/household/loop.toml")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--reuse", action="append", default=[], metavar="VARIANT=RUN_DIR",
                        help="use a finished run of this config for one variant (e.g. "
                        "+env=runs/demo: `make demo` is the full loop with seed 0)")
    args = parser.parse_args()
    reuse = dict(item.split("=", 1) for item in args.reuse)
    rows, seconds, runs = {}, {}, []
    for seed in args.seeds:
        for variant, flags in VARIANTS.items():
            name = f"learn-{variant.strip('+')}-s{seed}"
            run = Path(args.runs_dir) / name
            if variant in reuse and seed == args.seeds[0]:
                run = Path(reuse[variant])
                seconds[name] = None
            else:
                seconds[name] = round(run_loop(args.config, name, args.iterations, seed,
                                               flags, args.runs_dir), 1)
            rows[name] = {"variant": variant, "seed": seed, "run": str(run),
                          **summarize(run, args.iterations)}
            runs.append(str(run))
    report = RESULTS / "learning-report"
    subprocess.run([sys.executable, "-m", "rlany", "report", *runs, "-o", str(report)],
                   check=True)

    print(f"{'run':<24} {'eval success':>22} {'judge step acc':>20} {'accepted':>9}")
    for name, row in rows.items():
        b, f = row["base"], row["final"]
        judge = (f"{b['judge_step_accuracy'] or 0:.3f} -> {f['judge_step_accuracy'] or 0:.3f}")
        print(f"{name:<24} {b['success_rate']:>9.3f} -> {f['success_rate']:<9.3f} "
              f"{judge:>20} {row['accepted_tasks']:>9}")
    result = {"metric": "held-out eval success per ablation (base -> final)",
              "config": args.config, "iterations": args.iterations, "seeds": args.seeds,
              "runs": rows, "seconds": seconds, "report": str(report / "report.md")}
    save("learning", result)
    return result


if __name__ == "__main__":
    main()

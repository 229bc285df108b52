"""One model in memory: a loop process's peak memory with the trainer borrowing the hf
engine's network, against the trainer loading its own copy (what every training stage did
before). The work is the loop's: the engine starts and generates, then `train-policy` runs
on a household rollout's scored data (SmolLM2-135M-Instruct, learn.toml's LoRA settings).

Each mode runs in a fresh process (peak RSS is per process), alternated, `--repeats` times:
    python benchmarks/bench_memory.py [--repeats 2] [--max-steps 4]
Writes benchmarks/results/memory.json. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402

TASKS = "examples/household/learn_tasks.jsonl"


def prepare(work: Path) -> Path:
    """A scored file from one rollout of 16 household tasks x 8 (outcome reward)."""
    scored = work / "scored.jsonl"
    if scored.exists():
        return scored
    rlany = [sys.executable, "-m", "rlany"]
    subprocess.run([*rlany, "rollout", "-i", TASKS, "-o", str(work / "traj.jsonl"),
                    "--model", "smollm2", "--n", "8", "--sample-tasks", "16", "--max-steps",
                    "4", "--max-tokens", "16", "--temperature", "1.0", "--history-turns", "1",
                    "--constrain-actions"], check=True)
    subprocess.run([*rlany, "score", "-i", str(work / "traj.jsonl"), "-o", str(scored)],
                   check=True)
    return scored


def one(mode: str, scored: str, out: str, max_steps: int) -> dict:
    """In this process: the engine starts and generates, then train-policy runs."""
    from rlany.compat import resolve_dtype
    from rlany.engines.base import EngineConfig, Request, Sampling
    from rlany.engines.hf import HfEngine
    from rlany.models import resolve_model
    from rlany.stages.train_policy import TrainOptions, run

    model = resolve_model("smollm2")
    engine = HfEngine(EngineConfig(kind="hf", model=model, dtype=resolve_dtype("auto")))
    engine.generate([Request([{"role": "user", "content": "Say hello."}],
                             Sampling(n=8, max_tokens=16, temperature=1.0, seed=0))])
    after_engine = _rss_mb()
    opts = TrainOptions(input=scored, output=out, model=model, lr=3e-4, micro_batch=8,
                        target_modules="q_proj,v_proj", max_steps=max_steps, seed=0)
    t0 = time.perf_counter()
    run(opts, say=lambda s: None, engine=engine if mode == "engine" else None)
    seconds = time.perf_counter() - t0
    base_from = json.loads((Path(out) / "rlany.json").read_text())["base_from"]
    return {"mode": mode, "base_from": base_from, "train_seconds": round(seconds, 2),
            "rss_after_engine_mb": after_engine,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def _rss_mb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024)
    return -1


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--one", nargs=3, metavar=("MODE", "SCORED", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one, args.max_steps)))
        return {}
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        scored = prepare(Path(tmp))
        for k in range(args.repeats):
            for mode in ("disk", "engine"):
                out = str(Path(tmp) / f"ckpt-{mode}-{k}")
                line = subprocess.run([sys.executable, __file__, "--one", mode, str(scored), out,
                                       "--max-steps", str(args.max_steps)], env=env,
                                      check=True, capture_output=True, text=True).stdout
                runs.append(json.loads(line.strip().splitlines()[-1]))
                print(runs[-1], file=sys.stderr)

    def med(mode, key):
        return statistics.median(r[key] for r in runs if r["mode"] == mode)
    result = {"metric": "peak RSS (MB) of one process: hf engine + train-policy",
              "runs": runs,
              "peak_rss_mb": {m: med(m, "peak_rss_mb") for m in ("disk", "engine")},
              "train_seconds": {m: med(m, "train_seconds") for m in ("disk", "engine")},
              "saved_mb": med("disk", "peak_rss_mb") - med("engine", "peak_rss_mb"),
              "note": "run alone on the machine; median over repeats"}
    print(json.dumps({k: result[k] for k in ("peak_rss_mb", "train_seconds", "saved_mb")}))
    save("memory", result)
    return result


if __name__ == "__main__":
    main()

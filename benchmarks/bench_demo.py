"""`make demo` end to end: its wall time on this CPU setting, what it learned, and its
rollouts' seconds per generated token.

Runs `examples/demo.sh` (the model prepared first, so its one-time conversion is not
counted) under a fresh run name, times it, and reads the run: base and final held-out
success, the gain's 95% interval, seconds per stage, and per iteration the rollout's
generate seconds and generated tokens (its sidecar `iter_NNN/trajectories.meta.json`), with
iterations 1..N's seconds per token (the policy's adapter) over iteration 0's (the base
model): issue 65's target <= 1.05. An AVX2-forced run adds `avx2_estimate`: the goal <= 10
minutes on a real AVX2 CPU, stated as an estimate with how it is made. The CPU is the
result's `machine` block. Results: `results/demo-SETTING.json`, SETTING as
`common.cpu_setting` names it, so an AVX-512 + bf16 machine, an AVX2 one and this machine
with AVX2 forced each keep their own file (`examples/demo.sh` states the one matching its
machine, `--expected`):

    python benchmarks/bench_demo.py                              # this CPU as it is
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/bench_demo.py                          # an AVX2 CPU's kernels, fp32

The target (issue "Fast on every CPU"): at most 15 minutes on a 2-core AVX2 machine. Run
it alone on the machine. A finished run is not timed again (choose another --name); a
killed one resumes when rerun with the same --name, and then its minutes count only the
rerun: the result says `resumed` and claims no target.
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
from common import check_name, cpu_label, cpu_setting, save  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"  # the committed ones, which demo.sh states
TARGET_MIN = 15
PER_TOKEN_TARGET = 1.05  # issue 65: a rollout with the adapter against the base model's
AVX2_GOAL_MIN = 10  # issue 65: make demo on a real 2-core AVX2 CPU
# No results file records make demo on a real AVX2 CPU. Two files time the same training
# steps (real household RL samples) on a real 2-core AVX2 CPU and with AVX2 forced here:
# their ratio scales the forced run's minutes into the estimate.
SCALE_FILES = ("shared_prefix-avx2-float32.json", "shared_prefix-avx2forced-float32.json")


def avx2_scale(results: Path = RESULTS) -> dict | None:
    """Real AVX2 / AVX2 forced, seconds per optimizer step of the same samples (shared
    prefixes, the trainer's default, and the plain batch): the range of the estimate."""
    try:
        real, forced = (json.loads((results / f).read_text())["seconds_per_step"]
                        for f in SCALE_FILES)
    except (OSError, KeyError, ValueError):
        return None
    return {"low": round(min(real[k] / forced[k] for k in ("shared", "plain")), 2),
            "high": round(max(real[k] / forced[k] for k in ("shared", "plain")), 2),
            "files": list(SCALE_FILES)}


def successes(path: Path) -> tuple[int, int]:
    """(successes, episodes) of an `rlany eval` summary (eval.json)."""
    e = json.loads(path.read_text())
    return round(e["success_rate"] * e["trajectories"]), e["trajectories"]


def rollout_figures(run: Path) -> list[dict]:
    """Per iteration of `run` whose rollout generated: its generate seconds and generated
    (completion) tokens, as its sidecar iter_NNN/trajectories.meta.json counts them (a
    resumed rollout: its new trajectories only, both alike), and seconds per token."""
    from rlany.files.provenance import sidecar

    figures = []
    for d in sorted(run.glob("iter_[0-9][0-9][0-9]")):
        counts = (sidecar(d / "trajectories.jsonl") or {}).get("counts") or {}
        seconds, tokens = counts.get("generate_seconds"), counts.get("completion_tokens")
        if seconds is not None and tokens:
            figures.append({"iteration": int(d.name[5:]), "generate_seconds": seconds,
                            "completion_tokens": tokens,
                            "seconds_per_token": round(seconds / tokens, 5)})
    return figures


def per_token(figures: list[dict]) -> dict:
    """Iterations 1..N's rollout seconds per generated token over iteration 0's, each
    against PER_TOKEN_TARGET (met: every one; None without iteration 0 or a later one)."""
    base = next((f for f in figures if f["iteration"] == 0), None)
    ratios = {f"iter_{f['iteration']:03d}": round(f["seconds_per_token"]
                                                  / base["seconds_per_token"], 3)
              for f in figures if base and f["iteration"] > 0}
    return {"rollouts": figures, "over_iteration_0": ratios,
            "target": f"<= {PER_TOKEN_TARGET}",
            "met": max(ratios.values()) <= PER_TOKEN_TARGET if ratios else None}


def avx2_estimate(minutes: float, resumed: bool, results: Path = RESULTS) -> dict:
    """Issue 65's goal on a real AVX2 CPU, estimated from an AVX2-forced run's minutes
    scaled by `avx2_scale` (met: its upper end within the goal)."""
    scale = avx2_scale(results)
    if scale is None:
        return {"minutes": None, "goal": f"<= {AVX2_GOAL_MIN} min on a real AVX2 CPU",
                "met": None, "estimate": True, "how": "no files to scale the forced minutes by"}
    low, high = (round(minutes * scale[k], 1) for k in ("low", "high"))
    return {"minutes": [low, high], "goal": f"<= {AVX2_GOAL_MIN} min on a real AVX2 CPU",
            "met": None if resumed else high <= AVX2_GOAL_MIN, "estimate": True,
            "how": f"the forced run's {minutes:.1f} min x {scale['low']}-{scale['high']}, a "
                   "training step's seconds on a real 2-core AVX2 CPU over AVX2 forced here "
                   f"(same samples: {', '.join(scale['files'])}); generation scaled alike "
                   "(an estimate, not a measurement)"}


def expected(setting: str, results: Path = RESULTS) -> str:
    """What `make demo` says it takes here: the committed demo-SETTING.json's minutes and
    CPU, else that no file measured this setting (a real AVX2 CPU: the forced run's
    estimate, where its file has one)."""
    path = results / f"demo-{setting}.json"
    if path.is_file():
        r = json.loads(path.read_text())
        m = r.get("machine") or {}
        cpu = ", ".join(str(x) for x in (m.get("cpu_model"), cpu_label(m)) if x)
        return (f"demo: about {r['minutes']:.0f} minutes on this CPU setting: {r['minutes']} "
                f"measured ({m.get('cpus')} cores, {cpu}, {str(m.get('date'))[:10]}, "
                f"benchmarks/results/{path.name})")
    forced = results / "demo-avx2forced-float32.json"
    guess = (json.loads(forced.read_text()).get("avx2_estimate")
             if setting == "avx2-float32" and forced.is_file() else None)
    return (f"demo: no measured time for this CPU setting ({setting})"
            + (f"; estimated {guess['minutes'][0]}-{guess['minutes'][1]} min from AVX2 kernels "
               "forced on an AVX-512 CPU (an estimate)" if guess and guess["minutes"] else ""))


def main() -> None:
    from rlany.compat import resolve_dtype
    from rlany.stats import gain_interval

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", help="the run's name under runs/ (default demo-bench-SETTING)")
    ap.add_argument("--expected", action="store_true",
                    help="print what make demo takes on this CPU setting, from the committed "
                         "results/demo-SETTING.json, and exit (examples/demo.sh's first line)")
    a = ap.parse_args()
    setting, switches = cpu_setting(resolve_dtype("auto"))
    if a.expected:
        print(expected(setting))
        return
    name = a.name or f"demo-bench-{setting}"
    check_name(ap, "--name", name)
    run = ROOT / "runs" / name
    if sorted(run.glob("iter_*/eval.json")):
        ap.error(f"runs/{name} has finished: timing it again would time nothing; "
                 "choose another --name")
    resumed = run.exists()
    subprocess.run([sys.executable, "-m", "rlany", "models", "prepare", "smollm2"], check=True,
                   stdout=subprocess.DEVNULL)
    t0 = time.time()
    subprocess.run(["bash", str(ROOT / "examples/demo.sh")], check=True, cwd=ROOT,
                   env={**{k: v for k, v in os.environ.items() if k != "DEMO_CONFIG"},
                        "DEMO_NAME": name})  # the demo as `make demo` runs it
    minutes = (time.time() - t0) / 60
    (k0, n0), (k1, n1) = (successes(run / "eval_base.json"),
                          successes(sorted(run.glob("iter_*/eval.json"))[-1]))
    interval = gain_interval(k1, n1, k0, n0)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    stages: dict[str, float] = {}
    for row in rows:
        for stage, s in row.get("seconds", {}).items():
            stages[stage] = round(stages.get(stage, 0) + s, 1)
    tokens = per_token(rollout_figures(run))
    forced = any(switches.values())
    path = save(f"demo-{setting}", {
        "metric": "make demo: minutes end to end (2 cores), and the held-out gain",
        "minutes": round(minutes, 1), "target_minutes": TARGET_MIN,
        "target": f"<= {TARGET_MIN} min, gain beyond noise",
        "met": None if resumed else minutes <= TARGET_MIN and bool(interval and interval[0] > 0),
        "resumed": resumed, "isa_switches": switches, "run": f"runs/{name}",
        "base": {"successes": k0, "episodes": n0}, "final": {"successes": k1, "episodes": n1},
        "gain": round(k1 / n1 - k0 / n0, 4), "gain_ci95": interval,
        "seconds_by_stage": stages, "iterations": len(rows), "per_token": tokens,
        **({"avx2_estimate": avx2_estimate(minutes, resumed)} if forced else {})})
    cpu = json.loads(path.read_text())["machine"].get("cpu_model")
    ratios = ", ".join(f"{k} {v}" for k, v in tokens["over_iteration_0"].items())
    print(f"demo [{setting}, {cpu}]: {minutes:.1f} min, held-out {k0}/{n0} -> {k1}/{n1}, gain "
          f"{k1 / n1 - k0 / n0:+.3f} (95% {interval}); rollout seconds per token over "
          f"iteration 0's: {ratios or 'none'} (target {tokens['target']}) -> {path}")


if __name__ == "__main__":
    main()

"""The learning benchmark (the paper's Table 1 at CPU scale): does the loop learn, and does
each dynamic component help? Runs of one loop config per (arm, seed), each arm adding one
component:

    policy-only   outcome reward only (lambda = 0), fixed judge, fixed tasks
    +step         + integrated step feedback from the (fixed) reward model
    +rm           + reward-model training (consistency feedback)
    full          + environment adaptation (the whole RLAnything loop)

Every run evaluates the base model and then the policy every `eval_every` iterations on the
same held-out tasks (the config's [eval]: 32 tasks x 4 episodes = 128 per evaluation).
Success is pooled over seeds with a 95% Wilson interval; an arm's gain over the base model
has a 95% Newcombe (hybrid score) interval, and the per-seed values are listed so the
spread between seeds is visible. Also: the judge's step accuracy against the environment's
step labels (arms with a judge), accepted tasks per iteration (full), seconds per run.

Runs are the loop's own run directories (runs/learning/ARM-sSEED): a killed or interrupted
benchmark resumes where it stopped, and `--report-only` summarizes whatever is complete.
Writes benchmarks/results/learning.json, learning.md (the table) and learning-report/
(`rlany report`: plots of every run); `--readme` puts the table into benchmarks/README.md.
The reduced version (a smoke run of the whole benchmark: policy-only and full, seed 0, 2
iterations) has its own runs (runs/learning-reduced) and results (learning-reduced.*), so it
never resumes or overwrites the full benchmark's.

    python benchmarks/learning.py                       # policy-only and full, seeds 0 1 2
    python benchmarks/learning.py --reduced             # seed 0, 2 iterations: ~25 min here
    python benchmarks/learning.py --arms +step +rm --seeds 0
    python benchmarks/learning.py --arms +rm --tag balance --set score.rm_balance=true
    python benchmarks/learning.py --arms policy-only full --seeds 0 --warm-start
    python benchmarks/learning.py --report-only --readme

With --warm-start every run starts from a warm start (rows "ARM [warm]"), the loop's
`warm_start = true`: the env's expert demonstrations on the config's task pool, in the
prompts its rollout gives the policy (`rlany rollout --expert`), and `rlany sft` on them with
the policy's LoRA shape (RUN/warm_start/). Such a row adds the warm start's own held-out
success (eval_init.json) and RL's gain over it. With --judge-warm-start the judge starts
from a supervised one (rows "ARM [judge-warm]", the loop's `judge_warm_start = true`); its
held-out step accuracy is judge_heldout.py's "warm" judge. `judge_gain` counts only the
untagged +rm arm (consistency feedback alone, no labels anywhere).
Run it alone on the machine: two CPU-heavy processes on 2 cores each run ~7x slower.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from itertools import zip_longest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, check_name, save, write_readme_block  # noqa: E402

from rlany.stages.eval import gain_interval, wilson_interval  # noqa: E402

HOUSEHOLD_LEARN = "household/learn.toml"  # judge_heldout.py's steps are this config's
JUDGED_EVAL = ["--set", "eval.judge=true"]  # arms with a judge: its step accuracy, base and final
ARMS = {
    "policy-only": ["--no-step-feedback", "--no-rm-training", "--no-env-adaptation"],
    "+step": ["--step-feedback", "--no-rm-training", "--no-env-adaptation", *JUDGED_EVAL],
    "+rm": ["--step-feedback", "--rm-training", "--no-env-adaptation", *JUDGED_EVAL],
    "full": ["--step-feedback", "--rm-training", "--env-adaptation", *JUDGED_EVAL],
}


def rlany(*args: str, what: str | None = None) -> None:
    """Run one rlany command in its own process, printed first; a failure stops the
    benchmark (`what` names it in the message), whose rerun resumes it."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "TOKENIZERS_PARALLELISM": "false"}
    print("$ rlany " + " ".join(args), file=sys.stderr, flush=True)
    if subprocess.run([sys.executable, "-m", "rlany", *args], env=env).returncode != 0:
        raise SystemExit(f"{what or 'rlany ' + args[0]} failed; rerun the benchmark to "
                         "resume it")


def run_loop(config: str, name: str, seed: int, flags: list[str], runs_dir: str,
             sets: list[str]) -> None:
    rlany("loop", config, "--name", name, "--seed", str(seed), "--runs-dir", runs_dir, *flags,
          *[a for s in sets for a in ("--set", s)], what=f"the {name} run")


def _eval(path: Path) -> dict | None:
    if not path.exists():
        return None
    e = json.loads(path.read_text())
    n = e["trajectories"]
    return {"successes": round(e["success_rate"] * n), "episodes": n,
            "success": e["success_rate"], "judge_step_accuracy": e.get("judge_step_accuracy")}


def heldout_summary(path: Path) -> dict | None:
    """judge_heldout.py's result without its per-step P(+1) lists (they stay in the run)."""
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    for j in d["judges"].values():
        j.pop("p_positive", None)
    return d


def judge_on_rollouts(it_dir: Path) -> dict | None:
    """The judge's verdicts on one iteration's rollouts against the env's step labels
    (balanced accuracy) and its share of +1 verdicts, read from the iteration's files (so
    runs made before the judge stage reported it are covered too)."""
    from rlany.jsonl import JsonlReader
    from rlany.records import JudgeSample, Judgment, Trajectory
    from rlany.stages.eval import judge_metrics

    if not (it_dir / "judgments.jsonl").exists():
        return None
    trajs = {t.traj_id: t for _, t in JsonlReader(it_dir / "trajectories.jsonl", Trajectory,
                                                   "trajectories")}
    judged = [j for _, j in JsonlReader(it_dir / "judgments.jsonl", Judgment, "judgments")
              if j.steps]
    judged_trajs = [trajs[j.traj_id] for j in judged]
    m = judge_metrics(judged_trajs, judged)
    # the consistency target's own agreement with the labels: a judge that gave every step
    # its trajectory's outcome (what consistency feedback pulls toward) would score this
    oracle = [replace(j, steps=[replace(st, samples=[JudgeSample(text="", score=t.outcome)])
                                for st in j.steps]) for j, t in zip(judged, judged_trajs)]
    scores = [s.score for j in judged for st in j.steps for s in st.samples if s.score]
    return {"label_accuracy": m["judge_step_accuracy"],
            "outcome_label_accuracy": judge_metrics(judged_trajs, oracle)["judge_step_accuracy"],
            "positive_share": sum(v == 1 for v in scores) / len(scores) if scores else None}


def summarize_run(run: Path) -> dict | None:
    """Base and latest evaluation, the curve, and the loop's per-iteration metrics."""
    base = _eval(run / "eval_base.json")
    if base is None:
        return None
    init = _eval(run / "eval_init.json")  # the warm start, where there is one
    curve = [{"iteration": -1, **base}]
    for it_dir in sorted(run.glob("iter_*")):
        e = _eval(it_dir / "eval.json")
        if e:
            curve.append({"iteration": int(it_dir.name[5:]), **e})
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
               ] if (run / "metrics.jsonl").exists() else []
    return {"run": str(run), "iterations_done": len(metrics), "base": base, "init": init,
            "final": curve[-1],
            "curve": curve, "train_acc": [m.get("train_acc") for m in metrics],
            "accepted_tasks": [m.get("accepted_tasks") or 0 for m in metrics],
            "rm_samples": [m.get("rm_samples") for m in metrics],
            "stage_seconds": [m.get("seconds") for m in metrics],
            "judge_on_rollouts": [judge_on_rollouts(d) for d in sorted(run.glob("iter_*"))],
            "seconds": round(sum(sum((m.get("seconds") or {}).values()) for m in metrics), 1),
            # base and trained judges on fixed held-out labelled steps (judge_heldout.py)
            "judge_heldout": heldout_summary(run / "judge_heldout.json"),
            # the run's own resolved config: what it ran with, also under --report-only
            "config": json.loads((run / "config.json").read_text())
            if (run / "config.json").exists() else None}


RUN_NAME = re.compile(r"^(policy-only|step|rm|full)(?:-(.+))?-s(\d+)$")


def collect(runs_dir: Path) -> dict[str, list[dict]]:
    """Every run under runs_dir evaluated after training at least once, by arm (a tagged
    variant is its own row, "ARM [TAG]"), in the arms' order, seeds ascending."""
    found = []
    for d in runs_dir.iterdir() if runs_dir.is_dir() else []:
        m = RUN_NAME.match(d.name)
        if m:
            arm = next(a for a in ARMS if a.strip("+") == m[1])
            found.append((list(ARMS).index(arm), m[2] or "", int(m[3]), arm, d))
    by_arm: dict[str, list[dict]] = {}
    for _, tag, seed, arm, d in sorted(found, key=lambda f: f[:3]):
        summary = summarize_run(d)
        if summary and len(summary["curve"]) > 1:
            by_arm.setdefault(f"{arm} [{tag}]" if tag else arm, []).append(
                {"seed": seed, **summary})
    return by_arm


T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262}  # Student's t, 97.5th percentile, by degrees of freedom


def _t_interval(values: list[float]) -> list[float] | None:
    """95% t-interval of the mean over seeds (the spread between seeds, which the pooled
    Wilson interval does not see); None below 2 seeds."""
    n = len(values)
    if n < 2:
        return None
    m = sum(values) / n
    sd = (sum((v - m) ** 2 for v in values) / (n - 1)) ** 0.5
    half = T975.get(n - 1, 1.96) * sd / n ** 0.5
    return [round(m - half, 4), round(m + half, 4)]


def arm_summary(runs: list[dict]) -> dict:
    """Pooled over seeds: base and final success with Wilson intervals, the gain with a
    Newcombe interval, judge step accuracy base -> final (mean over seeds)."""
    kb = sum(r["base"]["successes"] for r in runs)
    nb = sum(r["base"]["episodes"] for r in runs)
    kf = sum(r["final"]["successes"] for r in runs)
    nf = sum(r["final"]["episodes"] for r in runs)

    gains = [r["final"]["success"] - r["base"]["success"] for r in runs]
    warm = [r["init"] for r in runs if r.get("init")]
    if warm and len(warm) == len(runs):  # the warm start alone, and RL's gain over it
        kw, nw = sum(w["successes"] for w in warm), sum(w["episodes"] for w in warm)
        warm_start = {"success": kw / nw, "ci95": wilson_interval(kw, nw),
                      "rl_gain": kf / nf - kw / nw, "rl_gain_ci95": gain_interval(kf, nf, kw, nw),
                      "per_seed": [round(w["success"], 3) for w in warm]}
    else:
        warm_start = None

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None
    return {"seeds": len(runs), "base": kb / nb, "base_ci95": wilson_interval(kb, nb),
            "final": kf / nf, "final_ci95": wilson_interval(kf, nf), "episodes": nf,
            "gain": kf / nf - kb / nb, "gain_ci95": gain_interval(kf, nf, kb, nb),
            "per_seed": [round(r["final"]["success"], 3) for r in runs],
            "gain_per_seed": [round(g, 3) for g in gains],
            "gain_seeds_t95": _t_interval(gains),
            "iterations": [r["final"]["iteration"] + 1 for r in runs],
            "judge_step_accuracy": [mean(r["base"]["judge_step_accuracy"] for r in runs),
                                    mean(r["final"]["judge_step_accuracy"] for r in runs)],
            "accepted_tasks": [r["accepted_tasks"] for r in runs],
            # mean over seeds, per iteration: the judge on the rollouts it judged, and the
            # outcome's own accuracy there (the most consistency feedback can teach)
            "judge_on_rollouts": [
                {k: mean(j[k] if j else None for j in col)
                 for k in ("label_accuracy", "outcome_label_accuracy", "positive_share")}
                for col in zip_longest(*(r["judge_on_rollouts"] for r in runs))]
            if all(r.get("judge_on_rollouts") for r in runs) else None,
            "warm_start": warm_start,
            "minutes_per_run": mean(r["seconds"] / 60 for r in runs),
            # an iteration's stages without its evaluation, mean over seeds and iterations:
            # what the judge costs per iteration (eval runs every eval_every, in every arm)
            "iteration_seconds": mean(sum(v for k, v in sec.items() if k != "eval")
                                      for r in runs for sec in r["stage_seconds"] if sec),
            "stage_seconds": {k: mean(sec.get(k) for r in runs for sec in r["stage_seconds"]
                                      if sec) for k in STAGE_ORDER}}


STAGE_ORDER = ("rollout", "judge", "score", "train_policy", "train_rm", "adapt_tasks")


def cost_ratios(arms: dict) -> dict | None:
    """Each arm's seconds per iteration over policy-only's (the judge's issue asks <= 1.5
    for the judged loop); None without a policy-only arm."""
    only = arms.get("policy-only", {}).get("iteration_seconds")
    if not only:
        return None
    return {arm: round(a["iteration_seconds"] / only, 3) for arm, a in arms.items()
            if a.get("iteration_seconds")}


def headline(by_arm: dict[str, list[dict]]) -> dict:
    """The two figures the judge's issue asks of a config, each with its 95% interval:
    `judge_gain`, the held-out judge step accuracy (judge_heldout.py: fixed labelled steps)
    final minus base under consistency feedback alone (the +rm arm: no labels anywhere),
    mean over seeds (t-interval over seeds; one seed: its bootstrap over tasks); and
    `full_minus_policy_only`, final held-out success pooled over seeds (Newcombe)."""
    out: dict = {"judge_gain": None, "full_minus_policy_only": None}
    finals = [r["judge_heldout"]["judges"][r["judge_heldout"]["final"]]
              for r in by_arm.get("+rm", []) if r.get("judge_heldout")
              and r["judge_heldout"].get("final")]
    if finals:
        gains = [f["gain"] for f in finals]
        out["judge_gain"] = {"value": round(sum(gains) / len(gains), 4),
                             "ci95": _t_interval(gains) if len(gains) > 1
                             else finals[0]["gain_ci95"],
                             "per_seed": gains, "seeds": len(gains),
                             "base": [r["judge_heldout"]["judges"]["base"]["bal_acc"]
                                      for r in by_arm["+rm"] if r.get("judge_heldout")]}
    full, only = by_arm.get("full"), by_arm.get("policy-only")
    if full and only:
        k1, n1 = (sum(r["final"][k] for r in full) for k in ("successes", "episodes"))
        k0, n0 = (sum(r["final"][k] for r in only) for k in ("successes", "episodes"))
        out["full_minus_policy_only"] = {"value": round(k1 / n1 - k0 / n0, 4),
                                         "ci95": gain_interval(k1, n1, k0, n0),
                                         "seeds": [len(full), len(only)]}
    return out


def table(arms: dict) -> str:
    def ci(lo_hi):
        return f"{lo_hi[0]:.2f}-{lo_hi[1]:.2f}"

    def num(v):
        return "-" if v is None else f"{v:.3f}"

    def num0(v):
        return "-" if v is None else f"{v:.0f}"

    def rollouts(per_it):
        if not per_it or all(j["label_accuracy"] is None for j in per_it):
            return "-"
        return " / ".join("-" if j["label_accuracy"] is None else
                          f"{j['label_accuracy']:.2f} ({j['outcome_label_accuracy']:.2f})"
                          for j in per_it)

    def seeds_t(t):
        return "" if t is None else f" ({t[0]:+.2f} to {t[1]:+.2f})"

    def warm(w):
        if not w:
            return "-"
        return (f"{w['success']:.3f} ({ci(w['ci95'])}); RL {w['rl_gain']:+.3f} "
                f"({w['rl_gain_ci95'][0]:+.2f} to {w['rl_gain_ci95'][1]:+.2f})")
    lines = ["| arm | seeds | iterations | base success (95%) | warm start (95%); RL's gain "
             "over it | final success (95%) | gain "
             "(95%, pooled) | gain per seed (95% t over seeds) | final per seed | judge step "
             "acc. (eval) | judge on its rollouts, per iteration (outcome) | accepted tasks | "
             "stage min/run | s/iteration (no eval) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, s in arms.items():
        judge = s["judge_step_accuracy"]
        lines.append(
            f"| {arm} | {s['seeds']} | {'/'.join(map(str, s['iterations']))} | "
            f"{s['base']:.3f} ({ci(s['base_ci95'])}) | {warm(s.get('warm_start'))} | "
            f"{s['final']:.3f} "
            f"({ci(s['final_ci95'])}) | {s['gain']:+.3f} ({s['gain_ci95'][0]:+.2f} to "
            f"{s['gain_ci95'][1]:+.2f}) | {', '.join(f'{g:+.3f}' for g in s['gain_per_seed'])}"
            f"{seeds_t(s['gain_seeds_t95'])} | {', '.join(map(str, s['per_seed']))} | "
            f"{num(judge[0])} -> {num(judge[1])} | {rollouts(s['judge_on_rollouts'])} | "
            f"{'; '.join(','.join(map(str, a)) for a in s['accepted_tasks'])} | "
            f"{s['minutes_per_run']:.0f} | {num0(s.get('iteration_seconds'))} |")
    return "\n".join(lines) + "\n"


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="examples/household/learn.toml")
    parser.add_argument("--arms", nargs="+", default=["policy-only", "full"],
                        choices=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, help="override the config's iterations")
    parser.add_argument("--bench", help="the results' name: benchmarks/results/BENCH.json, "
                        ".md and -report/, runs/BENCH, benchmarks/README.md block "
                        "BENCH-table (default: learning, or learning-reduced); another config "
                        "needs its own, e.g. --bench learning-reasoning")
    parser.add_argument("--runs-dir", help="default: runs/BENCH")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to `rlany loop --set` (every run)")
    parser.add_argument("--tag", help="a variant of the arms (with --set): runs are named "
                        "ARM-TAG-sSEED and reported as their own rows, e.g. --tag balance "
                        "--set score.rm_balance=true")
    parser.add_argument("--warm-start", action="store_true",
                        help="start every run from a warm start (tag 'warm' unless --tag): "
                        "the loop's warm_start = true (the env's expert demonstrations on "
                        "the task pool, `rlany sft` on them); rows add the warm start's "
                        "held-out success")
    parser.add_argument("--judge-warm-start", action="store_true",
                        help="start every run's judge from a supervised one (tag "
                        "'judge-warm' unless --tag): the loop's judge_warm_start = true (the "
                        "env's step labels on expert/random play of the pool, train-rm "
                        "--objective logloss; RUN/judge_warm_start/). Not label-free: its "
                        "rows are apart from judge_gain")
    parser.add_argument("--reduced", action="store_true",
                        help="seed 0, policy-only and full, 2 iterations (~25 min on 2 cores)")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: summarize the runs that exist (the summary "
                        "always covers every evaluated run under --runs-dir)")
    parser.add_argument("--readme", action="store_true",
                        help="write the table into benchmarks/README.md")
    args = parser.parse_args()
    sets = list(args.set)
    if args.tag:
        check_name(parser, "--tag", args.tag)
    if args.warm_start:
        args.tag = args.tag or "warm"
        sets.append("warm_start=true")
    if args.judge_warm_start:
        args.tag = args.tag or "judge-warm"
        sets.append("judge_warm_start=true")
    if args.reduced and args.readme:
        parser.error("--readme writes the full benchmark's table, not the reduced one's")
    if args.reduced:
        args.seeds, args.arms = [0], ["policy-only", "full"]
        sets += ["iterations=2", "eval_every=2"]
    bench = args.bench or ("learning-reduced" if args.reduced else "learning")
    check_name(parser, "--bench", bench)
    if args.bench is None and args.config != parser.get_default("config"):
        parser.error("another --config needs its own --bench (its results would replace "
                     "the household benchmark's)")
    args.runs_dir = args.runs_dir or f"runs/{bench}"
    if args.iterations:
        sets.append(f"iterations={args.iterations}")
    started = time.perf_counter()
    if not args.report_only:
        for seed in args.seeds:
            for arm in args.arms:
                name = f"{arm.strip('+')}{f'-{args.tag}' if args.tag else ''}-s{seed}"
                run_loop(args.config, name, seed, ARMS[arm], args.runs_dir, sets)
                run = Path(args.runs_dir) / name
                judged = "--rm-training" in ARMS[arm] or args.judge_warm_start
                if (judged and HOUSEHOLD_LEARN in args.config
                        and not (run / "judge_heldout.json").exists()):
                    # the trained judges on fixed held-out labelled steps: judge_gain
                    subprocess.run([sys.executable, str(Path(__file__).parent /
                                                        "judge_heldout.py"), str(run)],
                                   check=True)
    by_arm = collect(Path(args.runs_dir))  # every evaluated run there, not only these
    if not by_arm:
        raise SystemExit(f"no evaluated runs under {args.runs_dir}")
    arms = {arm: arm_summary(runs) for arm, runs in by_arm.items()}
    text = table(arms)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{bench}.md").write_text(text)
    run_dirs = [r["run"] for runs in by_arm.values() for r in runs]
    report = RESULTS / f"{bench}-report"
    subprocess.run([sys.executable, "-m", "rlany", "report", *run_dirs, "-o", str(report)],
                   check=False)
    if args.readme:
        write_readme_block(f"{bench}-table", text)
    result = {"metric": "held-out success per arm, pooled over seeds (base -> final)",
              "config": args.config, "sets": sets, **headline(by_arm),
              "cost_vs_policy_only": cost_ratios(arms), "arms": arms,
              "runs": by_arm,
              "seconds": round(time.perf_counter() - started, 1),
              "note": "run alone on the machine (one CPU-heavy process at a time)"}
    save(bench, result)
    return result


if __name__ == "__main__":
    main()

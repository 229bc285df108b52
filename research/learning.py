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
Runs that the results file already records under the same runs directory and config, and
whose directories are not here (a fresh clone), stay in the summary as recorded, each with
the machine it ran on; `rlany report`'s plots (-report/) are then left as they were.
Writes research/results/learning.json, learning.md (the table), learning-arms/ (one line
per arm, mean over seeds with a 95% band, recorded runs included: learning_plots.py) and
learning-report/ (`rlany report`: plots of every run); `--readme` puts the table into
research/README.md.
The reduced version (a smoke run of the whole benchmark: policy-only and full, seed 0, 2
iterations) has its own runs (runs/learning-reduced) and results (learning-reduced.*), so it
never resumes or overwrites the full benchmark's.

    python research/learning.py                       # policy-only and full, seeds 0 1 2
    python research/learning.py --reduced             # seed 0, 2 iterations: ~25 min here
    python research/learning.py --arms +step +rm --seeds 0
    python research/learning.py --arms +step --tag label --set score.step_scores=label
    python research/learning.py --arms policy-only full --seeds 0 --warm-start
    python research/learning.py --report-only --readme

With --warm-start every run starts from a warm start (rows "ARM [warm]"), the loop's
`warm_start = true`: the env's expert demonstrations on the config's task pool, in the
prompts its rollout gives the policy (`rlany rollout --expert`), and `rlany sft` on them with
the policy's LoRA shape (RUN/warm_start/). Such a row adds the warm start's own held-out
success (eval_init.json) and RL's gain over it. With --judge-warm-start the judge starts
from a supervised one (rows "ARM [judge-warm]"): docs/stages/loop.md's recipe of public
commands into RUN/judge_warm_start/ (`judge_warm_start`, --judge-sft its train-rm
settings), then the loop with `init_rm` on its adapter; its held-out step accuracy is
judge_heldout.py's "warm" judge. `judge_gain` counts only the +rm arm, untagged or else
"+rm [warm]" (consistency feedback alone, no labels anywhere).
The judges of household learn.toml and mid.toml runs are scored on held-out labelled steps
(judge_heldout.py, HELDOUT_ARGS) when their run ends.
Run it alone on the machine: two CPU-heavy processes on 2 cores each run ~7x slower.
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
from lab import (  # noqa: E402
    RESULTS,
    check_name,
    machine,
    made_since_boot,
    save,
    write_readme_block,
)
from learning_plots import draw as draw_arms  # noqa: E402
from learning_summary import (  # noqa: E402
    ARMS,
    arm_summary,
    collect,
    cost_ratios,
    headline,
    table,
    versus,
    with_recorded,
)

# The supervised judge (docs/stages/loop.md, "A supervised judge"): what each of its four
# public commands sets beyond the loop config's table for that stage, so its prompts and
# LoRA shape are those the loop's judge has
JUDGE_RECIPE = {
    "rollout": dict(expert=True, expert_p=0.5, n=4, sample_tasks=None, constrain_actions=False),
    "judge": dict(labels=True, m=1, max_tokens=0, select="all", last_step_only=False),
    "score": dict(rm_target="label", rm_acc_min=0.0, rm_acc_max=1.0),
    "train_rm": dict(objective="logloss"),
}

# judge_heldout.py's held-out steps per household config (its judge prompts are both's)
HELDOUT_ARGS = {"household/learn.toml": [],
                "household/mid.toml": ["--tasks", "examples/household/mid_eval.jsonl",
                                       "--max-steps", "8", "--per-task", "2"]}


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


def judge_warm_start(config: str, seed: int, sets: list[str], sft: list[str],
                     out: Path) -> Path:
    """JUDGE_RECIPE's commands for one run, each built from the loop config as `rlany loop`
    builds a stage's (its table, the run's model and seed, `sets`), into `out`; a finished
    one is skipped. train-rm also takes `sft` (KEY=VALUE of its table). Returns the adapter,
    for the loop's `init_rm`."""
    from dataclasses import replace

    from rlany.api import BY_TABLE, command_line, load_config, meta_path

    out.mkdir(parents=True, exist_ok=True)
    steps, judged, scored = (str(out / f"{n}.jsonl") for n in ("steps", "judgments", "scored"))
    io = {"rollout": dict(input=None, output=steps, iteration=0),
          "judge": dict(input=steps, output=judged),
          "score": dict(input=steps, output=scored, judgments=judged,
                        stats=str(out / "task_stats.jsonl")),
          "train_rm": dict(input=scored, output=str(out / "rm"))}
    for stage, paths in io.items():
        given = [*sets, *(f"train_rm.{kv}" for kv in sft if stage == "train_rm")]
        cfg = load_config(config, {"seed": seed}, given)
        opts = replace(cfg.options(stage, **{**paths, "input": paths["input"] or cfg.tasks}),
                       **JUDGE_RECIPE[stage])
        done = out / "rm" / "rlany.json" if stage == "train_rm" else \
            meta_path(paths.get("stats", paths["output"]))
        if not done.exists():
            argv = command_line(cfg, BY_TABLE[stage], opts)
            if argv[0] != "rlany":  # [launch] train: the trainer under its launcher
                subprocess.run(argv, check=True)
            else:
                rlany(*argv[1:], what=f"the judge warm start's {argv[1]}")
    return out / "rm"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="examples/household/learn.toml")
    parser.add_argument("--arms", nargs="+", default=["policy-only", "full"],
                        choices=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, help="override the config's iterations "
                        "(raised over existing runs: they continue)")
    parser.add_argument("--bench", help="the results' name: research/results/BENCH.json, "
                        ".md and -report/, runs/BENCH, research/README.md block "
                        "BENCH-table (default: learning, or learning-reduced); another config "
                        "needs its own, e.g. --bench learning-reasoning")
    parser.add_argument("--runs-dir", help="default: runs/BENCH")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to `rlany loop --set` (every run)")
    parser.add_argument("--tag", help="a variant of the arms (with --set): runs are named "
                        "ARM-TAG-sSEED and reported as their own rows, e.g. --tag label "
                        "--set score.step_scores=label")
    parser.add_argument("--warm-start", action="store_true",
                        help="start every run from a warm start (tag 'warm' unless --tag): "
                        "the loop's warm_start = true (the env's expert demonstrations on "
                        "the task pool, `rlany sft` on them); rows add the warm start's "
                        "held-out success")
    parser.add_argument("--judge-warm-start", action="store_true",
                        help="start every run's judge from a supervised one (tag "
                        "'judge-warm' unless --tag): docs/stages/loop.md's recipe (the "
                        "env's step labels on expert/random play of the pool, train-rm "
                        "--objective logloss) into RUN/judge_warm_start/, then the loop "
                        "with init_rm on it. Not label-free: its rows are apart from "
                        "judge_gain")
    parser.add_argument("--judge-sft", action="append", default=[], metavar="KEY=VALUE",
                        help="with --judge-warm-start: a train-rm setting of the supervised "
                        "judge over the config's [train_rm] (e.g. lr=1e-3)")
    parser.add_argument("--reduced", action="store_true",
                        help="seed 0, policy-only and full, 2 iterations (~25 min on 2 cores)")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: summarize the runs that exist (the summary "
                        "always covers every evaluated run under --runs-dir)")
    parser.add_argument("--readme", action="store_true",
                        help="write the table into research/README.md")
    return parser


def settle(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str], str]:
    """(the `--set`s of every run, the bench name): the flags' implied settings applied to
    `args` (tag, seeds, arms, runs dir), conflicting flags refused through `parser`."""
    sets = list(args.set)
    if args.tag:
        check_name(parser, "--tag", args.tag)
    if args.warm_start:
        args.tag = args.tag or "warm"
        sets.append("warm_start=true")
    if args.judge_warm_start:
        args.tag = args.tag or "judge-warm"
    elif args.judge_sft:
        parser.error("--judge-sft sets the supervised judge of --judge-warm-start")
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
    return sets, bench


def run_arms(args: argparse.Namespace, sets: list[str]) -> None:
    """Every (seed, arm) run, resumed where it stopped; a judged run's judge then scored on
    the config's held-out labelled steps (judge_heldout.py), once."""
    heldout = next((a for c, a in HELDOUT_ARGS.items() if c in args.config), None)
    for seed in args.seeds:
        for arm in args.arms:
            name = f"{arm.strip('+')}{f'-{args.tag}' if args.tag else ''}-s{seed}"
            run = Path(args.runs_dir) / name
            judge = []  # the supervised judge first, its adapter the loop's init_rm
            if args.judge_warm_start:
                rm = judge_warm_start(args.config, seed, sets, args.judge_sft,
                                      run / "judge_warm_start")
                judge = [f"init_rm={rm}"]
            run_loop(args.config, name, seed, ARMS[arm], args.runs_dir, [*sets, *judge])
            judged = "--rm-training" in ARMS[arm] or args.judge_warm_start
            if (judged and heldout is not None
                    and not (run / "judge_heldout.json").exists()):
                # the trained judges on fixed held-out labelled steps: judge_gain
                subprocess.run([sys.executable, str(Path(__file__).parent /
                                                    "judge_heldout.py"), str(run),
                                *heldout], check=True)


def gather(config: str, runs_dir: str, bench: str) -> tuple[dict, list]:
    """(runs by arm, recorded runs): every evaluated run under `runs_dir`, not only this
    invocation's, and the runs the committed results recorded there whose directories this
    machine does not have; each with the machine it ran on where known."""
    earlier = RESULTS / f"{bench}.json"
    earlier = json.loads(earlier.read_text()) if earlier.exists() else {}
    by_arm, recorded = with_recorded(
        collect(Path(runs_dir)),
        earlier.get("runs") if earlier.get("config") == config else None,
        Path(runs_dir), earlier.get("machine"))
    if not by_arm:
        raise SystemExit(f"no evaluated runs under {runs_dir}")
    here = machine()
    for runs in by_arm.values():  # a run made since this boot ran here; a record names its own
        for r in runs:
            if "machine" not in r:
                r["machine"] = here if made_since_boot(Path(r["run"]) / "config.json") else None
    return by_arm, recorded


def main() -> dict:
    parser = build_parser()
    args = parser.parse_args()
    sets, bench = settle(parser, args)
    started = time.perf_counter()
    if not args.report_only:
        run_arms(args, sets)
    by_arm, recorded = gather(args.config, args.runs_dir, bench)
    arms = {arm: arm_summary(runs) for arm, runs in by_arm.items()}
    head, costs = headline(by_arm), cost_ratios(arms)
    text = table(arms) + versus(head, costs)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{bench}.md").write_text(text)
    run_dirs = [r["run"] for runs in by_arm.values() for r in runs if r["run"] not in recorded]
    report = RESULTS / f"{bench}-report"
    if recorded:  # plots need the runs' files: keep the report that drew them all
        others = (f"; `rlany report {' '.join(run_dirs)} -o DIR` draws the others"
                  if run_dirs else "")
        print(f"{len(recorded)} runs only in {bench}.json (their directories are not here): "
              f"{report} kept as it was{others}", file=sys.stderr)
    else:
        subprocess.run([sys.executable, "-m", "rlany", "report", *run_dirs, "-o", str(report)],
                       check=False)
    # one line per arm from the records, so runs made elsewhere are drawn too
    draw_arms(by_arm, RESULTS / f"{bench}-arms")
    if args.readme:
        write_readme_block(f"{bench}-table", text)
    result = {"metric": "held-out success per arm, pooled over seeds (base -> final)",
              "config": args.config, "sets": sets, **head,
              "cost_vs_policy_only": costs, "arms": arms,
              "runs": by_arm,
              # kept from the earlier results file (each with its "machine"), not re-read
              "recorded_runs": recorded,
              "seconds": round(time.perf_counter() - started, 1),
              "note": "run alone on the machine (one CPU-heavy process at a time)"}
    save(bench, result)
    return result


if __name__ == "__main__":
    main()

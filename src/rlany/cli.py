"""The `rlany` command line: thin typer commands that open files, build options and call a
stage function. The stage modules hold the logic; nothing here does math.

Every command: `-i/--input`, `-o/--output` (`-` = stdin/stdout), data on stdout only,
people on stderr, expected failures exit 1 with one line `file:line: what is wrong`.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from rlany.console import console, info
from rlany.errors import RlanyError

app = typer.Typer(
    help="rlany: RLAnything as Unix stages. A policy, a generative reward model and the "
    "environment's tasks learn together: tasks -> rollout -> judge -> score -> "
    "train-policy / train-rm -> adapt-tasks -> tasks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

# Option aliases, defined once and reused by every stage.
OutputOpt = Annotated[str, typer.Option("-o", "--output", help="Output JSONL file; - for stdout.")]


def _example(*lines: str) -> str:
    return "**Example**\n\n" + "\n\n".join(f"`{line}`" for line in lines)


# ---------------------------------------------------------------------------------------
# score


class LoneStep(str, Enum):
    raw = "raw"
    zero = "zero"


class UniformTasks(str, Enum):
    separated = "separated"
    drop = "drop"
    keep = "keep"


@app.command(epilog=_example(
    "rlany score -i trajectories.jsonl -j judgments.jsonl -o scored.jsonl",
    "rlany score -i trajectories.jsonl --outcome-only -o scored.jsonl --stats stats.jsonl"))
def score(
    input: Annotated[str, typer.Option("-i", "--input", help="trajectories.jsonl; - for stdin.")],
    output: OutputOpt = "scored.jsonl",
    judgments: Annotated[Optional[str], typer.Option(
        "-j", "--judgments", help="judgments.jsonl from `rlany judge`, in trajectory order. "
        "Without it there are no step scores (outcome only) and no reward-model data.")] = None,
    stats: Annotated[Optional[str], typer.Option(
        "--stats", help="Per-task accuracy file. Default: task_stats.jsonl beside --output "
        "(not written when --output is -).")] = None,
    lam: Annotated[Optional[float], typer.Option(
        "--lam", help="lambda in R = O + lambda * mean(S). Default 1.")] = None,
    outcome_only: Annotated[bool, typer.Option(
        "--outcome-only", help="Policy reward from the outcome alone (lambda = 0).")] = False,
    lone_step: Annotated[LoneStep, typer.Option(
        help="A step index reached by only one trajectory: keep its raw R as the "
        "advantage (reference behaviour) or drop it.")] = LoneStep.raw,
    uniform_tasks: Annotated[UniformTasks, typer.Option(
        help="Tasks whose rollouts all succeed or all fail: keep for the policy only if "
        "step rewards separate them (separated), never (drop) or always (keep).")
    ] = UniformTasks.separated,
    unparseable_penalty: Annotated[float, typer.Option(
        help="Consistency reward of an unparseable judge sample.")] = -2.0,
    rm_acc_min: Annotated[float, typer.Option(
        help="Reward-model data only from tasks with accuracy >= this.")] = 0.2,
    rm_acc_max: Annotated[float, typer.Option(
        help="Reward-model data only from tasks with accuracy <= this.")] = 0.8,
) -> None:
    """Integrated step rewards and advantages for the policy, consistency rewards for the
    reward model, and per-task accuracy. Streams one task group at a time."""
    from rlany.jsonl import AtomicJsonl, JsonlReader, write_meta
    from rlany.records import Judgment, Trajectory
    from rlany.score import ScoreOptions, score_stream

    started = time.time()
    if outcome_only and lam not in (None, 0.0):
        raise RlanyError(f"--outcome-only means lambda = 0, but --lam {lam} was given",
                         hint="pass one of them")
    if not 0.0 <= rm_acc_min <= rm_acc_max <= 1.0:
        raise RlanyError(f"need 0 <= --rm-acc-min <= --rm-acc-max <= 1, got {rm_acc_min}, "
                         f"{rm_acc_max}")
    opts = ScoreOptions(lam=0.0 if outcome_only else (1.0 if lam is None else lam),
                        lone_step=lone_step.value, uniform_tasks=uniform_tasks.value,
                        unparseable_penalty=unparseable_penalty, rm_acc_min=rm_acc_min,
                        rm_acc_max=rm_acc_max)
    if stats is None and output != "-":
        stats = str(Path(output).with_name("task_stats.jsonl"))
    _refuse_same_file(input, judgments, output, stats)

    traj_reader = JsonlReader(input, Trajectory, "trajectories")
    judge_reader = JsonlReader(judgments, Judgment, "judgments") if judgments else None
    n_tasks = n_traj = policy_samples = rm_samples = 0
    acc_sum = 0.0
    with AtomicJsonl(output) as out, (AtomicJsonl(stats) if stats else nullcontext()) as st:
        for scored, task_stats in score_stream(traj_reader, judge_reader, opts):
            out.write_all(scored)
            if st:
                st.write(task_stats)
            n_tasks += 1
            n_traj += len(scored)
            acc_sum += task_stats.acc
            policy_samples += task_stats.policy_samples
            rm_samples += task_stats.rm_samples
    counts = {"tasks": n_tasks, "trajectories": n_traj, "policy_samples": policy_samples,
              "rm_samples": rm_samples, "mean_acc": acc_sum / max(n_tasks, 1)}
    flags = {"lam": opts.lam, "lone_step": opts.lone_step, "uniform_tasks": opts.uniform_tasks,
             "unparseable_penalty": opts.unparseable_penalty, "rm_acc_min": rm_acc_min,
             "rm_acc_max": rm_acc_max, "stats": stats}
    inputs = [traj_reader] + ([judge_reader] if judge_reader else [])
    write_meta(output, stage="score", flags=flags, inputs=inputs, counts=counts,
               started=started)
    if stats:
        write_meta(stats, stage="score", flags=flags, inputs=inputs, counts=counts,
                   started=started)
    info(f"score: {n_traj} trajectories in {n_tasks} tasks, mean acc {counts['mean_acc']:.3f}, "
         f"{policy_samples} policy samples, {rm_samples} reward-model samples -> {output} "
         f"({time.time() - started:.1f}s)")


def _refuse_same_file(*paths: str | None) -> None:
    real = [os.path.realpath(p) for p in paths if p and p != "-"]
    if len(real) != len(set(real)):
        raise RlanyError("an input and an output name the same file", hint="outputs are "
                         "written atomically, so reading and writing one file loses data")


# ---------------------------------------------------------------------------------------
# Stages not built yet: they say so and exit non-zero, never pretend.

_NOT_BUILT = {
    "rollout": ("tasks -> trajectories (n per task) with a policy model", 3),
    "judge": ("trajectories -> judgments (m verdicts per step) with the reward model", 3),
    "train-policy": ("scored steps -> a new policy adapter (PPO-clip)", 5),
    "train-rm": ("scored judge samples -> a new reward-model adapter", 5),
    "adapt-tasks": ("tasks + stats + critiques -> rewritten candidate tasks", 6),
    "loop": ("run the whole closed loop from a config, resumable", 6),
    "eval": ("a policy on held-out tasks: success rate, pass@k", 6),
    "report": ("plots and tables of a run directory", 6),
}


def _not_built(name: str, summary: str, issue: int) -> None:
    def command(ctx: typer.Context) -> None:
        raise RlanyError(f"`rlany {name}` is not built yet ({summary}); tracked in issue "
                         f"#{issue}")
    command.__doc__ = f"[not built yet] {summary[0].upper()}{summary[1:]}."
    app.command(name, context_settings={"allow_extra_args": True,
                                        "ignore_unknown_options": True},
                epilog=_example(f"rlany {name} --help"))(command)


for _name, (_summary, _issue) in _NOT_BUILT.items():
    _not_built(_name, _summary, _issue)


def main() -> None:
    """Console entry point: one line and exit 1 for expected failures."""
    try:
        app()
    except RlanyError as e:
        if os.environ.get("RLANY_DEBUG"):
            raise
        console.print(f"[red]error:[/] {escape(e.one_line())}", soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]")
        sys.exit(130)

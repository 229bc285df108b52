"""The stages: one module per `rlany` command, named after it, each read top to bottom
(options class, the pure logic, the file driver `run`), and the registry of the commands
that share that shape, read by the CLI (`rlany.cli`) and by the loop (`rlany.loop.loop`).

    rollout.py       rollout        tasks -> trajectories (the policy acts in the env)
    judge.py         judge          trajectories -> judgments (the reward model's verdicts)
    score.py         score          -> integrated step rewards, consistency rewards, stats
    train_policy.py  train-policy   scored steps -> a policy checkpoint (PPO)
    train_rm.py      train-rm       scored judge samples -> a reward-model checkpoint
    sft.py           sft            trajectories -> a warm-start policy checkpoint
    adapt_tasks.py   adapt-tasks    tasks + stats + critiques -> the next task pool
    eval.py          eval           held-out tasks -> success, pass@k (and the judge's accuracy)
    report.py        report         a run directory -> plots and tables

Beside them, what only stages use; every module with its summary is in docs/modules.md
(generated from the tree: `make docs`).
The loop that drives them is `rlany.loop`, above this package; the shared trainer is
`rlany.training`, the file plumbing `rlany.stageio` and a stage's engine `rlany.stage_engine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from rlany.stages import (
    adapt_tasks,
    eval,
    judge,
    rollout,
    score,
    sft,
    train_policy,
    train_rm,
)


@dataclass(frozen=True)
class Command:
    """A stage command: its module, whose options class is its flags (and the loop config's
    table of the same name) and whose `run(opts, engine=None)` is its file driver."""

    name: str  # rlany NAME
    module: ModuleType
    options: type
    # the generation engine: "generates" (the loop hands it its engine), "borrows" (a
    # trainer: the loop hands it the engine when one runs, for its network), None
    engine: Literal["generates", "borrows"] | None
    help: str
    examples: tuple[str, ...]

    def run(self, opts: Any, **kw: Any) -> dict:
        return self.module.run(opts, **kw)

    @property
    def table(self) -> str:
        """The loop config's table: the command with `_` for `-` (`[train_policy]`)."""
        return self.name.replace("-", "_")


COMMANDS = (
    Command("rollout", rollout, rollout.RolloutOptions, "generates",
        "Roll out the policy: n episodes per task, multi-turn, all live episodes stepped in "
        "one batched generate call per turn. Writes the n trajectories of each task together.",
        examples=(
            "rlany envs make-tasks reasoning --n 16 --seed 0 -o tasks.jsonl",
            "rlany rollout -i tasks.jsonl -o trajectories.jsonl --model smollm2 --n 8",
            "rlany rollout -i tasks.jsonl -o - --n 4 | rlany judge -i - -o - | rlany score -i - "
            "-o scored.jsonl",
            "rlany rollout -i examples/household/tasks.jsonl -o traj.jsonl --max-steps 8 "
            "--constrain-actions",
            "rlany rollout -i examples/household/learn_tasks.jsonl -o demos.jsonl --expert --n 1 "
            "--max-steps 4 --history-turns 1",
            "rlany rollout -i tasks.jsonl -o traj.jsonl --engine openai --base-url "
            "http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-7B-Instruct --adapter ckpt/policy-1 "
            "--allow-unverified",
            "rlany rollout -i next_tasks.jsonl -o traj.jsonl --sample-tasks 16 --replay-share 0.5 "
            "--iteration 3",
        )),
    Command("judge", judge, judge.JudgeOptions, "generates",
        "Judge every step with a generative reward model: m samples per step (sharing the "
        "prompt), each reasoning then giving +1 or -1 (decoded constrained by default, so "
        "every verdict is readable). With --mode unit-tests (coding) the reward model writes "
        "m tests per task instead, and each program's verdicts are whether it passes them.",
        examples=(
            "rlany judge -i trajectories.jsonl -o judgments.jsonl --model smollm2 --m 3",
            "rlany judge -i trajectories.jsonl -o judgments.jsonl --model smollm2 --m 4 "
            "--max-tokens 0 --select used --obs-lines 1",
            "rlany judge -i code_traj.jsonl -o judgments.jsonl --mode unit-tests --m 4",
            "rlany judge -i traj.jsonl -o judgments.jsonl --engine openai --base-url "
            "http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-7B-Instruct",
        )),
    Command("score", score, score.ScoreOptions, None,
        "Integrated step rewards and advantages for the policy, consistency rewards for the "
        "reward model, and per-task accuracy. Streams one task group at a time.",
        examples=(
            "rlany score -i trajectories.jsonl -j judgments.jsonl -o scored.jsonl",
            "rlany score -i trajectories.jsonl --lam 0 -o scored.jsonl --stats stats.jsonl",
            "rlany score -i trajectories.jsonl -o scored.jsonl --step-credit gigpo",
        )),
    Command("train-policy", train_policy, train_policy.TrainOptions, "borrows",
        "Update the policy with PPO-clip on the kept scored steps (prompt messages -> the "
        "sampled response tokens, weighted by the step advantage). Writes a LoRA adapter that "
        "`rollout --adapter` uses.",
        examples=(
            "rlany train-policy -i scored.jsonl -o ckpt/policy-1 --model smollm2",
            "rlany train-policy -i scored.jsonl -o ckpt/policy-2 --adapter ckpt/policy-1",
            "accelerate launch --config_file examples/accelerate/ddp-8gpu.yaml -m rlany "
            "train-policy -i scored.jsonl -o ckpt/p --model Qwen/Qwen2.5-7B-Instruct",
        )),
    Command("train-rm", train_rm, train_rm.TrainRmOptions, "borrows",
        "Update the generative reward model with consistency feedback (R = O + lambda * "
        "mean(S) from `rlany score`). A judge of bare verdicts (judge --max-tokens 0) is "
        "trained on each judged step's verdict token: the log-likelihood of the verdict that "
        "agrees with the consistency reward (--objective logloss, the default there); a "
        "reasoning judge on each kept sample, PPO weighted by its consistency advantage "
        "(pg).",
        examples=(
            "rlany train-rm -i scored.jsonl -o ckpt/rm-1 --model smollm2",
            "rlany train-rm -i scored.jsonl -o ckpt/rm-1 --model smollm2 --objective expected",
            "rlany judge -i traj.jsonl -o judgments.jsonl --model smollm2 --adapter ckpt/rm-1",
            "rlany loop examples/household/learn.toml --name judged --step-feedback "
            "--set init_rm=ckpt/rm-1",
        )),
    Command("sft", sft, sft.SftOptions, "borrows",
        "Warm-start the policy: supervised fine-tuning (token negative log-likelihood) on the "
        "steps of successful trajectories, e.g. the env's expert demonstrations from "
        "`rollout --expert`. Writes a LoRA adapter that `rollout --adapter` and a loop's "
        "`init_policy` use.",
        examples=(
            "rlany rollout -i examples/household/learn_tasks.jsonl -o demos.jsonl --expert --n 1 "
            "--max-steps 4 --history-turns 1",
            "rlany sft -i demos.jsonl -o ckpt/sft --model smollm2",
            "rlany loop examples/household/learn.toml --name warm --set init_policy=ckpt/sft",
            "rlany loop examples/household/learn.toml --name warm2 --set warm_start=true",
        )),
    Command("adapt-tasks", adapt_tasks, adapt_tasks.AdaptOptions, "generates",
        "Adapt the environment: accept rolled-out candidates that proved harder/easier (beside "
        "their original task, which stays), then rewrite tasks the policy always (>= "
        "alpha-high) or never (<= alpha-low) solves, guided by a summary of the critiques.",
        examples=(
            "rlany adapt-tasks -i tasks.jsonl --stats task_stats.jsonl -j judgments.jsonl "
            "-o next_tasks.jsonl --candidates candidates.jsonl --model smollm2",
            "rlany adapt-tasks -i tasks.jsonl --pending candidates.jsonl --stats task_stats.jsonl "
            "-j judgments.jsonl -o next_tasks.jsonl --candidates new_candidates.jsonl "
            "--iteration 2",
            "rlany adapt-tasks -i tasks.jsonl --stats task_stats.jsonl --trajectories traj.jsonl "
            "--critic env -o next_tasks.jsonl --candidates candidates.jsonl --rewrite "
            "learnability --history edit_history.jsonl --acceptance learnability",
            "rlany adapt-tasks -i tasks.jsonl --stats task_stats.jsonl --trajectories traj.jsonl "
            "--critic env -o next_tasks.jsonl --candidates candidates.jsonl --allow-edits "
            "'goal kind' --rewrites-per-root 2",
        )),
    Command("eval", eval, eval.EvalOptions, "generates",
        "Evaluate a policy (base or adapter) on held-out tasks: success rate, pass@k, mean "
        "steps; with --judge, the judge's step accuracy against the env's step labels.",
        examples=(
            "rlany eval -i examples/reasoning/eval.jsonl -o eval.json --model smollm2 --n 4 --k 1 "
            "--k 4",
            "rlany eval -i eval.jsonl -o - --adapter ckpt/policy-3 --judge-adapter ckpt/rm-3",
        )),
)
BY_TABLE = {c.table: c for c in COMMANDS}

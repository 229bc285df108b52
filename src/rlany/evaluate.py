"""`rlany eval`: a policy on held-out tasks, and the judge against ground truth.

Policy: success rate over all trajectories, pass@k per task with the unbiased estimator
1 - C(n-c, k) / C(n, k) (n samples, c successes), averaged over tasks, and mean steps.

Judge (optional): the reward model judges the eval trajectories. The last step of an
episode is labelled by its outcome (the step that ended a successful episode was good, the
one that ended a failed episode was not: exact for single-turn envs, a lower bound on what
a judge must get right for multi-turn ones). Reported: verdict accuracy on those labelled
steps (unparseable counts as wrong), the unparseable rate, and outcome agreement (the sign
of a trajectory's mean step score equals its outcome). With `last_step_only` judging, the
judgments hold the last step only, and these rates cover those steps.
"""

from __future__ import annotations

from math import comb
from statistics import fmean

from rlany.records import Judgment, Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def policy_metrics(groups: list[list[Trajectory]], ks: list[int]) -> dict:
    flat = [t for g in groups for t in g]
    per_task = []
    for g in groups:
        c = sum(t.outcome == 1 for t in g)
        per_task.append({"task_id": g[0].task_id, "n": len(g), "successes": c,
                         **{f"pass@{k}": pass_at_k(len(g), c, k) for k in ks}})
    return {
        "tasks": len(groups), "trajectories": len(flat),
        "success_rate": fmean(t.outcome == 1 for t in flat) if flat else 0.0,
        **{f"pass@{k}": fmean(p[f"pass@{k}"] for p in per_task) if per_task else 0.0
           for k in ks},
        "mean_steps": fmean(len(t.steps) for t in flat) if flat else 0.0,
        "per_task": per_task,
    }


def judge_metrics(trajectories: list[Trajectory], judgments: list[Judgment]) -> dict:
    labelled = correct = unparseable = verdicts = agree = 0
    for traj, j in zip(trajectories, judgments):
        scores = [s.score for step in j.steps for s in step.samples]
        verdicts += len(scores)
        unparseable += sum(s == 0 for s in scores)
        if j.steps:
            last = j.steps[-1].samples
            labelled += len(last)
            correct += sum(s.score == traj.outcome for s in last)
            mean = fmean(fmean(s.score for s in step.samples) for step in j.steps)
            agree += mean * traj.outcome > 0
    return {
        "judge_step_accuracy": correct / labelled if labelled else None,
        "judge_parse_fail_rate": unparseable / verdicts if verdicts else None,
        "judge_outcome_agreement": agree / len(trajectories) if trajectories else None,
        "judge_labelled_verdicts": labelled,
    }

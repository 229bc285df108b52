"""The judge fields of `score`'s task_stats.jsonl: how a task's step scores read.

For the judged trajectories of one task (a `skipped` judgment, `judge --select used`, does
not count): the mean step score S̄, the unparseable share of the verdicts, and the share
that agrees with the outcome,

    agree_i = [ mean_t S̄_it · O_i > 0 ]      (no steps or a zero mean disagree)

Agreement with the outcome is not step accuracy: a judge that only predicted outcomes
would agree while adding little beyond O. The loop's `judge_outcome_agreement` is the mean
of this share over pool tasks (label-free: outcomes only); the judge's step accuracy
against the env's labels is eval's.
"""

from __future__ import annotations

import statistics

from rlany.files.records import Judgment, Trajectory


def agrees(step_scores: list[float], outcome: int) -> bool:
    """A trajectory's judged quality agrees with its outcome when the sign of its mean step
    score is O's; no steps or a zero mean disagree."""
    return (statistics.fmean(step_scores) if step_scores else 0.0) * outcome > 0


def judge_stats(trajs: list[Trajectory], judgments: list[Judgment | None],
                 step_scores: list[list[float]]) -> dict:
    """One task's judge fields of task_stats.jsonl: its mean step score, the unparseable
    share of its verdicts, and the share of its judged trajectories that agree with their
    outcome (`agrees`; the loop's judge_outcome_agreement is the mean over pool tasks)."""
    judged = [(tr, j, s) for tr, j, s in zip(trajs, judgments, step_scores)
              if j is not None and j.skipped is None]
    if not judged:
        return {"step_score_mean": None, "parse_fail_rate": None,
                "judge_outcome_agreement": None}
    verdicts = [s.score for _, j, _ in judged for st in j.steps for s in st.samples]
    flat = [s for _, _, scores in judged for s in scores]
    # unjudged trajectories (`judge --select used`) do not count
    agree = [agrees(s, tr.outcome) for tr, _, s in judged]
    return {
        "step_score_mean": statistics.fmean(flat) if flat else None,
        "parse_fail_rate": (sum(v == 0 for v in verdicts) / len(verdicts)) if verdicts else None,
        "judge_outcome_agreement": sum(agree) / len(agree),
    }

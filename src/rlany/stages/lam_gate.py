"""`score --lam-gate agreement`: λ as large as the step scores have earned, label-free.

Step rewards R_it = O_i + λ·S̄_it help the policy only when S̄ says something true about
the steps; a judge at chance adds noise of the outcome's own size (λ = 1) (on learn.toml
every judged arm ended about 0.1 below policy-only; research/README.md, "Each component
against policy-only", has what the gate did on mid.toml). Labels are not available to
tell a good judge from a bad one, but the outcome is: a trajectory whose steps the judge
scores well on balance should be one that succeeded. With

    agree_i = [ mean_t S̄_it · O_i > 0 ]      (a zero mean disagrees)

over the judged trajectories of this input's pool tasks with mixed outcomes (both O = +1
and O = -1 among the task's rollouts: the ones `judge --select used` judges and score
trains on; candidates and unjudged trajectories do not count), and lo the 95% Wilson lower
bound of their mean,

    λ_eff = λ · max(0, 2·lo - 1)

so a judge that cannot be told from chance on this batch (lo <= 0.5) gives λ_eff = 0 (the
outcome alone: policy-only's rewards), and one that agrees with every outcome gives nearly
λ. The gate reads the step scores actually used: with `--step-scores label` it measures
the env's labels (mid.toml, seventeenth session's rollouts: labels agree 0.82-0.90, lower
bounds 0.73-0.83, λ_eff 0.47-0.66; the learned judges 0.41-0.56, λ_eff 0).

Agreement with the outcome is not step accuracy: a judge that only predicted outcomes
would pass the gate while adding little beyond O. The gate is a guard against a judge
that is noise, not a proof that its step scores are right.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable

from rlany.files.records import Judgment, Trajectory
from rlany.stats import wilson_interval

Group = list[tuple[str, Trajectory, Judgment | None]]


def gated_lambda(grouped: Iterable[Group], lam: float,
                 step_scores: Callable[[Group], list[list[float]]]) -> tuple[float, dict]:
    """(λ_eff, what it was measured on) from one pass over the paired input, grouped by
    task: the pre-pass `score` makes before scoring (stdin was spooled to a file, so the
    input can be read twice)."""
    agree = 0
    n = 0
    for group in grouped:
        trajs = [t for _, t, _ in group]
        if any(t.extra.get("candidate") for t in trajs) or len({t.outcome for t in trajs}) < 2:
            continue
        for tr, judgment, scores in zip(trajs, (j for _, _, j in group), step_scores(group)):
            if judgment is not None and judgment.skipped is not None:
                continue  # not judged: it says nothing about the judge
            agree += agrees(scores, tr.outcome)
            n += 1
    lower = wilson_interval(agree, n)[0] if n else 0.0
    gate = max(0.0, 2 * lower - 1)
    return lam * gate, {"agreement": round(agree / n, 4) if n else None,
                        "lower95": lower, "trajectories": n, "gate": round(gate, 4)}


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

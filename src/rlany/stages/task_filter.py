"""Which tasks each learner of `rlany score` trains on, with the reason written into the
task's stats (`policy_reason`, `rm_reason`); the rules are in `rlany.stages.score`'s
docstring (`--uniform-tasks`, `--rm-acc-min/--rm-acc-max`, candidates, errored episodes)."""

from __future__ import annotations

CANDIDATE = "candidate task, not accepted yet"
NO_RUN = "every episode errored: no outcome"


def policy_filter(candidate: bool, n: int, uniform: bool, separated: bool,
                  uniform_tasks: str) -> tuple[bool, str]:
    """(keep, reason): does the policy train on this task? (`--uniform-tasks`)"""
    if not n:
        return False, NO_RUN
    if candidate:
        return False, CANDIDATE
    if not uniform:
        return True, "mixed outcomes"
    if uniform_tasks == "keep":
        return True, "uniform outcome, kept by --uniform-tasks keep"
    if uniform_tasks == "separated" and separated:
        return True, "uniform outcome, step rewards separate"
    return False, "uniform outcome"


def rm_filter(candidate: bool, n: int, acc: float, acc_min: float, acc_max: float
              ) -> tuple[bool, str]:
    """(keep, reason): does the reward model train on this task's steps? Only tasks with
    acc_min <= acc(q) <= acc_max (`--rm-acc-min/--rm-acc-max`)."""
    if candidate:
        return False, CANDIDATE
    if not n:
        return False, NO_RUN
    if acc_min <= acc <= acc_max:
        return True, "acc within rm range"
    return False, f"acc {acc:.2f} outside [{acc_min}, {acc_max}]"

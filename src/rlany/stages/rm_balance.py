"""`score --rm-balance`: a task's reward-model samples weighted so that its steps with a
positive and a negative target weigh the same (the formula in `rlany.stages.score`'s
docstring)."""

from __future__ import annotations

from dataclasses import replace

from rlany.files.records import Scored
from rlany.stats import side_weights


def balanced(scored: list[Scored], targets: list[list[float]]) -> list[Scored]:
    """--rm-balance: the advantages of a task's kept reward-model samples, scaled per step
    so the steps whose target (R, or the label under --rm-target label) is > 0 and those
    where it is < 0 carry equal total weight (each side k / (2 k_side) for k kept steps; a
    lone step among many can weigh several times one); a step with target 0 (R = 0: an
    unparseable verdict beside agreeing ones) keeps weight 1, and a task with kept steps on
    one side only is unchanged. Per task, like the standardization: a task's rollouts are
    one group."""
    def sign(r: float) -> int:
        return (r > 0) - (r < 0)

    kept = [target for tr, row in zip(scored, targets) for step, target in zip(tr.steps, row)
            if target != 0 and any(j.keep for j in step.judge)]
    weight = {sign(t): w for t, w in zip(kept, side_weights(kept))}
    if len(weight) < 2:  # kept steps on one side only (or none)
        return scored
    weight[0] = 1.0
    return [replace(tr, steps=[replace(step, judge=[
        replace(j, advantage=j.advantage * weight[sign(target)]) for j in step.judge])
        for step, target in zip(tr.steps, row)]) for tr, row in zip(scored, targets)]

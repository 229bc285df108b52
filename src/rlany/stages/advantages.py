"""The normalizations behind every advantage `rlany score` writes: rewards standardized
within their group (a task's trajectories at one step index, the m verdicts of one step,
the m unit tests of one task, GiGPO's episode and anchor groups). The math is in
`rlany.stages.score`'s docstring (and `rlany.stages.gigpo`'s)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

EPS_STD = 1e-8  # below this a group's rewards are treated as all equal


def standardize(values: list[float]) -> list[float]:
    """(v - mean) / population std; all zeros when the values do not differ."""
    mean = statistics.fmean(values)
    std = statistics.pstdev(values, mu=mean)
    if std < EPS_STD:
        return [0.0] * len(values)
    return [(v - mean) / std for v in values]


def centered(values: list[float]) -> list[float]:
    """v - mean (GiGPO's mean-only normalization); all zeros when the values do not
    differ, as `standardize` gives."""
    mean = statistics.fmean(values)
    if statistics.pstdev(values, mu=mean) < EPS_STD:
        return [0.0] * len(values)
    return [v - mean for v in values]


@dataclass
class Credit:
    """The policy's advantage of every step of a task's trajectories."""

    advantages: list[list[float]]  # A_it: one row per trajectory, one entry per step
    separated: bool  # some step's reward differs within its group (`--uniform-tasks`)
    steps: list[list[dict | None]] | None = None  # GiGPO: each step's `gigpo` record
    stats: dict = field(default_factory=dict)  # GiGPO: the task's anchor-group counts


def step_index_advantages(rewards: list[list[float]], ran: list[bool], lone_step: str
                          ) -> Credit:
    """A_it: R standardized across the trajectories that ran and reach step index t (an
    errored one keeps 0), and whether any step index separates them."""
    advantages = [[0.0] * len(r) for r in rewards]
    separated = False
    for t in range(max((len(r) for r in rewards), default=0)):
        members = [i for i, r in enumerate(rewards) if ran[i] and t < len(r)]
        if not members:
            continue
        if len(members) == 1:
            i = members[0]
            advantages[i][t] = rewards[i][t] if lone_step == "raw" else 0.0
            continue
        std_adv = standardize([rewards[i][t] for i in members])
        separated |= any(a != 0.0 for a in std_adv)
        for i, a in zip(members, std_adv):
            advantages[i][t] = a
    return Credit(advantages, separated)

"""The one normalization behind every advantage `rlany score` writes: rewards standardized
within their group (a task's trajectories at one step index, the m verdicts of one step,
the m unit tests of one task). The math is in `rlany.stages.score`'s docstring."""

from __future__ import annotations

import statistics

EPS_STD = 1e-8  # below this a group's rewards are treated as all equal


def standardize(values: list[float]) -> list[float]:
    """(v - mean) / population std; all zeros when the values do not differ."""
    mean = statistics.fmean(values)
    std = statistics.pstdev(values, mu=mean)
    if std < EPS_STD:
        return [0.0] * len(values)
    return [(v - mean) / std for v in values]

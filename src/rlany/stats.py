"""The statistics every layer reports with, in one base module (no stage imports): success
intervals, the interval of a gain, pass@k, a judge's balanced accuracy, the spread over
seeds and the weights that balance two classes. Stages, `rlany report` and research import
them from here."""

from __future__ import annotations

from math import comb, sqrt

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262}  # Student's t, 97.5th percentile, by degrees of freedom


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of n samples with c correct (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> list[float] | None:
    """The 95% Wilson score interval of a success rate (sound at small n and at 0 or n
    successes, unlike the normal approximation). Episodes of one task are correlated, so
    for few tasks this is optimistic; it is the noise floor a gain must clear."""
    if n == 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def gain_interval(k1: int, n1: int, k0: int, n0: int) -> list[float] | None:
    """The 95% interval of a difference of success rates p1 - p0 (independent samples;
    Newcombe's hybrid score interval from the two Wilson intervals)."""
    if not n1 or not n0:
        return None
    p1, p0 = k1 / n1, k0 / n0
    (lo1, hi1), (lo0, hi0) = wilson_interval(k1, n1), wilson_interval(k0, n0)
    d = p1 - p0
    return [round(d - sqrt((p1 - lo1) ** 2 + (hi0 - p0) ** 2), 4),
            round(d + sqrt((hi1 - p1) ** 2 + (p0 - lo0) ** 2), 4)]


def side_weights(targets: list[float]) -> list[float]:
    """Class weights that make the two sides of 0 weigh the same: k / (2 k_side) for the k
    nonzero targets, k_side of them on the target's side (each side weighs k / 2 in total; a
    lone one among many can weigh several times one); 1 for a target of 0 and for all where
    the nonzero ones lie on one side: `train-rm`'s verdict samples."""
    k, k_pos = sum(t != 0 for t in targets), sum(t > 0 for t in targets)
    if k_pos in (0, k):
        return [1.0] * len(targets)
    return [k / (2 * k_pos) if t > 0 else k / (2 * (k - k_pos)) if t < 0 else 1.0
            for t in targets]


def balanced_accuracy(by_label: dict[int, list[int]]) -> float | None:
    """Mean over the step labels present of the share of verdicts equal to the label
    ({label: [verdicts, correct]}): a constant judge scores 0.5 whatever the label mix."""
    rates = [ok / n for n, ok in by_label.values() if n]
    return sum(rates) / len(rates) if rates else None


def t_interval(values: list[float]) -> list[float] | None:
    """95% t-interval of the mean over seeds (the spread between seeds, which a pooled
    Wilson interval does not see); None below 2 seeds."""
    n = len(values)
    if n < 2:
        return None
    m = sum(values) / n
    sd = (sum((v - m) ** 2 for v in values) / (n - 1)) ** 0.5
    half = T975.get(n - 1, 1.96) * sd / n ** 0.5
    return [round(m - half, 4), round(m + half, 4)]

"""What the env itself says about an episode, as `score` puts it into R = O + λ·S.

Each step's `info` may carry the env's own numbers (rollout records them as the env gives
them, so they are always on the trajectory):
    info["label"]   L_t ∈ {-1, +1}: the step is on a shortest plan (household, alfworld,
                    miniwob pages with an expert)
    info["reward"]  r_t: the env's reward for the step, a finite number, or null where the
                    env gave none (openenv: the server's `reward`; null also on a step the
                    server did not take); `info["return"]` is their running sum there

The outcome O_i (`score --outcome`):
    success        O_i = +1 if the episode succeeded else -1   (the paper's; the default)
    return         O_i = Σ_t r_t, added in step order          (TRL's: the env's return)
    final-reward   O_i = r_{T-1}                               (the last step's reward)
where a null reward counts 0 (as openenv's `return` counts it). A trajectory that ran and
carries no `reward` key on any step has no env reward: refused at its line, naming the
flag (the env records none; `--outcome success` is the choice there), and so is a reward
that is not a finite number, or a return that overflows. An errored episode (finish
"error") is never trained on: its missing rewards count 0. The reward model's target
(`rm_target` under `--rm-target outcome`, and R·S) is then this O_i: its sign is what a
verdict must agree with, so an env whose returns are all >= 0 gives the judge no contrast.

The step score S_it (`score --step-scores`): the judge's mean verdict (the paper), the env's
label L_it (`label`: a perfect judge, the upper bound of step feedback), or the env's step
reward r_it (`env-reward`, null = 0; refused, as above, for a trajectory with no rewards).

The success rate, acc(q) and everything decided on it (the reward model's accuracy range,
adapt-tasks) stay success-based whatever O is; `eval` reports the mean return beside the
success rate (`return_row`, `mean_return`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rlany.errors import RlanyError
from rlany.files.records import Judgment, Trajectory
from rlany.stages.episode_errors import errored

OUTCOMES = ("success", "return", "final-reward")
STEP_SCORES = ("judge", "label", "env-reward")
Group = list[tuple[str, Trajectory, Judgment | None]]  # ("path:line", trajectory, judgment)
HINT = "the env records no rewards (openenv does: info.reward); use --outcome success"


def rewards(tr: Trajectory) -> list[float] | None:
    """r_t of each step (null = 0), or None when no step carries a `reward` key. A value
    that is not a finite number (a bool, a string, NaN, infinity) raises ValueError."""
    if not any("reward" in step.info for step in tr.steps):
        return None
    out = []
    for t, step in enumerate(tr.steps):
        r = step.info.get("reward")
        if r is None:
            r = 0.0
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
            raise ValueError(f"step {t}'s info.reward is {r!r:.40}, not a finite number")
        out.append(float(r))
    return out


def _checked(where: str, tr: Trajectory, why: str) -> list[float]:
    """The trajectory's step rewards for `why` (a flag and its value), refused at its line
    when it has none (an errored one gets zeros: it is not trained on)."""
    try:
        found = rewards(tr)
    except ValueError as e:
        raise RlanyError(f"{why}: trajectory '{tr.traj_id}': {e}", where=where) from None
    if found is None and errored(tr):
        return [0.0] * len(tr.steps)
    if found is None:
        raise RlanyError(f"{why}: trajectory '{tr.traj_id}' has no env reward on any step "
                         "(no info.reward)", where=where, hint=HINT)
    return found


def outcomes(group: Group, source: str) -> list[float]:
    """O_i of each trajectory of the group under `--outcome source` (the module doc)."""
    if source == "success":
        return [float(tr.outcome) for _, tr, _ in group]
    out = []
    for where, tr, _ in group:
        r = _checked(where, tr, f"--outcome {source}")
        o = sum(r, 0.0) if source == "return" else (r[-1] if r else 0.0)
        if not math.isfinite(o):
            raise RlanyError(f"--outcome {source}: the env rewards of trajectory "
                             f"'{tr.traj_id}' sum to {o}, not a finite number", where=where)
        out.append(o)
    return out


def outcome_rewards(group: Group, source: str) -> list[list[float]]:
    """e_it: O_i on GiGPO's scale, put on the steps where the env gave it (`score
    --step-credit gigpo`, rlany.stages.gigpo): success, 1 at the last step of an episode
    that succeeded; return, each step's r_t; final-reward, r_{T-1} at the last step; 0 at
    every other step. Σ_t e_it is the episode's return (1 or 0 under success)."""
    out = []
    for where, tr, _ in group:
        e = [0.0] * len(tr.steps)
        if source == "return":
            e = _checked(where, tr, f"--outcome {source}")
        elif e and source == "final-reward":
            e[-1] = _checked(where, tr, f"--outcome {source}")[-1]
        elif e:
            e[-1] = 1.0 if tr.outcome == 1 else 0.0
        out.append(e)
    return out


def step_scores(group: Group, source: str, verdict: Callable[[Judgment | None, int], float]
                ) -> list[list[float]]:
    """S̄_it of each step under `--step-scores source`: `verdict(judgment, t)` (the judge's
    mean verdict, `score`'s) for judge, else the env's label or step reward."""
    if source == "label":
        return labels(group, "--step-scores label")
    if source == "env-reward":
        return [_checked(where, tr, "--step-scores env-reward") for where, tr, _ in group]
    return [[verdict(j, t) for t in range(len(tr.steps))] for _, tr, j in group]


def labels(group: Group, why: str) -> list[list[float]]:
    """--rm-target label / --step-scores label: each step's env label (+1 / -1), checked at
    its line."""
    out = []
    for where, tr, _ in group:
        row = []
        for t, step in enumerate(tr.steps):
            label = step.info.get("label")
            if label not in (1, -1) and errored(tr):
                label = 0  # the step the env failed on: not trained on, never labelled
            elif label not in (1, -1):
                raise RlanyError(f"{why}: step {t} of trajectory '{tr.traj_id}' "
                                 f"has no env step label (info.label is {label!r})",
                                 where=where, hint="use an env with step labels (household, "
                                 "alfworld)")
            row.append(float(label))
        out.append(row)
    return out


# -- eval: the mean return beside the success rate ------------------------------------

def return_row(trajectories: list[Trajectory]) -> dict:
    """A task row's `mean_return` and `rewarded` (its episodes that carry env rewards), or
    {} when none does (an env without rewards); a malformed reward counts as none."""
    returns = []
    for tr in trajectories:
        try:
            r = rewards(tr)
        except ValueError:
            r = None
        if r is not None and math.isfinite(total := sum(r, 0.0)):
            returns.append(total)
    n = len(returns)  # each term divided first: a mean of finite returns stays finite
    return {"mean_return": math.fsum(x / n for x in returns), "rewarded": n} if n else {}


def mean_return(rows: list[dict]) -> float | None:
    """The mean return over the episodes of all rows that carry rewards (rows in order, so
    a join of shards gives the unsharded number); None without any."""
    n = sum(row.get("rewarded", 0) for row in rows)
    return math.fsum(row["mean_return"] * (row["rewarded"] / n) for row in rows
                     if row.get("rewarded")) if n else None

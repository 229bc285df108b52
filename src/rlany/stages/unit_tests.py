"""The coding setting's reward model (`--mode unit-tests`, DESIGN section 4): the m samples
of a task's judgment are unit tests, and `rlany score` rewards each test by how well it
separates the task's correct programs from its wrong ones. The math is in
`rlany.stages.score`'s docstring."""

from __future__ import annotations

from collections.abc import Callable

from rlany.errors import RlanyError
from rlany.records import Judgment, ScoredJudgeSample, Trajectory
from rlany.stages.advantages import standardize


def unit_test_rewards(group: list[tuple[str, Trajectory, Judgment | None]], rm_keep: bool,
                      penalty: float) -> Callable[[int], list[ScoredJudgeSample]] | None:
    """For unit-tests judgments: i -> the scored tests of trajectory i (r_j and a_j of
    `rlany.stages.score`'s docstring; `penalty` the reward of an unparseable test). None:
    the task's judgments are verdicts, not tests."""
    judged = [(where, tr, j) for where, tr, j in group if j is not None and j.steps]
    if not judged or judged[0][2].mode != "unit-tests":
        if any(j.mode == "unit-tests" for _, _, j in judged):
            raise RlanyError("a task mixes 'steps' and 'unit-tests' judgments",
                             where=judged[0][0])
        return None
    texts = [s.text for s in judged[0][2].steps[0].samples]
    for where, tr, j in judged:
        if j.mode != "unit-tests" or [s.text for s in j.steps[0].samples] != texts:
            raise RlanyError(f"the unit-test judgments of task '{tr.task_id}' must share one "
                             "set of tests", where=where)
    m = len(texts)
    rewards = []
    for k in range(m):
        sample = judged[0][2].steps[0].samples[k]
        if sample.score == 0:
            rewards.append(penalty)
            continue
        rate = {}
        for outcome in (1, -1):
            members = [j.steps[0].samples[k].score == 1 for _, tr, j in judged
                       if tr.outcome == outcome]
            rate[outcome] = sum(members) / len(members) if members else 0.0
        rewards.append(rate[1] - rate[-1])
    advantages = standardize(rewards)
    first = judged[0][1].traj_id

    def scored_tests(i: int) -> list[ScoredJudgeSample]:
        _, tr, j = group[i]
        if j is None or not j.steps:
            return []
        return [ScoredJudgeSample(text=s.text, score=s.score, reward=r, advantage=a,
                                  keep=rm_keep and tr.traj_id == first and a != 0.0)
                for s, r, a in zip(j.steps[0].samples, rewards, advantages)]
    return scored_tests

"""The coding setting's reward model (`--mode unit-tests`, DESIGN section 4): `rlany judge`
has the judge write m unit tests per task and runs every program of the task on them in the
sandbox; `rlany score` rewards each test by how well it separates the task's correct programs
from its wrong ones. The math is in the docstrings of `rlany.stages.judge` and `score`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rlany.engines.base import Engine, Request, Sampling, stable_seed
from rlany.errors import RlanyError
from rlany.files.provenance import judgment_origin
from rlany.files.records import (
    JudgeSample,
    Judgment,
    ScoredJudgeSample,
    StepJudgment,
    Trajectory,
    responses_digest,
)
from rlany.prompts import parse_unit_test, unit_test_messages
from rlany.stages.advantages import standardize
from rlany.stages.episode_errors import ERRORED, errored

# -- judge: write the tests, run every program on them ----------------------------------

def unit_test_batch(batch: list[list[Trajectory]], engine: Engine, sampling: Sampling, *,
                    adapter: str | None, seed: int, cpu_s: float, judge_info: dict
                    ) -> Iterator[list[Judgment]]:
    """The judgments of a batch of task groups: per task, one test-writing prompt whose
    `sampling.n` samples are the tests; every program run on them (`cpu_s` CPU seconds
    per program per test)."""
    from rlany.envs.coding import extract_code

    for group in batch:
        for traj in group:
            if len(traj.steps) > 1:
                raise RlanyError(f"trajectory '{traj.traj_id}' has {len(traj.steps)} steps: "
                                 "--mode unit-tests judges single-turn coding trajectories")
    # one test-writing prompt per task, m samples
    asked = [(g, unit_test_messages(next(t.steps[0].obs for t in g if t.steps)))
             for g in batch if any(t.steps for t in g)]
    requests = [Request(messages=messages, adapter=adapter,
                        sampling=replace(sampling, seed=stable_seed(seed, "unit-tests",
                                                                    g[0].task_id)))
                for g, messages in asked]
    written = {g[0].task_id: (messages, [(c.text, parse_unit_test(c.text))
                                         for c in result.completions])
               for (g, messages), result in zip(asked, engine.generate(requests))}
    # every program against its task's parsed tests, one sandboxed process per program
    jobs = [(t, [test for _, test in written[g[0].task_id][1] if test is not None])
            for g in batch for t in g if t.steps and not errored(t)]
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        passed = dict(zip((t.traj_id for t, _ in jobs),
                          pool.map(lambda job: _run_program(
                              extract_code(job[0].steps[0].response), job[1], cpu_s),
                              jobs)))
    for group in batch:
        judgments = []
        for traj in group:
            steps = []
            jail = passed.get(traj.traj_id)
            if errored(traj) or isinstance(jail, str):  # the program never ran to an
                judgments.append(Judgment(traj_id=traj.traj_id, task_id=traj.task_id,
                                          judge=judge_info, steps=[],  # answer: no verdict
                                          skipped=jail if isinstance(jail, str) else ERRORED,
                                          mode="unit-tests",
                                          responses_sha256=responses_digest(traj.steps),
                                          extra=judgment_origin(traj)))
                continue
            if traj.steps:
                messages, tests = written[traj.task_id]
                verdicts = iter(passed[traj.traj_id])
                samples = [JudgeSample(text=text, test=test,
                                       score=0 if test is None else next(verdicts))
                           for text, test in tests]
                steps.append(StepJudgment(step=0, judge_messages=messages, samples=samples))
            judgments.append(Judgment(traj_id=traj.traj_id, task_id=traj.task_id,
                                      judge=judge_info, steps=steps, mode="unit-tests",
                                      responses_sha256=responses_digest(traj.steps),
                                      extra=judgment_origin(traj)))
        yield judgments


def _run_program(code: str, tests: list[dict], cpu_s: float) -> list[int] | str:
    """+1 / -1 per test: does the program print the expected output? Where the jail did
    not start (no program ran) why, for that judgment's `skipped`: the others still run."""
    if not tests:
        return []
    from rlany.sandbox import Limits, SandboxFailed, outputs_match, run_tests

    try:
        results = run_tests(code, [t["input"] for t in tests], Limits(cpu_s=cpu_s))
    except SandboxFailed as e:
        return f"the sandbox failed, no verdict: {e.message}"
    return [1 if r.status == "ok" and outputs_match(r.stdout, t["output"]) else -1
            for r, t in zip(results, tests)]


def unit_test_counts(group: list[Judgment], outcomes: dict[str, int]) -> dict[str, int]:
    """Per task: tests written, parsed, and (when some program is correct) how many every
    correct program passes ("valid") and how many of those also fail a wrong one."""
    judged = [j for j in group if j.steps]
    if not judged:
        return {}
    m = len(judged[0].steps[0].samples)
    parsed = [judged[0].steps[0].samples[k].test is not None for k in range(m)]
    counts = {"tests": m, "tests_parsed": sum(parsed), "tests_checkable": 0,
              "tests_valid": 0, "tests_discriminating": 0}
    right = [j for j in judged if outcomes.get(j.traj_id) == 1]
    wrong = [j for j in judged if outcomes.get(j.traj_id) == -1]
    if not right:
        return counts
    for k in range(m):
        if not parsed[k]:
            continue
        counts["tests_checkable"] += 1
        if all(j.steps[0].samples[k].score == 1 for j in right):
            counts["tests_valid"] += 1
            counts["tests_discriminating"] += any(j.steps[0].samples[k].score == -1
                                                  for j in wrong)
    return counts


# -- score: reward each test by how it separates correct programs from wrong ones -----

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

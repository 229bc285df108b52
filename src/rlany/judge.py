"""`rlany judge`: trajectories -> judgments, m verdicts per step from a generative judge.

For every step the judge gets one prompt (`prompts.judge_messages`: the task, the earlier
actions, the observation, the policy's response and what happened next) and `m` samples
are drawn from it in one request, sharing the prompt. All steps of a batch of trajectories
go to the engine in one call. Each sample is parsed with `prompts.parse_verdict`: +1, -1,
or 0 when unparseable (counted and reported, never fatal).

Mode "unit-tests" (the paper's coding setting, DESIGN §4): the reward model writes tests
instead of verdicts. Per task, one prompt (`prompts.unit_test_messages`: the problem the
policy saw) gets `m` samples, each parsed into {input, expected output} by
`prompts.parse_unit_test`. Every program of the task's trajectories (the last ```python
block of its single step) runs on all parsed tests in one sandboxed process; its verdict
from test j is +1 if it prints the expected output, -1 if not, and 0 when test j was
unparseable. So `rlany score` needs nothing new for the policy (R = O + λ·mean_j S_j),
and scores a test by how well it separates correct from incorrect programs.

Judgments come out in trajectory order (one per trajectory, grouped by task), which is the
order `rlany score` reads them in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from rlany.chat import text_of
from rlany.engines import Engine, Request, Sampling, stable_seed
from rlany.errors import RlanyError
from rlany.prompts import clip, judge_messages, parse_unit_test, parse_verdict, unit_test_messages
from rlany.records import JudgeSample, Judgment, StepJudgment, Trajectory

MODES = ("steps", "unit-tests")


@dataclass(frozen=True)
class JudgeOptions:
    m: int = 3
    sampling: Sampling = Sampling(max_tokens=384, temperature=0.8)
    adapter: str | None = None
    batch_trajectories: int = 64
    history_steps: int = 5  # earlier actions shown to the judge
    seed: int = 0
    mode: str = "steps"  # steps | unit-tests
    last_step_only: bool = False  # eval: judge only the outcome-labelled last step
    test_cpu_s: float = 2.0  # unit-tests: CPU seconds per program per test


def step_prompts(traj: Trajectory, history_steps: int) -> list[list[dict]]:
    """The judge prompt of every step of one trajectory.

    The task is the policy's first user message; at step 0 its observation part is left out
    (the prompt shows the observation anyway). Earlier steps are listed as the action and
    the first line of what the env answered (the full state is in the current observation).
    """
    prompts = []
    for t, step in enumerate(traj.steps):
        first_user = next((text_of(m["content"]) for m in step.prompt_messages
                           if m["role"] == "user"), "")
        if t == 0 and step.obs and first_user.endswith(step.obs):
            first_user = first_user[:-len(step.obs)].strip() or first_user
        earlier = traj.steps[max(0, t - history_steps):t]
        history = [f"step {t - len(earlier) + k}: {clip(s.action or s.response, 300)} -> "
                   f"{clip(_first_line(s.next_obs), 300)}" for k, s in enumerate(earlier)]
        prompts.append(judge_messages(first_user, history, step.obs, step.response,
                                      step.next_obs, step.images, step.next_images))
    return prompts


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")


def judge(trajectories: Iterable[Trajectory], engine: Engine, opts: JudgeOptions,
          judge_info: dict | None = None) -> Iterator[list[Judgment]]:
    """Yield the judgments of each task's trajectories, task by task, in input order."""
    batch: list[list[Trajectory]] = []
    size = 0
    for group in _task_groups(trajectories):
        batch.append(group)
        size += len(group)
        if size >= opts.batch_trajectories:
            yield from _judge_batch(batch, engine, opts, judge_info or {})
            batch, size = [], 0
    if batch:
        yield from _judge_batch(batch, engine, opts, judge_info or {})


def _judge_batch(batch: list[list[Trajectory]], engine: Engine, opts: JudgeOptions,
                judge_info: dict) -> Iterator[list[Judgment]]:
    if opts.mode == "unit-tests":
        return _unit_test_batch(batch, engine, opts, judge_info)
    return _step_batch(batch, engine, opts, judge_info)


def _task_groups(trajectories: Iterable[Trajectory]) -> Iterator[list[Trajectory]]:
    group: list[Trajectory] = []
    for traj in trajectories:
        if group and traj.task_id != group[0].task_id:
            yield group
            group = []
        group.append(traj)
    if group:
        yield group


def _step_batch(batch: list[list[Trajectory]], engine: Engine, opts: JudgeOptions,
                 judge_info: dict) -> Iterator[list[Judgment]]:
    prompts = {t.traj_id: list(enumerate(step_prompts(t, opts.history_steps)))
               for g in batch for t in g}
    if opts.last_step_only:
        prompts = {tid: steps[-1:] for tid, steps in prompts.items()}
    requests = [Request(messages=p, adapter=opts.adapter,
                        sampling=replace(opts.sampling, n=opts.m,
                                         seed=stable_seed(opts.seed, "judge", tid, k)))
                for tid, steps in prompts.items() for k, p in steps]
    results = iter(engine.generate(requests))
    for group in batch:
        judgments = []
        for traj in group:
            steps = []
            for k, messages in prompts[traj.traj_id]:
                result = next(results)
                samples = [JudgeSample(text=c.text, score=parse_verdict(c.text))
                           for c in result.completions]
                steps.append(StepJudgment(step=k, judge_messages=messages, samples=samples))
            judgments.append(Judgment(traj_id=traj.traj_id, task_id=traj.task_id,
                                      judge=judge_info, steps=steps))
        yield judgments


def _unit_test_batch(batch: list[list[Trajectory]], engine: Engine, opts: JudgeOptions,
                     judge_info: dict) -> Iterator[list[Judgment]]:
    from rlany.envs.coding import extract_code

    for group in batch:
        for traj in group:
            if len(traj.steps) > 1:
                raise RlanyError(f"trajectory '{traj.traj_id}' has {len(traj.steps)} steps: "
                                 "--mode unit-tests judges single-turn coding trajectories")
    # one test-writing prompt per task, m samples
    asked = [(g, unit_test_messages(next(t.steps[0].obs for t in g if t.steps)))
             for g in batch if any(t.steps for t in g)]
    requests = [Request(messages=messages, adapter=opts.adapter,
                        sampling=replace(opts.sampling, n=opts.m,
                                         seed=stable_seed(opts.seed, "unit-tests",
                                                          g[0].task_id)))
                for g, messages in asked]
    written = {g[0].task_id: (messages, [(c.text, parse_unit_test(c.text))
                                         for c in result.completions])
               for (g, messages), result in zip(asked, engine.generate(requests))}
    # every program against its task's parsed tests, one sandboxed process per program
    jobs = [(t, [test for _, test in written[g[0].task_id][1] if test is not None])
            for g in batch for t in g if t.steps]
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        passed = dict(zip((t.traj_id for t, _ in jobs),
                          pool.map(lambda job: _run_program(
                              extract_code(job[0].steps[0].response), job[1], opts.test_cpu_s),
                              jobs)))
    for group in batch:
        judgments = []
        for traj in group:
            steps = []
            if traj.steps:
                messages, tests = written[traj.task_id]
                verdicts = iter(passed[traj.traj_id])
                samples = [JudgeSample(text=text, test=test,
                                       score=0 if test is None else next(verdicts))
                           for text, test in tests]
                steps.append(StepJudgment(step=0, judge_messages=messages, samples=samples))
            judgments.append(Judgment(traj_id=traj.traj_id, task_id=traj.task_id,
                                      judge=judge_info, steps=steps, mode="unit-tests"))
        yield judgments


def _run_program(code: str, tests: list[dict], cpu_s: float) -> list[int]:
    """+1 / -1 per test: does the program print the expected output?"""
    if not tests:
        return []
    from rlany.sandbox import Limits, outputs_match, run_tests

    results = run_tests(code, [t["input"] for t in tests], Limits(cpu_s=cpu_s))
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

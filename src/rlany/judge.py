"""`rlany judge`: trajectories -> judgments, m verdicts per step from a generative judge.

For every step the judge gets one prompt (`prompts.judge_messages`: the task, the earlier
actions, the observation, the policy's response and what happened next) and `m` samples
are drawn from it in one request, sharing the prompt. All steps of a batch of trajectories
go to the engine in one call. Each sample is parsed with `prompts.parse_verdict`: +1, -1,
or 0 when unparseable (counted and reported, never fatal).

Judgments come out in trajectory order (one per trajectory, grouped by task), which is the
order `rlany score` reads them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from rlany.engines import Engine, Request, Sampling, stable_seed
from rlany.prompts import clip, judge_messages, parse_verdict
from rlany.records import JudgeSample, Judgment, StepJudgment, Trajectory


@dataclass(frozen=True)
class JudgeOptions:
    m: int = 3
    sampling: Sampling = Sampling(max_tokens=384, temperature=0.8)
    adapter: str | None = None
    batch_trajectories: int = 64
    history_steps: int = 5  # earlier actions shown to the judge
    seed: int = 0


def step_prompts(traj: Trajectory, history_steps: int) -> list[list[dict]]:
    """The judge prompt of every step of one trajectory."""
    prompts = []
    for t, step in enumerate(traj.steps):
        first_user = next((m["content"] for m in step.prompt_messages if m["role"] == "user"), "")
        earlier = traj.steps[max(0, t - history_steps):t]
        history = [f"step {t - len(earlier) + k}: {clip(s.action or s.response, 300)} -> "
                   f"{clip(s.next_obs, 300)}" for k, s in enumerate(earlier)]
        prompts.append(judge_messages(first_user, history, step.obs, step.response,
                                      step.next_obs))
    return prompts


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


def _task_groups(trajectories: Iterable[Trajectory]) -> Iterator[list[Trajectory]]:
    group: list[Trajectory] = []
    for traj in trajectories:
        if group and traj.task_id != group[0].task_id:
            yield group
            group = []
        group.append(traj)
    if group:
        yield group


def _judge_batch(batch: list[list[Trajectory]], engine: Engine, opts: JudgeOptions,
                 judge_info: dict) -> Iterator[list[Judgment]]:
    prompts = {t.traj_id: step_prompts(t, opts.history_steps) for g in batch for t in g}
    requests = [Request(messages=p, adapter=opts.adapter,
                        sampling=replace(opts.sampling, n=opts.m,
                                         seed=stable_seed(opts.seed, "judge", tid, k)))
                for tid, steps in prompts.items() for k, p in enumerate(steps)]
    results = iter(engine.generate(requests))
    for group in batch:
        judgments = []
        for traj in group:
            steps = []
            for k, messages in enumerate(prompts[traj.traj_id]):
                result = next(results)
                samples = [JudgeSample(text=c.text, score=parse_verdict(c.text))
                           for c in result.completions]
                steps.append(StepJudgment(step=k, judge_messages=messages, samples=samples))
            judgments.append(Judgment(traj_id=traj.traj_id, task_id=traj.task_id,
                                      judge=judge_info, steps=steps))
        yield judgments

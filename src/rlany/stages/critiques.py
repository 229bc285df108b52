"""The critique summary that `adapt-tasks` hands its rewriter: extracted from the reward
model's judgments of a task's trajectories, optionally condensed by the model."""

from __future__ import annotations

from collections.abc import Iterable

from rlany.engines.base import Engine, Request, Sampling
from rlany.files.records import Judgment
from rlany.prompts import clip, summary_messages

NONE = "(no critiques)"


def critique_summary(judgments: Iterable[Judgment], limit: int) -> str:
    """Extractive summary: critiques of steps judged bad first, near-duplicates dropped."""
    from rapidfuzz import fuzz

    bad, other = [], []
    for j in judgments:
        for step in j.steps:
            for s in step.samples:
                text = s.text.strip()
                if text:
                    (bad if s.score == -1 else other).append(text)
    chosen: list[str] = []
    for text in bad + other:
        if len(chosen) == limit:
            break
        if all(fuzz.ratio(text, c) < 90 for c in chosen):
            chosen.append(text)
    return "\n".join(f"- {clip(c, 400)}" for c in chosen) or NONE


def collect_critiques(judgments: str, task_ids: set[str], limit: int,
                      name: str | None = None) -> dict[str, str]:
    """Critique summaries of the given tasks, streaming the judgments file once."""
    from rlany.files.jsonl import JsonlReader

    grouped: dict[str, list] = {}
    for _, j in JsonlReader(judgments, Judgment, "judgments", name=name):
        if j.task_id in task_ids:
            grouped.setdefault(j.task_id, []).append(j)
    return {tid: critique_summary(js, limit) for tid, js in grouped.items()}


def model_summaries(targets: list, envs: dict, extracted: dict[str, str], engine: Engine,
                     max_tokens: int, adapter: str | None) -> dict[str, str]:
    """`--summary model`: one greedy summary per task of its extracted critiques (tasks
    without critiques keep NONE)."""
    asked = [t for t, _ in targets if extracted[t.task_id] != NONE]
    requests = [Request(messages=summary_messages(envs[t.task_id].describe(t),
                                                  extracted[t.task_id]),
                        sampling=Sampling(max_tokens=min(max_tokens, 160),
                                          temperature=0.0), adapter=adapter)
                for t in asked]
    out = dict(extracted)
    for t, result in zip(asked, engine.generate(requests) if requests else []):
        text = result.completions[0].text.strip()
        if text:
            out[t.task_id] = clip(text, 800)
    return out


def judged_bad_steps(judgments: str, task_ids: set[str], name: str | None = None
                     ) -> dict[str, set[int]]:
    """traj_id -> the steps the judge scored -1 on average (the env's account marks them)."""
    from rlany.files.jsonl import JsonlReader

    bad: dict[str, set[int]] = {}
    for _, j in JsonlReader(judgments, Judgment, "judgments", name=name):
        if j.task_id in task_ids:
            for step in j.steps:
                scores = [s.score for s in step.samples if s.score]
                if scores and sum(scores) < 0:
                    bad.setdefault(j.traj_id, set()).add(step.step)
    return bad


def read_critiques(paths: dict, targets: set[str], opts, stats: dict | None = None
                   ) -> dict[str, str]:
    """task id -> what the rewriter reads (`adapt-tasks --critic`): the judge's critique
    summary, the env's account of the episodes (`env_account`), or (auto) the judge's where
    it says more than verdicts, else the env's."""
    from rlany.stages.env_account import collect_accounts

    judged = (collect_critiques(paths["--judgments"], targets, opts.critiques, opts.judgments)
              if opts.judgments and opts.critic != "env" else {})
    if opts.critic == "judge" or not opts.trajectories:
        return judged
    marked = (judged_bad_steps(paths["--judgments"], targets, opts.judgments)
              if opts.judgments else {})
    accounts = collect_accounts(paths["--trajectories"], targets, opts.critiques,
                                opts.trajectories, marked, stats)
    return accounts if opts.critic == "env" else either(judged, accounts, targets)


def either(judged: dict[str, str], accounts: dict[str, str], targets) -> dict[str, str]:
    """`--critic auto`: per task, the judge's critiques where it wrote more than verdicts,
    else the env's account of its episodes; whichever a task has where it has one."""
    from rlany.stages.env_account import verdict_only

    return {t: accounts[t] if t in accounts and (t not in judged or verdict_only(judged[t]))
            else judged[t] for t in targets if t in judged or t in accounts}

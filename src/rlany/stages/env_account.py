"""The environment's own account of a task's episodes: what `adapt-tasks` hands its rewriter
when the judge wrote no critique (a verdict-only judge, or a task the judge skipped because
its outcomes were uniform, `judge --select used`), or when the loop runs no judge at all.

Per task, from its trajectories: how many episodes succeeded, how each failed one ended,
its actions (the ones the env labelled off-plan marked, where the env labels steps), and
its last observation; failed episodes first, near-identical accounts dropped. The judge's
critiques are the paper's text; this is the same channel filled from the env's record, so
a small rewriter still reads why the policy fails (`--critic env`, or `auto` where a task
has no judge critique)."""

from __future__ import annotations

from rlany.errors import RlanyError
from rlany.files.records import Trajectory
from rlany.prompts import clip
from rlany.stages.episode_errors import errored

NONE = "(no critiques)"
MAX_ACTIONS = 10  # per episode account: the last ones when an episode ran longer


def episode_account(traj: Trajectory, marked: set[int] | None = None) -> str:
    """One episode in one line: how it ended, its actions (`[off-plan]` after an action the
    env labelled -1, or one in `marked`: steps a judge scored -1), its last observation."""
    marked = marked or set()
    actions = []
    for k, step in enumerate(traj.steps):
        act = step.action if step.action is not None else f"invalid: {clip(step.response, 30)!r}"
        bad = step.info.get("label") == -1 or k in marked
        actions.append(act + (" [off-plan]" if bad else ""))
    shown = actions[-MAX_ACTIONS:]
    more = f"... {len(actions) - len(shown)} earlier, then " if len(actions) > len(shown) else ""
    last = traj.steps[-1].next_obs if traj.steps else ""
    ending = {"success": "succeeded", "max_steps": "ran out of steps",
              "failure": "failed", "error": "ended in an error"}.get(traj.finish, traj.finish)
    return (f"{ending} after {len(traj.steps)} actions: {more}{' -> '.join(shown)}. "
            f"Last observation: {clip(' '.join(last.split()), 160)}")


def task_account(trajs: list[Trajectory], limit: int,
                 marked: dict[str, set[int]] | None = None) -> str:
    """A task's account: its success count, then up to `limit` distinct episode accounts,
    failed episodes first, errored ones last."""
    from rapidfuzz import fuzz

    if not trajs:
        return NONE
    marked = marked or {}
    wins = sum(t.outcome == 1 for t in trajs)
    # errored episodes (the env failed, not the policy) last: they say least of the task
    ordered = sorted(trajs, key=lambda t: (errored(t), t.outcome == 1, t.sample))
    chosen: list[str] = []
    for t in ordered:
        if len(chosen) == limit:
            break
        text = episode_account(t, marked.get(t.traj_id))
        if all(fuzz.ratio(text, c) < 90 for c in chosen):
            chosen.append(text)
    broken = sum(map(errored, trajs))  # not the policy's doing: out of the count, said
    head = (f"- the policy succeeded in {wins} of {len(trajs) - broken} episodes"
            + (f" ({broken} more ended in an env error)" if broken else ""))
    return "\n".join([head, *(f"- {clip(c, 500)}" for c in chosen)])


def collect_accounts(trajectories: str, task_ids: set[str], limit: int,
                     name: str | None = None, marked: dict[str, set[int]] | None = None,
                     stats: dict | None = None) -> dict[str, str]:
    """The env's account of each given task, streaming the trajectories file once. With
    `stats` (the task stats adapt-tasks decides by), a task's episodes must be the ones
    they count: same task (`task_sha256`), as many ran and succeeded; else the file comes
    from another rollout, and its account would contradict the accuracy beside it."""
    from rlany.files.jsonl import JsonlReader
    from rlany.files.provenance import TASK_SHA256

    grouped: dict[str, list[Trajectory]] = {}
    first: dict[str, str] = {}
    for where, t in JsonlReader(trajectories, Trajectory, "trajectories", name=name):
        if t.task_id in task_ids:
            grouped.setdefault(t.task_id, []).append(t)
            first.setdefault(t.task_id, where)
            s = (stats or {}).get(t.task_id)
            theirs, ours = (s.extra.get(TASK_SHA256) if s else None), t.extra.get(TASK_SHA256)
            if theirs and ours and theirs != ours:
                raise RlanyError(f"trajectory of another task '{t.task_id}' than its stats' "
                                 f"({TASK_SHA256} differs): from another pool", where=where)
    for tid, ts in grouped.items():
        s = (stats or {}).get(tid)
        ran = [t for t in ts if not errored(t)]
        if s is not None and (len(ran), sum(t.outcome == 1 for t in ran)) != (s.n, s.successes):
            raise RlanyError(f"task '{tid}': {sum(t.outcome == 1 for t in ran)} of {len(ran)} "
                             f"episodes succeeded here, {s.successes} of {s.n} in its stats: "
                             "these trajectories come from another rollout", where=first[tid],
                             hint="give the trajectories the stats were scored from")
    return {tid: task_account(ts, limit, marked) for tid, ts in grouped.items()}


def verdict_only(summary: str) -> bool:
    """A judge summary that says nothing but verdicts (`\\boxed{1}` lines) or nothing."""
    import re

    lines = [ln.strip("- ").strip() for ln in summary.splitlines() if ln.strip()]
    return summary == NONE or all(re.fullmatch(r"(\\boxed\{[+-]?1\}|[+-]?1)\.?", ln)
                                  for ln in lines)

"""Trajectories paired with their judgments, one task group at a time, for `rlany score`:
from two files (in the same order), or from one stream (`rlany judge -o -`), with every
mismatch a one-line error naming the place.

A judgment belongs to a trajectory when it judged that trajectory, not one of another pool
or run with the same ids (`check_judgment`): by the digest of the whole trajectory record
where the judgment carries one (`trajectory_sha256`, `rlany.files.provenance`), else, for one
`rlany judge` wrote (it carries `responses_sha256`), by its responses and by what its judge
prompts show of each judged step (its task, observation and response, verbatim). A
hand-made judgment without either is paired by id and judged steps only."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from rlany.chat import text_of
from rlany.errors import RlanyError
from rlany.files.provenance import TASK_SHA256, TRAJECTORY_SHA256, task_origin, trajectory_digest
from rlany.files.records import MODES, Judgment, Trajectory, responses_digest
from rlany.prompts import clip


def paired(trajectories: Iterable[tuple[str, Trajectory]],
            judgments: Iterable[tuple[str, Judgment]] | None
            ) -> Iterator[tuple[str, Trajectory, Judgment | None]]:
    if judgments is None:
        yield from interleaved(trajectories)
        return
    judged = iter(judgments)
    for where, traj in trajectories:
        nxt = next(judged, None)
        if nxt is None:
            raise RlanyError(f"no judgment for trajectory '{traj.traj_id}': the judgments "
                             "file ended early", where=where)
        jwhere, judgment = nxt
        if judgment.traj_id != traj.traj_id:
            raise RlanyError(f"judgment is for '{judgment.traj_id}' but the trajectory at "
                             f"this position is '{traj.traj_id}' ({where})", where=jwhere,
                             hint="judgments must be in the order of the trajectories file")
        check_judgment(judgment, traj, jwhere)
        yield where, traj, judgment
    extra = next(judged, None)
    if extra is not None:
        raise RlanyError(f"judgment for '{extra[1].traj_id}' has no trajectory", where=extra[0])


def interleaved(records: Iterable[tuple[str, Trajectory | Judgment]]
                 ) -> Iterator[tuple[str, Trajectory, Judgment | None]]:
    """Pair a stream of trajectories and judgments (`judge -o -`: a task's trajectories,
    then their judgments in the same order). A stream without any judgment is a plain
    trajectories file: each task group is yielded unjudged as soon as it is complete."""
    pending: deque[tuple[str, Trajectory]] = deque()
    judged_any, released = False, None  # where the first task passed on unjudged began
    for where, rec in records:
        if isinstance(rec, Trajectory):
            if pending and not judged_any and pending[0][1].task_id != rec.task_id:
                released = released or pending[0]
                while pending:  # no judgment so far: a plain trajectories file
                    yield (*pending.popleft(), None)
            pending.append((where, rec))
            continue
        if released is not None:
            raise RlanyError(f"judgment for '{rec.traj_id}', but task '{released[1].task_id}' "
                             f"({released[0]}) had none: a stream judges every task or none",
                             where=where)
        judged_any = True
        if not pending:
            raise RlanyError(f"judgment for '{rec.traj_id}' comes before its trajectory",
                             where=where, hint="this looks like a judgments file, expected "
                             "trajectories: give it with --judgments, or pipe `rlany judge "
                             "-o -` into score")
        twhere, traj = pending.popleft()
        if rec.traj_id != traj.traj_id:
            raise RlanyError(f"judgment is for '{rec.traj_id}' but the next unjudged "
                             f"trajectory is '{traj.traj_id}' ({twhere})", where=where)
        check_judgment(rec, traj, where)
        yield twhere, traj, rec
    if pending and judged_any:
        where, traj = pending[0]
        raise RlanyError(f"no judgment for trajectory '{traj.traj_id}': the stream ended "
                         "early", where=where)
    while pending:
        yield (*pending.popleft(), None)


def check_judgment(judgment: Judgment, traj: Trajectory, where: str) -> None:
    """A judgment belongs to this trajectory: same id (checked by the caller), the
    trajectory it judged is this one (module docstring), and every judged step exists."""
    if judgment.responses_sha256 is not None and \
            judgment.responses_sha256 != responses_digest(traj.steps):
        raise RlanyError(f"judgment of '{judgment.traj_id}' judged other responses than this "
                         "trajectory's: the judgments come from another rollout with the "
                         "same ids", where=where, hint="judge these trajectories again")
    judged = judgment.extra.get(TRAJECTORY_SHA256)
    if judged is not None and judged != trajectory_digest(traj):
        raise RlanyError(f"judgment of '{judgment.traj_id}' judged another trajectory than "
                         f"this one ({TRAJECTORY_SHA256} {str(judged)[:12]}): its task, "
                         "steps or outcome differ; the judgments come from another pool or "
                         "run with the same ids", where=where,
                         hint="judge these trajectories again")
    indices = [s.step for s in judgment.steps]
    if judgment.skipped is not None:
        if indices:
            raise RlanyError(f"a skipped judgment ({judgment.skipped}) has no steps, got "
                             f"{len(indices)}", where=where)
    elif indices != list(range(len(traj.steps))):
        raise RlanyError(f"judgment covers steps {indices} but the trajectory has "
                         f"{len(traj.steps)} steps", where=where)
    if judgment.mode not in MODES:
        raise RlanyError(f"mode must be one of {', '.join(MODES)}, got '{judgment.mode}'",
                         where=where)
    for s in judgment.steps:
        if not s.samples:
            raise RlanyError(f"step {s.step} has no judge samples", where=where)
        for sample in s.samples:
            if sample.score not in (-1, 0, 1):
                raise RlanyError(f"step {s.step}: score must be -1, 0 or +1, got "
                                 f"{sample.score}", where=where)
    if judged is None and judgment.responses_sha256 is not None:
        _check_shown(judgment, traj, where)


def _check_shown(judgment: Judgment, traj: Trajectory, where: str) -> None:
    """A judgment `rlany judge` wrote before it recorded the trajectory's digest: its judge
    prompt of each judged step shows that step's observation and response verbatim (cut
    at `prompts.clip`), and step 0's the task as `prompts.step_prompts` words it; in mode
    unit-tests, the one test-writing prompt shows the problem (the first observation)."""
    for s in judgment.steps:
        text = "\n".join(text_of(m.get("content")) for m in s.judge_messages)
        step = traj.steps[s.step]
        shown = ([step.obs] if judgment.mode == "unit-tests" else
                 [step.obs, step.response] + ([_task(traj)] if s.step == 0 else []))
        if not all(clip(part) in text for part in shown):
            raise RlanyError(f"judgment of '{judgment.traj_id}' judged another trajectory "
                             f"than this one: its prompt of step {s.step} shows another task, "
                             "observation or response; the judgments come from another pool "
                             "or run with the same ids", where=where,
                             hint="judge these trajectories again")


def _task(traj: Trajectory) -> str:
    """The task as the judge prompt of step 0 shows it (`prompts.step_prompts`): the
    policy's first user message, less the first observation it ends with."""
    step = traj.steps[0]
    first_user = next((text_of(m["content"]) for m in step.prompt_messages
                       if m["role"] == "user"), "")
    if step.obs and first_user.endswith(step.obs):
        return first_user[:-len(step.obs)].strip() or first_user
    return first_user


def groups(items: Iterable[tuple[str, Trajectory, Judgment | None]]
            ) -> Iterator[list[tuple[str, Trajectory, Judgment | None]]]:
    """Consecutive trajectories of one task; a task seen again after others, a trajectory
    id seen twice, trajectories of one task id that answer different tasks (their
    `task_sha256`, where they carry one: two pools mixed) or come from another iteration or
    policy (two rollouts' files concatenated) are refused."""
    seen: set[str] = set()
    group: list[tuple[str, Trajectory, Judgment | None]] = []
    for item in items:
        where, traj, _ = item
        if traj.outcome not in (-1, 1):
            raise RlanyError(f"outcome must be -1 or +1, got {traj.outcome}", where=where)
        if group and traj.task_id != group[0][1].task_id:
            yield group
            group = []
        if not group:
            if traj.task_id in seen:
                raise RlanyError(f"task '{traj.task_id}' appears again after other tasks; "
                                 "the samples of one task must be consecutive", where=where)
            seen.add(traj.task_id)
        else:
            _check_member(group, traj, where)
        group.append(item)
    if group:
        yield group


def _check_member(group: list[tuple[str, Trajectory, Judgment | None]], traj: Trajectory,
                  where: str) -> None:
    first = next((w for w, t, _ in group if t.traj_id == traj.traj_id), None)
    if first is not None:
        raise RlanyError(f"duplicate trajectory '{traj.traj_id}' (first at {first})",
                         where=where, hint="each trajectory once: a record repeated would "
                         "count and train twice")
    head_where, head = group[0][0], group[0][1]
    if (traj.iteration, traj.policy) != (head.iteration, head.policy):
        what = (f"iteration {traj.iteration}" if traj.iteration != head.iteration else
                f"policy {traj.policy}")
        raise RlanyError(f"trajectory '{traj.traj_id}' is of {what}; its task group began "
                         f"at {head_where} with another (iteration {head.iteration}): two "
                         "rollouts are mixed", where=where, hint="score one rollout's file "
                         "at a time")
    task = traj.extra.get(TASK_SHA256)
    other = next(((w, t) for w, t, _ in group if t.extra.get(TASK_SHA256) not in (None, task)),
                 None)
    if task is not None and other is not None:
        raise RlanyError(f"trajectory '{traj.traj_id}' answers another task '{traj.task_id}' "
                         f"than {other[0]} ({TASK_SHA256} differs): two pools with the same "
                         "ids are mixed", where=where)


def group_origin(trajs: list[Trajectory]) -> dict:
    """The `task_sha256` a task group's trajectories carry, for its task stats ({} where the
    first has none; `groups` refused a group whose trajectories name different ones)."""
    return task_origin(trajs[0].extra) if trajs else {}

"""Trajectories paired with their judgments, one task group at a time, for `rlany score`:
from two files (in the same order), or from one stream (`rlany judge -o -`), with every
mismatch a one-line error naming the place."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from rlany.errors import RlanyError
from rlany.records import MODES, Judgment, Trajectory, responses_digest


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
    judged_any = False
    for where, rec in records:
        if isinstance(rec, Trajectory):
            if pending and not judged_any and pending[0][1].task_id != rec.task_id:
                while pending:  # no judgment so far: a plain trajectories file
                    yield (*pending.popleft(), None)
            pending.append((where, rec))
            continue
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
    responses it judged are this trajectory's (its `responses_sha256`, which every
    judgment `rlany judge` writes carries; a hand-made judgment without it is paired by id
    and step count only), and every judged step exists."""
    if judgment.responses_sha256 is not None and \
            judgment.responses_sha256 != responses_digest(traj.steps):
        raise RlanyError(f"judgment of '{judgment.traj_id}' judged other responses than this "
                         "trajectory's: the judgments come from another rollout with the "
                         "same ids", where=where, hint="judge these trajectories again")
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


def groups(items: Iterable[tuple[str, Trajectory, Judgment | None]]
            ) -> Iterator[list[tuple[str, Trajectory, Judgment | None]]]:
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
        elif any(traj.traj_id == g[1].traj_id for g in group):
            raise RlanyError(f"duplicate trajectory '{traj.traj_id}'", where=where)
        group.append(item)
    if group:
        yield group

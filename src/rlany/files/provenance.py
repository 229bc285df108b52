"""Provenance: do two inputs come from the same run? A stage's inputs are checked against
each other through their `.meta.json` sidecars (which input each was made from, by sha256)
before anything is computed: judgments of another rollout, or stats scored with other
judgments, are refused with one line naming the file.

Records also carry their origin themselves, for when the sidecar is gone (a copy, a
stream): a judgment the digest of the trajectory record it judged (`trajectory_sha256`,
`trajectory_digest`, checked by `pairing.check_judgment`), and a record that says which
task it answers the digest of that task (`task_sha256`, `task_digest`: id, env, spec and
prompt), checked against the pool by `check_task_origin`. A record without them (hand-made,
or older) is unknown and paired the old way: by id and the responses digest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rlany.errors import RlanyError
from rlany.files.jsonl import JsonlReader, meta_path
from rlany.files.records import Judgment, Task, TaskStats, Trajectory, to_json

TASK_SHA256 = "task_sha256"  # a column: the digest of the task a record answers
TRAJECTORY_SHA256 = "trajectory_sha256"  # a judgment's column: the trajectory it judged


def sidecar(path: str | Path) -> dict | None:
    """The `.meta.json` of an input (None: hand-made data, or stdin)."""
    meta = meta_path(path)
    if str(path) == "-" or not meta.is_file():
        return None
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        raise RlanyError("unreadable sidecar metadata", where=str(meta)) from None
    return data if isinstance(data, dict) else None


def _source(meta: dict | None, stage: str, index: int = 0) -> str | None:
    """The sha256 of input `index` that a `stage` sidecar records (None where unknown)."""
    if not meta or meta.get("stage") != stage:
        return None
    inputs = meta.get("inputs")
    if not isinstance(inputs, list) or len(inputs) <= index or not isinstance(
            inputs[index], dict):
        return None
    sha = inputs[index].get("sha256")
    return sha if isinstance(sha, str) else None


def check_judged(trajectories: str, judgments: str, names: tuple[str, str]) -> None:
    """Judgments whose sidecar names the trajectories they were made from must name this
    trajectories file (by content digest). Without a sidecar, `pairing.check_judgment`
    still compares each judgment's responses digest with its trajectory's."""
    judged = _source(sidecar(judgments), "judge")
    if judged is not None and judged != sha256_file(trajectories):
        raise RlanyError(f"these judgments were made from another trajectories file "
                         f"(sha256 {judged[:12]}), not from {names[0]}", where=names[1],
                         hint="judge these trajectories, or give this rollout's judgments")


def check_adapt_inputs(stats: str, judgments: str | None, names: tuple[str, str | None]
                       ) -> None:
    """adapt-tasks' stats and judgments must come from one rollout: where both sidecars
    say, the trajectories they were made from are the same file, and the judgments are the
    ones those stats were scored with."""
    stats_meta = sidecar(stats)
    if judgments is None or stats_meta is None:
        return
    scored_from = _source(stats_meta, "score")
    judged_from = _source(sidecar(judgments), "judge")
    if scored_from and judged_from and scored_from != judged_from:
        raise RlanyError("the task stats and the judgments come from different rollouts "
                         f"(trajectories sha256 {scored_from[:12]} vs {judged_from[:12]})",
                         where=names[1], hint="give the judgments of the rollout the stats "
                         "were scored from")
    scored_with = _source(stats_meta, "score", 1)
    if scored_with and scored_with != sha256_file(judgments):
        raise RlanyError(f"{names[0]} was scored with other judgments than this file",
                         where=names[1], hint="give the judgments the stats were scored with")


def check_scored_from(stats: str, trajectories: str, names: tuple[str, str]) -> None:
    """adapt-tasks' trajectories (the env's account) must be the ones its stats were scored
    from, where the stats' sidecar says."""
    scored_from = _source(sidecar(stats), "score")
    if scored_from and scored_from != sha256_file(trajectories):
        raise RlanyError(f"{names[0]} was scored from another trajectories file",
                         where=names[1], hint="give the trajectories the stats were scored "
                         "from")


def judged_tasks(judgments: str, name: str | None) -> dict[str, str]:
    """task id -> where it is first judged, for checking judgments against the stats."""
    seen: dict[str, str] = {}
    for where, j in JsonlReader(judgments, Judgment, "judgments", allow_empty=True, name=name):
        seen.setdefault(j.task_id, where)
    return seen


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _digest(obj: object) -> str:
    """sha256 of canonical JSON (keys sorted, UTF-8): the same record read from any copy,
    reordered or re-serialized, has the same digest."""
    data = json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                      allow_nan=False)
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()


def task_digest(task: Task) -> str:
    """The task a record answers, by content: its id, env, spec and prompt (not its lineage
    or split, which adapt-tasks updates without changing the problem)."""
    return _digest({"task_id": task.task_id, "env": task.env, "spec": task.spec,
                    "prompt": task.prompt})


def trajectory_digest(traj: Trajectory) -> str:
    """The trajectory a judgment judged: its ids, every step (prompts, observations,
    responses, actions, env info), outcome and finish, and `task_sha256` where rollout wrote
    one. Not the policy's name or adapter path, nor token counts: the same episodes of two
    run directories are judged alike."""
    record = to_json(traj)
    return _digest({**{k: record[k] for k in ("traj_id", "task_id", "iteration", "sample",
                                              "steps", "outcome", "finish")},
                    **task_origin(traj.extra)})


def task_origin(extra: dict) -> dict:
    """A record's `task_sha256` column, for the record made from it to carry ({} where it
    has none): a trajectory's onto its judgment, a task group's onto its task stats."""
    digest = extra.get(TASK_SHA256)
    return {TASK_SHA256: digest} if isinstance(digest, str) else {}


def judgment_origin(traj: Trajectory) -> dict:
    """The columns a judgment of `traj` carries (its `extra`): the judged trajectory's
    digest, and the digest of the task it answers where the trajectory has one."""
    return {TRAJECTORY_SHA256: trajectory_digest(traj), **task_origin(traj.extra)}


def check_task_origin(extra: dict, task: Task, where: str, what: str) -> None:
    """A record (`what`: "task stats", "judgment", ...) that names the digest of the task
    it answers must name this pool's task of that id; without one it is unknown (an older or
    hand-made record) and is taken as before."""
    recorded = extra.get(TASK_SHA256)
    if recorded is None:
        return
    if not isinstance(recorded, str):
        raise RlanyError(f"field '{TASK_SHA256}' must be a string", where=where)
    if recorded != task_digest(task):
        raise RlanyError(f"{what} of another task '{task.task_id}' than the pool's "
                         f"({TASK_SHA256} {recorded[:12]}, the pool's task "
                         f"{task_digest(task)[:12]}): from another pool with the same ids",
                         where=where, hint="give the files of a rollout of this pool")


def check_answers_pool(tasks: list[Task], stats: str, judgments: str | None,
                       names: tuple[str, str | None]) -> None:
    """adapt-tasks' stats and judgments answer this pool's tasks (or its pending ones): each
    record of a known task id that carries `task_sha256` must name that task's digest, so
    the files of another pool with the same ids are refused at their first line."""
    pool = {t.task_id: t for t in tasks}
    readers = [(JsonlReader(stats, TaskStats, "task stats", name=names[0]), "task stats")]
    if judgments is not None:
        readers.append((JsonlReader(judgments, Judgment, "judgments", allow_empty=True,
                                    name=names[1]), "judgment"))
    for reader, what in readers:
        for where, record in reader:
            if record.task_id in pool:
                check_task_origin(record.extra, pool[record.task_id], where, what)


def differing_keys(old: Any, new: Any) -> list[str]:
    """Where two records of what made a file differ, as dotted keys (`input`, `flags.lr`,
    `flags.content.adapter`: an adapter's weights rewritten in place), sorted."""
    a, b = _flat(old), _flat(new)
    return sorted(k for k in set(a) | set(b) if a.get(k, a) != b.get(k, a))


def _flat(value: Any, at: str = "") -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        return {at.rstrip(".") or "(all)": value}
    return {k: v for key, item in value.items() for k, v in _flat(item, f"{at}{key}.").items()}

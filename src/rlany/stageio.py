"""File plumbing shared by the stage drivers: paths checked and inputs read once (the engine a
stage starts, and its adapters' checks, are `rlany.stage_engine`'s). The stage modules hold
the logic; this module holds no math and no stage-specific rule (whether two inputs belong
together is `rlany.files.provenance`).

* `check_paths` refuses an output that would overwrite an input, and an output or a file
  written beside it that is no regular file; `spool_input` copies stdin (or a named pipe)
  to a temp file, for a stage that reads its input twice. `output_lock` (`rlany.files.locks`,
  imported here by the stages) keeps two processes from writing one output.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlany.errors import RlanyError, UsageError
from rlany.files.jsonl import JsonlReader
from rlany.files.locks import lock_path, output_lock, output_state  # noqa: F401 (the stages' import)

Sides = dict[str, list[tuple[str, Path, bool]]]  # flag -> (what, path, a directory?)


def prepare_paths(inputs: dict[str, str | None], outputs: dict[str, str | None],
                  sides: Sides | None = None) -> dict[str, str | None]:
    """Refuse outputs that name an input (or each other), then spool `-`, FIFOs and process
    substitutions once into temp files. Returns the readable path of each input."""
    check_paths(inputs, outputs, sides)
    return {k: (spool_input(v)[0] if v else v) for k, v in inputs.items()}


def read_tasks(path: str | Path, allow_empty: bool = False, name: str | None = None,
               check: Callable[[Any], None] | None = None):
    """All tasks of a file (a task pool is small), with env names, unique ids and each
    spec checked by its env's own `validate` (`envs.spec_problems`).
    `allow_empty` for candidate files: an iteration may propose no candidate at all.
    `check(task)`: a stage's own rule; the RlanyError it raises is reported at the line."""
    from rlany import envs
    from rlany.files.records import Task

    reader = JsonlReader(path, Task, "tasks", allow_empty=allow_empty, name=name)
    tasks, seen = [], set()
    known = envs.names()
    checkers: dict = {}  # env name -> one env object whose validate checks every spec
    for where, task in reader:
        if task.env not in known:
            raise RlanyError(f"unknown environment '{task.env}'", where=where,
                             hint=f"known: {', '.join(known)}")
        if task.task_id in seen:
            raise RlanyError(f"duplicate task_id '{task.task_id}'", where=where)
        seen.add(task.task_id)
        if task.env not in checkers:
            checkers[task.env] = envs.make_env(task.env)
        problems = envs.spec_problems(checkers[task.env], task.spec)
        if problems:  # a task its env cannot grade would be scored -1 whatever the answer
            raise RlanyError(f"the {task.env} env refuses this task's spec: "
                             + "; ".join(problems), where=where)
        if check is not None:
            try:
                check(task)
            except RlanyError as e:
                raise RlanyError(e.message, where=where, hint=e.hint) from None
        tasks.append(task)
    return tasks, reader


def read_stats(path: str | Path, name: str | None = None,
               tasks: set[str] | None = None) -> dict:
    """Task stats by task id, each once; with `tasks`, every id must be one of them (stats
    of another pool are refused at their line, never silently ignored)."""
    from rlany.files.records import TaskStats

    stats: dict = {}
    for where, s in JsonlReader(path, TaskStats, "task stats", name=name):
        if s.task_id in stats:
            raise RlanyError(f"duplicate task_id '{s.task_id}'", where=where)
        if tasks is not None and s.task_id not in tasks:
            raise RlanyError(f"stats of task '{s.task_id}', which is neither in the pool nor "
                             "pending: these stats come from another pool", where=where,
                             hint="give the task_stats.jsonl of a rollout of this pool")
        stats[s.task_id] = s
    return stats


def check_paths(inputs: dict[str, str | None], outputs: dict[str, str | None],
                sides: Sides | None = None) -> None:
    """Usage errors before anything is read or written: an output, its `.meta.json`
    sidecar or a file the stage writes beside it (`sides`: a partial output and its index,
    a lock, a trainer's metrics, partial state and temp checkpoint) that is not a regular
    file (`outputs.check_target`: a device, a FIFO, a link, a directory; a side directory:
    not a directory), any of those naming an input file or an input's sidecar (writing it
    would destroy the input or its provenance), two outputs naming one file, or more than
    one input or output on stdin/stdout. The same file under two names (a symlink, a hard
    link) counts as one. Keys are the flags, for the message."""
    from rlany.files.jsonl import meta_path
    from rlany.files.outputs import check_target

    for group, what in ((inputs, "stdin"), (outputs, "stdout")):
        dashes = [flag for flag, p in group.items() if p == "-"]
        if len(dashes) > 1:
            raise UsageError(f"{' and '.join(dashes)} both use {what} (-); at most one can")
    seen: dict[Any, str] = {}

    def keys(p: str | Path) -> list:
        out: list = [os.path.realpath(p)]
        try:
            st = os.stat(p)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            pass
        return out

    for flag, p in inputs.items():
        if p and p != "-":
            for path, label in ((p, flag), (meta_path(p), f"{flag}'s sidecar")):
                for key in keys(path):
                    seen.setdefault(key, label)
    for flag, p in outputs.items():
        if not p or p == "-":
            continue
        beside = [(f"{flag}'s sidecar", meta_path(p), False),
                  *((f"{flag}'s {what}", path, d) for what, path, d in (sides or {}).get(flag, ()))]
        for label, path, _ in [(flag, p, False), *beside]:
            for key in keys(path):
                if key in seen:
                    raise UsageError(f"{label} {path} is also {seen[key]}: writing it would "
                                     "destroy that file; choose another output")
            for key in keys(path):
                seen[key] = label
        try:
            check_target(p)
        except RlanyError as e:
            raise UsageError(f"{flag} {p}: {e.message}", hint=e.hint) from None
        for label, path, directory in beside:
            try:
                check_target(path, directory=directory)
            except RlanyError as e:
                raise UsageError(f"{label} {path}: {e.message}", hint="remove it, or choose "
                                 f"another {flag}") from None


def spool_input(path: str) -> tuple[str, str]:
    """(a path that can be read more than once, the name to show): stdin (`-`) and named
    pipes are copied to a temp file, removed when the process exits; a plain file is
    returned as it is."""
    if path != "-":
        try:
            if not stat.S_ISFIFO(os.stat(path).st_mode):
                return path, path
        except OSError:
            return path, path  # the reader reports a missing file with its name
    import atexit

    if path == "-" and sys.stdin is None:
        raise RlanyError("stdin is closed", where="<stdin>")
    fd, tmp = tempfile.mkstemp(prefix="rlany-stdin.", suffix=".jsonl")
    with os.fdopen(fd, "wb") as f:
        if path == "-":
            shutil.copyfileobj(sys.stdin.buffer, f)
        else:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, f)
    atexit.register(lambda: Path(tmp).unlink(missing_ok=True))
    return tmp, path


def resumable_sides(path: str) -> Sides:
    """The files a resumable output (rollout, judge) writes beside `path`: checked with it."""
    from rlany.files.outputs import partial_paths

    if path == "-":
        return {}
    partial, index = partial_paths(path)
    return {"--output": [("partial output", partial, False), ("partial index", index, False),
                         ("lock", lock_path(path), False)]}

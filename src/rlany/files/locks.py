"""One writer per output: `output_lock` holds an flock on a `.X.lock` file beside an output
while a stage writes it; a second writer fails at once, and a writer that checked before
another one finished re-checks once it holds the lock (tests/test_kill_resume.py holds the
race)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from rlany._testhook import pause
from rlany.errors import RlanyError


def lock_path(path: str | Path) -> Path:
    target = Path(path)
    return target.with_name(f".{target.name}.lock")


def output_state(path: str | Path) -> tuple:
    """What is at an output and its sidecar now (identity, size, mtime; None: nothing):
    taken before a stage's slow start and compared once its lock is held."""
    from rlany.files.jsonl import meta_path

    def one(p: str | Path) -> tuple | None:
        try:
            st = os.stat(p)
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
    return () if str(path) == "-" else (one(path), one(meta_path(path)))


@contextlib.contextmanager
def output_lock(path: str | Path, new: bool = False, seen: tuple | None = None,
                busy: str = "another rlany process is writing this output; wait for it or "
                "stop it") -> Iterator[None]:
    """Hold an exclusive lock on `path` while a stage writes it (a `.X.lock` file beside
    it, flock: released by the kernel when the process dies, so a killed stage never
    leaves a stale lock). A second writer fails at once (`busy`) instead of interleaving.
    Re-checked once the lock is held, so a writer that checked before another one finished
    neither overwrites nor redoes its work: `new=True` (a checkpoint directory), `path`
    must still not exist; `seen` (`output_state` when the stage began), the output and its
    sidecar must be as they were then."""
    if str(path) == "-":
        yield
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_path(target)
    pause("lock")  # a test hook (rlany._testhook): the lock race test holds a process here
    # a link is not followed nor a FIFO waited on (ELOOP, ENXIO: an OSError, one line);
    # the stages' up-front checks (`stageio.check_paths`) refuse both before they start
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "a") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RlanyError(busy, where=str(path)) from None
        try:
            if new and target.exists():
                raise RlanyError("exists: another process finished it", where=str(path),
                                 hint="choose another --output or delete it")
            if seen is not None and output_state(target) != seen:
                raise RlanyError("another process finished this output while this one was "
                                 "starting; nothing redone", where=str(path),
                                 hint="it is complete: use it, or rerun to make it again")
            yield
        finally:
            lock.unlink(missing_ok=True)
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)

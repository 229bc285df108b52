"""A test hook, not a product flag: it lets a test stop a stage at an exact point of its
writing, so a SIGKILL is known to land there (tests/test_kill_resume.py), or hold a process
before it takes an output's lock (the lock race). The one place `RLANY_TEST_PAUSE` is read.

`RLANY_TEST_PAUSE=POINT:N:MARKER`: the N-th time this process reaches `POINT` it writes
the file MARKER (its text: `POINT N`) and waits until MARKER.go exists, then goes on. The
points (docs/guarantees.md lists what each test holds):

    group       a resumable output's group is on disk and indexed (N groups complete)
    group-data  a group's records are on disk, its index line not yet written (torn)
    record      an atomic output's N-th record is flushed into its temp file
    state       a trainer saved its resumable state after optimizer step N (N-th save)
    lock        a stage is about to take its output's lock (after its up-front checks)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_counts: dict[str, int] = {}
_spec: list[str] = []  # RLANY_TEST_PAUSE, read at the first call (writers call this per record)


def pause(point: str, flush=None) -> None:
    """Stop here if `RLANY_TEST_PAUSE` names this point and its count is reached (a string
    comparison otherwise); `flush()` first puts what was written on disk."""
    if not _spec:
        _spec.append(os.environ.get("RLANY_TEST_PAUSE") or "")
    spec = _spec[0]
    if not spec.startswith(point + ":"):
        return
    _, count, marker = spec.split(":", 2)
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] != int(count):
        return
    if flush is not None:
        flush()
    tmp = Path(marker + ".tmp")
    tmp.write_text(f"{point} {count}\n")
    os.replace(tmp, marker)  # the test never reads a half-written marker
    while not Path(marker + ".go").exists():
        time.sleep(0.01)

"""How every output file is written: whole or not at all, and never over a device.

* `AtomicJsonl(path)` writes to a temp file beside `path` and renames it into place only when
  the stage finishes; a killed or failed stage leaves no output. `-` streams to stdout.
  `atomic_outputs` commits several files together: all or none. `write_text_atomic` is the
  same for one text file.
* `ResumableJsonl(path)` is for the expensive stages (rollout, judge): it appends whole
  groups to `path.partial` and records each completed group in `path.partial.idx` after an
  fsync; a rerun keeps the recorded groups, drops anything after them, and continues.
  `-` streams groups to stdout as they complete (a pipe cannot resume).
* `write_meta` writes `X.meta.json` (schema version, flags, inputs with sha256, counts, wall
  time, versions). It is written after the data, so "meta exists" means "output complete".
* `check_target` is the one rule every writer here applies: an output only ever replaces a
  regular file (or creates a new one), never a device, a FIFO, a socket or a directory.

Lines are `rlany.files.jsonl.dumps`'s canonical JSON; reading is `rlany.files.jsonl`.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import stat
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import jsonlines

from rlany._testhook import pause
from rlany.errors import RlanyError
from rlany.files.jsonl import JsonlReader, dumps, meta_path
from rlany.files.records import SCHEMA_VERSION


def check_target(path: str | Path, directory: bool = False) -> None:
    """The rule every output obeys (the atomic writers, the resumable writer and the
    stages' output checks all call this): an output may be a new file or replace a regular
    file; a device, a FIFO, a socket or a directory at that path is never replaced (as
    root, replacing `/dev/null` would break the machine). Nor is a symbolic link (writing
    renames a new file over the link itself, never through it: `/dev/stdout` is a link to
    `/proc/self/fd/1`), nor a path that resolves into /proc or /dev. `directory`: a
    directory the writer makes and fills (a trainer's partial state): one, or nothing."""
    link = os.path.islink(path)
    real = os.path.realpath(path)
    system = str(path).startswith(("/proc/", "/dev/")) or real.startswith(("/proc/", "/dev/"))
    if link and not system:
        system = os.readlink(path).startswith(("/proc/", "/dev/"))
    if link or system:
        what = f"a symbolic link (to {real})" if link else "a /proc or /dev path"
        raise RlanyError(f"output is {what}: rlany replaces a regular file by renaming a new "
                         "one over it, which a link or /proc path would not survive",
                         where=str(path), hint="write to stdout with -o - and redirect it "
                         "there" if system else f"give the file itself: -o {real}")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise RlanyError("a parent of this path is a file, not a directory",
                         where=str(path)) from None
    except OSError:
        return  # unreadable: the write itself reports it
    if stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode):
        return
    if directory:
        raise RlanyError("not a directory: rlany makes and fills this directory itself",
                         where=str(path))
    kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "not a regular file")
    raise RlanyError(f"output is {kind}: rlany only replaces regular files", where=str(path),
                     hint=None if stat.S_ISDIR(mode) else
                     "write to stdout with -o - and redirect it there")


class AtomicJsonl:
    """Write records to `path` atomically (temp file + rename); `-` means stdout.

    Lines are written by `jsonlines.Writer` with `jsonl.dumps`, the canonical line (records
    converted, no NaN/inf, UTF-8 kept). Reading stays hand-written (`JsonlReader`): it must
    hash the bytes as it streams, cap a line's length and name `file:line` in every error,
    which jsonlines' reader does not do together. Any failure (a full disk at the last
    flush included) removes the temp file and leaves `path` as it was. `defer=True`: the
    data is synced on exit but renamed into place only by `commit()` (`atomic_outputs`)."""

    def __init__(self, path: str | Path, defer: bool = False):
        self.path = str(path)
        self.count = 0
        self.defer = defer
        self._tmp: str | None = None
        self._out: IO[str] | None = None
        self._writer: jsonlines.Writer | None = None

    def __enter__(self) -> AtomicJsonl:
        if self.path == "-":
            if sys.stdout is None:
                raise RlanyError("stdout is closed", where="-")
            self._out = sys.stdout
            self._writer = jsonlines.Writer(self._out, dumps=dumps)
            return self
        target = Path(self.path)
        check_target(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(target)
        fd, self._tmp = tempfile.mkstemp(dir=target.parent,
                                         prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp")
        self._out = os.fdopen(fd, "w", encoding="utf-8")
        self._writer = jsonlines.Writer(self._out, dumps=dumps)
        return self

    def write(self, record: Any) -> None:
        assert self._writer is not None
        self._writer.write(record)
        self.count += 1
        if self._tmp is not None:
            pause("record", self._out.flush)  # a test hook (rlany._testhook)

    def write_all(self, records: Iterable[Any]) -> None:
        for r in records:
            self.write(r)

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self._out is not None
        if self.path == "-":
            if exc_type is None:
                self._out.flush()
            return
        _name(exc, self.path)  # a write into the temp file failed (a full disk): name the output
        try:
            if exc_type is None:
                self._out.flush()
                os.fsync(self._out.fileno())
            self._out.close()
            if exc_type is None and not self.defer:
                self.commit()
        except BaseException as e:
            self.abort()
            _name(e, self.path)
            raise
        if exc_type is not None:
            self.abort()

    def commit(self) -> None:
        """Rename the synced temp file into place (the writer has exited)."""
        if self._tmp is not None:
            check_target(self.path)
            os.replace(self._tmp, self.path)
            self._tmp = None

    def abort(self) -> None:
        if self._out is not None and not self._out.closed:
            try:
                self._out.close()
            except OSError:
                pass  # the data is being dropped; what failed was reported already
        if self._tmp is not None:
            Path(self._tmp).unlink(missing_ok=True)
            self._tmp = None


def _name(exc: BaseException | None, path: str) -> None:
    """An OSError from writing an output's file descriptor carries no file name: give it
    the output's, so the one-line error names the file, not stdout."""
    if isinstance(exc, OSError) and exc.filename is None:
        exc.filename = path


@contextmanager
def atomic_outputs(*paths: str | Path | None) -> Iterator[list[AtomicJsonl | None]]:
    """Several outputs of one stage (score: scored + stats), committed together: every file
    is written and synced first, then all are renamed into place; a failure in any (a full
    disk, a bad record, an interrupt) leaves every path as it was. None: no such output."""
    writers = [AtomicJsonl(p, defer=True) if p else None for p in paths]
    try:
        with ExitStack() as stack:
            for w in writers:
                if w is not None:
                    stack.enter_context(w)
            yield writers
    except BaseException:
        for w in writers:
            if w is not None:
                w.abort()
        raise
    for w in writers:
        if w is not None:
            w.commit()


def _remove_stale_temps(target: Path) -> None:
    """Temp files of writers that were killed (their pid, in the name, is gone)."""
    for tmp in target.parent.glob(f".{target.name}.*.tmp"):
        pid = tmp.name[len(target.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ResumableJsonl:
    """Append whole groups to `path.partial`; rename to `path` on `finish()`.

    `path.partial.idx` holds one line per completed group: `{"key": ..., "end": byte_offset}`,
    written after the group's bytes are fsynced. On reopen, the partial file is cut back to
    the last recorded offset (dropping a group that was being written when the process was
    killed) and `done` lists the keys already written, so the caller skips them.
    """

    def __init__(self, path: str | Path, header: dict | None = None):
        """`header` (the stage's flags and input hash) is the index's first line: a partial
        output made with another header is refused rather than silently mixed in.
        `path` `-` streams each group to stdout and never resumes."""
        self.done: list[str] = []
        self.count = 0
        self.stream = str(path) == "-"
        if self.stream:
            return
        self.path = Path(path)
        self.partial, self.index = partial_paths(self.path)
        for target in (self.path, self.partial, self.index):
            check_target(target)
        self.header = json.loads(json.dumps({"header": header or {}}, sort_keys=True))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        end = self._recover()
        self._out = open(self.partial, "ab")
        self._out.truncate(end)
        self._idx = open(self.index, "a", encoding="utf-8")

    def _recover(self) -> int:
        end = 0
        head = json.dumps(self.header, sort_keys=True)
        if self.index.exists() and self.partial.exists():
            lines = self.index.read_text(encoding="utf-8").splitlines()
            first = _loads_or_none(lines[0]) if lines else None
            # an index from before headers says nothing of its flags or input: not resumed
            if lines and (not isinstance(first, dict) or first != self.header):
                from rlany.files.provenance import differing_keys
                what = ", ".join(differing_keys(first["header"], self.header["header"])[
                    :4]) if isinstance(first, dict) and "header" in first else "no header"
                raise RlanyError(
                    f"a partial output from a run with other flags or input is here ({what}"
                    "); rerun with the same ones to resume, or delete "
                    f"{self.partial.name} and {self.index.name} to start over",
                    where=str(self.partial))
            good: list[str] = [head]
            for line in lines[1:]:
                entry = _loads_or_none(line)
                if not isinstance(entry, dict) or "key" not in entry:
                    break  # a torn index line: everything before it is still good
                good.append(line)
                self.done.append(entry["key"])
                end = entry["end"]
                self.count += entry["records"]
            size = self.partial.stat().st_size
            if end > size:  # the index claims bytes that never reached the disk
                raise RlanyError("partial output is shorter than its index; delete "
                                 f"{self.partial} and {self.index} to start over",
                                 where=str(self.partial))
            write_text_atomic(self.index, "".join(g + "\n" for g in good))
        else:
            self.index.unlink(missing_ok=True)
            self.partial.unlink(missing_ok=True)
            write_text_atomic(self.index, head + "\n")
        return end

    def write_group(self, key: str, records: list[Any]) -> None:
        data = "".join(dumps(r) + "\n" for r in records).encode("utf-8")
        if self.stream:
            if sys.stdout is None:
                raise RlanyError("stdout is closed", where="-")
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            self.done.append(key)
            self.count += len(records)
            return
        self._out.write(data)
        self._out.flush()
        os.fsync(self._out.fileno())
        pause("group-data")  # test hooks (rlany._testhook): a torn group, a whole one
        self._idx.write(json.dumps({"key": key, "end": self._out.tell(),
                                    "records": len(records)}, allow_nan=False) + "\n")
        self._idx.flush()
        os.fsync(self._idx.fileno())
        self.done.append(key)
        self.count += len(records)
        pause("group")

    def finish(self) -> None:
        if self.stream:
            return
        self._out.close()
        self._idx.close()
        check_target(self.path)
        os.replace(self.partial, self.path)
        self.index.unlink()

    def close(self) -> None:
        if self.stream:
            return
        self._out.close()
        self._idx.close()


def partial_paths(path: str | Path) -> tuple[Path, Path]:
    """(`path.partial`, `path.partial.idx`): what `ResumableJsonl(path)` writes beside it."""
    p = Path(path)
    return p.with_name(p.name + ".partial"), p.with_name(p.name + ".partial.idx")


def _loads_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def package_versions(*names: str) -> dict[str, str]:
    """The sidecar's `versions`: python, rlany and `names`, plus `rlany_source` (rlany's
    version string does not change with its code: an editable install's commits share it)."""
    out = {"python": platform.python_version()}
    for name in ("rlany", *names):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    out["rlany_source"] = source_digest()
    return out


@functools.cache
def source_digest() -> str:
    """sha256 (first 16 hex digits) over the rlany package's Python files, paths and bytes."""
    import hashlib

    root = Path(__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def write_meta(output: str | Path, *, stage: str, flags: dict[str, Any],
               inputs: list[JsonlReader | dict], counts: dict[str, Any], started: float,
               versions: tuple[str, ...] = ()) -> None:
    """Write the `X.meta.json` sidecar of `output` atomically (nothing for stdout)."""
    from rlany.files.provenance import sha256_file

    if str(output) == "-":
        return
    meta = {
        "schema_version": SCHEMA_VERSION,
        "stage": stage,
        "output": Path(output).name,
        "sha256": sha256_file(output) if Path(output).is_file() else None,  # a join checks it
        "flags": {k: (str(v) if isinstance(v, Path) else v) for k, v in flags.items()},
        "inputs": [i if isinstance(i, dict) else
                   {"path": i.name, "sha256": i.sha256, "records": i.count} for i in inputs],
        "counts": counts,
        "wall_time_s": round(time.time() - started, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": package_versions(*versions),
    }
    write_text_atomic(meta_path(output), json.dumps(meta, indent=2, allow_nan=False) + "\n")


def write_text_atomic(path: str | Path, text: str) -> None:
    """`path` replaced by `text` whole or not at all (the temp file is removed on any
    failure); only a regular file is ever replaced (`check_target`)."""
    path = Path(path)
    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)  # a writer killed between mkstemp and rename left its temp
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

"""Reading JSONL: streaming, line-numbered errors, and the canonical line format.

* `JsonlReader(path, Record)` yields `(where, record)` pairs, `where = "path:line"`, one line
  at a time (memory does not grow with the file), hashing the bytes as it goes so the
  sidecar can name the exact input. Malformed input raises `RlanyError` naming the line.
* `dumps` is the one canonical JSON line every writer uses; `meta_path` names a file's
  `X.meta.json` sidecar, and `check_schema_version` refuses one of another schema version.

Writing (atomic, resumable, the sidecar itself) is `rlany.files.outputs`.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

from rlany.errors import RlanyError
from rlany.files.records import SCHEMA_VERSION, from_json, to_json

R = TypeVar("R")

MAX_LINE_BYTES = 64 * 1024 * 1024  # a longer line is an error, never a memory blow-up
# deeper JSON is an error: how deep Python's recursion reaches depends on the caller, so a
# record a stage could read might crash a later step (or the next stage) that recurses
MAX_DEPTH = 100
_TOO_DEEP = f"JSON nested too deeply (more than {MAX_DEPTH} levels)"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # how a lone surrogate gets in: \ud800
_SURROGATE = re.compile("[\ud800-\udfff]")


# Fields whose presence tells which stage wrote a file, for a helpful error message.
_SIGNATURES = {
    "tasks": {"env", "spec", "prompt"},
    "trajectories": {"steps", "outcome", "finish"},
    "judgments": {"judge", "steps"},
    "scored": {"task_acc", "steps"},
    "task stats": {"acc", "policy_keep"},
}


def guess_kind(obj: dict) -> str | None:
    for kind in ("scored", "task stats", "judgments", "trajectories", "tasks"):
        if _SIGNATURES[kind] <= obj.keys():
            return kind
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is out of range for a float (read as infinity)")
    return value


def dumps(obj: Any) -> str:
    """One canonical JSON line: stable key order as given, no NaN/inf, UTF-8 kept."""
    return json.dumps(to_json(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def meta_path(path: str | Path) -> Path:
    """`X.jsonl` (or `X.json`) -> `X.meta.json`, beside it."""
    p = Path(path)
    return p.with_suffix(".meta.json") if p.suffix else p.with_name(p.name + ".meta.json")


class JsonlReader(Generic[R]):
    """Iterate `(where, record)`; afterwards `.count` and `.sha256` describe what was read."""

    def __init__(self, path: str | Path, cls: type[R] | dict[str, type], kind: str,
                 allow_empty: bool = False, name: str | None = None):
        """`name`: what errors and the sidecar call the input (the user's `-` when `path`
        is the temp copy of stdin that `spool_input` made). `cls` a {kind: class} dict
        reads a mixed stream (`judge -o -`: trajectories and judgments)."""
        self.path, self.cls, self.kind, self.allow_empty = str(path), cls, kind, allow_empty
        self.name = str(name) if name is not None else self.path
        if self.name == "-":
            self.name = "<stdin>"
        self.count = 0
        self._hash = hashlib.sha256()
        if self.path != "-":
            p = Path(self.path)
            if not p.exists():
                raise RlanyError(f"no such {kind} file", where=self.name)
            if p.is_dir():
                raise RlanyError(f"is a directory, expected a {kind} JSONL file", where=self.name)
            check_schema_version(p)

    @property
    def sha256(self) -> str | None:
        return self._hash.hexdigest() if self.path != "-" else None

    def __iter__(self) -> Iterator[tuple[str, R]]:
        # each pass describes what it read: a stage that reads its input twice (judge
        # checks the groups first) records the file's digest, not the digest of two copies
        self.count = 0
        self._hash = hashlib.sha256()
        stream: IO[bytes]
        if self.path == "-":
            if sys.stdin is None:
                raise RlanyError("stdin is closed", where=self.name)
            stream = sys.stdin.buffer
        else:
            try:
                stream = open(self.path, "rb")
            except OSError as e:
                raise RlanyError(f"cannot read: {e.strerror}", where=self.name) from e
        try:
            yield from self._records(stream)
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()
        if self.count == 0 and not self.allow_empty:
            raise RlanyError(f"empty input: no {self.kind} records", where=self.name)

    def _records(self, stream: IO[bytes]) -> Iterator[tuple[str, R]]:
        lineno = 0
        while True:
            raw = stream.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            lineno += 1
            where = f"{self.name}:{lineno}"
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise RlanyError(f"line longer than {MAX_LINE_BYTES // 2**20} MiB", where=where)
            self._hash.update(raw)
            if not raw.strip():
                continue
            yield where, self._parse(raw, where)
            self.count += 1

    def _parse(self, raw: bytes, where: str) -> R:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RlanyError(f"not UTF-8 text (byte {e.start})", where=where) from None
        try:
            obj = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        except RecursionError:
            raise RlanyError(_TOO_DEEP, where=where) from None
        except (json.JSONDecodeError, ValueError) as e:
            if not text.endswith("\n"):
                raise RlanyError(f"truncated last line: {e}", where=where) from None
            raise RlanyError(f"invalid JSON: {e}", where=where) from None
        if text.count("[") + text.count("{") > MAX_DEPTH and _deeper_than(obj, MAX_DEPTH):
            raise RlanyError(_TOO_DEEP, where=where)
        if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(obj):
            # valid JSON syntax, but not text: it could never be written back as UTF-8
            raise RlanyError("invalid JSON: a \\u escape of a lone UTF-16 surrogate "
                             "(\\ud800-\\udfff) is not a character", where=where)
        cls = self.cls
        if isinstance(cls, dict):  # a mixed stream: the record's kind picks its class
            kinds = cls
            cls = kinds.get(guess_kind(obj) if isinstance(obj, dict) else None,
                            next(iter(kinds.values())))  # else: the first kind's errors
        try:
            return from_json(cls, obj)
        except RlanyError as e:
            found = guess_kind(obj) if isinstance(obj, dict) else None
            hint = (f"this looks like a {found} file, expected {self.kind}"
                    if found and found != self.kind and found not in (
                        self.cls if isinstance(self.cls, dict) else ()) else None)
            raise RlanyError(e.message, where=where, hint=hint) from None


def _deeper_than(obj: Any, limit: int) -> bool:
    """Whether parsed JSON nests arrays/objects more than `limit` levels (no recursion)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict)
                                                  else value))
    return False


def _has_lone_surrogate(obj: Any) -> bool:
    """Whether any string (key or value) of parsed JSON holds a lone surrogate."""
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return True
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def check_schema_version(path: Path) -> None:
    """Refuse an input whose sidecar says it was written under another schema version."""
    meta = meta_path(path)
    if not meta.exists():
        return
    try:
        version = json.loads(meta.read_text()).get("schema_version")
    except (OSError, ValueError, AttributeError):
        raise RlanyError("unreadable sidecar metadata", where=str(meta)) from None
    if version != SCHEMA_VERSION:
        raise RlanyError(
            f"schema version {version!r}, this rlany reads version {SCHEMA_VERSION}",
            where=str(meta), hint="regenerate the file with this version of rlany")

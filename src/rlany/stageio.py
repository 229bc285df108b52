"""File plumbing shared by the stage drivers: inputs checked and read once, the engine
started from a stage's options, and the sidecar helpers. The stage modules hold the logic;
this module holds no math and no stage-specific rule.

* `check_paths` refuses an output that would overwrite an input; `spool_input` copies stdin
  (or a named pipe) to a temp file, for a stage that reads its input twice; `output_lock`
  keeps two processes from writing one output.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlany.console import info
from rlany.errors import RlanyError, UsageError
from rlany.jsonl import JsonlReader

GEN_VERSIONS = ("vllm", "torch", "transformers")


def prepare_paths(inputs: dict[str, str | None], outputs: dict[str, str | None]
                  ) -> dict[str, str | None]:
    """Refuse outputs that name an input (or each other), then spool `-`, FIFOs and process
    substitutions once into temp files. Returns the readable path of each input."""
    check_paths(inputs, outputs)
    return {k: (spool_input(v)[0] if v else v) for k, v in inputs.items()}


def begin_generation(opts: Any, outputs: dict[str, str | None], engine: Any = None,
                     adapters: dict[str, str | None] | None = None,
                     check: Callable[[Any], None] | None = None):
    """(tasks, reader, engine) for a stage that generates from `opts.input`: adapters and
    paths checked and tasks read (bad input, or a task `check` refuses, fails before an
    engine starts), then the engine started unless one is given (the loop passes its own)."""
    for flag, adapter in {"--adapter": opts.adapter, **(adapters or {})}.items():
        check_adapter(adapter, flag)
    paths = prepare_paths({"--input": opts.input}, outputs)
    tasks, reader = read_tasks(paths["--input"], name=opts.input, check=check)
    return tasks, reader, engine or start_engine(opts)


def read_tasks(path: str | Path, allow_empty: bool = False, name: str | None = None,
               check: Callable[[Any], None] | None = None):
    """All tasks of a file (a task pool is small), with env names and unique ids checked.
    `allow_empty` for candidate files: an iteration may propose no candidate at all.
    `check(task)`: a stage's own rule; the RlanyError it raises is reported at the line."""
    from rlany import envs
    from rlany.records import Task

    reader = JsonlReader(path, Task, "tasks", allow_empty=allow_empty, name=name)
    tasks, seen = [], set()
    known = envs.names()
    for where, task in reader:
        if task.env not in known:
            raise RlanyError(f"unknown environment '{task.env}'", where=where,
                             hint=f"known: {', '.join(known)}")
        if task.task_id in seen:
            raise RlanyError(f"duplicate task_id '{task.task_id}'", where=where)
        seen.add(task.task_id)
        if check is not None:
            try:
                check(task)
            except RlanyError as e:
                raise RlanyError(e.message, where=where, hint=e.hint) from None
        tasks.append(task)
    return tasks, reader


def read_stats(path: str | Path, name: str | None = None) -> dict:
    from rlany.records import TaskStats

    return {s.task_id: s for _, s in JsonlReader(path, TaskStats, "task stats", name=name)}


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_adapter(adapter: str | None, flag: str = "--adapter") -> None:
    if adapter and not (Path(adapter) / "adapter_config.json").exists():
        raise RlanyError(f"{flag}: not a LoRA adapter directory (no adapter_config.json)",
                         where=adapter)


def start_engine(opts: Any):
    """The engine an options object (EngineFields) asks for; `engine auto` is resolved for
    this machine and the reason is printed (and kept in `engine.choice`)."""
    from rlany import engines
    from rlany.engines import EngineConfig, make_engine
    from rlany.models import resolve_model

    kind, reason = engines.resolve_engine(opts.engine)
    if kind != "openai" and opts.base_url:
        raise RlanyError(f"--base-url is only for --engine openai, not {kind}")
    model = resolve_model(opts.model) if kind in ("vllm", "hf") else opts.model
    info(f"starting engine {kind} ({reason}): {model}")
    engine = make_engine(EngineConfig(kind=kind, model=model, dtype=opts.dtype, seed=opts.seed,
                                      max_model_len=opts.max_model_len, base_url=opts.base_url,
                                      max_lora_rank=opts.max_lora_rank))
    engine.choice = {"engine": kind, "reason": reason}
    return engine


def adapter_checks(engine: Any) -> dict:
    """The sidecar's record of the adapter probes the engine ran (rlany.probe), if any."""
    probes = getattr(engine, "probes", None)
    checks = probes.checks if probes is not None else None
    return {"adapter_checks": list(checks)} if checks else {}


def engine_flags(opts: Any, engine: Any) -> dict:
    """The sidecar's `flags`: every option, the resolved model and the engine choice."""
    from dataclasses import asdict

    flags = asdict(opts)
    flags["model"] = engine.model
    choice = getattr(engine, "choice", None)
    if choice:
        flags["engine_resolved"] = choice
    return flags


def check_paths(inputs: dict[str, str | None], outputs: dict[str, str | None]) -> None:
    """Usage errors before anything is read or written: an output that names an input
    file (writing it would destroy the input), two outputs naming one file, or more than
    one input or output on stdin/stdout. Keys are the flags, for the message."""
    def real(p: str) -> str:
        return os.path.realpath(p)

    for group, what in ((inputs, "stdin"), (outputs, "stdout")):
        dashes = [flag for flag, p in group.items() if p == "-"]
        if len(dashes) > 1:
            raise UsageError(f"{' and '.join(dashes)} both use {what} (-); at most one can")
    seen: dict[str, str] = {}
    for flag, p in inputs.items():
        if p and p != "-":
            seen.setdefault(real(p), flag)
    for flag, p in outputs.items():
        if not p or p == "-":
            continue
        if real(p) in seen:
            raise UsageError(f"{flag} {p} is also {seen[real(p)]}: writing it would destroy "
                             "that file; choose another output")
        seen[real(p)] = flag


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

    fd, tmp = tempfile.mkstemp(prefix="rlany-stdin.", suffix=".jsonl")
    with os.fdopen(fd, "wb") as f:
        if path == "-":
            shutil.copyfileobj(sys.stdin.buffer, f)
        else:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, f)
    atexit.register(lambda: Path(tmp).unlink(missing_ok=True))
    return tmp, path


@contextlib.contextmanager
def output_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` while a stage writes it (a `.X.lock` file beside
    it, flock: released by the kernel when the process dies, so a killed stage never
    leaves a stale lock). A second writer fails at once instead of interleaving."""
    if str(path) == "-":
        yield
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.with_name(f".{target.name}.lock")
    with open(lock, "a") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RlanyError("another rlany process is writing this output; wait for it "
                             "or stop it", where=str(path)) from None
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)

"""The loop config's `[launch]` table: how the training stages run, and what the plan that
`rlany loop CONFIG --print-plan` writes starts (`rlany.loop.plan`).

    [launch]
    train = "accelerate launch --config_file examples/accelerate/ddp-8gpu.yaml"
    shards = 8                  # --print-plan: each generation stage as 8 shard processes
    serve = "vllm serve --gpu-memory-utilization 0.85"  # --print-plan: the openai servers

`train`, a launcher: the loop runs train-policy, train-rm and sft as the subprocess
`TRAIN -m rlany COMMAND FLAGS` (the line it prints), and closes its own engine first, so
that the devices are the trainer's; the next stage that generates starts the engine again
(on the hf engine, training then loads its own copy of the base model instead of borrowing
the engine's). Launchers: `accelerate launch ...`, `torchrun ...`, `python -m
torch.distributed.run ...` or a plain `python` (one process), optionally after `srun ...`
(one launcher per node under Slurm); the launcher's options are read by its own parser, so
that a program of its own (its first word that is no option's value, or `-m`) is refused
while `--rdzv_id rlany` is not. Nothing to learn from is the trainer's answer, not a
failure: the loop passes `--skipped FILE`, the trainer (its first process) writes that file
and exits 0, and the loop goes on with the model as it was. Any other exit, or a signal,
fails the loop in one line; rerun it: the trainer resumes from its last saved step. The
trainer dies with the loop, even by kill -9 (Linux's PR_SET_PDEATHSIG); one that outlived
it all the same is named when the rerun finds its checkpoint's lock held.
The line is split as a shell would split it, but nothing in it is expanded.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlany.children import dying_with_us
from rlany.errors import RlanyError
from rlany.training.world import ENV as WORLD_ENV

HINT = ("e.g. train = \"accelerate launch --config_file examples/accelerate/ddp-8gpu.yaml\" or "
        "\"torchrun --nproc_per_node 8\" (the loop adds -m rlany COMMAND FLAGS)")
# `python -m MODULE`: the launcher whose options follow
PYTHON_LAUNCHERS = {("-m", "torch.distributed.run"): "torchrun",
                    ("-m", "accelerate.commands.launch"): "accelerate launch"}


@dataclass(frozen=True)
class Launch:
    train: str | None = None  # the launcher of the training stages; None: in the loop
    shards: int | None = None  # the plan's shards per generation stage (default: endpoints)
    serve: str | None = None  # the plan starts `SERVE MODEL ...` per openai endpoint


KEYS = {"train": str, "shards": int, "serve": str}


def parse_launch(raw: Any, where: str) -> Launch:
    """`[launch]` of a config, checked: known keys, their types, a launcher the loop knows."""
    from rlany.limits import MAX_SHARDS
    from rlany.options import typed

    if not isinstance(raw, dict):
        raise RlanyError("[launch] must be a table", where=where)
    for key, value in raw.items():
        if key not in KEYS:
            raise RlanyError(f"unknown key '{key}' in [launch]", where=where,
                             hint=f"known: {', '.join(KEYS)}")
        typed(f"[launch] {key}", value, KEYS[key], where)
    launch = Launch(**raw)
    if launch.train is not None:
        launcher(launch.train, where)
    if launch.shards is not None and not 1 <= launch.shards <= MAX_SHARDS:
        raise RlanyError(f"'[launch] shards' must be 1 to {MAX_SHARDS:,} (rlany.limits), got "
                         f"{launch.shards}", where=where)
    if launch.serve is not None and not _split(launch.serve, "serve", where):
        raise RlanyError("'[launch] serve' is empty", where=where,
                         hint="e.g. serve = \"vllm serve\"")
    return launch


def _split(line: str, key: str, where: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as e:
        raise RlanyError(f"'[launch] {key}' cannot be split into words: {e}",
                         where=where) from None


def _is_launcher(word: str) -> bool:
    name = Path(word).name
    return name in ("accelerate", "torchrun") or name.startswith("python")


def launcher(line: str, where: str) -> list[str]:
    """The words of `[launch] train`, refused unless a known launcher (module doc) that is
    on this machine and gives no module or script of its own."""
    argv = _split(line, "train", where)
    if not argv:
        raise RlanyError("'[launch] train' is empty", where=where, hint=HINT)
    start = 0
    if Path(argv[0]).name == "srun":
        start = next((i for i, w in enumerate(argv) if i and _is_launcher(w)), 0)
    program, rest = Path(argv[start]).name, argv[start + 1:]
    if not start and not _is_launcher(argv[0]):
        raise RlanyError(f"'[launch] train': {argv[0]!r} is not a launcher the loop knows "
                         "(accelerate launch, torchrun, python -m torch.distributed.run, "
                         "python; optionally after srun)", where=where, hint=HINT)
    parser = "torchrun"  # whose options `rest` are
    if program == "accelerate":
        if rest[:1] != ["launch"]:
            raise RlanyError("'[launch] train': accelerate needs its `launch` command",
                             where=where, hint=HINT)
        rest, parser = rest[1:], "accelerate launch"
    elif program.startswith("python"):
        if tuple(rest[:2]) not in PYTHON_LAUNCHERS and rest:
            raise RlanyError(f"'[launch] train': {program} takes no arguments here but "
                             "-m torch.distributed.run ... (or nothing: one process)",
                             where=where, hint=HINT)
        parser = PYTHON_LAUNCHERS.get(tuple(rest[:2]), "")
        rest = rest[2:]
    wrong = _options(parser, tuple(rest)) if parser else None
    if wrong:
        raise RlanyError(f"'[launch] train' {wrong}", where=where, hint=HINT)
    if shutil.which(argv[0]) is None:
        raise RlanyError(f"'[launch] train': {argv[0]!r} is not on this machine (PATH)",
                         where=where, hint="install it, or give its full path")
    return argv


_ADDED = "\0rlany"  # stands for what the loop adds after the launcher's options


def world_size(line: str, where: str) -> int | None:
    """How many processes `[launch] train` is told to start, read by the launcher's own
    parser: torchrun's `--nproc_per_node` times `--nnodes` (None where either is not a
    number: `auto`, an elastic `1:4`), accelerate's `--num_processes` or its config file's;
    a plain python, 1. The trainer refuses a group of another size (`training.world`)."""
    argv = launcher(line, where)
    start = next(i for i, w in enumerate(argv) if _is_launcher(w) or i == len(argv) - 1)
    program, rest = Path(argv[start]).name, argv[start + 1:]
    if program == "accelerate":
        parser, rest = "accelerate launch", rest[1:]
    elif program.startswith("python"):
        parser = PYTHON_LAUNCHERS.get(tuple(rest[:2]), "")
        rest = rest[2:]
    else:
        parser = "torchrun"
    if not parser:
        return 1
    args = _parsed(parser, tuple(rest))
    if parser == "accelerate launch":
        if args.num_processes is None and args.config_file:
            from accelerate.commands.config.config_args import load_config_from_file

            return getattr(load_config_from_file(args.config_file), "num_processes", None)
        return args.num_processes
    per_node, nodes = str(args.nproc_per_node), set(str(args.nnodes).split(":"))  # "2:2"
    if not per_node.isdigit() or len(nodes) != 1 or not next(iter(nodes)).isdigit():
        return None
    return int(per_node) * int(nodes.pop())


@functools.lru_cache(maxsize=32)
def _options(parser: str, rest: tuple[str, ...]) -> str | None:
    """What is wrong with a launcher's options `rest` (None: nothing): a program of its own
    (a first positional word, or `-m`/`--module`), or an option its parser refuses. Read
    by the launcher's own parser (torch's for torchrun, accelerate's for `accelerate
    launch`), so that an option's value (`--rdzv_id rlany`) is never taken for a program."""
    import argparse

    try:
        args = _parsed(parser, rest)
    except (ValueError, argparse.ArgumentError, SystemExit) as e:
        return f"has options {parser} refuses ({e})"
    own = "-m" if args.module else args.training_script
    if own != _ADDED:
        return (f"names a program of its own ({own!r}): give the launcher only; the loop "
                "adds -m rlany COMMAND FLAGS")
    return None


def _parsed(parser: str, rest: tuple[str, ...]) -> Any:
    """The launcher's options `rest` (then what the loop adds) as its own parser reads
    them; its refusal raises ValueError."""
    import contextlib
    import io

    if parser == "accelerate launch":
        from accelerate.commands.launch import launch_command_parser
        p = launch_command_parser()
    else:
        from torch.distributed.run import get_args_parser
        p = get_args_parser()

    def refuse(message: str):
        raise ValueError(message)
    p.error = refuse  # argparse reports through self.error: here it raises, never exits
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return p.parse_args([*rest, _ADDED])


def command_line(cfg: Any, command: Any, opts: Any) -> list[str]:
    """A stage's command line: `rlany COMMAND FLAGS`; a trainer's under `[launch] train`
    `LAUNCHER -m rlany COMMAND FLAGS`."""
    from rlany.options import to_argv

    argv = to_argv(command.name, opts)
    if command.engine == "borrows" and cfg.launch.train:
        world = world_size(cfg.launch.train, cfg.path)  # the group the trainer must form
        told = ["env", f"{WORLD_ENV}={world}"] if world and world > 1 else []
        return [*told, *launcher(cfg.launch.train, cfg.path), "-m", "rlany", *argv[1:]]
    return argv


def _lock_holder(output: str) -> int | str | None:
    """Whether another process holds the writer lock of `output` (`rlany.files.locks`): its pid
    where Linux's /proc/locks names it, else ""; None: nobody does."""
    import fcntl

    from rlany.files.locks import lock_path

    try:
        fd = os.open(lock_path(output), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None  # no lock file: no writer
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:
        st = os.fstat(fd)
        node = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        try:
            with open("/proc/locks", encoding="ascii") as f:
                held = [line.split() for line in f if "->" not in line]
        except OSError:
            return ""
        return next((int(w[4]) for w in held if len(w) > 5 and w[5] == node), "")
    except OSError:  # a file system without flock: the trainer's own lock says it
        return None
    finally:
        os.close(fd)


def run_launched(argv: list[str], name: str, where: str, done: Callable[[], bool]) -> None:
    """Run a launched trainer to its end: it must exit 0 having written its checkpoint or
    its `skipped` file (`done()`). Anything else is one line; an interrupted loop stops its
    trainer too (it resumes on the next run)."""
    holder = _lock_holder(where)
    if holder is not None:
        raise RlanyError(f"{name}: another process is still writing this checkpoint "
                         f"(it holds its lock{f', process {holder}' if holder else ''}): a "
                         "trainer an earlier `rlany loop` started that outlived it?",
                         where=where, hint="wait for it to end or stop it, then rerun the "
                         "loop: training resumes from its last saved step")
    try:  # the trainer dies with the loop, even by kill -9
        proc = subprocess.Popen(dying_with_us(argv),
                                stdin=subprocess.DEVNULL)
    except OSError as e:
        raise RlanyError(f"{name}: cannot start {argv[0]!r}: {e.strerror}", where=where,
                         hint="check [launch] train") from None
    try:
        code = proc.wait()
    except BaseException:  # Ctrl-C or SIGTERM: the trainer stops too, it resumes later
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    if code == 0:
        if not done():
            raise RlanyError(f"{name} under [launch] train exited 0 but wrote neither its "
                             "checkpoint nor its --skipped file", where=where)
        return
    try:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else \
            f"exited with code {code}"
    except ValueError:
        how = f"was killed by signal {-code}"
    raise RlanyError(f"{name} under [launch] train {how}", where=where,
                     hint="its own error is above; rerun the loop: training resumes from "
                     "its last saved step")


def free_memory() -> None:
    """After the loop dropped its closed engine: collect it, and give its GPU memory back
    (vLLM's engine process has exited; the hf engine's network is garbage)."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")  # imported only where an engine loaded it
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()

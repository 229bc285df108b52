"""How the loop's walk is carried out: one executor per way of running a stage.

`rlany.loop.loop.Loop` walks the stages (which, in which order, with which options, whether
each is complete, which checkpoints they start from) and hands every step with an effect to
its executor, an `Executor`:

* `InProcess` runs each stage's command in this process (the engine started once, when the
  first stage that generates has work; trainers borrow its network), writes the pools'
  byte copies and the config echo, holds the run directory's lock, writes each iteration's
  done.json and metrics, prunes old checkpoints;
* `Launched`, under `[launch] train`, is InProcess except that a stage whose command line is
  a launcher's (`LAUNCHER -m rlany ...`) runs in processes of its own (`rlany.loop.launch`),
  the engine released first so that the devices are the trainer's;
* `rlany.loop.plan.Plan` (`--print-plan`) runs and writes nothing: it takes each stage,
  directory and copy down as lines of a bash script, and plans one iteration only.

`executor_for(cfg)` is the one a config runs with (the plan is the CLI's choice).
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Literal, Protocol

from rlany.console import info
from rlany.loop.config import LoopConfig

Assumed = Literal["trained", "skipped"]  # what an executor takes a training to have made


class Executor(Protocol):
    """The effects of the loop's walk; `loop` is the `Loop` walking."""

    def hold(self, run_dir: Path) -> AbstractContextManager[None]:
        """The run directory for the whole walk (its lock, for an executor that writes)."""
        ...

    def mkdir(self, d: Path) -> None: ...

    def copy(self, srcs: list[Path], dst: Path) -> None:
        """`dst`, the byte concatenation of `srcs`."""
        ...

    def write_echo(self, path: Path, text: str) -> None:
        """The resolved config, echoed into the run directory."""
        ...

    def share_warm_start(self, loop: Any, warm: Path) -> None:
        """Adopt a sibling run's identical warm start where there is one (`warm_reuse`)."""
        ...

    def begin(self, it: int) -> None:
        """Iteration `it`'s stages come next."""
        ...

    def done(self, stage: Any, opts: Any) -> Path:
        """The file whose presence marks `stage` complete with options `opts`."""
        ...

    def adopt(self, output: str) -> bool:
        """Whether the shards of `output` are there, joined (`rlany.loop.shards.adopt`)."""
        ...

    def stage(self, loop: Any, stage: Any, d: Path, it: int, io: dict, opts: Any) -> str | None:
        """Carry out one incomplete stage; the name of the command it ran (None: none)."""
        ...

    def finish(self, loop: Any, d: Path, it: int) -> None:
        """Iteration `it`'s stages are complete."""
        ...

    def next_iteration(self, ran: bool) -> bool:
        """Whether the walk goes on after an iteration (`ran`: it had stages to do)."""
        ...

    def end(self, loop: Any) -> None:
        """The walk is over (every iteration done, or `--stop-after`)."""
        ...

    def assumed(self, kind: str, it: int) -> Assumed | None:
        """What this executor takes iteration `it`'s training of `kind` (policy, rm) to
        have made before it is there; None: nothing (the checkpoint must be there)."""
        ...


def executor_for(cfg: LoopConfig) -> Executor:
    """The executor `cfg` runs with: Launched under `[launch] train`, else InProcess."""
    return Launched(cfg) if cfg.launch.train else InProcess(cfg)


class InProcess:
    """Runs every stage in this process, with one engine (`engine`: None until a stage
    that generates has work; a test may set a fake one)."""

    def __init__(self, cfg: LoopConfig):
        self.cfg = cfg
        self.engine: Any = None
        self._engine_start: float | None = None  # seconds, until an iteration records it

    @contextmanager
    def hold(self, run_dir: Path) -> Iterator[None]:
        """The run directory's lock: a second `rlany loop` on it is refused, not
        interleaved."""
        from rlany.stageio import output_lock

        run_dir.mkdir(parents=True, exist_ok=True)
        with output_lock(run_dir / "loop", busy="another `rlany loop` is running in this "
                         "run directory; wait for it or stop it"):
            yield

    def mkdir(self, d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)

    def copy(self, srcs: list[Path], dst: Path) -> None:
        """Printed as the `cat` that makes it, moved into place whole."""
        info("loop: $ " + shlex.join(["cat", *map(str, srcs)]) + " > " + shlex.quote(str(dst)))
        tmp = dst.with_name(f".{dst.name}.tmp")
        with open(tmp, "wb") as out:
            for path in srcs:
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, out)
        tmp.replace(dst)

    def write_echo(self, path: Path, text: str) -> None:
        from rlany.files.outputs import write_text_atomic

        write_text_atomic(path, text)

    def share_warm_start(self, loop: Any, warm: Path) -> None:
        from rlany.loop.tables import WARM_START
        from rlany.loop.warm_reuse import share_warm_start

        if src := share_warm_start(*(loop.options(s, warm, 0) for s in WARM_START), warm):
            info(f"loop: warm start shared: {src} (same flags, pool, versions and model "
                 "content)")

    def begin(self, it: int) -> None:
        pass

    def done(self, stage: Any, opts: Any) -> Path:
        """The stage's own rule (a base evaluation may be a sibling run's, shared here)."""
        return stage.done(opts)

    def adopt(self, output: str) -> bool:
        """The shards' join, its sidecar written."""
        from rlany.loop.shards import adopt

        return adopt(output, True)

    def stage(self, loop: Any, stage: Any, d: Path, it: int, io: dict, opts: Any) -> str:
        """Print the stage's command, then run exactly that (a trainer with nothing to
        learn from writes its `skipped` file instead of a checkpoint)."""
        from rlany.loop.launch import command_line
        from rlany.stages import BY_TABLE

        command = BY_TABLE[stage.table]
        argv = command_line(self.cfg, command, opts)
        info("loop: $ " + shlex.join(argv))
        self.run(loop, stage, command, opts, argv)
        return command.name

    def run(self, loop: Any, stage: Any, command: Any, opts: Any, argv: list[str]) -> None:
        """The command `argv` prints, run in this process."""
        kw: dict[str, Any] = {}
        if command.engine == "generates" and stage.engine:
            kw["engine"] = self.started_engine()
        elif command.engine == "borrows":  # one model in memory: the engine's network
            kw["engine"] = self.engine
        command.run(opts, **kw)

    def started_engine(self) -> Any:
        """The engine, started once, when the first generating stage has work to do."""
        if self.engine is None:
            from rlany.stage_engine import start_engine

            info("loop: one engine for all stages")
            t0 = time.perf_counter()
            self.engine = start_engine(self.cfg.options("rollout", input="-"), "loop")
            self._engine_start = round(time.perf_counter() - t0, 1)
        return self.engine

    def finish(self, loop: Any, d: Path, it: int) -> None:
        """done.json (the iteration's metrics), pruning, runs/NAME/metrics.jsonl."""
        from rlany.files.outputs import write_text_atomic
        from rlany.loop.metrics import collect_metrics, write_metrics

        metrics = {"iteration": it, **collect_metrics(d)}
        if self._engine_start is not None:  # this process started its engine in this iteration
            metrics["seconds"]["engine_start"], self._engine_start = self._engine_start, None
        write_text_atomic(d / "done.json", json.dumps(metrics, indent=2, allow_nan=False) + "\n")
        self._prune(loop, it)
        write_metrics(loop.dir)
        info(f"loop: iteration {it} done: train acc {metrics.get('train_acc')}, eval success "
             f"{metrics.get('eval_success')}, accepted tasks {metrics.get('accepted_tasks')}")

    def _prune(self, loop: Any, it: int) -> None:
        """Keep the checkpoints of the last `keep_last` iterations (and always the latest)."""
        for kind in ("policy", "rm"):
            latest = loop.latest(kind, it + 1)
            for old in range(0, it + 1 - self.cfg.keep_last):
                ckpt = loop.dir / f"iter_{old:03d}" / kind
                if ckpt.exists() and str(ckpt) != latest:
                    shutil.rmtree(ckpt)
                    (ckpt.parent / f"{kind}.pruned").write_text("pruned by keep_last\n")

    def next_iteration(self, ran: bool) -> bool:
        return True

    def end(self, loop: Any) -> None:
        from rlany.loop.metrics import write_metrics

        write_metrics(loop.dir)
        info(f"loop: stopped after iteration {loop.stopped} (--stop-after) in {loop.dir}"
             if loop.stopped is not None else
             f"loop: {self.cfg.iterations} iterations complete in {loop.dir}")

    def assumed(self, kind: str, it: int) -> Assumed | None:
        return None  # what it trains is there once its stage returns


class Launched(InProcess):
    """InProcess, but a trainer under `[launch] train` runs in processes of its own
    (`rlany.loop.launch.run_launched`), the engine closed first; the next stage that
    generates starts it again. A subclass (STYLE 3 shares no behaviour by inheritance): how
    a stage's command runs is the one thing a launched run changes, and its lock, files,
    engine and bookkeeping are InProcess's, which a copy would repeat line for line."""

    def run(self, loop: Any, stage: Any, command: Any, opts: Any, argv: list[str]) -> None:
        from rlany.loop.launch import run_launched

        if argv[0] == "rlany":  # not a trainer: in this process
            return super().run(loop, stage, command, opts, argv)
        self.release_engine()
        run_launched(argv, command.name, str(opts.output), lambda: loop.complete(stage, opts))

    def release_engine(self) -> None:
        if self.engine is None:
            return
        from rlany.loop.launch import free_memory

        info("loop: engine closed, the launched trainer has the devices (the next stage "
             "that generates starts it again)")
        self.engine.close()
        self.engine = None
        free_memory()

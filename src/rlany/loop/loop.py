"""`rlany loop CONFIG`: the closed RLAnything loop, one directory per iteration, resumable.

One iteration (runs/NAME/iter_NNN/), a table of stages run in order:
    tasks.jsonl, rollout_tasks.jsonl   the pool; the pool plus last iteration's candidates
    trajectories.jsonl    rollout with the latest policy adapter
    judgments.jsonl       judge with the latest reward-model adapter
    scored.jsonl, task_stats.jsonl     score
    policy/, rm/          train-policy, train-rm (each continues its latest adapter)
    next_tasks.jsonl, candidates.jsonl, decisions.jsonl      adapt-tasks
    eval.json             the new policy (and judge) on held-out tasks, every `eval_every`
    done.json             the iteration's metrics; runs/NAME/metrics.jsonl is rebuilt from these
Before iteration 0: runs/NAME/eval_base.json (the base model) and, with `init_policy` (a
warm-start adapter such as `rlany sft`'s, which iteration 0 starts from), eval_init.json.
`warm_start = true` makes that adapter first, in runs/NAME/warm_start/: demos.jsonl (`rlany
rollout --expert`: the env's expert plays every pool task once, in the policy's prompts) and
sft/ (`rlany sft` on them, `[sft]` settings, `[train_policy]`'s LoRA shape). A sibling run
in the same runs directory that made the identical warm start (and its evaluation) lends
its copy instead (`rlany.loop.warm_reuse`, as `eval_reuse` does for the base evaluation).
`init_rm` (a judge adapter such as `rlany train-rm`'s) is the judge's start: iteration 0
judges with it, train-rm continues it (docs/stages/loop.md's supervised judge makes one).

The config is flat: top-level keys (the run: name, tasks, model, engine, seed, ...) and one
table per stage whose keys are that stage's flags, e.g. `[rollout] max_tokens = 96` is
`rlany rollout --max-tokens 96`. Both go through the stage's one options class, so defaults
and validation are the CLI's, the whole config is checked before anything runs, and the
command the loop prints for each stage (`loop: $ rlany ...`) is exactly what it runs: run by
hand in order, those commands give the same files. `[eval]` takes the judge's settings
(m, max_tokens, temperature, history_steps, mode, verdict, obs_lines) from `[judge]` unless it sets
them itself (as judge_max_tokens, ...).

Each stage is skipped when its output is complete (its `.meta.json` exists, or a checkpoint
directory with `rlany.json`), so a killed loop reruns to the same result; rollout and judge
resume inside a stage, training resumes from its last optimizer step. The generation engine
starts once and serves the policy and the reward model as two LoRA adapters on one base
model; with the hf engine, training borrows that same network (a third, trainable adapter
added beside them and removed after saving), so the base weights are in memory once.
Ablations are switches: `step_feedback` (false: outcome-only reward, lambda = 0),
`rm_training`, `env_adaptation`.

`Loop` is the walk: which stages, in which order, with which options, whether each is
complete, which checkpoints each starts from. What is done with a stage still to do, and
every directory, copy and record around it, is its executor's (`rlany.loop.executors`):
in this process; under `[launch] train`, the trainers in processes of their own, the
engine closed meanwhile (`rlany.loop.launch`); or, with `--print-plan`, nothing run and
nothing written, the same walk taking what is left of the next iteration down as a bash
script (`rlany.loop.plan`). `--stop-after N` stops once iteration N is done.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlany.console import info
from rlany.errors import RlanyError
from rlany.loop.config import LoopConfig, load_config
from rlany.loop.executors import Executor, executor_for
from rlany.loop.tables import (
    EVAL,
    STAGES,
    WARM_START,
    Stage,
    eval_judge,
    pending_candidates,
)
from rlany.stages import BY_TABLE

__all__ = ["Loop", "LoopConfig", "load_config"]


class Loop:
    """Walks the iterations of one config; every stage checks its own completion first, and
    its executor (`rlany.loop.executors`) carries out what is left: runs it in this process
    or launched (the config's choice, `executor_for`), or takes it down as a script (a
    `plan.Plan`). With `one_stage`, it runs the next incomplete stage and returns its
    command; with `stop_after`, it stops once that iteration is done."""

    def __init__(self, cfg: LoopConfig, config_path: str, one_stage: bool = False,
                 stop_after: int | None = None, executor: Executor | None = None):
        self.one_stage = one_stage
        self.stop_after = stop_after
        self.executor = executor or executor_for(cfg)
        self.cfg = cfg
        self.dir = cfg.run_dir
        self.config_path = config_path
        self.stopped: int | None = None  # the iteration `stop_after` stopped at

    def run(self) -> str | None:
        """The whole run, in the run directory as the executor holds it (an executor that
        writes holds its lock). With `one_stage`, the command of the one stage it ran
        (None: every stage was complete)."""
        if self.dir.exists() and not self.dir.is_dir():
            raise RlanyError("the run directory is a file", where=str(self.dir))
        with self.executor.hold(self.dir):
            return self._run()

    def _run(self) -> str | None:
        self._init_run_dir()  # the config (paths included) was checked when it was loaded
        for stage, d, it, io in self._stages():
            ran = self.stage(stage, d, it, **io)
            if ran and self.one_stage:
                return ran
        self.executor.end(self)
        return None

    def _stages(self) -> Iterator[tuple[Stage, Path, int, dict]]:
        """Every stage of the run in order, (stage, directory, iteration, paths the call
        sets), with the bookkeeping between them (an iteration's pool before its stages,
        its metrics after them); a caller that stops early leaves the rest undone."""
        if self.cfg.warm_start:  # first: an env without an expert fails before anything
            warm = self.dir / "warm_start"
            self.executor.mkdir(warm)
            self.executor.share_warm_start(self, warm)
            for stage in WARM_START:
                yield stage, warm, 0, {}
        if self.cfg.eval_tasks:
            yield EVAL, self.dir, -1, dict(output=str(self.dir / "eval_base.json"),
                                           adapter=None, judge_adapter=None)
            if self.init_policy:  # the warm start before any RL
                yield EVAL, self.dir, -1, dict(output=str(self.dir / "eval_init.json"),
                                               adapter=self.init_policy,
                                               judge_adapter=eval_judge(self.cfg,
                                                                        self.init_rm))
        for it in range(self.cfg.iterations):
            ran = yield from self.iteration(it)
            if it == self.stop_after or not self.executor.next_iteration(ran):
                self.stopped = it if it == self.stop_after else None
                return  # (a plan is one iteration: the next depends on what this one makes)

    def _init_run_dir(self) -> None:
        """Echo the resolved config into config.json, once it is checked against what the
        run directory holds (`rlany.loop.resume`): the echo of a started run, and
        the options every finished stage recorded, whether or not config.json survives."""
        from rlany.loop.resume import check_echo, check_finished

        config = {k: v for k, v in dataclasses.asdict(self.cfg).items() if k != "path"}
        resolved = json.dumps(config, indent=2, sort_keys=True, allow_nan=False) + "\n"
        echo = self.dir / "config.json"
        started = any(self.dir.glob("iter_*")) or any(
            (self.dir / name).exists()
            # judge_warm_start: a run of the retired judge warm start, refused below
            for name in ("eval_base.json", "warm_start", "judge_warm_start"))
        if echo.exists() and echo.read_text() != resolved and started:
            check_echo(echo, config, self.cfg.iterations)
        check_finished(self)
        self.executor.write_echo(echo, resolved)

    def iteration(self, it: int) -> Iterator[tuple[Stage, Path, int, dict]]:
        """The stages of iteration `it` (none when its done.json exists); returns whether
        there were any."""
        d = self.dir / f"iter_{it:03d}"
        if (d / "done.json").exists():
            info(f"loop: iteration {it} already complete")
            return False
        self.executor.mkdir(d)
        self.executor.begin(it)
        self._pool(it, d)
        for stage in STAGES:
            if stage.enabled(self.cfg):
                yield stage, d, it, {}
        if not self.cfg.env_adaptation and not (d / "next_tasks.jsonl").exists():
            self.executor.copy([d / "tasks.jsonl"], d / "next_tasks.jsonl")
        last = it == self.cfg.iterations - 1
        if self.cfg.eval_tasks and ((it + 1) % self.cfg.eval_every == 0 or last):
            yield EVAL, d, it, {}
        self.executor.finish(self, d, it)
        return True

    def stage(self, stage: Stage, d: Path, it: int, **io: Any) -> str | None:
        """Carry out one stage unless complete (its executor runs it, or takes it down).
        Returns the name of the command it ran (None: complete, or only planned)."""
        opts = self.options(stage, d, it, **io)
        if self.complete(stage, opts):
            info(f"loop: skip {BY_TABLE[stage.table].name}: {opts.output} is complete")
            return None
        return self.executor.stage(self, stage, d, it, io, opts)

    def complete(self, stage: Stage, opts: Any) -> bool:
        """A stage's output is complete: its sidecar or checkpoint (`executor.done`: a plan
        looks without writing, so shares no evaluation), a trainer's `skipped` file, or the
        joined outputs of a plan's shards (`shards.adopt`, whose sidecar an executor that
        writes then writes)."""
        done = self.executor.done(stage, opts)
        skipped = getattr(opts, "skipped", None)
        return (done.exists() or bool(skipped and Path(skipped).exists())
                or (stage.table in ("rollout", "judge") and self.executor.adopt(opts.output)))

    def options(self, stage: Stage, d: Path, it: int, **io: Any) -> Any:
        """The options `stage` runs with in directory `d` of iteration `it`."""
        from rlany.loop.batches import sized

        opts = self.cfg.options(stage.table, **{**stage.io(self, d, it), **io})
        opts = dataclasses.replace(opts, **stage.forced(self))
        return dataclasses.replace(opts, **sized(self, stage, opts, it))  # every shard work

    def _pool(self, it: int, d: Path) -> None:
        """tasks.jsonl (a copy: no pool is overwritten in place) and rollout_tasks.jsonl
        (the pool, then last iteration's candidates), both byte copies."""
        from rlany.stageio import read_tasks

        pool = d / "tasks.jsonl"
        if not pool.exists():
            src = Path(self.cfg.tasks) if it == 0 else \
                self.dir / f"iter_{it - 1:03d}" / "next_tasks.jsonl"
            read_tasks(src)
            self.executor.copy([src], pool)
        out = d / "rollout_tasks.jsonl"
        if not out.exists():
            pending = pending_candidates(self, it)
            if pending:
                read_tasks(pending, allow_empty=True)
            self.executor.copy([pool, *([Path(pending)] if pending else [])], out)

    def rm_input(self, d: Path, it: int) -> str:
        """train-rm's input: the iteration's scored steps, or with rm_buffer = K those of
        the last K iterations concatenated into rm_input.jsonl (a printed byte copy)."""
        first = max(0, it - self.cfg.rm_buffer + 1)
        if first == it:
            return str(d / "scored.jsonl")
        older = [self.dir / f"iter_{j:03d}" / "scored.jsonl" for j in range(first, it)]
        return self.joined(d / "rm_input.jsonl", older, d / "rm" / "rlany.json",
                           f"rm_buffer = {self.cfg.rm_buffer}", d / "scored.jsonl")

    def joined(self, out: Path, older: list[Path], done: Path, why: str, *now: Path) -> str:
        """`out`, the byte concatenation of earlier iterations' files `older` (each must be
        there) and this one's `now`, made once (not when `done`, what the stage reading it
        completes, exists)."""
        if not out.exists() and not done.exists():
            for path in older:
                if not path.is_file():
                    raise RlanyError(f"{why} needs {path}, which is missing",
                                     where=str(self.dir))
            self.executor.copy([*older, *now], out)
        return str(out)

    # -- bookkeeping -------------------------------------------------------------------
    def latest(self, kind: str, before: int) -> str | None:
        """The checkpoint of `kind` that iteration `before` starts from: the one trained by
        the newest iteration before it (an iteration whose training had no samples passes
        its own start on); before any, the policy's is `init_policy` (a warm start) or None
        (the base model), and the reward model's `init_rm` (a judge adapter) or None. A
        reward model that is not trained stays `init_rm`. A checkpoint that should be there
        and is not (deleted, pruned, incomplete, damaged) is an error naming it: the loop
        never falls back to an older model or to the base model."""
        if kind == "rm" and not self.cfg.rm_training:
            return self.init_rm
        for it in range(before - 1, -1, -1):
            d = self.dir / f"iter_{it:03d}"
            ckpt = d / kind
            if (d / f"train_{kind}.skipped.json").exists():
                continue  # no samples that iteration: the model stayed as it was
            if (ckpt / "rlany.json").exists():
                self._check_checkpoint(ckpt, kind)
                return str(ckpt)
            assumed = self.executor.assumed(kind, it)  # a plan's own training, not run yet
            if assumed == "skipped":
                continue
            if assumed == "trained":
                return str(ckpt)
            if (d / f"{kind}.pruned").exists():
                raise RlanyError(f"the {kind} checkpoint this iteration needs was pruned",
                                 where=str(ckpt), hint="rerun from a later iteration or "
                                 "raise keep_last")
            raise RlanyError(f"the {kind} checkpoint of iteration {it} is missing or "
                             "incomplete (no rlany.json); the loop will not fall back to an "
                             "older or the base model", where=str(ckpt),
                             hint="restore it, or start a new run with another --name")
        return self.init_policy if kind == "policy" else self.init_rm

    def _check_checkpoint(self, ckpt: Path, kind: str) -> None:
        from rlany.stage_engine import check_adapter

        if (ckpt / "adapter_config.json").exists() or not (ckpt / "config.json").exists():
            check_adapter(str(ckpt), f"the {kind} checkpoint")  # damaged: one line, named

    @property
    def init_policy(self) -> str | None:
        """The adapter iteration 0 starts from: init_policy, warm_start's sft, or None."""
        if self.cfg.warm_start:
            return str(self.dir / "warm_start" / "sft")
        return self.cfg.init_policy

    @property
    def init_rm(self) -> str | None:
        """The judge adapter iteration 0 starts from: init_rm (e.g. the supervised judge of
        docs/stages/loop.md's recipe), or None (the base model)."""
        return self.cfg.init_rm

"""`rlany judge`: trajectories -> judgments, m verdicts per step from a generative judge.

For every step the judge gets one prompt (`prompts.step_prompts`: the task, the earlier
actions, the observation, the policy's response and what happened next) and `m` samples
are drawn from it in one request, sharing the prompt. All steps of a batch of trajectories
go to the engine in one call. Each sample is parsed with `prompts.parse_verdict`: +1, -1,
or 0 when unparseable (counted and reported, never fatal).

Mode "unit-tests" (the paper's coding setting, DESIGN §4; `rlany.stages.unit_tests`): the
reward model writes tests instead of verdicts. Per task, one prompt
(`prompts.unit_test_messages`: the problem the policy saw) gets `m` samples, each parsed
into {input, expected output} by `prompts.parse_unit_test`. Every program of the task's
trajectories (the last ```python block of its single step) runs on all parsed tests in one
sandboxed process; its verdict from test j is +1 if it prints the expected output, -1 if
not, and 0 when test j was unparseable. So `rlany score` needs nothing new for the policy
(R = O + λ·mean_j S_j), and scores a test by how well it separates correct from incorrect
programs.

Judgments come out in trajectory order (one per trajectory, grouped by task), which is the
order `rlany score` reads them in. `--shard I/N` judges a contiguous block of the whole
input's batches (`rlany.shards`); a rollout shard's output is judged whole, without it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from rlany import limits
from rlany.engines.base import Engine, NoModel, Request, Sampling, real_token_ids, stable_seed
from rlany.errors import RlanyError, UsageError
from rlany.files.provenance import judgment_origin
from rlany.files.records import (
    MODES,
    JudgeSample,
    Judgment,
    StepJudgment,
    Trajectory,
    responses_digest,
)
from rlany.options import EngineFields, opt
from rlany.prompts import VERDICT_MODES, generate_verdicts, parse_verdict, step_prompts
from rlany.shards import shard_opt
from rlany.stages.episode_errors import ERRORED, errored
from rlany.stages.expert import check_labels, label_verdicts
from rlany.stages.resume import replayed
from rlany.stages.unit_tests import unit_test_batch, unit_test_counts
from rlany.stats import balanced_accuracy

if TYPE_CHECKING:
    from rlany.files.outputs import ResumableJsonl

SELECTS = ("all", "used")


@dataclass(frozen=True, kw_only=True)
class JudgeOptions(EngineFields):
    input: str = opt("-", "trajectories.jsonl; - for stdin (the default).", scope="io", short="-i")
    output: str = opt("judgments.jsonl", "judgments.jsonl. - streams to stdout each task's "
                      "trajectories followed by their judgments, which `rlany score -i -` "
                      "reads (no --judgments needed). A file resumes (same flags); stdout "
                      "does not.", scope="io", short="-o")
    m: int = opt(3, "Judge samples per step.", min=1, max=limits.MAX_SAMPLES)
    max_tokens: int = opt(384, "Max new tokens of each judge sample's reasoning. 0: no "
                          "reasoning, the verdict alone (constrained): the m samples of a "
                          "step then cost one prompt pass, not m generations.", min=0,
                          max=limits.MAX_TOKENS)
    temperature: float = opt(0.8, "Sampling temperature.", min=0)
    top_p: float = opt(1.0, "Nucleus sampling top-p.", min=0, max=1, min_exclusive=True)
    batch_trajectories: int = opt(64, "Trajectories whose steps go to the engine in one call.",
                                  min=1, max=limits.MAX_BATCH)
    history_steps: int = opt(5, "Earlier actions shown to the judge.", min=0)
    obs_lines: int = opt(0, "Cap the judge's prompt: what happened next, and the task's "
                         "first observation at later steps, cut to their first N lines (0: "
                         "whole). The observation the step acted on is always whole.", min=0)
    mode: str = opt("steps", "steps: m verdicts per step. unit-tests (coding): the judge writes "
                    "m tests per task and every program is run on them in the sandbox.",
                    choices=MODES)
    verdict: str = opt("constrained", "constrained: reason freely, then the verdict is decoded "
                       "as exactly \\boxed{+1} or \\boxed{-1} (always readable). free: parse "
                       "whatever the judge wrote (unparseable scores 0).", choices=VERDICT_MODES)
    last_step_only: bool = opt(False, "Judge only each trajectory's last step.")
    select: str = opt("all", "Which tasks to judge. all: every step of every trajectory "
                      "(the paper). used: only the tasks `score` can train on, i.e. not a "
                      "pending candidate and with rollouts that neither all succeed nor all "
                      "fail; the others get an unjudged record (no verdicts, `skipped` says "
                      "why), so their step rewards are 0 and adapt-tasks has no critiques "
                      "of them.", choices=SELECTS)
    test_cpu_s: float = opt(2.0, "unit-tests: CPU seconds per program per test.", min=0,
                            min_exclusive=True)
    labels: bool = opt(False, "No model: each step's m verdicts are the env's own step label "
                       "(steps[t].info.label: household, alfworld, miniwob), in exactly the "
                       "prompts the other flags give: labelled reward-model data for a judge "
                       "warm start (then `score --rm-target label`, `train-rm --objective "
                       "logloss`). Needs --max-tokens 0; a step without a label is an error.",
                       scope="io")
    shard: str | None = shard_opt("whole batches (--batch-trajectories) of the input's task "
                                  "groups, contiguous")

    def check(self, name) -> None:
        if self.labels and self.max_tokens != 0:
            raise UsageError(f"{name('labels')} writes bare verdicts (the env's labels): it "
                             f"needs {name('max_tokens')} 0")
        if self.max_tokens == 0 and (self.verdict != "constrained" or self.mode != "steps"):
            raise RlanyError(f"{name('max_tokens')} 0 (the verdict alone) needs "
                             f"{name('verdict')} constrained and {name('mode')} steps")

    @property
    def sampling(self) -> Sampling:
        return Sampling(max_tokens=self.max_tokens, temperature=self.temperature,
                        top_p=self.top_p)


def judge(trajectories: Iterable[Trajectory], engine: Engine, opts: JudgeOptions,
          judge_info: dict | None = None) -> Iterator[list[Judgment]]:
    """Yield the judgments of each task's trajectories, task by task, in input order."""
    batch: list[list[Trajectory]] = []
    size = 0
    for group in _task_groups(trajectories):
        batch.append(group)
        size += len(group)
        if size >= opts.batch_trajectories:
            yield from _judge_batch(batch, engine, opts, judge_info or {})
            batch, size = [], 0
    if batch:
        yield from _judge_batch(batch, engine, opts, judge_info or {})


def _judge_batch(batch: list[list[Trajectory]], engine: Engine, opts: JudgeOptions,
                judge_info: dict) -> Iterator[list[Judgment]]:
    if opts.mode == "unit-tests":
        return unit_test_batch(batch, engine, replace(opts.sampling, n=opts.m),
                               adapter=opts.adapter, seed=opts.seed, cpu_s=opts.test_cpu_s,
                               judge_info=judge_info)
    return _step_batch(batch, engine, opts, judge_info)


def _task_groups(trajectories: Iterable[Trajectory]) -> Iterator[list[Trajectory]]:
    group: list[Trajectory] = []
    for traj in trajectories:
        if group and traj.task_id != group[0].task_id:
            yield group
            group = []
        group.append(traj)
    if group:
        yield group


def _step_batch(batch: list[list[Trajectory]], engine: Engine, opts: JudgeOptions,
                 judge_info: dict) -> Iterator[list[Judgment]]:
    skipped = {t.traj_id: why for g in batch if (why := unused(g, opts.select))
               for t in g}
    for t in (t for g in batch for t in g if errored(t) and t.traj_id not in skipped):
        skipped[t.traj_id] = ERRORED
    prompts = {t.traj_id: list(enumerate(step_prompts(t, opts.history_steps, opts.obs_lines)))
               for g in batch for t in g if t.traj_id not in skipped}
    if opts.last_step_only:
        prompts = {tid: steps[-1:] for tid, steps in prompts.items()}
    requests = [Request(messages=p, adapter=opts.adapter,
                        sampling=replace(opts.sampling, n=opts.m,
                                         seed=stable_seed(opts.seed, "judge", tid, k)))
                for tid, steps in prompts.items() for k, p in steps]
    results = iter(label_verdicts(batch, prompts, opts.m) if opts.labels
                   else generate_verdicts(engine, requests, opts.verdict))
    real_ids = real_token_ids(engine)
    for group in batch:
        judgments = []
        for traj in group:
            if traj.traj_id in skipped:
                judgments.append(Judgment(traj_id=traj.traj_id, task_id=traj.task_id,
                                          judge=judge_info, steps=[],
                                          skipped=skipped[traj.traj_id],
                                          responses_sha256=responses_digest(traj.steps),
                                          extra=judgment_origin(traj)))
                continue
            steps = []
            for k, messages in prompts[traj.traj_id]:
                result = next(results)
                samples = [JudgeSample(text=c.text, score=parse_verdict(c.text),
                                       token_ids=list(c.token_ids) if real_ids else None,
                                       finish_reason=c.finish_reason)
                           for c in result.completions]
                steps.append(StepJudgment(step=k, judge_messages=messages, samples=samples))
            judgments.append(Judgment(traj_id=traj.traj_id, task_id=traj.task_id,
                                      judge=judge_info, steps=steps,
                                      responses_sha256=responses_digest(traj.steps),
                                      extra=judgment_origin(traj)))
        yield judgments


def unused(group: list[Trajectory], select: str) -> str | None:
    """Why `--select used` leaves this task's trajectories unjudged (None: judge them)."""
    if select == "all":
        return None
    if any(t.extra.get("candidate") for t in group):
        return "candidate task, not accepted yet"
    outcomes = {t.outcome for t in group if not errored(t)}  # as score reads the group
    if len(outcomes) <= 1:
        return "uniform outcome" if outcomes else "no episode ran"
    return None


# -- the file driver: `rlany judge` and the loop's judge stage --------------------------

def run(opts: JudgeOptions, engine: Engine | None = None) -> dict:
    """Read trajectories, judge them (resuming a partial output), write judgments."""
    from rlany import shards
    from rlany.console import info
    from rlany.files.jsonl import JsonlReader
    from rlany.files.outputs import ResumableJsonl, write_meta
    from rlany.stage_engine import (
        GEN_VERSIONS,
        check_adapter,
        check_fits,
        engine_flags,
        start_engine,
    )
    from rlany.stageio import output_lock, output_state, prepare_paths, resumable_sides

    started = time.time()
    shard = shards.parse(opts.shard)
    if shard:
        shards.refuse_sharded_input(opts.input)
    if opts.labels and (engine is not None or opts.adapter):
        raise UsageError("--labels writes the env's labels: no model, so no --adapter")
    check_adapter(opts.adapter)
    check_fits(opts, opts.adapter)
    seen = output_state(opts.output)  # re-checked once the lock is held
    path = prepare_paths({"--input": opts.input}, {"--output": opts.output},
                         resumable_sides(opts.output))["--input"]
    reader = JsonlReader(path, Trajectory, "trajectories", name=opts.input)
    sizes, steps = _check_input(reader, opts.labels, opts.last_step_only)
    keep, in_shard = shards.take(list(sizes), opts.batch_trajectories, shard, stage="judge",
                                 batch_flag="--batch-trajectories", unit="task groups",
                                 sizes=list(sizes.values()))
    limits.check_verdicts(opts.m, sum(sizes[t] for t in keep), sum(steps[t] for t in keep),
                          opts.batch_trajectories)
    engine = (NoModel("labels", "--labels: the env's step labels, no model") if opts.labels
              else engine or start_engine(opts, "judge"))
    flags = engine_flags(opts, engine)
    with output_lock(opts.output, seen=seen):
        out = ResumableJsonl(opts.output, header={"flags": flags, "input": reader.sha256})
        if out.done:
            info(f"judge: resuming, {len(out.done)} tasks already judged")
        mark = engine.stats.mark()
        try:
            tally = _judge_into(out, reader, engine, opts, set(keep) if shard else None,
                                replayed(list(sizes), list(sizes.values()),
                                         opts.batch_trajectories, set(out.done)))
        finally:
            out.close()
        out.finish()
        counts = {**_judge_counts(tally.verdicts, tally.tests, out.count, engine, mark),
                  "skipped": tally.skipped,
                  # balanced accuracy against the env's step labels, on the steps judged here
                  "label_accuracy": balanced_accuracy(tally.by_label),
                  "labelled_verdicts": tally.by_label[1][0] + tally.by_label[-1][0],
                  **in_shard}
        # under the lock: a writer waiting for it finds the output complete, sidecar too
        write_meta(opts.output, stage="judge", flags=flags, inputs=[reader], counts=counts,
                   started=started, versions=GEN_VERSIONS)
    info(_summary_line(counts, tally, opts.output, started))
    return counts


def _check_input(reader: Iterable[tuple[str, Trajectory]], labels: bool, last_only: bool
                 ) -> tuple[dict[str, int], dict[str, int]]:
    """A malformed line, a task split in two or a trajectory id seen before fails here,
    before an engine is started (groups are judged and resumed by task, and matched by id);
    with `labels`, so does a step without the env's label (errored episodes, never judged,
    aside). Returns each task's group size,
    in input order, and its steps to judge (`last_only`: one a trajectory)."""
    from rlany.stages.pairing import groups

    ids: set[str] = set()
    steps: dict[str, int] = {}

    def unique():
        for where, t in reader:
            if t.traj_id in ids:
                raise RlanyError(f"duplicate trajectory '{t.traj_id}'", where=where)
            if labels and not errored(t):
                check_labels(t, where)
            ids.add(t.traj_id)
            judged = 0 if errored(t) else len(t.steps)
            steps[t.task_id] = steps.get(t.task_id, 0) + min(judged, 1 if last_only else judged)
            yield where, t, None
    return {g[0][1].task_id: len(g) for g in groups(unique())}, steps


@dataclass
class _Tally:
    """What `run` counts as judgments are written: verdicts by value, verdicts against the
    env's step labels ({label: [verdicts, verdicts equal to it]}), the unit-test counts and
    the trajectories left unjudged."""
    verdicts: dict[int, int] = field(default_factory=lambda: {1: 0, -1: 0, 0: 0})
    by_label: dict[int, list[int]] = field(default_factory=lambda: {1: [0, 0], -1: [0, 0]})
    tests: dict[str, int] = field(default_factory=dict)
    skipped: int = 0

    def add(self, judgment: Judgment, step_labels: list, steps_mode: bool) -> None:
        self.skipped += judgment.skipped is not None
        for s in judgment.steps:
            label = step_labels[s.step] if s.step < len(step_labels) else None
            for sample in s.samples:
                self.verdicts[sample.score] += 1
                if label in self.by_label and steps_mode:
                    self.by_label[label][0] += 1
                    self.by_label[label][1] += sample.score == label


def _judge_into(out: ResumableJsonl, reader: Iterable[tuple[str, Trajectory]], engine: Engine,
                opts: JudgeOptions, keep: set[str] | None, replay: set[str]) -> _Tally:
    """Judge the tasks `out` has not written yet (of `keep`, a shard's, where given; with
    the rest of their batches, `replay`), writing each task's judgments as one group
    (after its trajectories when `out` streams)."""
    from rlany.console import progress

    done = set(out.done)
    outcomes: dict[str, int] = {}
    labels: dict[str, list] = {}  # the env's step labels (+1 / -1), where it gives them
    held: dict[str, Trajectory] = {}  # -o -: trajectories passed through to the pipe

    def todo():
        for _, t in reader:
            if t.task_id in replay and (keep is None or t.task_id in keep):
                outcomes[t.traj_id] = t.outcome
                labels[t.traj_id] = [s.info.get("label") for s in t.steps]
                if out.stream:
                    held[t.traj_id] = t
                yield t
    tally = _Tally()
    with progress("judge", None) as bar:
        for group in judge(todo(), engine, opts, {"model": engine.model,
                                                  "adapter": opts.adapter}):
            if group[0].task_id in done:  # judged again with its batch, written before
                for j in group:
                    outcomes.pop(j.traj_id, None), labels.pop(j.traj_id, None)
                continue
            passed = [held.pop(j.traj_id) for j in group] if out.stream else []
            out.write_group(group[0].task_id, [*passed, *group])
            if opts.mode == "unit-tests":
                for key, value in unit_test_counts(group, outcomes).items():
                    tally.tests[key] = tally.tests.get(key, 0) + value
            for j in group:
                outcomes.pop(j.traj_id, None)
                tally.add(j, labels.pop(j.traj_id, []), opts.mode == "steps")
            bar.advance()
    return tally


def _summary_line(counts: dict, tally: _Tally, output: str, started: float) -> str:
    seconds = counts["generate_seconds"]
    verdicts, skipped = tally.verdicts, tally.skipped
    return (f"judge: {counts['verdicts']} verdicts (+1: {verdicts[1]}, -1: {verdicts[-1]}, "
            f"unparseable: {verdicts[0]} = {counts['parse_fail_rate']:.1%}; share of +1 "
            f"{_pct(counts['positive_share'])}{_label_line(counts['label_accuracy'])}); "
            f"{_tests_line(tally.tests)}"
            f"{f'{skipped} trajectories not judged (--select used); ' if skipped else ''}"
            f"{counts['completion_tokens']} tokens, "
            f"{counts['completion_tokens'] / seconds if seconds else 0:.0f} tokens/s -> "
            f"{output} ({time.time() - started:.1f}s)")


def _judge_counts(verdicts: dict[int, int], tests: dict[str, int], judgments: int, engine,
                  mark: tuple) -> dict:
    from rlany.stage_engine import adapter_checks

    total = sum(verdicts.values())
    readable = verdicts[1] + verdicts[-1]
    return {"judgments": judgments, "verdicts": total, "positive": verdicts[1],
            "negative": verdicts[-1], "unparseable": verdicts[0],
            "parse_fail_rate": verdicts[0] / total if total else 0.0,
            "positive_share": verdicts[1] / readable if readable else None,
            **engine.stats.since(mark), **tests,
            **adapter_checks(engine)}


def _label_line(accuracy: float | None) -> str:
    return "" if accuracy is None else f"; balanced accuracy vs the env's step labels " \
        f"{accuracy:.1%}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _tests_line(tests: dict[str, int]) -> str:
    if not tests:
        return ""
    return (f"unit tests: {tests['tests_parsed']}/{tests['tests']} parsed, "
            f"{tests['tests_valid']}/{tests['tests_checkable']} passed by every correct "
            f"program, {tests['tests_discriminating']} of those fail a wrong one; ")

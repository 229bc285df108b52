"""`rlany judge`: trajectories -> judgments, m verdicts per step from a generative judge.

For every step the judge gets one prompt (`prompts.judge_messages`: the task, the earlier
actions, the observation, the policy's response and what happened next) and `m` samples
are drawn from it in one request, sharing the prompt. All steps of a batch of trajectories
go to the engine in one call. Each sample is parsed with `prompts.parse_verdict`: +1, -1,
or 0 when unparseable (counted and reported, never fatal).

Mode "unit-tests" (the paper's coding setting, DESIGN §4): the reward model writes tests
instead of verdicts. Per task, one prompt (`prompts.unit_test_messages`: the problem the
policy saw) gets `m` samples, each parsed into {input, expected output} by
`prompts.parse_unit_test`. Every program of the task's trajectories (the last ```python
block of its single step) runs on all parsed tests in one sandboxed process; its verdict
from test j is +1 if it prints the expected output, -1 if not, and 0 when test j was
unparseable. So `rlany score` needs nothing new for the policy (R = O + λ·mean_j S_j),
and scores a test by how well it separates correct from incorrect programs.

Judgments come out in trajectory order (one per trajectory, grouped by task), which is the
order `rlany score` reads them in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from rlany.chat import text_of
from rlany.engines import Engine, Request, Sampling, real_token_ids, stable_seed
from rlany.errors import RlanyError, UsageError
from rlany.options import EngineFields, opt
from rlany.prompts import (
    VERDICT_MODES,
    clip,
    generate_verdicts,
    judge_messages,
    parse_unit_test,
    parse_verdict,
    unit_test_messages,
)
from rlany.records import (
    MODES,
    JudgeSample,
    Judgment,
    StepJudgment,
    Trajectory,
    responses_digest,
)

SELECTS = ("all", "used")


@dataclass(frozen=True, kw_only=True)
class JudgeOptions(EngineFields):
    input: str = opt("-", "trajectories.jsonl; - for stdin (the default).", scope="io", short="-i")
    output: str = opt("judgments.jsonl", "judgments.jsonl. - streams to stdout each task's "
                      "trajectories followed by their judgments, which `rlany score -i -` "
                      "reads (no --judgments needed). A file resumes (same flags); stdout "
                      "does not.", scope="io", short="-o")
    m: int = opt(3, "Judge samples per step.", min=1)
    max_tokens: int = opt(384, "Max new tokens of each judge sample's reasoning. 0: no "
                          "reasoning, the verdict alone (constrained): the m samples of a "
                          "step then cost one prompt pass, not m generations.", min=0)
    temperature: float = opt(0.8, "Sampling temperature.", min=0)
    top_p: float = opt(1.0, "Nucleus sampling top-p.", min=0, max=1, min_exclusive=True)
    batch_trajectories: int = opt(64, "Trajectories whose steps go to the engine in one call.",
                                  min=1)
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


def step_prompts(traj: Trajectory, history_steps: int, obs_lines: int = 0
                 ) -> list[list[dict]]:
    """The judge prompt of every step of one trajectory.

    The task is the policy's first user message; at step 0 its observation part is left out
    (the prompt shows the observation anyway), and at later steps it is cut to `obs_lines`
    lines (0: whole), as is what happened next. Earlier steps are listed as the action and
    the first line of what the env answered (the full state is in the current observation).
    """
    prompts = []
    obs0 = traj.steps[0].obs if traj.steps else ""
    for t, step in enumerate(traj.steps):
        first_user = next((text_of(m["content"]) for m in step.prompt_messages
                           if m["role"] == "user"), "")
        if obs0 and first_user.endswith(obs0):
            head = first_user[:-len(obs0)]
            if t == 0:
                first_user = head.strip() or first_user
            elif obs_lines:
                first_user = head + _lines(obs0, obs_lines)
        next_obs = _lines(step.next_obs, obs_lines) if obs_lines else step.next_obs
        earlier = traj.steps[max(0, t - history_steps):t]
        history = [f"step {t - len(earlier) + k}: {clip(s.action or s.response, 300)} -> "
                   f"{clip(_first_line(s.next_obs), 300)}" for k, s in enumerate(earlier)]
        prompts.append(judge_messages(first_user, history, step.obs, step.response,
                                      next_obs, step.images, step.next_images))
    return prompts


def _lines(text: str, n: int) -> str:
    return "\n".join(text.splitlines()[:n])


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")


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
        return _unit_test_batch(batch, engine, opts, judge_info)
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
    prompts = {t.traj_id: list(enumerate(step_prompts(t, opts.history_steps, opts.obs_lines)))
               for g in batch for t in g if t.traj_id not in skipped}
    if opts.last_step_only:
        prompts = {tid: steps[-1:] for tid, steps in prompts.items()}
    requests = [Request(messages=p, adapter=opts.adapter,
                        sampling=replace(opts.sampling, n=opts.m,
                                         seed=stable_seed(opts.seed, "judge", tid, k)))
                for tid, steps in prompts.items() for k, p in steps]
    results = iter(_label_verdicts(batch, prompts, opts.m) if opts.labels
                   else generate_verdicts(engine, requests, opts.verdict))
    real_ids = real_token_ids(engine)
    for group in batch:
        judgments = []
        for traj in group:
            if traj.traj_id in skipped:
                judgments.append(Judgment(traj_id=traj.traj_id, task_id=traj.task_id,
                                          judge=judge_info, steps=[],
                                          skipped=skipped[traj.traj_id],
                                          responses_sha256=responses_digest(traj.steps)))
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
                                      responses_sha256=responses_digest(traj.steps)))
        yield judgments


class LabelEngine:
    """What `judge --labels` runs instead of a model: the verdicts are the env's labels."""
    name = "labels"
    model = "labels"
    real_token_ids = False
    choice = {"engine": "labels", "reason": "--labels: the env's step labels, no model"}

    def __init__(self) -> None:
        from rlany.engines import EngineStats

        self.stats = EngineStats()


def _label_verdicts(batch: list[list[Trajectory]], prompts: dict, m: int) -> Iterator:
    """One result per judged step (the order of `prompts`): m copies of the verdict that
    is the step's label."""
    from rlany.engines import Completion, Result
    from rlany.prompts import VERDICT_CHOICES

    steps = {t.traj_id: t.steps for g in batch for t in g}
    for tid, judged in prompts.items():
        for k, _ in judged:
            text = VERDICT_CHOICES[(1, -1).index(steps[tid][k].info["label"])]
            yield Result(prompt_token_ids=[], completions=[
                Completion(text=text, token_ids=[], finish_reason="stop") for _ in range(m)])


def _check_labels(traj: Trajectory, where: str) -> None:
    """`--labels`: every step carries the env's label, +1 or -1 (checked at read)."""
    for k, step in enumerate(traj.steps):
        if step.info.get("label") not in (1, -1):
            raise RlanyError(f"step {k} of '{traj.traj_id}' has no env label (info.label "
                             "+1/-1), so --labels has no verdict for it", where=where)


def unused(group: list[Trajectory], select: str) -> str | None:
    """Why `--select used` leaves this task's trajectories unjudged (None: judge them)."""
    if select == "all":
        return None
    if any(t.extra.get("candidate") for t in group):
        return "candidate task, not accepted yet"
    if len({t.outcome for t in group}) == 1:
        return "uniform outcome"
    return None


def _unit_test_batch(batch: list[list[Trajectory]], engine: Engine, opts: JudgeOptions,
                     judge_info: dict) -> Iterator[list[Judgment]]:
    from rlany.envs.coding import extract_code

    for group in batch:
        for traj in group:
            if len(traj.steps) > 1:
                raise RlanyError(f"trajectory '{traj.traj_id}' has {len(traj.steps)} steps: "
                                 "--mode unit-tests judges single-turn coding trajectories")
    # one test-writing prompt per task, m samples
    asked = [(g, unit_test_messages(next(t.steps[0].obs for t in g if t.steps)))
             for g in batch if any(t.steps for t in g)]
    requests = [Request(messages=messages, adapter=opts.adapter,
                        sampling=replace(opts.sampling, n=opts.m,
                                         seed=stable_seed(opts.seed, "unit-tests",
                                                          g[0].task_id)))
                for g, messages in asked]
    written = {g[0].task_id: (messages, [(c.text, parse_unit_test(c.text))
                                         for c in result.completions])
               for (g, messages), result in zip(asked, engine.generate(requests))}
    # every program against its task's parsed tests, one sandboxed process per program
    jobs = [(t, [test for _, test in written[g[0].task_id][1] if test is not None])
            for g in batch for t in g if t.steps]
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        passed = dict(zip((t.traj_id for t, _ in jobs),
                          pool.map(lambda job: _run_program(
                              extract_code(job[0].steps[0].response), job[1], opts.test_cpu_s),
                              jobs)))
    for group in batch:
        judgments = []
        for traj in group:
            steps = []
            if traj.steps:
                messages, tests = written[traj.task_id]
                verdicts = iter(passed[traj.traj_id])
                samples = [JudgeSample(text=text, test=test,
                                       score=0 if test is None else next(verdicts))
                           for text, test in tests]
                steps.append(StepJudgment(step=0, judge_messages=messages, samples=samples))
            judgments.append(Judgment(traj_id=traj.traj_id, task_id=traj.task_id,
                                      judge=judge_info, steps=steps, mode="unit-tests",
                                      responses_sha256=responses_digest(traj.steps)))
        yield judgments


def _run_program(code: str, tests: list[dict], cpu_s: float) -> list[int]:
    """+1 / -1 per test: does the program print the expected output?"""
    if not tests:
        return []
    from rlany.sandbox import Limits, outputs_match, run_tests

    results = run_tests(code, [t["input"] for t in tests], Limits(cpu_s=cpu_s))
    return [1 if r.status == "ok" and outputs_match(r.stdout, t["output"]) else -1
            for r, t in zip(results, tests)]


def unit_test_counts(group: list[Judgment], outcomes: dict[str, int]) -> dict[str, int]:
    """Per task: tests written, parsed, and (when some program is correct) how many every
    correct program passes ("valid") and how many of those also fail a wrong one."""
    judged = [j for j in group if j.steps]
    if not judged:
        return {}
    m = len(judged[0].steps[0].samples)
    parsed = [judged[0].steps[0].samples[k].test is not None for k in range(m)]
    counts = {"tests": m, "tests_parsed": sum(parsed), "tests_checkable": 0,
              "tests_valid": 0, "tests_discriminating": 0}
    right = [j for j in judged if outcomes.get(j.traj_id) == 1]
    wrong = [j for j in judged if outcomes.get(j.traj_id) == -1]
    if not right:
        return counts
    for k in range(m):
        if not parsed[k]:
            continue
        counts["tests_checkable"] += 1
        if all(j.steps[0].samples[k].score == 1 for j in right):
            counts["tests_valid"] += 1
            counts["tests_discriminating"] += any(j.steps[0].samples[k].score == -1
                                                  for j in wrong)
    return counts


# -- the file driver: `rlany judge` and the loop's judge stage --------------------------

def run(opts: JudgeOptions, engine: Engine | None = None) -> dict:
    """Read trajectories, judge them (resuming a partial output), write judgments."""
    from rlany.console import info, progress
    from rlany.jsonl import JsonlReader
    from rlany.outputs import ResumableJsonl, write_meta
    from rlany.stageio import (
        GEN_VERSIONS,
        check_adapter,
        engine_flags,
        output_lock,
        prepare_paths,
        start_engine,
    )
    from rlany.stages.pairing import groups

    started = time.time()
    if opts.labels and (engine is not None or opts.adapter):
        raise UsageError("--labels writes the env's labels: no model, so no --adapter")
    check_adapter(opts.adapter)
    path = prepare_paths({"--input": opts.input}, {"--output": opts.output})["--input"]
    reader = JsonlReader(path, Trajectory, "trajectories", name=opts.input)
    # a malformed line, a task split in two or a trajectory id seen before fails here,
    # before an engine is started (groups are judged and resumed by task, and matched by id)
    ids: set[str] = set()

    def unique():
        for where, t in reader:
            if t.traj_id in ids:
                raise RlanyError(f"duplicate trajectory '{t.traj_id}'", where=where)
            if opts.labels:
                _check_labels(t, where)
            ids.add(t.traj_id)
            yield where, t, None
    for _ in groups(unique()):
        pass
    engine = LabelEngine() if opts.labels else engine or start_engine(opts)
    flags = engine_flags(opts, engine)
    with output_lock(opts.output):
        out = ResumableJsonl(opts.output, header={"flags": flags, "input": reader.sha256})
        done = set(out.done)
        if done:
            info(f"judge: resuming, {len(done)} tasks already judged")
        tokens0, secs0 = engine.stats.completion_tokens, engine.stats.seconds
        outcomes: dict[str, int] = {}
        labels: dict[str, list] = {}  # the env's step labels (+1 / -1), where it gives them
        held: dict[str, Trajectory] = {}  # -o -: trajectories passed through to the pipe

        def todo():
            for _, t in reader:
                if t.task_id not in done:
                    outcomes[t.traj_id] = t.outcome
                    labels[t.traj_id] = [s.info.get("label") for s in t.steps]
                    if out.stream:
                        held[t.traj_id] = t
                    yield t
        verdicts = {1: 0, -1: 0, 0: 0}
        by_label = {1: [0, 0], -1: [0, 0]}  # step label -> [verdicts, verdicts equal to it]
        tests: dict[str, int] = {}
        skipped = 0
        try:
            with progress("judge", None) as bar:
                for group in judge(todo(), engine, opts, {"model": engine.model,
                                                          "adapter": opts.adapter}):
                    passed = [held.pop(j.traj_id) for j in group] if out.stream else []
                    out.write_group(group[0].task_id, [*passed, *group])
                    if opts.mode == "unit-tests":
                        for key, value in unit_test_counts(group, outcomes).items():
                            tests[key] = tests.get(key, 0) + value
                    for j in group:
                        outcomes.pop(j.traj_id, None)
                        step_labels = labels.pop(j.traj_id, [])
                        skipped += j.skipped is not None
                        for s in j.steps:
                            label = step_labels[s.step] if s.step < len(step_labels) else None
                            for sample in s.samples:
                                verdicts[sample.score] += 1
                                if label in by_label and opts.mode == "steps":
                                    by_label[label][0] += 1
                                    by_label[label][1] += sample.score == label
                    bar.advance()
        finally:
            out.close()
        out.finish()
    counts = {**_judge_counts(verdicts, tests, out.count, engine, tokens0, secs0),
              "skipped": skipped,
              # balanced accuracy against the env's step labels, on the steps judged here
              "label_accuracy": balanced_accuracy(by_label),
              "labelled_verdicts": by_label[1][0] + by_label[-1][0]}
    write_meta(opts.output, stage="judge", flags=flags, inputs=[reader], counts=counts,
               started=started, versions=GEN_VERSIONS)
    seconds = counts["generate_seconds"]
    info(f"judge: {counts['verdicts']} verdicts (+1: {verdicts[1]}, -1: {verdicts[-1]}, "
         f"unparseable: {verdicts[0]} = {counts['parse_fail_rate']:.1%}; share of +1 "
         f"{_pct(counts['positive_share'])}{_label_line(counts['label_accuracy'])}); "
         f"{_tests_line(tests)}"
         f"{f'{skipped} trajectories not judged (--select used); ' if skipped else ''}"
         f"{counts['completion_tokens']} tokens, "
         f"{counts['completion_tokens'] / seconds if seconds else 0:.0f} tokens/s -> "
         f"{opts.output} ({time.time() - started:.1f}s)")
    return counts


def _judge_counts(verdicts: dict[int, int], tests: dict[str, int], judgments: int, engine,
                  tokens0: int, secs0: float) -> dict:
    from rlany.stageio import adapter_checks

    total = sum(verdicts.values())
    readable = verdicts[1] + verdicts[-1]
    return {"judgments": judgments, "verdicts": total, "positive": verdicts[1],
            "negative": verdicts[-1], "unparseable": verdicts[0],
            "parse_fail_rate": verdicts[0] / total if total else 0.0,
            "positive_share": verdicts[1] / readable if readable else None,
            "completion_tokens": engine.stats.completion_tokens - tokens0,
            "generate_seconds": round(engine.stats.seconds - secs0, 3), **tests,
            **adapter_checks(engine)}


def balanced_accuracy(by_label: dict[int, list[int]]) -> float | None:
    """Mean over the step labels present of the share of verdicts equal to the label
    ({label: [verdicts, correct]}): a constant judge scores 0.5 whatever the label mix."""
    rates = [ok / n for n, ok in by_label.values() if n]
    return sum(rates) / len(rates) if rates else None


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

"""`rlany adapt-tasks`: the environment learns too (RLAnything's task adaptation).

Two steps, both pure functions of records plus an engine:

1. `decide` (acceptance of last iteration's candidates, now rolled out). A candidate q'
   of task q is accepted only on evidence (DESIGN §4):
       harder: alpha_low < acc(q') < acc(q)
       easier: acc(q) < acc(q') < alpha_high
       always: acc(q') > 0   (at least one success proves q' solvable)
   acc(q) is the parent's accuracy in the same iteration when the parent was rolled out
   again (same policy), else its accuracy when the candidate was proposed. An accepted q'
   replaces q in the pool at q's position; lineage keeps root, parent, version, direction
   and the iteration of acceptance. Every decision is recorded with its reason.

2. `propose` (new candidates). For each pool task with acc >= alpha_high (make harder) or
   acc <= alpha_low (make easier), the reward model's critiques of its trajectories are
   summarized: `--summary extract` takes the judge texts of steps it scored -1 first,
   near-duplicates dropped, clipped; `--summary model` then has the model condense them
   into three sentences (the paper's summarized critic). Then the rewrite:
   * `--rewrite edits` (what `auto` picks where the env offers edits): the model sees the
     task, the summary and the env's numbered edits (`Environment.edits(spec,
     direction)`: short, described, each already valid) and its answer is decoded as one
     of the numbers, so a small model's every proposal is a valid task.
   * `--rewrite free`: the model writes a whole new JSON spec (for strong models); it must
     parse, pass the env's `validate`.
   A proposal must not duplicate a pool task (a free rewrite: not even nearly, rapidfuzz);
   `samples` proposals are drawn and the first that passes is the candidate, recorded with
   its summary and (edits) the edit chosen. Rejections are recorded with their reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from rlany.engines import Engine, Request, Sampling
from rlany.envs import Environment
from rlany.envs.make import spec_key
from rlany.errors import RlanyError, UsageError
from rlany.options import EngineFields, opt
from rlany.prompts import clip, edit_choices, edit_messages, rewrite_messages
from rlany.records import Task, TaskStats
from rlany.stages.adapt_metrics import env_loop_counts, summary_line
from rlany.stages.critiques import model_summaries, read_critiques
from rlany.stages.rewrites import (
    RandomEdits,
    candidate_task,
    check_candidate,
    describe,
    duplicate,
    read_proposal,
    reparent,
    stepping_stones,
)

REWRITES = ("auto", "edits", "free", "random")
CRITICS = ("auto", "judge", "env")
SUMMARIES = ("extract", "model")


@dataclass(frozen=True, kw_only=True)
class AdaptOptions(EngineFields):
    input: str = opt("-", "The task pool (tasks.jsonl); - for stdin (the default).",
                     scope="io", short="-i")
    stats: str = opt("task_stats.jsonl", "task_stats.jsonl from `rlany score` of a rollout of "
                     "the pool (and of --pending).", scope="io")
    output: str = opt("next_tasks.jsonl", "The next task pool; - for stdout.", scope="io",
                      short="-o")
    candidates: str = opt("candidates.jsonl", "New candidate tasks, to roll out next "
                          "iteration.", scope="io")
    decisions: str | None = opt(None, "Acceptance decisions and rejected rewrites, with "
                                "reasons. Default: decisions.jsonl beside --output (none when "
                                "--output is -).", scope="io")
    judgments: str | None = opt(None, "judgments.jsonl: the critiques the rewriter reads.",
                                scope="io", short="-j")
    trajectories: str | None = opt(None, "trajectories.jsonl of the rollout the stats were "
                                   "scored from: the env's own account of the episodes "
                                   "(--critic env, or auto).", scope="io")
    pending: str | None = opt(None, "Last iteration's candidates, rolled out in this "
                              "iteration: accepted or rejected by the acceptance rule.",
                              scope="io")
    held_out: str | None = opt(None, "Tasks never to propose (the eval tasks: a loop passes "
                               "its eval_tasks): a rewrite into one is rejected.", scope="io")
    iteration: int = opt(0, "Loop iteration (ids and lineage).", scope="io", min=0)
    alpha_high: float = opt(0.8, "acc >= this: make the task harder.", min=0, max=1)
    alpha_low: float = opt(0.2, "acc <= this: make the task easier.", min=0, max=1)
    samples: int = opt(2, "Rewrites drawn per task; the first valid one is kept.", min=1)
    descend: int = opt(0, "Not in the paper: an easier candidate rejected as unsolved (acc "
                       "0, its parent still unsolved) is a stepping stone; its own easier "
                       "rewrite becomes the parent's next candidate, up to this many stones "
                       "deep. 0: the paper's rule (one edit from the pool task).", min=0)
    exclude_edits: str | None = opt(None, "Not in the paper: leave out of the menu the env's "
                                    "edits whose description starts with one of these "
                                    "comma-separated names, e.g. 'goal kind'.")
    critiques: int = opt(3, "Critique snippets in a task's summary.", min=1)
    dup_threshold: float = opt(97.0, "rapidfuzz similarity (0-100) at which a rewrite "
                               "duplicates a pool task.", min=0, max=100)
    max_tokens: int = opt(384, "Max new tokens per free rewrite (and per model summary).",
                          min=1)
    temperature: float = opt(0.7, "Sampling temperature of the rewriter.", min=0)
    rewrite: str = opt("auto", "edits: pick one of the env's numbered edits (decoded as one "
                       "of the numbers: always valid). free: write a whole new JSON spec. "
                       "auto: edits for envs that offer edits (all built-in ones), else free. "
                       "random: a uniformly random edit of the same menu, no model (the "
                       "control the model's choice is measured against).",
                       choices=REWRITES)
    critic: str = opt("auto", "What the rewriter reads of a task's episodes: judge (the "
                      "judge's critiques), env (the env's account from --trajectories: how "
                      "episodes ended, their actions with off-plan ones marked, the last "
                      "observation), auto (the judge's where it wrote more than verdicts, "
                      "else the env's).", choices=CRITICS)
    summary: str = opt("extract", "The critique summary the rewriter reads: extract (the "
                       "judge's critiques of bad steps first, de-duplicated) or model (the "
                       "model condenses those into three sentences).", choices=SUMMARIES)

    def check(self, name) -> None:
        if self.rewrite == "random" and self.summary == "model":  # the model would pick
            raise RlanyError(f"{name('rewrite')} random is the control of the model's "
                             f"choice: it reads no summary ({name('summary')} extract)")
        if self.alpha_low >= self.alpha_high:
            raise RlanyError(f"need {name('alpha_low')} < {name('alpha_high')}, got "
                             f"{self.alpha_low} >= {self.alpha_high}")
        if self.exclude_edits and self.rewrite == "free":  # it would be silently unused
            raise RlanyError(f"{name('exclude_edits')} leaves edits out of the env's menu, "
                             f"and {name('rewrite')} free shows the model none")

    @property
    def sampling(self) -> Sampling:
        return Sampling(max_tokens=self.max_tokens, temperature=self.temperature)

    @property
    def decisions_path(self) -> str | None:
        if self.decisions is None and self.output != "-":
            return str(Path(self.output).with_name("decisions.jsonl"))
        return self.decisions


def direction_for(acc: float, opts: AdaptOptions) -> str | None:
    if acc >= opts.alpha_high:
        return "harder"
    if acc <= opts.alpha_low:
        return "easier"
    return None


def acceptance(direction: str, parent_acc: float, child_acc: float,
               opts: AdaptOptions) -> tuple[bool, str]:
    """The acceptance rule; returns (accepted, reason)."""
    if child_acc <= 0.0:
        return False, "acc(q') = 0: not proven solvable"
    if direction == "harder":
        if opts.alpha_low < child_acc < parent_acc:
            return True, f"harder: {opts.alpha_low} < {child_acc:.3f} < {parent_acc:.3f}"
        return False, (f"not harder within bounds: need {opts.alpha_low} < acc(q') < acc(q) = "
                       f"{parent_acc:.3f}, got {child_acc:.3f}")
    if parent_acc < child_acc < opts.alpha_high:
        return True, f"easier: {parent_acc:.3f} < {child_acc:.3f} < {opts.alpha_high}"
    return False, (f"not easier within bounds: need acc(q) = {parent_acc:.3f} < acc(q') < "
                   f"{opts.alpha_high}, got {child_acc:.3f}")


def decide(pool: list[Task], pending: list[Task], stats: dict[str, TaskStats],
           opts: AdaptOptions) -> tuple[list[Task], list[dict]]:
    """Accept or reject rolled-out candidates; return the next pool and the decisions. A
    parent takes at most one candidate an iteration (with `--descend` it can have several):
    the first that passes, in the candidates' order; a later one that passes too is
    rejected as "parent replaced"."""
    index = {t.task_id: k for k, t in enumerate(pool)}
    new_pool = list(pool)
    decisions, replaced = [], {}
    for cand in pending:
        info = cand.extra.get("candidate", {})
        parent_id = cand.lineage.parent_id if cand.lineage else None
        record = {"task_id": cand.task_id, "parent_id": parent_id,
                  "direction": cand.lineage.direction if cand.lineage else None,
                  "iteration": opts.iteration}
        if parent_id not in index:
            decisions.append({**record, "accepted": False, "reason": "parent not in pool"})
            continue
        if cand.task_id not in stats:
            decisions.append({**record, "accepted": False, "reason": "candidate not rolled out"})
            continue
        parent_acc, source = ((stats[parent_id].acc, "rollout") if parent_id in stats
                              else (float(info.get("parent_acc", 0.0)), "proposal"))
        child_acc = stats[cand.task_id].acc
        ok, reason = acceptance(record["direction"], parent_acc, child_acc, opts)
        if ok and parent_id in replaced:
            ok, reason = False, f"parent replaced by {replaced[parent_id]} ({reason})"
        decisions.append({**record, "accepted": ok, "reason": reason, "parent_acc": parent_acc,
                          "parent_acc_from": source, "acc": child_acc})
        if ok:
            replaced[parent_id] = cand.task_id
            extra = {k: v for k, v in cand.extra.items() if k != "candidate"}
            new_pool[index[parent_id]] = replace(
                cand, extra=extra, lineage=replace(cand.lineage, accepted_iter=opts.iteration))
    return new_pool, decisions


def propose(pool: list[Task], stats: dict[str, TaskStats], critiques: dict[str, str],
            engine: Engine, make_env: Callable[[str], Environment], opts: AdaptOptions,
            held: set[str] = frozenset()) -> tuple[list[Task], list[dict], dict]:
    """Rewrite tasks that are too easy or too hard; none into a held-out task (`held`: its
    specs as sorted JSON). Returns (candidates, rejections, tally); tally counts the
    proposals drawn, the valid ones (an edit number in range, or a free rewrite that parses
    and validates) and the tasks rewritten by each mode."""
    targets = [(t, direction_for(stats[t.task_id].acc, opts)) for t in pool if t.task_id in stats]
    targets = [(t, d) for t, d in targets if d]
    envs = {t.task_id: make_env(t.env) for t, _ in targets}
    descriptions, menus, broken = describe(targets, envs, opts)
    targets = [(t, d) for t, d in targets if t.task_id in descriptions]
    summaries = {t.task_id: critiques.get(t.task_id, "(no critiques)") for t, _ in targets}
    if opts.summary == "model":
        summaries = model_summaries(targets, envs, summaries, engine, opts.max_tokens,
                                    opts.adapter)
    requests = []
    for t, d in targets:
        description, acc = descriptions[t.task_id], stats[t.task_id].acc
        if t.task_id in menus:
            menu = menus[t.task_id] or [None]  # no edit offered: one request, rejected below
            requests.append(Request(
                messages=edit_messages(description, acc, d, summaries[t.task_id],
                                       [e.description for e in menu if e]),
                sampling=Sampling(n=opts.samples, max_tokens=8, temperature=opts.temperature,
                                  choices=edit_choices(len(menu))),
                adapter=opts.adapter))
        else:
            requests.append(Request(messages=rewrite_messages(
                description, t.spec, acc, d, summaries[t.task_id]),
                sampling=replace(opts.sampling, n=opts.samples), adapter=opts.adapter))
    asked = [(t, d, r) for (t, d), r in zip(targets, requests)
             if t.task_id not in menus or menus[t.task_id]]
    results = iter(engine.generate([r for *_, r in asked]) if asked else [])
    seen = [spec_key(t) for t in pool]
    candidates, rejections = [], broken
    tally = {"proposals": 0, "valid_proposals": 0, "edits_tasks": 0, "free_tasks": 0}
    for task, direction in targets:
        menu = menus.get(task.task_id)
        tally["edits_tasks" if menu is not None else "free_tasks"] += 1
        if menu == []:
            rejections.append({"task_id": task.task_id, "direction": direction,
                               "iteration": opts.iteration, "outputs": [],
                               "reasons": [f"the env offers no {direction} edit"]})
            continue
        result = next(results)
        reasons, found = [], None
        for completion in result.completions:
            tally["proposals"] += 1
            spec, edit, why = read_proposal(completion.text, menu, envs[task.task_id])
            if spec is None:
                reasons.append(why)
                continue
            tally["valid_proposals"] += 1
            if found is not None:
                continue
            flat = json.dumps(spec, sort_keys=True)
            why = duplicate(flat, menu is not None, seen, held, opts.dup_threshold)
            if why:
                reasons.append(why)
                continue
            found = spec
            candidates.append(candidate_task(task, spec, direction, stats[task.task_id].acc,
                                         summaries[task.task_id], opts.iteration, edit))
            seen.append(flat)
        if found is None:
            rejections.append({"task_id": task.task_id, "direction": direction,
                               "iteration": opts.iteration, "reasons": reasons,
                               "outputs": [clip(c.text, 600) for c in result.completions]})
    return candidates, rejections, tally


# -- the file driver: `rlany adapt-tasks` and the loop's adapt-tasks stage ---------------

def _read_stats(paths: dict, opts: AdaptOptions, task_ids: set[str]) -> dict[str, TaskStats]:
    """The stats, checked: of this pool (and its pending candidates) and from the rollout
    the judgments and trajectories come from (another pool's would otherwise change nothing,
    silently). A task none of whose episodes ran (the env failed each) has no accuracy: it
    is left out, not taken for a hard task."""
    from rlany.provenance import check_adapt_inputs, check_scored_from, judged_tasks
    from rlany.stageio import read_stats

    stats = read_stats(paths["--stats"], name=opts.stats, tasks=task_ids)
    check_adapt_inputs(paths["--stats"], paths["--judgments"], (opts.stats, opts.judgments))
    if opts.trajectories:
        check_scored_from(paths["--stats"], paths["--trajectories"],
                          (opts.stats, opts.trajectories))
    if opts.judgments:
        for task_id, where in judged_tasks(paths["--judgments"], opts.judgments).items():
            if task_id not in stats:
                raise RlanyError(f"judgments of task '{task_id}', which has no stats in "
                                 f"{opts.stats}: these judgments come from another rollout",
                                 where=where)
    return {k: s for k, s in stats.items() if s.extra.get("ran", 1) > 0}


def run(opts: AdaptOptions, engine: Engine | None = None) -> dict:
    """Accept/reject pending candidates, then propose new ones; write pool + candidates."""
    from rlany import envs
    from rlany.console import info
    from rlany.outputs import atomic_outputs, write_meta
    from rlany.provenance import check_answers_pool, sha256_file
    from rlany.stageio import (
        GEN_VERSIONS,
        check_adapter,
        check_fits,
        prepare_paths,
        read_tasks,
        start_engine,
    )

    started = time.time()
    if opts.critic == "env" and not opts.trajectories:
        raise UsageError("--critic env reads the episodes: give --trajectories")
    check_adapter(opts.adapter)
    check_fits(opts, opts.adapter)
    decisions_out = opts.decisions_path
    paths = prepare_paths(
        {"--input": opts.input, "--stats": opts.stats, "--judgments": opts.judgments,
         "--pending": opts.pending, "--trajectories": opts.trajectories,
         "--held-out": opts.held_out},
        {"--output": opts.output, "--candidates": opts.candidates,
         "--decisions": decisions_out})
    # every input fails before the engine starts
    pool, pool_reader = read_tasks(paths["--input"], name=opts.input)
    pending_tasks: list = []
    if opts.pending:
        pending_tasks, pending_reader = read_tasks(
            paths["--pending"], allow_empty=True, name=opts.pending,
            check=partial(check_candidate, pool_ids={t.task_id for t in pool}))
    check_answers_pool(pool + pending_tasks, paths["--stats"], paths["--judgments"],
                       (opts.stats, opts.judgments))
    stats = _read_stats(paths, opts, {t.task_id for t in pool + pending_tasks})
    inputs: list = [pool_reader, {"path": opts.stats, "sha256": sha256_file(paths["--stats"])}]
    if opts.pending:
        inputs.append(pending_reader)
    held_tasks, held_reader = read_tasks(paths["--held-out"], name=opts.held_out) \
        if opts.held_out else ([], None)
    inputs += [held_reader] if held_reader else []
    new_pool, decisions = decide(pool, pending_tasks, stats, opts)
    stones = stepping_stones(pending_tasks, decisions, new_pool, opts.descend)
    targets = {t.task_id for t in new_pool + stones
               if t.task_id in stats and direction_for(stats[t.task_id].acc, opts)}
    critiques = read_critiques(paths, targets, opts, stats)
    if opts.rewrite == "random":
        engine = RandomEdits(opts.seed, opts.iteration)  # no model: the control
    engine = engine or (start_engine(opts) if targets else None)
    candidates, rejections, tally = (
        propose(new_pool + stones, stats, critiques, engine, envs.make_env, opts,
                {spec_key(t) for t in held_tasks})
        if targets else ([], [], {}))
    candidates = [reparent(c, stones) for c in candidates]
    accepted = sum(d["accepted"] for d in decisions)
    # the three files commit together: a failure in any leaves all three as they were
    with atomic_outputs(opts.candidates, decisions_out, opts.output) as (cands, dec, out):
        cands.write_all(candidates)
        if dec:
            dec.write_all([{"kind": "decision", **d} for d in decisions] +
                          [{"kind": "rewrite_rejected", **r} for r in rejections])
        out.write_all(new_pool)
    counts = {"pool": len(new_pool), "pending": len(pending_tasks), "accepted": accepted,
              "rejected": len(decisions) - accepted, "targets": len(targets),
              "candidates": len(candidates), "rewrites_rejected": len(rejections), **tally,
              "stones": len(stones),
              **env_loop_counts(new_pool, decisions, candidates, envs.make_env)}
    flags = {**asdict(opts), "model": engine.model if engine else opts.model}
    for path in (opts.candidates, decisions_out, opts.output):  # the pool's meta last
        if path:
            write_meta(path, stage="adapt-tasks", flags=flags, inputs=inputs, counts=counts,
                       started=started, versions=GEN_VERSIONS)
    info(summary_line(counts, opts.output, time.time() - started))
    return counts

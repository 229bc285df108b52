"""`rlany adapt-tasks`: the environment learns too (RLAnything's task adaptation).

Two steps, both pure functions of records plus an engine:

1. `decide` (`adapt_decide`): last iteration's candidates, now rolled out, are accepted on
   evidence (the paper's rule, or `--acceptance learnability`); an accepted rewrite goes
   beside its original (at most `--rewrites-per-root`), or in its adapted parent's place.
2. `propose` (`adapt_propose`): the pool tasks the policy always or never solves are
   rewritten, from a summary of the critiques of their episodes, by the model's pick of the
   env's shuffled numbered edits (`--rewrite edits`), a random one (`random`), the one
   predicted nearest an even split (`learnability`, `edit_choice`), or a whole new spec
   (`free`); an adapted task's edits are made from its original.

This module holds the options and the file driver (`run`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from rlany.engines.base import Engine, Sampling
from rlany.envs.make import spec_key
from rlany.errors import RlanyError, UsageError
from rlany.files.records import TaskStats
from rlany.options import EngineFields, opt
from rlany.stages.adapt_decide import acceptance, decide, direction_for  # noqa: F401
from rlany.stages.adapt_metrics import env_loop_counts, summary_line
from rlany.stages.adapt_propose import propose, targets_of
from rlany.stages.critiques import read_critiques
from rlany.stages.edit_choice import choice_counts, tallies
from rlany.stages.rewrites import (
    RandomEdits,
    _names,
    check_candidate,
    reparent,
    stepping_stones,
)

REWRITES = ("auto", "edits", "free", "random", "learnability")
ACCEPTANCES = ("paper", "learnability")
OPT_IN_EDITS = ("goal kind",)  # the envs' opt-in kinds of edit (household)
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
    history: str | None = opt(None, "decisions.jsonl of earlier iterations, concatenated (a "
                              "loop passes them): what --rewrite learnability has measured "
                              "of each kind of edit.", scope="io")
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
    allow_edits: str | None = opt(None, "Not in the paper's reference code: also offer the "
                                  "env's opt-in edits named here (comma-separated; household: "
                                  "'goal kind', which changes the goal's kind).")
    rewrites_per_root: int = opt(1, "Accepted rewrites an original task may have in the pool "
                                 "beside it; an original with this many is not rewritten "
                                 "again (its rewrites are).", min=1)
    acceptance: str = opt("paper", "paper: the paper's rule (easier: acc(q) < acc(q') < "
                          "alpha_high; harder: alpha_low < acc(q') < acc(q)). learnability: "
                          "acc(q') from >= 8 rollouts inside (alpha_low, alpha_high) with "
                          "p(1-p) above its parent's.", choices=ACCEPTANCES)
    critiques: int = opt(3, "Critique snippets in a task's summary.", min=1)
    dup_threshold: float = opt(97.0, "rapidfuzz similarity (0-100) at which a rewrite "
                               "duplicates a pool task.", min=0, max=100)
    max_tokens: int = opt(384, "Max new tokens per free rewrite (and per model summary).",
                          min=1)
    temperature: float = opt(0.7, "Sampling temperature of the rewriter.", min=0)
    rewrite: str = opt("auto", "How a task is rewritten: edits (the model picks one of the "
                       "env's numbered edits, always valid), free (it writes a whole new JSON "
                       "spec, the paper's way), auto (edits where the env offers them, as all "
                       "built-in ones do, else free), random (a uniformly random edit, no "
                       "model: the control) or learnability (the edit whose kind's measured "
                       "success is nearest 0.5, no model). Each: docs/stages/adapt-tasks.md.",
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
        if self.rewrite in ("random", "learnability") and self.summary == "model":
            raise RlanyError(f"{name('rewrite')} {self.rewrite} chooses without a model: it "
                             f"reads no summary ({name('summary')} extract)")
        unknown = [n for n in _names(self.allow_edits) if n not in OPT_IN_EDITS]
        if unknown:
            raise RlanyError(f"{name('allow_edits')} names no opt-in edit: "
                             f"{', '.join(map(repr, unknown))} (known: "
                             f"{', '.join(map(repr, OPT_IN_EDITS))})")
        if self.history and self.rewrite != "learnability":  # it would be silently unused
            raise RlanyError(f"{name('history')} is what {name('rewrite')} learnability "
                             f"estimates from; {name('rewrite')} {self.rewrite} reads none")
        if self.alpha_low >= self.alpha_high:
            raise RlanyError(f"need {name('alpha_low')} < {name('alpha_high')}, got "
                             f"{self.alpha_low} >= {self.alpha_high}")
        for key in ("exclude_edits", "allow_edits"):  # it would be silently unused
            if getattr(self, key) and self.rewrite == "free":
                raise RlanyError(f"{name(key)} changes the env's menu of edits, and "
                                 f"{name('rewrite')} free shows the model none")

    @property
    def sampling(self) -> Sampling:
        return Sampling(max_tokens=self.max_tokens, temperature=self.temperature)

    @property
    def decisions_path(self) -> str | None:
        if self.decisions is None and self.output != "-":
            return str(Path(self.output).with_name("decisions.jsonl"))
        return self.decisions


# -- the file driver: `rlany adapt-tasks` and the loop's adapt-tasks stage ---------------

def _read_stats(paths: dict, opts: AdaptOptions, task_ids: set[str]) -> dict[str, TaskStats]:
    """The stats, checked: of this pool (and its pending candidates) and from the rollout
    the judgments and trajectories come from (another pool's would otherwise change nothing,
    silently). A task none of whose episodes ran (the env failed each) has no accuracy: it
    is left out, not taken for a hard task."""
    from rlany.files.provenance import check_adapt_inputs, check_scored_from, judged_tasks
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


def read_history(path: str, name: str) -> list[dict]:
    """The decisions of earlier iterations (`--history`): their decision records, each
    checked where `edit_choice.tallies` reads it (direction, acc in [0, 1], n a count)."""
    import math

    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError as e:
                raise RlanyError(f"invalid JSON: {e}", where=f"{name}:{lineno}") from None
            if not isinstance(d, dict) or d.get("kind") != "decision" or "acc" not in d:
                continue  # a rejected rewrite, or a candidate never rolled out
            acc, n = d["acc"], d.get("n", 1)
            if d.get("direction") not in ("easier", "harder") or isinstance(acc, bool) or \
                    not isinstance(acc, int | float) or not (math.isfinite(acc) and
                                                            0 <= acc <= 1) or \
                    isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise RlanyError("a decision needs direction easier|harder, acc in [0, 1] and "
                                 "n >= 1", where=f"{name}:{lineno}")
            out.append(d)
    return out


def _history(paths: dict, opts: AdaptOptions, inputs: list) -> list[dict]:
    """`--history`'s decisions (none without it), its file added to the sidecar's inputs."""
    from rlany.files.provenance import sha256_file

    if not opts.history:
        return []
    inputs.append({"path": opts.history, "sha256": sha256_file(paths["--history"])})
    return read_history(paths["--history"], opts.history)


def _rewriter(opts: AdaptOptions, engine: Engine | None, needed: bool) -> Engine | None:
    """What answers the menus: `--rewrite random`'s stand-in (no model: the control), none
    for `learnability` (it chooses without a model), else the engine, started if needed."""
    from rlany.stage_engine import start_engine

    if opts.rewrite == "random":
        return RandomEdits(opts.seed, opts.iteration)
    if opts.rewrite == "learnability":
        return None
    return engine or (start_engine(opts, "adapt-tasks") if needed else None)


def run(opts: AdaptOptions, engine: Engine | None = None) -> dict:
    """Accept/reject pending candidates, then propose new ones; write pool + candidates."""
    from rlany import envs
    from rlany.console import info
    from rlany.files.outputs import atomic_outputs, write_meta
    from rlany.files.provenance import check_answers_pool, sha256_file
    from rlany.stage_engine import GEN_VERSIONS, check_adapter, check_fits
    from rlany.stageio import prepare_paths, read_tasks

    started = time.time()
    if opts.critic == "env" and not opts.trajectories:
        raise UsageError("--critic env reads the episodes: give --trajectories")
    check_adapter(opts.adapter)
    check_fits(opts, opts.adapter)
    decisions_out = opts.decisions_path
    paths = prepare_paths(
        {"--input": opts.input, "--stats": opts.stats, "--judgments": opts.judgments,
         "--pending": opts.pending, "--trajectories": opts.trajectories,
         "--held-out": opts.held_out, "--history": opts.history},
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
    history = _history(paths, opts, inputs)
    new_pool, decisions = decide(pool, pending_tasks, stats, opts)
    stones = stepping_stones(pending_tasks, decisions, new_pool, opts.descend)
    targets = {t.task_id for t, _ in targets_of(new_pool + stones, stats, opts)}
    critiques = read_critiques(paths, targets, opts, stats)
    engine = _rewriter(opts, engine, bool(targets))
    candidates, rejections, tally = (
        propose(new_pool + stones, stats, critiques, engine, envs.make_env, opts,
                {spec_key(t) for t in held_tasks}, tallies(history + decisions))
        if targets else ([], [], {}))
    offered = tally.pop("offered", {})
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
              **env_loop_counts(new_pool, decisions, candidates, envs.make_env),
              **choice_counts(candidates, offered)}
    flags = {**asdict(opts), "model": engine.model if engine else opts.model}
    for path in (opts.candidates, decisions_out, opts.output):  # the pool's meta last
        if path:
            write_meta(path, stage="adapt-tasks", flags=flags, inputs=inputs, counts=counts,
                       started=started, versions=GEN_VERSIONS)
    info(summary_line(counts, opts.output, time.time() - started))
    return counts

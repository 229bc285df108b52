"""`adapt-tasks`' second step: new candidates for the pool tasks that are too easy or too hard.

For each target (`adapt_decide.direction_for`), the critiques of its episodes are summarized
(`critiques`), then the rewrite (`--rewrite`):
* edits (what `auto` picks where the env offers edits): the model sees the task, the
  summary and the env's numbered edits, shuffled per proposal (`edit_choice.shuffled`), and
  its answer is decoded as one of the numbers, so a small model's every proposal is valid.
* random: a uniformly random item of the same menu, no model (the control).
* learnability: the item whose predicted success is nearest 0.5 (`edit_choice`), no model.
* free: the model writes a whole new JSON spec (for strong models); it must parse and pass
  the env's `validate`.
An adapted task's edits are made from its original (the root, in the pool: originals stay),
so edits never stack; an original whose root already has `rewrites_per_root` rewrites in the
pool is not rewritten again (its rewrites are). A menu item identical to a pool task is left
out (it could only be rejected). A proposal must not duplicate a pool task or a candidate (a
free rewrite: not even nearly, rapidfuzz) nor a held-out task; `samples` proposals are drawn
and the first that passes is the candidate, recorded with its summary and the edit chosen
(kind, menu position, env rank). Rejections are recorded with their reason.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rlany.engines.base import Engine, Request, Sampling
from rlany.envs import Environment
from rlany.envs.make import spec_key
from rlany.files.records import Task, TaskStats
from rlany.prompts import clip, edit_choices, edit_messages, rewrite_messages
from rlany.stages.adapt_decide import direction_for, is_original, rewrites_of, root_of
from rlany.stages.critiques import model_summaries
from rlany.stages.edit_choice import learnability_result, shuffled
from rlany.stages.rewrites import candidate_task, describe, duplicate, read_proposal


def targets_of(pool: list[Task], stats: dict[str, TaskStats], opts: Any) -> list:
    """(task, direction) of the pool tasks to adapt: accuracy outside (alpha_low,
    alpha_high), an original only while its root has room for another rewrite."""
    placed = [t for t in pool if "candidate" not in t.extra]  # not --descend's stones
    out = [(t, direction_for(stats[t.task_id].acc, opts)) for t in pool if t.task_id in stats]
    return [(t, d) for t, d in out if d and not (
        is_original(t) and rewrites_of(placed, root_of(t)) >= opts.rewrites_per_root)]


def _source(task: Task, roots: dict[str, Task], env: Environment) -> Task:
    """The task an edit of `task` is made from: its original (the root) where the env makes
    edits from the root and the root is in the pool; else `task` itself (a `--descend`
    stone: its own rewrite is the point)."""
    if "candidate" in task.extra or not getattr(env, "edits_from_root", False):
        return task
    return roots.get(root_of(task), task)


def propose(pool: list[Task], stats: dict[str, TaskStats], critiques: dict[str, str],
            engine: Engine | None, make_env: Callable[[str], Environment], opts: Any,
            held: set[str] = frozenset(), seen_kinds: dict | None = None
            ) -> tuple[list[Task], list[dict], dict]:
    """Rewrite tasks that are too easy or too hard; none into a held-out task (`held`: its
    specs as sorted JSON). `seen_kinds`: what `--rewrite learnability` predicts from
    (`edit_choice.tallies`). Returns (candidates, rejections, tally); tally counts the
    proposals drawn, the valid ones (an edit number in range, or a free rewrite that parses
    and validates), the tasks rewritten by each mode and the menu items offered by kind."""
    targets = targets_of(pool, stats, opts)
    envs = {t.task_id: make_env(t.env) for t, _ in targets}
    roots = {t.task_id: t for t in pool if is_original(t)}
    sources = {t.task_id: _source(t, roots, envs[t.task_id]) for t, _ in targets}
    descriptions, menus, broken = describe(targets, envs, opts, sources,
                                           {spec_key(t) for t in pool})
    targets = [(t, d) for t, d in targets if t.task_id in descriptions]
    ranks = {}
    for t, _ in targets:
        if menus.get(t.task_id):
            menus[t.task_id], ranks[t.task_id] = shuffled(menus[t.task_id], opts.seed,
                                                          opts.iteration, t.task_id)
    summaries = {t.task_id: critiques.get(t.task_id, "(no critiques)") for t, _ in targets}
    if opts.summary == "model":
        summaries = model_summaries(targets, envs, summaries, engine, opts.max_tokens,
                                    opts.adapter)
    asked = [(t, d) for t, d in targets if t.task_id not in menus or menus[t.task_id]]
    results = iter(_answers(asked, descriptions, menus, summaries, stats, engine, opts,
                            seen_kinds or {}))
    seen = [spec_key(t) for t in pool]
    candidates, rejections = [], broken
    tally = {"proposals": 0, "valid_proposals": 0, "edits_tasks": 0, "free_tasks": 0}
    offered = Counter(e.kind_name for m in menus.values() for e in m)
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
            spec, pick, why = read_proposal(completion.text, menu, envs[task.task_id])
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
            source = sources[task.task_id] if menu is not None else task
            choice = {} if pick is None else {
                "edit": menu[pick].description, "edit_kind": menu[pick].kind_name,
                "menu_position": pick + 1, "menu_size": len(menu),
                "env_rank": ranks[task.task_id][pick], "made_from": source.task_id}
            candidates.append(candidate_task(
                task, spec, direction, stats[task.task_id].acc, summaries[task.task_id],
                opts.iteration, choice, source=source,
                taken={c.task_id for c in candidates} | {t.task_id for t in pool}))
            seen.append(flat)
        if found is None:
            rejections.append({"task_id": task.task_id, "direction": direction,
                               "iteration": opts.iteration, "reasons": reasons,
                               "outputs": [clip(c.text, 600) for c in result.completions]})
    return candidates, rejections, {**tally, "offered": offered}


def _answers(asked: list, descriptions: dict, menus: dict, summaries: dict, stats: dict,
             engine: Engine | None, opts: Any, seen_kinds: dict) -> list:
    """The rewriter's answers, one Result per asked target: the engine's (edits, random,
    free) or, for `--rewrite learnability`, the menu items nearest an even split."""
    if opts.rewrite == "learnability":
        chosen: Counter = Counter()
        return [learnability_result(menus[t.task_id], d, seen_kinds, opts.samples, chosen)
                for t, d in asked]
    requests = []
    for t, d in asked:
        description, acc = descriptions[t.task_id], stats[t.task_id].acc
        if t.task_id in menus:
            menu = menus[t.task_id]
            requests.append(Request(
                messages=edit_messages(description, acc, d, summaries[t.task_id],
                                       [e.description for e in menu]),
                sampling=Sampling(n=opts.samples, max_tokens=8, temperature=opts.temperature,
                                  choices=edit_choices(len(menu))),
                adapter=opts.adapter))
        else:
            requests.append(Request(messages=rewrite_messages(
                description, t.spec, acc, d, summaries[t.task_id]),
                sampling=replace(opts.sampling, n=opts.samples), adapter=opts.adapter))
    return engine.generate(requests) if requests else []

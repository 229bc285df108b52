"""`adapt-tasks`' first step: which pool tasks to adapt, and whether a rolled-out candidate
is accepted, and where an accepted one goes in the pool.

Targets: acc(q) >= alpha_high -> harder, acc(q) <= alpha_low -> easier.

Acceptance, `--acceptance paper` (the default: the paper's rule, DESIGN §4):
    harder: alpha_low < acc(q') < acc(q)
    easier: acc(q) < acc(q') < alpha_high
    always: acc(q') > 0   (at least one success proves q' solvable)
`--acceptance learnability` (not in the paper; PLR/SFL's learnability p(1-p)): the
candidate's success p, from at least LEARNABILITY_ROLLOUTS rollouts, lies inside
(alpha_low, alpha_high) and p(1-p) > acc(q)(1-acc(q)): it is nearer an even split, where
a group of rollouts has the most mixed outcomes to learn from.

acc(q) is the parent's accuracy in the same iteration when the parent was drawn again (same
policy), else its accuracy when the candidate was proposed: parents are measured by their
own draws, never forced into one.

Where an accepted q' goes: originals stay. A rewrite of an original goes BESIDE it (after
the original's family in the pool), at most `rewrites_per_root` rewrites per original; a
rewrite of an adapted task (made from the same original) takes that task's place. Lineage
keeps root, parent, version, direction and the iteration of acceptance. Every decision is
recorded with its reason, the candidate's edit kind and its rollouts (`--rewrite
learnability` estimates from them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlany.files.records import Task, TaskStats

LEARNABILITY_ROLLOUTS = 8  # rollouts a candidate's p needs under --acceptance learnability


def direction_for(acc: float, opts: Any) -> str | None:
    if acc >= opts.alpha_high:
        return "harder"
    if acc <= opts.alpha_low:
        return "easier"
    return None


def acceptance(direction: str, parent_acc: float, child_acc: float, opts: Any,
               n: int | None = None) -> tuple[bool, str]:
    """The acceptance rule (`opts.acceptance`: paper | learnability); returns (accepted,
    reason). `n`: the candidate's rollouts (learnability needs LEARNABILITY_ROLLOUTS)."""
    if child_acc <= 0.0:
        return False, "acc(q') = 0: not proven solvable"
    if getattr(opts, "acceptance", "paper") == "learnability":
        return _learnability(parent_acc, child_acc, opts, n)
    if direction == "harder":
        if opts.alpha_low < child_acc < parent_acc:
            return True, f"harder: {opts.alpha_low} < {child_acc:.3f} < {parent_acc:.3f}"
        return False, (f"not harder within bounds: need {opts.alpha_low} < acc(q') < acc(q) = "
                       f"{parent_acc:.3f}, got {child_acc:.3f}")
    if parent_acc < child_acc < opts.alpha_high:
        return True, f"easier: {parent_acc:.3f} < {child_acc:.3f} < {opts.alpha_high}"
    return False, (f"not easier within bounds: need acc(q) = {parent_acc:.3f} < acc(q') < "
                   f"{opts.alpha_high}, got {child_acc:.3f}")


def _learnability(parent_acc: float, p: float, opts: Any, n: int | None) -> tuple[bool, str]:
    if n is not None and n < LEARNABILITY_ROLLOUTS:
        return False, (f"too few rollouts: {n} < {LEARNABILITY_ROLLOUTS} to measure "
                       f"learnability")
    if not opts.alpha_low < p < opts.alpha_high:
        return False, (f"not learnable within bounds: need {opts.alpha_low} < acc(q') < "
                       f"{opts.alpha_high}, got {p:.3f}")
    mine, theirs = p * (1 - p), parent_acc * (1 - parent_acc)
    if mine > theirs:
        return True, f"learnability: p(1-p) {mine:.3f} > {theirs:.3f} of acc(q) {parent_acc:.3f}"
    return False, (f"not more learnable: p(1-p) {mine:.3f} <= {theirs:.3f} of acc(q) = "
                   f"{parent_acc:.3f}")


def is_original(task: Task) -> bool:
    """A task of the pool as made, not a rewrite (lineage version 0, or no lineage)."""
    return task.lineage is None or task.lineage.version == 0


def root_of(task: Task) -> str:
    return task.lineage.root_id if task.lineage else task.task_id


def rewrites_of(pool: list[Task], root_id: str) -> int:
    return sum(not is_original(t) and root_of(t) == root_id for t in pool)


def decide(pool: list[Task], pending: list[Task], stats: dict[str, TaskStats],
           opts: Any) -> tuple[list[Task], list[dict]]:
    """Accept or reject rolled-out candidates; return the next pool and the decisions. A
    parent takes at most one candidate an iteration (with `--descend` it can have several):
    the first that passes, in the candidates' order; a later one that passes too is
    rejected as "parent replaced". A rewrite of an original whose original already has
    `rewrites_per_root` rewrites in the pool is rejected as "root full"."""
    by_id = {t.task_id: t for t in pool}
    new_pool = list(pool)
    decisions, replaced = [], {}
    for cand in pending:
        info = cand.extra.get("candidate", {})
        parent_id = cand.lineage.parent_id if cand.lineage else None
        record = {"task_id": cand.task_id, "parent_id": parent_id,
                  "direction": cand.lineage.direction if cand.lineage else None,
                  "iteration": opts.iteration,
                  **({"edit_kind": info["edit_kind"]} if "edit_kind" in info else {})}
        if parent_id not in by_id:
            decisions.append({**record, "accepted": False, "reason": "parent not in pool"})
            continue
        if cand.task_id not in stats:
            decisions.append({**record, "accepted": False, "reason": "candidate not rolled out"})
            continue
        parent_acc, source = ((stats[parent_id].acc, "rollout") if parent_id in stats
                              else (float(info.get("parent_acc", 0.0)), "proposal"))
        child = stats[cand.task_id]
        ok, reason = acceptance(record["direction"], parent_acc, child.acc, opts, child.n)
        parent = by_id[parent_id]
        if ok and parent_id in replaced:
            ok, reason = False, f"parent replaced by {replaced[parent_id]} ({reason})"
        elif ok and is_original(parent) and rewrites_of(new_pool, parent_id) >= \
                opts.rewrites_per_root:
            ok, reason = False, (f"root full: {parent_id} has {opts.rewrites_per_root} "
                                 f"rewrite(s) in the pool ({reason})")
        decisions.append({**record, "accepted": ok, "reason": reason, "parent_acc": parent_acc,
                          "parent_acc_from": source, "acc": child.acc, "n": child.n})
        if ok:
            replaced[parent_id] = cand.task_id
            extra = {k: v for k, v in cand.extra.items() if k != "candidate"}
            task = replace(cand, extra=extra,
                           lineage=replace(cand.lineage, accepted_iter=opts.iteration))
            new_pool = _placed(new_pool, parent, task)
    return new_pool, decisions


def _placed(pool: list[Task], parent: Task, task: Task) -> list[Task]:
    """The pool with `task` beside its original `parent` (after the original's family), or
    in its adapted `parent`'s place."""
    ids = [t.task_id for t in pool]
    if not is_original(parent):
        k = ids.index(parent.task_id)
        return pool[:k] + [task] + pool[k + 1:]
    root = root_of(parent)
    last = max(k for k, t in enumerate(pool) if t.task_id == parent.task_id or
               (not is_original(t) and root_of(t) == root))
    return pool[:last + 1] + [task] + pool[last + 1:]

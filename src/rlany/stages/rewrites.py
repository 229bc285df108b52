"""What adapt-tasks makes of the rewriter's answers: a proposal read as one of the env's
numbered edits or as a whole new JSON spec (`parse_spec`, then the env's `validate`), and
the candidate task it becomes, with its lineage and why it was proposed, and the check
of a candidate as it comes back to be decided (`check_candidate`). The rules (which
tasks are rewritten, the acceptance rule) are in `rlany.stages.adapt_tasks`."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from rlany.envs import Environment, OffersEdits, offered_edits
from rlany.errors import RlanyError
from rlany.files.records import Lineage, Task
from rlany.prompts import clip

_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


def parse_spec(text: str) -> dict | None:
    """The JSON object in the rewriter's answer: a fenced block, else the last {...}."""
    candidates = _FENCE.findall(text)
    if not candidates:
        depth, start = 0, None
        for k, ch in enumerate(text):
            if ch == "{":
                if depth == 0:
                    start = k
                depth += 1
            elif ch == "}" and depth:
                depth -= 1
                if depth == 0 and start is not None:
                    candidates.append(text[start:k + 1])
    for raw in reversed(candidates):
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def read_proposal(text: str, menu: list | None, env: Environment
                  ) -> tuple[dict | None, int | None, str]:
    """(spec, the edit's index in the menu, why not): an edit number from the menu, or a
    free rewrite (index None)."""
    if menu is not None:
        k = text.strip()
        if not k.isdigit() or not 1 <= int(k) <= len(menu):
            return None, None, f"not one of the {len(menu)} edits: {clip(text, 40)!r}"
        return menu[int(k) - 1].spec, int(k) - 1, ""
    spec = parse_spec(text)
    if spec is None:
        return None, None, "no JSON object in the rewrite"
    problems = env.validate(spec)
    if problems:
        return None, None, "invalid spec: " + "; ".join(problems)
    return spec, None, ""


def duplicate(flat: str, edit: bool, seen: list[str], held: set[str],
              threshold: float) -> str | None:
    """Why a proposal (`flat`: its spec as sorted JSON) is a duplicate, or None: of a pool
    task or candidate (`seen`), or of a held-out task (`held`: adapting into the eval set
    would train on it). An edit is small by design (and differs from its task): only an
    identical spec is one; a free rewrite that barely changed the spec is one too."""
    from rapidfuzz import fuzz

    for specs, what in ((held, "a held-out task"), (seen, "a pool task or candidate")):
        best = 100.0 * (flat in specs) if edit else max(
            (fuzz.ratio(flat, s) for s in specs), default=0.0)
        if best >= threshold:
            return f"near-duplicate of {what} ({best:.0f})"
    return None


def candidate_task(parent: Task, spec: dict, direction: str, parent_acc: float,
                   critique: str, iteration: int, choice: dict | None = None,
                   source: Task | None = None, taken: set[str] = frozenset()) -> Task:
    """The candidate q' of `parent`, made from `source` (its original, or `parent` itself):
    one version past the source in the root's lineage, an id no task in `taken` has, with
    what `decide` reads next iteration (the parent's accuracy now) and why it was proposed
    (`choice`: the edit chosen, its kind, menu position and env rank)."""
    lineage = parent.lineage or Lineage(root_id=parent.task_id)
    made = source or parent
    version = (made.lineage.version if made.lineage else 0) + 1
    task_id, k = f"{lineage.root_id}.v{version}.i{iteration}", 1
    while task_id in taken:
        k += 1
        task_id = f"{lineage.root_id}.v{version}.i{iteration}.{k}"
    return Task(task_id=task_id, env=parent.env, spec=spec, prompt=parent.prompt,
                split=parent.split,
                lineage=Lineage(root_id=lineage.root_id, parent_id=parent.task_id,
                                version=version, direction=direction),
                extra={**parent.extra, "candidate": {"parent_acc": parent_acc,
                                                     "proposed_iter": iteration,
                                                     "critique": critique, **(choice or {})}})


class RandomEdits:
    """`adapt-tasks --rewrite random`: an engine stand-in that answers every edit menu with
    a uniformly random one of its numbers, no model: the control the model's choice of edit
    is measured against. Seeded by the run's seed and the iteration, so a rerun repeats it."""

    name = "random"
    model = "random"

    def __init__(self, seed: int, iteration: int) -> None:
        import random

        from rlany.engines.base import EngineStats

        self.rng = random.Random(f"adapt-random-{seed}-{iteration}")
        self.stats = EngineStats()

    def generate(self, requests):
        from rlany.engines.base import Completion, Result

        out = []
        for r in requests:
            choices = r.sampling.choices or ("1",)  # a free rewrite has no menu: rejected
            out.append(Result(prompt_token_ids=[], completions=[
                Completion(text=self.rng.choice(choices), token_ids=[], finish_reason="stop")
                for _ in range(r.sampling.n)]))
        return out

    def close(self) -> None:
        pass


def stepping_stones(pending: list[Task], decisions: list[dict], pool: list[Task],
                    depth: int) -> list[Task]:
    """`adapt-tasks --descend K` (not in the paper): easier candidates rejected as unsolved
    whose parent is still in the pool, unchanged, and still unsolved there, at most K stones
    deep. Their own easier rewrites become the parent's next candidates, so the easier
    direction can cross rewrites that are easier yet still unsolved."""
    if depth <= 0:
        return []
    in_pool = {t.task_id for t in pool}
    unsolved = {d["task_id"] for d in decisions if not d["accepted"]
                and d.get("direction") == "easier" and d.get("acc") == 0.0
                and d.get("parent_acc") == 0.0 and d.get("parent_id") in in_pool}
    return [t for t in pending if t.task_id in unsolved
            and t.extra.get("candidate", {}).get("hops", 0) < depth]


def reparent(cand: Task, stones: list[Task]) -> Task:
    """A rewrite of a stepping stone becomes a candidate of the stone's own parent (the pool
    task the acceptance rule compares it with), one hop further; others pass unchanged."""
    from dataclasses import replace

    stone = next((s for s in stones if s.task_id == cand.lineage.parent_id), None)
    if stone is None:
        return cand
    was = stone.extra["candidate"]
    # the parent's accuracy when the stone was decided: 0 (`stepping_stones`' rule)
    info = {**cand.extra["candidate"], "parent_acc": 0.0,
            "via": stone.task_id, "hops": was.get("hops", 0) + 1}
    return replace(cand, lineage=replace(cand.lineage, parent_id=stone.lineage.parent_id),
                   extra={**cand.extra, "candidate": info})


def _names(exclude: str | None) -> tuple:
    return tuple(n.strip() for n in (exclude or "").split(",") if n.strip())


def kept_edits(menu: list, exclude: str | None, matched: set | None = None) -> list:
    """`adapt-tasks --exclude-edits` (not in the paper): the env's edits whose description
    starts with none of the comma-separated names ("goal kind" leaves out "goal kind:
    pick_and_place -> pick"), so a curriculum can be kept to the pool's kind of task. The
    names that left an edit out are added to `matched`."""
    names, matched = _names(exclude), set() if matched is None else matched
    kept = []
    for e in menu:
        hits = [n for n in names if e.description.startswith(n)]
        matched.update(hits)
        if not hits:
            kept.append(e)
    return kept


def warn_unmatched(exclude: str | None, matched: set, menus: int) -> None:
    """Says which --exclude-edits names left out no edit of any of this stage's menus (a
    typo, most likely: the run would otherwise go on with the whole menu, silently)."""
    unmatched = [n for n in _names(exclude) if n not in matched]
    if menus and unmatched:
        from rlany.console import info

        info(f"adapt-tasks: --exclude-edits {', '.join(map(repr, unmatched))} left out no "
             f"edit of {menus} task(s)' menus (an edit's description starts with its name)")


def describe(targets: list[tuple[Task, str]], envs: dict[str, Environment], opts: Any,
             sources: dict[str, Task] | None = None, pool_specs: set[str] = frozenset()
             ) -> tuple[dict[str, str], dict[str, list], list[dict]]:
    """(descriptions, menus, rejections) of adapt-tasks' targets (`opts`: its AdaptOptions):
    each task as its env describes it and, where edits are used, the env's menu of edits in
    the direction (empty: nothing to propose, rejected later), made from the target's
    `sources` entry where that is another task (its original), without the items identical
    to a pool task (`pool_specs`, sorted JSON). A spec its env cannot read is rejected with
    the reason, as rollout records a broken task instead of failing the batch."""
    import json

    descriptions: dict[str, str] = {}
    menus: dict[str, list] = {}
    broken: list[dict] = []
    matched: set = set()
    allow = _names(getattr(opts, "allow_edits", None))
    for t, d in targets:
        env, source = envs[t.task_id], (sources or {}).get(t.task_id, t)
        root = source.spec if source is not t else None
        try:
            descriptions[t.task_id] = env.describe(t)
            if opts.rewrite in ("edits", "random", "learnability") or (
                    opts.rewrite == "auto" and isinstance(env, OffersEdits)):
                menu = offered_edits(env, t.spec, d, root=root, allow=allow)
                menus[t.task_id] = [e for e in kept_edits(menu, opts.exclude_edits, matched)
                                    if json.dumps(e.spec, sort_keys=True) not in pool_specs]
        except Exception as e:  # whatever the env raises on a spec it cannot read
            descriptions.pop(t.task_id, None)
            broken.append({"task_id": t.task_id, "direction": d, "iteration": opts.iteration,
                           "outputs": [], "reasons": [f"the {t.env} env cannot read this "
                                                      f"task: {type(e).__name__}: {e}"]})
    warn_unmatched(opts.exclude_edits, matched, len(menus))
    return descriptions, menus, broken


def check_candidate(task: Task, pool_ids: set[str] = frozenset()) -> None:
    """A pending candidate as `decide` reads it (`read_tasks` names the line): an id no pool
    task has (their stats would be one), a lineage with a parent and a direction, and
    `candidate` metadata whose `parent_acc`, `hops` and `via`, when present, are a finite
    number, a count and a task id."""
    if task.lineage is None or not task.lineage.parent_id or \
            task.lineage.direction not in ("easier", "harder"):
        raise RlanyError("a candidate needs lineage.parent_id and lineage.direction "
                         "'easier' or 'harder'")
    info = task.extra.get("candidate", {})
    if not isinstance(info, dict):
        raise RlanyError("field 'candidate' must be an object")
    acc = info.get("parent_acc", 0.0)
    try:
        finite = not isinstance(acc, bool) and math.isfinite(acc)
    except (TypeError, OverflowError):  # not a number, or an integer beyond the float range
        finite = False
    if not finite:
        raise RlanyError("field 'candidate.parent_acc' must be a finite number")
    hops, via = info.get("hops", 0), info.get("via")  # --descend's stepping stones
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0 or \
            not isinstance(via, str | None):
        raise RlanyError("field 'candidate.hops' must be a count and 'candidate.via' a "
                         "task id")
    if task.task_id in pool_ids:
        raise RlanyError(f"candidate '{task.task_id}' has the id of a task in the pool")

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
   summarized (extractive: the judge texts of steps it scored -1 first, near-duplicates
   dropped, clipped) and handed to a rewriter model with the environment's description and
   editable JSON spec. The rewrite must parse as JSON, pass the environment's `validate`,
   and not be a near-duplicate (rapidfuzz) of a pool task; `samples` rewrites are drawn and
   the first that passes is the candidate. Rejections are recorded with their reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from rlany.engines import Engine, Request, Sampling
from rlany.envs import Environment
from rlany.prompts import clip, rewrite_messages
from rlany.records import Judgment, Lineage, Task, TaskStats


@dataclass(frozen=True)
class AdaptOptions:
    alpha_high: float = 0.8
    alpha_low: float = 0.2
    samples: int = 2  # rewrites drawn per task; the first valid one is kept
    critiques: int = 3  # critique snippets in a summary
    dup_threshold: float = 97.0  # rapidfuzz ratio at or above which a rewrite is a duplicate
    sampling: Sampling = Sampling(max_tokens=384, temperature=0.7)
    adapter: str | None = None
    iteration: int = 0
    seed: int = 0


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
    """Accept or reject rolled-out candidates; return the next pool and the decisions."""
    index = {t.task_id: k for k, t in enumerate(pool)}
    new_pool = list(pool)
    decisions = []
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
        parent_acc = (stats[parent_id].acc if parent_id in stats
                      else float(info.get("parent_acc", 0.0)))
        child_acc = stats[cand.task_id].acc
        ok, reason = acceptance(record["direction"], parent_acc, child_acc, opts)
        decisions.append({**record, "accepted": ok, "reason": reason,
                          "parent_acc": parent_acc, "acc": child_acc})
        if ok:
            extra = {k: v for k, v in cand.extra.items() if k != "candidate"}
            new_pool[index[parent_id]] = replace(
                cand, extra=extra, lineage=replace(cand.lineage, accepted_iter=opts.iteration))
    return new_pool, decisions


def critique_summary(judgments: Iterable[Judgment], limit: int) -> str:
    """Extractive summary: critiques of steps judged bad first, near-duplicates dropped."""
    from rapidfuzz import fuzz

    bad, other = [], []
    for j in judgments:
        for step in j.steps:
            for s in step.samples:
                text = s.text.strip()
                if text:
                    (bad if s.score == -1 else other).append(text)
    chosen: list[str] = []
    for text in bad + other:
        if len(chosen) == limit:
            break
        if all(fuzz.ratio(text, c) < 90 for c in chosen):
            chosen.append(text)
    return "\n".join(f"- {clip(c, 400)}" for c in chosen) or "(no critiques)"


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


def propose(pool: list[Task], stats: dict[str, TaskStats], critiques: dict[str, str],
            engine: Engine, make_env: Callable[[str], Environment],
            opts: AdaptOptions) -> tuple[list[Task], list[dict]]:
    """Rewrite tasks that are too easy or too hard; return (candidates, rejections)."""
    from rapidfuzz import fuzz

    targets = [(t, direction_for(stats[t.task_id].acc, opts)) for t in pool if t.task_id in stats]
    targets = [(t, d) for t, d in targets if d]
    envs = {t.task_id: make_env(t.env) for t, _ in targets}
    requests = [Request(messages=rewrite_messages(
                    envs[t.task_id].describe(t), t.spec, stats[t.task_id].acc, d,
                    critiques.get(t.task_id, "(no critiques)")),
                    sampling=replace(opts.sampling, n=opts.samples), adapter=opts.adapter)
                for t, d in targets]
    results = engine.generate(requests) if requests else []
    seen = [json.dumps(t.spec, sort_keys=True) for t in pool]
    candidates, rejections = [], []
    for (task, direction), result in zip(targets, results):
        env = envs[task.task_id]
        reasons = []
        for completion in result.completions:
            spec = parse_spec(completion.text)
            if spec is None:
                reasons.append("no JSON object in the rewrite")
                continue
            problems = env.validate(spec)
            if problems:
                reasons.append("invalid spec: " + "; ".join(problems))
                continue
            flat = json.dumps(spec, sort_keys=True)
            best = max((fuzz.ratio(flat, s) for s in seen), default=0.0)
            if best >= opts.dup_threshold:
                reasons.append(f"near-duplicate of a pool task (similarity {best:.0f})")
                continue
            candidates.append(_candidate(task, spec, direction, stats[task.task_id].acc,
                                         critiques.get(task.task_id, ""), opts.iteration))
            seen.append(flat)
            break
        else:
            rejections.append({"task_id": task.task_id, "direction": direction,
                               "iteration": opts.iteration, "reasons": reasons,
                               "outputs": [clip(c.text, 600) for c in result.completions]})
    return candidates, rejections


def _candidate(parent: Task, spec: dict, direction: str, parent_acc: float, critique: str,
               iteration: int) -> Task:
    lineage = parent.lineage or Lineage(root_id=parent.task_id)
    version = lineage.version + 1
    return Task(task_id=f"{lineage.root_id}.v{version}.i{iteration}", env=parent.env,
                spec=spec, prompt=parent.prompt, split=parent.split,
                lineage=Lineage(root_id=lineage.root_id, parent_id=parent.task_id,
                                version=version, direction=direction),
                extra={**parent.extra, "candidate": {"parent_acc": parent_acc,
                                                     "proposed_iter": iteration,
                                                     "critique": critique}})

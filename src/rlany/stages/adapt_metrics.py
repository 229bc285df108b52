"""What the environment loop did in one `adapt-tasks` run, as numbers: the counts its
sidecar records (and the loop's metrics.jsonl and `rlany report` read), and its one-line
summary. Pure functions of the decisions, the candidates and the next pool."""

from __future__ import annotations

from collections.abc import Callable
from statistics import fmean

# a decision's reason, by its first words (`adapt_tasks.acceptance`, `decide`)
REASONS = {"acc(q') = 0": "unsolved", "not easier": "not_easier", "not harder": "not_harder",
           "parent not in pool": "parent_gone", "candidate not rolled out": "not_rolled_out",
           "parent replaced": "parent_replaced", "root full": "root_full",
           "too few rollouts": "too_few_rollouts", "not learnable": "not_learnable",
           "not more learnable": "not_more_learnable"}


def reason_key(reason: str) -> str:
    return next((k for start, k in REASONS.items() if reason.startswith(start)), "other")


def _mean(xs: list[float]) -> float | None:
    return round(fmean(xs), 4) if xs else None


def env_loop_counts(pool: list, decisions: list[dict], candidates: list,
                    make_env: Callable) -> dict:
    """Per iteration: accepted by direction, rejected by reason, success on the decided
    candidates against their parents (mean acc(q') and acc(q), all and accepted), the
    pool's difficulty (the env's `MeasuresDifficulty`, means over the pool), its lineage
    depth (mean and max version), its share and count of adapted tasks."""
    from rlany.envs import MeasuresDifficulty

    rejected: dict[str, int] = {}
    accepted = {"easier": 0, "harder": 0}
    for d in decisions:
        if d["accepted"]:
            accepted[d["direction"]] = accepted.get(d["direction"], 0) + 1
        else:
            key = reason_key(d["reason"])
            rejected[key] = rejected.get(key, 0) + 1
    rolled = [d for d in decisions if "acc" in d]
    won = [d for d in rolled if d["accepted"]]
    envs: dict[str, object] = {}
    measures: dict[str, list[float]] = {}
    for t in pool:
        env = envs.setdefault(t.env, make_env(t.env))
        if isinstance(env, MeasuresDifficulty):
            for k, v in env.difficulty(t.spec).items():
                measures.setdefault(k, []).append(v)
    depth = [t.lineage.version if t.lineage else 0 for t in pool]
    return {
        "proposed": {"easier": sum(c.lineage.direction == "easier" for c in candidates),
                     "harder": sum(c.lineage.direction == "harder" for c in candidates)},
        "accepted_by_direction": accepted, "rejected_by_reason": rejected,
        "candidate_acc": _mean([d["acc"] for d in rolled]),
        "candidate_parent_acc": _mean([d["parent_acc"] for d in rolled]),
        "accepted_acc": _mean([d["acc"] for d in won]),
        "accepted_parent_acc": _mean([d["parent_acc"] for d in won]),
        "difficulty": {k: _mean(v) for k, v in measures.items()},
        "lineage_depth_mean": _mean(depth), "lineage_depth_max": max(depth, default=0),
        "adapted_share": _mean([float(v > 0) for v in depth]),
        "pool_rewrites": sum(v > 0 for v in depth),
    }


def summary_line(counts: dict, output: str, seconds: float) -> str:
    """`adapt-tasks`' one line: decisions, rejections by reason, new candidates, the pool."""
    why = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in
                    sorted(counts.get("rejected_by_reason", {}).items()))
    acc = (f" (acc {counts['accepted_acc']:.2f} vs parents {counts['accepted_parent_acc']:.2f})"
           if counts.get("accepted_acc") is not None else "")
    valid = (f", {counts['valid_proposals']}/{counts['proposals']} proposals valid"
             if counts.get("proposals") else "")
    diff = ", ".join(f"{k} {v:.2f}" for k, v in counts.get("difficulty", {}).items()
                     if v is not None)
    proposed = counts.get("proposed", {})
    return (f"adapt-tasks: accepted {counts['accepted']} of {counts['pending']} candidates"
            f"{acc}{f'; rejected: {why}' if why else ''}; {counts['targets']} tasks to adapt"
            f" -> {counts['candidates']} new candidates ({proposed.get('easier', 0)} easier, "
            f"{proposed.get('harder', 0)} harder{valid}), {counts['rewrites_rejected']} "
            f"rewrites rejected; pool {counts['pool']} tasks, "
            f"{counts.get('adapted_share') or 0:.0%} adapted, depth max "
            f"{counts.get('lineage_depth_max', 0)}{f', {diff}' if diff else ''} -> {output} "
            f"({seconds:.1f}s)")

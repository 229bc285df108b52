"""eval.json from counts: the policy's and the judge's numbers from the task rows and the
counts every rate is a ratio of (`summary_of`), and the summary written with its sidecar
(`write_summary`). One home for an unsharded `rlany eval` (`rlany.stages.eval`) and for the
join of its shards (`rlany.stages.eval_join`), so both give the same numbers exactly.
"""

from __future__ import annotations

import json
from statistics import fmean

from rlany.stages.env_reward import mean_return
from rlany.stats import wilson_interval


def policy_summary(per_task: list[dict], sums: dict, ks: list[int]) -> dict:
    """The policy's numbers from its rows and counts (integer ratios, so shards' added
    counts give the unsharded numbers exactly; pass@k is the mean of the rows')."""
    n = sums["trajectories"]
    passes = {k: [p[f"pass@{k}"] for p in per_task if p[f"pass@{k}"] is not None] for k in ks}
    return {
        "tasks": len(per_task), "trajectories": n, "errored": sums["errored"],
        "success_rate": sums["successes"] / n if n else 0.0,
        "success_ci95": wilson_interval(sums["successes"], n),
        **{f"pass@{k}": fmean(passes[k]) if passes[k] else None for k in ks},
        "mean_steps": sums["steps"] / n if n else 0.0,
        "on_plan_share": (sums["on_plan_steps"] / sums["labelled_steps"]
                          if sums["labelled_steps"] else None),
        "mean_return": mean_return(per_task),
        "per_task": per_task,
    }


def judge_summary(s: dict) -> dict:
    """The judge metrics from `judge_sums`' counts (ratios; None where nothing to count)."""
    from rlany.stats import balanced_accuracy

    def ratio(a: str, b: str) -> float | None:
        return s[a] / s[b] if s[b] else None

    return {
        "judge_step_accuracy": balanced_accuracy({1: [s["good_verdicts"], s["good_correct"]],
                                                  -1: [s["bad_verdicts"], s["bad_correct"]]}),
        "judge_good_step_accuracy": ratio("good_correct", "good_verdicts"),
        "judge_bad_step_accuracy": ratio("bad_correct", "bad_verdicts"),
        "judge_good_steps": s["good_steps"], "judge_bad_steps": s["bad_steps"],
        "judge_last_step_accuracy": ratio("last_correct", "last_verdicts"),
        "judge_parse_fail_rate": ratio("unparseable", "verdicts"),
        "judge_outcome_agreement": ratio("agree", "judged"),
        "judge_labelled_verdicts": s["good_verdicts"] + s["bad_verdicts"],
    }


def summary_of(policy: dict, per_task: list[dict], sums: dict, ks: list[int],
               judge: dict | None) -> dict:
    """eval.json's numbers from the task rows and the counts (`sums`: policy, judge,
    unit_tests): one function for a run and for a join of shards."""
    summary = {"policy": policy, **policy_summary(per_task, sums["policy"], ks)}
    if judge is not None:
        summary["judge"] = judge
        summary.update(judge_summary(sums["judge"]))
        summary.update({f"judge_{k}": v for k, v in sums.get("unit_tests", {}).items()})
    return summary


def write_summary(summary: dict, output: str, ks: list[int], *, flags: dict, inputs: list,
           started: float, counts: dict) -> None:
    """eval.json (or stdout), its sidecar and the summary line."""
    from rlany.console import info
    from rlany.files.outputs import write_meta, write_text_atomic
    from rlany.stage_engine import GEN_VERSIONS

    text = json.dumps(summary, indent=2, allow_nan=False) + "\n"
    if output == "-":
        print(text, end="", flush=True)
    else:
        write_text_atomic(output, text)
    write_meta(output, stage="eval", flags=flags, inputs=inputs,
               counts={**{k: v for k, v in summary.items()
                          if k not in ("per_task", "shard", "sums")}, **counts},
               started=started, versions=GEN_VERSIONS)
    acc = summary.get("judge_step_accuracy")
    ci = summary["success_ci95"] or [0.0, 0.0]
    errors = summary["errored"]
    info(f"eval: success {summary['success_rate']:.3f} (95% {ci[0]:.2f}-{ci[1]:.2f}) over "
         f"{summary['trajectories']} "
         f"trajectories of {summary['tasks']} tasks"
         + (f" ({errors} more errored, not counted), " if errors else ", ")
         + ", ".join(f"pass@{k} " + ("-" if summary[f"pass@{k}"] is None else
                                     f"{summary[f'pass@{k}']:.3f}") for k in ks)
         + (f", judge step accuracy {acc:.3f}" if acc is not None else "")
         + (f", mean return {ret:.4g}" if (ret := summary.get("mean_return")) is not None
            else "")
         + f" -> {output} ({summary['wall_time_s']:.1f}s)")

"""The numbers of one finished loop iteration, read back from its sidecars (so they are
right after a resume too): `done.json` and `metrics.jsonl` are built from these."""

from __future__ import annotations

import json
from pathlib import Path

ENV_LOOP = ("pending", "rejected", "proposed", "accepted_by_direction", "rejected_by_reason",
            "candidate_acc", "candidate_parent_acc", "accepted_acc", "accepted_parent_acc",
            "difficulty", "lineage_depth_mean", "lineage_depth_max", "adapted_share", "stones",
            "pool_rewrites", "choice_by_kind", "choice_by_position", "choice_by_env_rank",
            "offered_by_kind")
# a metrics row's keys that measure time, not learning: two runs of the same records differ
# only in these
TIMED = ("seconds", "generation_seconds")


def collect_metrics(d: Path) -> dict:
    """The numbers of one finished iteration directory, read back from its sidecars."""
    def meta(name: str) -> dict:
        p = d / name
        return json.loads(p.read_text()).get("counts", {}) if p.exists() else {}

    def ckpt(kind: str) -> dict:
        p = d / kind / "rlany.json"
        return json.loads(p.read_text()).get("metrics", {}) if p.exists() else {}

    score, judge, adapt = meta("scored.meta.json"), meta("judgments.meta.json"), \
        meta("next_tasks.meta.json")
    evaluation = json.loads((d / "eval.json").read_text()) if (d / "eval.json").exists() else {}

    def seconds(name: str) -> float | None:  # from the sidecars: right after a resume too
        p = d / name
        return json.loads(p.read_text()).get("wall_time_s") if p.exists() else None

    stage_seconds = {"rollout": seconds("trajectories.meta.json"),
                     "judge": seconds("judgments.meta.json"),
                     "score": seconds("scored.meta.json"),
                     "train_policy": ckpt("policy").get("seconds"),
                     "train_rm": ckpt("rm").get("seconds"),
                     "adapt": seconds("next_tasks.meta.json"),
                     "eval": seconds("eval.meta.json")}
    generating = [meta("trajectories.meta.json"), meta("judgments.meta.json"), evaluation]
    generate = sum(c.get("generate_seconds") or 0.0 for c in generating)
    prefill = sum(c.get("prefill_seconds") or 0.0 for c in generating)
    return {
        "seconds": {k: round(v, 1) for k, v in stage_seconds.items() if v is not None},
        # where the generating stages' seconds went (prefill: the hf engine's prompt passes)
        "generation_seconds": {"prefill": round(prefill, 1),
                               "decode": round(generate - prefill, 1)},
        "train_acc": score.get("mean_acc"),
        "policy_samples": score.get("policy_samples"),
        "rm_samples": score.get("rm_samples"),
        "judge_parse_fail_rate": judge.get("parse_fail_rate"),
        "judge_outcome_agreement": score.get("judge_outcome_agreement"),
        "lam": score.get("lam"),  # lambda as scored: [score] lam
        # [score] step_credit = "gigpo": the share of steps whose anchor state another step
        # of the task's rollouts met too, and the steps per anchor group (rlany.stages.gigpo)
        "anchor_shared_share": score.get("anchor_shared_share"),
        "anchor_group_mean": score.get("anchor_group_mean"),
        # the judge on this iteration's rollouts: vs the env's step labels, and its +1 share
        "judge_label_accuracy": judge.get("label_accuracy"),
        "judge_positive_share": judge.get("positive_share"),
        "accepted_tasks": adapt.get("accepted"),
        "new_candidates": adapt.get("candidates"),
        # the environment loop (`adapt_metrics`): only when the run adapts
        **({"env_loop": {k: adapt.get(k) for k in ENV_LOOP}} if adapt else {}),
        "policy_loss": ckpt("policy").get("loss"),
        "policy_kl": ckpt("policy").get("kl"),
        "rm_loss": ckpt("rm").get("loss"),
        "eval_success": evaluation.get("success_rate"),
        "eval_success_ci95": evaluation.get("success_ci95"),
        "eval_episodes": evaluation.get("trajectories"),  # the rate's denominator
        "eval_on_plan_share": evaluation.get("on_plan_share"),
        "eval_pass": {k: v for k, v in evaluation.items() if k.startswith("pass@")},
        "eval_judge_step_accuracy": evaluation.get("judge_step_accuracy"),
        "eval_judge_parse_fail_rate": evaluation.get("judge_parse_fail_rate"),
    }


def write_metrics(run_dir: Path) -> None:
    """runs/NAME/metrics.jsonl: every finished iteration's done.json, one line each, in order."""
    from rlany.files.outputs import write_text_atomic
    from rlany.stages.report_read import ITERATION

    done = sorted((int(m[1]), p) for p in run_dir.glob("iter_*/done.json")
                  if (m := ITERATION.match(p.parent.name)))  # not a copied iter_003.old
    lines = [json.dumps(json.loads(p.read_text()), allow_nan=False) for _, p in done]
    write_text_atomic(run_dir / "metrics.jsonl", "".join(x + "\n" for x in lines))

"""`rlany train-rm`: update the generative reward model with consistency feedback
(`rlany score`'s R = O + lambda * mean(S) for the sampled estimator; the exact objectives'
target R is each scored step's `rm_target`, the trajectory's outcome O by default).

A judge of bare verdicts (`judge --max-tokens 0`) is trained on each judged step's verdict
token: the log-likelihood of the verdict that agrees with R (`--objective logloss`, the
default there) or its expected consistency reward computed exactly (`expected`); the math
is `rlany.training.verdict`'s. A reasoning judge is trained on each kept sample, PPO weighted
by its consistency advantage (`pg`). The file driver and the update are the shared
trainer's (`rlany.training`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rlany.console import info
from rlany.options import opt
from rlany.stages.train_policy import TrainOptions, or_skipped
from rlany.training.objectives import VERDICT_OBJECTIVES


@dataclass(frozen=True, kw_only=True)
class TrainRmOptions(TrainOptions):
    lr: float = opt(2e-5, "AdamW learning rate (the reward model's: not swept; full "
                    "fine-tuning wants ~1e-6).", min=0, min_exclusive=True)
    max_len: int = opt(1536, "Longest judge prompt+output in tokens; longer samples are "
                       "dropped whole (judge prompts are longer than the policy's).", min=2)
    objective: str = opt("auto", "expected / logloss (a judge run with --max-tokens 0): every "
                         "step with reward-model data once, the verdict's exact expected "
                         "consistency reward R*E[v] / the log-likelihood of the verdict that "
                         "agrees with R, on the verdict token alone. pg: PPO on each kept "
                         "sampled judge output (reasoning and verdict), weighted by its "
                         "consistency advantage (the reference implementation's estimator). "
                         "auto: logloss where the judge gave bare verdicts, else pg "
                         "(docs/stages/train-rm.md).",
                         choices=("auto", *VERDICT_OBJECTIVES, "pg"))
    balance: bool = opt(True, "expected / logloss: weigh the steps with R > 0 and those with "
                        "R < 0 equally in total, so a bias toward the common verdict cannot "
                        "meet the objective.")


def run(opts: TrainRmOptions, engine=None, say: Callable[[str], None] = info) -> dict:
    """Train the reward model on scored.jsonl; write the checkpoint. `engine`: the loop's,
    whose network is borrowed where it holds this base model (`rlany.training.driver`)."""
    from rlany.training.driver import run_trainer

    return or_skipped(opts, lambda: run_trainer(opts, _plan, say=say, engine=engine), say)


def _plan(opts: TrainRmOptions, path: Path):
    from rlany.files.records import Scored
    from rlany.training.driver import Plan

    if opts.objective == "auto":
        opts = replace(opts, objective=_auto_objective(path, opts.input))
    if opts.objective == "pg":
        from rlany.training.samples import rm_samples

        return opts, Plan(kind="rm", label="train-rm", records=(Scored, "scored"),
                          extract=rm_samples, objective="ppo",
                          hint="every step had zero advantage or keep=false; see task_stats")
    from rlany.prompts import VERDICT_CHOICES
    from rlany.training.verdict import tokenize_verdicts, verdict_samples

    return opts, Plan(
        kind="rm", label=f"train-rm ({opts.objective})", records=(Scored, "scored"),
        extract=lambda recs: verdict_samples(recs, VERDICT_CHOICES),
        objective=opts.objective,
        tokenize=lambda tok, raw, max_len: tokenize_verdicts(tok, raw, max_len, opts.balance),
        hint="no step has an rm_target: the tasks' accuracy was outside score's "
             "--rm-acc-min/--rm-acc-max, the judgments were skipped, or scored.jsonl comes "
             "from before rm_target (score it again)")


def _auto_objective(path, name: str) -> str:
    """--objective auto: "logloss" (rlany.training.verdict) where the steps with
    reward-model data were judged with bare verdicts (`judge --max-tokens 0`), else "pg"."""
    from rlany.files.jsonl import JsonlReader
    from rlany.files.records import Scored
    from rlany.prompts import VERDICT_CHOICES

    bare = None
    for _, record in JsonlReader(path, Scored, "scored", name=name):
        for step in record.steps:
            if step.rm_target is not None and step.judge:
                if any(j.text not in VERDICT_CHOICES for j in step.judge):
                    return "pg"
                bare = True
    return "logloss" if bare else "pg"

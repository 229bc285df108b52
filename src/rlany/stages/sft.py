"""`rlany sft`: warm-start the policy with supervised fine-tuning (the token mean negative
log-likelihood) on the steps of successful trajectories, e.g. the env's expert
demonstrations from `rollout --expert`. Writes a LoRA adapter that `rollout --adapter` and a
loop's `init_policy` use. The file driver and the update are the shared trainer's
(`rlany.training`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlany.console import info
from rlany.options import opt
from rlany.training.fields import TrainFields


@dataclass(frozen=True, kw_only=True)
class SftOptions(TrainFields):
    """sft: supervised warm start (token negative log-likelihood) on trajectories."""

    input: str = opt("-", "trajectories.jsonl, e.g. demonstrations from `rlany rollout "
                     "--expert`; - for stdin (the default).", scope="io", short="-i")
    lr: float = opt(3e-4, "AdamW learning rate (LoRA; full fine-tuning wants ~1e-6).",
                    min=0, min_exclusive=True)
    epochs: int = opt(2, "Passes over the samples.", min=1)
    micro_batch: int = opt(8, "Sequences per forward/backward.", min=1)
    grad_accum: int = opt(1, "Micro-batches per optimizer step (per process).", min=1)
    all_outcomes: bool = opt(False, "Train on every trajectory's steps (default: only "
                             "successful trajectories, outcome +1).")


def run(opts: SftOptions, engine=None, say: Callable[[str], None] = info) -> dict:
    """Fine-tune on trajectories.jsonl; write the checkpoint. `engine`: the loop's, whose
    network is borrowed where it holds this base model (`rlany.training.driver`)."""
    from rlany.training.driver import run_trainer

    return run_trainer(opts, _plan, say=say, engine=engine)


def _plan(opts: SftOptions, path: Path):
    from rlany.files.records import Trajectory
    from rlany.training.driver import Plan
    from rlany.training.samples import sft_samples

    return opts, Plan(kind="sft", label="sft", records=(Trajectory, "trajectories"),
                      extract=lambda recs: sft_samples(recs, opts.all_outcomes),
                      objective="nll",
                      hint="no trajectory succeeded" if not opts.all_outcomes else "no steps")

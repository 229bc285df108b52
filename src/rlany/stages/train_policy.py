"""`rlany train-policy`: PPO-clip with a k3 KL to a reference policy (the pre-update one
unless --kl-ref names a fixed one), on the kept scored steps (prompt messages -> the sampled
response tokens), each weighted by its step advantage.
Writes a LoRA adapter (or, with --full, a model directory) that `rollout --adapter` uses.

The options every trainer shares, the file driver and the update itself are the shared
trainer's (`rlany.training`); this module says what train-policy learns from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlany.console import info
from rlany.training.fields import PpoFields


@dataclass(frozen=True, kw_only=True)
class TrainOptions(PpoFields):
    """train-policy: PPO-clip with a k3 KL to a reference (--kl-ref)."""


def run(opts: TrainOptions, engine=None, say: Callable[[str], None] = info) -> dict:
    """Train the policy on scored.jsonl; write the checkpoint. `engine`: the loop's, whose
    network is borrowed where it holds this base model (`rlany.training.driver`)."""
    from rlany.training.driver import run_trainer

    return run_trainer(opts, _plan, say=say, engine=engine)


def _plan(opts: TrainOptions, path: Path):
    from rlany.records import Scored
    from rlany.training.driver import Plan
    from rlany.training.samples import policy_samples

    return opts, Plan(kind="policy", label="train-policy", records=(Scored, "scored"),
                      extract=policy_samples, objective="ppo",
                      hint="every step had zero advantage or keep=false; see task_stats")

"""`rlany train-policy`: PPO-clip with a k3 KL to a reference policy (the pre-update one
unless --kl-ref names a fixed one), on the kept scored steps (prompt messages -> the sampled
response tokens), each weighted by its step advantage.
Writes a LoRA adapter (or, with --full, a model directory) that `rollout --adapter` uses.

The options every trainer shares, the file driver and the update itself are the shared
trainer's (`rlany.training`); this module says what train-policy learns from.

Nothing to learn from (every advantage zero, every sample too long) fails with exit 1,
unless `--skipped FILE` is given: then it is an answer, told to a caller in another process
(the loop's `[launch] train`, a plan script) as FILE, `{"reason": ...}` written by the first
process, with exit 0 and no checkpoint; a launcher's exit code could not carry it.
train-rm shares the flag (`or_skipped`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlany.console import info
from rlany.options import opt
from rlany.training.fields import PpoFields


@dataclass(frozen=True, kw_only=True)
class TrainOptions(PpoFields):
    """train-policy: PPO-clip with a k3 KL to a reference (--kl-ref)."""

    skipped: str | None = opt(None, "With nothing to learn from (no kept sample): write this "
                              "JSON file ({\"reason\": ...}) and exit 0, no checkpoint, instead "
                              "of failing; `rlany loop` passes it, so that a trainer in "
                              "another process tells it the model stays as it was.",
                              scope="io")


def run(opts: TrainOptions, engine=None, say: Callable[[str], None] = info) -> dict:
    """Train the policy on scored.jsonl; write the checkpoint. `engine`: the loop's, whose
    network is borrowed where it holds this base model (`rlany.training.driver`)."""
    from rlany.training.driver import run_trainer

    return or_skipped(opts, lambda: run_trainer(opts, _plan, say=say, engine=engine), say)


def or_skipped(opts: TrainOptions, train: Callable[[], dict],
               say: Callable[[str], None]) -> dict:
    """`train()`, where nothing to learn from (`NoSamples`) is `--skipped`'s answer (module
    doc); without the flag it fails as before. Under a launcher every process gets here
    and the first writes the file (accelerate's view of the processes, as the trainer's:
    in one process without a launcher, that process)."""
    import json

    from rlany.errors import NoSamples
    from rlany.files.outputs import write_text_atomic

    try:
        return train()
    except NoSamples as e:
        if opts.skipped is None:
            raise
        from accelerate import PartialState

        if PartialState().is_main_process:
            write_text_atomic(opts.skipped,
                              json.dumps({"reason": e.message}, allow_nan=False) + "\n")
        say(f"nothing to train ({e.one_line()}): wrote {opts.skipped}; the model stays as "
            "it was")
        return {"skipped": e.message}


def _plan(opts: TrainOptions, path: Path):
    from rlany.files.records import Scored
    from rlany.training.driver import Plan
    from rlany.training.samples import policy_samples

    return opts, Plan(kind="policy", label="train-policy", records=(Scored, "scored"),
                      extract=policy_samples, objective="ppo",
                      hint="every step had zero advantage or keep=false; see task_stats")

"""The trainers' options: what every trainer shares (TrainFields) and PPO's own fields
(PpoFields). The commands' options classes (`rlany.stages.train_policy`, `train_rm`, `sft`)
build on these; the trainer reads them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlany import limits
from rlany.errors import RlanyError
from rlany.options import opt

OLD_LOGPROBS = ("auto", "generation", "recompute")  # where PPO's pre-update log-probs come from
LR_SCHEDULES = ("constant", "linear", "cosine")
KL_REFS = ("pre-update", "base")  # or a LoRA adapter directory; the loop also takes "init"


def lr_at(lr: float, schedule: str, step: int, steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based) of `steps`: a function of the step
    alone, so a resumed run needs no scheduler state. linear / cosine start at `lr` and
    reach lr/steps / about lr*(pi/steps)^2/4 at the last step, never 0 (every step moves)."""
    if schedule == "constant" or steps <= 1:
        return lr
    if schedule == "linear":
        return lr * (steps - step) / steps
    if schedule == "cosine":
        return lr * 0.5 * (1 + math.cos(math.pi * step / steps))
    raise RlanyError(f"unknown learning-rate schedule {schedule!r}")


@dataclass(frozen=True, kw_only=True)
class TrainFields:
    """What every trainer shares (train-policy, train-rm, sft): data, model, LoRA, optimizer,
    batching and resume. The objective's own fields are in the classes below."""

    input: str = opt("-", "scored.jsonl from `rlany score`; - for stdin (the default).",
                     scope="io", short="-i")
    output: str = opt(help="Checkpoint directory to write (a PEFT adapter, or a full model "
                      "with --full). It appears only when complete; a killed run resumes "
                      "from its last optimizer step.", scope="io", short="-o")
    model: str = opt("smollm2", "Base model: `smollm2`, a local HF directory, or a hub id.",
                     scope="run")
    adapter: str | None = opt(None, "Continue training this LoRA adapter (or, with --full, "
                              "this model directory).", scope="io")
    iteration: int = opt(0, "Loop iteration, recorded in rlany.json.", scope="io", min=0)
    seed: int = opt(0, "Seed of the LoRA init and the sample order.", scope="run", min=0,
                    max=limits.MAX_SEED)
    lr: float = opt(3e-4, "AdamW learning rate: 3e-4 for LoRA, ~1e-6 for full fine-tuning "
                    "(how each was chosen: train-policy's README). `rlany loop` "
                    "from a warm start trains at 1e-4 where its config gives none "
                    "(docs/stages/loop.md).",
                    min=0, min_exclusive=True)
    lr_schedule: str = opt("constant", "The learning rate over this run's optimizer steps: "
                           "constant, or decayed from --lr toward 0 by its last step (linear, "
                           "cosine), so the last few small, noisy batches cannot swing the "
                           "model (why: train-policy's README).",
                           choices=LR_SCHEDULES)
    epochs: int = opt(1, "Passes over the samples.", min=1)
    micro_batch: int = opt(4, "Sequences per forward/backward.", min=1)
    grad_accum: int = opt(2, "Micro-batches per optimizer step (per process).", min=1)
    max_grad_norm: float = opt(1.0, "Gradient clipping norm.", min=0, min_exclusive=True)
    weight_decay: float = opt(0.0, "AdamW weight decay.", min=0)
    max_len: int = opt(1024, "Longest prompt+response in tokens; longer samples are dropped "
                       "whole.", min=2)
    full: bool = opt(False, "Full fine-tuning instead of LoRA.")
    lora_r: int = opt(16, "LoRA rank.", min=1)
    lora_alpha: int = opt(32, "LoRA alpha.", min=1)
    lora_dropout: float = opt(0.0, "LoRA dropout.", min=0, max=1)
    lora_layers: int | None = opt(None, "LoRA on the model's top N layers only (default: every "
                                  "layer): the backward pass stops there, so a step costs "
                                  "little more than a forward. What judge_capacity.py's judges "
                                  "learned with (top 2).", min=1)
    target_modules: str = opt("all-linear", "LoRA target modules: all-linear or a comma list "
                              "such as q_proj,v_proj.")
    dtype: str = opt("auto", "Training dtype: auto (bf16 where the CPU or GPU has native bf16, "
                     "else float32), float32, bfloat16.",
                     choices=("auto", "float32", "bfloat16"))
    save_every: int = opt(1, "Save the resumable state every this many optimizer steps.", min=1)
    max_steps: int | None = opt(None, "Stop after this many optimizer steps.", min=1)
    batch_order: str = opt("shuffled", "Which samples meet in an optimizer step: shuffled "
                           "(a random permutation) or grouped (sorted by prompt, so a step "
                           "holds a task's rollouts and shares their prompt prefixes: less "
                           "compute with --share-prefix; the step order is still random) or "
                           "stratified (grouped within each class, the sign of a sample's "
                           "target or advantage, both classes in every step in their overall "
                           "proportion, as a shuffled step holds them on average).",
                           choices=("shuffled", "grouped", "stratified"))
    share_prefix: bool = opt(True, "Run each prefix that samples of a micro-batch share once "
                             "(the same loss and gradients, less compute; on a CPU with "
                             "sdpa or eager attention, else off: slower on a GPU). "
                             "--no-share-prefix runs the plain padded batch.")
    grad_checkpointing: bool = opt(False, "Recompute each layer's activations in the backward "
                                   "pass instead of keeping them (Hugging Face's gradient "
                                   "checkpointing): about a third more compute for a fraction "
                                   "of the memory, for long sequences (benchmarks/README.md, "
                                   "\"On a GPU\"). Turns --share-prefix off.")

    def check(self, name) -> None:
        if not self.target_modules.strip(" ,"):
            raise RlanyError(f"{name('target_modules')} is empty")


@dataclass(frozen=True, kw_only=True)
class PpoFields(TrainFields):
    """PPO-clip with a k3 KL to a reference policy (train-policy, train-rm's pg): the
    pre-update policy by default, or a fixed one (--kl-ref)."""

    clip_eps: float = opt(0.2, "PPO clip epsilon.", min=0)
    kl_beta: float = opt(0.01, "k3 KL weight against --kl-ref.", min=0)
    kl_ref: str = opt("pre-update", "The KL's reference policy: pre-update (the policy before "
                      "this update: the KL bounds one update's step), base (the base model, "
                      "its adapter off), or a LoRA adapter directory (e.g. a warm start): a "
                      "fixed anchor that every iteration's update is pulled back to. In a "
                      "loop config also init: the run's first policy (its warm start, else "
                      "the base model). LoRA only (not --full); one process or DDP.")
    old_logprobs: str = opt("auto", "PPO's pre-update log-probs: auto (the sampling engine's, "
                            "where every sample has them and they are exact), generation, or "
                            "recompute (an extra forward pass).",
                            choices=OLD_LOGPROBS)

    def check(self, name) -> None:
        super().check(name)
        if self.full and self.kl_ref != "pre-update":
            raise RlanyError(f"{name('kl_ref')} {self.kl_ref} needs a LoRA policy (the "
                             "reference is an adapter switched on the same network); with "
                             "--full use pre-update")

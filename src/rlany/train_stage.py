"""`rlany train-policy`, `rlany train-rm` and `rlany sft`: options classes on one shared base
(TrainFields), one file driver, three sample extractors. The update itself (PPO-clip with a
k3 KL, or the supervised NLL for sft; accumulation, resume, Accelerate) is `rlany.training`;
this module reads the records, picks the samples and writes the checkpoint.

train-policy: each kept scored step (prompt messages -> response) weighted by its advantage.
train-rm: each kept judge sample (judge prompt -> reasoning and verdict) weighted by its
consistency advantage. sft: each step of a successful trajectory (trajectories.jsonl), weight
1. All train the sampled token ids where the records carry them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from rlany.console import info
from rlany.errors import RlanyError
from rlany.options import opt
from rlany.training.fields import PpoFields, TrainFields


@dataclass(frozen=True, kw_only=True)
class TrainOptions(PpoFields):
    """train-policy: PPO-clip with a k3 KL to the pre-update policy."""


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
                         "auto: expected where the judge gave bare verdicts, else pg "
                         "(stages/train-rm/README.md).",
                         choices=("auto", "expected", "logloss", "pg"))
    balance: bool = opt(True, "expected / logloss: weigh the steps with R > 0 and those with "
                        "R < 0 equally in total, so a bias toward the common verdict cannot "
                        "meet the objective.")


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


KINDS = {"policy": TrainOptions, "rm": TrainRmOptions, "sft": SftOptions}


def run(opts: TrainFields, kind: str = "policy", say: Callable[[str], None] = info,
        engine=None) -> dict:
    """Train the policy ('policy', PPO), the reward model ('rm', PPO) or warm-start the
    policy on trajectories ('sft', negative log-likelihood); write the checkpoint.
    `engine` (the loop's): where it is an hf engine holding this base model in this
    precision, in one process, its network is borrowed instead of loading another copy."""
    from rlany.compat import resolve_dtype
    from rlany.jsonl import JsonlReader, write_text_atomic
    from rlany.models import resolve_model
    from rlany.records import Scored, Trajectory
    from rlany.stageio import (
        check_adapter,
        check_lora_targets,
        output_lock,
        prepare_paths,
        sha256_file,
    )
    from rlany.training.model import borrowed_model, load_model
    from rlany.training.samples import policy_samples, rm_samples, sft_samples, tokenize
    from rlany.training.trainer import train

    started = time.time()
    out = Path(opts.output)
    if (out / "rlany.json").exists():
        raise RlanyError("checkpoint already exists", where=opts.output,
                         hint="choose another --output or delete it")
    if out.exists():
        raise RlanyError("output exists and is not a finished checkpoint", where=opts.output)
    if opts.adapter and not opts.full:
        check_adapter(opts.adapter)
    path = prepare_paths({"--input": opts.input}, {"--output": opts.output})["--input"]
    if kind == "rm" and opts.objective == "auto":
        opts = replace(opts, objective=_auto_objective(path, opts.input))
    verdicts = kind == "rm" and opts.objective != "pg"
    if kind == "sft":
        records, label, hint = (Trajectory, "trajectories"), "sft", (
            "no trajectory succeeded" if not opts.all_outcomes else "no steps")
        extract: Callable = lambda recs: sft_samples(recs, opts.all_outcomes)  # noqa: E731
    elif verdicts:
        from rlany.prompts import VERDICT_CHOICES
        from rlany.training.verdict import verdict_samples
        records, label = (Scored, "scored"), f"train-rm ({opts.objective})"
        hint = ("no step has an rm_target: the tasks' accuracy was outside score's "
                "--rm-acc-min/--rm-acc-max, the judgments were skipped, or scored.jsonl "
                "comes from before rm_target (score it again)")
        extract = lambda recs: verdict_samples(recs, VERDICT_CHOICES)  # noqa: E731
    else:
        records, label = (Scored, "scored"), f"train-{kind}"
        hint = "every step had zero advantage or keep=false; see task_stats"
        extract = policy_samples if kind == "policy" else rm_samples
    kept, low, high = 0, None, None  # (token id, where): the extreme recorded token ids
    for where, record in JsonlReader(path, *records, name=opts.input):
        for sample in extract([record]):
            kept += 1
            if not sample.messages:
                raise RlanyError("a kept sample has no prompt messages", where=where)
            if getattr(sample, "token_ids", None):
                lo, hi = min(sample.token_ids), max(sample.token_ids)
                low = (lo, where) if low is None or lo < low[0] else low
                high = (hi, where) if high is None or hi > high[0] else high
    if not kept:  # before the model loads: nothing to learn is an answer, not a crash
        raise RlanyError("no training samples", where=opts.input, hint=hint)
    if low is not None and low[0] < 0:
        raise RlanyError(f"token id {low[0]} is negative", where=low[1])
    opts = replace(opts, dtype=resolve_dtype(opts.dtype))
    base = resolve_model(opts.model)
    if not opts.full and not opts.adapter:
        check_lora_targets(base, opts.target_modules)
    vocab = _vocab_size(opts.adapter if opts.full and opts.adapter else base)
    if high is not None and vocab is not None and high[0] >= vocab:
        raise RlanyError(f"token id {high[0]} is outside the model's vocabulary of {vocab}",
                         where=high[1], hint="token_ids must be sampled from this --model")
    # under torchrun/accelerate every process runs this; the first holds the lock for all
    lock = (output_lock(opts.output, new=True) if os.environ.get("RANK", "0") == "0"
            else nullcontext())
    shared = _can_borrow(engine, base, opts)
    # the model is loaded (or borrowed) once the lock is held
    with lock, (borrowed_model(engine, opts.adapter, opts) if shared else
                nullcontext(load_model(base, opts.adapter, opts))) as (net, tokenizer):
        reader = JsonlReader(path, *records, name=opts.input)
        if verdicts:
            from rlany.training.verdict import tokenize_verdicts
            samples, dropped = tokenize_verdicts(tokenizer, extract(s for _, s in reader),
                                                 opts.max_len, opts.balance)
        else:
            samples, dropped = tokenize(tokenizer, extract(s for _, s in reader), opts.max_len)
        if not samples:
            raise RlanyError(f"no training samples: all {dropped} longer than --max-len "
                             f"{opts.max_len}", where=opts.input)
        metrics_path = out.with_name(out.name + ".metrics.jsonl")
        lines: list[str] = []

        def log(record: dict) -> None:
            lines.append(json.dumps(record))
            write_text_atomic(metrics_path, "\n".join(lines) + "\n")
            if "loss" in record:
                ppo = (f" kl {record['kl']:.4f} clip {record['clip_frac']:.3f}"
                       if kind != "sft" and not verdicts else "")
                say(f"{label} step {record['step']}/{record['of']}: loss "
                    f"{record['loss']:+.4f}{ppo} grad {record['grad_norm']:.3f} "
                    f"{record['tokens_per_s']:.0f} tok/s")

        meta = {"kind": kind, "base_model": base, "init_adapter": opts.adapter,
                "iteration": opts.iteration, "data": opts.input,
                "data_sha256": sha256_file(path), "samples": len(samples),
                "dropped_too_long": dropped, "dtype": opts.dtype,
                "base_from": "engine" if shared else "disk"}
        where = ", on the engine's network (one copy in memory)" if shared else ""
        say(f"{label}: {len(samples)} samples ({dropped} dropped as longer than "
            f"{opts.max_len} tokens), {'full' if opts.full else 'LoRA'} on {base}, "
            f"{opts.dtype}{where}")
        summary = train(samples, net, tokenizer, opts, out, meta, log,
                        objective="nll" if kind == "sft" else
                        opts.objective if verdicts else "ppo")
    say(f"{label}: {summary['steps']} optimizer steps -> {opts.output} "
        f"({time.time() - started:.1f}s)")
    return summary


def _auto_objective(path, name: str) -> str:
    """train-rm --objective auto: "expected" (rlany.training.verdict) where the steps with
    reward-model data were judged with bare verdicts (`judge --max-tokens 0`), else "pg"."""
    from rlany.jsonl import JsonlReader
    from rlany.prompts import VERDICT_CHOICES
    from rlany.records import Scored

    bare = None
    for _, record in JsonlReader(path, Scored, "scored", name=name):
        for step in record.steps:
            if step.rm_target is not None and step.judge:
                if any(j.text not in VERDICT_CHOICES for j in step.judge):
                    return "pg"
                bare = True
    return "expected" if bare else "pg"


def _can_borrow(engine, base: str, opts: TrainFields) -> bool:
    """One model in memory: the engine's network serves as the trainer's when it is the
    hf engine's, of the same base model and precision, and training is one process."""
    return (engine is not None and getattr(engine, "name", None) == "hf" and not opts.full
            and int(os.environ.get("WORLD_SIZE", "1")) == 1
            and getattr(engine, "dtype", None) == opts.dtype
            and Path(getattr(engine, "model", "")).resolve() == Path(base).resolve())


def _vocab_size(path: str) -> int | None:
    """The model's vocabulary size from its config (no weights loaded), where it says."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return None  # loading the model reports what is wrong with it
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None)
    return size if isinstance(size, int) else None

"""The file driver every trainer shares (`train-policy`, `train-rm`, `sft`): read the
records, pick the samples, load (or borrow) the model, run the update (`trainer.train`) and
write the checkpoint. What differs between the three commands (the records read, the
samples taken, the objective) is a `Plan` each command's module makes from its options.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from rlany.console import info
from rlany.errors import NoSamples, RlanyError, UsageError
from rlany.training.fields import TrainFields


@dataclass(frozen=True)
class Plan:
    """What one trainer command learns from, and how."""

    kind: str  # rlany.json's kind: policy, rm or sft
    label: str  # the name on its progress lines
    records: tuple[type, str]  # the record class of the input and its name
    extract: Callable[[Iterable], Iterable]  # records -> raw samples
    hint: str  # why there may be no samples
    objective: str  # the trainer's objective: ppo, nll, expected or logloss
    # (tokenizer, raw samples, max_len) -> (samples, dropped); None: samples.tokenize
    tokenize: Callable | None = None


def run_trainer(opts: TrainFields, plan_for: Callable[[TrainFields, Path], tuple],
                say: Callable[[str], None] = info, engine=None) -> dict:
    """Check the output and the input, then train as `plan_for(opts, input path)` says (it
    returns the options, perhaps with a value resolved from the data, and the Plan); write
    the checkpoint. `engine` (the loop's): where it is an hf engine holding this base model
    in this precision, in one process, its network is borrowed instead of loading another
    copy. Nothing to learn from is `NoSamples`, raised before the model loads."""
    from rlany.compat import resolve_dtype
    from rlany.models import resolve_model
    from rlany.stage_engine import check_adapter, check_lora_targets
    from rlany.stageio import lock_path, output_lock, prepare_paths
    from rlany.training.state import side_dirs
    from rlany.training.world import check_world

    started = time.time()
    out = Path(opts.output)
    if (out / "rlany.json").exists():
        raise RlanyError("checkpoint already exists", where=opts.output,
                         hint="choose another --output or delete it")
    if out.exists():
        raise RlanyError("output exists and is not a finished checkpoint", where=opts.output)
    check_world()  # a launcher's processes, one group of the size asked for
    if opts.adapter and not opts.full:
        check_adapter(opts.adapter)
    check_kl_ref(getattr(opts, "kl_ref", "pre-update"))
    # every file it writes beside the checkpoint, checked as -o is: before the model loads
    sides = {"--output": [("metrics", metrics_file(out), False), *side_dirs(out),
                          ("lock", lock_path(out), False)]}
    path = prepare_paths({"--input": opts.input}, {"--output": opts.output}, sides)["--input"]
    opts, plan = plan_for(opts, path)
    high = _check_samples(path, opts, plan)
    opts = replace(opts, dtype=resolve_dtype(opts.dtype))
    base = resolve_model(opts.model)
    if not opts.full and not opts.adapter:
        check_lora_targets(base, opts.target_modules)
    _check_adapters_fit(opts, base)
    vocab = _vocab_size(opts.adapter if opts.full and opts.adapter else base)
    if high is not None and vocab is not None and high[0] >= vocab:
        raise RlanyError(f"token id {high[0]} is outside the model's vocabulary of {vocab}",
                         where=high[1], hint="token_ids must be sampled from this --model")
    # under torchrun/accelerate every process runs this; the first holds the lock for all
    lock = (output_lock(opts.output, new=True) if os.environ.get("RANK", "0") == "0"
            else nullcontext())
    with lock:
        summary = _train(opts, plan, path, base, engine, say)
    say(f"{plan.label}: {summary['steps']} optimizer steps -> {opts.output} "
        f"({time.time() - started:.1f}s)")
    return summary


def check_kl_ref(ref: str, name: str = "--kl-ref", in_loop: bool = False) -> None:
    """--kl-ref (a loop config's `kl_ref`, `name`): pre-update, base or a LoRA adapter
    directory; `init` only `in_loop`, which resolves it to the run's first policy before a
    trainer runs."""
    from rlany.stage_engine import check_adapter
    from rlany.training.fields import KL_REFS

    if ref == "init" and not in_loop:  # a flag's value that only a loop gives meaning to
        raise UsageError("--kl-ref init names a loop run's first policy; outside a loop "
                         "give pre-update, base or an adapter directory")
    if ref not in (*KL_REFS, "init"):
        check_adapter(ref, name)


def _check_adapters_fit(opts: TrainFields, base: str) -> None:
    """--adapter (a LoRA one) and a --kl-ref adapter fit the base model (`rlany.adapters`):
    another base model's adapter is one line here, not PEFT's state-dict error later."""
    from rlany.adapters import check_adapter_fits
    from rlany.training.fields import KL_REFS

    if opts.adapter and not opts.full:
        check_adapter_fits(opts.adapter, base)
    ref = getattr(opts, "kl_ref", "pre-update")
    if ref not in (*KL_REFS, "init"):
        check_adapter_fits(ref, base, "--kl-ref")


def _located(samples, where: str):
    """The samples an extract yields, its errors about the record (a verdict objective's
    step with reasoning, ...) located at the record's file:line."""
    try:
        yield from samples
    except RlanyError as e:
        if e.where is None:
            e.where = where
        raise


def _check_samples(path, opts: TrainFields, plan: Plan) -> tuple | None:
    """Read the input once before any model loads: each record once (`samples.once`), at
    least one sample, every one with a prompt, no negative token id. Returns the highest
    recorded token id and where it is."""
    from rlany.files.jsonl import JsonlReader
    from rlany.training.samples import engine_logprobs, once

    kept, low, high = 0, None, None  # (token id, where): the extreme recorded token ids
    other, missing = None, False  # a record another adapter sampled; a sample without
    for where, record in once(JsonlReader(path, *plan.records, name=opts.input)):
        if plan.kind == "policy":                              # engine log-probs
            other = other or _sampled_by_other(record, where, opts)
        for sample in _located(plan.extract([record]), where):
            kept += 1
            ids = getattr(sample, "token_ids", None)
            missing = missing or engine_logprobs(ids, getattr(sample, "logprobs", None)) is None
            if not sample.messages:
                raise RlanyError("a kept sample has no prompt messages", where=where)
            if ids:
                lo, hi = min(ids), max(ids)
                low = (lo, where) if low is None or lo < low[0] else low
                high = (hi, where) if high is None or hi > high[0] else high
    if other and (getattr(opts, "old_logprobs", "auto") == "generation" or not missing):
        raise other  # auto recomputes them all where one is missing: no refusal then
    if not kept:  # before the model loads: nothing to learn is an answer, not a crash
        raise NoSamples("no training samples", where=opts.input, hint=plan.hint)
    if low is not None and low[0] < 0:
        raise RlanyError(f"token id {low[0]} is negative", where=low[1])
    return high


def _sampled_by_other(record, where: str, opts: TrainFields) -> RlanyError | None:
    """PPO's pre-update log-probs taken from generation (`--old-logprobs` auto or
    generation) are the sampling policy's: a record carrying them must have been sampled
    by the adapter this training starts from, else the ratio and the KL would measure
    against another policy, silently. The refusal, where it was not; auto raises it only
    where every sample carries engine log-probs (else they are all recomputed). The base
    model is not compared: a served one is a name, not the path training loads."""
    if getattr(opts, "old_logprobs", "recompute") == "recompute" or not any(
            s.keep and s.logprobs for s in record.steps):
        return None
    sampled, start = (record.policy or {}).get("adapter"), opts.adapter
    here, there = (None if p is None else Path(p).resolve() for p in (sampled, start))
    if here == there:
        return None
    return RlanyError(f"sampled by adapter {sampled}, but training starts from {start}: its "
                      "engine log-probs are another policy's", where=where,
                      hint="train from the adapter that sampled it, or pass "
                      "--old-logprobs recompute")


def _train(opts: TrainFields, plan: Plan, path, base: str, engine, say) -> dict:
    """Load (or borrow) the model once the lock is held, tokenize, train, save."""
    from rlany.files.jsonl import JsonlReader
    from rlany.files.outputs import write_text_atomic
    from rlany.files.provenance import sha256_file
    from rlany.training.model import borrowed_model, load_model, master_fp32
    from rlany.training.samples import tokenize
    from rlany.training.trainer import train

    out = Path(opts.output)
    shared = _can_borrow(engine, base, opts)
    fp32_master = master_fp32(opts)
    with (borrowed_model(engine, opts.adapter, opts) if shared else
          nullcontext(load_model(base, opts.adapter, opts))) as (net, tokenizer):
        reader = JsonlReader(path, *plan.records, name=opts.input)
        samples, dropped = (plan.tokenize or tokenize)(
            tokenizer, plan.extract(s for _, s in reader), opts.max_len)
        if not samples:
            raise NoSamples(f"no training samples: all {dropped} longer than --max-len "
                            f"{opts.max_len}", where=opts.input)
        metrics_path = metrics_file(out)
        lines: list[str] = []

        def log(record: dict) -> None:
            lines.append(json.dumps(record, allow_nan=False))
            write_text_atomic(metrics_path, "\n".join(lines) + "\n")
            if "loss" in record:
                ppo = (f" kl {record['kl']:.4f} clip {record['clip_frac']:.3f}"
                       if plan.objective == "ppo" else "")
                say(f"{plan.label} step {record['step']}/{record['of']}: loss "
                    f"{record['loss']:+.4f}{ppo} grad {record['grad_norm']:.3f} "
                    f"{record['samples_per_s']:.2f} samples/s {record['tokens_per_s']:.0f} tok/s")

        meta = {"kind": plan.kind, "objective": plan.objective, "base_model": base,
                "init_adapter": opts.adapter,
                "iteration": opts.iteration, "data": opts.input,
                "data_sha256": sha256_file(path), "samples": len(samples),
                "dropped_too_long": dropped, "dtype": opts.dtype,
                "weights_dtype": "float32" if fp32_master else opts.dtype,
                "base_from": "engine" if shared else "disk"}
        where = ", on the engine's network (one copy in memory)" if shared else ""
        say(f"{plan.label}: {len(samples)} samples ({dropped} dropped as longer than "
            f"{opts.max_len} tokens), {'full' if opts.full else 'LoRA'} on {base}, "
            f"{opts.dtype}{' with fp32 master weights' if fp32_master else ''}{where}")
        return train(samples, net, tokenizer, opts, out, meta, log, objective=plan.objective)


def metrics_file(out: Path) -> Path:
    """`OUT.metrics.jsonl`: one line per optimizer step, rewritten whole after each."""
    return out.with_name(out.name + ".metrics.jsonl")


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

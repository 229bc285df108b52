"""The one training loop behind `train-policy`, `train-rm` and `sft` (no Trainer subclass).

A sample (`rlany.training.samples`: prompt token ids -> response token ids, advantage) is
trained with one of `rlany.training.objectives`: "ppo" (train-policy, train-rm's pg), "nll"
(sft) or a verdict objective (train-rm's expected / logloss); the object says what the forward
returns and turns a micro-batch into a loss.

The update (DESIGN §4, `rlany.training.losses`): PPO's pre-update log-probs are the sampling
engine's own with `old_logprobs` "generation" (or "auto" when every sample has them: the
caller vouches that the sampler was this model at this precision); else ("recompute") a
no-grad pass, except for the first optimizer step's samples, which take theirs from that
step's own forward. Then `epochs` passes of PPO-clip + k3 KL to that snapshot, or (with
`kl_ref` base or an adapter) to a fixed reference whose log-probs one no-grad pass reads
first, its adapter switched on the same network. Samples are
shuffled (seeded) into optimizer steps of `micro_batch * grad_accum * world` sequences;
each process takes its slice, sorted by length into micro-batches. A micro-batch's loss is
its summed per-sequence loss / (step size / world): with the backend's gradient average,
the exact mean over the step, scaled once.

Accelerate runs it: plain `python` on one device, `accelerate launch` on many (DDP, FSDP,
DeepSpeed config files in examples/accelerate/). Every process runs the same number of
forward and backward calls (FSDP and ZeRO-3 gather weights in each forward; DDP reduces in
each synced backward): a short slice is padded with a row whose loss mask is empty.

Resume: every `save_every` optimizer steps `Accelerator.save_state` (every process) writes
`OUT.partial/step-N/` and then `state.json` names it; a rerun of the same data continues
there. Final weights come from `Accelerator.get_state_dict` into a temp directory renamed
to OUT, so OUT is always complete. A non-finite loss or gradient norm stops with an error.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rlany.errors import RlanyError
from rlany.training.fields import lr_at
from rlany.training.objectives import MicroBatch, Objective
from rlany.training.objectives import objective as objective_named
from rlany.training.samples import Sample

if TYPE_CHECKING:  # the options (flags, loop keys, defaults) are defined once, there
    from rlany.training.fields import TrainFields


def plan_steps(samples: list[Sample], opts: TrainFields, world: int) -> list[list[int]]:
    """Sample indices of each optimizer step, over all epochs (seeded, deterministic).

    `shuffled`: every epoch a random permutation, cut into steps. `grouped`: the samples
    sorted by their prompt's tokens (so the n rollouts of a task, and a task's steps, lie
    side by side), cut into steps, and the steps' order shuffled every epoch: a step's
    samples share long prompt prefixes, which `rlany.shared_prefix` then runs once (on the
    learning config's household samples 565 forward tokens a step of 8 against 1,412
    shuffled). `stratified` (`_stratified`): grouped within each class, both classes in
    every step. Each step's loss is the same function either way; which samples meet in a
    step is what differs (as in TRL, whose batches hold a prompt's generations together)."""
    per_step = opts.micro_batch * opts.grad_accum * world
    rng = random.Random(opts.seed)
    steps = []
    if opts.batch_order in ("grouped", "stratified"):
        chunks = (_stratified(samples, per_step) if opts.batch_order == "stratified" else
                  _runs(sorted(range(len(samples)), key=lambda i: samples[i].prompt_ids),
                        per_step))
        for _ in range(opts.epochs):
            rng.shuffle(chunks)
            steps += [list(c) for c in chunks]
    else:
        for _ in range(opts.epochs):
            order = list(range(len(samples)))
            rng.shuffle(order)
            steps += _runs(order, per_step)
    if opts.max_steps is not None:
        steps = steps[:opts.max_steps]
    return steps


def _runs(order: list[int], per_step: int) -> list[list[int]]:
    return [order[i:i + per_step] for i in range(0, len(order), per_step)]


def _stratified(samples: list[Sample], per_step: int) -> list[list[int]]:
    """`stratified` steps: the samples split by class (the sign of the target where there
    is one, a verdict's; else of the advantage), each class sorted by prompt and cut into
    as many consecutive runs as there are steps, a step one run of each class. So a step
    holds both classes in their overall proportion, as a shuffled step does on average (a
    grouped step of one trajectory's steps, mostly one outcome, pushed train-rm's verdict
    bias: docs/stages/train-rm.md), and each run shares its prompts' prefixes as a grouped
    step's do."""
    def positive(s: Sample) -> bool:
        return (s.target if s.target is not None else s.advantage) > 0

    n = math.ceil(len(samples) / per_step)
    classes = [sorted((i for i, s in enumerate(samples) if positive(s) == side),
                      key=lambda i: samples[i].prompt_ids) for side in (True, False)]
    steps = [[i for c in classes for i in c[len(c) * j // n:len(c) * (j + 1) // n]]
             for j in range(n)]
    return [s for s in steps if s]  # a run of each class can round to nothing


def micro_batches(indices: list[int], samples: list[Sample], rank: int, world: int,
                  micro: int) -> list[list[int | None]]:
    """This process's slice of one optimizer step, sorted by length, cut into micro-batches.
    Every process gets ceil(len(indices) / world) entries: a short slice is padded with
    None (a row that must carry no loss), so all run the same number of micro-batches."""
    mine: list[int | None] = sorted(indices[rank::world], key=lambda i: samples[i].length)
    mine += [None] * (math.ceil(len(indices) / world) - len(mine))
    return [mine[i:i + micro] for i in range(0, len(mine), micro)]


def collate(batch: list[Sample], pad_id: int):
    """input_ids (B, L) right-padded, attention (B, L), response mask on targets (B, L-1)."""
    import torch

    width = max(s.length for s in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    resp = torch.zeros((len(batch), width - 1), dtype=torch.bool)
    for row, s in enumerate(batch):
        seq = s.prompt_ids + s.response_ids
        ids[row, :len(seq)] = torch.tensor(seq)
        attn[row, :len(seq)] = 1
        # target position t predicts token t+1: response tokens are targets
        # len(prompt)-1 .. len(seq)-2
        resp[row, len(s.prompt_ids) - 1:len(seq) - 1] = True
    adv = torch.tensor([s.advantage for s in batch], dtype=torch.float32)
    return ids, attn, resp, adv


def train(samples: list[Sample], model, tokenizer, opts: TrainFields, output: Path,
          meta: dict, log: Callable[[dict], None], objective: str = "ppo") -> dict:
    """Run the update and write the checkpoint to `output`. Returns summary metrics.
    `objective`: a name in `rlany.training.objectives.OBJECTIVES`."""
    import torch
    from accelerate import Accelerator

    from rlany.training import state
    from rlany.training.reference import old_logprobs_source, old_policy, reference

    started = time.perf_counter()
    acc = Accelerator()
    if acc.device.type == "cuda":  # this training's peak, not the process's (the loop's engine)
        torch.cuda.reset_peak_memory_stats(acc.device)
    torch.manual_seed(opts.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    steps = plan_steps(samples, opts, acc.num_processes)
    obj = objective_named(objective)
    source = (old_logprobs_source(samples, getattr(opts, "old_logprobs", "auto"))
              if obj.clips else None)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    model, optimizer = acc.prepare(model, optimizer)
    state.save_trainable_only(acc, model)
    forward, share = _forward_pass(acc, model, opts, meta, obj, pad)

    partial = output.with_name(output.name + ".partial")
    plan, update = state.plan_key(samples, steps), state.update_key(opts, meta)
    start_step = state.saved_step(partial, meta, plan, update)
    # before the saved weights load: a resumed run's old policy is the initial one
    old = old_policy(source, forward, model, samples, steps, acc, opts.micro_batch,
                     first_step_later=start_step == 0)
    # the KL's reference where a KL is computed (PPO, kl_beta > 0): pre-update or a fixed one
    kl_ref = (getattr(opts, "kl_ref", "pre-update")
              if obj.clips and opts.kl_beta > 0 else None)
    ref = reference(kl_ref or "pre-update", forward, model, samples, steps, acc,
                    opts.micro_batch)
    if start_step:
        state.load_state(acc, partial, start_step)
        if acc.is_main_process:
            log({"event": "resume", "step": start_step})
    model.train()
    summary = {"steps": len(steps), "samples": len(samples), "old_logprobs": source,
               "kl_ref": kl_ref,
               "samples_from_ids": sum(s.from_ids for s in samples),
               "samples_retokenized": sum(not s.from_ids for s in samples)}
    with recomputing(acc.unwrap_model(model), opts.grad_checkpointing):
        for step in range(start_step, len(steps)):
            t0 = time.perf_counter()
            numbers = _optimizer_step(acc, model, params, forward, samples,
                                      steps[step], old, opts, obj, ref)
            _check_finite(numbers, step, output)
            lr = lr_at(opts.lr, opts.lr_schedule, step, len(steps))
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            record = _step_record(numbers, step, steps, samples, lr, time.perf_counter() - t0)
            if acc.is_main_process:
                log(record)
            summary.update({k: record[k] for k in ("loss", "kl", "clip_frac", "grad_norm")})
            if (step + 1) % opts.save_every == 0 and step + 1 < len(steps):
                state.save_state(acc, partial, step + 1, meta, plan, update)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    summary["shared_prefix"] = share
    if acc.device.type == "cuda":  # since this training began, model and optimizer included
        summary["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated(acc.device)
                                               / 2**30, 2)
    _save(acc, model, tokenizer, output, partial,
          {**meta, "world_size": acc.num_processes, "metrics": summary,
           "options": asdict(opts)},
          [(s.prompt_ids, s.response_ids) for s in samples[:64]])
    acc.wait_for_everyone()
    return summary


@contextmanager
def recomputing(net, on: bool):
    """`--grad-checkpointing` for this update only: each layer recomputed in the backward
    (non-reentrant), and the network handed back as it came (the loop's trainers borrow
    the engine's). Non-reentrant checkpointing needs no gradient on the inputs, so Hugging
    Face's input hook is taken off at once (it would run the backward through the layers
    `--lora-layers` leaves frozen)."""
    if not on:
        yield
        return
    base = net.get_base_model() if hasattr(net, "get_base_model") else net
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise RlanyError(f"--grad-checkpointing: {type(base).__name__} does not support "
                         "gradient checkpointing", hint="leave it off")
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if getattr(base, "_require_grads_hook", None) is not None:
        base.disable_input_require_grads()
    try:
        yield
    finally:
        base.gradient_checkpointing_disable()


def _forward_pass(acc, model, opts: TrainFields, meta: dict, obj: Objective, pad: int):
    """(forward, share): the prepared model's forward of a micro-batch for `obj`, and
    whether it runs each shared prompt prefix once. Records the autocast, device and package
    versions in `meta`."""
    import torch

    from rlany.compat import accepts_logits_to_keep
    from rlany.files.outputs import package_versions
    from rlany.shared_prefix import shareable, shared_logprobs
    from rlany.training.model import TRAIN_VERSIONS, autocast_bf16
    from rlany.training.verdict import choice_logprobs

    keep = accepts_logits_to_keep(model)
    # not on a GPU: there the plain batch ran 2.5x faster (H200, SmolLM2-360M's shape, LoRA
    # and full; benchmarks/README.md "On a GPU"): a 4-D mask costs attention its fused kernels
    # nor with --grad-checkpointing: the shared prefix is a key-value cache it cannot recompute
    share = (opts.share_prefix and keep and acc.device.type != "cuda"
             and not opts.grad_checkpointing
             and shareable(acc.unwrap_model(model)))

    # full fine-tuning in bf16 (fp32 weights) and LoRA in bf16 on a GPU (fp32 adapters):
    # the forward under bf16 autocast (our own context, not Accelerate's mixed_precision:
    # that is fixed by the first Accelerator of a process, and one process may train
    # several times: the loop's stages, a test run)
    amp = autocast_bf16(opts, acc.device.type)
    meta.update(autocast="bfloat16" if amp else None, device=acc.device.type,
                versions=package_versions(*TRAIN_VERSIONS))

    def forward(batch: list[Sample]):
        with torch.autocast(acc.device.type, dtype=torch.bfloat16) if amp else nullcontext():
            return _forward(batch)

    def _forward(batch: list[Sample]):
        if obj.choices:  # log q(choice | prompt), (B, C)
            return choice_logprobs(model, [s.prompt_ids for s in batch],
                                   batch[0].choice_ids, pad, acc.device, share,
                                   one_pass=acc.num_processes > 1)
        if share:  # each shared prefix once (rlany.shared_prefix): the same numbers
            logp, resp = shared_logprobs(model, [s.prompt_ids + s.response_ids for s in batch],
                                         [len(s.prompt_ids) - 1 for s in batch], pad,
                                         acc.device, one_pass=acc.num_processes > 1)
            return logp, resp, torch.tensor([s.advantage for s in batch], device=acc.device)
        return response_logprobs(model, collate(batch, pad), acc.device, keep)

    return forward, share


def _step_record(numbers: dict, step: int, steps: list[list[int]], samples: list[Sample],
                 lr: float, seconds: float) -> dict:
    """The log record of optimizer step `step`: its numbers, learning rate and throughput."""
    held = sum(samples[i].length for i in steps[step])  # prompt and response, every token
    return {"step": step + 1, "of": len(steps),
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in numbers.items()},
            "lr": lr, "sample_tokens": held, "tokens_per_s": round(held / seconds, 1),
            "samples_per_s": round(len(steps[step]) / seconds, 3),
            "seconds": round(seconds, 3)}


def _check_finite(numbers: dict, step: int, output: Path) -> None:
    """A non-finite loss or gradient norm stops training before the optimizer steps."""
    if not math.isfinite(numbers["loss"]) or not math.isfinite(numbers["grad_norm"] or 0):
        raise RlanyError(f"non-finite loss ({numbers['loss']}) or gradient norm "
                         f"({numbers['grad_norm']}) at optimizer step {step + 1}",
                         where=str(output), hint="lower --lr or train in float32; "
                         "no checkpoint was written")


def _save(acc, model, tokenizer, output: Path, partial: Path, meta: dict,
          probes: list) -> None:
    """The checkpoint: every process gathers the weights (FSDP and ZeRO-3 shard them), the
    main process writes them with `meta` and the probe record (chosen among `probes`,
    training samples' (prompt ids, response ids)) and drops the partial state."""
    weights = acc.get_state_dict(model)
    if acc.is_main_process:
        from rlany.probe import record
        from rlany.training import state

        final = acc.unwrap_model(model)
        state.save_final(final, weights, tokenizer, output,
                         {**meta, "probe": record(final, tokenizer, probes)})
        shutil.rmtree(partial, ignore_errors=True)


def response_logprobs(model, batch, device, keep: bool = True):
    """(log-probs (B, K), response mask (B, K), advantages) of a collated batch. With `keep`,
    the LM head runs only where a response token is predicted (from the shortest prompt's
    last token on): over a long prompt it is most of the (B, T, vocab) logits and a quarter
    of the compute, and the log-probs are the same numbers."""
    from rlany.logprobs import token_logprobs

    ids, attn, resp, adv = (t.to(device) for t in batch)
    if not keep:
        return token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids), resp, adv
    start = int(resp.any(dim=0).float().argmax())  # the first column with a response target
    logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=ids.shape[1] - start).logits
    return token_logprobs(logits, ids[:, start:]), resp[:, start:], adv


def _optimizer_step(acc, model, params, forward, samples: list[Sample], group: list[int],
                    old: dict, opts: TrainFields, obj: Objective,
                    ref: dict | None = None) -> dict:
    """Forward and backward over this process's micro-batches of one optimizer step, then
    the gradient clip. Returns the step's numbers over all processes (the caller steps)."""
    import torch

    world = acc.num_processes
    batches = micro_batches(group, samples, acc.process_index, world, opts.micro_batch)
    shortest = min(group, key=lambda i: samples[i].length)
    sums = torch.zeros(5, dtype=torch.float64)  # objective, pg, kl, clipped, tokens
    for k, idx in enumerate(batches):
        last = k == len(batches) - 1
        acc.sync_gradients = last  # DeepSpeed steps its engine at the boundary only
        with nullcontext() if last else acc.no_sync(model):
            batch = [samples[shortest if i is None else i] for i in idx]
            parts = obj.loss(forward(batch), MicroBatch(batch, idx, old, ref or {}, opts,
                                                        len(group) / world))
            acc.backward(parts.loss)
        sums += torch.tensor([parts.objective, parts.pg, parts.kl, parts.clipped,
                              parts.tokens], dtype=torch.float64)
    grad_norm = acc.clip_grad_norm_(params, opts.max_grad_norm)  # None under DeepSpeed
    if world > 1:
        sums = acc.reduce(sums.to(acc.device), "sum").cpu()
    total, pg, kl, clipped, tokens = sums.tolist()
    n = len(group)
    return {"loss": total / n, "pg": pg / n, "kl": kl / n,
            "clip_frac": clipped / max(tokens, 1), "tokens": int(tokens),
            "grad_norm": None if grad_norm is None else float(grad_norm)}


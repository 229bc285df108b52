"""The one training loop behind `train-policy`, `train-rm` and `sft` (no Trainer subclass).

A sample is (chat messages -> response tokens, advantage): for `train-policy` each kept
scored step (prompt_messages -> response, the step's advantage), for `train-rm` each kept
judge sample (judge_messages -> the judge's output, its consistency advantage), for `sft`
each step of a successful trajectory (weight 1; `objective` "nll": the token mean negative
log-likelihood, no pre-update policy). The prompt
is rendered with the tokenizer's chat template (`rlany.chat.render`, as at generation); the
response is the **sampled token ids** of the record (older records without ids fall back
to tokenizing the text; both are counted). EOS closes a response only where generation
ended (policy: not `truncated`; judge: finish_reason not "length") and the sampled ids do
not already end with it. A sample longer than `max_len` is dropped whole.

The update (DESIGN §4, `rlany.losses`): PPO's pre-update log-probs are the sampling
engine's own with `old_logprobs` "generation" (or "auto" when every sample has them: the
caller vouches that the sampler was this model at this precision); else ("recompute") a
no-grad pass, except for the first optimizer step's samples, which take theirs from that
step's own forward. Then `epochs` passes of PPO-clip + k3 KL to that snapshot. Samples are
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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

from rlany.errors import RlanyError
from rlany.records import Scored, Trajectory

# the options (flags, loop keys, defaults) are defined once, in rlany.train_stage
from rlany.train_stage import TrainFields, TrainOptions  # noqa: E402
from rlany.verdict import OBJECTIVES as VERDICT_OBJECTIVES

OLD_LOGPROBS = ("auto", "recompute", "generation")
OBJECTIVES = ("ppo", "nll", *VERDICT_OBJECTIVES)


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    old_logprobs: list[float] | None = None  # the engine's log-prob of each response id
    from_ids: bool = False  # the response is the sampled ids (not a re-tokenized text)
    # verdict objectives (`rlany.verdict`): no response; the prompt ends at the branch
    target: float | None = None  # R_it, what the verdict must agree with
    choice_ids: list[int] | None = None  # the choices' branch tokens
    choice_values: list[float] | None = None  # their verdict scores

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


class RawSample(NamedTuple):
    messages: list[dict]
    response: str
    advantage: float
    ended: bool  # generation ended (EOS or a stop): an EOS closes the response
    token_ids: list[int] | None = None  # the sampled response ids, where recorded
    logprobs: list[float] | None = None  # the engine's log-probs of token_ids


def policy_samples(scored: Iterable[Scored]) -> Iterator[RawSample]:
    for traj in scored:
        for step in traj.steps:
            if step.keep:
                yield RawSample(step.prompt_messages, step.response, step.advantage,
                                not step.truncated, step.token_ids, step.logprobs)


def rm_samples(scored: Iterable[Scored]) -> Iterator[RawSample]:
    """Judge samples; an output cut at max_tokens (finish_reason "length") gets no EOS.
    Records from before finish_reason was kept (None) count as ended, as they were."""
    for traj in scored:
        for step in traj.steps:
            for sample in step.judge:
                if sample.keep and step.judge_messages:
                    yield RawSample(step.judge_messages, sample.text, sample.advantage,
                                    sample.finish_reason != "length", sample.token_ids)


def sft_samples(trajectories: Iterable[Trajectory], all_outcomes: bool = False
                ) -> Iterator[RawSample]:
    """Warm-start samples: every step of each successful trajectory (every trajectory with
    `all_outcomes`) with a prompt, weight 1; a step that raised in the env is skipped."""
    for traj in trajectories:
        if traj.outcome != 1 and not all_outcomes:
            continue
        for step in traj.steps:
            # an empty response (the expert had no plan from there) would teach stopping
            if step.prompt_messages and step.response and "error" not in step.info:
                yield RawSample(step.prompt_messages, step.response, 1.0,
                                step.finish_reason != "length", step.token_ids)


def tokenize(tokenizer, raw: Iterable[RawSample | tuple], max_len: int
             ) -> tuple[list[Sample], int]:
    """Token ids for each sample; over-long samples are dropped whole. Returns (kept, dropped)."""
    from rlany.chat import render

    eos = tokenizer.eos_token_id
    ends = set(tokenizer.all_special_ids)  # sampled ids that already close the response
    kept, dropped = [], 0
    for r in raw:
        r = RawSample(*r)
        prompt = render(tokenizer, r.messages)
        if r.token_ids is not None:
            resp = list(r.token_ids)
            logprobs = list(r.logprobs) if r.logprobs and len(r.logprobs) == len(resp) else None
        else:
            resp, logprobs = tokenizer(r.response, add_special_tokens=False)["input_ids"], None
        if r.ended and eos is not None and (not resp or resp[-1] not in ends):
            resp, logprobs = resp + [eos], None  # no engine log-prob for an unsampled EOS
        if not resp or len(prompt) + len(resp) > max_len:
            dropped += 1
            continue
        kept.append(Sample(prompt, resp, r.advantage, logprobs, r.token_ids is not None))
    return kept, dropped


def plan_steps(samples: list[Sample], opts: TrainFields, world: int) -> list[list[int]]:
    """Sample indices of each optimizer step, over all epochs (seeded, deterministic)."""
    per_step = opts.micro_batch * opts.grad_accum * world
    rng = random.Random(opts.seed)
    steps = []
    for _ in range(opts.epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        steps += [order[i:i + per_step] for i in range(0, len(order), per_step)]
    if opts.max_steps is not None:
        steps = steps[:opts.max_steps]
    return steps


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


def lora_config(opts: TrainFields, model=None):
    """The LoRA of `opts`; with `lora_layers` N, on the top N of `model`'s layers only."""
    from peft import LoraConfig

    targets = (opts.target_modules if opts.target_modules == "all-linear"
               else [t.strip() for t in opts.target_modules.split(",") if t.strip()])
    layers = None
    if getattr(opts, "lora_layers", None):
        total = model.config.num_hidden_layers
        layers = list(range(max(0, total - opts.lora_layers), total))
    return LoraConfig(r=opts.lora_r, lora_alpha=opts.lora_alpha, lora_dropout=opts.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM",
                      layers_to_transform=layers)


TRAINED = "default"  # the adapter being trained: PEFT saves "default" at the top level


@contextmanager
def borrowed_model(engine, adapter: str | None, opts: TrainFields):
    """The hf engine's own network as the trainer's model: the base weights in memory are
    shared, never copied or merged into. A trainable LoRA adapter (TRAINED: `adapter`'s
    weights, or a fresh one seeded as `load_model` seeds it) is added beside the adapters
    the engine serves, only its tensors train, and it is removed afterwards (the checkpoint
    on disk is what the engine loads next). Yields (model, tokenizer)."""
    import torch
    from peft import PeftModel, get_peft_model

    from rlany.compat import enable_cpu_masked_gqa
    enable_cpu_masked_gqa()

    net = engine.net
    serving = isinstance(net, PeftModel)  # the engine already holds adapters
    if not adapter:
        torch.manual_seed(opts.seed)
    if serving:
        if adapter:
            net.load_adapter(adapter, adapter_name=TRAINED, is_trainable=True)
        else:
            net.add_adapter(TRAINED, lora_config(opts, net))
        net.set_adapter(TRAINED)
        model = net
    elif adapter:
        model = PeftModel.from_pretrained(net, adapter, adapter_name=TRAINED, is_trainable=True)
    else:
        model = get_peft_model(net, lora_config(opts, net), adapter_name=TRAINED)
    for name, p in model.named_parameters():
        p.requires_grad_(f".{TRAINED}." in name and "lora_" in name)
    try:
        yield model, engine.tokenizer
    finally:
        if serving:
            net.set_adapter(next(a for a in net.peft_config if a != TRAINED))
            net.delete_adapter(TRAINED)
        else:  # the LoRA layers out again, the base untouched
            engine.net = model.unload()
        engine.net.eval()
        for p in engine.net.parameters():
            p.requires_grad_(False)


def load_model(base: str, adapter: str | None, opts: TrainFields):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlany.compat import enable_cpu_masked_gqa, resolve_dtype
    enable_cpu_masked_gqa()

    tokenizer = AutoTokenizer.from_pretrained(adapter if opts.full and adapter else base)
    model = AutoModelForCausalLM.from_pretrained(adapter if opts.full and adapter else base,
                                                 dtype=getattr(torch, resolve_dtype(opts.dtype)))
    if opts.full:
        return model, tokenizer
    from peft import PeftModel, get_peft_model

    if adapter:
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    else:
        torch.manual_seed(opts.seed)  # LoRA A is random-initialized: make it reproducible
        model = get_peft_model(model, lora_config(opts, model), adapter_name=TRAINED)
    return model, tokenizer


def train(samples: list[Sample], model, tokenizer, opts: TrainFields, output: Path,
          meta: dict, log: Callable[[dict], None], objective: str = "ppo") -> dict:
    """Run the update and write the checkpoint to `output`. Returns summary metrics.
    `objective`: "ppo" (clip against the pre-update log-probs), "nll" (supervised: the
    token mean negative log-likelihood of each response, weighted by its advantage), or a
    verdict objective, "expected" / "logloss" (`rlany.verdict`: the choice distribution at
    the prompt's end against each sample's target, weighted by its advantage)."""
    import torch
    from accelerate import Accelerator

    from rlany import train_state as state
    from rlany.compat import accepts_logits_to_keep
    from rlany.shared_prefix import shareable, shared_logprobs
    from rlany.verdict import choice_logprobs

    started = time.perf_counter()
    acc = Accelerator()
    torch.manual_seed(opts.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    steps = plan_steps(samples, opts, acc.num_processes)
    if objective not in OBJECTIVES:
        raise RlanyError(f"unknown training objective {objective!r}")
    source = (old_logprobs_source(samples, getattr(opts, "old_logprobs", "auto"))
              if objective == "ppo" else None)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    model, optimizer = acc.prepare(model, optimizer)
    state.save_trainable_only(acc, model)

    keep = accepts_logits_to_keep(model)
    share = opts.share_prefix and keep and shareable(acc.unwrap_model(model))

    def forward(batch: list[Sample]):
        if objective in VERDICT_OBJECTIVES:  # log q(choice | prompt), (B, C)
            return choice_logprobs(model, [s.prompt_ids for s in batch],
                                   batch[0].choice_ids, pad, acc.device, share)
        if share:  # each shared prefix once (rlany.shared_prefix): the same numbers
            logp, resp = shared_logprobs(model, [s.prompt_ids + s.response_ids for s in batch],
                                         [len(s.prompt_ids) - 1 for s in batch], pad,
                                         acc.device)
            return logp, resp, torch.tensor([s.advantage for s in batch], device=acc.device)
        return response_logprobs(model, collate(batch, pad), acc.device, keep)

    partial = output.with_name(output.name + ".partial")
    plan = state.plan_key(samples, steps)
    start_step = state.saved_step(partial, meta, plan)
    if source is None:
        old = {}  # supervised: no pre-update policy
    elif source == "generation":
        old = {i: torch.tensor(s.old_logprobs, dtype=torch.float32)
               for i, s in enumerate(samples)}
    else:  # before the saved weights load: a resumed run's old policy is the initial one
        model.eval()
        old = _pre_update_logprobs(forward, samples, steps, acc, opts.micro_batch,
                                   first_step_later=start_step == 0)
    if start_step:
        state.load_state(acc, partial, start_step)
        if acc.is_main_process:
            log({"event": "resume", "step": start_step})
    model.train()
    summary = {"steps": len(steps), "samples": len(samples), "old_logprobs": source,
               "samples_from_ids": sum(s.from_ids for s in samples),
               "samples_retokenized": sum(not s.from_ids for s in samples)}
    for step in range(start_step, len(steps)):
        t0 = time.perf_counter()
        numbers = _optimizer_step(acc, model, params, forward, samples,
                                  steps[step], old, opts, objective)
        if not math.isfinite(numbers["loss"]) or not math.isfinite(numbers["grad_norm"] or 0):
            raise RlanyError(f"non-finite loss ({numbers['loss']}) or gradient norm "
                             f"({numbers['grad_norm']}) at optimizer step {step + 1}",
                             where=str(output), hint="lower --lr or train in float32; "
                             "no checkpoint was written")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - t0
        record = {"step": step + 1, "of": len(steps),
                  **{k: round(v, 6) if isinstance(v, float) else v for k, v in numbers.items()},
                  "lr": opts.lr, "tokens_per_s": round(numbers["tokens"] / seconds, 1),
                  "seconds": round(seconds, 3)}
        if acc.is_main_process:
            log(record)
        summary.update({k: record[k] for k in ("loss", "kl", "clip_frac", "grad_norm")})
        if (step + 1) % opts.save_every == 0 and step + 1 < len(steps):
            state.save_state(acc, partial, step + 1, meta, plan)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    weights = acc.get_state_dict(model)  # every process: FSDP and ZeRO-3 gather the shards
    if acc.is_main_process:
        from rlany.probe import record
        final = acc.unwrap_model(model)
        state.save_final(final, weights, tokenizer, output,
                         {**meta, "metrics": summary, "options": asdict(opts),
                          "probe": record(final, tokenizer)})
        shutil.rmtree(partial, ignore_errors=True)
    acc.wait_for_everyone()
    return summary


def response_logprobs(model, batch, device, keep: bool = True):
    """(log-probs (B, K), response mask (B, K), advantages) of a collated batch. With `keep`,
    the LM head runs only where a response token is predicted (from the shortest prompt's
    last token on): over a long prompt it is most of the (B, T, vocab) logits and a quarter
    of the compute, and the log-probs are the same numbers."""
    from rlany.losses import token_logprobs

    ids, attn, resp, adv = (t.to(device) for t in batch)
    if not keep:
        return token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids), resp, adv
    start = int(resp.any(dim=0).float().argmax())  # the first column with a response target
    logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=ids.shape[1] - start).logits
    return token_logprobs(logits, ids[:, start:]), resp[:, start:], adv


def old_logprobs_source(samples: list[Sample], mode: str) -> str:
    """"generation" or "recompute": where PPO's pre-update log-probs come from."""
    if mode not in OLD_LOGPROBS:
        raise RlanyError(f"old_logprobs must be one of {', '.join(OLD_LOGPROBS)}, not {mode!r}")
    missing = sum(s.old_logprobs is None for s in samples)
    if mode == "generation" and missing:
        raise RlanyError(f"--old-logprobs generation, but {missing} of {len(samples)} samples "
                         "carry no engine log-probs of their sampled tokens",
                         hint="use --old-logprobs auto or recompute")
    return "generation" if mode != "recompute" and not missing else "recompute"


def _pre_update_logprobs(forward, samples: list[Sample], steps: list[list[int]], acc,
                         micro: int, first_step_later: bool) -> dict:
    """Log-probs of the pre-update policy for this process's samples (no grad, eval mode).
    With `first_step_later`, the first optimizer step's samples are left out: that step's
    own forward gives theirs. Every process runs the same number of forwards."""
    import torch

    world = acc.num_processes

    def todo(rank: int) -> list[int]:
        skip = set(steps[0][rank::world]) if first_step_later and steps else set()
        mine = {i for s in steps for i in s[rank::world]} - skip
        return sorted(mine, key=lambda i: samples[i].length)

    mine = todo(acc.process_index)
    calls = max(math.ceil(len(todo(r)) / micro) for r in range(world))
    shortest = min(samples, key=lambda s: s.length)
    old = {}
    with torch.no_grad():
        for b in range(calls):
            idx = mine[b * micro:(b + 1) * micro]
            logp, resp, _ = forward([samples[i] for i in idx] or [shortest])
            for row, i in enumerate(idx):
                old[i] = logp[row][resp[row]].cpu()
    return old


def _ppo_parts(logp, resp, adv, idx: list, old: dict, opts: TrainOptions, normalizer: float):
    """PPO-clip of one micro-batch against the pre-update log-probs (`old`, filled here for
    a first-step sample: the current weights are the old ones)."""
    import torch

    from rlany.losses import ppo_clip_loss

    old_logp = torch.zeros_like(logp)  # (B, T-1)
    for row, i in enumerate(idx):
        if i is None:
            continue
        if i not in old:
            old[i] = logp[row][resp[row]].detach().cpu()
        old_logp[row][resp[row]] = old[i].to(logp.device, logp.dtype)
    return ppo_clip_loss(logp, old_logp, old_logp, adv, resp, clip_eps=opts.clip_eps,
                         kl_beta=opts.kl_beta, normalizer=normalizer)


def _optimizer_step(acc, model, params, forward, samples: list[Sample], group: list[int],
                    old: dict, opts: TrainFields, objective: str = "ppo") -> dict:
    """Forward and backward over this process's micro-batches of one optimizer step, then
    the gradient clip. Returns the step's numbers over all processes (the caller steps)."""
    import torch

    from rlany.losses import nll_loss
    from rlany.verdict import verdict_loss

    world = acc.num_processes
    batches = micro_batches(group, samples, acc.process_index, world, opts.micro_batch)
    shortest = min(group, key=lambda i: samples[i].length)
    sums = torch.zeros(5, dtype=torch.float64)  # objective, pg, kl, clipped, tokens
    for k, idx in enumerate(batches):
        last = k == len(batches) - 1
        acc.sync_gradients = last  # DeepSpeed steps its engine at the boundary only
        with nullcontext() if last else acc.no_sync(model):
            batch = [samples[shortest if i is None else i] for i in idx]
            if objective in VERDICT_OBJECTIVES:
                real = torch.tensor([float(i is not None) for i in idx])
                parts = verdict_loss(
                    forward(batch), torch.tensor(batch[0].choice_values),
                    torch.tensor([s.target for s in batch]),
                    torch.tensor([s.advantage for s in batch]) * real,
                    objective=objective, normalizer=len(group) / world)
                acc.backward(parts.loss)
                sums += torch.tensor([parts.objective, parts.pg, parts.kl, parts.clipped,
                                      parts.tokens], dtype=torch.float64)
                continue
            logp, resp, adv = forward(batch)
            real = torch.tensor([i is not None for i in idx], device=resp.device)
            resp = resp & real[:, None]  # (B, T-1): padding rows have no response token
            if objective == "nll":
                parts = nll_loss(logp, adv, resp, normalizer=len(group) / world)
            else:
                parts = _ppo_parts(logp, resp, adv, idx, old, opts, len(group) / world)
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


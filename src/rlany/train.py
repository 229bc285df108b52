"""The one training loop behind `train-policy` and `train-rm` (no Trainer subclass).

A sample is (chat messages -> response text, advantage). `train-policy` takes every scored
step with `keep` (its prompt_messages -> its response, the step's advantage); `train-rm`
takes every kept judge sample (the step's judge_messages -> the judge's text, its
consistency advantage). Tokens: the prompt is rendered with the tokenizer's chat template
(`rlany.chat.render`, exactly as at generation), the response is tokenized and closed with
EOS (except a response that was cut by max_tokens: it never ended, so no EOS is taught).
A sample longer than `max_len` is dropped whole: prompt, response and advantage together.

The update (DESIGN §4, `rlany.losses`): log-probs of the pre-update policy are computed
first (no grad, eval mode); then `epochs` passes of PPO-clip + k3 KL to that snapshot.
Samples are shuffled (seeded) into optimizer steps of `micro_batch * grad_accum * world`
sequences; inside a step they are sorted by length into micro-batches, so little compute
goes to padding. The loss of a micro-batch is its summed per-sequence loss divided by the
sequence count of the whole optimizer step: accumulation is scaled exactly once.

Runs under Accelerate: plain `python` on one CPU/GPU, `accelerate launch` on many (DDP,
FSDP, DeepSpeed through accelerate config files). Each process trains on its slice of each
optimizer step; gradients are averaged by the backend, and the loss scaling above keeps
the global mean exact.

Resume: every `save_every` optimizer steps the trainable weights, optimizer state and step
count go to `OUT.partial/state.pt` (atomically). A rerun with the same data continues from
there. The finished checkpoint is written to a temp directory and renamed to OUT, so a
directory named OUT is always complete.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

from rlany.errors import RlanyError
from rlany.records import Scored


@dataclass(frozen=True)
class TrainOptions:
    lr: float = 2e-5  # LoRA; full fine-tuning wants ~1e-6 (DESIGN §4)
    epochs: int = 1
    micro_batch: int = 4
    grad_accum: int = 2
    clip_eps: float = 0.2
    kl_beta: float = 0.01
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    max_len: int = 1024
    seed: int = 0
    full: bool = False  # full fine-tuning instead of LoRA
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: str = "all-linear"
    dtype: str = "float32"
    save_every: int = 1
    max_steps: int | None = None  # stop after this many optimizer steps (tests, budgets)


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


RawSample = tuple[list[dict], str, float, bool]  # messages, response, advantage, add_eos


def policy_samples(scored: Iterable[Scored]) -> Iterator[RawSample]:
    for traj in scored:
        for step in traj.steps:
            if step.keep:
                yield step.prompt_messages, step.response, step.advantage, not step.truncated


def rm_samples(scored: Iterable[Scored]) -> Iterator[RawSample]:
    for traj in scored:
        for step in traj.steps:
            for sample in step.judge:
                if sample.keep and step.judge_messages:
                    yield step.judge_messages, sample.text, sample.advantage, True


def tokenize(tokenizer, raw: Iterable[RawSample], max_len: int) -> tuple[list[Sample], int]:
    """Token ids for each sample; over-long samples are dropped whole. Returns (kept, dropped)."""
    from rlany.chat import render

    eos = tokenizer.eos_token_id
    kept, dropped = [], 0
    for messages, response, advantage, add_eos in raw:
        prompt = render(tokenizer, messages)
        resp = tokenizer(response, add_special_tokens=False)["input_ids"]
        if add_eos and eos is not None:
            resp = resp + [eos]
        if not resp or len(prompt) + len(resp) > max_len:
            dropped += 1
            continue
        kept.append(Sample(prompt, resp, advantage))
    return kept, dropped


def plan_steps(samples: list[Sample], opts: TrainOptions, world: int) -> list[list[int]]:
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
                  micro: int) -> list[list[int]]:
    """This process's slice of one optimizer step, sorted by length, cut into micro-batches."""
    mine = sorted(indices[rank::world], key=lambda i: samples[i].length)
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


def load_model(base: str, adapter: str | None, opts: TrainOptions):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlany.compat import enable_cpu_masked_gqa
    enable_cpu_masked_gqa()

    tokenizer = AutoTokenizer.from_pretrained(adapter if opts.full and adapter else base)
    model = AutoModelForCausalLM.from_pretrained(adapter if opts.full and adapter else base,
                                                 dtype=getattr(torch, opts.dtype))
    if opts.full:
        return model, tokenizer
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter:
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    else:
        torch.manual_seed(opts.seed)  # LoRA A is random-initialized: make it reproducible
        targets = (opts.target_modules if opts.target_modules == "all-linear"
                   else [t.strip() for t in opts.target_modules.split(",") if t.strip()])
        model = get_peft_model(model, LoraConfig(
            r=opts.lora_r, lora_alpha=opts.lora_alpha, lora_dropout=opts.lora_dropout,
            target_modules=targets, task_type="CAUSAL_LM"))
    return model, tokenizer


def train(samples: list[Sample], model, tokenizer, opts: TrainOptions, output: Path,
          meta: dict, log: Callable[[dict], None]) -> dict:
    """Run the update and write the checkpoint to `output`. Returns summary metrics."""
    import torch
    from accelerate import Accelerator

    from rlany.losses import ppo_clip_loss, token_logprobs

    started = time.perf_counter()
    acc = Accelerator()
    torch.manual_seed(opts.seed)
    rank, world = acc.process_index, acc.num_processes
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    steps = plan_steps(samples, opts, world)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    model, optimizer = acc.prepare(model, optimizer)

    def forward_logp(batch):
        ids, attn, resp, adv = (t.to(acc.device) for t in collate(batch, pad))
        logits = model(input_ids=ids, attention_mask=attn).logits
        return token_logprobs(logits, ids), resp, adv

    # log-probs of the pre-update policy, for this process's samples only (no grad). The
    # first optimizer step runs on the pre-update weights, so its samples take theirs from
    # that step's own forward (ratio exactly 1 there, as PPO's first minibatch has): one
    # no-grad forward fewer per sample of step 1. A resumed run starts past step 1 with
    # updated weights, so it computes them all here, before the saved weights are loaded.
    partial = output.with_name(output.name + ".partial")
    resuming = (partial / "state.pt").exists()
    first = set() if resuming or not steps else set(steps[0][rank::world])
    mine = sorted({i for s in steps for i in s[rank::world]} - first)
    old: dict[int, torch.Tensor] = {}
    model.eval()
    with torch.no_grad():
        for b in range(0, len(mine), opts.micro_batch):
            idx = mine[b:b + opts.micro_batch]
            logp, resp, _ = forward_logp([samples[i] for i in idx])
            for row, i in enumerate(idx):
                old[i] = logp[row][resp[row]].cpu()

    start_step = _resume(partial, model, optimizer, acc, meta)
    if start_step and acc.is_main_process:
        log({"event": "resume", "step": start_step})
    model.train()
    summary = {"steps": len(steps), "samples": len(samples)}
    for step in range(start_step, len(steps)):
        t0 = time.perf_counter()
        group = steps[step]
        batches = micro_batches(group, samples, rank, world, opts.micro_batch)
        totals = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clip_frac": 0.0, "tokens": 0}
        for k, batch_idx in enumerate(batches):
            batch = [samples[i] for i in batch_idx]
            sync = k == len(batches) - 1
            ctx = acc.no_sync(model) if not sync and world > 1 else nullcontext()
            with ctx:
                logp, resp, adv = forward_logp(batch)
                for row, i in enumerate(batch_idx):
                    if i not in old:  # a first-step sample: the current weights are the old
                        old[i] = logp[row][resp[row]].detach().cpu()
                old_logp = torch.zeros_like(logp)
                for row, i in enumerate(batch_idx):
                    old_logp[row][resp[row]] = old[i].to(logp.device, logp.dtype)
                parts = ppo_clip_loss(logp, old_logp, old_logp, adv, resp,
                                      clip_eps=opts.clip_eps, kl_beta=opts.kl_beta,
                                      normalizer=math.ceil(len(group) / world))
                acc.backward(parts.loss)
            weight = len(batch) / len(group[rank::world])
            totals["loss"] += parts.loss.item()
            totals["pg"] += parts.pg * weight
            totals["kl"] += parts.kl * weight
            totals["clip_frac"] += parts.clip_frac * weight
            totals["tokens"] += parts.tokens
        grad_norm = acc.clip_grad_norm_(params, opts.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if world > 1:  # the step's numbers over all processes (loss: mean of the slices)
            reduced = acc.reduce(torch.tensor([totals["loss"], totals["pg"], totals["kl"],
                                               totals["clip_frac"]], device=acc.device), "mean")
            totals.update(zip(("loss", "pg", "kl", "clip_frac"), reduced.tolist()))
            totals["tokens"] = int(acc.reduce(torch.tensor(totals["tokens"], device=acc.device),
                                              "sum").item())
        seconds = time.perf_counter() - t0
        record = {"step": step + 1, "of": len(steps), **{k: round(v, 6) if isinstance(v, float)
                                                         else v for k, v in totals.items()},
                  "grad_norm": round(float(grad_norm), 6), "lr": opts.lr,
                  "tokens_per_s": round(totals["tokens"] / seconds, 1),
                  "seconds": round(seconds, 3)}
        if acc.is_main_process:
            log(record)
        summary.update({k: record[k] for k in ("loss", "kl", "clip_frac", "grad_norm")})
        if (step + 1) % opts.save_every == 0 and step + 1 < len(steps) and acc.is_main_process:
            _save_state(partial, model, optimizer, acc, step + 1, meta)
    acc.wait_for_everyone()
    summary["seconds"] = round(time.perf_counter() - started, 1)
    if acc.is_main_process:
        _save_final(acc.unwrap_model(model), tokenizer, output, {**meta, "metrics": summary,
                                                                 "options": asdict(opts)})
        shutil.rmtree(partial, ignore_errors=True)
    return summary


def _trainable(model, acc) -> dict:
    return {n: p.detach().cpu() for n, p in acc.unwrap_model(model).named_parameters()
            if p.requires_grad}


def _save_state(partial: Path, model, optimizer, acc, step: int, meta: dict) -> None:
    import torch

    partial.mkdir(parents=True, exist_ok=True)
    tmp = partial / "state.pt.tmp"
    torch.save({"step": step, "data_sha256": meta.get("data_sha256"),
                "params": _trainable(model, acc), "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, partial / "state.pt")


def _resume(partial: Path, model, optimizer, acc, meta: dict) -> int:
    import torch

    state_file = partial / "state.pt"
    if not state_file.exists():
        return 0
    state = torch.load(state_file, map_location="cpu", weights_only=False)
    if state.get("data_sha256") != meta.get("data_sha256"):
        raise RlanyError("an interrupted training of other data is in the way",
                         where=str(partial), hint="delete it to start over")
    named = dict(acc.unwrap_model(model).named_parameters())
    with torch.no_grad():
        for name, value in state["params"].items():
            named[name].copy_(value.to(named[name].device, named[name].dtype))
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def _save_final(model, tokenizer, output: Path, meta: dict) -> None:
    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if not hasattr(model, "peft_config"):  # a full model directory needs its tokenizer
        tokenizer.save_pretrained(tmp)
    (tmp / "rlany.json").write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, output)

"""train-policy: useful (non-padding) tokens/s of rlany's update ÷ a bare torch
forward+backward+AdamW loop on the same micro-batches. Target >= 0.9.

Both use SmolLM2-135M with the same LoRA config on the CPU, fresh LoRA weights for each
run, and the same forward (the LM head only over positions that predict response tokens),
so the ratio is rlany's own overhead: Accelerate, the PPO-clip + KL loss, the pre-update
log-probs and writing the checkpoint. rlany runs twice per round:
- `generation`: the samples carry the sampling engine's log-probs of their tokens, as
  they do inside `rlany loop` with the hf engine (`--old-logprobs auto`); here they are
  computed by one no-grad pass of the base model before timing, i.e. what an engine holding
  the same weights returns;
- `recompute`: no engine log-probs (a file from another engine, or `--old-logprobs
  recompute`): one extra no-grad forward over the samples after the first optimizer step's.
After one warm-up step the sides alternate (generation, recompute, bare, ...) and each
side's best time counts, so none pays for a cold start.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402


def samples(tokenizer, n: int = 32):
    from rlany.training.samples import tokenize
    raw = [([{"role": "user", "content": f"Solve the problem. What is {i} + {i * 3}? "
              + "Explain briefly. " * (i % 4)}],
            f"We add {i} and {i * 3}. " * (1 + i % 3) + f"The answer is \\boxed{{{4 * i}}}.",
            1.0 if i % 2 else -1.0, True) for i in range(n)]
    return tokenize(tokenizer, raw, max_len=1024)[0]


def with_engine_logprobs(model, data, pad):
    """The samples with the base policy's log-prob of each response token attached."""
    import torch

    from rlany.compat import accepts_logits_to_keep
    from rlany.training.trainer import collate, response_logprobs

    keep = accepts_logits_to_keep(model)
    model.eval()
    out = []
    with torch.no_grad():
        for s in data:
            logp, resp, _ = response_logprobs(model, collate([s], pad), "cpu", keep)
            out.append(dataclasses.replace(s, old_logprobs=logp[resp].tolist()))
    return out


def bare_loop(model, batches, pad, lr):
    import torch

    from rlany.compat import accepts_logits_to_keep
    from rlany.training.trainer import collate, response_logprobs

    keep = accepts_logits_to_keep(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    start = time.perf_counter()
    for step in batches:
        for micro in step:
            logp, resp, adv = response_logprobs(model, collate(micro, pad), "cpu", keep)
            loss = -(logp * resp * adv[:, None]).sum() / resp.sum()
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> dict:
    from rlany.models import resolve_model
    from rlany.stages.train_policy import TrainOptions
    from rlany.training.model import load_model
    from rlany.training.trainer import micro_batches, plan_steps, train

    base = resolve_model("smollm2")
    opts = TrainOptions(output="unused", micro_batch=4, grad_accum=2, lr=2e-5)
    model, tok = load_model(base, None, opts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    data = samples(tok)
    engine_data = with_engine_logprobs(model, data, pad)
    useful = sum(s.length for s in data)
    steps = plan_steps(data, opts, world=1)
    batches = [[[data[i] for i in mb] for mb in micro_batches(s, data, 0, 1, opts.micro_batch)]
               for s in steps]
    bare_loop(model, batches[:1], pad, opts.lr)  # warm-up: allocator, kernels, page cache

    def run_rlany(source: str) -> float:
        model, tok = load_model(base, None, opts)
        run_opts = dataclasses.replace(opts, old_logprobs=source)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            summary = train(engine_data if source == "generation" else data, model, tok,
                            run_opts, Path(tmp) / "ckpt", {"data_sha256": "bench"},
                            lambda r: None)
            assert summary["old_logprobs"] == source, summary
            return time.perf_counter() - start

    def run_bare() -> float:
        model, _ = load_model(base, None, opts)
        return bare_loop(model, batches, pad, opts.lr)

    times = {"generation": [], "recompute": [], "bare": []}
    for _ in range(2):
        times["generation"].append(run_rlany("generation"))
        times["recompute"].append(run_rlany("recompute"))
        times["bare"].append(run_bare())
    best = {k: min(v) for k, v in times.items()}
    ratio = {k: round(best["bare"] / best[k], 3) for k in ("generation", "recompute")}
    result = {"metric": "useful tokens/s, train-policy / bare fwd+bwd+AdamW loop",
              "ratio": ratio["generation"], "ratio_recompute": ratio["recompute"],
              "target": ">= 0.9 (old log-probs from generation, the loop's path)",
              "met": ratio["generation"] >= 0.9,
              "useful_tokens": useful, "samples": len(data), "optimizer_steps": len(steps),
              "tokens_per_s": {k: round(useful / t, 1) for k, t in best.items()},
              "best_s": {k: round(t, 2) for k, t in best.items()},
              "runs_s": {k: [round(t, 2) for t in v] for k, v in times.items()},
              "dtype": str(model.dtype)}
    save("training", result)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))

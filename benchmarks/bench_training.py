"""train-policy: useful (non-padding) tokens/s of rlany's update ÷ a bare torch
forward+backward+AdamW loop on the same micro-batches. Target >= 0.9.

Both use SmolLM2-135M with the same LoRA config on the CPU, fresh LoRA weights for each
run. rlany's update also computes the pre-update log-probs PPO's ratio needs (one no-grad
forward over the samples after the first optimizer step's) and writes its checkpoint:
both are part of what is measured. After one warm-up step, the two alternate (rlany, bare,
rlany, bare) and each side's best time counts, so neither pays for a cold start.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402


def samples(tokenizer, n: int = 32):
    from rlany.train import tokenize
    raw = [([{"role": "user", "content": f"Solve the problem. What is {i} + {i * 3}? "
              + "Explain briefly. " * (i % 4)}],
            f"We add {i} and {i * 3}. " * (1 + i % 3) + f"The answer is \\boxed{{{4 * i}}}.",
            1.0 if i % 2 else -1.0, True) for i in range(n)]
    return tokenize(tokenizer, raw, max_len=1024)[0]


def bare_loop(model, batches, pad, lr):
    import torch

    from rlany.losses import token_logprobs
    from rlany.train import collate

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    start = time.perf_counter()
    for step in batches:
        for micro in step:
            ids, attn, resp, adv = collate(micro, pad)
            logp = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
            loss = -(logp * resp * adv[:, None]).sum() / resp.sum()
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> dict:
    from rlany.models import resolve_model
    from rlany.train import TrainOptions, load_model, micro_batches, plan_steps, train

    base = resolve_model("smollm2")
    opts = TrainOptions(output="unused", micro_batch=4, grad_accum=2, lr=2e-5)
    model, tok = load_model(base, None, opts)
    data = samples(tok)
    useful = sum(s.length for s in data)
    steps = plan_steps(data, opts, world=1)
    batches = [[[data[i] for i in mb] for mb in micro_batches(s, data, 0, 1, opts.micro_batch)]
               for s in steps]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    bare_loop(model, batches[:1], pad, opts.lr)  # warm-up: allocator, kernels, page cache

    def run_rlany() -> float:
        model, tok = load_model(base, None, opts)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            train(data, model, tok, opts, Path(tmp) / "ckpt", {"data_sha256": "bench"},
                  lambda r: None)
            return time.perf_counter() - start

    def run_bare() -> float:
        model, _ = load_model(base, None, opts)
        return bare_loop(model, batches, pad, opts.lr)

    times_rlany, times_bare = [], []
    for _ in range(2):
        times_rlany.append(run_rlany())
        times_bare.append(run_bare())
    t_rlany, t_bare = min(times_rlany), min(times_bare)
    ratio = (useful / t_rlany) / (useful / t_bare)
    result = {"metric": "useful tokens/s, train-policy / bare fwd+bwd loop",
              "ratio": round(ratio, 3), "target": ">= 0.9", "met": ratio >= 0.9,
              "useful_tokens": useful, "rlany_tokens_per_s": round(useful / t_rlany, 1),
              "bare_tokens_per_s": round(useful / t_bare, 1), "rlany_s": round(t_rlany, 2),
              "bare_s": round(t_bare, 2), "samples": len(data),
              "runs_s": {"rlany": [round(t, 2) for t in times_rlany],
                         "bare": [round(t, 2) for t in times_bare]}}
    save("training", result)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))

"""Where LoRA's time goes on a GPU: forward + backward of one batch, five ways.

`benchmarks/results/gpu.json` (2026-11-26) has rlany's LoRA train-policy at 54-61% of
`--full`'s tokens/s on an H200, where LoRA should be faster (no weight gradients for the
base). Suspect: PEFT keeps the adapters in fp32 (`autocast_adapter_dtype`), so every
adapted linear casts its bf16 input to fp32 and back. This times, on a random model of
SmolLM2-360M's shape in bf16, one batch's forward + backward (+ the optimizer step) as:
full bf16 weights; full fp32 weights under bf16 autocast (rlany's `--full` since then);
LoRA r16 on every linear as rlany makes it; the same under bf16 autocast; LoRA with bf16
adapters. Run from the repository root on a GPU machine:

    python benchmarks/gpu_lora_probe.py --tokenizer DIR --out results-dir

(`--smoke`: a tiny shape on the CPU, to test this script.) Writes lora_probe.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import SHAPES, SMOKE_SHAPE, device_facts  # noqa: E402


def build(tokenizer: Path, shape: dict, device: str, dtype):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    base = json.loads((tokenizer / "config.json").read_text())
    config = LlamaConfig(**{**base, **shape, "head_dim": shape["hidden_size"]
                            // shape["num_attention_heads"]})
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def way(name: str, tokenizer: Path, shape: dict, device: str, ids, reps: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model

    full = name.startswith("full")
    weights = torch.float32 if name == "full-amp" else torch.bfloat16
    model = build(tokenizer, shape, device, weights)
    if not full:
        model = get_peft_model(model, LoraConfig(
            r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
            autocast_adapter_dtype=name != "lora-bf16")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)
    amp = name in ("full-amp", "lora-autocast")
    times = []
    for i in range(reps + 2):  # two warm-up steps
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16) if amp else nullcontext():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    trainable = sum(p.numel() for p in params)
    peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None
    del model, opt
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    sec = statistics.median(times)
    return {"seconds_median": round(sec, 4), "tokens_per_s": round(ids.numel() / sec),
            "trainable_parameters": trainable, "peak_gpu_memory_gib": peak,
            "adapter_dtype": None if full else ("bfloat16" if name == "lora-bf16" else
                                                "float32")}


def main() -> None:
    import torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="smollm2-360m", choices=list(SHAPES))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=896)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not a.smoke:
        sys.exit("gpu_lora_probe: no CUDA device (use --smoke to test the script on a CPU)")
    shape = SMOKE_SHAPE if a.smoke else SHAPES[a.shape]
    batch, tokens = (2, 32) if a.smoke else (a.batch, a.tokens)
    torch.manual_seed(1)
    ids = torch.randint(0, 49152, (batch, tokens), device=device)
    result = {"machine": device_facts(), "shape": "smoke" if a.smoke else a.shape,
              "batch": [batch, tokens], "what": "one forward + backward + AdamW step, "
              "random ids, labels = ids, median of --reps after 2 warm-up steps", "ways": {}}
    for name in ("full-bf16", "full-amp", "lora", "lora-autocast", "lora-bf16"):
        result["ways"][name] = way(name, a.tokenizer, shape, device, ids, a.reps)
        print(name, json.dumps(result["ways"][name]), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "lora_probe.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

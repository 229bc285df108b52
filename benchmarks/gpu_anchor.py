"""prime-rl's published Qwen3-0.6B training rows, redone with rlany on the same card.

prime-rl's own benchmark table (PrimeIntellect-ai/prime-rl, benchmarks/results/BENCHMARKS.md
at 30bf494f) gives, for Qwen3-0.6B on one H100 HBM3 at 16,384 tokens with activation
recompute and FlashAttention 3: "RL Full" 11.90k tokens/s (12.5 GiB), "RL LoRA(r=16)"
13.34k (5.1 GiB). This runs `rlany train-policy` on the same shape (random weights: they
cost what trained ones do; SmolLM2's tokenizer, whose ids lie within Qwen3's vocabulary),
one ~16k-token sequence per optimizer step, the engine's log-probs carried in the samples
(no pre-update pass: prime-rl's RL reads the inference server's). Run on a machine with one
CUDA GPU, from the repository root with rlany importable (benchmarks/gpu_check.py says how):

    python benchmarks/gpu_anchor.py --tokenizer DIR --out results-dir \\
        --runs full:12000:4000,full:12000:4000:gc,lora:12000:4000:gc,full:100:15900:gc

A run is KIND:PROMPT:RESPONSE[:gc]: full or lora, the prompt's and the response's tokens
(rlany computes the LM head on the response only, so 100:15900 is the LM head on nearly
every position), `gc` adds --grad-checkpointing (prime-rl's "Recompute"). `--smoke` runs
it on a CPU with a tiny shape (to test this script). Writes gpu.json and gpu-log.txt to
--out; benchmarks/results/gpu.json holds the H100 calls (`h100_anchor`).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpu_check import SMOKE_SHAPE, Checks, device_facts, make_random, scored_file, start, train

PRIME_RL = {"full": {"tokens_per_s": 11900, "mfu": 0.111, "peak_gib": 12.5, "step_s": 1.38},
            "lora": {"tokens_per_s": 13340, "mfu": 0.109, "peak_gib": 5.1, "step_s": 1.23}}
QWEN3_06B = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
             "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
             "rope_theta": 1000000.0, "tie_word_embeddings": True}


def anchor(c: Checks, tokenizer: Path, work: Path, device: str, smoke: bool,
           specs: list[str]) -> None:
    model = work / "qwen3-0.6b"
    shape = {**QWEN3_06B, **({k: SMOKE_SHAPE[k] for k in ("hidden_size",
             "intermediate_size", "num_hidden_layers")} if smoke else {})}
    size = make_random(tokenizer, shape, model, device)
    common = ("--lr", "1e-6", "--micro-batch", 1, "--grad-accum", 1, "--max-len", 16384,
              "--max-steps", 3 if smoke else 6)
    runs: dict = {}
    for spec in specs:
        kind, prompt, response, *gc = spec.split(":")
        data = work / f"scored-anchor-{prompt}-{response}.jsonl"
        if not data.exists():
            words = (150, 50) if smoke else (int(prompt), int(response))
            scored_file(data, 2 if smoke else 8, *words, tokenizer)
        runs[spec] = train(c, f"anchor-{spec.replace(':', '-')}", model, data, work,
                           *(("--full",) if kind == "full" else ()),
                           *(("--grad-checkpointing",) if gc else ()), *common)
    c.record("anchor-qwen3-0.6b", ok=all(r["rc"] == 0 for r in runs.values()),
             parameters_b=size, prime_rl=PRIME_RL, **runs)


def versus_prime_rl(anchor_runs: dict) -> dict:
    """The ratios benchmarks/README.md states, from the recorded runs: rlany's tokens/s and
    peak memory with recompute over prime-rl's published row (full: the 4k-response and the
    LM-head-everywhere shape; LoRA: 4k), and what --grad-checkpointing costs at 15.9k."""
    run = anchor_runs.__getitem__
    specs = ("full:12000:4000:gc", "full:100:15900:gc", "lora:12000:4000:gc")
    speed = {spec: run(spec)["tokens_per_s_median"]
             / PRIME_RL[spec.split(":")[0]]["tokens_per_s"] for spec in specs}
    memory = {spec: run(spec)["peak_gpu_memory_gib"] / PRIME_RL[spec.split(":")[0]]["peak_gib"]
              for spec in speed}
    kept, gc = run("full:100:15900"), run("full:100:15900:gc")
    return {"speed": speed, "memory": memory,
            "grad_checkpointing_tokens_per_s_lost": 1 - gc["tokens_per_s_median"]
            / kept["tokens_per_s_median"]}


def main() -> None:
    a, c = start(__doc__, "/tmp/rlany-anchor", 400, lambda ap: ap.add_argument(
        "--runs", default="full:12000:4000,lora:12000:4000",
        help="KIND:PROMPT:RESPONSE[:gc], comma-separated (see above)"))
    c.results["machine"] = facts = device_facts()
    if not facts["cuda_available"] and not a.smoke:
        c.record("cuda", ok=False, error="torch sees no CUDA device")
        return
    anchor(c, a.tokenizer, a.work, "cuda" if facts["cuda_available"] else "cpu", a.smoke,
           a.runs.split(","))
    (a.out / "gpu.json").write_text(json.dumps(c.results, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""The hf engine's generation against a plain transformers `generate` on the same work.

bench_trl.py's held-back shape: 8 two-digit sums x 8 samples x up to 96 new tokens,
temperature 1, fp32 (the trainer's dtype where the CPU has no bf16), SmolLM2-135M-Instruct.
Three ways, alternated round by round, run alone on the machine:

    plain      `generate` on the 64 rows (each prompt repeated 8 times), nothing kept but
               the tokens: what TRL's GRPOTrainer does
    logits     the same, with `output_logits=True` and the sampled tokens' log-probs read
               from the stacked logits afterwards: what rlany's hf engine did before
               (every step's full logits kept until generate returns)
    rlany      `HfEngine.generate` (n = 8 per request, logprobs on): one prefill per
               prompt shared by its 8 samples, the log-probs kept as they are sampled
               (`rlany.engines.hf_logprobs`), all 64 sequences in one call
    rlany-b32  the same in calls of 32 sequences (the engine's default batch until
               2026-11-26, when a rollout of 64 sequences took two calls; now 64,
               `--engine-batch`)

Reports seconds per call (median and each round), new tokens and tokens/s per way, and
rlany / plain (target: <= 1). Writes benchmarks/results/hf_generate-SETTING.json (with the
machine's CPU flags; SETTING as common.cpu_setting names it, e.g. avx2-float32 on an AVX2
CPU, avx2forced-float32 with the instruction-set switches), so each CPU setting keeps its
own result:

    python benchmarks/bench_hf_generate.py --rounds 3
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python benchmarks/bench_hf_generate.py --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_setting, save  # noqa: E402

PROMPTS, SAMPLES, MAX_NEW = 8, 8, 96


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args(argv)
    import torch

    from rlany.chat import render
    from rlany.engines.base import EngineConfig, Request, Sampling
    from rlany.engines.hf import HfEngine
    from rlany.models import resolve_model

    model = resolve_model("smollm2")
    engine = HfEngine(EngineConfig(kind="hf", model=model, dtype=args.dtype, seed=0,
                                   batch_size=PROMPTS * SAMPLES))
    net, tok = engine.net, engine.tokenizer
    messages = [[{"role": "user", "content": f"What is {10 + 7 * i} + {23 + 5 * i}? Think "
                  "step by step, then give the answer."}] for i in range(PROMPTS)]
    ids = [render(tok, m) for m in messages]
    width = max(len(p) for p in ids)
    pad = engine._pad
    rows = torch.tensor([[pad] * (width - len(p)) + p for p in ids for _ in range(SAMPLES)])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids
                         for _ in range(SAMPLES)])

    def plain(keep_logits: bool) -> int:
        out = net.generate(input_ids=rows, attention_mask=mask, do_sample=True,
                           temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW,
                           pad_token_id=pad, return_dict_in_generate=True,
                           output_logits=keep_logits)
        new = out.sequences[:, width:]
        if keep_logits:  # the old engine's read-out: stacked logits, log_softmax, gather
            for row in range(new.shape[0]):
                logits = torch.stack([step[row] for step in out.logits])
                torch.log_softmax(logits.float(), -1).gather(-1, new[row][:, None])
        return int((new != pad).sum())

    def rlany() -> int:
        res = engine.generate([Request(m, Sampling(n=SAMPLES, max_tokens=MAX_NEW,
                                                   temperature=1.0, logprobs=True))
                               for m in messages])
        return sum(len(c.token_ids) for r in res for c in r.completions)

    def rlany_b32() -> int:
        engine.batch_size = 32
        try:
            return rlany()
        finally:
            engine.batch_size = PROMPTS * SAMPLES

    ways = {"plain": lambda: plain(False), "logits": lambda: plain(True), "rlany": rlany,
            "rlany-b32": rlany_b32}
    with torch.no_grad():
        plain(False)  # warm-up
        runs = alternate(ways, args.rounds)
    result = summarize(runs, args.dtype, torch.get_num_threads())
    setting, result["isa_switches"] = cpu_setting(args.dtype)
    path = save(f"hf_generate-{setting}", result)
    print(path, {k: v for k, v in result.items() if k != "ways"})
    return 0


def alternate(ways: dict, rounds: int) -> dict[str, list]:
    """Each way once per round, in turn (seeded by the round): seconds and new tokens."""
    import torch

    runs: dict[str, list] = {k: [] for k in ways}
    for r in range(rounds):
        for name, fn in ways.items():
            torch.manual_seed(r)
            t0 = time.perf_counter()
            tokens = fn()
            runs[name].append({"seconds": round(time.perf_counter() - t0, 2),
                               "new_tokens": tokens})
            print(name, runs[name][-1], flush=True)
    return runs


def summarize(runs: dict[str, list], dtype: str, threads: int) -> dict:
    """The result: per way the median seconds and tokens/s, and rlany / plain."""
    summary = {name: {"median_seconds": statistics.median(x["seconds"] for x in v),
                      "tokens_per_s": round(sum(x["new_tokens"] for x in v)
                                            / sum(x["seconds"] for x in v), 1),
                      "rounds": v} for name, v in runs.items()}
    ratio = round(summary["rlany"]["median_seconds"] / summary["plain"]["median_seconds"], 3)
    return {"metric": "seconds of rlany's generation / a plain `generate`'s, same work",
            "ratio": ratio, "target": "<= 1", "met": ratio <= 1, "dtype": dtype,
            "what": f"{PROMPTS} prompts x {SAMPLES} samples x up to {MAX_NEW} new tokens, "
                    f"temperature 1, {dtype}, SmolLM2-135M-Instruct, torch threads "
                    f"{threads}",
            "ways": summary,
            "logits_over_plain_seconds": round(summary["logits"]["median_seconds"]
                                               / summary["plain"]["median_seconds"], 3),
            "b32_over_plain_seconds": round(summary["rlany-b32"]["median_seconds"]
                                            / summary["plain"]["median_seconds"], 3)}


if __name__ == "__main__":
    sys.exit(main())

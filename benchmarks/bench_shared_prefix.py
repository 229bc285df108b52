"""train-policy with shared prefixes computed once (`rlany.shared_prefix`, the default)
against the plain padded batch (`--no-share-prefix`), on a real RL step's samples; and with
`--batch-order grouped` (a step holds a task's samples, so they share more).

The data (benchmarks/data/household-step.jsonl.gz) are the kept samples of one iteration of
`examples/household/learn.toml` (SmolLM2-135M, 16 tasks x 8 rollouts: the prompts the
policy saw, the tokens it sampled, their engine log-probs and advantages), i.e. exactly what
`rlany train-policy` gets inside `make demo`. Both sides train fresh LoRA weights with the
config's settings (micro-batch 8, q/v LoRA r16, lr 3e-4) for the same first optimizer steps;
the sides alternate and each side's best round counts. Reported: seconds per optimizer step,
tokens the forward computes per step (shared tokens once), the speed-up, and each step's
loss on both sides (the same numbers: the exactness the unit tests check, here on the real
model). The grouped side trains other steps (other samples meet), so its losses are not
compared, only its speed. Run it alone on the machine.

    python benchmarks/bench_shared_prefix.py [--steps 6] [--rounds 2] [--dtype float32]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python benchmarks/bench_shared_prefix.py          # an AVX2 CPU's kernels, here
    python benchmarks/bench_shared_prefix.py --from-scored RUN/iter_000/scored.jsonl  # the data

The result is named by the CPU setting it ran with (common.cpu_setting):
results/shared_prefix-avx2-float32.json on an AVX2 CPU, shared_prefix-avx2forced-float32.json
with the instruction-set switches set.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_setting, save  # noqa: E402

DATA = Path(__file__).parent / "data" / "household-step.jsonl.gz"

def load_samples(tokenizer):
    from rlany.training.samples import RawSample, tokenize
    with gzip.open(DATA, "rt") as f:
        raw = [RawSample(r["messages"], r["response"], r["advantage"], r["ended"],
                         r["token_ids"], r["logprobs"]) for r in map(json.loads, f)]
    return tokenize(tokenizer, raw, max_len=2048)[0]


def write_data(scored: str) -> None:
    """The data file from a `rlany score` output: its kept policy samples (what
    `train-policy` reads from it), one JSON object each."""
    rows = []
    with open(scored) as f:
        for traj in map(json.loads, f):
            rows += [{"messages": s["prompt_messages"], "response": s["response"],
                      "advantage": s["advantage"], "ended": not s["truncated"],
                      "token_ids": s["token_ids"], "logprobs": s["logprobs"]}
                     for s in traj["steps"] if s["keep"]]
    DATA.parent.mkdir(exist_ok=True)
    with gzip.open(DATA, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"{len(rows)} samples -> {DATA}", file=sys.stderr)


def computed_tokens(data, steps, micro: int, share: bool) -> int:
    """Tokens the forward runs over the planned steps (padding excluded)."""
    from rlany.shared_prefix import common_prefix, pack_rows
    from rlany.training.trainer import micro_batches
    total = 0
    for step in steps:
        for mb in micro_batches(step, data, 0, 1, micro):
            seqs = [data[i].prompt_ids + data[i].response_ids for i in mb]
            if not share:
                total += sum(map(len, seqs))
                continue
            shared = common_prefix(seqs, min(len(data[i].prompt_ids) - 1 for i in mb))
            total += shared + sum(len(r.tokens) for r in pack_rows([s[shared:] for s in seqs]))
    return total


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the training dtype (float32: what a CPU without bf16 trains in)")
    parser.add_argument("--from-scored", metavar="SCORED", help="write the data file from "
                        "this scored.jsonl and stop")
    args = parser.parse_args()
    if args.from_scored:
        return write_data(args.from_scored)
    from rlany.models import resolve_model
    from rlany.stages.train_policy import TrainOptions
    from rlany.training.model import load_model
    from rlany.training.trainer import plan_steps, train

    base = resolve_model("smollm2")
    opts = TrainOptions(output="unused", micro_batch=8, grad_accum=1, lr=3e-4,
                        target_modules="q_proj,v_proj", max_steps=args.steps, dtype=args.dtype)
    _, tok = load_model(base, None, opts)
    data = load_samples(tok)
    sides = {"shared": opts, "plain": dataclasses.replace(opts, share_prefix=False),
             "grouped": dataclasses.replace(opts, batch_order="grouped")}
    plans = {side: plan_steps(data, o, world=1) for side, o in sides.items()}
    tokens = {side: computed_tokens(data, plans[side], o.micro_batch, o.share_prefix)
              for side, o in sides.items()}
    steps = plans["shared"]
    # what each side's steps hold (the grouped side's first steps are other samples):
    # samples and every token of them, so seconds compare per sample and per token too
    held = {side: [data[i].length for st in plan for i in st] for side, plan in plans.items()}

    def run(side: str) -> tuple[float, list[float]]:
        model, tok = load_model(base, None, opts)
        losses = []
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            train(data, model, tok, sides[side], Path(tmp) / "ckpt", {"data_sha256": "bench"},
                  lambda r: losses.append(r["loss"]) if "loss" in r else None)
            return time.perf_counter() - start, losses

    times: dict[str, list[float]] = {side: [] for side in sides}
    losses: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for side in times:
            seconds, losses[side] = run(side)
            times[side].append(seconds)
            print(f"{side}: {seconds:.1f} s", file=sys.stderr, flush=True)
    best = {k: min(v) for k, v in times.items()}
    worst_rel = max(abs(a - b) / max(abs(b), 1e-8)
                    for a, b in zip(losses["shared"], losses["plain"], strict=True))
    import torch
    result = {"metric": "seconds per optimizer step of train-policy, shared prefixes vs the "
                        "plain padded batch (real household RL samples)",
              "speedup": round(best["plain"] / best["shared"], 3),
              "grouped_speedup": round(best["plain"] / best["grouped"], 3),
              "target": "faster than the plain batch, the same losses",
              "met": best["plain"] > best["shared"] and worst_rel < 1e-4,
              "seconds_per_step": {k: round(t / len(steps), 2) for k, t in best.items()},
              "computed_tokens_per_step": {k: round(t / len(steps)) for k, t in tokens.items()},
              "sample_tokens_per_step": {k: round(sum(v) / len(steps)) for k, v in held.items()},
              "samples_per_s": {k: round(len(held[k]) / t, 3) for k, t in best.items()},
              "samples": len(data), "optimizer_steps": len(steps),
              "micro_batch": opts.micro_batch,
              "losses": {k: [round(x, 6) for x in v] for k, v in losses.items()},
              "loss_max_relative_difference": worst_rel,
              "runs_s": {k: [round(t, 1) for t in v] for k, v in times.items()},
              "dtype": str(load_model(base, None, opts)[0].dtype),
              "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    setting, result["isa_switches"] = cpu_setting(args.dtype)
    save(f"shared_prefix-{setting}", result)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))

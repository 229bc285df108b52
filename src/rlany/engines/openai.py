"""Any OpenAI-compatible chat endpoint (e.g. `vllm serve MODEL --enable-lora`).

Uses only the standard library. Each request is one POST to `/v1/chat/completions` with
`n` samples; timeouts and retries with exponential backoff (on connection errors, 429 and
5xx). A LoRA adapter directory is hot-loaded once through vLLM's
`/v1/load_lora_adapter` (the server needs `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) and then
addressed by name, so a running server picks up each new checkpoint without a restart.
The server renders the chat template; token ids are not returned by the API, so
`token_ids` holds one entry per generated token only when log-probs were asked for.
Image parts with local `file://` URLs (GUI observations) are sent inline as base64 `data:`
URLs, since the server need not share this machine's files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import mimetypes
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlany.engines import Completion, EngineConfig, EngineStats, Request, Result
from rlany.errors import RlanyError


class OpenAIEngine:
    name = "openai"

    def __init__(self, cfg: EngineConfig):
        if not cfg.base_url:
            raise RlanyError("the openai engine needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        self.model = cfg.model
        self.base_url = cfg.base_url.rstrip("/")
        self.api_key = cfg.api_key
        self.timeout_s = cfg.timeout_s
        self.retries = cfg.retries
        self.stats = EngineStats()
        self._adapters: dict[str, str] = {}

    def _post(self, path: str, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode()
        delay = 1.0
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.base_url + path, data=data, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    text = resp.read().decode()
                    return json.loads(text) if text.strip().startswith("{") else {}
            except urllib.error.HTTPError as e:
                retryable = e.code == 429 or e.code >= 500
                detail = e.read().decode(errors="replace")[:200]
                if not retryable or attempt == self.retries:
                    raise RlanyError(f"HTTP {e.code} from {path}: {detail}",
                                     where=self.base_url) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                if attempt == self.retries:
                    raise RlanyError(f"cannot reach the server: {e}", where=self.base_url) from None
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _model_name(self, adapter: str | None) -> str:
        if adapter is None:
            return self.model
        path = str(Path(adapter).resolve())
        if path not in self._adapters:
            name = "rlany-" + hashlib.sha256(path.encode()).hexdigest()[:12]
            self._post("/load_lora_adapter", {"lora_name": name, "lora_path": path})
            self._adapters[path] = name
        return self._adapters[path]

    def _one(self, r: Request) -> Result:
        body = {"model": self._model_name(r.adapter), "messages": inline_images(r.messages),
                "n": r.sampling.n,
                "max_tokens": r.sampling.max_tokens, "temperature": r.sampling.temperature,
                "top_p": r.sampling.top_p}
        if r.sampling.stop:
            body["stop"] = list(r.sampling.stop)
        if r.sampling.seed is not None:
            body["seed"] = r.sampling.seed
        if r.sampling.logprobs:
            body["logprobs"] = True
        out = self._post("/chat/completions", body)
        completions = []
        for choice in sorted(out.get("choices", []), key=lambda c: c.get("index", 0)):
            content = (choice.get("logprobs") or {}).get("content") or []
            logprobs = [c["logprob"] for c in content] if r.sampling.logprobs else None
            completions.append(Completion(
                text=choice["message"].get("content") or "", token_ids=[0] * len(content),
                finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
                logprobs=logprobs))
        usage = out.get("usage") or {}
        if completions and not r.sampling.logprobs:  # count tokens from usage instead
            per = usage.get("completion_tokens", 0) // len(completions)
            for c in completions:
                c.token_ids = [0] * per
        return Result(prompt_token_ids=[0] * usage.get("prompt_tokens", 0),
                      completions=completions)

    def generate(self, requests: Sequence[Request]) -> list[Result]:
        start = time.perf_counter()
        for r in requests:  # load adapters before the parallel calls
            self._model_name(r.adapter)
        with ThreadPoolExecutor(max_workers=16) as pool:
            results = list(pool.map(self._one, requests))
        self.stats.add(requests, results, time.perf_counter() - start)
        return results

    def close(self) -> None:
        pass


def inline_images(messages: list[dict]) -> list[dict]:
    """The messages with every file:// image part replaced by a base64 data: URL."""
    def part(p):
        url = p.get("image_url", {}).get("url", "") if isinstance(p, dict) else ""
        if p.get("type") != "image_url" or not url.startswith("file://"):
            return p
        path = Path(urllib.request.url2pathname(url[len("file://"):]))
        try:
            data = base64.b64encode(path.read_bytes()).decode()
        except OSError as e:
            raise RlanyError(f"cannot read image: {e.strerror}", where=str(path)) from None
        mime = mimetypes.guess_type(path.name)[0] or "image/png"
        return {**p, "image_url": {**p["image_url"], "url": f"data:{mime};base64,{data}"}}
    return [{**m, "content": [part(p) for p in m["content"]]}
            if isinstance(m.get("content"), list) else m for m in messages]

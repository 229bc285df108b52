"""Scripted outputs for tests: deterministic, order-independent, no model.

A response is chosen by rule: the first rule whose `match` substring occurs in the last
message (or a rule without `match`) gives a list of responses, and sample k of a request
takes `responses[(h + k) % len]` where h is a stable hash of the messages and the seed.
A script file is JSON: `{"rules": [{"match": "...", "responses": ["..."]}, ...]}` or a bare
list of responses. Tests may pass any callable `responder(request, k) -> str` instead.
Every call is recorded (`calls`), so tests can count batched generate calls. With
`Sampling.choices`, a response outside the choices is replaced by one of them.
A stop string cuts a response (`stop_reason`); a later constrained request (choices) that
continues the cut text (`continuation_text`) continues the same scripted response, so a
scripted judge's `\\boxed{-1}` survives constrained verdict decoding (choices that begin
the rest win).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rlany.chat import text_of
from rlany.engines.base import Completion, EngineStats, Request, Result
from rlany.errors import RlanyError

SCRIPT_NAME = "fake_script.json"


class FakeEngine:
    name = "fake"
    real_token_ids = False  # token_ids count words; stages record no ids from this engine

    def __init__(self, responder: Callable[[Request, int], str], model: str = "fake",
                 seed: int = 0):
        self.responder = responder
        self.model = model
        self.seed = seed
        self.stats = EngineStats()
        self.calls: list[list[Request]] = []
        # (messages, text before a stop string) -> the rest of each response cut there
        self._cut: dict[str, list[str]] = {}

    @classmethod
    def from_rules(cls, rules: list[dict], model: str = "fake", seed: int = 0) -> FakeEngine:
        def respond(request: Request, k: int) -> str:
            last = text_of(request.messages[-1]["content"]) if request.messages else ""
            for rule in rules:
                if rule.get("match", "") in last:
                    h = _stable_hash(request.messages, request.sampling.seed or seed)
                    responses = rule["responses"]
                    return responses[(h + k) % len(responses)]
            return ""
        return cls(respond, model=model, seed=seed)

    @classmethod
    def from_file(cls, path: str, seed: int = 0) -> FakeEngine:
        """A script file, or a directory holding `fake_script.json` (e.g. a tiny model's
        directory: one `--model` then serves the fake engine and the trainer)."""
        file = Path(path) / SCRIPT_NAME if Path(path).is_dir() else Path(path)
        try:
            script = json.loads(file.read_text())
        except (OSError, ValueError, RecursionError) as e:
            raise RlanyError(f"cannot read fake engine script: {e}", where=path) from None
        rules = [{"responses": script}] if isinstance(script, list) else (
            script.get("rules") if isinstance(script, dict) else None)

        def well_formed(rule) -> bool:
            return (isinstance(rule, dict) and isinstance(rule.get("match", ""), str)
                    and isinstance(rule.get("responses"), list) and bool(rule["responses"])
                    and all(isinstance(r, str) for r in rule["responses"]))
        if not isinstance(rules, list) or not rules or not all(map(well_formed, rules)):
            raise RlanyError("a fake script is a list of responses or {\"rules\": [{\"match\":"
                             " str, \"responses\": [str, ...]}]}", where=path)
        return cls.from_rules(rules, model=path, seed=seed)

    def generate(self, requests: Sequence[Request]) -> list[Result]:
        start = time.perf_counter()
        self.calls.append(list(requests))
        results = []
        for r in requests:
            prompt = [0] * sum(len(text_of(m["content"]).split()) + 4 for m in r.messages)
            completions = []
            for k in range(r.sampling.n):
                text = self.responder(r, k)
                cut = r.sampling.choices and self._cut.get(json.dumps([r.messages,
                                                                      r.continuation_text]))
                if cut:  # a constrained continuation of a cut response: the script goes on
                    text = cut.pop(0)
                if r.sampling.choices and text not in r.sampling.choices:
                    # constrained decoding: a scripted answer outside the choices becomes
                    # the choice it begins with, or one of them (stable per request, sample)
                    h = _stable_hash(r.messages, (r.sampling.seed or self.seed) + k)
                    text = next((c for c in r.sampling.choices if text.lstrip().startswith(c)),
                                r.sampling.choices[h % len(r.sampling.choices)])
                reason = min((s for s in r.sampling.stop if s in text), key=text.find,
                             default=None)
                if reason is not None:
                    before, text = text[:text.find(reason)], text[text.find(reason):]
                    self._cut.setdefault(json.dumps([r.messages, before]), []).append(text)
                    text = before
                words = text.split()[: r.sampling.max_tokens]
                completions.append(Completion(
                    text=text, token_ids=list(range(len(words))), finish_reason="stop",
                    logprobs=[-1.0] * len(words) if r.sampling.logprobs else None,
                    stop_reason=reason))
            results.append(Result(prompt_token_ids=prompt, completions=completions))
        self.stats.add(requests, results, time.perf_counter() - start)
        return results

    def close(self) -> None:
        pass


def _stable_hash(messages: list[dict], seed: int) -> int:
    data = json.dumps([messages, seed], sort_keys=True).encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")

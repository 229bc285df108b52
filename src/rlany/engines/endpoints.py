"""Generation on several OpenAI-compatible endpoints (`--engine openai --base-url
URL1,URL2,...`): e.g. one `vllm serve` per GPU or per node, without a router.

Each endpoint is an `OpenAIEngine` of its own. Every adapter a batch uses is hot-loaded and
verified (`rlany.probe`) on every endpoint before any request is sent: a worker that serves
a stale or different adapter fails the stage in one line naming its URL, never rolls out
another policy. Requests are dealt round-robin in order (request k to endpoint k mod N)
and the results come back in the requests' order; each request carries its own sampling
seed, so which endpoint served it does not change what a seeded server samples. A single
router URL (vLLM's own data parallelism or router) is simply one endpoint.
"""

from __future__ import annotations

import ipaddress
import re
import time
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rlany.engines.base import EngineConfig, EngineStats, Request, Result
from rlany.errors import RlanyError

_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")  # a name or IPv4


def split_urls(base_url: str | None, name: str = "--base-url") -> list[str]:
    """The endpoints of a --base-url value: one URL, or several separated by commas, each
    an http(s) URL with a host (a name, an IPv4 or a bracketed IPv6 address: never one
    that begins with `-`, which a launcher's ssh line would read as an option) and an
    optional port; an endpoint named twice is refused (`name`: the flag or key)."""
    urls = [u.strip() for u in (base_url or "").split(",") if u.strip()]
    for url in urls:
        problem = _url_problem(url)
        if problem:
            raise RlanyError(f"{name}: {url[:80]!r} {problem}",
                             hint="e.g. http://127.0.0.1:8000/v1")
    if len(set(urls)) != len(urls):
        raise RlanyError(f"{name} names an endpoint twice: {base_url[:200]}")
    return urls


def _url_problem(url: str) -> str | None:
    """What keeps `url` from being a server's http(s) URL, or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port  # a bad port raises
    except ValueError as e:  # "Invalid IPv6 URL", a port out of range
        return f"is not a URL ({e})"
    if parts.scheme not in ("http", "https"):
        return (f"is not an http(s) URL (scheme {parts.scheme!r})" if parts.scheme else
                "has no scheme: give http://HOST:PORT/v1")
    if not host:
        return "has no host"
    if "[" in parts.netloc:
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            return f"has a host that is no IPv6 address: [{host}]"
    elif host.startswith("-"):
        return "has a host that begins with '-'"
    elif not _HOST.fullmatch(host):
        return f"has a host that is no host name: {host[:40]!r}"
    return None if port is None or port > 0 else "has port 0"


class Endpoints:
    """N OpenAIEngines behind the Engine protocol (the module doc's rules)."""

    name = "openai"

    def __init__(self, cfg: EngineConfig):
        from rlany.engines.openai import OpenAIEngine
        from rlany.probe import Verifier

        self.model = cfg.model
        self.urls = split_urls(cfg.base_url)
        self.engines = [OpenAIEngine(replace(cfg, base_url=u)) for u in self.urls]
        self.stats = EngineStats()
        self.probes = Verifier()  # the sidecar's adapter_checks: every endpoint's
        self.base_url = ",".join(self.urls)

    @property
    def real_token_ids(self) -> bool:
        return all(e.real_token_ids for e in self.engines)

    def _load(self, adapter: str | None) -> None:
        """Load and verify `adapter` on every endpoint (each raises, naming its URL)."""
        for e in self.engines:
            before = len(e.probes.checks)
            e._model_name(adapter)
            self.probes.checks += [{**c, "endpoint": e.base_url}
                                   for c in e.probes.checks[before:]]

    def generate(self, requests: Sequence[Request]) -> list[Result]:
        start = time.perf_counter()
        for adapter in dict.fromkeys(r.adapter for r in requests):
            self._load(adapter)
        n = len(self.engines)
        parts = [[r for k, r in enumerate(requests) if k % n == i] for i in range(n)]
        with ThreadPoolExecutor(max_workers=n) as pool:
            answers = list(pool.map(lambda i: self.engines[i].generate(parts[i])
                                    if parts[i] else [], range(n)))
        results = [answers[k % n][k // n] for k in range(len(requests))]
        self.stats.add(requests, results, time.perf_counter() - start)
        return results

    def decode(self, ids: list[int]) -> str:
        return self.engines[0].decode(ids)

    def close(self) -> None:
        for e in self.engines:
            e.close()

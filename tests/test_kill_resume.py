"""SIGKILL at a known point of a stage's writing, then a rerun: the output equals a run that
was never interrupted, byte for byte (rollout with the fake and the hf engine, judge, score,
eval), and `train-policy` ends where an uninterrupted run ends (tiny model, CPU).

The kill is placed, not timed: the test hook `RLANY_TEST_PAUSE=POINT:N:MARKER`
(`rlany._testhook`) stops the process at the N-th time it reaches POINT and writes MARKER;
the test waits for the marker, kills the process with SIGKILL, and first checks that the
kill landed mid-write (the partial output holds exactly what the point says), so a kill
during start-up cannot pass for one. docs/guarantees.md lists the kill points held here;
the hf and training tests are in `make test-slow`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import make_judgment, make_traj, write_jsonl
from rlany.envs.reasoning import make_tasks
from rlany.stages.score import ScoreOptions, score_group


def rlany(*args) -> list[str]:
    return [sys.executable, "-m", "rlany", *map(str, args)]


def _env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "RLANY_DEBUG": "", **extra}


def finish(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def paused(argv: list[str], point: str, n: int, where: Path) -> subprocess.Popen:
    """Start `argv` with the hook set; return once it stopped at the N-th `point`."""
    marker = where / f"marker.{point}.{n}"
    log = open(where / f"stderr.{point}.{n}", "w")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log,
                            env=_env(RLANY_TEST_PAUSE=f"{point}:{n}:{marker}"))
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert proc.poll() is None, f"exited {proc.returncode} before {point} {n}: " + \
            (where / f"stderr.{point}.{n}").read_text()[-3000:]
        assert time.monotonic() < deadline, f"never reached {point} {n}"
        time.sleep(0.01)
    return proc


def sigkill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def groups_indexed(out: Path) -> int:
    """Complete groups the resumable output's index records (its first line is the header)."""
    return len(lines(out.with_name(out.name + ".partial.idx"))) - 1


def clean(folder: Path) -> None:
    """Nothing left behind by the killed run: no partial output, temp file or lock."""
    left = [p.name for p in folder.iterdir() if p.name.endswith((".partial", ".partial.idx",
                                                                 ".tmp", ".lock"))]
    assert not left, left


# -- rollout and judge: resumable outputs ----------------------------------------------

N, BATCH = 3, 2  # episodes per task, tasks per batch: a kill can land inside a batch


@pytest.fixture
def tasks_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "tasks.jsonl", make_tasks(10, seed=9))


@pytest.fixture
def fake_script(tmp_path) -> Path:
    path = tmp_path / "fake.json"
    path.write_text(json.dumps({"rules": [
        {"match": "## The agent", "responses": ["ok \\boxed{+1}", "bad \\boxed{-1}", "?"]},
        {"responses": ["\\boxed{7}", "\\boxed{12}", "I do not know"]}]}))
    return path


def _rollout(tasks: Path, out: Path, model: Path | str, *more) -> list[str]:
    return rlany("rollout", "-i", tasks, "-o", out, "--n", N, "--batch-tasks", BATCH,
                 "--model", model, *more)


def _resumes(tmp_path: Path, make_argv, out_name: str, point: str, k: int, per_group: int,
             expected: bytes) -> None:
    """Kill at the k-th `point` of a run into a fresh folder, check the partial output,
    rerun, compare with `expected`."""
    d = tmp_path / f"{point}-{k}"
    d.mkdir()
    out = d / out_name
    sigkill(paused(make_argv(out), point, k, d))
    partial = out.with_name(out.name + ".partial")
    assert not out.exists() and partial.exists()
    # the kill landed mid-write: k groups on disk; "group" has indexed all k, "group-data"
    # k - 1 (the k-th group's bytes are there, its index line is not: a torn group)
    assert len(lines(partial)) == k * per_group
    assert groups_indexed(out) == (k if point == "group" else k - 1)
    finish(make_argv(out))
    assert out.read_bytes() == expected, (point, k)
    clean(d)


@pytest.mark.parametrize("point,k", [("group", 1), ("group", 2), ("group-data", 3)])
def test_rollout_killed_mid_write_resumes_byte_identical(tmp_path, tasks_file, fake_script,
                                                         point, k):
    def argv(out):
        return _rollout(tasks_file, out, fake_script, "--engine", "fake")
    ref = tmp_path / "ref.jsonl"
    finish(argv(ref))
    _resumes(tmp_path, argv, "traj.jsonl", point, k, N, ref.read_bytes())


@pytest.mark.parametrize("point,k", [("group", 1), ("group-data", 2)])
def test_judge_killed_mid_write_resumes_byte_identical(tmp_path, tasks_file, fake_script,
                                                       point, k):
    traj = tmp_path / "traj.jsonl"
    finish(_rollout(tasks_file, traj, fake_script, "--engine", "fake"))

    def argv(out):
        return rlany("judge", "-i", traj, "-o", out, "--engine", "fake", "--model",
                     fake_script, "--batch-trajectories", 4)
    ref = tmp_path / "ref.jsonl"
    finish(argv(ref))
    _resumes(tmp_path, argv, "judg.jsonl", point, k, N, ref.read_bytes())


HF = ("--engine", "hf", "--dtype", "float32", "--max-tokens", 6)


@pytest.mark.slow  # three hf runs: 20 to 25 s on 2 cores
def test_rollout_with_hf_killed_mid_batch_resumes_byte_identical(tmp_path, tasks_file,
                                                                 tiny_model):
    """The hf engine on the tiny model (sampled, temperature 1): killed after the first
    task's group of a two-task batch, then rerun: the uninterrupted run's bytes (the batch
    is played again whole: hf draws a batch's samples together, `stages.resume`)."""
    def argv(out):
        return _rollout(tasks_file, out, tiny_model, *HF)
    ref = tmp_path / "ref.jsonl"
    finish(argv(ref))
    _resumes(tmp_path, argv, "traj.jsonl", "group", 3, N, ref.read_bytes())


@pytest.mark.slow
def test_judge_with_hf_killed_mid_batch_resumes_byte_identical(tmp_path, tasks_file,
                                                               fake_script, tiny_model):
    traj = tmp_path / "traj.jsonl"
    finish(_rollout(tasks_file, traj, fake_script, "--engine", "fake"))

    def argv(out):
        return rlany("judge", "-i", traj, "-o", out, "--model", tiny_model, "--m", 2,
                     "--batch-trajectories", 6, *HF)
    ref = tmp_path / "ref.jsonl"
    finish(argv(ref))
    _resumes(tmp_path, argv, "judg.jsonl", "group", 1, N, ref.read_bytes())


# -- score and eval: atomic outputs, rerun from the start ------------------------------

def test_score_killed_mid_write_reruns_byte_identical(tmp_path):
    trajs = [make_traj(f"t{k}", i, 1 if (i + k) % 3 else -1, n_steps=2)
             for k in range(30) for i in range(4)]
    t = write_jsonl(tmp_path / "trajs.jsonl", trajs)
    j = write_jsonl(tmp_path / "judg.jsonl", [make_judgment(x, [[1, -1, 0], [1, 1, -1]])
                                              for x in trajs])

    def argv(d):
        return rlany("score", "-i", t, "-j", j, "-o", d / "scored.jsonl")
    (tmp_path / "ref").mkdir()
    finish(argv(tmp_path / "ref"))
    names = ("scored.jsonl", "task_stats.jsonl")
    expected = [(tmp_path / "ref" / n).read_bytes() for n in names]
    stats = len(lines(tmp_path / "ref" / "task_stats.jsonl"))
    # per task its 4 scored records, then its stats record: the 7th record is the second
    # task's 2nd scored one; the last is the last stats record (then both are renamed)
    for k, name, flushed in ((7, "scored.jsonl", 6), (5 * stats, "task_stats.jsonl", stats)):
        d = tmp_path / f"kill{k}"
        d.mkdir()
        sigkill(paused(argv(d), "record", k, d))
        assert len(list(d.glob(".*.tmp"))) == 2  # the two files are written side by side
        assert not any((d / n).exists() for n in names)  # both or neither
        (temp,) = d.glob(f".{name}.*.tmp")
        assert len(lines(temp)) == flushed
        finish(argv(d))
        assert [(d / n).read_bytes() for n in names] == expected, k
        clean(d)


def test_eval_killed_mid_write_reruns_identical(tmp_path, tasks_file, fake_script):
    def argv(d):
        return rlany("eval", "-i", tasks_file, "-o", d / "eval.json", "--engine", "fake",
                     "--model", fake_script, "--n", N, "--trajectories", d / "traj.jsonl")

    def summary(d):
        s = json.loads((d / "eval.json").read_text())
        s.pop("wall_time_s")
        return s
    (tmp_path / "ref").mkdir()
    finish(argv(tmp_path / "ref"))
    d = tmp_path / "kill"
    d.mkdir()
    sigkill(paused(argv(d), "record", 7, d))
    (temp,) = d.glob(".traj.jsonl.*.tmp")
    assert len(lines(temp)) == 7 and not (d / "traj.jsonl").exists()
    assert not (d / "eval.json").exists()
    finish(argv(d))
    assert (d / "traj.jsonl").read_bytes() == (tmp_path / "ref" / "traj.jsonl").read_bytes()
    assert summary(d) == summary(tmp_path / "ref")
    clean(d)


# -- train-policy: resumes from its last saved optimizer step ----------------------------

def _scored(tmp_path: Path) -> Path:
    groups = []
    for task in range(8):  # 8 mixed-outcome tasks x 4 rollouts: 32 samples
        trajs = [make_traj(f"t{task}", i, +1 if i < 2 else -1) for i in range(4)]
        scored, _ = score_group([(f"x:{i}", t, None) for i, t in enumerate(trajs)],
                                ScoreOptions())
        groups += scored
    return write_jsonl(tmp_path / "scored.jsonl", groups)


def _train(tiny_model: str, data: Path, out: Path) -> list[str]:
    return rlany("train-policy", "-i", data, "-o", out, "--model", tiny_model,
                 "--micro-batch", 1, "--grad-accum", 1, "--lr", "1e-2", "--dtype", "float32",
                 "--save-every", 1, "--seed", 0)


def _weights(out: Path) -> dict:
    return load_file(str(out / "adapter_model.safetensors"))


@pytest.mark.slow  # three trainings of 32 steps: 20 to 40 s on 2 cores
def test_train_policy_resumes_after_sigkill_mid_training(tiny_model, tmp_path):
    """Killed right after it saved its state at step 3 (the hook holds it there), rerun:
    it resumes from step 3 and ends where an uninterrupted run ends, within fp32 kernel
    noise (a lost optimizer state or step moves weights by ~1e-3 at lr 1e-2)."""
    import torch

    data = _scored(tmp_path)
    full = tmp_path / "full"
    finish(_train(tiny_model, data, full))
    steps = json.loads((full / "rlany.json").read_text())["metrics"]["steps"]
    assert steps >= 30

    out = tmp_path / "killed"
    sigkill(paused(_train(tiny_model, data, out), "state", 3, tmp_path))
    # the kill landed mid-training: step 3 saved, no checkpoint
    state = out.with_name("killed.partial") / "state.json"
    assert not out.exists() and json.loads(state.read_text())["step"] == 3

    finish(_train(tiny_model, data, out))
    logs = [json.loads(x) for x in lines(out.with_name("killed.metrics.jsonl"))]
    assert logs[0]["event"] == "resume" and logs[0]["step"] == 3
    assert [r["step"] for r in logs[1:]] == list(range(4, steps + 1))
    a, b = _weights(out), _weights(full)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=2.5e-4, msg=key)

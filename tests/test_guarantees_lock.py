"""One writer per output, and the re-check once the lock is held (`rlany.files.locks`).

The race: process B passed its up-front checks and started (its engine, its model) while
process A was still writing the same output; A finishes and lets go of the lock; B takes
it. B must then see that A finished, and neither redo A's work nor replace its output. The
test hook `RLANY_TEST_PAUSE=lock:1:MARKER` (`rlany._testhook`) holds B just before it takes
the lock, so the interleaving is placed, not timed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import make_traj, write_jsonl
from rlany.envs.reasoning import make_tasks
from rlany.stages.score import ScoreOptions, score_group
from test_kill_resume import finish, paused, rlany, sigkill


def _go(proc: subprocess.Popen, where: Path, point: str = "lock") -> tuple[int, str]:
    """Let the process held at `point` go on; (its exit code, its stderr)."""
    (where / f"marker.{point}.1.go").touch()
    code = proc.wait(timeout=600)
    return code, (where / f"stderr.{point}.1").read_text()


def _state(path: Path) -> tuple:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, path.read_bytes()


@pytest.fixture
def stage(request, tmp_path):
    """argv of a fake-engine rollout, or judge, of 6 tasks x 2 episodes into `out`."""
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(6, seed=3))
    script = tmp_path / "fake.json"
    script.write_text(json.dumps(["\\boxed{7}", "\\boxed{+1}", "no"]))

    def rollout(out):
        return rlany("rollout", "-i", tasks, "-o", out, "--engine", "fake", "--model", script,
                     "--n", 2, "--batch-tasks", 2)
    if request.param == "rollout":
        return rollout
    traj = tmp_path / "traj.jsonl"
    finish(rollout(traj))
    return lambda out: rlany("judge", "-i", traj, "-o", out, "--engine", "fake", "--model",
                             script, "--batch-trajectories", 4)


@pytest.mark.parametrize("stage", ["rollout", "judge"], indirect=True)
def test_a_writer_that_waited_for_the_lock_finds_the_output_finished(tmp_path, stage):
    out = tmp_path / "out.jsonl"
    b = paused(stage(out), "lock", 1, tmp_path)  # checked, engine started, lock not taken
    finish(stage(out))  # A: the whole output, and its sidecar
    before = (_state(out), _state(tmp_path / "out.meta.json"))
    code, err = _go(b, tmp_path)
    assert code == 1 and "another process finished this output" in err.splitlines()[-1], err
    assert (_state(out), _state(tmp_path / "out.meta.json")) == before  # not made again
    assert not [p.name for p in tmp_path.iterdir() if ".partial" in p.name or
                p.name.endswith(".lock")]


@pytest.mark.parametrize("stage", ["rollout", "judge"], indirect=True)
def test_a_writer_that_waited_for_the_lock_resumes_what_a_killed_one_left(tmp_path, stage):
    """A killed with two task groups written: B, once it holds the lock, keeps them (it
    says so) and writes the rest, the same bytes as a run never interrupted."""
    ref = tmp_path / "ref.jsonl"
    finish(stage(ref))
    out = tmp_path / "out.jsonl"
    b = paused(stage(out), "lock", 1, tmp_path)
    sigkill(paused(stage(out), "group", 2, tmp_path))
    code, err = _go(b, tmp_path)
    assert code == 0, err
    assert "resuming, 2" in err and out.read_bytes() == ref.read_bytes()


@pytest.mark.parametrize("stage", ["rollout"], indirect=True)
def test_a_second_writer_fails_at_once_while_the_first_holds_the_lock(tmp_path, stage):
    out = tmp_path / "out.jsonl"
    a = paused(stage(out), "group", 1, tmp_path)  # A holds the lock, one group written
    b = subprocess.run(stage(out), capture_output=True, text=True,
                       env={**os.environ, "RLANY_DEBUG": ""}, timeout=600)
    assert b.returncode == 1 and "another rlany process is writing this output" in b.stderr
    code, err = _go(a, tmp_path, "group")
    assert code == 0, err


@pytest.mark.slow  # a training and a trainer's start: about 25 s on 2 cores
def test_a_trainer_that_waited_for_the_lock_finds_the_checkpoint_finished(tmp_path,
                                                                         tiny_model):
    """train-policy's checkpoint directory is re-checked once its lock is held."""
    trajs = [make_traj("q", i, +1 if i < 2 else -1) for i in range(4)]
    scored, _ = score_group([(f"x:{i}", t, None) for i, t in enumerate(trajs)],
                            ScoreOptions())
    data = write_jsonl(tmp_path / "scored.jsonl", scored)
    out = tmp_path / "ckpt"

    def train():
        return rlany("train-policy", "-i", data, "-o", out, "--model", tiny_model,
                     "--dtype", "float32", "--micro-batch", 4, "--grad-accum", 1)
    b = paused(train(), "lock", 1, tmp_path)
    finish(train())
    before = (_state(out / "rlany.json"), _state(tmp_path / "ckpt.metrics.jsonl"))
    code, err = _go(b, tmp_path)
    assert code == 1 and "exists: another process finished it" in err.splitlines()[-1], err
    assert (_state(out / "rlany.json"), _state(tmp_path / "ckpt.metrics.jsonl")) == before
    assert not (tmp_path / "ckpt.partial").exists()

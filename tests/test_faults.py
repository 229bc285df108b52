"""Fault injection: SIGKILL a stage at random points, rerun it, and compare with a run that
was never interrupted: identical output, no partial or duplicate records, no temp files.
A few kill points in the default suite; 20 per stage with `make test-slow`."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import make_judgment, make_traj, write_jsonl
from rlany.envs.reasoning import make_tasks

FAST_POINTS, SLOW_POINTS = 3, 20


def rlany(*args):
    return [sys.executable, "-m", "rlany", *args]


def run_killed(cmd, delay):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "RLANY_DEBUG": ""})
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def finish(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def reference(cmd):
    start = time.perf_counter()
    finish(cmd)
    return time.perf_counter() - start


def check_kill_points(tmp_path, make_cmd, points, outputs):
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    duration = reference(make_cmd(ref_dir))
    expected = {name: (ref_dir / name).read_bytes() for name in outputs}
    rng = random.Random(len(outputs) * 1000 + points)
    for k in range(points):
        d = tmp_path / f"kill{k}"
        d.mkdir()
        cmd = make_cmd(d)
        for _ in range(2):   # kill it twice at random points, then let it finish
            run_killed(cmd, rng.uniform(0.05, 1.0) * duration)
        finish(cmd)
        for name in outputs:
            assert (d / name).read_bytes() == expected[name], (k, name)
            lines = (d / name).read_text().splitlines()
            ids = [json.loads(x).get("traj_id") or json.loads(x).get("task_id") for x in lines]
            assert len(ids) == len(set(ids)) or name.startswith("task_stats")
        assert not list(d.glob(".*.tmp")) and not list(d.glob("*.partial*")), k


@pytest.fixture
def tasks_file(tmp_path):
    return write_jsonl(tmp_path / "tasks.jsonl", make_tasks(120, seed=9))


@pytest.fixture
def fake_script(tmp_path):
    path = tmp_path / "fake.json"
    path.write_text(json.dumps({"rules": [
        {"match": "## The agent", "responses": ["ok \\boxed{+1}", "bad \\boxed{-1}", "?"]},
        {"responses": ["\\boxed{7}", "\\boxed{12}", "I do not know"]}]}))
    return path


def _rollout_cmd(tasks, script):
    return lambda d: rlany("rollout", "-i", str(tasks), "-o", str(d / "traj.jsonl"), "--engine",
                          "fake", "--model", str(script), "--n", "4", "--batch-tasks", "2")


def _judge_cmd(traj, script):
    return lambda d: rlany("judge", "-i", str(traj), "-o", str(d / "judg.jsonl"), "--engine",
                          "fake", "--model", str(script), "--batch-trajectories", "8")


def _score_inputs(tmp_path):
    trajs = [make_traj(f"t{k}", i, 1 if (i + k) % 3 else -1, n_steps=2)
             for k in range(3000) for i in range(4)]
    t = write_jsonl(tmp_path / "strajs.jsonl", trajs)
    j = write_jsonl(tmp_path / "sjudg.jsonl", [make_judgment(x, [[1, -1, 0], [1, 1, -1]])
                                               for x in trajs])
    return lambda d: rlany("score", "-i", str(t), "-j", str(j), "-o", str(d / "scored.jsonl"))


def test_rollout_survives_kills(tmp_path, tasks_file, fake_script):
    check_kill_points(tmp_path, _rollout_cmd(tasks_file, fake_script), FAST_POINTS,
                      ["traj.jsonl"])


def test_judge_survives_kills(tmp_path, tasks_file, fake_script):
    finish(_rollout_cmd(tasks_file, fake_script)(tmp_path))
    check_kill_points(tmp_path, _judge_cmd(tmp_path / "traj.jsonl", fake_script), FAST_POINTS,
                      ["judg.jsonl"])


@pytest.mark.slow  # 40 s; score's kills mid-write are confirmed in test_kill_resume.py
def test_score_survives_kills(tmp_path):
    check_kill_points(tmp_path, _score_inputs(tmp_path), 2,
                      ["scored.jsonl", "task_stats.jsonl"])


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["rollout", "judge", "score"])
def test_twenty_kill_points_per_stage(stage, tmp_path, tasks_file, fake_script):
    if stage == "rollout":
        check_kill_points(tmp_path, _rollout_cmd(tasks_file, fake_script), SLOW_POINTS,
                          ["traj.jsonl"])
    elif stage == "judge":
        finish(_rollout_cmd(tasks_file, fake_script)(tmp_path))
        check_kill_points(tmp_path, _judge_cmd(tmp_path / "traj.jsonl", fake_script),
                          SLOW_POINTS, ["judg.jsonl"])
    else:
        check_kill_points(tmp_path, _score_inputs(tmp_path), SLOW_POINTS,
                          ["scored.jsonl", "task_stats.jsonl"])


def test_outputs_are_byte_identical_across_runs(tmp_path, tasks_file, fake_script):
    """Determinism: with the fake engine and a fixed seed every stage's output repeats."""
    outs = []
    for k in range(2):
        d = tmp_path / f"run{k}"
        d.mkdir()
        finish(_rollout_cmd(tasks_file, fake_script)(d))
        finish(_judge_cmd(d / "traj.jsonl", fake_script)(d))
        finish(rlany("score", "-i", str(d / "traj.jsonl"), "-j", str(d / "judg.jsonl"), "-o",
                     str(d / "scored.jsonl")))
        outs.append([(d / n).read_bytes() for n in ("traj.jsonl", "judg.jsonl", "scored.jsonl",
                                                   "task_stats.jsonl")])
    assert outs[0] == outs[1]


LOOP_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_loop import responder
from rlany.engines.fake import FakeEngine
from rlany.loop.loop import Loop, load_config
cfg = load_config({config!r})
loop = Loop(cfg, {config!r})
loop.executor.engine = FakeEngine(responder, model="fake")
loop.run()
"""

LOOP_OUTPUTS = ("rollout_tasks.jsonl", "trajectories.jsonl", "judgments.jsonl", "scored.jsonl",
                "task_stats.jsonl", "next_tasks.jsonl", "candidates.jsonl", "decisions.jsonl")


@pytest.mark.slow
def test_loop_survives_sigkill_at_random_points(tmp_path, tiny_model):
    from pathlib import Path

    from test_loop import _config

    tests_dir = str(Path(__file__).parent)

    def loop_cmd(folder):
        folder.mkdir(exist_ok=True)
        config = _config(folder, tiny_model, keep_last=2)
        return [sys.executable, "-c", LOOP_SCRIPT.format(tests=tests_dir, config=config)]

    def outputs(folder):
        run = folder / "runs" / "t"
        # adapter paths name the run's own folder: compare with that folder abstracted
        return {f"{d.name}/{n}": (d / n).read_bytes().replace(str(folder).encode(), b"<root>")
                for d in sorted(run.glob("iter_*")) for n in LOOP_OUTPUTS if (d / n).exists()}

    ref = tmp_path / "ref"
    duration = reference(loop_cmd(ref))
    expected = outputs(ref)
    rng = random.Random(7)
    for k in range(SLOW_POINTS):
        folder = tmp_path / f"kill{k}"
        cmd = loop_cmd(folder)
        for _ in range(2):
            run_killed(cmd, rng.uniform(0.1, 1.0) * duration)
        finish(cmd)
        assert outputs(folder) == expected, k
        lines = (folder / "runs" / "t" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["iteration"] for x in lines] == [0, 1]

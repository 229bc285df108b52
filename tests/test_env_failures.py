"""An episode the env could not run is not an episode (rlany.stages.episode_errors).

Through the real CLI in a subprocess, with test envs registered in it: an env whose reset
always raises fails rollout and eval in one line before anything is written; episodes that
error now and then are counted apart (`errored`) and kept out of eval's rates and out of
score's accuracy and training; above --max-error-share a stage fails in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import make_judgment, make_traj, one_line, read_jsonl, write_jsonl
from rlany.envs import StepResult
from rlany.files.records import Task


class Broken:
    """Cannot start: every reset raises (a browser that is not installed)."""

    name = "broken"

    def reset(self, task):
        raise RuntimeError("chromium is not installed")

    def step(self, response):
        raise AssertionError("never reached")

    def describe(self, task):
        return ""

    def validate(self, spec):
        return []


class Flaky:
    """One step per episode. spec.fail "reset" or "step": the env raises there; otherwise
    the episode succeeds when spec.win, whatever the response."""

    name = "flaky"

    def reset(self, task):
        self.spec = task.spec
        if self.spec.get("fail") == "reset":
            raise ConnectionError("the server went away")
        return "answer"

    def step(self, response):
        if self.spec.get("fail") == "step":
            raise RuntimeError("the page crashed")
        win = bool(self.spec.get("win"))
        return StepResult(obs="done", done=True, success=win, action=response.strip())

    def describe(self, task):
        return ""

    def validate(self, spec):
        return []


def register() -> None:
    from rlany import envs

    envs.register("broken", Broken)
    envs.register("flaky", Flaky)


BOOT = ("import sys; sys.path.insert(0, {here!r}); import test_env_failures as m; "
        "m.register(); from rlany.cli import main; main(sys.argv[1:])")


def rlany(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`rlany ARGS` with the test envs registered, in a subprocess."""
    import os

    code = BOOT.format(here=str(Path(__file__).parent))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "RLANY_DEBUG": ""})


def tasks_file(tmp_path: Path, env: str, specs: list[dict]) -> Path:
    return write_jsonl(tmp_path / "tasks.jsonl", [
        Task(task_id=f"t{k}", env=env, spec=spec, prompt="Go.") for k, spec in enumerate(specs)])


@pytest.fixture
def policy(tmp_path) -> str:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(["go"]))
    return str(path)


def fake(policy: str, *more: str) -> tuple[str, ...]:
    return ("--engine", "fake", "--model", policy, *more)


# (a) an env that cannot start ----------------------------------------------------------

@pytest.mark.parametrize("output", ["traj.jsonl", "-"])
def test_an_env_that_cannot_start_fails_rollout_in_one_line_writing_nothing(
        tmp_path, policy, output):
    tasks = tasks_file(tmp_path, "broken", [{}, {}, {}])
    r = rlany("rollout", "-i", str(tasks), "-o", output, *fake(policy, "--n", "2"),
              cwd=tmp_path)
    line = one_line(r, 1)
    assert "the broken environment could not start" in line, line
    assert "all 6 episodes of the first 3 tasks failed at reset" in line
    assert "task 't0': reset: RuntimeError: chromium is not installed" in line
    assert r.stdout == ""  # -o -: not one trajectory streamed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.json", "tasks.jsonl"]


def test_an_env_that_cannot_start_fails_eval_writing_nothing(tmp_path, policy):
    tasks = tasks_file(tmp_path, "broken", [{}, {}])
    r = rlany("eval", "-i", str(tasks), "-o", "eval.json", "--trajectories", "t.jsonl",
              *fake(policy), cwd=tmp_path)
    line = one_line(r, 1)
    assert "could not start" in line and "chromium is not installed" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.json", "tasks.jsonl"]


def test_an_openenv_url_it_cannot_use_fails_eval_in_one_line(tmp_path, policy):
    """The issue's case with a built-in env: a port out of range (no server involved)."""
    pytest.importorskip("websockets", reason="the openenv env needs websockets")
    spec = {"url": "http://127.0.0.1:99999"}
    tasks = tasks_file(tmp_path, "openenv", [spec, spec])
    r = rlany("eval", "-i", str(tasks), "-o", "eval.json", *fake(policy, "--n", "2"),
              cwd=tmp_path)
    line = one_line(r, 1)
    assert "the openenv environment could not start" in line and "Port out of range" in line
    assert not (tmp_path / "eval.json").exists()


# (b) episodes that error now and then ---------------------------------------------------

FLAKY = [{"win": True}, {"win": True}, {}, {"fail": "step"}, {"fail": "reset"}]


def test_eval_rates_count_only_the_episodes_that_ran(tmp_path, policy):
    tasks = tasks_file(tmp_path, "flaky", FLAKY)
    r = rlany("eval", "-i", str(tasks), "-o", "eval.json", "--trajectories", "t.jsonl",
              *fake(policy, "--n", "2", "--k", "1", "--k", "2"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "eval.json").read_text())
    assert summary["trajectories"] == 6 and summary["errored"] == 4
    assert summary["success_rate"] == pytest.approx(4 / 6)  # not 4 / 10
    assert summary["pass@1"] == pytest.approx(2 / 3) and summary["pass@2"] == pytest.approx(2 / 3)
    per_task = {p["task_id"]: p for p in summary["per_task"]}
    assert per_task["t3"] == {"task_id": "t3", "n": 0, "successes": 0, "errored": 2,
                              "pass@1": None, "pass@2": None}
    assert per_task["t0"]["n"] == 2 and per_task["t0"]["errored"] == 0
    assert "(4 more errored, not counted)" in r.stderr
    written = read_jsonl(tmp_path / "t.jsonl")  # the errored episodes are recorded
    assert len(written) == 10 and sum(t["finish"] == "error" for t in written) == 4
    meta = json.loads((tmp_path / "eval.meta.json").read_text())
    assert meta["counts"]["errored"] == 4 and meta["flags"]["max_error_share"] == 0.5


def test_rollout_records_errored_episodes_and_counts_them_apart(tmp_path, policy):
    tasks = tasks_file(tmp_path, "flaky", FLAKY)
    r = rlany("rollout", "-i", str(tasks), "-o", "traj.jsonl", *fake(policy, "--n", "2"),
              cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trajs = read_jsonl(tmp_path / "traj.jsonl")
    errors = [t for t in trajs if t["finish"] == "error"]
    assert len(trajs) == 10 and len(errors) == 4
    assert {t["error"] for t in errors if "error" in t} == {
        "reset: ConnectionError: the server went away"}
    assert {t["steps"][0]["info"]["error"] for t in errors if t["steps"]} == {
        "step: RuntimeError: the page crashed"}
    counts = json.loads((tmp_path / "traj.meta.json").read_text())["counts"]
    assert counts["errored"] == 4 and counts["success_rate"] == pytest.approx(4 / 6)


def _errored(traj, why="step: RuntimeError: the page crashed"):
    steps = [replace(s, info={"error": why}, action=None) for s in traj.steps]
    return replace(traj, steps=steps, finish="error", outcome=-1)


def test_score_keeps_errored_episodes_out_of_acc_and_training(tmp_path, cli):
    mixed = [make_traj("m", 0, 1), make_traj("m", 1, -1),
             _errored(make_traj("m", 2, -1)), _errored(make_traj("m", 3, -1))]
    dead = [_errored(make_traj("z", k, -1)) for k in range(2)]
    trajs = mixed + dead
    write_jsonl(tmp_path / "traj.jsonl", trajs)
    write_jsonl(tmp_path / "j.jsonl", [make_judgment(t, [[1, -1, 1]]) for t in trajs])
    r = cli("score", "-i", str(tmp_path / "traj.jsonl"), "-j", str(tmp_path / "j.jsonl"),
            "-o", str(tmp_path / "scored.jsonl"))
    assert r.returncode == 0, r.stderr
    scored = {s["traj_id"]: s for s in read_jsonl(tmp_path / "scored.jsonl")}
    for traj in trajs[2:]:
        step = scored[traj.traj_id]["steps"][0]
        assert not step["keep"] and step["advantage"] == 0.0
        assert not any(j["keep"] for j in step["judge"]) and "rm_target" not in step
    ran = [scored[t.traj_id]["steps"][0] for t in mixed[:2]]
    assert all(s["keep"] for s in ran) and [s["advantage"] for s in ran] == [1.0, -1.0]
    assert all(any(j["keep"] for j in s["judge"]) for s in ran)
    assert scored["m/0/0"]["task_acc"] == 0.5
    stats = {s["task_id"]: s for s in read_jsonl(tmp_path / "task_stats.jsonl")}
    assert (stats["m"]["n"], stats["m"]["successes"], stats["m"]["acc"]) == (2, 1, 0.5)
    assert (stats["m"]["errored"], stats["m"]["ran"]) == (2, 2)
    z = stats["z"]
    assert (z["ran"], z["errored"], z["policy_keep"], z["rm_keep"]) == (0, 2, False, False)
    assert z["policy_reason"] == "every episode errored: no outcome"
    counts = json.loads((tmp_path / "scored.meta.json").read_text())["counts"]
    assert counts["errored"] == 4 and counts["mean_acc"] == 0.5 and counts["pool_tasks"] == 1


# (c) above --max-error-share --------------------------------------------------------------

STEP_FAILS = [{"fail": "step"}, {"fail": "step"}, {"win": True}, {}]


@pytest.mark.parametrize("stage, output", [("rollout", "traj.jsonl"), ("eval", "eval.json")])
def test_above_max_error_share_the_stage_fails_writing_nothing(tmp_path, policy, stage,
                                                                output):
    tasks = tasks_file(tmp_path, "flaky", STEP_FAILS)
    r = rlany(stage, "-i", str(tasks), "-o", output, "--max-error-share", "0.25",
              *fake(policy, "--n", "1"), cwd=tmp_path)
    line = one_line(r, 1)
    assert "2 of 4 episodes errored, more than --max-error-share 0.25 of them" in line, line
    assert "the first: task 't0': step: RuntimeError: the page crashed" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.json", "tasks.jsonl"]
    r = rlany(stage, "-i", str(tasks), "-o", output, *fake(policy, "--n", "1"),
              cwd=tmp_path)  # the default 0.5 lets 2 of 4 through
    assert r.returncode == 0, r.stderr


def test_a_share_that_cannot_come_back_stops_early(tmp_path, policy):
    tasks = tasks_file(tmp_path, "flaky", STEP_FAILS)
    r = rlany("rollout", "-i", str(tasks), "-o", "traj.jsonl", "--max-error-share", "0.25",
              "--batch-tasks", "1", *fake(policy, "--n", "1"), cwd=tmp_path)
    line = one_line(r, 1)
    assert "(stopped after 2 of 4: the share cannot come back)" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.json", "tasks.jsonl"]


def test_eval_with_no_episode_that_ran_fails_even_at_share_1(tmp_path, policy):
    tasks = tasks_file(tmp_path, "flaky", [{"fail": "step"}] * 2)
    r = rlany("eval", "-i", str(tasks), "-o", "eval.json", "--max-error-share", "1",
              *fake(policy), cwd=tmp_path)
    line = one_line(r, 1)
    assert "no episode ran: all 8 errored" in line, line
    assert not (tmp_path / "eval.json").exists()


def test_max_error_share_is_a_bounded_flag(tmp_path, policy):
    tasks = tasks_file(tmp_path, "flaky", [{}])
    r = rlany("rollout", "-i", str(tasks), "-o", "t.jsonl", "--max-error-share", "1.5",
              *fake(policy), cwd=tmp_path)
    assert one_line(r, 2) == "usage error: --max-error-share must be <= 1, got 1.5"

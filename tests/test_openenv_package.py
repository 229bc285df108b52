"""The `openenv` env against servers written with the `openenv` 0.10 package's own server API
(`openenv_servers/games.py`, run from its own virtualenv: `make openenv-test-servers`): a
plain env played through `rlany rollout --engine fake`; a server's task split read by `rlany
envs make-tasks`; a tool env (MCP tools) played from both call forms, its bad calls shown
back, its calls listed for --constrain-actions where they can be; a one-session server
under `--n 2` (played within the limit) against one another client holds (fails in one
line, nothing written). One server process serves every app of the module."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from conftest import one_line, read_jsonl, write_jsonl

pytest.importorskip("websockets", reason="needs websockets: pip install 'rlany[openenv]'")
from rlany.envs.openenv import OpenenvEnv  # noqa: E402
from rlany.envs.openenv_wire import start_server  # noqa: E402
from rlany.errors import RlanyError  # noqa: E402
from rlany.files.records import Task  # noqa: E402
from test_openenv import free_port, trajectories  # noqa: E402

HERE = Path(__file__).with_name("openenv_servers")
VENV_PY = HERE / ".venv" / "bin" / "python"
pytestmark = pytest.mark.skipif(not VENV_PY.exists(), reason="needs openenv 0.10 in "
                                "tests/openenv_servers/.venv: make openenv-test-servers")
BUSY = ("serves 1 session(s) at once (its max_concurrent_envs), all held by this stage's "
        "episodes: the others wait for one to end")


@pytest.fixture(scope="module")
def base():
    """The server started as a stage starts one (`spec.server`): polled on /health, stopped
    when the test process exits. Importing openenv (fastapi, fastmcp) takes seconds on a
    busy machine: 180 s to answer."""
    port = free_port()
    try:
        url = start_server([str(VENV_PY), str(HERE / "games.py"), "--port", str(port)], port,
                           180)
    except RlanyError as e:
        pytest.fail(str(e))
    return url


def task(spec: dict, task_id: str = "t") -> Task:
    return Task(task_id=task_id, env="openenv", prompt="", spec=spec)


def script(path: Path, rules: list[tuple[str, str]]) -> str:
    """A fake policy answering by what the newest observation holds."""
    path.write_text(json.dumps({"rules": [{"match": m, "responses": [r]} for m, r in rules]}))
    return str(path)


def test_a_plain_env_plays_through_rollout(base, tmp_path, cli):
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "traj.jsonl"
    r = cli("envs", "make-tasks", "openenv", "--n", "2", "--seed", "0", "--knob",
            f"url={base}/guess", "-o", str(tasks))
    assert r.returncode == 0, r.stderr
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(["1", "2", "3", "4", "5"]))
    r = cli("rollout", "-i", str(tasks), "-o", str(out), "--engine", "fake", "--model",
            str(policy), "--n", "2", "--max-steps", "3")
    assert r.returncode == 0, r.stderr
    trajs = trajectories(out)
    assert len(trajs) == 4 and {t["finish"] for t in trajs} <= {"success", "failure",
                                                                 "max_steps"}
    for t in trajs:  # openenv 0.10's empty `metadata` field is not shown
        assert t["steps"][0]["obs"] == "Guess a number from 1 to 5.\nAdmissible actions: " \
                                       "1, 2, 3, 4, 5"
        assert (t["outcome"] == 1) == (t["steps"][-1]["info"]["reward"] == 1.0)


def test_make_tasks_reads_a_servers_task_split(base, tmp_path, cli):
    out = tmp_path / "tasks.jsonl"
    r = cli("envs", "make-tasks", "openenv", "--n", "10", "--knob", f"url={base}/guess",
            "--knob", "server_split=test", "--split", "eval", "-o", str(out))
    assert r.returncode == 0, r.stderr
    tasks = read_jsonl(out)
    assert [t["task_id"] for t in tasks] == ["oe-test-0000", "oe-test-0001", "oe-test-0002"]
    assert [t["spec"]["reset"] for t in tasks] == [{"split": "test", "index": i}
                                                   for i in range(3)]
    assert [t["server_task"] for t in tasks] == ["test-0", "test-1", "test-2"]
    assert {t["split"] for t in tasks} == {"eval"}
    for t, target in zip(tasks, [2, 5, 3]):  # the server plays the task it listed
        env = OpenenvEnv()
        env.reset(task(t["spec"]))
        assert env.step(str(target)).success
    r = cli("envs", "make-tasks", "openenv", "--n", "2", "--knob", f"url={base}/guess",
            "--knob", "server_split=dev", "-o", str(tmp_path / "dev.jsonl"))
    assert one_line(r, 2).endswith(f"the server at {base}/guess has no split 'dev' (its "
                                   "splits: train, test)")
    assert not (tmp_path / "dev.jsonl").exists()
    r = cli("envs", "make-tasks", "openenv", "--n", "2", "--knob", f"url={base}/hangman",
            "--knob", "server_split=train", "-o", str(tmp_path / "none.jsonl"))
    assert "HTTP 501" in one_line(r, 2)  # an env without the Task API


def test_a_tool_env_is_played_through_its_tools(base):
    env = OpenenvEnv()
    obs = env.reset(task({"url": f"{base}/hangman", "reset": {"word": "cat"}}))
    assert obs.startswith("_ _ _\n\nTools (answer with one call, as name(arg=value) or ")
    assert '- guess_letter(letter: "a" | "b" | "c" | "d" | "e" | "f" | ...): Reveal every ' \
           'place the letter takes in the word.\n- solve(word: string): Say the whole word ' \
           '(one try).' in obs
    r = env.step('I will try guess_letter(letter="c")')
    assert (r.action, r.obs, r.done, r.info) == ('guess_letter(letter="c")', "Yes: c _ _",
                                                 False, {"reward": 0.0, "return": 0.0})
    r = env.step('guess_letter(letter="cc")')  # the server's tool refuses it: one line
    assert r.action is None and not r.done and r.obs.endswith("\nYes: c _ _")
    assert r.obs.startswith("The tool call failed: execution_error: 1 validation error for "
                            "call[guess_letter] letter Input should be 'a', 'b'")
    assert r.info["rejected"].startswith("execution_error: ") and "\n" not in r.info["rejected"]
    for bad, why in [("dance()", "no tool is named 'dance' (the tools: guess_letter, solve)"),
                     ("guess_letter()", "guess_letter needs letter"),
                     ("I give up.", "the response holds no tool call")]:
        r = env.step(bad)  # the decoder's: not sent
        assert r.action is None and r.obs.startswith(f"Invalid action: {why}"), r.obs
    r = env.step('{"tool": "guess_letter", "arguments": {"letter": "a"}}')
    assert (r.action, r.obs) == ('guess_letter(letter="a")', "Yes: c a _")
    with pytest.raises(RlanyError, match="tool solve's argument word is free text"):
        env.choices()
    r = env.step('solve("cat")')
    assert (r.action, r.done, r.success, r.info["reward"]) == ('solve(word="cat")', True,
                                                               True, 1.0)


def test_tool_envs_through_rollout_free_and_constrained(base, tmp_path, cli):
    rules = [("Yes: c a _", 'solve(word="cat")'), ("Yes: c _ _", '{"tool": "guess_letter", '
             '"arguments": {"letter": "a"}}'), ("_ _ _", 'guess_letter("c")')]
    tasks = write_jsonl(tmp_path / "tasks.jsonl",
                        [task({"url": f"{base}/hangman", "reset": {"word": "cat"}})])
    out = tmp_path / "traj.jsonl"
    r = cli("rollout", "-i", str(tasks), "-o", str(out), "--engine", "fake", "--model",
            script(tmp_path / "p.json", rules), "--n", "2", "--max-steps", "4")
    assert r.returncode == 0, r.stderr
    for t in trajectories(out):
        assert t["finish"] == "success" and [s["action"] for s in t["steps"]] == [
            'guess_letter(letter="c")', 'guess_letter(letter="a")', 'solve(word="cat")']
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "c.jsonl"), "--engine", "fake",
            "--model", script(tmp_path / "p.json", rules), "--constrain-actions")
    assert one_line(r, 1).endswith("cannot be used with this server's tools: tool solve's "
                                   "argument word is free text, so its calls cannot be listed")
    letters = write_jsonl(tmp_path / "letters.jsonl",
                          [task({"url": f"{base}/letters", "reset": {"word": "cat"}})])
    rules = [("Yes: c a _", 'guess_letter(letter="t")'), ("Yes: c _ _", 'guess_letter('
             'letter="a")'), ("_ _ _", 'guess_letter(letter="c")')]  # choices as listed
    r = cli("rollout", "-i", str(letters), "-o", str(out), "--engine", "fake", "--model",
            script(tmp_path / "p.json", rules), "--n", "1", "--max-steps", "4",
            "--constrain-actions")
    assert r.returncode == 0, r.stderr
    [t] = trajectories(out)
    assert t["finish"] == "success" and [s["action"] for s in t["steps"]] == [
        'guess_letter(letter="c")', 'guess_letter(letter="a")', 'guess_letter(letter="t")']


def test_a_one_session_server_is_played_within_its_limit_or_fails_in_one_line(base, tmp_path,
                                                                             cli):
    spec = {"url": f"{base}/single", "reset": {"target": 2}, "timeout_s": 2}
    tasks, out = write_jsonl(tmp_path / "tasks.jsonl", [task(spec)]), tmp_path / "traj.jsonl"
    policy = script(tmp_path / "p.json", [("", "2")])
    r = cli("rollout", "-i", str(tasks), "-o", str(out), "--engine", "fake", "--model",
            policy, "--n", "2", "--max-steps", "2")
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stderr.splitlines() if BUSY in ln] == [
        f"openenv: the server at {base}/single {BUSY} (serve more sessions to play more at "
        "once)"]
    assert [(t["sample"], t["finish"]) for t in trajectories(out)] == [(0, "success"),
                                                                       (1, "success")]
    meta = json.loads((tmp_path / "traj.meta.json").read_text())
    assert meta["counts"]["errored"] == 0 and meta["counts"]["success_rate"] == 1.0
    # the other outcome: another client holds the one session past timeout_s
    from websockets.sync.client import connect

    with contextlib.ExitStack() as other:
        ws = other.enter_context(connect(f"{base.replace('http', 'ws')}/single/ws"))
        ws.send(json.dumps({"type": "reset", "data": {}}))
        ws.recv(timeout=5)
        r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "t2.jsonl"), "--engine",
                "fake", "--model", policy, "--n", "2", "--max-steps", "2")
    line = one_line(r, 1)
    assert "the openenv environment could not start: all 2 episodes" in line
    assert "refused the session (CAPACITY_REACHED): Server at capacity: 1/1" in line
    assert BUSY not in r.stderr and not list(tmp_path.glob("t2.jsonl*"))

"""The `miniwob` env: MiniWoB++ pages in a real headless Chromium. Episodes through the env,
the expert and its labels, real screenshots, rollout over it, a browser crash mid-episode
(restarted, replayed, counted) and a kill -9 of a rollout (no Chromium left behind)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlany.envs import Observation
from rlany.errors import RlanyError
from rlany.files.records import Task, to_json

miniwob = pytest.importorskip("miniwob", reason="needs the miniwob package: pip install "
                              "'rlany[gui]'")
from rlany.envs.browser import MARK, Browser, browser  # noqa: E402
from rlany.envs.miniwob import MiniwobEnv, make_tasks  # noqa: E402
from rlany.envs.miniwob_actions import Act  # noqa: E402
from rlany.envs.miniwob_expert import PLANS  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")
needs_chromium = pytest.mark.skipif(
    not (os.access("/usr/bin/chromium", os.X_OK) and os.access("/usr/bin/chromedriver",
                                                               os.X_OK)),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
           "chromium-driver; make install does it as root)")


def task(name: str, seed: int = 3, **extra) -> Task:
    return Task(task_id=f"{name}-{seed}", env="miniwob", prompt="",
                spec={"task": name, "seed": seed, **extra})


def play_expert(env: MiniwobEnv, t: Task) -> list:
    env.reset(t)
    results = []
    while not results or not results[-1].done:
        results.append(env.step(env.expert_action() or "nothing"))
    return results


@needs_chromium
@pytest.mark.parametrize("name", ["click-button", "enter-text", "login-user"])
def test_expert_solves_the_page_and_labels_its_steps(name, tmp_path, monkeypatch):
    monkeypatch.setenv("RLANY_CACHE", str(tmp_path))
    results = play_expert(MiniwobEnv(), task(name))
    assert results[-1].success and len(results) == PLANS[name][0]
    assert [r.info["label"] for r in results] == [1] * len(results)
    [before], [after] = results[-1].info["screens"]  # openenv's shape: [[before], [after]]
    assert before != after and Path(after).parent == tmp_path / "screens"


@needs_chromium
def test_wrong_and_unparseable_actions_are_labelled_bad():
    env = MiniwobEnv()
    obs = env.reset(task("click-button", seed=7))
    assert isinstance(obs, str) and obs.startswith("Instruction: Click on the")
    good = env.expert_action()
    wrong = next(a for a in env.choices() if a != good and a.startswith("click"))
    r = env.step(wrong)
    assert r.action == wrong and r.info["label"] == -1
    if not r.done:  # another button or a text: the page may end the episode as a failure
        r = env.step("what a lovely page")
        assert r.action is None and r.info["label"] == -1 and r.obs.startswith("Nothing")


@needs_chromium
def test_screenshot_is_a_real_png_of_the_page(tmp_path, monkeypatch):
    from PIL import Image

    monkeypatch.setenv("RLANY_CACHE", str(tmp_path))
    obs = MiniwobEnv().reset(task("click-button", screens="observe"))
    assert isinstance(obs, Observation) and len(obs.images) == 1
    data = Path(obs.images[0]).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = Image.open(obs.images[0]).convert("RGB")
    assert img.size == (160, 210)
    colors = img.getcolors(maxcolors=100_000)
    assert len(colors) > 20  # text and buttons, not a blank page
    # the instruction's yellow band is on top
    top = [img.getpixel((x, y)) for x in range(160) for y in range(30)]
    assert sum(p == (255, 255, 0) for p in top) > len(top) / 2


@needs_chromium
def test_rollout_cli_writes_text_and_screens(tmp_path):
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "traj.jsonl"
    env = {**os.environ, "PYTHONPATH": SRC, "RLANY_CACHE": str(tmp_path)}
    cmd = [sys.executable, "-m", "rlany"]
    subprocess.run(cmd + ["envs", "make-tasks", "miniwob", "--n", "3", "--seed", "0",
                          "-o", str(tasks)], check=True, env=env)
    subprocess.run(cmd + ["rollout", "-i", str(tasks), "-o", str(out), "--expert", "--n", "1",
                          "--max-steps", "4", "--constrain-actions"], check=True, env=env)
    trajs = [json.loads(x) for x in out.read_text().splitlines() if '"steps"' in x]
    assert len(trajs) == 3 and all(t["outcome"] == 1 for t in trajs)
    for step in (s for t in trajs for s in t["steps"]):
        assert "Admissible actions:" in step["obs"] and step["info"]["label"] == 1
        assert all(Path(p).is_file() for shots in step["info"]["screens"] for p in shots)


@needs_chromium
def test_a_crashed_browser_is_restarted_and_the_episode_replayed():
    env = MiniwobEnv()
    env.reset(task("enter-text", seed=11))
    first = env.step(env.expert_action())  # typed; the episode goes on
    assert not first.done
    b = browser()
    gen, restarts = b.generation, b.restarts
    b.driver.service.process.kill()  # the driver dies under the episode
    b.driver.service.process.wait()
    last = env.step(env.expert_action())
    assert last.done and last.success and last.info["browser_retries"] == 1
    assert b.generation == gen + 1 and b.restarts == restarts + 1


def test_a_missing_browser_fails_in_one_line(monkeypatch):
    monkeypatch.setenv("MINIWOB_CHROME_BINARY", "/nonexistent/chromium")
    with pytest.raises(RlanyError, match="not installed: /nonexistent/chromium not found") as e:
        Browser().start()
    assert "apt-get install chromium chromium-driver" in e.value.hint


def _run_processes(pid: int) -> set[int]:
    """The processes marked as this run's browser, and their descendants."""
    marked, parent = set(), {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
            if any(x.startswith(f"{MARK}={pid}-".encode()) for x in env):
                marked.add(int(p))
            parent[int(p)] = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    for _ in range(5):
        marked |= {p for p, pp in parent.items() if pp in marked}
    return marked


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@needs_chromium
def test_kill_9_of_a_rollout_leaves_no_chromium(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(to_json(t)) + "\n"
                             for t in make_tasks(200, 0, screens="none")))
    env = {**os.environ, "PYTHONPATH": SRC, "RLANY_CACHE": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "rlany", "rollout", "-i", str(tasks), "-o",
                             str(tmp_path / "t.jsonl"), "--expert", "--n", "1",
                             "--max-steps", "4"], env=env, stderr=subprocess.DEVNULL)
    deadline, seen = time.time() + 60, set()
    while time.time() < deadline and len(seen) < 3:  # chromedriver, chromium, its helpers
        seen = _run_processes(proc.pid)
        time.sleep(0.2)
    assert len(seen) >= 3 and proc.poll() is None, "the rollout's browser never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and any(_alive(p) for p in seen | _run_processes(proc.pid)):
        time.sleep(0.2)
    left = [p for p in seen | _run_processes(proc.pid) if _alive(p)]
    assert not left, f"Chromium processes left after kill -9: {left}"


def test_specs_are_validated_and_edited_along_the_ladders():
    env = MiniwobEnv()
    assert env.validate({"task": "click-button", "seed": 1}) == []
    bad = env.validate({"task": "no-such-page", "seed": -1, "screens": "x", "extra": 1})
    assert len(bad) == 4 and "spec.task" in bad[0]
    spec = {"task": "click-test-2", "seed": 5, "max_steps": 3}
    harder = {e.description: e.spec for e in env.edits(spec, "harder")}
    assert harder == {"task: click-test-2 -> click-button": {**spec, "task": "click-button"},
                      "step limit: 3 -> 2": {**spec, "max_steps": 2}}
    easier = env.edits({"task": "enter-text", "seed": 5, "max_steps": 4}, "easier")
    assert [e.description for e in easier] == ["step limit: 4 -> 5"]
    hard = env.edits({"task": "enter-text", "seed": 5, "max_steps": 2}, "harder")
    assert [e.spec["task"] for e in hard] == ["enter-text-2", "enter-password"]
    assert all(env.validate(e.spec) == [] for e in hard + easier)


def test_make_tasks_draws_pages_of_the_family():
    tasks = make_tasks(10, 0)
    assert [t.task_id for t in tasks] == [f"web-0-{k:04d}" for k in range(10)]
    assert {t.spec["task"] for t in tasks} <= set(PLANS)
    assert [t.spec for t in make_tasks(4, 0)] == [t.spec for t in tasks[:4]]  # sequential
    with pytest.raises(RlanyError, match="tasks must be"):
        make_tasks(2, 0, tasks="click-button,drag-box")


def test_browsergym_and_numbered_answers_parse_to_the_action_named():
    """BrowserGym's function-call form and our numbered form run the same action, case kept
    (issue 51's KENETH case), without a browser: the parser alone."""
    env = MiniwobEnv.__new__(MiniwobEnv)
    env.rows = [{"ref": 3, "kind": "button", "text": "Submit"},
                {"ref": 5, "kind": "textbox", "text": ""}]
    env.actions = ['click [3] button "Submit"', 'type "keneth" into [5]',
                   'type "KENETH" into [5]']
    assert env._parse("click('3')")[0] == env.actions[0]
    assert env._parse('fill("5", "KENETH")')[0] == env.actions[2]
    assert env._parse('3. type "KENETH" into [5]')[0] == env.actions[2]
    assert env._parse("fill('5', 'Someone Else')")[0] == 'type "Someone Else" into [5]'
    # an element not on the page is still tried: the page answers with its error
    assert env._parse("click('9')")[:1] == ("click [9]",)
    assert env._parse("what a lovely page")[0] is None
    assert env._parse("scroll(0, 10000000)")[:2] == ("scroll 0 10000000",
                                                     Act("scroll", x=0, y=10000000))
    for bad in ("scroll(0, 1e400)", "scroll 0 inf", "mouse_click(1234567, 5)"):
        action, act, info, error = env._parse(bad)
        assert (action, act, info) == (None, None, {"parse": "bad call"}) and error
    error = env._act(None)  # no browser is touched: a one-line error, not an exception
    assert isinstance(error, str) and "\n" not in error


def test_only_a_browser_failure_restarts_the_browser(monkeypatch):
    """A bug of ours (an AttributeError) is raised as is; a WebDriver error restarts the
    browser and runs again, once."""
    from selenium.common.exceptions import WebDriverException

    from rlany.envs import miniwob as module

    restarts = []

    class FakeBrowser:
        def restart(self):
            restarts.append(1)

    monkeypatch.setattr(module, "browser", FakeBrowser)
    env = MiniwobEnv()
    env.spec, env.retries = {"task": "click-test", "seed": 1}, 0
    monkeypatch.setattr(env, "_attach", lambda: None)
    with pytest.raises(AttributeError):
        env._safely(lambda: None.verb)
    assert restarts == [] and env.retries == 0
    tries = []

    def flaky():
        tries.append(1)
        if len(tries) == 1:
            raise WebDriverException("chrome not reachable")
        return "ran"

    assert env._safely(flaky) == "ran" and restarts == [1] and env.retries == 1


@needs_chromium
def test_a_reset_that_fails_gives_its_tab_back(monkeypatch):
    from rlany.envs import miniwob_page

    env = MiniwobEnv()
    real = miniwob_page.elements

    def broken(*a):
        raise ValueError("the page cannot be read")
    monkeypatch.setattr(miniwob_page, "elements", broken)
    with pytest.raises(ValueError, match="cannot be read"):
        env.reset(task("click-test"))
    assert env.tab is None and env._release is None
    monkeypatch.setattr(miniwob_page, "elements", real)
    free = len(browser().free)
    assert env.reset(task("click-test")).startswith("Instruction:")
    assert len(browser().free) == free - 1  # the tab it gave back, taken again

"""A policy's failure is the policy's, an env's failure the env's (`rlany.envs.read_action`).

Every env reads the policy's text in one guarded call: whatever the text makes fail is an
invalid action the policy sees ("Error: ..."), never an exception out of `step`, so never an
episode set apart as an env error. Fed here to each env that runs without a browser or a
real server (miniwob's step with its page stubbed, openenv's with its session stubbed or the
local test server), as hypothesis draws and as a fixed battery: digits of every Unicode
number class, integers of 10,000 digits, nesting 10,000 deep, 1 MB strings, sets, bytes,
NaN and inf, lone surrogates, NUL bytes, alone and inside each env's action syntax. Then
rollout over them (no episode errors) and `rlany eval` of a policy right half the time and
malformed the other half (success 0.5, not 1.0)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import read_jsonl, write_jsonl
from rlany.engines.fake import FakeEngine
from rlany.envs import StepResult, read_action
from rlany.files.records import Task

BIG = "9" * 10_000  # past int()'s 4,300 digits
HOSTILE = ["²", "³¹", "١٢", "Ⅻ", "ↂ", "𝟗", "½", BIG, "-" + BIG, "[" * 10_000 + "]" * 10_000,
           "(" * 10_000 + ")" * 10_000, "{" * 10_000 + "}" * 10_000, "x" * (1 << 20),
           "{1, 2}", "b'\\xff'", "b''", "nan", "NaN", "float('nan')", "inf", "-Infinity",
           "1e999", "\ud800", "'\udfff'", "\x00", "a\x00b", "[[1, {2}]]", "{'a': b'x'}", ""]
# each env's action syntax, with @ where a hostile piece goes
SYNTAX = {
    "any": ["@", "@\n1", "1\n@", "action: @", "@."],
    "household": ["go to @", "take @ from table 1"],
    "reasoning": ["answer: @", "\\boxed{@}", "The answer is @."],
    "miniwob": ["click(@)", "click('@')", "click [@]", "hover [@] button", "fill('@', 'x')",
                "fill('1', @)", 'type "@" into [1]', "select_option('1', @)",
                "select @ in [1]", "scroll(@, 1)", "scroll @ 1", "mouse_click(1, @)",
                "click at @ 2", "press('1', '@')"],
    "openenv-tools": ["guess(@)", "guess(n=@)", '{"tool": "guess", "arguments": {"n": @}}',
                      '{"tool": "guess", "arguments": "{\\"n\\": @}"}', "look(@)"]}
SYNTAX["alfworld"] = SYNTAX["household"]
TEMPLATES = sorted({t for ts in SYNTAX.values() for t in ts})
BATTERY = [t.replace("@", h) for t in TEMPLATES for h in HOSTILE]

number_chars = st.characters(categories=["Nd", "No", "Nl"])
pieces = st.one_of(st.sampled_from(HOSTILE), st.text(number_chars, min_size=1, max_size=12),
                   st.integers(4_301, 12_000).map(lambda n: "8" * n),
                   st.integers(1, 10_000).flatmap(lambda d: st.sampled_from(
                       ["[" * d + "]" * d, "(" * d + ")" * d, "{[" * d])),
                   st.text(max_size=40))


def hostile(env: str) -> st.SearchStrategy[str]:
    """Text, or a hostile piece written into the env's own action syntax."""
    written = st.tuples(st.sampled_from(SYNTAX["any"] + SYNTAX[env]), pieces).map(
        lambda t: t[0].replace("@", t[1]))
    return st.one_of(written, written, st.text())


SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def invalid(result: StepResult) -> str | None:
    return result.info.get("invalid_action") or result.info.get("action_error")


def test_read_action_turns_whatever_the_text_raises_into_the_policys_invalid_action():
    assert read_action(int, "12") == (12, None)
    value, why = read_action(int, "²")
    assert value is None and why.startswith("the action cannot be read (ValueError: invalid")
    value, why = read_action(json.loads, "[" * 100_000)
    assert value is None and "RecursionError" in why
    assert read_action(json.dumps, {1, 2})[1].startswith("the action cannot be read (TypeError")
    assert len(read_action(int, BIG)[1]) < 260  # one short line, not the text


# -- each env, step by step ----------------------------------------------------------------

def household():
    from rlany.envs.household import HouseholdEnv, make_tasks

    env = HouseholdEnv()
    env.reset(make_tasks(1, seed=0)[0])
    return env


def reasoning():
    from rlany.envs.reasoning import ReasoningEnv, make_tasks

    env = ReasoningEnv()
    env.reset(make_tasks(1, seed=0)[0])
    return env


def alfworld():
    """The env's own step over a stub game (compiling a TextWorld game takes seconds): the
    response is read before the game is touched."""
    from rlany.envs.alfworld import AlfworldEnv

    class State(dict):
        feedback = "You open the drawer."

    class Game:
        def step(self, command):
            return State(admissible_commands=["open drawer 1", "look"]), 0, False

        def close(self):
            pass

    env = AlfworldEnv()
    env.game, env.spec, env.steps, env.policy = Game(), {"max_steps": 50}, 0, []
    env.admissible = ["open drawer 1", "go to table 1", "look"]
    return env


def miniwob(monkeypatch):
    """The env's own step with the browser stubbed: the page does nothing, so every
    exception would be the reading's."""
    from rlany.envs import miniwob_page as page
    from rlany.envs.miniwob import MiniwobEnv

    dom = {"tag": "BODY", "ref": 1, "children": [
        {"tag": "INPUT_text", "ref": 2, "id": "name", "value": "", "children": []},
        {"tag": "SELECT", "ref": 3, "id": "pick", "children": []},
        {"tag": "BUTTON", "ref": 4, "text": "Submit", "children": []}]}
    extra = {"2": {"type": "text", "visible": True},
             "3": {"options": ["Chad", "Peru"], "selected": ["Chad"], "visible": True},
             "4": {"visible": True}}
    env = MiniwobEnv()
    env.spec = {"task": "a-page-without-expert", "max_steps": 10**6, "screens": "none"}
    env.rows = page.elements(dom, extra)
    env.actions, env.fields = page.admissible(env.rows, []), []
    env.state = {"done": False, "raw": 0, "utterance": "Enter a name."}
    env.history, env.ran, env.steps, env.retries, env.screen = [], [], 0, 0, None
    env.pointer = [80, 130]
    monkeypatch.setattr(env, "_safely", lambda do: None)  # the page took the action
    monkeypatch.setattr(env, "_observe", lambda: None)
    return env


def openenv_tools(monkeypatch):
    """A tool env's step over a stub session that sends as the wire does (`json.dumps`)."""
    from rlany.envs.openenv import OpenenvEnv
    from rlany.envs.openenv_tools import read_tools

    class Session:
        url = "http://stub"

        def call(self, message, what):
            json.dumps(message)  # what openenv_wire.Session.call sends
            return {"observation": {"tool_name": message["data"]["tool_name"],
                                    "result": {"content": [{"type": "text", "text": "ok"}]}},
                    "reward": 0.0, "done": False}

    env = OpenenvEnv()
    env.session, env.steps, env.retries, env.total, env.text = Session(), 0, 0, 0.0, ""
    env.screens = ()
    env.field, env.kind, env.options = None, "tools", None
    env.tools = read_tools({"tools": [
        {"name": "guess", "description": "", "input_schema": {
            "type": "object", "required": ["n"], "properties": {"n": {}}}},
        {"name": "look", "description": "", "input_schema": {}}]})
    return env


SIMPLE = {"household": household, "reasoning": reasoning, "alfworld": alfworld}
PATCHED = {"miniwob": miniwob, "openenv-tools": openenv_tools}


def make(name, monkeypatch):
    return SIMPLE[name]() if name in SIMPLE else PATCHED[name](monkeypatch)


def check_step(env, response: str) -> None:
    result = env.step(response)  # never raises: the test's point
    assert isinstance(result, StepResult) and isinstance(result.obs, str)
    if result.info.get("invalid_action") and not result.done:
        assert result.obs.startswith("Error: the action cannot be read (")


@pytest.mark.parametrize("name", [*SIMPLE, *PATCHED])
def test_no_step_raises_on_the_battery(name, monkeypatch):
    for response in BATTERY:
        check_step(make(name, monkeypatch), response)


@pytest.mark.parametrize("name", [*SIMPLE, *PATCHED])
def test_no_step_raises_on_drawn_responses(name):
    with pytest.MonkeyPatch.context() as monkeypatch:  # hypothesis reuses the test's fixtures
        @SETTINGS
        @given(st.lists(hostile(name), min_size=1, max_size=3))
        def steps(responses):
            env = make(name, monkeypatch)
            for response in responses:
                check_step(env, response)
        steps()


def test_what_the_text_makes_fail_is_shown_to_the_policy_as_an_error(monkeypatch):
    env = miniwob(monkeypatch)
    for response in ("click('²')", f"click [{BIG}]", 'type "\ud800" into [2]'):
        result = env.step(response)
        assert result.action is None and not result.done
        assert result.obs.startswith("Error: ") and invalid(result), response
    env = openenv_tools(monkeypatch)
    for response in ("guess(n={1, 2})", "guess(b'x')", "guess(n=float('nan'))",
                     "guess(n=nan)", "guess('\ud800')"):
        result = env.step(response)
        assert result.action is None and not result.done and result.info["return"] == 0.0
        assert result.obs.startswith(("Error: the action cannot be read", "Invalid action")), \
            (response, result.obs)
    assert env.step("guess(n=3)").action == "guess(n=3)"  # and the episode goes on


def test_coding_reads_any_response_as_a_program_that_fails():
    from rlany.envs.coding import CodingEnv, make_tasks

    task = make_tasks(1, seed=0)[0]
    for response in HOSTILE:
        env = CodingEnv()
        env.reset(task)
        result = env.step(response)
        assert result.done and not result.success


def test_an_openenv_server_is_sent_only_what_json_encodes():
    """The local test server's game: an action whose value JSON cannot encode (NaN, an
    infinity, a lone surrogate) is not sent, and the episode goes on; so is any hostile
    response to its integer field."""
    pytest.importorskip("websockets", reason="the openenv env needs websockets")
    from openenv_server import serve
    from rlany.envs.openenv import OpenenvEnv

    server = serve(0)
    url = f"http://127.0.0.1:{server.socket.getsockname()[1]}"

    def episode(**spec) -> OpenenvEnv:
        env = OpenenvEnv()
        env.reset(Task(task_id="t", env="openenv", prompt="",
                       spec={"url": url, "reset": {"target": 3}, **spec}))
        return env

    try:
        env = episode(action_json=True)
        for response in ('{"guess": NaN}', '{"guess": -Infinity}', '{"guess": 1e999}',
                         '{"guess": "\\ud800"}'):
            result = env.step(response)
            assert not result.done and "rejected" not in result.info, response
            assert result.obs.startswith("Error: the action cannot be read ("), result.obs
        assert env.step('{"guess": 3}').success
        for response in HOSTILE:  # a fresh episode each: three wrong guesses end one
            env = episode(action_field="guess")
            assert isinstance(env.step(response).obs, str)
            env.close()
    finally:
        server.shutdown()


# -- through rollout and eval ----------------------------------------------------------------

def test_no_episode_is_set_apart_for_the_policys_text():
    from rlany.envs import make_env
    from rlany.envs.household import make_tasks as house
    from rlany.envs.reasoning import make_tasks as arith
    from rlany.stages.rollout import RolloutOptions, rollout

    tasks = house(3, seed=1) + arith(3, seed=1)
    answers = itertools.cycle(HOSTILE + BATTERY[::11])
    engine = FakeEngine(lambda request, k: next(answers))
    groups = list(rollout(tasks, engine, make_env, RolloutOptions(n=4, max_steps=3)))
    trajs = [t for g in groups for t in g]
    assert len(trajs) == 24 and {t.finish for t in trajs} <= {"success", "failure",
                                                            "max_steps"}


PICK = {"rooms": {"kitchen": [{"name": "table 1", "type": "table", "contents": ["apple 1"]},
                              {"name": "cabinet 1", "type": "cabinet", "contents": []}]},
        "start_room": "kitchen", "goal": {"kind": "pick", "object": "apple"}, "max_steps": 5}


def test_a_policy_right_half_the_time_evaluates_at_one_half(tmp_path, cli):
    """Each task's two samples answer the first turn differently: one walks to the table
    and takes the apple, the other answers a number of 10,000 digits (once the env's
    error). Half the episodes succeed; the other half are the policy's failures."""
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [
        Task(task_id=f"t{k}", env="household", spec=PICK, prompt="Pick.") for k in range(4)])
    script = tmp_path / "policy.json"
    script.write_text(json.dumps({"rules": [
        {"match": "You arrive at table 1", "responses": ["take apple 1 from table 1"]},
        {"responses": ["go to table 1", BIG]}]}))
    r = cli("eval", "-i", str(tasks), "-o", str(tmp_path / "eval.json"), "--trajectories",
            str(tmp_path / "t.jsonl"), "--engine", "fake", "--model", str(script), "--n", "2",
            "--max-steps", "2")
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "eval.json").read_text())
    assert summary["errored"] == 0 and summary["trajectories"] == 8
    assert summary["success_rate"] == 0.5
    finishes = sorted(t["finish"] for t in read_jsonl(tmp_path / "t.jsonl"))
    assert finishes == ["max_steps"] * 4 + ["success"] * 4

"""The `openenv` env's tool-call decoder (`openenv_tools`), without a server: both call forms,
what makes a response no call, the listed calls for --constrain-actions, the menu the policy
reads and the one-line tool error. test_openenv_package.py plays them on a real MCP env."""

from __future__ import annotations

import time

import pytest

from rlany.envs.openenv_tools import (
    BadCall,
    calls,
    json_objects,
    menu,
    parse,
    read_tools,
    show_result,
)

TOOLS = read_tools({"tools": [
    {"name": "move", "description": "Move one step.\nMore text.",
     "input_schema": {"type": "object", "additionalProperties": False, "required": ["dir"],
                      "properties": {"dir": {"enum": ["n", "s"]},
                                     "run": {"type": "boolean"}}}},
    {"name": "get-note", "description": "", "inputSchema": {  # MCP's own key and name
        "type": "object", "required": ["title"], "properties": {"title": {"type": "string"}}}},
    {"name": "look", "description": "Look around.", "input_schema": {}}]})


@pytest.mark.parametrize("response, call", [
    ('move(dir="n")', ("move", {"dir": "n"})),
    ("I go north.\nmove('n', run=true)", ("move", {"dir": "n", "run": True})),
    ("think (hard) then move(dir='s')", ("move", {"dir": "s"})),
    ('get-note(title="a (b)")', ("get-note", {"title": "a (b)"})),
    ('{"tool": "move", "arguments": {"dir": "s", "run": false}}',
     ("move", {"dir": "s", "run": False})),
    ('{"name": "get-note", "arguments": "{\\"title\\": \\"x\\"}"}', ("get-note", {"title": "x"})),
    ('{"tool": "get-note", "arguments": {"title": "t", "name": "look"}}',
     ("get-note", {"title": "t", "name": "look"})),  # the outermost object is the call
    ("look", ("look", {})),
    ("**look**.", ("look", {})),
    # only calls of a listed tool count, and of those the last one, whatever its form
    ('I see {"name": "Bob"}. move(dir="n")', ("move", {"dir": "n"})),
    ('{"tool": "move", "arguments": {"dir": "s"}} no: move(dir="n")', ("move", {"dir": "n"})),
    ('move(dir="n") no: {"tool": "move", "arguments": {"dir": "s"}}', ("move", {"dir": "s"})),
    ('{"tool": "get-note", "arguments": {"title": "look()"}}', ("get-note", {"title": "look()"})),
    ("""get-note(title='{"tool": "look"}')""", ("get-note", {"title": '{"tool": "look"}'})),
    ('move(dir="n") ' + "f(x=)" * 4000, ("move", {"dir": "n"})),  # a degenerate tail
])
def test_both_call_forms_decode(response, call):
    assert parse(response, TOOLS) == call


@pytest.mark.parametrize("response, why", [
    ("I am not sure.", "the response holds no tool call"),
    ('jump(dir="n")', "no tool is named 'jump' (the tools: move, get-note, look)"),
    ('I see {"name": "Bob"}.', "no tool is named 'Bob'"),
    ("move()", "move needs dir"),
    ('move(dir="n", speed=3)', "move takes no argument 'speed' (it takes dir, run)"),
    ("move(n)", "argument dir is not a literal value"),
    ('move("n", True, 3)', "move takes 2 argument(s) by position (dir, run), got 3"),
    ('{"tool": "move", "arguments": [1]}', "the call's arguments must be a JSON object"),
])
def test_what_is_no_call_is_said_in_one_line(response, why):
    with pytest.raises(BadCall, match="^" + why.replace("(", r"\(").replace(")", r"\)")):
        parse(response, TOOLS)


@pytest.mark.parametrize("response", [
    "f(x=)" * 4000, 'move(dir=)' * 2000, "f(" * 20000, "move(" * 4000, "f(')" * 5000,
    '{"a": ' * 4000, "{" * 20000, '{"tool": [' * 2000])
def test_a_degenerate_response_is_decoded_in_well_under_a_second(response):
    """Each `name(` is closed by one scan of its brackets and quotes, and only the last few
    are tried: not ast.parse at every `)` after every `name(` (25 s for 8,000 characters).
    Timed in this process's CPU seconds: a busy machine does not fail it."""
    assert len(response) >= 20000
    began = time.process_time()
    with pytest.raises(BadCall):
        parse(response, TOOLS)
    assert time.process_time() - began < 0.5


def test_calls_menu_and_tool_errors():
    with pytest.raises(BadCall, match="tool get-note's argument title is free text"):
        calls(TOOLS)
    assert calls([TOOLS[0], TOOLS[2]]) == ['move(dir="n")', 'move(dir="s")', "look()"]
    assert menu(TOOLS).splitlines()[1:] == [
        '- move(dir: "n" | "s", run: boolean (optional)): Move one step.',
        "- get-note(title: string)", "- look(): Look around."]
    assert json_objects('a {"x": {"y": 1}} b {"z": 2} {bad') == [{"x": {"y": 1}}, {"z": 2}]
    error = {"error_type": "invalid_args", "message": "1 validation error\nx\n  Missing\n"
             "    For further information visit https://errors.pydantic.dev"}
    assert show_result({"error": error}) == ("", "invalid_args: 1 validation error x Missing")
    ok = {"result": {"content": [{"type": "text", "text": "done"}], "is_error": False}}
    assert show_result(ok) == ("done", None)
    assert show_result({"result": {"content": [{"type": "text", "text": "no"}],
                                   "is_error": True}}) == ("", "tool error: no")
    assert show_result({"result": 7}) == ("7", None)


def test_a_tool_call_that_never_reached_its_tool_errors_the_episode(monkeypatch):
    """MCP's transport_error is the framework's (openenv's ToolError: "NOT for errors
    returned by the tool itself"): the env failed, so the episode errors; a tool's own
    refusal (execution_error, invalid_args) and a tool that ran past the server's timeout
    (MCPEnvironment's wait_for around the tool's run: the policy's endless loop in a code
    tool) are shown back and the episode goes on."""
    from rlany.envs.openenv import OpenenvEnv
    from rlany.errors import RlanyError

    class Session:
        url = "http://server"

        def __init__(self, error_type):
            self.error_type = error_type

        def call(self, message, what):
            error = {"error_type": self.error_type, "message": "could not reach the tool"}
            return {"observation": {"tool_name": "look", "error": error}, "reward": None,
                    "done": False}

    for error_type, errors in (("transport_error", True), ("timeout", False),
                               ("execution_error", False)):
        env = OpenenvEnv()
        env.session, env.tools, env.steps, env.retries, env.total = \
            Session(error_type), [], 0, 0, 0.0
        monkeypatch.setattr(env, "_parse", lambda response: ("look()", {"tool_name": "look"},
                                                             None))
        monkeypatch.setattr(env, "_again", lambda text, info, reward=None: text)
        if errors:
            with pytest.raises(RlanyError, match=f"could not run the tool call \\({error_type}"):
                env.step("look()")
        else:
            assert env.step("look()").startswith(f"The tool call failed: {error_type}:")


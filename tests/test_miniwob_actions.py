"""The `miniwob` env's BrowserGym action set (issue 51): click, fill, select_option, press,
hover, scroll and mouse_click, in the listed (numbered/plain) form and BrowserGym's call
form, run in real MiniWoB pages in Chromium; the accessibility-tree style observation; the
page's error in one line when an action fails; the experts of the pages that need them."""

from __future__ import annotations

import inspect
import os
import re

import pytest

from rlany.files.records import Task

miniwob = pytest.importorskip("miniwob", reason="needs the miniwob package: pip install "
                              "'rlany[gui]'")
from rlany.envs import miniwob_actions as acts  # noqa: E402
from rlany.envs import miniwob_page as page  # noqa: E402
from rlany.envs.miniwob import MiniwobEnv  # noqa: E402
from rlany.envs.miniwob_actions import Act  # noqa: E402

needs_chromium = pytest.mark.skipif(
    not (os.access("/usr/bin/chromium", os.X_OK) and os.access("/usr/bin/chromedriver",
                                                               os.X_OK)),
    reason="needs Debian's chromium and chromium-driver")


def start(name: str, seed: int = 3) -> tuple[MiniwobEnv, str]:
    env = MiniwobEnv()
    obs = env.reset(Task(task_id=f"{name}-{seed}", env="miniwob", prompt="",
                         spec={"task": name, "seed": seed, "screens": "none",
                               "max_steps": 20}))
    return env, obs


def row(env: MiniwobEnv, kind: str, **match) -> dict:
    return next(r for r in env.rows if r["kind"] == kind
                and all(r.get(k) == v for k, v in match.items()))


def numbered(env: MiniwobEnv, action: str) -> str:
    return f"{env.choices().index(action) + 1}. {action}"


# -- the two forms, without a browser ----------------------------------------------------
@pytest.mark.parametrize("call, plain", [
    ("click('12')", "click [12]"),
    ('fill("5", "KENETH")', 'type "KENETH" into [5]'),
    ("fill('5', 'say \"hi\"')", 'type "say "hi"" into [5]'),
    ("select_option('4', 'Peru')", 'select "Peru" in [4]'),
    ("select_option('4', ['a', 'b'])", 'select ["a", "b"] in [4]'),
    ("press('5', 'Control+a')", 'press "Control+a" on [5]'),
    ("hover('7')", "hover [7]"),
    ("scroll(0, -100)", "scroll 0 -100"),
    ("mouse_click(80.5, 120)", "click at 80.5 120"),
    ("scroll(0, 10000000)", "scroll 0 10000000"),  # exactly, not 1e+07
    ("mouse_click(499, 0.125)", "click at 499 0.125"),
    ("press('5', 'a\\nb')", 'press "a\nb" on [5]'),
])
def test_each_call_has_a_plain_form_that_reads_back_the_same(call, plain):
    act, error = acts.from_call(call)
    assert error is None and acts.show(act, []) == plain
    assert acts.from_plain(plain) == (act, None)


@pytest.mark.parametrize("answer, why", [
    ("scroll(0, 1e400)", "scroll(delta_x, delta_y): the numbers must be finite"),
    ("scroll(0, 2**40)", "scroll(delta_x, delta_y): the arguments must be literal values"),
    ("scroll(0, 10000000000)", "scroll(delta_x, delta_y): a scroll moves at most 2147483647 "
                               "pixels"),
    ("mouse_click(1234567, 5)", "mouse_click(x, y): (1234567, 5) is off the page (x in "
                                "0..499, y in 0..399)"),
    ("mouse_click(-1, 5)", "mouse_click(x, y): (-1, 5) is off the page"),
    ("scroll 0 inf", "scroll DX DY: the numbers must be finite"),
    ("scroll 0 NaN", "scroll DX DY: the numbers must be finite"),
    ("click at 1e+07 5", "click at X Y: (10000000, 5) is off the page"),
])
def test_numbers_the_page_cannot_take_are_refused_in_one_line(answer, why):
    act, error = acts.from_call(answer) if "(" in answer else acts.from_plain(answer)
    assert act is None and error.startswith(why) and "\n" not in error


def test_a_call_with_wrong_arguments_says_what_is_wrong():
    assert acts.from_call("fill('5')") == (None, "fill(bid, value): missing value")
    assert acts.from_call("select_option('4', 3)")[1].endswith("a list of strings")
    assert acts.from_call("click('a5')")[1].startswith("click(bid): bid must be")
    assert acts.from_call("scroll('up', 1)")[1].endswith("must be numbers")
    assert acts.from_call("click('3', button='right')")[1].endswith("left click is supported")
    assert acts.from_call("launch('3')") == (None, None)  # not an action: read otherwise
    assert acts.from_call('type "x" into [5]') == (None, None)


def test_key_names_map_to_selenium_keys():
    from selenium.webdriver.common.keys import Keys

    assert acts.keys("Enter") == ([], Keys.ENTER)
    assert acts.keys("Control+a") == ([Keys.CONTROL], "a")
    assert acts.keys("Shift+KeyT") == ([Keys.SHIFT], "t")
    assert acts.keys("Shift++") == ([Keys.SHIFT], "+")
    assert acts.keys("Hyper+q") == "unknown modifier 'Hyper'"
    assert acts.keys("Bogus") == "unknown key 'Bogus'"


def test_the_page_lists_roles_states_and_a_bounded_action_set():
    dom = {"tag": "BODY", "ref": 1, "children": [
        {"tag": "SELECT", "ref": 4, "id": "options", "children": []},
        {"tag": "INPUT_time", "ref": 5, "id": "tt", "value": "", "children": []},
        {"tag": "LI", "ref": 6, "children": [{"tag": "A", "ref": 7, "text": "Tab #1",
                                              "children": []}]},
        {"tag": "DIV", "ref": 8, "children": [{"tag": "P", "ref": 9, "text": "far down",
                                               "children": []}]},
        {"tag": "BUTTON", "ref": 10, "text": "Submit", "children": []}]}
    extra = {"4": {"options": ["Chad", "Peru"], "selected": ["Chad"], "visible": True},
             "5": {"type": "time", "focused": True, "visible": True},
             "6": {"role": "tab", "expanded": False, "visible": True},
             "8": {"scrollable": True, "visible": True},
             "9": {"visible": False}, "10": {"visible": True, "disabled": True}}
    rows = page.elements(dom, extra)
    assert [page.line(r) for r in rows] == [
        '[4] combobox "options" value="Chad" options: "Chad", "Peru"',
        '[5] textbox "tt" value="" (focused)',
        '[7] link "Tab #1" (collapsed)',  # the tab's own link, carrying the tab's state
        '[9] text "far down" (not visible)',
        '[10] button "Submit" (disabled)']
    rows[1]["text"] = "tt"
    listed = page.admissible(rows, [("target", "2:45PM")])
    assert listed == ['select "Chad" in [4]', 'select "Peru" in [4]', 'click [5] textbox "tt"',
                      'type "14:45" into [5]', 'type "2:45PM" into [5]',
                      'press "Enter" on [5]',
                      'click [7] link "Tab #1"', 'click [9] text "far down"',
                      'click [10] button "Submit"']
    rows[2]["scrollable"] = True
    assert page.admissible(rows, [])[-2:] == ["scroll 0 100", "scroll 0 -100"]


def test_envs_show_lists_every_make_tasks_knob():
    from typer.testing import CliRunner

    from rlany.cli import app
    from rlany.envs.miniwob import make_tasks

    out = CliRunner().invoke(app, ["envs", "show", "miniwob"]).output
    knobs = set(inspect.signature(make_tasks).parameters) - {"n", "seed", "split"}
    assert knobs == {"tasks", "slack", "screens", "prefix"}
    for knob in knobs:
        assert re.search(rf"^    {knob} ", out, re.MULTILINE), knob


# -- in the browser --------------------------------------------------------------------
@needs_chromium
def test_select_option_in_both_forms_and_a_missing_option():
    env, obs = start("choose-list", seed=5)
    menu = row(env, "combobox")
    target = dict(env.fields)["target"]
    other = next(o for o in menu["options"] if o != target)
    r = env.step(f"select_option('{menu['ref']}', '{other}')")
    assert r.action == f'select "{other}" in [{menu["ref"]}]' and not r.done
    assert row(env, "combobox")["selected"] == [other] and r.info["label"] == -1
    r = env.step(f"select_option('{menu['ref']}', 'Atlantis')")
    assert r.obs.startswith(f'Error: no option "Atlantis" in [{menu["ref"]}] (options: "')
    r = env.step(numbered(env, f'select "{target}" in [{menu["ref"]}]'))
    assert row(env, "combobox")["selected"] == [target] and r.info["label"] == 1
    assert f'value="{target}"' in r.obs
    r = env.step(env.expert_action())
    assert r.done and r.success


@needs_chromium
def test_fill_types_exactly_what_was_answered_the_keneth_case():
    env, obs = start("enter-text", seed=2)
    box = row(env, "textbox")
    word = dict(env.fields)["target"]
    upper = f'type "{word.upper()}" into [{box["ref"]}]'
    assert upper in env.choices() and f'type "{word.lower()}" into [{box["ref"]}]' in \
        env.choices()
    env.step(numbered(env, upper))
    assert row(env, "textbox")["value"] == word.upper()
    env.step(f"fill('{box['ref']}', '{word.lower()}')")
    assert row(env, "textbox")["value"] == word.lower()
    mixed = "KeNeTh o'Neil"
    r = env.step(f'type "{mixed}" into [{box["ref"]}]')  # not listed: typed as answered
    assert r.action == f'type "{mixed}" into [{box["ref"]}]'
    assert row(env, "textbox")["value"] == mixed and f'value="{mixed}" (focused)' in r.obs
    env.step(f"press('{box['ref']}', 'Control+a')")
    r = env.step(f'press "Backspace" on [{box["ref"]}]')
    assert row(env, "textbox")["value"] == "" and "Error" not in r.obs


@needs_chromium
def test_press_enter_in_both_forms_runs_the_terminal_and_errors_are_one_line():
    env, obs = start("terminal")
    box = row(env, "textbox", id="terminal-target")
    env.step(f"fill('{box['ref']}', 'help')")
    assert any(r["text"] == "help" for r in env.rows if r["id"] == "active-input")
    r = env.step(numbered(env, f'press "Enter" on [{box["ref"]}]'))
    assert "ls: list contents" in r.obs and r.action == f'press "Enter" on [{box["ref"]}]'
    env.step(f"fill('{box['ref']}', 'xyzzy')")
    r = env.step(f"press('{box['ref']}', 'Enter')")
    assert "Command not found." in r.obs
    assert env.step("click('999')").obs.startswith("Error: no element [999] on the page\n")
    r = env.step(f"press('{box['ref']}', 'Hyper+q')")
    assert r.obs.startswith("Error: press: unknown modifier 'Hyper'\n")
    assert r.info["action_error"] == "press: unknown modifier 'Hyper'"
    r = env.step(f"select_option('{box['ref']}', 'x')")
    assert r.obs.startswith(f"Error: [{box['ref']}] is not a <select> element (text)\n")
    r = env.step("fill('7')")  # a call that cannot be read: said, nothing done
    assert r.action is None and r.obs.startswith("Error: fill(bid, value): missing value\n")


@needs_chromium
def test_a_date_field_takes_its_format_or_the_keys_a_person_types():
    env, obs = start("enter-date")
    box, submit = row(env, "textbox"), row(env, "button")
    written = dict(env.fields)["target"]  # 05/20/2010
    iso = page.as_date(written)  # 2010-05-20
    assert [f'type "{iso}" into [{box["ref"]}]', f'type "{written}" into [{box["ref"]}]'] == [
        a for a in env.choices() if a.startswith("type")]
    r = env.step(f"fill('{box['ref']}', 'next tuesday')")
    assert r.obs.startswith('Error: "next tuesday" is not a value of a date input')
    r = env.step(f"fill('{submit['ref']}', 'x')")
    assert r.obs.startswith(f"Error: [{submit['ref']}] is not a text field (button)")
    r = env.step(f'type "{written}" into [{box["ref"]}]')  # typed as keys: Chromium reads it
    assert row(env, "textbox")["value"] == iso and r.info["label"] == 1
    env.step(f"fill('{box['ref']}', '1999-12-31')")  # set in the input's own format
    assert row(env, "textbox")["value"] == "1999-12-31"
    r = env.step(env.expert_action())
    assert r.action == f'type "{iso}" into [{box["ref"]}]'
    assert env.step(env.expert_action()).success


@needs_chromium
def test_hover_scroll_and_a_coordinate_click():
    env, obs = start("click-test")
    button = row(env, "button")
    r = env.step(f"hover('{button['ref']}')")
    assert r.action.startswith(f"hover [{button['ref']}] button") and "Error" not in r.obs
    assert env.step("scroll(0, 50)").action == "scroll 0 50"
    r = env.step("mouse_click(900, 900)")  # outside the window
    assert r.obs.startswith("Error: mouse_click(x, y): (900, 900) is off the page")
    node = next(n for n in _nodes(env.state["dom"]) if n.get("ref") == button["ref"])
    x, y = node["left"] + node["width"] / 2, node["top"] + node["height"] / 2
    r = env.step(f"mouse_click({x:.0f}, {y:.0f})")
    assert r.done and r.success and r.action == f"click at {x:.0f} {y:.0f}"


@needs_chromium
def test_what_the_listed_form_cannot_carry_runs_as_read_without_a_browser_restart():
    """Numbers and keys whose listed line would not read back (`scroll 0 1e+07`, a key with
    a newline) run as they were read, or are refused in one line: no exception, no
    browser restart, no replay."""
    from rlany.envs.browser import browser

    env, obs = start("click-test")
    b = browser()
    restarts, generation = b.restarts, b.generation
    r = env.step("scroll(0, 10000000)")
    assert r.action == "scroll 0 10000000" and "action_error" not in r.info
    button = row(env, "button")
    for answer, why in [("mouse_click(1234567, 5)", "(1234567, 5) is off the page"),
                        ("scroll(0, 1e400)", "the numbers must be finite"),
                        ("click at 1.23457e+06 5", "is off the page"),
                        (f"press('{button['ref']}', 'a\\nb')", "press: unknown key 'a\\nb'")]:
        r = env.step(answer)
        assert not r.done and why in r.info["action_error"], (answer, r.info)
        assert r.obs.startswith("Error: ") and "\n" not in r.info["action_error"]
        assert "browser_retries" not in r.info
    assert (b.restarts, b.generation) == (restarts, generation)
    r = env.step(f"click('{button['ref']}')")  # the page still works
    assert r.done and r.success


def _nodes(node: dict):
    yield node
    for child in node.get("children", []):
        yield from _nodes(child)


@needs_chromium
@pytest.mark.parametrize("name", ["choose-list", "enter-time", "click-collapsible",
                                  "terminal"])
def test_the_new_experts_solve_their_pages(name):
    env, obs = start(name, seed=7)
    results = []
    while not results or not results[-1].done:
        results.append(env.step(env.expert_action() or "nothing"))
    assert results[-1].success and all(r.info["label"] == 1 for r in results)
    assert "action_error" not in results[-1].info


def test_act_is_a_plain_value():
    assert (Act("click", ref=3), None) == acts.from_plain('click [3] button "Whatever it says"')

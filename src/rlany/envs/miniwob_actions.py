"""MiniWoB actions: BrowserGym's high-level set, read in two forms and run with Selenium.

An answer names one action in either form (the observation lists the first, numbered):

    listed / plain form                  BrowserGym's call         what it does
    click [REF] KIND "NAME"              click('REF')              MiniWoB's element click
    type "TEXT" into [REF]               fill('REF', 'TEXT')       replace a field's value
    select "OPTION" in [REF]             select_option('REF', 'OPTION')   pick in a <select>
    select ["A", "B"] in [REF]           select_option('REF', ['A', 'B']) (multiple)
    press "KEYS" on [REF]                press('REF', 'Control+a') focus, press the keys
    hover [REF] KIND "NAME"              hover('REF')              move the pointer onto it
    scroll DX DY                         scroll(DX, DY)            wheel at the pointer
    click at X Y                         mouse_click(X, Y)         a click at page pixels

A call is read with Python's own parser (`ast`), so its quoting and escapes are Python's;
the plain form keeps TEXT exactly as written between the first and the last quote. Either
way the text typed is the text answered, case and all. `click [REF]` and `hover [REF]`
may leave out KIND "NAME" (the page's own are put back).

`fill`: a text field gets the keys typed (key events fire, as a page may listen to them)
after its value is cleared; a date, time, month, week, color or range input gets the value
set, as Playwright's fill does, when it is in that input's format (`2016-05-21`, `14:05`),
else (date and time kinds) the keys typed, as a person types `05/21/2016` or `2:05PM` into
it (Chromium reads them by its locale, en-US here); it fails when the field stays empty.
`press` keys are Playwright's names: Enter, Tab, Escape, Backspace, Delete, ArrowUp/Down/
Left/Right, Home, End, PageUp, PageDown, Insert, Space, F1-F12, KeyA/Digit0-style names or
one character, with modifiers Control, Shift, Alt, Meta joined by `+`. `scroll` turns the
wheel where the pointer is (the last hover or coordinate click; at first the task area's
centre, 80,130). Numbers are read as written and shown exactly (`scroll 0 10000000`);
either form refuses, in one line, numbers that are not finite, a scroll past 2^31-1 pixels
and a click off the 500x400 window. `run` returns the page's error in one line when an
action cannot be done (no such element, not a text field, no such option, an unknown key).
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass

from rlany.envs.browser import WINDOW

# call name -> its parameters, BrowserGym's names
CALLS = {"click": ("bid",), "fill": ("bid", "value"), "select_option": ("bid", "options"),
         "press": ("bid", "key_comb"), "hover": ("bid",), "scroll": ("delta_x", "delta_y"),
         "mouse_click": ("x", "y")}
VERBS = {"click": "click", "fill": "type", "select_option": "select", "press": "press",
         "hover": "hover", "scroll": "scroll", "mouse_click": "click_at"}
SET_VALUE = {"date", "time", "month", "week", "color", "range", "datetime-local"}
POINTER = (80, 130)  # the pointer's place before any hover or coordinate click
MAX_DELTA = 2**31 - 1  # WebDriver's wheel deltas are 32-bit integers


@dataclass(frozen=True)
class Act:
    verb: str  # click | type | select | press | hover | scroll | click_at
    ref: int | None = None
    text: str = ""  # type: the text; press: the keys
    options: tuple[str, ...] = ()  # select
    x: float = 0.0  # scroll: delta x; click_at: x
    y: float = 0.0  # scroll: delta y; click_at: y


def _num(v: float) -> str:
    """Exactly as it reads back: 10000000 (not 1e+07), 80.5."""
    return str(int(v)) if v.is_integer() else repr(v)


def _float(v: int | float) -> float:
    try:
        return float(v)
    except OverflowError:  # an int past float's range
        return math.inf if v > 0 else -math.inf


def _numbers(verb: str, x: float, y: float) -> str | None:
    """What is wrong with a scroll's deltas or a click's point (one line), else None."""
    if not (math.isfinite(x) and math.isfinite(y)):
        return "the numbers must be finite"
    if verb == "scroll":
        return None if max(abs(x), abs(y)) <= MAX_DELTA else \
            f"a scroll moves at most {MAX_DELTA} pixels"
    if 0 <= x < WINDOW[0] and 0 <= y < WINDOW[1]:
        return None
    return (f"({x:.10g}, {y:.10g}) is off the page (x in 0..{WINDOW[0] - 1}, "
            f"y in 0..{WINDOW[1] - 1})")


def show(act: Act, rows: list[dict]) -> str:
    """The action's listed (plain) form; click and hover carry the element's kind and name."""
    row = next((r for r in rows if r["ref"] == act.ref), None)
    named = f' {row["kind"]} "{row["text"][:30]}"' if row else ""
    if act.verb in ("click", "hover"):
        return f"{act.verb} [{act.ref}]{named}"
    if act.verb == "type":
        return f'type "{act.text}" into [{act.ref}]'
    if act.verb == "select":
        opts = (f'"{act.options[0]}"' if len(act.options) == 1
                else json.dumps(list(act.options), ensure_ascii=False))
        return f"select {opts} in [{act.ref}]"
    if act.verb == "press":
        return f'press "{act.text}" on [{act.ref}]'
    if act.verb == "scroll":
        return f"scroll {_num(act.x)} {_num(act.y)}"
    return f"click at {_num(act.x)} {_num(act.y)}"


_N = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?i:inf(?:inity)?|nan))"
_PLAIN = [
    ("click", re.compile(r"click \[(\d+)\](?:\s.*)?", re.DOTALL)),
    ("hover", re.compile(r"hover \[(\d+)\](?:\s.*)?", re.DOTALL)),
    ("type", re.compile(r'type "(.*)" into \[(\d+)\]', re.DOTALL)),
    ("select", re.compile(r'select ("(?:.*)"|\[.*\]) in \[(\d+)\]', re.DOTALL)),
    ("press", re.compile(r'press "(.+)" on \[(\d+)\]', re.DOTALL)),
    ("scroll", re.compile(rf"scroll \(?{_N},?\s+{_N}\)?")),
    ("click_at", re.compile(rf"click at \(?{_N},?\s+{_N}\)?")),
]


def from_plain(line: str) -> tuple[Act | None, str | None]:
    """The plain form (`type "x" into [5]`) -> (the action, None); a scroll or a click at
    numbers it cannot do -> (None, what is wrong); anything else (None, None)."""
    for verb, rx in _PLAIN:
        m = rx.fullmatch(line.strip())
        if not m:
            continue
        if verb in ("click", "hover"):
            return Act(verb, ref=int(m[1])), None
        if verb in ("type", "press"):
            return Act(verb, ref=int(m[2]), text=m[1]), None
        if verb == "select":
            opts = _options(m[1][1:-1] if m[1].startswith('"') else _literal(m[1]))
            return (Act(verb, ref=int(m[2]), options=opts), None) if opts else (None, None)
        x, y = float(m[1]), float(m[2])
        why = _numbers(verb, x, y)
        usage = "scroll DX DY" if verb == "scroll" else "click at X Y"
        return (None, f"{usage}: {why}") if why else (Act(verb, x=x, y=y), None)
    return None, None


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def _options(value) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    return ()


def from_call(line: str) -> tuple[Act | None, str | None]:
    """BrowserGym's call form (`fill('5', 'KENETH')`) -> (the action, None); a call of a
    known name with wrong arguments -> (None, what is wrong); anything else (None, None)."""
    try:
        node = ast.parse(line.strip().strip("`").strip(), mode="eval").body
    except SyntaxError:
        return None, None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in CALLS):
        return None, None
    name, params = node.func.id, CALLS[node.func.id]
    usage = f"{name}({', '.join(params)})"
    try:
        values = [ast.literal_eval(a) for a in node.args]
        named = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except (ValueError, SyntaxError):
        return None, f"{usage}: the arguments must be literal values"
    if named.pop("button", "left") != "left" or named.pop("modifiers", []):
        return None, f"{usage}: only a plain left click is supported"
    if len(values) > len(params) or set(named) - set(params[len(values):]):
        return None, f"{usage}: unexpected arguments"
    args = dict(zip(params, values)) | named
    if set(params) - set(args):
        return None, f"{usage}: missing {', '.join(p for p in params if p not in args)}"
    verb = VERBS[name]
    if "bid" in args:
        bid = str(args["bid"])
        if not bid.isdecimal() or len(bid) > 9:  # '²' is a digit int() refuses
            return None, f"{usage}: bid must be an element's number, got {bid!r:.40}"
        ref = int(bid)
        if verb == "select":
            opts = _options(args["options"])
            return (Act(verb, ref=ref, options=opts), None) if opts else (
                None, f"{usage}: options must be a string or a list of strings")
        text = args.get("value", args.get("key_comb", ""))
        if not isinstance(text, str):
            return None, f"{usage}: {params[1]} must be a string"
        return Act(verb, ref=ref, text=text), None
    x, y = (args[p] for p in params)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)):
        return None, f"{usage}: {params[0]} and {params[1]} must be numbers"
    x, y = _float(x), _float(y)
    why = _numbers(verb, x, y)
    return (None, f"{usage}: {why}") if why else (Act(verb, x=x, y=y), None)


# -- running them in the browser -----------------------------------------------------------
_ELEMENT = "return core.previousDOMInfo[arguments[0]] || null;"
_CLICK = "return core.elementClick(arguments[0]);"
_FOCUS = "arguments[0].focus(); return document.activeElement === arguments[0];"
_SET = """var e = arguments[0]; e.value = arguments[1];
e.dispatchEvent(new Event('input', {bubbles: true}));
e.dispatchEvent(new Event('change', {bubbles: true})); return e.value;"""
_CLEAR = """var e = arguments[0]; if (e.isContentEditable) { e.textContent = ''; }
else { e.value = ''; }"""
_KIND = """var e = arguments[0]; if (e.isContentEditable) return 'editable';
if (e instanceof HTMLTextAreaElement) return 'text';
if (e instanceof HTMLInputElement) return e.type; return e.tagName.toLowerCase();"""
_TEXT_TYPES = {"text", "password", "email", "number", "search", "tel", "url", "editable"}
_KEYS = {"Enter": "ENTER", "Tab": "TAB", "Escape": "ESCAPE", "Backspace": "BACKSPACE",
         "Delete": "DELETE", "ArrowUp": "ARROW_UP", "ArrowDown": "ARROW_DOWN",
         "ArrowLeft": "ARROW_LEFT", "ArrowRight": "ARROW_RIGHT", "Home": "HOME", "End": "END",
         "PageUp": "PAGE_UP", "PageDown": "PAGE_DOWN", "Insert": "INSERT", "Space": "SPACE",
         **{f"F{k}": f"F{k}" for k in range(1, 13)}}
_MODIFIERS = {"Control": "CONTROL", "Shift": "SHIFT", "Alt": "ALT", "Meta": "META"}


def keys(comb: str) -> tuple[list[str], str] | str:
    """Playwright's key names -> (Selenium's modifier keys, the key); else what is wrong."""
    from selenium.webdriver.common.keys import Keys

    parts = comb.split("+")
    if comb == "+" or comb.endswith("++"):  # the key is "+" itself
        parts = [p for p in comb[:-2].split("+") if p] + ["+"]
    *mods, key = parts
    bad = [m for m in mods if m not in _MODIFIERS]
    if bad or not key:
        return f"unknown modifier {bad[0]!r}" if bad else f"no key in {comb!r}"
    if key in _KEYS:
        key = getattr(Keys, _KEYS[key])
    elif re.fullmatch(r"Key[A-Z]|Digit\d", key):
        key = key[-1].lower()
    elif len(key) != 1:
        return f"unknown key {key!r}"
    return [getattr(Keys, _MODIFIERS[m]) for m in mods], key


def run(driver, act: Act, pointer: list[float]) -> str | None:
    """Do the action in the page; None, or the page's error in one line. `pointer` is
    the mouse's place, [x, y], moved by hover and coordinate clicks."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.wheel_input import ScrollOrigin

    chain = ActionChains(driver, duration=0)
    try:
        if act.verb == "scroll":
            origin = ScrollOrigin.from_viewport(int(pointer[0]), int(pointer[1]))
            chain.scroll_from_origin(origin, int(act.x), int(act.y)).perform()
            return None
        if act.verb == "click_at":
            chain.w3c_actions.pointer_action.move_to_location(int(act.x), int(act.y))
            chain.w3c_actions.pointer_action.click()
            chain.w3c_actions.perform()
            pointer[:] = [act.x, act.y]
            return None
        el = driver.execute_script(_ELEMENT, act.ref)
        if el is None:
            return f"no element [{act.ref}] on the page"
        return _on_element(driver, chain, el, act, pointer)
    except WebDriverException as e:
        what = (e.msg or type(e).__name__).strip().splitlines()[0]
        return f"{act.verb} failed: {what[:160]}"


def _on_element(driver, chain, el, act: Act, pointer: list[float]) -> str | None:
    from selenium.common.exceptions import NoSuchElementException
    from selenium.webdriver.support.select import Select

    if act.verb == "click":
        done = driver.execute_script(_CLICK, act.ref)
        return None if done is True else f"click [{act.ref}] failed: {str(done)[:160]}"
    if act.verb == "hover":
        chain.move_to_element(el).perform()
        rect = el.rect
        pointer[:] = [rect["x"] + rect["width"] / 2, rect["y"] + rect["height"] / 2]
        return None
    kind = driver.execute_script(_KIND, el)
    if act.verb == "select":
        if kind != "select":
            return f"[{act.ref}] is not a <select> element ({kind})"
        menu = Select(el)
        if len(act.options) > 1 and not menu.is_multiple:
            return f"[{act.ref}] takes one option, {len(act.options)} given"
        if menu.is_multiple:
            menu.deselect_all()
        for want in act.options:
            try:
                menu.select_by_value(want)
            except NoSuchElementException:
                try:
                    menu.select_by_visible_text(want)
                except NoSuchElementException:
                    have = ", ".join(f'"{o.text}"' for o in menu.options[:8])
                    return f'no option "{want[:40]}" in [{act.ref}] (options: {have})'
        return None
    if act.verb == "press":
        found = keys(act.text)
        if isinstance(found, str):
            return f"press: {found}"
        if not driver.execute_script(_FOCUS, el):
            return f"[{act.ref}] cannot take the focus"
        mods, key = found
        for m in mods:
            chain.key_down(m)
        chain.send_keys(key)
        for m in reversed(mods):
            chain.key_up(m)
        chain.perform()
        return None
    if kind in SET_VALUE:  # fill: set, as Playwright does, in the input's own format
        if driver.execute_script(_SET, el, act.text) == act.text:
            return None
        if kind in ("range", "color"):
            return f'"{act.text[:40]}" is not a value of a {kind} input'
    elif kind not in _TEXT_TYPES:
        return f"[{act.ref}] is not a text field ({kind})"
    # type the keys, as a person does (a date or time input reads them by its locale,
    # from its first part: focused anew, not where an earlier typing left it)
    if kind in SET_VALUE:
        driver.execute_script("arguments[0].blur();", el)
    driver.execute_script(_CLICK, act.ref)
    if not driver.execute_script(_FOCUS, el):
        return f"[{act.ref}] cannot take the focus"
    driver.execute_script(_CLEAR, el)
    chain.send_keys(act.text).perform()
    if kind in SET_VALUE and not driver.execute_script("return arguments[0].value;", el):
        return f'"{act.text[:40]}" is not a value of a {kind} input (it reads "")'
    return None

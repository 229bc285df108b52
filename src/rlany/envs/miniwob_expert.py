"""MiniWoB experts: scripted solvers that read MiniWoB's fields and the page's rows.

`expert(task, fields, rows, history)` lists the next actions of the shortest plans from
the current page (the first is the expert's pick), [] when the task is done or has no
expert here. `PLANS` names the tasks that have one, with the most steps its plan takes;
`LADDERS` orders them easier -> harder for `edits`. The experts of choose-list (select),
enter-date and enter-time (a date/time input's value), click-collapsible (an accordion's
`tab` header) and terminal (type a command, press Enter) need the actions and rows that
came with the BrowserGym action set (issue 51); every expert solves its page
(src/rlany/envs/README.md, "miniwob").
"""

from __future__ import annotations

import re

from rlany.envs.miniwob_page import as_date, as_time, click, press, select, type_


def _find(rows: list[dict], kind: str | tuple, text: str | None = None) -> list[dict]:
    kinds = (kind,) if isinstance(kind, str) else kind
    found = [r for r in rows if r["kind"] in kinds]
    if text is None:
        return found
    exact = [r for r in found if r["text"] == text]
    return exact or [r for r in found if r["text"].strip(".,;:!?") == text.strip(".,;:!?")]


def _fill_then(boxes: list[tuple[dict, str]], submit: list[dict]) -> list[str]:
    """Type each wanted value where it is not yet, then click submit."""
    todo = [type_(want, box) for box, want in boxes if box.get("value") != want]
    return todo or [click(r) for r in submit[:1]]


def _transform(text: str, case: str) -> str:
    return text.upper() if case == "upper" else text.lower() if case == "lower" else text


def _terminal(f: dict, rows: list[dict]) -> list[str]:
    """`ls`, Enter, then `rm` a file with the asked extension (or none), Enter."""
    box = [r for r in rows if r["id"] == "terminal-target"]
    if not box:
        return []
    texts = [r for r in rows if r["kind"] == "text"]
    listed = next((texts[k + 1]["text"].split() for k, r in enumerate(texts[:-1])
                   if "command" in r["classes"] and r["text"] == "ls"
                   and "output" in texts[k + 1]["classes"]), None)
    want = "ls"
    if listed is not None:
        ext = re.search(r"extension \.(\S+)", f.get("target", ""))
        hits = [n for n in listed if (n.endswith("." + ext[1]) if ext else "." not in n)]
        if not hits:
            return []
        want = f"rm {hits[0]}"
    typed = next((r["text"] for r in rows if r["id"] == "active-input"), "")
    if typed == want:
        return [press("Enter", box[0])]
    return [press("Backspace", box[0])] if typed else [type_(want, box[0])]


def _value_then_submit(rows: list[dict], kind: str, written: str) -> list[str]:
    """A date/time input: its value in the input's format (the expert's pick) or as the
    instruction writes it (typed as keys: as good), then Submit."""
    want = (as_time if kind == "time" else as_date)(written)
    boxes = [r for r in rows if r["kind"] == "textbox" and r.get("type") == kind]
    if not boxes or want is None:
        return []
    if boxes[0]["value"] == want:
        return [click(r) for r in _find(rows, "button")[:1]]
    return [type_(want, boxes[0]), type_(written, boxes[0])]


def expert(task: str, fields: list, rows: list[dict], history: list[str]) -> list[str]:
    """The next actions of the shortest plans (the first is the expert's pick); []: none."""
    f = {k: str(v) for k, v in fields}
    target = f.get("target", "")
    if task in ("click-test", "click-test-2", "click-button"):
        hits = _find(rows, "button") if task == "click-test" else _find(rows, "button", target)
        return [click(r) for r in hits[:1]]
    if task == "click-button-sequence":
        one, two = _find(rows, "button", "ONE"), _find(rows, "button", "TWO")
        if not one or not two:
            return []
        return [click(two[0])] if click(one[0]) in history else [click(one[0])]
    if task == "click-link":
        return [click(r) for r in _find(rows, ("text", "link"), target)[:1]]
    if task == "click-tab":
        return [click(r) for r in _find(rows, "link", f"Tab #{target}")[:1]]
    if task in ("focus-text", "focus-text-2"):
        boxes = _find(rows, "textbox")
        k = int(target) - 1 if target.isdigit() else 0
        return [click(boxes[k])] if 0 <= k < len(boxes) else []
    if task in ("enter-text", "enter-text-2"):
        want = _transform(f.get("text", target), f.get("case", ""))
        boxes, submit = _find(rows, "textbox"), _find(rows, "button", "Submit")
        return _fill_then([(boxes[0], want)], submit) if boxes else []
    if task == "enter-password":
        boxes = _find(rows, "textbox")
        return _fill_then([(b, target) for b in boxes], _find(rows, "button", "Submit"))
    if task == "login-user":
        user = [r for r in rows if r["kind"] == "textbox" and r["id"] == "username"]
        pw = [r for r in rows if r["kind"] == "textbox" and r["id"] == "password"]
        if not user or not pw:
            return []
        return _fill_then([(user[0], f.get("username", "")), (pw[0], f.get("password", ""))],
                          _find(rows, "button", "Login"))
    if task == "click-dialog":
        return [click(r) for r in rows if r["kind"] == "button"
                and "ui-dialog-titlebar-close" in r["classes"]][:1]
    if task == "click-option":
        pick = [r for r in _find(rows, "radio", target) if not r["checked"]]
        return [click(pick[0])] if pick else [click(r) for r in
                                              _find(rows, "button", "Submit")[:1]]
    if task == "click-checkboxes":
        wanted = {v for k, v in f.items() if k.startswith("target")}
        flip = [click(r) for r in _find(rows, "checkbox") if r["checked"] != (r["text"] in wanted)]
        return flip or [click(r) for r in _find(rows, "button", "Submit")[:1]]
    return _new(task, f, rows)


def _new(task: str, f: dict, rows: list[dict]) -> list[str]:
    """The pages that need the actions and rows of the BrowserGym set."""
    target = f.get("target", "")
    if task == "choose-list":
        menu = _find(rows, "combobox")
        if not menu or target not in menu[0]["options"]:
            return []
        if menu[0]["selected"] != [target]:
            return [select(target, menu[0])]
        return [click(r) for r in _find(rows, "button", "Submit")[:1]]
    if task == "enter-date":
        return _value_then_submit(rows, "date", target)
    if task == "enter-time":
        return _value_then_submit(rows, "time", target)
    if task == "click-collapsible":
        heads = [r for r in rows if r["kind"] == "tab" and r["text"].startswith("Section")]
        if heads and not heads[0].get("expanded"):
            return [click(heads[0])]
        return [click(r) for r in _find(rows, "button", "Submit")[:1]] if heads else []
    if task == "terminal":
        return _terminal(f, rows)
    return []


# task -> (most steps its expert plan takes, what it asks: the rewriter's view)
PLANS = {
    "click-test": (1, "click the only button"),
    "click-test-2": (1, "click the button named in the instruction, of two"),
    "click-button": (1, "click the button named in the instruction, among several"),
    "click-button-sequence": (2, "click button ONE, then button TWO"),
    "click-link": (1, "click the link named in the instruction, inside a paragraph"),
    "click-tab": (1, "click the tab named in the instruction"),
    "focus-text": (1, "put the focus into the only text box"),
    "focus-text-2": (1, "put the focus into the n-th of three text boxes"),
    "enter-text": (2, "type the given text into the text box and press Submit"),
    "enter-text-2": (2, "type the given text in upper/lower case and press Submit"),
    "enter-password": (3, "type the password into both fields and press Submit"),
    "login-user": (3, "type a username and a password and press Login"),
    "click-dialog": (1, "close the dialog by its x button"),
    "click-option": (2, "select the named radio option and press Submit"),
    "click-checkboxes": (7, "tick exactly the named check boxes and press Submit"),
    "choose-list": (2, "pick the named item in a drop-down list and press Submit"),
    "enter-date": (2, "enter the given date into a date field and press Submit"),
    "enter-time": (2, "enter the given time into a time field and press Submit"),
    "click-collapsible": (2, "expand the collapsed section and press Submit"),
    "terminal": (4, "in a terminal, list the files and delete the one asked for"),
}
# easier -> harder neighbours: `edits` moves a task one rung along a ladder
LADDERS = (("click-test", "click-test-2", "click-button", "click-button-sequence"),
           ("click-link", "click-tab", "click-dialog"),
           ("focus-text", "focus-text-2"),
           ("enter-text", "enter-text-2"),
           ("enter-text", "enter-password", "login-user"),
           ("click-option", "click-checkboxes"),
           ("click-collapsible", "choose-list"),
           ("enter-date", "enter-time", "terminal"))

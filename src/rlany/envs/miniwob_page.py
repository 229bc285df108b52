"""MiniWoB pages as text: the interactive elements, the admissible actions, and the expert.

`elements(dom)` flattens MiniWoB's `core.getDOMInfo()` tree into rows (ref, kind, text,
value, checked) for the elements an agent can act on: buttons, links, text boxes, check
boxes and radios (named by their label), and leaf elements with text (a link styled as a
span, a paragraph). Refs are MiniWoB's own: stable for an element within an episode.

Actions (the strings the policy answers with, listed every turn):
    click [REF] KIND "TEXT"          click the element (a text box gets the focus)
    type "TEXT" into [REF]           replace the text box's value with TEXT (typed keys)
TEXT candidates for typing are the instruction's quoted values (MiniWoB's fields), as
written and in upper/lower case, so `--constrain-actions` has a finite list.

`expert(task, fields, rows, history)` lists the next actions of the shortest plans from
the current page for the tasks in `PLANS` (MiniWoB exposes the target in its fields and the
DOM), [] when the task is done or has no expert here.
"""

from __future__ import annotations

import re

TEXTBOXES = {"input_text", "input_password", "input_email", "input_number", "input_search",
             "input_tel", "input_url", "textarea"}
KINDS = {"button": "button", "a": "link", "input_checkbox": "checkbox", "input_radio": "radio",
         "input_submit": "button", "input_button": "button", "select": "select",
         **{t: "textbox" for t in TEXTBOXES}}


def _text_under(node: dict) -> str:
    if node.get("text"):
        return str(node["text"]).strip()
    return " ".join(filter(None, (_text_under(c) for c in node.get("children", [])))).strip()


def elements(dom: dict) -> list[dict]:
    rows: list[dict] = []

    def walk(node: dict, label: str) -> None:
        tag, ref = str(node.get("tag", "")).lower(), node.get("ref", 0)
        if tag == "label":
            label = _text_under(node)
        kind = KINDS.get(tag)
        children = node.get("children", [])
        if kind is None and not children and node.get("text") and ref > 0 and tag != "body":
            kind = "text"
        if kind and ref > 0:
            text = label if kind in ("checkbox", "radio", "textbox") else _text_under(node)
            if kind == "textbox" and not text:
                text = node.get("id") or ""
            row = {"ref": ref, "kind": kind, "text": " ".join(text.split())[:60],
                   "id": node.get("id") or "", "classes": node.get("classes") or ""}
            if kind == "textbox":
                row["value"] = str(node.get("value") or "")
            if kind in ("checkbox", "radio"):
                row["checked"] = bool(node.get("value"))
            rows.append(row)
        for child in children:
            walk(child, label)

    walk(dom, "")
    return rows


def render(utterance: str, rows: list[dict], actions: list[str]) -> str:
    lines = []
    for r in rows:
        line = f'[{r["ref"]}] {r["kind"]} "{r["text"]}"'
        if "value" in r:
            line += f' value="{r["value"]}"'
        if "checked" in r:
            line += " (checked)" if r["checked"] else " (unchecked)"
        lines.append(line)
    acts = "\n".join(f"{k + 1}. {a}" for k, a in enumerate(actions))
    return (f"Instruction: {utterance}\nPage elements:\n" + "\n".join(lines)
            + f"\nAdmissible actions:\n{acts}")


def click(row: dict) -> str:
    return f'click [{row["ref"]}] {row["kind"]} "{row["text"][:30]}"'


def type_(text: str, row: dict) -> str:
    return f'type "{text}" into [{row["ref"]}]'


_BG_CLICK = re.compile(r"""^click\(\s*['"](\d+)['"]\s*\)$""")
_BG_FILL = re.compile(r"""^fill\(\s*['"](\d+)['"]\s*,\s*(['"])(.*)\2\s*\)$""", re.DOTALL)


def from_browsergym(line: str, actions: list[str]) -> str | None:
    """BrowserGym's high-level answer in our action syntax: `click('12')` -> the listed
    `click [12] ...`, `fill('5', 'text')` -> `type "text" into [5]` (case kept); None for
    any other line."""
    if m := _BG_CLICK.match(line.strip()):
        return next((a for a in actions if a.startswith(f"click [{m[1]}]")), None)
    if m := _BG_FILL.match(line.strip()):
        return f'type "{m[3]}" into [{m[1]}]'
    return None


def candidates(fields: list) -> list[str]:
    out: list[str] = []
    for _, value in fields:
        for v in (str(value), str(value).upper(), str(value).lower()):
            if v.strip() and v not in out and not v.isdigit():
                out.append(v)
    return out


def admissible(rows: list[dict], fields: list) -> list[str]:
    acts = [click(r) for r in rows]
    texts = candidates(fields)
    acts += [type_(t, r) for r in rows if r["kind"] == "textbox" for t in texts]
    return acts


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
}
# easier -> harder neighbours: `edits` moves a task one rung along a ladder
LADDERS = (("click-test", "click-test-2", "click-button", "click-button-sequence"),
           ("click-link", "click-tab", "click-dialog"),
           ("focus-text", "focus-text-2"),
           ("enter-text", "enter-text-2"),
           ("enter-text", "enter-password", "login-user"),
           ("click-option", "click-checkboxes"))

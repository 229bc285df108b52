"""MiniWoB pages as text: an accessibility-tree style list of the elements, and the
admissible actions.

`elements(dom, extra)` flattens MiniWoB's `core.getDOMInfo()` tree (only rendered elements;
refs are MiniWoB's own, stable for an element within an episode) into rows, one per element
an agent can act on or read: buttons, links, text fields, check boxes and radios (named by
their label), <select>s with their options, headings and elements with an ARIA widget role
(an accordion's header is a `tab`), and leaf elements with text. `extra` (the page's
`SNAPSHOT`, per ref) adds what the DOM info lacks: the ARIA role, an input's type, a
select's options, whether the element has the focus, is disabled, expanded or collapsed,
scrollable, or not visible (hidden, covered, or outside the window or its scroll box).

`render` shows them one a line, BrowserGym's axtree in a flat list:
    [5] textbox "tt" value="" (focused)
    [7] combobox "options" value="Peru" options: "Chad", "Peru", "Kenya"
    [9] tab "Section #38" (collapsed)
    [6] button "Submit" (not visible)
then the numbered admissible actions (`admissible`), per element kind: a click for each
element that is not a <select>; for a text field also `type` with each text the
instruction quotes (MiniWoB's fields, as written and in upper/lower case; for a date or
time input the field in the input's format, 2016-05-21 / 14:05, and as written) and
`press "Enter"`; for a
<select> one `select` per option; `scroll 0 100` / `scroll 0 -100` when something on the
page scrolls. Other actions (`hover`, other keys, free text, `click at X Y`) are accepted
when answered but not listed, so `--constrain-actions` keeps a short list.
"""

from __future__ import annotations

import re

from rlany.envs.miniwob_actions import Act, show

TEXTBOXES = {"input_text", "input_password", "input_email", "input_number", "input_search",
             "input_tel", "input_url", "input_date", "input_time", "input_month",
             "input_week", "input_datetime-local", "textarea"}
KINDS = {"button": "button", "a": "link", "input_checkbox": "checkbox", "input_radio": "radio",
         "input_submit": "button", "input_button": "button", "select": "combobox",
         **{t: "textbox" for t in TEXTBOXES}}
# ARIA widget roles an element may declare (jQuery UI's tabs and accordion headers, menus)
ROLES = {"tab", "menuitem", "treeitem", "option", "switch", "slider", "spinbutton"}
HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}

# Run after core.getDOMInfo(): per ref, what the DOM info does not say.
SNAPSHOT = r"""var out = {}, seen = core.previousDOMInfo;
for (var ref in seen) {
  var el = seen[ref]; if (!(el instanceof Element)) continue;
  var r = el.getBoundingClientRect(), cs = window.getComputedStyle(el);
  var hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  var x = {role: el.getAttribute('role') || '', focused: document.activeElement === el,
           visible: cs.visibility !== 'hidden' && hit !== null && (hit === el || el.contains(hit)
             || (el.labels && Array.prototype.some.call(el.labels, function (l) {
                   return l.contains(hit); })))};
  if (el.children.length === 0) x.text = el.textContent.replace(/\s+/g, ' ').trim();
  if (el.disabled) x.disabled = true;
  var ex = el.getAttribute('aria-expanded'); if (ex !== null) x.expanded = ex === 'true';
  if (el instanceof HTMLInputElement) x.type = el.type;
  if (el instanceof HTMLSelectElement) {
    x.options = Array.prototype.map.call(el.options, function (o) { return o.text.trim(); });
    x.selected = Array.prototype.map.call(el.selectedOptions,
                                          function (o) { return o.text.trim(); });
    x.multiple = el.multiple;
  }
  if (el.scrollHeight > el.clientHeight + 2 && /(auto|scroll)/.test(cs.overflowY))
    x.scrollable = true;
  out[ref] = x;
}
return out;"""


def _text_under(node: dict) -> str:
    if node.get("text"):
        return str(node["text"]).strip()
    return " ".join(filter(None, (_text_under(c) for c in node.get("children", [])))).strip()


def _kind(tag: str, node: dict, more: dict) -> str | None:
    if more.get("role") in ROLES:
        return more["role"]
    kind = KINDS.get(tag)
    if kind == "combobox" and more.get("multiple"):
        return "listbox"
    if kind is None and tag in HEADINGS and _text_under(node):
        return "heading"
    if kind is None and not node.get("children") and node.get("text") and tag != "body":
        return "text"
    return kind


def elements(dom: dict, extra: dict | None = None) -> list[dict]:
    extra = extra or {}
    rows: list[dict] = []

    def walk(node: dict, label: str) -> None:
        tag, ref = str(node.get("tag", "")).lower(), node.get("ref", 0)
        if tag == "label":
            label = _text_under(node)
        more = extra.get(str(ref), {})
        kind = _kind(tag, node, more) if ref > 0 else None
        if kind:
            text = label if kind in ("checkbox", "radio", "textbox") else (
                more.get("text") or _text_under(node))  # the page's own spaces: "rm a.gif"
            if kind in ("textbox", "combobox", "listbox") and not text:
                text = node.get("id") or ""
            row = {"ref": ref, "kind": kind, "text": " ".join(text.split())[:60],
                   "id": node.get("id") or "", "classes": node.get("classes") or "",
                   "focused": bool(more.get("focused", node.get("focused"))),
                   "visible": more.get("visible", True)}
            if kind == "textbox":
                row["value"] = str(node.get("value") or "")
                row["type"] = more.get("type", "text")
            if kind in ("checkbox", "radio"):
                row["checked"] = bool(node.get("value"))
            if kind in ("combobox", "listbox"):
                row["options"], row["selected"] = more.get("options", []), more.get(
                    "selected", [])
            for key in ("expanded", "disabled", "scrollable"):
                if key in more:
                    row[key] = more[key]
            rows.append(row)
        at = len(rows)
        for child in node.get("children", []):
            walk(child, label)
        same = [r for r in rows[at:] if kind in ROLES and r["text"] == rows[at - 1]["text"]]
        if same:  # a tab wrapping its link: one row, the link (the element that acts)
            outer = rows[at - 1]
            same[0].update({k: outer[k] for k in ("expanded",) if k in outer},
                           focused=same[0]["focused"] or outer["focused"])
            del rows[at - 1]

    walk(dom, "")
    return rows


def line(r: dict) -> str:
    out = f'[{r["ref"]}] {r["kind"]} "{r["text"]}"'
    if "value" in r:
        out += f' value="{r["value"]}"'
    if "options" in r:
        out += f' value="{", ".join(r["selected"])}" options: ' + ", ".join(
            f'"{o}"' for o in r["options"])
    if "checked" in r:
        out += " (checked)" if r["checked"] else " (unchecked)"
    if "expanded" in r:
        out += " (expanded)" if r["expanded"] else " (collapsed)"
    for key, mark in (("focused", "focused"), ("disabled", "disabled"),
                      ("scrollable", "scrollable")):
        if r.get(key):
            out += f" ({mark})"
    if not r.get("visible", True):
        out += " (not visible)"
    return out


def render(utterance: str, rows: list[dict], actions: list[str]) -> str:
    acts = "\n".join(f"{k + 1}. {a}" for k, a in enumerate(actions))
    return (f"Instruction: {utterance}\nPage elements:\n" + "\n".join(line(r) for r in rows)
            + f"\nAdmissible actions:\n{acts}")


# -- the actions' listed forms -------------------------------------------------------------
def click(row: dict) -> str:
    return show(Act("click", ref=row["ref"]), [row])


def type_(text: str, row: dict) -> str:
    return show(Act("type", ref=row["ref"], text=text), [row])


def select(option: str, row: dict) -> str:
    return show(Act("select", ref=row["ref"], options=(option,)), [row])


def press(keys: str, row: dict) -> str:
    return show(Act("press", ref=row["ref"], text=keys), [row])


def as_time(text: str) -> str | None:
    """'2:45PM', '2:45 pm', '14:45' -> '14:45' (a time input's value); else None."""
    m = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*([AaPp][Mm])?\s*", text)
    if not m or int(m[1]) > 23 or int(m[2]) > 59:
        return None
    hour = int(m[1]) % 12 + (12 if m[3] and m[3].lower() == "pm" else 0) if m[3] else int(m[1])
    return f"{hour:02d}:{m[2]}"


def as_date(text: str) -> str | None:
    """'02/03/2014' (month/day/year, MiniWoB's) -> '2014-02-03' (a date input's value)."""
    m = re.fullmatch(r"\s*(\d{1,2})/(\d{1,2})/(\d{4})\s*", text)
    return f"{m[3]}-{int(m[1]):02d}-{int(m[2]):02d}" if m else None


def candidates(fields: list, row: dict | None = None) -> list[str]:
    """The texts listed for typing into `row`: the instruction's fields (a date or time
    input: in its format)."""
    kind = (row or {}).get("type", "text")
    out: list[str] = []
    for _, value in fields:
        value = str(value)
        if kind in ("time", "date"):  # the value's format, and as written (typed as keys)
            forms = [(as_time if kind == "time" else as_date)(value)]
            forms += [value] if forms[0] else []
        else:
            forms = [value, value.upper(), value.lower()]
        for v in forms:
            if v and v.strip() and v not in out and not v.isdigit():
                out.append(v)
    return out


def admissible(rows: list[dict], fields: list) -> list[str]:
    acts: list[str] = []
    for r in rows:
        if r["kind"] in ("combobox", "listbox"):
            acts += [select(o, r) for o in r.get("options", [])]
            continue
        acts.append(click(r))
        if r["kind"] == "textbox":
            acts += [type_(t, r) for t in candidates(fields, r)] + [press("Enter", r)]
    if any(r.get("scrollable") for r in rows):
        acts += ["scroll 0 100", "scroll 0 -100"]
    return acts

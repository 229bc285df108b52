"""How the `openenv` env reads a response into the step it sends (`read`).

Run by the env inside `rlany.envs.read_action`, the one guarded call: whatever the response
makes this raise is the policy's invalid action ("Error: ...", the episode goes on), never
an env error. It does no I/O. What it returns is sent as it is, so it is checked here to
encode as the JSON a server reads: no NaN or infinity, no set or bytes (Python literals of
a tool call), no lone surrogate. A response that names no valid action returns why
(one line), shown as "Invalid action: WHY.".
"""

from __future__ import annotations

import json
import re

from rlany.envs import openenv_tools as tools
from rlany.envs import parse_action


def read(response: str, *, calls: list[tools.Tool] | None, action_json: bool,
         options: dict | None, field: str | None, kind: str
         ) -> tuple[str | None, dict | None, str | None]:
    """(the action as text, the step's data, why the response is no valid action): by the
    server's tools (`calls`), as the whole action (`action_json`), as one of the admissible
    `options` (text -> the server's value), else as the action `field` of schema `kind`."""
    action, data, why = _read(response, calls, action_json, options, field, kind)
    if data is not None:  # ValueError (NaN), TypeError (a set), UnicodeEncodeError
        json.dumps(data, allow_nan=False, ensure_ascii=False).encode()
    return action, data, why


def _read(response: str, calls: list[tools.Tool] | None, action_json: bool,
          options: dict | None, field: str | None, kind: str
          ) -> tuple[str | None, dict | None, str | None]:
    if calls is not None:
        try:
            name, arguments = tools.parse(response, calls)
        except tools.BadCall as e:
            return None, None, str(e)
        return tools.call_text(name, arguments), {"type": "call_tool", "tool_name": name,
                                                  "arguments": arguments}, None
    if action_json:
        found = tools.json_objects(response)
        if not found:
            return None, None, "the response holds no JSON object"
        return json.dumps(found[-1]), found[-1], None
    if options is not None:
        lines = [ln.strip() for ln in response.strip().splitlines() if ln.strip()]
        last = lines[-1].rstrip(".") if lines else ""
        if last not in options and not numeric(list(options)):
            lower = {a.lower(): a for a in options}
            hit, _ = parse_action(response, list(lower))
            last = lower.get(hit, last) if hit else last
        if last not in options:
            return None, None, "not one of the admissible actions"
        return last, {field: options[last]}, None
    text = response.strip()
    try:
        value = _convert(text, kind)
    except ValueError:
        return None, None, f"{field} must be {kind}, got {text[:40]!r}"
    return text, {field: value}, None


def _convert(text: str, kind: str):
    if kind == "integer":
        return int(text)
    if kind == "number":
        return float(text)
    if kind == "boolean":
        if text.lower() not in ("true", "false"):
            raise ValueError(text)
        return text.lower() == "true"
    if kind in ("array", "object"):
        return json.loads(text)
    return text


def numeric(names: list[str]) -> bool:
    return all(re.fullmatch(r"-?\d+(\.\d+)?", a) for a in names)

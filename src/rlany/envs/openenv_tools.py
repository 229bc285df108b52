"""Tool envs of the `openenv` env: a server whose action is MCP's `CallToolAction`.

An `openenv` 0.10 tool env (`MCPEnvironment`, served with `create_app(Env, CallToolAction,
CallToolObservation)`) is played through the same WebSocket session as any other:
    -> {"type": "step", "data": {"type": "list_tools"}}       (once, after the reset)
    <- observation {"tools": [{"name", "description", "input_schema"}, ...]}
    -> {"type": "step", "data": {"type": "call_tool", "tool_name": NAME, "arguments": {..}}}
    <- observation {"tool_name", "result": {"content": [{"type": "text", "text"}], ...},
                    "error": null | {"error_type", "message"}}, reward, done
The step path rather than MCP's JSON-RPC (`/mcp`, or {"type": "mcp"} on /ws): only a step
carries the reward and `done` (openenv's MCPToolClient plays simulation mode this way too).

The listed tools are the action space: the first observation lists each as a signature
(`guess_letter(letter: "a" | "b" | ...)`) with its description, and a response is decoded
into one call, in either form (of the calls naming a listed tool, the last one counts):
    guess_letter(letter="e")                       a Python-style call: keyword arguments,
        or positional ones in the schema's order; values are literals (JSON's true/false/
        null too); a tool without arguments may be named alone
    {"tool": "guess_letter", "arguments": {"letter": "e"}}   a JSON object ("name" or
        "tool_name" may stand for "tool")
A response that decodes to no call, names no listed tool, or misses a required argument is
not sent; a call the server refuses (its tool error) is not taken either. Both are shown
back as one line above the current observation and the episode goes on. `choices()` (for
`--constrain-actions`) is every call whose required arguments all have finitely many
values (an enum, a const, a boolean), written as above: possible when no tool takes free
text, else it says which argument does.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_CALLS = 512  # more enumerated calls than this is no menu for constrained decoding


class BadCall(ValueError):
    """The response is no call to a listed tool; the message says why (one line)."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict  # its input JSON schema

    @property
    def params(self) -> list[str]:
        return list(self.schema.get("properties") or {})

    @property
    def required(self) -> list[str]:
        return [p for p in self.schema.get("required") or [] if p in self.params]


def is_tool_schema(action_schema: dict) -> bool:
    """The server's action is MCP's CallToolAction (it has tool_name and arguments)."""
    props = action_schema.get("properties") or {}
    return "tool_name" in props and "arguments" in props


def read_tools(observation: dict) -> list[Tool]:
    """The tools of a list_tools answer (`input_schema`, or MCP's `inputSchema`)."""
    tools = []
    for t in observation.get("tools") or []:
        if isinstance(t, dict) and isinstance(t.get("name"), str):
            schema = t.get("input_schema", t.get("inputSchema")) or {}
            tools.append(Tool(t["name"], str(t.get("description") or "").strip(),
                              schema if isinstance(schema, dict) else {}))
    return tools


def menu(tools: list[Tool]) -> str:
    """The action space as the policy reads it."""
    lines = [f"- {signature(t)}" + (f": {t.description.splitlines()[0]}" if t.description
                                    else "") for t in tools]
    return ("Tools (answer with one call, as name(arg=value) or {\"tool\": name, "
            "\"arguments\": {...}}):\n" + "\n".join(lines))


def signature(tool: Tool) -> str:
    props = tool.schema.get("properties") or {}
    parts = []
    for name in tool.params:
        kind = _kind(props[name])
        parts.append(f"{name}: {kind}" + ("" if name in tool.required else " (optional)"))
    return f"{tool.name}({', '.join(parts)})"


def _kind(prop: dict) -> str:
    values = _finite(prop)
    if values is not None and not (prop.get("type") == "boolean"):
        shown = " | ".join(json.dumps(v) for v in values[:6])
        return shown + (" | ..." if len(values) > 6 else "")
    kinds = [prop.get("type")] + [p.get("type") for p in prop.get("anyOf", [])]
    return next((k for k in kinds if k and k != "null"), "any")


def _finite(prop: dict) -> list | None:
    """The values a property can take when they are few (enum, const, boolean), else None."""
    if "enum" in prop:
        return list(prop["enum"])
    if "const" in prop:
        return [prop["const"]]
    if prop.get("type") == "boolean":
        return [True, False]
    options = [p for p in prop.get("anyOf", []) if p.get("type") != "null"]
    if options and all(_finite(p) is not None for p in options):
        return [v for p in options for v in _finite(p)]
    return None


def call_text(name: str, arguments: dict) -> str:
    """The canonical text of a call: `name(arg=JSON value, ...)`."""
    return f"{name}({', '.join(f'{k}={json.dumps(v)}' for k, v in arguments.items())})"


def calls(tools: list[Tool]) -> list[str]:
    """Every call of the tools whose required arguments take finitely many values."""
    out: list[str] = []
    for tool in tools:
        props = tool.schema.get("properties") or {}
        values = {p: _finite(props[p]) for p in tool.required}
        free = [p for p, v in values.items() if v is None]
        if free:
            raise BadCall(f"tool {tool.name}'s argument {free[0]} is free text, so its calls "
                          "cannot be listed")
        for combo in itertools.product(*values.values()):
            out.append(call_text(tool.name, dict(zip(values, combo))))
            if len(out) > MAX_CALLS:
                raise BadCall(f"the tools have more than {MAX_CALLS} calls")
    return out


def parse(response: str, tools: list[Tool]) -> tuple[str, dict]:
    """The call the response makes: (tool name, arguments); BadCall says why not. Of the
    calls in either form that name a listed tool, the last one (not one written inside
    another, as a JSON call's argument); else a line that is only a tool's name; else what
    the last call names."""
    by_name = {t.name: t for t in tools}
    found = sorted(_json_calls(response) + _python_calls(response, by_name),
                   key=lambda c: c.start)
    outer, reach = [], -1  # the calls of listed tools, less those inside an earlier one
    for c in (c for c in found if c.name in by_name):
        if c.end > reach:
            outer.append(c)
            reach = c.end
    if outer:
        name, arguments = outer[-1].name, outer[-1].arguments()
    elif (word := _bare_name(response, by_name)) is not None:
        name, arguments = word, {}
    elif found:
        raise BadCall(f"no tool is named {found[-1].name[:40]!r} (the tools: "
                      f"{', '.join(by_name)})")
    else:
        raise BadCall("the response holds no tool call (name(arg=value) or {\"tool\": name, "
                      "\"arguments\": {...}})")
    tool = by_name[name]
    missing = [p for p in tool.required if p not in arguments]
    if missing:
        raise BadCall(f"{name} needs {', '.join(missing)}")
    unknown = [a for a in arguments if a not in tool.params]
    if unknown and tool.schema.get("additionalProperties") is False:
        raise BadCall(f"{name} takes no argument {unknown[0][:40]!r} (it takes "
                      f"{', '.join(tool.params) or 'none'})")
    return name, arguments


@dataclass(frozen=True)
class _Call:
    start: int  # where it is written: text[start:end]
    end: int
    name: str
    arguments: Callable[[], dict]  # read when it is the call taken (BadCall says why not)


_OBJECT = re.compile(r"\{\s*[\"}]")  # where a JSON object can begin
DEEP_SKIP = 256  # objects not tried after one nested past Python's recursion limit


def _json_spans(text: str) -> list[tuple[int, int, dict]]:
    """The JSON objects written in the text, outermost ones only, in order, with where.
    After an object nested past the recursion limit the next DEEP_SKIP beginnings (inside
    it, as deep) are not tried: a degenerate `{"a": {"a": ...` costs a linear time."""
    decoder, found, reach, skip = json.JSONDecoder(), [], 0, 0
    for k, m in enumerate(_OBJECT.finditer(text)):
        if m.start() < reach or k < skip:
            continue
        try:
            obj, end = decoder.raw_decode(text, m.start())
        except RecursionError:
            skip = k + DEEP_SKIP
            continue
        except ValueError:
            continue
        if isinstance(obj, dict):
            found.append((m.start(), end, obj))
            reach = end
    return found


def json_objects(text: str) -> list[dict]:
    """The JSON objects written in the text, outermost ones only, in order."""
    return [obj for _, _, obj in _json_spans(text)]


def _json_calls(text: str) -> list[_Call]:
    found = []
    for start, end, obj in _json_spans(text):
        name = next((obj[k] for k in ("tool", "name", "tool_name") if k in obj), None)
        if isinstance(name, str):
            found.append(_Call(start, end, name, lambda obj=obj: _json_arguments(obj)))
    return found


def _json_arguments(obj: dict) -> dict:
    arguments = obj.get("arguments", obj.get("args", {}))
    if isinstance(arguments, str):  # OpenAI's function call: arguments as JSON text
        with contextlib.suppress(ValueError, RecursionError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        raise BadCall("the call's arguments must be a JSON object")
    return arguments


_CALL = re.compile(r"\b([A-Za-z_][\w.-]*)(\s*)\(")
LAST_STARTS = 8  # `name(`s of listed tools, and of other names, tried from the last
MAX_CALL = 4000  # characters one call may span


def _python_calls(text: str, by_name: dict[str, Tool]) -> list[_Call]:
    """The last `name(...)`s in the text that parse as calls: a listed tool's name, or
    another name when "(" follows it at once. Each `(` is closed by one scan of brackets
    and quotes (`_closing`) and parsed once; only the last LAST_STARTS of each kind are
    tried, so a degenerate response costs no more than a short one. A name need not be
    an identifier (MCP allows `get-x`)."""
    starts = [m for m in _CALL.finditer(text) if m.group(1) in by_name or not m.group(2)]
    listed = [m for m in starts if m.group(1) in by_name][-LAST_STARTS:]
    other = [m for m in starts if m.group(1) not in by_name][-LAST_STARTS:]
    found = []
    for m in listed + other:
        end = _closing(text, m.end() - 1)
        if end is None:
            continue
        try:
            node = ast.parse("f" + text[m.end(1):end].strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            tool = by_name.get(m.group(1))
            found.append(_Call(m.start(), end, m.group(1),
                               lambda node=node, tool=tool: _arguments(node, tool)))
    return found


def _closing(text: str, at: int) -> int | None:
    """Just past the `)` that closes the `(` at `at`, counting brackets and skipping
    Python strings; None when it is not closed within MAX_CALL characters."""
    depth, quote, k, stop = 0, "", at, min(len(text), at + MAX_CALL)
    while k < stop:
        c = text[k]
        if quote:
            if c == "\\":
                k += 1
            elif text.startswith(quote, k):
                k, quote = k + len(quote) - 1, ""
        elif c in "'\"":
            quote = c * 3 if text.startswith(c * 3, k) else c
            k += len(quote) - 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return k + 1 if c == ")" else None
        k += 1
    return None


def _bare_name(text: str, by_name: dict[str, Tool]) -> str | None:
    """The last line that is only a tool's name (a tool without arguments)."""
    for line in reversed(text.strip().splitlines()):
        word = line.strip().strip("`*. ")
        if word in by_name:
            return word
    return None


def _arguments(node: ast.Call, tool: Tool | None) -> dict:
    if tool is None:
        return {}  # no such tool: parse() says so
    params = tool.params
    if len(node.args) > len(params):
        raise BadCall(f"{tool.name} takes {len(params)} argument(s) by position "
                      f"({', '.join(params) or 'none'}), got {len(node.args)}")
    out = {p: _literal(a, p) for p, a in zip(params, node.args)}
    for kw in node.keywords:
        if kw.arg is None:
            raise BadCall("write each argument as name=value")
        out[kw.arg] = _literal(kw.value, kw.arg)
    return out


def _literal(node: ast.expr, name: str):
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        raise BadCall(f"argument {name} is not a literal value (quote text: "
                      f"{name}=\"...\")") from None


# MCP tool errors of the framework, not the tool or its arguments (openenv's ToolError). Its
# `timeout` is not one: MCPEnvironment's wait_for around the tool's own run (a code tool
# running the policy's endless loop), answered like the tool's execution_error
NOT_THE_POLICYS = ("transport_error:",)


def show_result(observation: dict) -> tuple[str, str | None]:
    """(the text a call answered, the server's tool error as one line or None)."""
    error = observation.get("error")
    if isinstance(error, dict) and error.get("message"):
        return "", f"{error.get('error_type', 'error')}: {one_line(str(error['message']))}"
    result = observation.get("result")
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        text = "\n".join(str(c.get("text", "")) for c in result["content"]
                         if isinstance(c, dict) and c.get("type") == "text")
        if result.get("is_error") or result.get("isError"):
            return "", f"tool error: {one_line(text)}"
        if text or "data" not in result:
            return text, None
        result = result["data"]
    return (result if isinstance(result, str) else json.dumps(result)), None


def one_line(message: str) -> str:
    """A (pydantic) multi-line error as one line: its lines joined, the link left out."""
    lines = [ln.strip() for ln in message.splitlines()
             if ln.strip() and not ln.strip().startswith("For further information")]
    return " ".join(lines)[:300]

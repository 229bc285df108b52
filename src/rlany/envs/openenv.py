"""`openenv`: any OpenEnv environment server (HTTP + WebSocket: `openenv` 0.10's server, and
the older `openenv-core`'s).

spec:
    {"url": "http://HOST:PORT[/PATH]" (a running server; ws:// works too)
       or "command": "python -m my_env.server --port 8011" (str or list) with "port": 8011
           (started once per process, polled on /health, stopped when the process exits;
           started again, said in one line on stderr, if it has exited),
     "reset": {...} (keyword arguments of the server's reset, e.g. {"seed": 3}; default {}),
     "action_field": the action field the response fills (default: the only field of the
           server's action schema, GET /schema, besides `metadata`),
     "action_json": true (instead: the response's last JSON object is the whole action),
     "obs_field": the observation field shown as text (default: every field, "name: value"),
     "choices_field": the observation field listing the admissible actions (default: the
           first of legal_actions, available_actions, valid_actions, admissible_actions that
           holds a list),
     "image_fields": [fields holding images: base64 PNG/JPEG, a data: URL, or an H x W (x C)
           list of 0-255 ints; several images as a list of those],
     "images": "observe" (default: the policy and the judge see them) | "record" (only in
           the step's info["screens"], for text-only models),
     "success_on": "last" (default) | "sum",  "success_above": 0.0,
     "final_obs": "hide" (default: the last observation's text is "(the episode has ended)",
           so it cannot state the result to the judge) | "show" (the server's, as it is),
     "timeout_s": 30 (connect and per-message), "start_timeout_s": 60 (a command's start),
     "description": str (what `describe` tells a task rewriter)}

Episode: one WebSocket session (`openenv_wire`): reset with spec.reset, then one step per
response. The response becomes the action: with admissible actions, the one it names (the
server's own value, e.g. an int); else the stripped response converted to the field's
schema type (integer, number, boolean, array/object as JSON); a response that does not
convert is not sent ("Invalid action: ..."; the episode goes on), nor is one whose reading
raises or whose value JSON cannot encode (NaN, a set, bytes, a lone surrogate: "Error: ...",
`openenv_actions`). A step the server rejects
(VALIDATION_ERROR) shows "The server rejected the action: ..." and goes on; one its env
raised at (EXECUTION_ERROR) ends the episode as an errored one (`episode_errors`).
Outcome: the server's `done` ends the episode; success when the last reward
(success_on "last") or the sum of rewards ("sum") is > success_above. Each step's info has
`reward` (null where the server gave none, or did not take the action) and `return` (the sum
so far, null = 0), `rejected` when the server refused the action: `score --outcome return`.
Observation text: spec.obs_field, else the only field, else "name: value" lines (null
fields and an empty `metadata` left out); the admissible actions are listed under it
(numbered, unless they are numbers themselves).

Tool envs (`openenv_tools`): a server whose action is MCP's CallToolAction (an openenv
`MCPEnvironment`) is played through its tools: the first observation lists them (name,
arguments from each input schema, description), and each response is decoded into one call,
`name(arg="value")` or {"tool": name, "arguments": {...}}. A response that is no call to a
listed tool (or misses a required argument) is not sent, and a call the server's tool
refuses is not taken: either is shown back in one line and the episode goes on (a call
that never reached its tool, MCP's transport_error, errors the episode; a timeout goes on).
`--constrain-actions` decodes exactly one call where every tool's required arguments are
enums or booleans (the calls are then listed in full).

Failures are one line, never a hang: a server that is down fails the episode at reset
("cannot reach the server at URL"; later episodes for 10 s fail at once without waiting);
one that does not answer within timeout_s, or answers with something that is not an
OpenEnv message, or a reward that is not a finite number (NaN, infinity), fails the
episode at that step (finish "error"), as does a server that ends the session
(SESSION_ERROR, with its message); text with lone surrogates (invalid UTF-8) is repaired
with U+FFFD, said once per server (`openenv_wire.repair_text`).

Sessions: an episode holds one session; a server allows max_concurrent_envs at once
(openenv's default: 1). When this stage's live episodes hold them all (the server refuses
with CAPACITY_REACHED, naming its max_sessions), the next episode waits, not counted
anywhere, and starts when one ends (rollout: `EnvBusy`): the stage plays within the limit
and says so once on stderr. A server full of other clients' sessions is asked again for up
to timeout_s, counted in the first step's info["session_retries"].

Tasks: `rlany envs make-tasks openenv --knob url=URL` (or --knob command=... --knob port=N;
`spec` a JSON object of other spec keys, `prefix`, `prompt`): n episodes, each reset with
its own seed; with `--knob server_split=NAME`, the server's own tasks of that split (its
Task API), each reset with {"split": NAME, "index": I} (`openenv_tasks`).

The client (`openenv_wire`) speaks OpenEnv's WebSocket protocol with `websockets` rather
than through openenv's own client; why is said there. Needs `pip install 'rlany[openenv]'`
(in `make install`).
"""

from __future__ import annotations

import json
import time
import weakref

from rlany.envs import EnvBusy, Observation, StepResult, read_action
from rlany.envs import openenv_actions as actions
from rlany.envs import openenv_tools as tools
from rlany.envs import openenv_wire as wire
from rlany.envs.openenv_tasks import PROMPT, make_tasks, spec_problems  # noqa: F401 (CLI)
from rlany.errors import RlanyError
from rlany.files.records import Task

CHOICE_FIELDS = ("legal_actions", "available_actions", "valid_actions", "admissible_actions")
_said: set[str] = set()


class OpenenvEnv:
    name = "openenv"

    def __init__(self) -> None:
        self.session: wire.Session | None = None
        self.options: dict | None = None  # admissible action text -> the server's value
        self.tools: list[tools.Tool] | None = None  # a tool env's tools
        self._closer = None
        self.spec: dict = {}

    # -- protocol ----------------------------------------------------------------------
    def reset(self, task: Task) -> str | Observation:
        problems = self.validate(task.spec)
        if problems:
            raise RlanyError(f"bad openenv spec: {'; '.join(problems)}")
        self.close()
        self.spec = spec = task.spec
        timeout = float(spec.get("timeout_s", 30))
        url = spec.get("url") or wire.start_server(spec["command"], spec["port"],
                                                   float(spec.get("start_timeout_s", 60)))
        self.retries, self.total, self.steps, self.tools = 0, 0.0, 0, None
        data = self._open(url, timeout)
        try:  # a reset that fails gives its session back (a 1-session server needs it)
            if data.get("done"):
                raise RlanyError("openenv: the server ended the episode at reset")
            self.field, self.kind = self._action_field(url, timeout)
            if self.kind == "tools":
                self.tools = self._list_tools()
            text, images = self._observe(data)
        except BaseException:
            self.close()
            raise
        return Observation(text=text, images=images) if images else text

    def step(self, response: str) -> StepResult:
        if self.session is None:
            raise RlanyError("openenv: step() after the episode ended (or before reset)")
        self.steps += 1
        info: dict = {}
        if self.steps == 1 and self.retries:
            info["session_retries"] = self.retries
        read, error = read_action(self._parse, response)
        action, value, why = read or (None, None, None)
        if why or error:  # the policy's text is no action: not sent, the episode goes on
            return self._again(f"Invalid action: {why}." if why else f"Error: {error}", info)
        try:
            data = self.session.call({"type": "step", "data": value}, "a step")
        except wire.ServerError as e:
            # SESSION_ERROR and the like: the session is over; EXECUTION_ERROR: the
            # server's env raised at the step (an env failure, not the policy's action)
            if e.code not in wire.GOES_ON or e.code == "EXECUTION_ERROR":
                url = self.session.url
                self.close()
                what = "its env raised at a step" if e.code == "EXECUTION_ERROR" else \
                    "ended the session"
                raise _once(f"openenv: the server at {url} {what} ({e.code}): "
                            f"{e.message}") from None
            info["rejected"] = f"{e.code}: {e.message}"
            return self._again(f"The server rejected the action: {e.message}", info)
        except RlanyError as e:
            self.close()
            raise _once(e.message) from None
        reward = data.get("reward")
        self.total += float(reward or 0)
        if not wire.finite(self.total):  # each reward is finite (wire); their sum overflowed
            url = self.session.url
            self.close()
            raise _once(f"openenv: the rewards of the server at {url} sum to {self.total}, "
                        "not a finite number: the episode cannot be scored")
        info.update(reward=reward, **{"return": self.total})
        done, obs = bool(data.get("done")), data.get("observation") or {}
        refused = tools.show_result(obs)[1] if self.tools is not None and "tool_name" in obs \
            and not done else None
        if refused and refused.startswith(tools.NOT_THE_POLICYS):
            self.close()  # the call never reached its tool: an env failure, not a refusal
            raise _once(f"openenv: the server could not run the tool call ({refused})")
        if refused:
            info["rejected"] = refused
            return self._again(f"The tool call failed: {refused}", info, reward)
        text, images = self._observe(data)
        success = False
        if done:
            self.close()
            if self.spec.get("final_obs", "hide") == "hide":
                text = "(the episode has ended)"
            score = reward if self.spec.get("success_on", "last") == "last" else self.total
            success = score is not None and score > float(self.spec.get("success_above", 0))
        if self.spec.get("images", "observe") == "record" and self.screens:
            info["screens"] = [self.screens_before, self.screens]
        return StepResult(obs=text, done=done, success=success, action=action, info=info,
                          images=images)

    def describe(self, task: Task) -> str:
        spec = task.spec
        where = spec.get("url") or f"a local server ({_argv0(spec.get('command'))}, port " \
            f"{spec.get('port')})"
        what = spec.get("description") or "an OpenEnv environment"
        reset = f" Reset with {json.dumps(spec['reset'])}." if spec.get("reset") else ""
        return f"{what} (served at {where}).{reset}"

    def validate(self, spec: dict) -> list[str]:
        return spec_problems(spec)

    def choices(self) -> list[str]:
        if self.tools is not None:
            try:
                return tools.calls(self.tools)
            except tools.BadCall as e:
                raise RlanyError(f"openenv: --constrain-actions cannot be used with this "
                                 f"server's tools: {e}") from None
        if self.options is None:
            raise RlanyError("openenv: the server's observation lists no admissible actions "
                             "(name the field in spec.choices_field), so --constrain-actions "
                             "cannot be used with it")
        return list(self.options)

    def close(self) -> None:
        """End the session (also done at `done` and when the env is collected)."""
        if self._closer is not None:
            self._closer()
            self._closer, self.session = None, None

    # -- the session -------------------------------------------------------------------
    def _open(self, url: str, timeout: float) -> dict:
        """A session on the server and its answer to the reset. A server full of this
        process's own sessions raises EnvBusy (they end as their episodes do); one full of
        other clients' is asked again until timeout_s."""
        deadline = time.monotonic() + timeout
        while True:
            self.session = _say(lambda: wire.Session(url, timeout))
            self._closer = weakref.finalize(self, self.session.close)
            try:
                return self.session.call({"type": "reset", "data": self.spec.get("reset", {})},
                                         "reset")
            except wire.ServerError as e:
                self.close()
                base = wire.http_base(url)
                if e.code == "CAPACITY_REACHED" and wire.held.get(base, 0) > 0:
                    raise _busy(base, e) from None
                if e.code != "CAPACITY_REACHED" or time.monotonic() > deadline:
                    raise _once(f"openenv: the server at {base} refused the session "
                                f"({e.code}): {e.message}") from None
                self.retries += 1
                time.sleep(min(0.05 * 2 ** self.retries, 1.0))

    def _list_tools(self) -> list[tools.Tool]:
        url = self.session.url
        try:
            data = self.session.call({"type": "step", "data": {"type": "list_tools"}},
                                     "list_tools")
        except wire.ServerError as e:
            self.close()
            raise _once(f"openenv: the server at {url} did not list its tools ({e.code}): "
                        f"{e.message}") from None
        found = tools.read_tools(data.get("observation") or {})
        if not found:
            self.close()
            raise _once(f"openenv: the server at {url} takes tool calls but lists no tools")
        return found

    # -- observations and actions ------------------------------------------------------
    def _observe(self, data: dict) -> tuple[str, tuple[str, ...]]:
        obs = {k: v for k, v in (data.get("observation") or {}).items()
               if v is not None and not (k == "metadata" and not v)}
        if set(obs) == {"metadata"} and isinstance(obs["metadata"], dict):
            obs = obs["metadata"]  # an env that says everything in metadata (MCP envs)
        spec = self.spec
        self.screens_before = getattr(self, "screens", ())
        self.screens = tuple(p for f in spec.get("image_fields", [])
                             for p in wire.save_images(obs.pop(f, None), f))
        name = spec.get("choices_field") or next(
            (f for f in CHOICE_FIELDS if isinstance(obs.get(f), list)), None)
        listed = obs.pop(name, None) if name else None
        self.options = None
        if isinstance(listed, list) and listed and self.tools is None:
            self.options = {_show(v): v for v in listed}
        if self.tools is not None and "tool_name" in obs:  # the answer to a call
            text = tools.show_result(obs)[0]
            obs = {k: v for k, v in obs.items() if k not in ("tool_name", "result", "error")}
            text = "\n".join([text] * bool(text) + [f"{k}: {_show(v)}" for k, v in obs.items()])
        elif spec.get("obs_field"):
            text = _show(obs.get(spec["obs_field"], ""))
        elif len(obs) == 1:
            text = _show(next(iter(obs.values())))
        else:
            text = "\n".join(f"{k}: {_show(v)}" for k, v in obs.items())
        if self.options and not data.get("done"):
            names = list(self.options)
            text += ("\nAdmissible actions: " + ", ".join(names) if actions.numeric(names) else
                     "\nAdmissible actions:\n" + "\n".join(f"{i}. {a}"
                                                          for i, a in enumerate(names, 1)))
        if self.tools is not None and self.steps == 0:
            text += "\n\n" + tools.menu(self.tools)
        self.text = text
        return text, (self.screens if spec.get("images", "observe") == "observe" else ())

    def _again(self, note: str, info: dict, reward=None) -> StepResult:
        """A step the server did not take: the same observation, the episode goes on."""
        images = self.screens if self.spec.get("images", "observe") == "observe" else ()
        return StepResult(obs=f"{note}\n{self.text}", done=False, success=False, action=None,
                          info={**info, "reward": reward, "return": self.total}, images=images)

    def _action_field(self, url: str, timeout: float) -> tuple[str | None, str]:
        if self.spec.get("action_json"):
            return None, "object"
        schema = wire.action_schema(url, timeout)
        name = self.spec.get("action_field")
        if name is None and tools.is_tool_schema(schema):
            return None, "tools"
        props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
        if name is None:
            if len(props) != 1:
                self.close()
                raise RlanyError(
                    f"openenv: cannot tell which action field the response fills (the server's "
                    f"action schema has {sorted(props) or 'no fields'}): set spec.action_field "
                    "or spec.action_json")
            name = next(iter(props))
        prop = props.get(name, {})
        kinds = [prop.get("type")] + [p.get("type") for p in prop.get("anyOf", [])]
        return name, next((k for k in kinds if k and k != "null"), "string")

    def _parse(self, response: str) -> tuple[str | None, dict | None, str | None]:
        """(action text, the step's data, why it is no valid action): `openenv_actions`."""
        return actions.read(response, calls=self.tools,
                            action_json=bool(self.spec.get("action_json")),
                            options=self.options, field=self.field, kind=self.kind)


def _show(v) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _argv0(command) -> str:
    return (command.split() if isinstance(command, str) else command or ["?"])[0]


def _once(message: str) -> RlanyError:
    """The error, said on stderr the first time this process meets it."""
    if message not in _said:
        from rlany.console import info

        _said.add(message)
        info(message)
    return RlanyError(message)


def _busy(base: str, e: wire.ServerError) -> EnvBusy:
    """The server is full of this process's sessions: the episode waits (said once)."""
    limit = e.data.get("max_sessions")
    _once(f"openenv: the server at {base} serves {limit or 'a limited number of'} "
          "session(s) at once (its max_concurrent_envs), all held by this stage's "
          "episodes: the others wait for one to end (serve more sessions to play more at "
          "once)")
    return EnvBusy(f"openenv: the server at {base} is full with this stage's "
                   f"{wire.held.get(base, 0)} session(s) ({e.message})")


def _say(connect):
    try:
        return connect()
    except RlanyError as e:
        raise _once(e.message) from None

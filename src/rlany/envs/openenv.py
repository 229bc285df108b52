"""`openenv`: any OpenEnv environment server (HTTP + WebSocket, `openenv-core`'s format).

spec:
    {"url": "http://HOST:PORT" (a running server; ws:// works too)
       or "command": "python -m my_env.server --port 8011" (str or list) with "port": 8011
           (started once per process, polled on /health, stopped when the process exits),
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
convert is not sent ("Invalid action: ..."; the episode goes on). A step the server rejects
(VALIDATION_ERROR, EXECUTION_ERROR) shows "The server rejected the action: ..." and goes on.
Outcome: the server's `done` ends the episode; success when the last reward
(success_on "last") or the sum of rewards ("sum") is > success_above. Each step's info has
`reward` (null where the server gave none, or did not take the action) and `return` (the sum
so far, null = 0), `rejected` when the server refused the action: `score --outcome return`.
Observation text: spec.obs_field, else the only field, else "name: value" lines (null
fields left out); the admissible actions are listed under it (numbered, unless they are
numbers themselves).

Failures are one line, never a hang: a server that is down fails the episode at reset
("cannot reach the server at URL"; later episodes for 10 s fail at once without waiting);
one that does not answer within timeout_s, or answers with something that is not an
OpenEnv message, or a reward that is not a finite number (NaN, infinity), fails the
episode at that step (finish "error"); text with lone surrogates (invalid UTF-8) is
repaired with U+FFFD, said once per server (`openenv_wire.repair_text`). Rollout holds
one session per live episode (--batch-tasks x --n), so give the server
(max_concurrent_envs) at least that many: a server full of this process's own sessions
fails the episode at once (they end with the batch); one full of other clients' is asked
again for up to timeout_s, counted in the first step's info["session_retries"].

`rlany envs make-tasks openenv --knob url=URL` (or --knob command=... --knob port=N; knob
`spec` a JSON object of other spec keys, `prefix`, `prompt`): n episodes of that server,
each reset with its own seed.

The client (`openenv_wire`) speaks OpenEnv's WebSocket protocol with `websockets` rather
than through openenv-core's own client; why is said there. Needs `pip install
'rlany[openenv]'` (in `make install`).
"""

from __future__ import annotations

import json
import random
import re
import time
import weakref

from rlany.envs import Observation, StepResult, parse_action
from rlany.envs import openenv_wire as wire
from rlany.errors import RlanyError
from rlany.records import Lineage, Task

PROMPT = "You are acting in an environment. Each turn, answer with exactly one action."
CHOICE_FIELDS = ("legal_actions", "available_actions", "valid_actions", "admissible_actions")
KEYS = {"url", "command", "port", "reset", "action_field", "action_json", "obs_field",
        "choices_field", "image_fields", "images", "success_on", "success_above", "timeout_s",
        "start_timeout_s", "final_obs", "description"}
_said: set[str] = set()


class OpenenvEnv:
    name = "openenv"

    def __init__(self) -> None:
        self.session: wire.Session | None = None
        self.options: dict | None = None  # admissible action text -> the server's value
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
        self.retries, self.total, self.steps = 0, 0.0, 0
        deadline = time.monotonic() + timeout
        while True:
            self.session = _say(lambda: wire.Session(url, timeout))
            self._closer = weakref.finalize(self, self.session.close)
            try:
                data = self.session.call({"type": "reset", "data": spec.get("reset", {})},
                                         "reset")
                break
            except wire.ServerError as e:
                self.close()
                base = wire.http_base(url)
                # full with sessions of this process: they end only after this batch
                ours = e.code == "CAPACITY_REACHED" and wire.held.get(base, 0) > 0
                if e.code != "CAPACITY_REACHED" or ours or time.monotonic() > deadline:
                    raise _once(f"openenv: the server at {base} refused the session "
                                f"({e.code}): {e.message}" +
                                ("; this stage's episodes hold sessions there: run fewer at "
                                 "once (--batch-tasks x --n) or raise its max_concurrent_envs"
                                 if ours else "")) from None
                self.retries += 1
                time.sleep(min(0.05 * 2 ** self.retries, 1.0))
        if data.get("done"):
            self.close()
            raise RlanyError("openenv: the server ended the episode at reset")
        self.field, self.kind = self._action_field(url, timeout)
        text, images = self._observe(data)
        return Observation(text=text, images=images) if images else text

    def step(self, response: str) -> StepResult:
        if self.session is None:
            raise RlanyError("openenv: step() after the episode ended (or before reset)")
        self.steps += 1
        info: dict = {}
        if self.steps == 1 and self.retries:
            info["session_retries"] = self.retries
        action, value, why = self._parse(response)
        if why:
            return self._again(f"Invalid action: {why}.", info)
        try:
            data = self.session.call({"type": "step", "data": value}, "a step")
        except wire.ServerError as e:
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
        text, images = self._observe(data)
        done = bool(data.get("done"))
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
        if not isinstance(spec, dict):
            return ["spec must be an object"]
        problems = []
        url, command, port = spec.get("url"), spec.get("command"), spec.get("port")
        if (url is None) == (command is None):
            problems.append("give spec.url (a running server) or spec.command and spec.port "
                            "(a server to start), one of them")
        if url is not None and not (isinstance(url, str)
                                    and re.fullmatch(r"(https?|wss?)://[^\s/]+(/\S*)?", url)):
            problems.append(f"spec.url must be http(s):// or ws(s)://HOST:PORT, got {url!r:.60}")
        if command is not None:
            if not (isinstance(command, str) and command.strip()) and not (
                    isinstance(command, list) and command
                    and all(isinstance(c, str) for c in command)):
                problems.append("spec.command must be a non-empty string or list of strings")
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                problems.append("spec.command needs spec.port, an integer in 1..65535")
        elif port is not None:
            problems.append("spec.port goes with spec.command (put the port in spec.url)")
        if not isinstance(spec.get("reset", {}), dict):
            problems.append("spec.reset must be an object (the server's reset arguments)")
        for key in ("action_field", "obs_field", "choices_field", "description"):
            if not isinstance(spec.get(key, ""), str):
                problems.append(f"spec.{key} must be a string")
        if not isinstance(spec.get("action_json", False), bool):
            problems.append("spec.action_json must be true or false")
        elif spec.get("action_json") and "action_field" in spec:
            problems.append("give spec.action_field or spec.action_json, not both")
        fields = spec.get("image_fields", [])
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            problems.append("spec.image_fields must be a list of field names")
        if spec.get("images", "observe") not in ("observe", "record"):
            problems.append("spec.images must be observe or record")
        if spec.get("final_obs", "hide") not in ("hide", "show"):
            problems.append("spec.final_obs must be hide or show")
        if spec.get("success_on", "last") not in ("last", "sum"):
            problems.append("spec.success_on must be last or sum")
        for key, default, low, high in (("success_above", 0, -1e9, 1e9),
                                        ("timeout_s", 30, 0.01, 3600),
                                        ("start_timeout_s", 60, 0.01, 3600)):
            v = spec.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
                problems.append(f"spec.{key} must be a number in {low:g}..{high:g}")
        unknown = set(spec) - KEYS
        if unknown:
            problems.append(f"unknown spec keys {sorted(unknown)}")
        return problems

    def choices(self) -> list[str]:
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

    # -- observations and actions ------------------------------------------------------
    def _observe(self, data: dict) -> tuple[str, tuple[str, ...]]:
        obs = {k: v for k, v in (data.get("observation") or {}).items() if v is not None}
        spec = self.spec
        self.screens_before = getattr(self, "screens", ())
        self.screens = tuple(p for f in spec.get("image_fields", [])
                             for p in wire.save_images(obs.pop(f, None), f))
        name = spec.get("choices_field") or next(
            (f for f in CHOICE_FIELDS if isinstance(obs.get(f), list)), None)
        listed = obs.pop(name, None) if name else None
        self.options = None
        if isinstance(listed, list) and listed:
            self.options = {_show(v): v for v in listed}
        if spec.get("obs_field"):
            text = _show(obs.get(spec["obs_field"], ""))
        elif len(obs) == 1:
            text = _show(next(iter(obs.values())))
        else:
            text = "\n".join(f"{k}: {_show(v)}" for k, v in obs.items())
        if self.options and not data.get("done"):
            names = list(self.options)
            text += ("\nAdmissible actions: " + ", ".join(names) if _numeric(names) else
                     "\nAdmissible actions:\n" + "\n".join(f"{i}. {a}"
                                                          for i, a in enumerate(names, 1)))
        self.text = text
        return text, (self.screens if spec.get("images", "observe") == "observe" else ())

    def _again(self, note: str, info: dict) -> StepResult:
        """A step the server did not take: the same observation, the episode goes on."""
        images = self.screens if self.spec.get("images", "observe") == "observe" else ()
        return StepResult(obs=f"{note}\n{self.text}", done=False, success=False, action=None,
                          info={**info, "reward": None, "return": self.total}, images=images)

    def _action_field(self, url: str, timeout: float) -> tuple[str | None, str]:
        if self.spec.get("action_json"):
            return None, "object"
        schema = wire.action_schema(url, timeout)
        props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
        name = self.spec.get("action_field")
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
        """(action text, the step's data, why it is invalid)."""
        lines = [ln.strip() for ln in response.strip().splitlines() if ln.strip()]
        if self.spec.get("action_json"):
            found = _last_json_object(response)
            if found is None:
                return None, None, "the response holds no JSON object"
            return json.dumps(found), found, None
        if self.options is not None:
            last = lines[-1].rstrip(".") if lines else ""
            if last not in self.options and not _numeric(list(self.options)):
                lower = {a.lower(): a for a in self.options}
                hit, _ = parse_action(response, list(lower))
                last = lower.get(hit, last) if hit else last
            if last not in self.options:
                return None, None, "not one of the admissible actions"
            return last, {self.field: self.options[last]}, None
        text = response.strip()
        try:
            value = _convert(text, self.kind)
        except ValueError:
            return None, None, f"{self.field} must be {self.kind}, got {text[:40]!r}"
        return text, {self.field: value}, None


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


def _last_json_object(text: str) -> dict | None:
    decoder = json.JSONDecoder()
    for m in reversed([m.start() for m in re.finditer(r"\{", text)]):
        try:
            found, _ = decoder.raw_decode(text, m)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None


def _show(v) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _numeric(names: list[str]) -> bool:
    return all(re.fullmatch(r"-?\d+(\.\d+)?", a) for a in names)


def _argv0(command) -> str:
    return (command.split() if isinstance(command, str) else command or ["?"])[0]


def _once(message: str) -> RlanyError:
    """The error, said on stderr the first time this process meets it."""
    if message not in _said:
        from rlany.console import info

        _said.add(message)
        info(message)
    return RlanyError(message)


def _say(connect):
    try:
        return connect()
    except RlanyError as e:
        raise _once(e.message) from None


def make_tasks(n: int, seed: int, url: str = "", command: str = "", port: int = 0,
               spec: str | dict | None = None, split: str = "train", prefix: str = "oe",
               prompt: str = PROMPT) -> list[Task]:
    """n episodes of one server, each reset with its own seed (spec.reset.seed, drawn from
    --seed): the server is given by url, or by command and port; `spec` (a JSON object, or
    its text as `--knob spec=JSON` gives it) adds any other spec key to every task (e.g.
    {"action_field": "message"})."""
    hint = "--knob url=http://HOST:PORT, or --knob command=... --knob port=N"
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError as e:
            raise RlanyError(f"openenv tasks: spec is not JSON ({e})",
                             hint="e.g. --knob 'spec={\"action_field\": \"message\"}'") from None
    if not isinstance(spec or {}, dict):
        raise RlanyError("openenv tasks: spec must be a JSON object", hint=hint)
    base = {**({"url": url} if url else {}), **({"command": command, "port": port}
                                                if command else {}), **(spec or {})}
    problems = OpenenvEnv().validate(base)
    if problems:
        raise RlanyError(f"openenv tasks: {'; '.join(problems)}", hint=hint)
    rng, out = random.Random(seed), []
    for k in range(n):
        task_id = f"{prefix}-{seed}-{k:04d}"
        task_spec = {**base, "reset": {**base.get("reset", {}), "seed": rng.randrange(2**31)}}
        out.append(Task(task_id=task_id, env="openenv", spec=task_spec, prompt=prompt,
                        lineage=Lineage(root_id=task_id), split=split))
    return out

"""`rlany envs make-tasks openenv`: tasks for an OpenEnv server, drawn or read from it.

Two ways (the server is `--knob url=...`, or `--knob command=... --knob port=N`):
* seeds (the default): n episodes, each reset with its own seed (spec.reset.seed, drawn
  from --seed);
* a server's task split (`--knob server_split=NAME`): the split's tasks as the server lists
  them through openenv's Task API, one rlany task per server task, in the server's order
  (the first n when it has more): each resets with {"split": NAME, "index": I}, which is how
  openenv selects a task (`reset(split=, index=)`). The server's name for itself comes from
  GET /list_environments; its splits from GET /{env}/splits, their sizes from POST
  /{env}/num_tasks and the tasks from POST /{env}/task_range. The server task's own id, when
  it has one, is kept in the task's `server_task` column. (`--split`, train or eval, stays
  rlany's label of the pool, as for every env.)
"""

from __future__ import annotations

import json
import random
import re
from urllib.parse import quote

from rlany.envs import openenv_wire as wire
from rlany.errors import RlanyError
from rlany.files.records import Lineage, Task

PROMPT = "You are acting in an environment. Each turn, answer with exactly one action."
HINT = "--knob url=http://HOST:PORT, or --knob command=... --knob port=N"
KEYS = {"url", "command", "port", "reset", "action_field", "action_json", "obs_field",
        "choices_field", "image_fields", "images", "success_on", "success_above", "timeout_s",
        "start_timeout_s", "final_obs", "description"}


def spec_problems(spec: dict) -> list[str]:
    """What is wrong with an openenv task spec (the env's `validate`); [] when nothing."""
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
    for key, allowed in (("images", ("observe", "record")), ("final_obs", ("hide", "show")),
                         ("success_on", ("last", "sum"))):
        if spec.get(key, allowed[0]) not in allowed:
            problems.append(f"spec.{key} must be {' or '.join(allowed)}")
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


def make_tasks(n: int, seed: int, url: str = "", command: str = "", port: int = 0,
               spec: str | dict | None = None, server_split: str = "", split: str = "train",
               prefix: str = "oe", prompt: str = PROMPT) -> list[Task]:
    """n episodes of one server, each reset with its own seed (spec.reset.seed, drawn from
    --seed), or with `server_split` the server's own tasks of that split (at most n, each
    reset with {"split", "index"}): the server is given by url, or by command and port;
    `spec` (a JSON object, or its text as `--knob spec=JSON` gives it) adds any other spec
    key to every task (e.g. {"action_field": "message"})."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError as e:
            raise RlanyError(f"openenv tasks: spec is not JSON ({e})",
                             hint="e.g. --knob 'spec={\"action_field\": \"message\"}'") from None
    if not isinstance(spec or {}, dict):
        raise RlanyError("openenv tasks: spec must be a JSON object", hint=HINT)
    base = {**({"url": url} if url else {}), **({"command": command, "port": port}
                                                if command else {}), **(spec or {})}
    problems = spec_problems(base)
    if problems:
        raise RlanyError(f"openenv tasks: {'; '.join(problems)}", hint=HINT)
    if server_split:
        return _split_tasks(n, base, server_split, split, prefix, prompt)
    rng, out = random.Random(seed), []
    for k in range(n):
        task_id = f"{prefix}-{seed}-{k:04d}"
        task_spec = {**base, "reset": {**base.get("reset", {}), "seed": rng.randrange(2**31)}}
        out.append(Task(task_id=task_id, env="openenv", spec=task_spec, prompt=prompt,
                        lineage=Lineage(root_id=task_id), split=split))
    return out


def _split_tasks(n: int, base: dict, name: str, split: str, prefix: str,
                 prompt: str) -> list[Task]:
    timeout = float(base.get("timeout_s", 30))
    url = base.get("url") or wire.start_server(base["command"], base["port"],
                                               float(base.get("start_timeout_s", 60)))
    server_tasks = read_split(url, name, n, timeout)
    out = []
    for index, found in enumerate(server_tasks):
        task_id = f"{prefix}-{name}-{index:04d}"
        reset = {**base.get("reset", {}), "split": name, "index": index}
        own = found.get("id", found.get("task_id")) if isinstance(found, dict) else None
        out.append(Task(task_id=task_id, env="openenv", spec={**base, "reset": reset},
                        prompt=prompt, lineage=Lineage(root_id=task_id), split=split,
                        extra={"server_task": own} if isinstance(own, (str, int)) else {}))
    return out


def read_split(url: str, name: str, n: int, timeout_s: float) -> list:
    """The first n tasks of the server's split `name` (openenv's Task API)."""
    base = wire.http_base(url)
    try:
        envs = wire.http_json(url, "/list_environments", timeout_s)
    except RlanyError as e:
        raise RlanyError(f"openenv tasks: the server at {base} lists no task splits (openenv's "
                         f"Task API, GET /list_environments): {e.message}") from None
    if not (isinstance(envs, list) and envs and isinstance(envs[0], str)):
        raise RlanyError(f"openenv tasks: the server at {base} answered /list_environments "
                         f"with {str(envs)[:80]!r}, not a list of names")
    env = quote(envs[0], safe="")  # a path segment, whatever the name holds (a space, '/')
    splits = wire.http_json(url, f"/{env}/splits", timeout_s)
    if not isinstance(splits, list):
        raise RlanyError(f"openenv tasks: the server at {base} answered /{env}/splits with "
                         f"{str(splits)[:80]!r}, not a list of splits")
    names = [s.get("name") if isinstance(s, dict) else s for s in splits]
    if name not in names:
        raise RlanyError(f"openenv tasks: the server at {base} has no split {name!r} (its "
                         f"splits: {', '.join(map(str, names)) or 'none'})")
    count = wire.http_json(url, f"/{env}/num_tasks", timeout_s, {"split": name})
    total = count.get("num_tasks") if isinstance(count, dict) else None
    if isinstance(total, bool) or not isinstance(total, int):
        raise RlanyError(f"openenv tasks: the server at {base} answered /{env}/num_tasks with "
                         f"{str(count)[:80]!r}")
    if total == 0:
        raise RlanyError(f"openenv tasks: the server's split {name!r} holds no tasks")
    got = wire.http_json(url, f"/{env}/task_range", timeout_s,
                         {"split": name, "start": 0, "stop": min(n, total)})
    tasks = got.get("tasks") if isinstance(got, dict) else None
    if not isinstance(tasks, list) or len(tasks) != min(n, total):
        raise RlanyError(f"openenv tasks: the server at {base} answered /{env}/task_range "
                         f"with {str(got)[:80]!r}, not {min(n, total)} tasks")
    return tasks

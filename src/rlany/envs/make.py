"""`rlany envs make-tasks`: an env's task generator driven from the command line: its
knobs parsed from `--knob key=value` (typed by the generator's defaults), and a held-out
split drawn so that it shares no task spec with another pool (`--exclude`)."""

from __future__ import annotations

import inspect
import json
from typing import Any

from rlany.errors import RlanyError, UsageError

MAX_TASKS = 100_000  # a pool is read whole by every stage; more is a mistake, not a pool
SPLITS = ("train", "eval")


def excluding(make, banned: set[str], n: int, kwargs: dict) -> list:
    """The first n generated tasks whose spec is not in `banned`. A generator is sequential
    per seed (its first k tasks do not depend on how many it makes), so drawing more keeps
    the same prefix: doubled until n remain or 64 x n (at most 4 x MAX_TASKS) were drawn."""
    drawn = n
    while True:
        kept = [t for t in make(n=drawn, **kwargs) if spec_key(t) not in banned]
        if len(kept) >= n or drawn >= min(64 * n, 4 * MAX_TASKS):
            break
        drawn = min(drawn * 2, 64 * n, 4 * MAX_TASKS)
    if len(kept) < n:
        raise RlanyError(f"only {len(kept)} of {drawn} generated tasks are not in --exclude",
                         hint="ask for fewer tasks (--n) or change the knobs")
    return kept[:n]


def spec_key(task) -> str:
    return json.dumps(task.spec, sort_keys=True)


def parse_knobs(items: list[str], params: dict, name: str) -> dict:
    """`--knob key=value` items -> keyword arguments of the env's generator: each key known
    and given once, each value of its default's type (JSON for numbers and booleans, the
    raw text for a string knob). Every mistake is a usage error naming the knob."""
    known = [k for k in params if k not in ("n", "seed", "split")]
    knobs: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--knob must be key=value, got '{item}'")
        if key not in known:
            raise UsageError(f"--knob {key}: unknown knob for '{name}'",
                             hint=f"known: {', '.join(known)}")
        if key in knobs:
            raise UsageError(f"--knob {key} is given twice; give each knob once")
        default = params[key].default
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if isinstance(default, str) or default is None:
            value = text  # a string knob takes the text as written ("10" stays "10")
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise UsageError(f"--knob {key} must be true or false, got '{text}'")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"--knob {key} must be an integer, got '{text}'")
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UsageError(f"--knob {key} must be a number, got '{text}'")
            value = float(value)
        elif default is not inspect.Parameter.empty and not isinstance(value, type(default)):
            raise UsageError(f"--knob {key} must be like {default!r}, got '{text}'")
        knobs[key] = value
    return knobs

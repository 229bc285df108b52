"""Environments: a Protocol, a registry by name, and third-party plug-ins.

An environment object is one episode's state: `make_env(name)` returns a fresh one, then
`reset(task) -> first observation` and `step(response) -> StepResult` until `done`.
Policy failures and env errors, by construction: a step reads the policy's text in one
guarded call, `read_action(read, response, ...)`; whatever the text makes `read` raise is
the policy's invalid action, which the env answers as an observation ("Error: ...") and
the episode goes on or fails as the policy's failure. So `step` raises only for failures
of the env itself (its browser, its server's connection, its sandbox): rollout records
those as errored episodes (finish "error", counted apart: `rlany.stages.episode_errors`).
An env that lists its admissible actions may offer `choices() -> list[str]` (the actions
valid for the next response); `rollout --constrain-actions` then decodes each response as
exactly one of them. `describe(task)` is the text a task rewriter sees; `validate(spec)`
lists what is wrong with a (possibly rewritten) spec, empty when it is well-formed and
solvable in principle.
An env may offer `edits(spec, direction) -> list[Edit]` ("harder" | "easier"): a short list
(at most 8, order stable for a given spec) of small rewrites, each one short line a small
model can read ("goal object: apple -> mug") and the whole new spec, which passes
`validate`. `adapt-tasks` picks among them at small scale (DESIGN §4); `offered_edits`
calls it and gives [] for an env without it.
An env with an expert labels each step in `StepResult.info["label"]`: +1 when the action
lies on a shortest plan to the goal from the state it was taken in, -1 otherwise (an
unparseable response too); absent = unlabelled. `rlany eval --judge` scores the judge's
verdicts against these labels. Such an env may also offer `expert_action() -> str | None`:
the next action of a shortest plan from the current state; `rlany rollout --expert` plays it
to write demonstrations for `rlany sft` (a warm start).
A module may also offer `make_tasks(n, seed, **knobs) -> list[Task]`.
An env may offer `state_key(observation) -> str`: the part of an observation that is the
env's state, so that two steps whose keys are equal met the same state (household and
miniwob leave out the feedback on the last action). Rollout records its digest per step
(`Step.state`, `state_digest`); `score --step-credit gigpo` groups a task's steps by it
(anchor states), and hashes the whole observation for an env without it.
An env may offer `close()`: release what the episode holds (a browser tab, a server's
session); rollout calls it when the episode ends. An env whose episodes share a limited
resource (a server's sessions) raises `EnvBusy` from `reset` while this process's live
episodes hold all of it: rollout starts that episode again once another has ended.

Image observations (GUI agents, e.g. OSWorld-like): `reset` may return an `Observation`
(text plus image file paths, e.g. screenshots) instead of a string, and `StepResult.images`
holds the images of the next observation. Actions stay text. Rollout puts the images into
the policy's user message and records them per step; the judge sees the images before and
after the step. Both go to the engine as OpenAI-style image parts (`rlany.chat`).

Third-party packages register in the `rlany.envs` entry-point group:
    [project.entry-points."rlany.envs"]
    myenv = "mypkg.envs:MyEnv"        # a class or factory: MyEnv() -> Environment
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module, metadata
from typing import Protocol, TypeVar, runtime_checkable

from rlany.errors import RlanyError
from rlany.files.records import Task


class EnvBusy(RlanyError):
    """`reset` cannot start the episode until another episode of this process ends (they
    hold every session its server allows): not an error of the episode, which rollout
    starts again later and counts nowhere until then."""


@dataclass(frozen=True)
class Observation:
    text: str
    images: tuple[str, ...] = ()  # image file paths (screenshots), shown before the text


@dataclass(frozen=True)
class StepResult:
    obs: str  # what the agent sees next (must not reveal success on the final step)
    done: bool
    success: bool
    action: str | None = None  # the action the env executed, parsed from the response
    info: dict = field(default_factory=dict)
    images: tuple[str, ...] = ()  # image file paths of the next observation


@dataclass(frozen=True)
class Edit:
    """One env-provided rewrite of a task (`Environment.edits`)."""
    description: str  # one short line, e.g. "goal object: apple -> mug"
    spec: dict  # the whole new spec; passes the env's validate(spec)
    kind: str = ""  # the kind of edit, e.g. "goal object" (default: the description's head)

    @property
    def kind_name(self) -> str:
        """The edit's kind: `kind`, else its description before a ':' (e.g. "step limit")."""
        return self.kind or self.description.split(":")[0].strip()


DIRECTIONS = ("harder", "easier")


def save_screen(data: bytes, ext: str = "png") -> str:
    """An image observation as a file named by its content (sha256) under the cache's
    `screens/` directory, written atomically once; its path. Shared by the GUI envs."""
    import hashlib
    import os
    import tempfile

    from rlany.models import cache_dir

    path = cache_dir().parent / "screens" / f"{hashlib.sha256(data).hexdigest()[:24]}.{ext}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return str(path)


R = TypeVar("R")


def read_action(read: Callable[..., R], *args) -> tuple[R | None, str | None]:
    """The one guarded call in which an env reads the policy's text: `(read(*args), None)`,
    or `(None, why)` when the text makes `read` raise anything at all (a digit `int`
    rejects, an integer of 10,000 digits, nesting that exhausts a parser, a value JSON
    cannot encode, a lone surrogate). That is the policy's invalid action: the env shows
    "Error: WHY" and counts the step as the policy's, never as an env error. `read` does
    no I/O and changes nothing, so what it raises can only be the text's doing; it returns
    an action the env can always carry out (a value that JSON encodes, text UTF-8 can
    hold), and what then fails in carrying it out is the env's."""
    try:
        return read(*args), None
    except Exception as e:  # anything: the policy's text is arbitrary (the module doc)
        why = " ".join(str(e).split())[:200]
        return None, f"the action cannot be read ({type(e).__name__}{': ' if why else ''}{why})"


def split_obs(obs: str | Observation) -> tuple[str, list[str]]:
    if isinstance(obs, Observation):
        return obs.text, [str(p) for p in obs.images]
    return obs, []


class Environment(Protocol):
    name: str

    def reset(self, task: Task) -> str | Observation: ...

    def step(self, response: str) -> StepResult: ...

    def describe(self, task: Task) -> str: ...

    def validate(self, spec: dict) -> list[str]: ...


# What an env may do beyond the protocol; a stage asks with isinstance(env, ListsActions) and
# refuses the flag that needs it when the env cannot.

@runtime_checkable
class ListsActions(Protocol):
    """Lists the admissible actions of the current state (`rollout --constrain-actions`)."""

    def choices(self) -> list[str]: ...


@runtime_checkable
class OffersEdits(Protocol):
    """Offers its own rewrites of a task (`adapt-tasks --rewrite edits`)."""

    def edits(self, spec: dict, direction: str) -> list[Edit]: ...


@runtime_checkable
class HasExpert(Protocol):
    """Knows a good next action in the current state (`rollout --expert`); None: no plan."""

    def expert_action(self) -> str | None: ...


@runtime_checkable
class MeasuresDifficulty(Protocol):
    """Measures a task's difficulty as named numbers (household: plan_length and size,
    larger is harder, and the step limit max_steps); `adapt-tasks` reports the pool's
    means per iteration."""

    def difficulty(self, spec: dict) -> dict[str, float]: ...


@runtime_checkable
class KeysStates(Protocol):
    """Names the state an observation shows (`state_key`, the module doc)."""

    def state_key(self, observation: str) -> str: ...


def state_hash(key: str) -> str:
    """An exact digest of a state key: sha256, its first 16 hex digits (64 bits)."""
    import hashlib

    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def state_digest(env: Environment, observation: str) -> str | None:
    """What rollout records as a step's `state`: the digest of the env's state key of the
    observation the step answers; None for an env without `state_key`, or whose `state_key`
    raised or gave no text (score then hashes the whole observation)."""
    if not isinstance(env, KeysStates):
        return None
    try:
        key = env.state_key(observation)
    except Exception:  # a plug-in's key: the step keys on its observation instead
        return None
    return state_hash(key) if isinstance(key, str) else None


def after_first_line(observation: str) -> str:
    """A state key for envs whose observation opens with one line of feedback on the last
    action (household): the rest of it."""
    return observation.partition("\n")[2] or observation


# name -> "module:attribute" of a class/factory taking no arguments
BUILTIN = {
    "reasoning": "rlany.envs.reasoning:ReasoningEnv",
    "household": "rlany.envs.household:HouseholdEnv",
    "coding": "rlany.envs.coding:CodingEnv",
    "alfworld": "rlany.envs.alfworld:AlfworldEnv",
    "miniwob": "rlany.envs.miniwob:MiniwobEnv",
    "openenv": "rlany.envs.openenv:OpenenvEnv",
}
_registered: dict[str, Callable[[], Environment]] = {}


def register(name: str, factory: Callable[[], Environment]) -> None:
    """Register an environment factory at run time (tests, notebooks)."""
    _registered[name] = factory


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group="rlany.envs")}


def names() -> list[str]:
    return sorted({*BUILTIN, *_registered, *_entry_points()})


def factory(name: str) -> Callable[[], Environment]:
    if name in _registered:
        return _registered[name]
    if name in BUILTIN:
        module, attr = BUILTIN[name].split(":")
        return getattr(import_module(module), attr)
    eps = _entry_points()
    if name in eps:
        return eps[name].load()
    raise RlanyError(f"unknown environment '{name}'", hint=f"known: {', '.join(names())}")


def check_knob(name: str, value: float, low: float, high: float | None = None) -> None:
    """A task generator's bounds on one knob: `low <= value (<= high)`, else an RlanyError
    naming the knob (`rlany envs make-tasks` reports it as a usage error of --knob)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (
            high is not None and value > high):
        bounds = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
        raise RlanyError(f"{name} must be {bounds}, got {value!r}")


def spec_problems(env: Environment, spec: dict) -> list[str]:
    """What the env's own `validate` finds wrong with a task spec as it is read, before any
    engine starts: the cheap check (an env whose validate takes `check_solvable` or
    `check_solution` skips its expensive solvability proof here; adapt-tasks runs the full
    one on rewrites). An env that cannot read the spec at all is a problem too."""
    import inspect

    validate = getattr(env, "validate", None)
    if validate is None:
        return []
    params = inspect.signature(validate).parameters
    cheap = {k: False for k in ("check_solvable", "check_solution") if k in params}
    try:
        return list(validate(spec, **cheap))
    except Exception as e:  # a spec the env's own check trips over is not a gradable task
        return [f"the env cannot read this spec ({type(e).__name__}: {e})"]


def make_env(name: str) -> Environment:
    return factory(name)()


def offered_edits(env: Environment, spec: dict, direction: str, root: dict | None = None,
                  allow: tuple[str, ...] = ()) -> list[Edit]:
    """The env's edits of `spec` in `direction` ("harder" | "easier"); [] if it has none.
    `root`: the original task `spec` was adapted from; an env that makes edits from the
    root (`edits_from_root`, household) edits the root (edits never stack), another edits
    `spec` itself. `allow`: opt-in kinds of edit (`opt_in_edits`, household's "goal kind")
    to offer too where the env has them."""
    if direction not in DIRECTIONS:
        raise RlanyError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    if not isinstance(env, OffersEdits):
        return []
    if getattr(env, "edits_from_root", False):
        mine = tuple(a for a in allow if a in getattr(env, "opt_in_edits", ()))
        return list(env.edits(spec, direction, root=root, allow=mine))
    return list(env.edits(spec, direction))


def parse_action(response: str, admissible: list[str]) -> tuple[str | None, dict]:
    """Map a free-text response to one admissible action (or None), with how it matched.

    A number picks from the list (first or last line); else the last non-empty line is
    matched: exactly, as an unambiguous prefix of one action ("take apple" -> "take apple 1
    from table 1"), else as the nearest action by rapidfuzz ratio (cutoff 80)."""
    from rapidfuzz import fuzz, process

    lines = [ln.strip() for ln in response.strip().splitlines() if ln.strip()]
    if not lines:
        return None, {"parse": "empty"}
    for line in (lines[0], lines[-1]):
        m = re.fullmatch(r"(?:action\s*:?\s*)?(\d{1,9})[.)]?", line, re.IGNORECASE)
        if m and 1 <= int(m.group(1)) <= len(admissible):
            return admissible[int(m.group(1)) - 1], {"parse": "number"}
    raw = re.sub(r"^(?:action\s*:\s*|\d+[.)]\s*)", "", lines[-1], flags=re.IGNORECASE)
    raw = raw.strip().rstrip(".")
    text = raw.lower()
    # exactly as written first: an action that differs from another only in case (`type
    # "KENETH"` beside `type "keneth"`) is the one answered, never its first case variant
    if raw in admissible:
        return raw, {"parse": "text"}
    folded = [a for a in admissible if a.lower() == text]
    if len(folded) == 1:
        return folded[0], {"parse": "text"}
    if folded:
        return None, {"parse": "ambiguous case", "text": raw[:200]}
    # an unambiguous start of an action ("take apple" -> "take apple 1 from table 1")
    starts = ([a for a in admissible if a.lower().startswith(text)]
              if len(text.split()) >= 2 else [])
    if len(starts) == 1:
        return starts[0], {"parse": "prefix", "text": text[:200]}
    # else the whole line must be close to one action (spelling slips, not prose that
    # merely mentions a receptacle); as written, else case-folded
    best = (process.extractOne(raw, admissible, scorer=fuzz.ratio, score_cutoff=80)
            or process.extractOne(text, admissible, scorer=fuzz.ratio, score_cutoff=80))
    if best is None:
        return None, {"parse": "no match", "text": text[:200]}
    return best[0], {"parse": "fuzzy", "text": text[:200], "score": round(best[1], 1)}

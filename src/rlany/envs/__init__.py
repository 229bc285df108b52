"""Environments: a Protocol, a registry by name, and third-party plug-ins.

An environment object is one episode's state: `make_env(name)` returns a fresh one, then
`reset(task) -> first observation` and `step(response) -> StepResult` until `done`.
`describe(task)` is the text a task rewriter sees; `validate(spec)` lists what is wrong
with a (possibly rewritten) spec, empty when it is well-formed and solvable in principle.
A module may also offer `make_tasks(n, seed, **knobs) -> list[Task]`.

Third-party packages register in the `rlany.envs` entry-point group:
    [project.entry-points."rlany.envs"]
    myenv = "mypkg.envs:MyEnv"        # a class or factory: MyEnv() -> Environment
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module, metadata
from typing import Protocol

from rlany.errors import RlanyError
from rlany.records import Task


@dataclass(frozen=True)
class StepResult:
    obs: str  # what the agent sees next (must not reveal success on the final step)
    done: bool
    success: bool
    action: str | None = None  # the action the env executed, parsed from the response
    info: dict = field(default_factory=dict)


class Environment(Protocol):
    name: str

    def reset(self, task: Task) -> str: ...

    def step(self, response: str) -> StepResult: ...

    def describe(self, task: Task) -> str: ...

    def validate(self, spec: dict) -> list[str]: ...


# name -> "module:attribute" of a class/factory taking no arguments
BUILTIN = {
    "reasoning": "rlany.envs.reasoning:ReasoningEnv",
    "household": "rlany.envs.household:HouseholdEnv",
    "coding": "rlany.envs.coding:CodingEnv",
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


def make_env(name: str) -> Environment:
    return factory(name)()

"""The loop's executors (`rlany.loop.executors`): `Loop` is the walk and holds no branch on
which executor carries it out (the `if self.plan` branches it had), every executor has the
whole protocol, and a config picks its own (in-process, or launched under `[launch] train`).

The branch check is pure `ast` on loop.py, proven able to fail on planted lines."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

LOOP = Path(__file__).resolve().parent.parent / "src" / "rlany" / "loop" / "loop.py"
KINDS = {"Plan", "InProcess", "Launched", "Executor"}  # the executor classes
HOLDERS = ("executor", "plan")  # what an attribute holding the executor is named


def _names(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))}


def kind_branches(source: str) -> list[str]:
    """The lines of `source` that ask which executor runs: an `isinstance`/`type` of an
    executor class, a test of the executor (or a plan) against None, `self.plan`, or a
    concrete executor class named at all (the loop gets its executor, `executor_for`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        why = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("isinstance", "type", "issubclass"):
            why = "isinstance" if _names(node) & KINDS else None
        elif isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value is None
                for c in [node.left, *node.comparators]):
            held = {n for n in _names(node) if any(h in n.lower() for h in HOLDERS)}
            why = f"{', '.join(sorted(held))} against None" if held else None
        elif isinstance(node, ast.Attribute) and node.attr == "plan":
            why = "self.plan"
        elif isinstance(node, ast.Name) and node.id in KINDS - {"Executor"}:
            why = f"names {node.id}"
        elif isinstance(node, ast.ImportFrom) and {a.name for a in node.names} & (
                KINDS - {"Executor"}):
            why = "imports a concrete executor"
        if why:
            found.append(f"loop.py:{node.lineno}: {why}: {ast.get_source_segment(source, node)}")
    return found


def test_the_walk_holds_no_branch_on_its_executor():
    assert kind_branches(LOOP.read_text()) == []


@pytest.mark.parametrize("planted", [
    "if self.plan is not None:\n    pass",
    "if self.executor is None:\n    pass",
    "x = isinstance(self.executor, Plan)",
    "from rlany.loop.plan import Plan",
    "x = InProcess(cfg)",
])
def test_the_branch_check_finds_a_planted_branch(planted):
    assert len(kind_branches(LOOP.read_text() + "\n" + planted + "\n")) >= 1


def _executors():
    from rlany.loop.executors import InProcess, Launched
    from rlany.loop.plan import Plan

    return [InProcess, Launched, Plan]


@pytest.mark.parametrize("name", ["InProcess", "Launched", "Plan"])
def test_every_executor_has_the_whole_protocol(name):
    """Each method of `Executor`, with its parameters (a missing one would only fail on
    the path that calls it: a planned warm start, say)."""
    from rlany.loop.executors import Executor

    cls = next(c for c in _executors() if c.__name__ == name)
    wanted = [n for n, v in vars(Executor).items() if callable(v) and not n.startswith("_")]
    assert len(wanted) >= 10
    for method in wanted:
        assert callable(getattr(cls, method, None)), f"{name} has no {method}"
        assert list(inspect.signature(getattr(cls, method)).parameters) == \
            list(inspect.signature(getattr(Executor, method)).parameters), (name, method)


@pytest.mark.parametrize("train, kind", [(None, "InProcess"), ("python", "Launched")])
def test_a_config_picks_its_executor(train, kind):
    from rlany.loop.executors import executor_for
    from rlany.loop.launch import Launch

    cfg = SimpleNamespace(launch=Launch(train=train))
    assert type(executor_for(cfg)).__name__ == kind  # type: ignore[arg-type]

"""No import cycle inside src/rlany (docs/layout.md): the import graph of every module, with
every import wherever it stands (inside functions, under `if TYPE_CHECKING:`) and a module's
imports of its own package (`from rlany.engines import Request` in `rlany/engines/hf.py` is
an edge to `rlany/engines/__init__.py`), has no cycle.

An edge runs from a module to each module an import of it runs: `from P import N` reaches
`P.N` when that is a module, else `P`; `import P.Q` reaches `P.Q`; either also runs the
packages above the target that are not the importer's own (the importer's package is
already running when it imports). Pure `ast`: nothing here imports the code it checks."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

def modules(src: Path) -> dict[str, Path]:
    """Dotted name -> file of every module and package under `src`."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def targets(node: ast.AST, package: str, known: dict[str, Path]) -> list[str]:
    """The modules one import statement names (before the packages above them)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: from the importer's package up
        base = package.split(".")[:len(package.split(".")) - node.level + 1]
        module = ".".join([*base, *([node.module] if node.module else [])])
    else:
        module = node.module or ""
    return [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
            for a in node.names]


def import_graph(src: Path, root: str = "rlany") -> dict[str, set[str]]:
    """module -> the modules of `root` its imports run (module docstring)."""
    known = modules(src)
    graph: dict[str, set[str]] = {name: set() for name in known if name.startswith(root)}
    for name in graph:
        path = known[name]
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in targets(node, package, known):
                parts = target.split(".")
                above = {".".join(parts[:i]) for i in range(1, len(parts))} - own
                for module in {target, *above}:
                    if module in graph and module != name:
                        graph[name].add(module)
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as e:
        return e.args[1]
    return None


def test_no_import_cycle_in_rlany():
    graph = import_graph(SRC)
    assert {"rlany.loop.loop", "rlany.files.records", "rlany.stages.score"} <= set(graph)
    found = cycle(graph)
    assert found is None, ("an import cycle (break it by passing data or with a base module): "
                           + " -> ".join(found))


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize("files", [
    {  # a cycle hidden inside a function
        "rlany/__init__.py": "", "rlany/a.py": "from rlany.b import f\n",
        "rlany/b.py": "def f():\n    from rlany.a import g\n"},
    {  # a module importing its own package, whose __init__ imports it
        "rlany/__init__.py": "", "rlany/p/__init__.py": "def make():\n    from rlany.p.m import M\n",
        "rlany/p/m.py": "from rlany.p import make\nclass M: ...\n"},
    {  # relative imports, and a type-only one
        "rlany/__init__.py": "", "rlany/p/__init__.py": "",
        "rlany/p/a.py": "from . import b\n",
        "rlany/p/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"},
    {  # through a package above the target: importing rlany.q.x runs rlany.q's __init__
        "rlany/__init__.py": "", "rlany/q/__init__.py": "from rlany.r import y\n",
        "rlany/q/x.py": "", "rlany/r.py": "import rlany.q.x\n"},
])
def test_a_planted_cycle_is_found(tmp_path, files):
    assert cycle(import_graph(_tree(tmp_path, files))) is not None


def test_a_module_and_its_own_package_are_no_cycle(tmp_path):
    """A submodule imports its siblings by absolute name (which runs its package, already
    running): no edge back to the package that imports it."""
    src = _tree(tmp_path, {"rlany/__init__.py": "", "rlany/p/__init__.py": "from rlany.p import a\n",
                           "rlany/p/a.py": "from rlany.p.b import B\n", "rlany/p/b.py": "B = 1\n"})
    assert cycle(import_graph(src)) is None

"""The lab is a client: research/ reaches the product only through its declared API
(`rlany.api`: the names in its `__all__`) and the CLI (a subprocess, as `learning.py` runs
`rlany loop`); the product never reaches the lab.

Every name research touches is resolved, not just its import lines: every script under
research/ (subfolders too); `import rlany.x as m` then `m.name`, `getattr(m, "name")`, an
attribute chain from `import rlany`; `importlib.import_module("rlany...")` and
`__import__` (a name they cannot resolve, not a constant, is refused too); and what
research reaches through benchmarks/ (`benchmarks.common`, the one module of that folder it
may use, and the benchmarks modules that imports), held to the same API. A name re-exported
by another product module (`rlany.stages.rollout.Completion`) is not the API's: only
`rlany.api` is. There is no exception list: what research needs, the API declares.

The product (src/rlany) never imports research/ or benchmarks/ (nor their scripts by
module name, as a script on sys.path would be), and benchmarks/ never imports research/.

Pure `ast`: nothing here imports the code it checks. Each of the five ways around the rule
that an earlier version of this test let through is planted in a copy and must fail."""

from __future__ import annotations

import ast
import functools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
RESEARCH, BENCHMARKS = ROOT / "research", ROOT / "benchmarks"
API_FILE = SRC / "rlany" / "api.py"
API = "rlany.api"


def api_names(api_file: Path = API_FILE) -> set[str]:
    """The API's names: its `__all__`, a literal list."""
    for node in ast.parse(api_file.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{api_file} has no literal __all__")


def scripts(folder: Path) -> list[Path]:
    """Every .py file under `folder`, subfolders included (not a virtualenv's)."""
    return sorted(p for p in folder.rglob("*.py")
                  if not any(part.startswith(".") or part == "__pycache__"
                             for part in p.relative_to(folder).parts))


def stems(folder: Path) -> set[str]:
    """The module names a folder's scripts import each other by (their folder on sys.path)."""
    return {p.stem for p in scripts(folder)}


def imports(path: Path) -> tuple[tuple[int, str, str | None], ...]:
    """(line, module, name) of every absolute import in `path`, wherever it stands (inside
    functions too): name None for `import module`."""
    return _imports(path.read_text())


@functools.cache  # by the text: the planted copies reuse the tree's work
def _imports(text: str) -> tuple[tuple[int, str, str | None], ...]:
    return tuple(_each_import(ast.parse(text)))


def _each_import(tree: ast.Module) -> Iterator[tuple[int, str, str | None]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def allowed(dotted: str, names: set[str]) -> bool:
    """Whether a client may use `dotted`: the package, the API module, or a name of the API
    (and whatever hangs off it: `rlany.api.Task.from_json`)."""
    parts = dotted.split(".")
    return dotted in ("rlany", API) or (parts[:2] == ["rlany", "api"] and parts[2] in names)


def _dotted(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None for anything else (a call's result, a subscript)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute) and (head := _dotted(node.value)):
        return [*head, node.attr]
    return None


def _dynamic_import(node: ast.Call, aliases: dict[str, str]) -> bool:
    chain = _dotted(node.func) or []
    target = ".".join([aliases.get(chain[0], chain[0]), *chain[1:]]) if chain else ""
    return target in ("importlib.import_module", "__import__")


def rlany_uses(path: Path) -> tuple[tuple[int, str], ...]:
    """(line, dotted name) of everything of rlany's that `path` touches: what it imports,
    the attributes it reads off an rlany module, the modules it imports by string; a
    dynamic import whose module is not a constant is "<dynamic import>"."""
    return _uses(path.read_text())


@functools.cache
def _uses(text: str) -> tuple[tuple[int, str], ...]:
    return tuple(_each_use(ast.parse(text)))


def _each_use(tree: ast.Module) -> Iterator[tuple[int, str]]:
    aliases: dict[str, str] = {}  # a local name -> what it stands for ("rlany.x", "importlib")
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):  # bindings first: a name is used after its import
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                    a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                _dynamic_import(node.value, aliases) and node.value.args and \
                isinstance(node.value.args[0], ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    aliases[t.id] = str(node.value.args[0].value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "rlany":
                    yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "rlany":
            for a in node.names:
                yield node.lineno, f"{node.module}.{a.name}"
        elif isinstance(node, ast.Attribute) and not isinstance(parents.get(node),
                                                                 ast.Attribute):
            chain = _dotted(node)
            if chain and chain[0] in aliases and aliases[chain[0]].startswith("rlany"):
                yield node.lineno, ".".join([aliases[chain[0]], *chain[1:]])
        elif isinstance(node, ast.Call):
            chain = _dotted(node.func)
            if _dynamic_import(node, aliases):
                arg = node.args[0] if node.args else None
                if not isinstance(arg, ast.Constant):
                    yield node.lineno, "<dynamic import>"
                elif str(arg.value).split(".")[0] == "rlany":
                    yield node.lineno, str(arg.value)
            elif chain == ["getattr"] and len(node.args) >= 2 and \
                    isinstance(node.args[1], ast.Constant) and \
                    (obj := _dotted(node.args[0])) and obj[0] in aliases and \
                    aliases[obj[0]].startswith("rlany"):
                yield node.lineno, ".".join([aliases[obj[0]], *obj[1:], str(node.args[1].value)])


def benchmarks_reached(path: Path, benchmarks: Path) -> list[Path]:
    """The benchmarks/ modules `path` imports (`benchmarks.common`, `from benchmarks import
    common`), and theirs in turn (a benchmarks module imports its neighbours by stem)."""
    names = stems(benchmarks)
    found, todo = [], [path]
    while todo:
        here = todo.pop()
        for _, module, name in imports(here):
            parts = module.split(".")
            stem = (parts[1] if parts[0] == "benchmarks" and len(parts) > 1 else
                    name if parts == ["benchmarks"] else
                    parts[0] if here.parent == benchmarks and parts[0] in names else None)
            target = benchmarks / f"{stem}.py" if stem else None
            if target and target.is_file() and target not in found:
                found.append(target)
                todo.append(target)
    return found


def violations(research: Path = RESEARCH, benchmarks: Path = BENCHMARKS,
               api_file: Path = API_FILE) -> list[str]:
    """`file:line: name` for each thing of rlany's that research/, or a benchmarks module it
    reaches, touches outside the API."""
    names, bad = api_names(api_file), []
    for p in scripts(research):
        via = [(p, "")] + [(b, f" (reached from research/{p.relative_to(research)})")
                           for b in benchmarks_reached(p, benchmarks)]
        for file, note in via:
            base = research if file.is_relative_to(research) else benchmarks
            where = f"{base.name}/{file.relative_to(base)}"
            bad += [f"{where}:{line}: {what}{note}" for line, what in rlany_uses(file)
                    if not allowed(what, names)]
    return sorted(set(bad))


def test_the_api_is_declared_and_research_uses_it():
    """`rlany.api.__all__` names what it imports; research/ has scripts that use it."""
    names = api_names()
    tree = ast.parse(API_FILE.read_text())
    bound = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
             for a in n.names}
    assert names and names <= bound, f"__all__ names nothing bound: {sorted(names - bound)}"
    assert any(p.name == "learning.py" for p in scripts(RESEARCH))
    used = {what for p in scripts(RESEARCH) for _, what in rlany_uses(p)}
    assert sum(w.startswith(f"{API}.") for w in used) > 20, used


def test_research_touches_only_the_api():
    bad = violations()
    assert not bad, ("research/ (or a benchmarks module it reaches) uses rlany outside "
                     "rlany.api (import it from there; a name research needs goes into the "
                     "API, src/rlany/api.py, with its group):\n" + "\n".join(bad))


PLANTS = {  # the five ways around an import-line check: (file, text, what must be named)
    "a script in a subfolder": (
        "deep/probe.py", "from rlany.stages.rollout import _advance\n",
        "deep/probe.py:1: rlany.stages.rollout._advance"),
    "a private name by attribute": (
        "probe.py", "from rlany.stages import rollout\n\n\ndef f():\n    return rollout._start\n",
        "probe.py:5: rlany.stages.rollout._start"),
    "importlib": (
        "probe.py", "import importlib\n\nverdict = importlib.import_module("
        "'rlany.training.verdict')\nverdict.branch\n",
        "probe.py:3: rlany.training.verdict"),
    "a below-stage name re-exported by a stage module": (
        "probe.py", "from rlany.stages.rollout import Completion\n",
        "probe.py:1: rlany.stages.rollout.Completion"),
    "a path through benchmarks": (
        "../benchmarks/common.py", "from rlany.compat import cpu_model\n",
        "common.py:1: rlany.compat.cpu_model (reached from research/lab.py)"),
}


@pytest.mark.parametrize("kind", PLANTS)
def test_each_planted_violation_fails(kind, tmp_path):
    """A copy of research/ and benchmarks/ with one violation planted: the copy passes
    before, fails after, naming the planted use."""
    for folder in (RESEARCH, BENCHMARKS):
        for p in scripts(folder):
            dest = tmp_path / folder.name / p.relative_to(folder)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(p, dest)
    research, benchmarks = tmp_path / "research", tmp_path / "benchmarks"
    assert violations(research, benchmarks) == []
    rel, text, expected = PLANTS[kind]
    target = (research / rel).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + (target.read_text() if target.exists() else ""))
    bad = violations(research, benchmarks)
    assert any(b.endswith(expected) for b in bad), (kind, bad)


def test_the_resolver_on_known_uses(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import json\nimport rlany\nimport rlany.stages.eval as ev\n"
                 "from rlany.api import Task, wilson_interval\nfrom rlany import api\n"
                 "ev.wilson\napi.Task.from_json\nrlany.api.t_interval(1)\nrlany.stats.x\n"
                 "getattr(api, '_hidden')\n__import__(name)\n")
    names = api_names()
    assert [(what, allowed(what, names)) for _, what in sorted(rlany_uses(f))] == [
        ("rlany", True), ("rlany.stages.eval", False), ("rlany.api.Task", True),
        ("rlany.api.wilson_interval", True), ("rlany.api", True),
        ("rlany.stages.eval.wilson", False), ("rlany.api.Task.from_json", True),
        ("rlany.api.t_interval", True), ("rlany.stats.x", False),
        ("rlany.api._hidden", False), ("<dynamic import>", False)]


def test_research_reaches_benchmarks_only_for_common():
    bench_scripts = stems(BENCHMARKS)
    bad = []
    for p in scripts(RESEARCH):
        for line, module, name in imports(p):
            top = module.split(".")[0]
            common = module == "benchmarks.common" or (module, name) == ("benchmarks", "common")
            if top == "benchmarks" and not common:
                bad.append(f"research/{p.name}:{line}: {module}")
            elif top in bench_scripts:  # a benchmarks/ script by its bare name
                bad.append(f"research/{p.name}:{line}: {module} (benchmarks/{top}.py)")
    assert not bad, "research/ imports benchmarks/ beyond benchmarks.common:\n" + "\n".join(bad)


def test_product_never_imports_research_or_benchmarks():
    lab = {"research", "benchmarks"} | stems(RESEARCH) | stems(BENCHMARKS)
    bad = [f"{p.relative_to(ROOT)}:{line}: {module}"
           for p in sorted((SRC / "rlany").rglob("*.py")) for line, module, _ in imports(p)
           if module.split(".")[0] in lab]
    assert not bad, "the product imports the lab or the benchmarks:\n" + "\n".join(bad)


def test_benchmarks_never_import_research():
    lab = {"research"} | stems(RESEARCH)
    bad = [f"benchmarks/{p.name}:{line}: {module}"
           for p in scripts(BENCHMARKS) for line, module, _ in imports(p)
           if module.split(".")[0] in lab]
    assert not bad, "benchmarks/ imports research/:\n" + "\n".join(bad)


def lab_citations(package: Path = SRC / "rlany") -> list[str]:
    """`path:line` of each line of a product file (a module, a README, any file under
    src/rlany) that names research/: the reasoning behind the product lives in its stage
    docs, not in the lab's notebook. rlany/api.py names research/ as its client."""
    files = [p for p in sorted(package.rglob("*")) if p.is_file() and p.suffix != ".pyc"
             and p != package / "api.py"]
    return [f"{p.relative_to(package.parent)}:{n}" for p in files
            for n, line in enumerate(p.read_bytes().decode(errors="replace").splitlines(), 1)
            if "research/" in line]


def test_the_product_cites_no_lab():
    bad = lab_citations()
    assert not bad, ("a product file cites the lab (move the reasoning to docs/stages/, or "
                     "drop the citation):\n" + "\n".join(bad))


def test_the_citation_check_catches_one(tmp_path):
    package = tmp_path / "rlany"
    (package / "envs").mkdir(parents=True)
    (package / "api.py").write_text('"""The API research/ imports."""\n')
    (package / "x.py").write_text('"""Fine."""\n# measured: research/LOG.md\n')
    (package / "envs" / "README.md").write_text("Run `python research/pages.py`.\n")
    assert lab_citations(package) == ["rlany/envs/README.md:1", "rlany/x.py:2"]

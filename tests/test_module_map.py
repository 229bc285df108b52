"""The module map (docs/modules.md) is generated from the tree and current: every module of
src/rlany is in it, under its package, with its docstring's first sentence."""

from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).parent.parent


def _gen():
    return load_script("docs/gen_modules.py")


def test_module_map_is_current():
    gen = _gen()
    text = gen.render()
    assert gen.DOC.read_text() == text, "docs/modules.md is stale: run `make docs`"


def test_module_map_names_every_module_under_its_package(tmp_path, monkeypatch):
    """Not vacuous: every module file is a row of its package's section, and a module added
    to the tree changes the map."""
    gen = _gen()
    text = gen.render()
    for path in (ROOT / "src" / "rlany").rglob("*.py"):
        if path.name != "__init__.py":
            package = ".".join(path.parent.relative_to(ROOT / "src").parts)
            section = text.split(f"## `{package}`\n", 1)[1].split("\n## ", 1)[0]
            assert f"| `{path.name}` |" in section, f"{path} is not in the map"
    planted = tmp_path / "rlany"
    planted.mkdir()
    (planted / "__init__.py").write_text('"""A package."""\n')
    (planted / "new.py").write_text('"""A module added. More words."""\n')
    monkeypatch.setattr(gen, "PACKAGE", planted)
    assert "| `new.py` | A module added. |" in gen.render()

"""The generated CLI reference is current, and every option is in its command's `--help`."""

from dataclasses import dataclass

import typer
from typer.testing import CliRunner

from conftest import load_script
from rlany.options import command, from_table, opt, specs, to_argv
from rlany.stages import COMMANDS


def test_cli_reference_is_current():
    gen = load_script("docs/gen_cli.py")
    text = gen.render()
    assert text.splitlines()[0] == gen.HEADER and "do not edit by hand" in gen.HEADER
    assert gen.DOC.read_text() == text, "docs/cli.md is stale: run `make docs`"
    for name in ("rollout", "judge", "score", "train-policy", "loop", "envs make-tasks"):
        assert f"\n## rlany {name}\n" in text  # every command and subcommand is there


@dataclass(frozen=True, kw_only=True)
class ToyOptions:
    steps: int = opt(1, "How many steps.", min=1)
    depth: int = opt(2, "A judge setting.", panel="Judge")


def _toy_app(seen: list) -> typer.Typer:
    app = typer.Typer(rich_markup_mode="markdown")
    command(app, "toy", ToyOptions, seen.append, "A toy stage.", ("rlany toy --steps 2",))

    @app.command("other")
    def other() -> None:
        """A second command, so `toy` is a subcommand as in rlany."""
    return app


def test_a_panel_groups_options_under_its_heading_in_help(monkeypatch):
    from typer import rich_utils

    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 120)
    seen: list = []
    app, runner = _toy_app(seen), CliRunner()
    short = runner.invoke(app, ["toy", "--help"])
    assert short.exit_code == 0 and "--steps" in short.output
    assert short.output.index("Judge") < short.output.index("--depth")
    ran = runner.invoke(app, ["toy", "--depth", "3"])
    assert ran.exit_code == 0, ran.output
    assert seen == [ToyOptions(depth=3)]
    assert from_table(ToyOptions, {"depth": 3}, "x.toml", "toy") == ToyOptions(depth=3)
    assert to_argv("toy", ToyOptions(depth=3)) == ["rlany", "toy", "--depth", "3"]


def hidden_options(group, path: tuple[str, ...] = ()) -> list[str]:
    """`rlany PATH --flag` of each option that a command (hidden ones too) or any command
    under it hides from its `--help`."""
    found = [f"rlany {' '.join(path)} {p.opts[0]}" for p in group.params
             if getattr(p, "hidden", False)]
    for name, cmd in getattr(group, "commands", {}).items():
        found += hidden_options(cmd, path + (name,))
    return found


def test_no_command_hides_an_option():
    """Every option of every command is in its `--help`: an experiment's switch is a public
    option or leaves the product (research/README.md, "Retired switches")."""
    from rlany.cli import app

    root = typer.main.get_command(app)
    assert not hidden_options(root), hidden_options(root)
    for stage in COMMANDS:  # and each stage's options class has its every field there
        out = CliRunner().invoke(app, [stage.name, "--help"], env={"COLUMNS": "200"}).output
        missing = [k for k in specs(stage.options)
                   if "--" + k.replace("_", "-") not in out]
        assert not missing, (stage.name, missing)


def test_the_hidden_check_catches_a_hidden_option():
    app = _toy_app([])
    root = typer.main.get_command(app)
    assert hidden_options(root) == []
    root.commands["toy"].params[0].hidden = True
    assert hidden_options(root) == ["rlany toy --steps"]


def test_eval_groups_the_judge_settings(monkeypatch):
    from typer import rich_utils

    from rlany.cli import app

    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 200)  # no flag name cut short
    out = CliRunner().invoke(app, ["eval", "--help"]).output
    judge = out.index("Judge (with --judge)")
    for flag in ("--judge-adapter", "--judge-max-tokens", "--verdict", "--obs-lines"):
        assert out.index(flag) > judge, flag
    assert out.index("--max-tokens") < judge  # the policy's own stay in the main panel

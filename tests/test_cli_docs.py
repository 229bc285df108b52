"""The generated CLI reference is current, and research switches are fenced off `--help`."""

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import typer
from typer.testing import CliRunner

from rlany.options import RESEARCH_PANEL, command, from_table, opt, specs, to_argv
from rlany.stages import COMMANDS

ROOT = Path(__file__).parent.parent


def _gen_cli():
    spec = importlib.util.spec_from_file_location("gen_cli", ROOT / "docs" / "gen_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_current():
    gen = _gen_cli()
    text = gen.render()
    assert text.splitlines()[0] == gen.HEADER and "do not edit by hand" in gen.HEADER
    assert gen.DOC.read_text() == text, "docs/cli.md is stale: run `make docs`"
    for name in ("rollout", "judge", "score", "train-policy", "loop", "envs make-tasks"):
        assert f"\n## rlany {name}\n" in text  # every command and subcommand is there


@dataclass(frozen=True, kw_only=True)
class ToyOptions:
    steps: int = opt(1, "How many steps.", min=1)
    probe: str = opt("off", "A research probe.", choices=("off", "on"), diagnostic=True)
    depth: int = opt(2, "A judge setting.", panel="Judge")


def _toy_app(seen: list) -> typer.Typer:
    app = typer.Typer(rich_markup_mode="markdown")
    command(app, "toy", ToyOptions, seen.append, "A toy stage.", ("rlany toy --steps 2",))

    @app.command("other")
    def other() -> None:
        """A second command, so `toy` is a subcommand as in rlany."""
    return app


def test_research_switch_is_out_of_help_but_a_flag_and_a_loop_key(monkeypatch):
    from typer import rich_utils

    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 120)
    seen: list = []
    app, runner = _toy_app(seen), CliRunner()
    short = runner.invoke(app, ["toy", "--help"])
    assert short.exit_code == 0 and "--steps" in short.output
    assert "--probe" not in short.output and RESEARCH_PANEL not in short.output
    assert "--help-all" in short.output  # says there is more
    assert "Judge" in short.output and "--depth" in short.output  # a panel is not hidden
    full = runner.invoke(app, ["toy", "--help-all"])
    assert full.exit_code == 0 and "--probe" in full.output
    assert full.output.index(RESEARCH_PANEL) < full.output.index("--probe")
    again = runner.invoke(app, ["toy", "--help"])
    assert "--probe" not in again.output  # --help-all un-hid nothing for later calls
    ran = runner.invoke(app, ["toy", "--probe", "on"])
    assert ran.exit_code == 0, ran.output
    assert seen == [ToyOptions(probe="on")]
    bad = runner.invoke(app, ["toy", "--probe", "maybe"])
    assert bad.exit_code == 2  # still checked like any flag
    assert from_table(ToyOptions, {"probe": "on"}, "x.toml", "toy") == ToyOptions(probe="on")
    assert to_argv("toy", ToyOptions(probe="on")) == ["rlany", "toy", "--probe", "on"]


SWITCH_TABLES = ("research/README.md", "benchmarks/README.md")  # each with its users


def _research_table() -> str:
    """The "## Research switches" sections of SWITCH_TABLES: a switch is documented beside
    the experiment or speed benchmark that uses it."""
    docs = [(ROOT / name).read_text() for name in SWITCH_TABLES]
    return "\n".join(doc[doc.index("## Research switches"):] for doc in docs)


def test_every_research_switch_is_documented_with_its_benchmark():
    """Each diagnostic field of a stage is listed in a research-switches table (research/ or
    benchmarks/ README), and its command offers --help-all; an ordinary field is never
    listed there."""
    table = _research_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    from rlany.cli import app

    for stage in COMMANDS:
        command_name, cls = stage.name, stage.options
        diagnostic = {k for k, (_, _, s) in specs(cls).items() if s.diagnostic}
        for key in diagnostic:
            flag = "--" + key.replace("_", "-")
            assert any(f"`{command_name}`" in r and f"`{flag}" in r for r in rows), \
                f"{command_name} {flag} is a research switch missing from {SWITCH_TABLES}"
        if diagnostic:
            result = CliRunner().invoke(app, [command_name, "--help-all"])
            assert result.exit_code == 0 and RESEARCH_PANEL in result.output
    listed = set(re.findall(r"`(--[a-z-]+)", "\n".join(r.split("|")[2] for r in rows)))
    known = {"--" + k.replace("_", "-") for stage in COMMANDS for k in specs(stage.options)}
    assert listed <= known, f"{SWITCH_TABLES} list flags no stage has: {listed - known}"


def test_eval_groups_the_judge_settings(monkeypatch):
    from typer import rich_utils

    from rlany.cli import app

    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 200)  # no flag name cut short
    out = CliRunner().invoke(app, ["eval", "--help"]).output
    judge = out.index("Judge (with --judge)")
    for flag in ("--judge-adapter", "--judge-max-tokens", "--verdict", "--obs-lines"):
        assert out.index(flag) > judge, flag
    assert out.index("--max-tokens") < judge  # the policy's own stay in the main panel

"""An option's help is what a user needs at the prompt: at most three sentences, citing no
lab notebook. The reasoning behind a flag (why its default, what an experiment showed)
lives in the stage's README (`stages/<stage>/README.md`), which the help may name.

Checked over every option and argument of every command and subcommand, as click holds
them after typer built the app."""

from __future__ import annotations

import re
from dataclasses import dataclass

import click
import pytest
import typer

from rlany.cli import app
from rlany.options import command, opt

MAX_SENTENCES = 3
# abbreviations whose period ends no sentence
ABBREVIATIONS = re.compile(r"\b(?:e\.g|i\.e|etc|vs|cf|approx)\.", re.IGNORECASE)
# a sentence ends at . ! or ? (after any closing brackets or quotes) before white space
SENTENCE_END = re.compile(r"(?<=[.!?])[)\]\"'`]*\s+")
LAB = re.compile(r"\bresearch/|\bLOG\.md\b")  # the lab's notebook: not a user's reference


def sentences(text: str) -> list[str]:
    """The sentences of a help text: a lower-case start counts too ("edits: ... free: ..."
    is two), a decimal or a path's dot does not end one (no space after it)."""
    text = ABBREVIATIONS.sub(lambda m: m[0].replace(".", "\0"), text.strip())
    return [s.replace("\0", ".") for s in SENTENCE_END.split(text) if s.strip()]


def commands(group: click.Command, path: tuple[str, ...] = ()):
    """(path, command) of the app and everything under it, hidden commands included."""
    yield path, group
    for name, cmd in getattr(group, "commands", {}).items():
        yield from commands(cmd, path + (name,))


def offenders(root: click.Command) -> list[str]:
    """`rlany PATH --flag: what is wrong` for each option whose help breaks the rule."""
    bad = []
    for path, cmd in commands(root):
        for param in cmd.params:
            help_text = getattr(param, "help", None) or ""
            where = f"rlany {' '.join(path)} {param.opts[0] if param.opts else param.name}"
            if (n := len(sentences(help_text))) > MAX_SENTENCES:
                bad.append(f"{where}: {n} sentences (move the reasoning into its stage's "
                           f"README): {help_text!r}")
            if LAB.search(help_text):
                bad.append(f"{where}: cites the lab's notebook (say it in the stage's "
                           f"README): {help_text!r}")
    return bad


def test_sentences_are_counted_as_a_reader_reads_them():
    assert len(sentences("One. Two (e.g. three). Four: 0.5, see stages/x/README.md.")) == 3
    assert len(sentences("edits: one. free: two. auto: three. random: four.")) == 4
    assert sentences("Max tokens.") == ["Max tokens."]
    assert sentences("") == []


def test_every_option_of_every_command_is_checked():
    root = typer.main.get_command(app)
    paths = {" ".join(p) for p, _ in commands(root)}
    assert {"rollout", "score", "train-policy", "loop", "envs make-tasks"} <= paths
    helped = [p for _, c in commands(root) for p in c.params if getattr(p, "help", None)]
    assert len(helped) > 200, len(helped)


def test_option_help_is_short_and_cites_no_lab():
    bad = offenders(typer.main.get_command(app))
    assert not bad, "option help over the rule:\n" + "\n".join(bad)


@pytest.mark.parametrize("text,why", [
    ("One. Two. Three. Four.", "4 sentences"),
    ("edits: one. free: two. auto: three. random: four.", "4 sentences"),
    ("Decayed toward 0 (research/LOG.md, 2026-11-23).", "cites the lab"),
])
def test_a_planted_help_fails(text, why):
    """The checker on a toy command whose one option breaks the rule."""
    @dataclass(frozen=True, kw_only=True)
    class Toy:
        fine: int = opt(1, "Fine. Two. Three.", min=1)
        planted: str = opt("a", text)

    toy = typer.Typer()
    command(toy, "toy", Toy, lambda opts: None, "A toy stage.", ("rlany toy --fine 2",))

    @toy.command("other")
    def _other() -> None:
        """A second command, so `toy` is a subcommand as in rlany."""

    bad = offenders(typer.main.get_command(toy))
    assert len(bad) == 1 and "--planted" in bad[0], bad
    assert why.split()[-1] in bad[0] or why.split()[0] in bad[0], (why, bad)

"""The one stderr Console: progress bars, summaries, warnings. stdout carries data only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True, highlight=False)


def info(message: str) -> None:
    """A plain line for people (no rich markup is interpreted in `message`)."""
    console.print(message, markup=False, highlight=False, soft_wrap=True)


@contextmanager
def progress(description: str, total: int | None) -> Iterator[Bar]:
    """A progress bar on stderr; silent when stderr is not a terminal."""
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    with bar:
        task = bar.add_task(description, total=total)
        yield Bar(bar, task)


class Bar:
    def __init__(self, bar: Progress, task) -> None:
        self._bar, self._task = bar, task

    def advance(self, amount: int = 1) -> None:
        self._bar.advance(self._task, amount)

"""The one command line of docs/'s generators: write the generated file, or with `--check`
compare it (`make docs` writes; the tests compare).

    main(__doc__, DOC, render, stale="docs/x.md is stale: run `make docs`")

A generator script imports this as a sibling module (`python docs/x.py` puts docs/ first on
sys.path; tests/conftest.py's `load_script` does the same).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(path: Path, text: str, check: bool, stale: str) -> None:
    """With `check`: exit 1 saying `stale` unless `path` holds exactly `text` (a missing file
    is stale). Else write `text` to `path` atomically (a temp file beside it, renamed)."""
    if check:
        if not path.is_file() or path.read_text() != text:
            sys.exit(stale)
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    print(f"wrote {path}", file=sys.stderr)


def main(doc: str, path: Path, render: Callable[[], str], stale: str) -> None:
    """A generator's command line: its docstring's first line as the description, and
    `--check`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if {path.name} differs from what would be written")
    args = parser.parse_args()
    write_or_check(path, render(), args.check, stale)

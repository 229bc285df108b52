"""Shared by the research scripts: where their results and generated tables go
(research/results/, research/README.md), and whether a run directory is this host's work.

The machine facts and the results file's format have one home, benchmarks/common.py (the
product's measurements record the same); they are imported from there, not copied.
Named `lab`, not `common`, so a process that imports scripts of both folders never mixes
up two modules of one name."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root: `benchmarks.common` below
from benchmarks import common as _bench  # noqa: E402
from benchmarks.common import boot_id, check_name, cpu_label, machine  # noqa: E402, F401

RESULTS = Path(os.environ.get("RLANY_RESEARCH_DIR", "research/results"))
README = Path(__file__).parent / "README.md"  # the generated tables live here


def read_rows(path: Path) -> list[dict]:
    """A JSONL file's records (blank lines skipped): a run's files, read by the scripts here."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def save(name: str, result: dict) -> Path:
    """RESULTS/NAME.json: the result with its name and the machine it ran on."""
    return _bench.save(name, result, RESULTS)


def write_readme_block(block: str, text: str, readme: Path = README) -> None:
    """research/README.md's generated table BLOCK (`<!-- BLOCK:begin -->` ... `end`) := text."""
    _bench.write_readme_block(block, text, readme)


@functools.cache
def _boot_time() -> int | None:
    """When this machine booted (`/proc/stat` btime, seconds since the epoch)."""
    try:
        return next(int(line.split()[1]) for line in
                    Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    except (OSError, StopIteration, ValueError):
        return None


def made_since_boot(path: Path) -> bool:
    """Whether `path` was last written after this machine booted: a run directory that was
    is this host's work; one from before may be another host's."""
    btime = _boot_time()
    try:
        return btime is not None and path.stat().st_mtime >= btime
    except OSError:
        return False

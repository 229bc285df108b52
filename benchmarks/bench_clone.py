"""clone: what `git clone` downloads, the whole history against the tip alone (`--depth 1`,
README's clone line). The history keeps every committed version of every file, old run
tarballs of the lab's among them, which a user of the CLI never needs. Target: the shallow
clone's `.git` under 1/10 of the full one's.

    python benchmarks/bench_clone.py [SOURCE]   # -> benchmarks/results/clone.json

SOURCE is a clone URL (default: this repository's `file://` URL, so that git sends the
packed objects a network clone would get, not hard links). Sizes are the bytes `du -sb`
counts under each clone's `.git`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MIB = 2 ** 20


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def du_bytes(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], check=True, capture_output=True,
                              text=True).stdout.split()[0])


def clone(source: str, into: Path, *flags: str) -> dict:
    start = time.perf_counter()
    git("clone", "-q", "--no-local", *flags, source, str(into))
    return {"seconds": round(time.perf_counter() - start, 1),
            "git_mib": round(du_bytes(into / ".git") / MIB, 1),
            "tree_mib": round((du_bytes(into) - du_bytes(into / ".git")) / MIB, 1),
            "commits": int(git("rev-list", "--count", "HEAD", cwd=into))}


def main(source: str | None = None) -> dict:
    source = source or ROOT.as_uri()
    with tempfile.TemporaryDirectory() as tmp:
        shallow = clone(source, Path(tmp) / "shallow", "--depth", "1")
        full = clone(source, Path(tmp) / "full")
        commit = git("rev-parse", "HEAD", cwd=Path(tmp) / "shallow")
    ratio = round(shallow["git_mib"] / full["git_mib"], 3)
    result = {"metric": "MiB of .git a clone downloads, --depth 1 / the full history",
              "ratio": ratio, "target": "<= 0.1", "met": ratio <= 0.1,
              "commit": commit, "shallow": shallow, "full": full}
    save("clone", result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="a clone URL (default: this repository)")
    print(json.dumps(main(parser.parse_args().source), indent=2))

"""install: the README's first two lines on a fresh checkout, timed: `git clone --depth 1`
then `make install` (a virtualenv of its own, every package downloaded: pip's cache off),
as a new user runs them.

    python benchmarks/bench_install.py [SOURCE]   # -> benchmarks/results/install.json

SOURCE is a clone URL (default: this repository's `file://` URL). What a fresh machine has
and this one may not: the Debian tools `make install` adds as root (bubblewrap, chromium and
its driver) are counted only when missing here (`system_tools` says which were present), and
the download speed is this machine's to the package registries, so the seconds are this
network's, or a local mirror's where pip is configured with one (`pip_sources` says).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_clone import du_bytes, git  # noqa: E402
from common import save  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("bwrap", "chromium", "chromedriver")


def _timed(argv: list[str], cwd: Path, env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, env=env, stdout=subprocess.DEVNULL)
    return round(time.perf_counter() - start, 1)


def main(source: str | None = None) -> dict:
    source = source or ROOT.as_uri()
    present = {tool: shutil.which(tool) is not None for tool in TOOLS}
    pip_sources = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                                 capture_output=True, text=True).stdout.splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        into = Path(tmp) / "rlany"
        clone = _timed(["git", "clone", "-q", "--no-local", "--depth", "1", source,
                        str(into)], Path(tmp))
        env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
        env.pop("VIRTUAL_ENV", None)
        install = _timed(["make", "install"], into, env)
        venv, commit = du_bytes(into / ".venv"), git("rev-parse", "HEAD", cwd=into)
    result = {"metric": "seconds of the README's clone line and `make install` on a fresh "
                        "checkout, pip's cache off",
              "commit": commit, "clone_seconds": clone, "install_seconds": install,
              "install_minutes": round(install / 60, 1),
              "venv_mib": round(venv / 2 ** 20), "system_tools": present,
              "pip_sources": [x for x in pip_sources if "index" in x or "find-links" in x],
              "note": "packages from the sources pip_sources names (a local wheel directory "
                      "or mirror is faster than a download over the internet); the Debian "
                      "tools present here were not installed again"}
    save("install", result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="a clone URL (default: this repository)")
    print(json.dumps(main(parser.parse_args().source), indent=2))

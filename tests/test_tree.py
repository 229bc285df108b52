"""A clone a user can afford: the tree holds source, docs and results, no run state (run
directories, tarballs of runs, checkpoints, adapters, model weights) and no large file, and
the README clones the tip alone (`--depth 1`: the history keeps old run tarballs of the
lab's; benchmarks/results/clone.json measures both).

Reads `git ls-files`; skipped where the tree is not a git checkout (an unpacked sdist)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 1024 * 1024  # the largest committed file is ~0.2 MiB (docs/cli.md)
RUN_STATE = re.compile(r"(^|/)(runs|ckpt|checkpoints?|logs)/|\.(tar(\.\w+)?|tgz|zip|safetensors|"
                       r"bin|pt|pth|ckpt|gguf|npz)$|(^|/)(adapter_config|trainer_state)\.json$")


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.decode().split("\0") if p]


def run_state(paths: list[str]) -> list[str]:
    return [p for p in paths if RUN_STATE.search(p)]


def test_no_run_state_is_tracked():
    paths = tracked()
    assert len(paths) > 100 and "README.md" in paths
    assert not run_state(paths), f"run state in the tree (keep it out: .gitignore): {run_state(paths)}"


def test_the_rule_catches_run_state():
    assert run_state(["runs/demo/metrics.jsonl", "research/inflight/mid.tar.gz",
                      "ckpt/policy-1/adapter_model.safetensors", "x/adapter_config.json",
                      "src/rlany/tiny_corpus.json.gz", "research/results/learning.json"]) == [
        "runs/demo/metrics.jsonl", "research/inflight/mid.tar.gz",
        "ckpt/policy-1/adapter_model.safetensors", "x/adapter_config.json"]


def test_no_large_file_is_tracked():
    big = [f"{p}: {size} bytes" for p in tracked()
           if (ROOT / p).is_file() and (size := (ROOT / p).stat().st_size) > MAX_BYTES]
    assert not big, f"files over {MAX_BYTES} bytes in the tree: {big}"


def test_the_readme_clones_the_tip_alone():
    clones = re.findall(r"^git clone .*$", (ROOT / "README.md").read_text(), re.M)
    assert clones and all("--depth 1" in c for c in clones), clones

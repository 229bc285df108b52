"""Shared test helpers: small records built by hand, and the real CLI as a subprocess."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

# tests never reach a model hub: fail fast instead of waiting on network timeouts
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from rlany.files.records import (
    JudgeSample,
    Judgment,
    Step,
    StepJudgment,
    Trajectory,
    to_json,
    traj_id,
)


def make_traj(task_id: str, sample: int, outcome: int, n_steps: int = 1,
              iteration: int = 0, **extra) -> Trajectory:
    steps = [Step(obs=f"obs {t}", prompt_messages=[{"role": "user", "content": f"{task_id} {t}"}],
                  response=f"act {sample}.{t}", action=f"act {t}", next_obs=f"obs {t + 1}")
             for t in range(n_steps)]
    return Trajectory(traj_id=traj_id(task_id, iteration, sample), task_id=task_id,
                      iteration=iteration, sample=sample, steps=steps, outcome=outcome,
                      finish="success" if outcome == 1 else "failure",
                      policy={"model": "test"}, extra=extra)


def make_judgment(traj: Trajectory, scores: list[list[int]]) -> Judgment:
    assert len(scores) == len(traj.steps)
    return Judgment(traj_id=traj.traj_id, task_id=traj.task_id, judge={"model": "test"},
                    steps=[StepJudgment(step=t, judge_messages=[{"role": "user", "content": "j"}],
                                        samples=[JudgeSample(text=f"\\boxed{{{s}}}", score=s)
                                                 for s in ss])
                           for t, ss in enumerate(scores)])


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(to_json(r)) + "\n" for r in records))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def load_script(path: str) -> types.ModuleType:
    """A script of the repository (`docs/gen_cli.py`, ...) loaded afresh as a module, as
    `python PATH` runs it: its folder first on sys.path, so its sibling imports resolve."""
    file = Path(__file__).resolve().parent.parent / path
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(*args: str, cwd: Path | None = None, stdin: str | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `rlany` entry point in a subprocess."""
    full_env = {**os.environ, "RLANY_DEBUG": "", **(env or {})}
    return subprocess.run([sys.executable, "-m", "rlany", *args], cwd=cwd, input=stdin,
                          capture_output=True, text=True, env=full_env, timeout=600)


def one_line(r, code: int) -> str:
    """A finished command's exit code is `code` and its stderr ends in exactly one error
    line, with no traceback: that line."""
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("error:", "usage error:", "internal"))]
    assert errors == lines[-1:] and "Traceback" not in r.stderr, r.stderr
    return lines[-1]


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A tiny random-init chat model built locally (about 2 s)."""
    from rlany.models import make_tiny
    return str(make_tiny(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="session")
def tiny_lora(tiny_model, tmp_path_factory) -> str:
    """A LoRA adapter on the tiny model with non-zero B, so it changes the output."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                                  target_modules=["q_proj", "v_proj"]))
    path = tmp_path_factory.mktemp("lora") / "adapter"
    peft_model.save_pretrained(path)
    return str(path)


def strict_json(text: str):
    """JSON as any other reader parses it: NaN and Infinity, which Python's json writes
    and reads by default, are not JSON and are refused."""
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="session", autouse=True)
def every_json_file_written_is_json(tmp_path_factory):
    """After the session: every `.json` file under the tests' temp folders (sidecars,
    summaries, checkpoints' rlany.json, the loop's config.json and done.json) that Python's
    lenient parser reads is read by the strict one too. A file even the lenient parser
    refuses was damaged by a test on purpose and is left alone; none writes NaN on purpose."""
    yield
    bad = []
    for path in Path(tmp_path_factory.getbasetemp()).rglob("*.json"):
        if path.is_symlink() or not path.is_file():  # a test's FIFO or link: never read
            continue
        try:
            text = path.read_text(encoding="utf-8")
            json.loads(text)
        except (OSError, ValueError, RecursionError):
            continue
        try:
            strict_json(text)
        except ValueError as e:
            bad.append(f"{path}: {e}")
    assert not bad, "written with NaN or Infinity, not JSON:\n" + "\n".join(bad[:10])

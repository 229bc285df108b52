"""research/carry.py: what a run directory carries to the next machine."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research"))

from carry import members  # noqa: E402


def _touch(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_finished_warm_start_travels_and_an_unfinished_iteration_does_not(tmp_path):
    run = tmp_path / "policy-only-warm-s0"
    for name in ("config.json", "eval_base.json", "eval_init.json", "metrics.jsonl",
                 ".loop.lock", "warm_start/demos.jsonl", "warm_start/.sft.lock",
                 "warm_start/sft/rlany.json", "warm_start/sft/adapter_model.safetensors",
                 "iter_000/done.json", "iter_000/task_stats.jsonl",
                 "iter_000/trajectories.jsonl", "iter_000/policy/rlany.json",
                 "iter_001/task_stats.jsonl"):
        _touch(run / name)
    got = {str(p.relative_to(run)) for p in members(run)}
    assert got == {"config.json", "eval_base.json", "eval_init.json", "metrics.jsonl",
                   "warm_start/demos.jsonl", "warm_start/sft/rlany.json",
                   "warm_start/sft/adapter_model.safetensors", "iter_000/done.json",
                   "iter_000/task_stats.jsonl", "iter_000/policy/rlany.json"}
    (run / "warm_start/sft/rlany.json").unlink()  # the sft unfinished: it is remade there
    _touch(run / "warm_start/sft.partial/x")
    assert not any(str(p.relative_to(run)).startswith("warm_start") for p in members(run))

"""rm_replay.py's summary: the held-out judges as run and replayed, and train-rm's seconds."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research"))

import rm_replay  # noqa: E402


def _judged(d: Path, gain: float, step_seconds: list[float]) -> None:
    (d / "iter_000").mkdir(parents=True)
    (d / "iter_000" / "rm.metrics.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "seconds": s}) + "\n"
                for i, s in enumerate(step_seconds)))
    (d / "judge_heldout.json").write_text(json.dumps({"final": "iter_000", "judges": {
        "base": {"bal_acc": 0.5},
        "iter_000": {"bal_acc": 0.5 + gain, "gain": gain, "p_positive": [0.5]}}}))


def test_summary_reports_the_judges_and_train_rm_seconds(tmp_path, monkeypatch):
    import lab
    monkeypatch.setattr(lab, "RESULTS", tmp_path / "results")
    for seed, (as_run, replayed) in enumerate(((6.0, 4.0), (9.0, 3.0))):
        _judged(tmp_path / f"run{seed}", 0.1, [as_run / 2, as_run / 2])
        _judged(tmp_path / f"rep{seed}", 0.2, [replayed])
        (tmp_path / f"rep{seed}" / "replay.json").write_text(
            json.dumps({"overrides": {"batch_order": "stratified"}}))
    pairs = [f"{tmp_path}/run{s}={tmp_path}/rep{s}" for s in (0, 1)]
    assert rm_replay.summary("replay-test", pairs) == 0
    out = json.loads((tmp_path / "results" / "replay-test.json").read_text())
    assert out["pairs"][0]["train_rm"] == {"as_run": {"steps": 2, "seconds": 6.0},
                                           "replayed": {"steps": 1, "seconds": 4.0},
                                           "speedup": 1.5}
    assert out["train_rm_speedup"] == {"value": 2.25, "per_seed": [1.5, 3.0]}
    assert abs(out["judge_gain_replayed"]["value"] - 0.2) < 1e-9
    assert "p_positive" not in out["pairs"][0]["replayed"]

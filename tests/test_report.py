"""`rlany report`: only the panels a run has, intervals as error bars, seeds of an arm as
one line with a band."""

import json
from pathlib import Path

from rlany.stages.report import lines, load_run, write_report
from rlany.stats import t_interval, wilson_interval


def _run(root: Path, name: str, evals: list[float], judge: bool = False,
         episodes: int | None = None) -> Path:
    """A loop run directory: base eval, then one metrics row per evaluation (with its
    episode count where `episodes` says)."""
    run = root / name
    run.mkdir(parents=True)
    rows = []
    for i, s in enumerate(evals[1:]):
        row = {"iteration": i, "train_acc": 0.1 * (i + 1), "eval_success": s,
               "eval_success_ci95": [s - 0.05, s + 0.05], "policy_loss": 0.5,
               "seconds": {"rollout": 3.0, "train_policy": 5.0},
               **({"eval_episodes": episodes} if episodes else {})}
        if judge:
            row.update(judge_label_accuracy=0.5, judge_parse_fail_rate=0.0, accepted_tasks=i)
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "eval_base.json").write_text(json.dumps(
        {"success_rate": evals[0], "trajectories": 128,
         "success_ci95": [evals[0] - 0.04, evals[0] + 0.04]}))
    return run


def test_a_policy_only_run_gets_only_its_panels(tmp_path):
    run = _run(tmp_path, "policy-only", [0.1, 0.2, 0.3])
    out = tmp_path / "report"
    (out).mkdir()
    (out / "judge_label_accuracy.png").write_bytes(b"an older report's panel")
    (out / "report.md").write_text("an older report\n")  # report writes only over a report
    written = {p.name for p in write_report([str(run)], out)}
    assert written == {"train_acc.png", "eval_success.png", "policy_loss.png",
                       "stage_seconds.png", "report.md"}
    assert sorted(p.name for p in out.iterdir()) == sorted(written)
    md = (out / "report.md").read_text()
    assert "![eval_success](eval_success.png)" in md and "judge_label_accuracy" not in md


def test_eval_success_carries_its_intervals(tmp_path):
    run = load_run(_run(tmp_path, "one", [0.1, 0.2, 0.3]))
    (line,) = lines([run], "eval_success")
    assert line["x"] == [-1, 0, 1] and line["y"] == [0.1, 0.2, 0.3] and line["intervals"]
    assert [round(v, 2) for v in line["lo"]] == [0.06, 0.15, 0.25]
    assert [round(v, 2) for v in line["hi"]] == [0.14, 0.25, 0.35]
    (acc,) = lines([run], "train_acc")
    assert not acc["intervals"] and acc["lo"] == acc["y"]  # no interval: none drawn


def test_seeds_of_one_arm_are_one_line_with_a_band(tmp_path):
    runs = [load_run(_run(tmp_path, f"full-s{s}", evals, judge=True))
            for s, evals in enumerate([[0.1, 0.2, 0.4], [0.1, 0.3, 0.2], [0.2, 0.4, 0.3]])]
    runs.append(load_run(_run(tmp_path, "policy-only-s0", [0.1, 0.3, 0.5])))
    panel = lines(runs, "eval_success")
    # no episode counts in these metrics: the mean, with a 95% t-interval over the seeds
    assert [p["label"] for p in panel] == [
        "full (3 seeds, mean; band: 95% t over seeds)", "policy-only-s0"]
    full = panel[0]
    assert full["band"] and full["x"] == [-1, 0, 1]
    assert [round(v, 3) for v in full["y"]] == [0.133, 0.3, 0.3]
    seeds = [[0.1, 0.1, 0.2], [0.2, 0.3, 0.4], [0.4, 0.2, 0.3]]
    assert [[lo, hi] for lo, hi in zip(full["lo"], full["hi"])] == [
        t_interval(v) for v in seeds]
    assert [p["label"] for p in lines(runs, "judge_label_accuracy")] == [
        "full (3 seeds, mean; band: 95% t over seeds)"]  # policy-only has no judge line
    # with the episodes each evaluation ran, success is pooled with its Wilson interval
    pooled = [load_run(_run(tmp_path / "p", f"arm-s{s}", evals, episodes=128))
              for s, evals in enumerate([[0.1, 0.25], [0.2, 0.5]])]
    line = lines(pooled, "eval_success")[0]
    assert line["label"] == "arm (2 seeds, pooled; band: 95% Wilson)"
    assert line["y"] == [(13 + 26) / 256, (32 + 64) / 256]
    assert [line["lo"][1], line["hi"][1]] == wilson_interval(96, 256)
    out = tmp_path / "cmp"
    written = {p.name for p in write_report([str(tmp_path / r["name"]) for r in runs], out)}
    assert "judge_label_accuracy.png" in written and "eval_judge_step_accuracy.png" not in written
    assert "| full-s1 |" in (out / "report.md").read_text()  # the table: one row per run


def test_a_run_is_read_as_the_loop_wrote_it_and_nothing_twice(tmp_path):
    """Iterations by number (iter_1000 after iter_999), a copied `iter_003.old` no
    iteration, an unfinished one (no done.json) not the final, an iteration twice in metrics.jsonl or a run given twice refused (each would
    count twice), and no gain across two task sets."""
    import pytest

    from rlany.errors import RlanyError
    from rlany.files.jsonl import meta_path

    run = _run(tmp_path, "a", [0.1, 0.2, 0.3])
    for name, rate in (("iter_999", 0.3), ("iter_1000", 0.4), ("iter_1000.old", 0.9),
                       ("iter_1001", 0.8)):
        (run / name).mkdir()
        (run / name / "eval.json").write_text(json.dumps({"success_rate": rate}))
        if name != "iter_1001":  # killed before its done.json: not the run's final
            (run / name / "done.json").write_text("{}")
    got = load_run(run)
    assert (got["final_iteration"], got["final"]["success_rate"]) == (1000, 0.4)
    with pytest.raises(RlanyError, match="given twice") as e:
        write_report([str(run), str(tmp_path / "." / "a")], tmp_path / "report")
    assert not (tmp_path / "report").exists() and e.value.where == str(tmp_path / "." / "a")
    sidecar = {"inputs": [{"path": "eval.jsonl", "sha256": "a" * 64}]}
    meta_path(run / "eval_base.json").write_text(json.dumps(sidecar))
    sidecar["inputs"][0]["sha256"] = "b" * 64
    meta_path(run / "iter_1000" / "eval.json").write_text(json.dumps(sidecar))
    with pytest.raises(RlanyError, match="evaluated other tasks than eval_base.json"):
        load_run(run)
    metrics = run / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines()[0] + "\n" + metrics.read_text())
    (run / "iter_1000" / "eval.meta.json").unlink()
    with pytest.raises(RlanyError, match="iteration 0 again \\(first at line 1\\)") as e:
        load_run(run)
    assert e.value.where == f"{metrics}:2"

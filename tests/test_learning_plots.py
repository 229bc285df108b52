"""The learning benchmark's arm plots (research/learning_plots.py): one line per arm from
the per-run records, the mean over seeds with a 95% band."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research"))

from learning_plots import arm_lines, draw  # noqa: E402

from rlany.stats import wilson_interval  # noqa: E402


def _run(final: int, *, warm: bool = False, judges: dict | None = None,
         rollouts: list | None = None, accepted: list | None = None) -> dict:
    out = {"base": {"successes": 0, "episodes": 128},
           "curve": [{"iteration": -1, "successes": 0, "episodes": 128},
                     {"iteration": 2, "successes": final, "episodes": 128}],
           "judge_on_rollouts": [{"label_accuracy": a} for a in rollouts or []],
           "accepted_tasks": accepted or [0, 0, 0], "rm_samples": [None, None, None]}
    if warm:
        out["init"] = {"successes": 60, "episodes": 128}
    if judges is not None:
        out["judge_heldout"] = {"judges": {k: {"bal_acc": v} for k, v in judges.items()}}
    return out


def test_success_is_pooled_over_seeds_with_the_wilson_band():
    by_arm = {"policy-only [warm]": [_run(50, warm=True), _run(70, warm=True)]}
    (line,) = arm_lines(by_arm, "success")
    assert line["x"] == [-2, -1, 2]  # base model, warm start, after the 3rd iteration
    assert line["y"][-1] == 120 / 256 and line["band"][-1] == wilson_interval(120, 256)
    assert line["label"] == "policy-only [warm] (2 seeds)"


def test_per_iteration_panels_take_the_mean_and_a_t_band_only_with_two_seeds():
    by_arm = {"full": [_run(40, rollouts=[0.5, 0.6, 0.7]), _run(40, rollouts=[0.5, 0.8, 0.7])],
              "policy-only": [_run(40)]}
    (line,) = arm_lines(by_arm, "judge_rollouts")  # policy-only has no judge: no line
    assert line["x"] == [0, 1, 2] and abs(line["y"][1] - 0.7) < 1e-9
    assert line["band"][0] == [0.5, 0.5] and line["band"][1][0] < 0.7 < line["band"][1][1]
    one = arm_lines({"full": [_run(40, rollouts=[0.5])]}, "judge_rollouts")[0]
    assert one["band"] == [None] and one["label"] == "full (1 seed)"


def test_a_t_band_stays_within_what_its_quantity_can_be():
    """A t band over 3 seeds of counts (accepted tasks 0, 0, 6) runs below 0; of a share
    (success on the pool's rollouts) past 1: each is cut at its quantity's range."""
    runs = [_run(40, accepted=[0, a, 0]) for a in (0, 0, 6)]
    for r, acc in zip(runs, (0.1, 0.9, 1.0)):
        r["train_acc"] = [acc, 1.0, 0.5]
    (count,) = arm_lines({"+adapt": runs}, "accepted_tasks")
    assert count["band"][1][0] == 0.0 and count["band"][1][1] > 6  # cut below, not above
    (share,) = arm_lines({"+adapt": runs}, "train_acc")
    assert share["band"][0][0] < 0.1 and share["band"][0][1] == 1.0
    assert share["band"][1] == [1.0, 1.0]  # no spread: the interval is the value


def test_held_out_judges_start_from_the_judge_the_run_started_from():
    warm = _run(40, judges={"base": 0.5, "warm": 0.83, "iter_002": 0.78})
    plain = _run(40, judges={"base": 0.5, "iter_001": 0.63, "iter_002": 0.58})
    (w,) = arm_lines({"full [judge-warm]": [warm]}, "judge_heldout")
    assert dict(zip(w["x"], w["y"])) == {-1: 0.83, 2: 0.78}
    # seeds counted where they have data: one run of two has held-out judges
    (p,) = arm_lines({"full": [plain, _run(40)]}, "judge_heldout")
    assert dict(zip(p["x"], p["y"])) == {-1: 0.5, 1: 0.63, 2: 0.58}
    assert p["label"] == "full (1 seed)"


def test_draw_writes_the_panels_with_data_and_removes_a_stale_one(tmp_path):
    stale = tmp_path / "arms_accepted_tasks.png"
    stale.write_bytes(b"old")
    written = draw({"policy-only": [_run(40)], "full": [_run(30, rollouts=[0.5, 0.5])]},
                   tmp_path)
    names = sorted(p.name for p in written)
    assert names == ["arms_judge_rollouts.png", "arms_success.png"]
    assert not stale.exists()  # no arm accepted a task: no panel
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written)

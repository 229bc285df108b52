"""research/env_loop_why.py: the accepted rewrites by edit and goal kind, and the original
tasks' progress (goal object picked up) per iteration, read from a run's files."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research"))

from env_loop_why import summary  # noqa: E402


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _task(task_id: str, kind: str, version: int) -> dict:
    return {"task_id": task_id, "spec": {"goal": {"kind": kind, "object": "apple"}},
            "lineage": {"version": version}}


def _traj(task_id: str, action: str, obs: str, outcome: float) -> dict:
    return {"task_id": task_id, "outcome": outcome,
            "steps": [{"action": "go to table 1", "next_obs": "You arrive"},
                      {"action": action, "next_obs": obs}]}


def test_accepted_edits_and_the_originals_progress(tmp_path):
    it = tmp_path / "adapt-s0" / "iter_000"
    _write(it.parent / "metrics.jsonl", [{"iteration": 0}])
    (it.parent / "config.json").write_text('{"iterations": 3}')
    _write(it / "rollout_tasks.jsonl", [_task("t1", "pick_and_place", 0),
                                        _task("t1.v1.i0", "pick", 1)])
    _write(it / "trajectories.jsonl", [
        _traj("t1", "take apple 1 from table 1", "You pick up the apple 1.", -1),
        _traj("t1", "take apple 1 from table 1", "Nothing happens.", -1),
        _traj("t1", "take applepie 1 from table 1", "You pick up the applepie 1.", -1),
        _traj("t1.v1.i0", "take apple 1 from table 1", "You pick up the apple 1.", 1)])
    _write(it / "candidates.jsonl", [
        {"task_id": "t1.v1.i0", "spec": {"goal": {"kind": "pick"}},
         "candidate": {"edit": "goal kind: pick_and_place -> pick"}},
        {"task_id": "t2.v1.i0", "spec": {"goal": {"kind": "pick_and_place"}},
         "candidate": {"edit": "remove table 1"}}])
    _write(it / "decisions.jsonl", [{"kind": "decision", "task_id": "t1.v1.i0", "accepted": True,
                                     "direction": "easier", "acc": 0.25},
                                    {"task_id": "t2.v1.i0", "accepted": False,
                                     "direction": "easier", "acc": 0.0},
                                    {"kind": "rewrite_rejected", "task_id": "t3",
                                     "reasons": ["no valid edit"]}])  # not a decision
    result = summary(tmp_path, late=1)
    assert result["took_pooled_last_1"] == {"adapt": {"took": 1, "episodes": 3,
                                                      "share": round(1 / 3, 3)}}
    run = result["runs"]["adapt-s0"]
    assert run["edits"] == {"accepted": {"goal kind": 1}, "rejected": {"remove": 1},
                            "accepted_goal_kinds": {"pick": 1},
                            "kind_kept_accepted_of_decided": {"pick_and_place: remove": [0, 1]},
                            "accepted_then_overwritten": 0,
                            "by_direction": {"easier": {
                                "goal kind": {"decided": 1, "accepted": 1, "mean_acc": 0.25,
                                              "acc_zero": 0},
                                "remove": {"decided": 1, "accepted": 0, "mean_acc": 0.0,
                                           "acc_zero": 1}}}}
    # the rewritten task's episode is not an original's; a failed take and another
    # object's are no progress
    assert run["originals"] == [{"iteration": 0, "episodes": 3, "took": 1, "succeeded": 0}]
    assert run["took_share_last_1"] == round(1 / 3, 3) and run["iterations"] == 1
    assert run["planned_iterations"] == 3  # unfinished: 1 of 3 (the metrics' lines)


def test_a_parent_overwritten_in_one_iteration_counts_the_task_the_pool_took(tmp_path):
    """Runs made before a parent took one candidate an iteration hold two accepted decisions
    for one parent; the pool took the last: the earlier is counted as not accepted."""
    it = tmp_path / "adapt-s0" / "iter_000"
    _write(it.parent / "metrics.jsonl", [{"iteration": 0}])
    _write(it / "rollout_tasks.jsonl", [])
    _write(it / "trajectories.jsonl", [])
    _write(it / "candidates.jsonl", [
        {"task_id": f"t1.v{v}.i0", "spec": {"goal": {"kind": "pick_and_place"}},
         "candidate": {"edit": edit}} for v, edit in ((1, "remove table 1"),
                                                      (2, "step limit: 8 -> 10"))])
    _write(it / "decisions.jsonl", [{"kind": "decision", "task_id": f"t1.v{v}.i0",
                                     "parent_id": "t1", "accepted": True} for v in (1, 2)])
    edits = summary(tmp_path, late=1)["runs"]["adapt-s0"]["edits"]
    assert edits["accepted"] == {"step limit": 1} and edits["rejected"] == {"remove": 1}
    assert edits["accepted_then_overwritten"] == 1


def test_candidates_that_repeat_an_earlier_iterations_spec_are_counted(tmp_path):
    run = tmp_path / "adapt-s0"
    _write(run / "metrics.jsonl", [{"iteration": 0}, {"iteration": 1}])
    for k, specs in enumerate(([{"a": 1}, {"a": 2}], [{"a": 2}, {"a": 3}, {"a": 3}])):
        it = run / f"iter_00{k}"
        for name in ("rollout_tasks.jsonl", "trajectories.jsonl", "decisions.jsonl"):
            _write(it / name, [])
        _write(it / "candidates.jsonl", [{"task_id": f"c{k}{j}", "spec": x}
                                         for j, x in enumerate(specs)])
    # {"a": 2} again in iteration 1 is a repeat; {"a": 3} twice within one is not
    assert summary(tmp_path, late=1)["runs"]["adapt-s0"]["repeats"] == {
        "candidates": 5, "spec_proposed_earlier": 1}

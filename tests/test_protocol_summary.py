"""research/protocol.py: the pinned protocol's outcomes (research/README.md) read from small
hand-made run directories as learning.py names them (ARM[-TAG]-sSEED): the primary
differences paired by seed, each arm's seconds per iteration with its CPU, and the
secondary figures (held-out success by kind, accepted rewrites, originals, rewrites against
their roots, the rewriter's choices, anchor groups, the warm start)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "research"))

import protocol  # noqa: E402

from rlany.stats import gain_interval  # noqa: E402

HELD = {"h0": "pick_and_place", "h1": "pick_and_place", "h2": "pick"}  # 4 episodes each


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _task(task_id: str, kind: str = "pick_and_place", root: str | None = None,
          accepted: int | None = None, extra: dict | None = None) -> dict:
    return {"task_id": task_id, "env": "household", "prompt": "",
            "spec": {"goal": {"kind": kind, "object": "apple"}},
            "lineage": {"root_id": root or task_id, "parent_id": root,
                        "version": 1 if root else 0, "accepted_iter": accepted},
            **(extra or {})}


def _traj(task_id: str, it: int, k: int, won: bool, finish: str | None = None) -> dict:
    return {"traj_id": f"{task_id}/{it}/{k}", "task_id": task_id, "iteration": it,
            "sample": k, "outcome": 1 if won else -1,
            "finish": finish or ("success" if won else "failure"), "policy": {},
            "steps": [{"obs": "", "prompt_messages": [], "response": "1",
                       "action": "take apple 1 from table 1",
                       "next_obs": "You pick up the apple 1.", "info": {}}]}


def _run(runs: Path, name: str, final: list[int], init: int = 5, metrics: list[dict] = (),
         pools: list[list[tuple]] = ((("t1", None, None, [1, 0]),),) * 2,
         iter_files: dict | None = None) -> Path:
    """A finished run: base and warm-start evaluations (12 episodes), one pool per
    iteration (task id, root, accepted_iter, outcomes), the last iteration's evaluation
    with `final` successes of 4 per held-out task, and metrics rows."""
    run = runs / name
    n = 4 * len(HELD)
    (run / "config.json").parent.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"iterations": len(pools),
                                                 "eval_tasks": "held.jsonl"}))
    (run / "eval_base.json").write_text(json.dumps({"trajectories": n, "success_rate": 0.0}))
    (run / "eval_init.json").write_text(json.dumps({"trajectories": n,
                                                    "success_rate": init / n}))
    for it, pool in enumerate(pools):
        d = run / f"iter_{it:03d}"
        _write(d / "rollout_tasks.jsonl", [_task(t, root=r, accepted=a) for t, r, a, _ in pool])
        _write(d / "trajectories.jsonl", [_traj(t, it, k, bool(w)) for t, _, _, ws in pool
                                          for k, w in enumerate(ws)])
        for fname, rows in (iter_files or {}).get(it, {}).items():
            _write(d / fname, rows)
    (d / "eval.json").write_text(json.dumps({
        "trajectories": n, "success_rate": sum(final) / n,
        "per_task": [{"task_id": t, "n": 4, "successes": k} for t, k in zip(HELD, final)]}))
    rows = list(metrics) or [{"seconds": {"rollout": 100.0, "train_policy": 50.0}}] * len(pools)
    _write(run / "metrics.jsonl", rows)
    return run


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "RESULTS", tmp_path / "results")
    _write(tmp_path / "held.jsonl", [_task(t, kind) for t, kind in HELD.items()])
    return tmp_path / "runs" / "protocol-mid"


def test_primary_outcomes_are_paired_by_seed_and_null_without_a_seed(runs):
    _run(runs, "policy-only-warm-s0", [2, 1, 1])
    _run(runs, "policy-only-warm-s1", [3, 2, 1])
    _run(runs, "adapt-learn-s0", [4, 3, 2])
    _run(runs, "policy-only-gigpo-s0", [2, 2, 1])
    _run(runs, "policy-only-gigpo-s1", [3, 3, 2])
    (runs / "adapt-learn-s1" / "iter_000").mkdir(parents=True)  # running: not evaluated yet
    s = protocol.summary(runs, {})
    adapt = s["adapt_minus_policy_only"]
    assert adapt["arm"] == "+adapt [learn]" and adapt["against"] == "policy-only [warm]"
    assert adapt["seeds"] == [0] and adapt["unpaired"] == [1]  # s1 waits for +adapt's s1
    assert adapt["value"] == pytest.approx((9 - 4) / 12, abs=1e-4)
    assert adapt["ci95"] == gain_interval(9, 12, 4, 12)
    assert adapt["per_seed"] == [{"seed": 0, "arm": {"successes": 9, "episodes": 12,
                                                     "success": 0.75},
                                  "against": {"successes": 4, "episodes": 12,
                                              "success": 4 / 12},
                                  "diff": round(0.75 - 4 / 12, 4)}]
    assert adapt["target_met"] is (adapt["ci95"][0] > 0)
    gigpo = s["gigpo_minus_policy_only"]
    assert gigpo["seeds"] == [0, 1] and gigpo["value"] == pytest.approx((13 - 10) / 24, abs=1e-4)
    assert gigpo["ci95"] == gain_interval(13, 24, 10, 24) and gigpo["target_met"] is False
    assert s["labels_minus_policy_only"] is None and s["judge_minus_gigpo"] is None
    assert s["rows"]["labels"] is None and s["seeds"]["policy-only [gigpo]"] == [0, 1]


def test_the_judge_is_held_against_gigpo_under_the_row_named_for_it(runs):
    _run(runs, "policy-only-gigpo-s0", [2, 2, 1])
    _run(runs, "rm-warm-s0", [1, 1, 1])
    _run(runs, "rm-judge-s0", [4, 4, 4])
    s = protocol.summary(runs, {})
    assert s["rows"]["judge"] == "+rm [judge]"  # the first of ROWS' names found
    assert s["judge_minus_gigpo"]["value"] == pytest.approx(7 / 12, abs=1e-4)
    s = protocol.summary(runs, {"judge": "+rm [warm]"})
    assert s["judge_minus_gigpo"]["value"] == pytest.approx(-2 / 12, abs=1e-4)
    assert "target_met" not in s["judge_minus_gigpo"]  # the protocol sets it no target


def test_seconds_per_iteration_leave_out_the_evaluation_and_name_the_cpu(runs, tmp_path):
    rows = [{"seconds": {"rollout": 100.0, "score": 10.0, "train_policy": 50.0}},
            {"seconds": {"rollout": 120.0, "score": 10.0, "train_policy": 70.0,
                         "eval": 900.0}}]
    run = _run(runs, "policy-only-warm-s0", [2, 1, 1], metrics=rows)
    os.utime(run / "config.json", (0, 0))  # made before this boot: learning.py's record says
    cpu = {"cpu_model": "AMD EPYC 9R14", "profile": {"cpu_capability": "AVX512",
                                                     "cpu_bf16": True, "dtype": "bfloat16"}}
    _write(tmp_path / "results" / "protocol-mid.json", [])
    (tmp_path / "results" / "protocol-mid.json").write_text(json.dumps(
        {"runs": {"policy-only [warm]": [{"run": str(run), "machine": cpu}]}}))
    v = protocol.summary(runs, {})["seconds_per_iteration"]["policy-only [warm]"]
    assert v["seconds_per_iteration"] == 180.0 and v["per_seed"] == [180]
    assert v["cpu"] == [{"cpu": "AVX-512+bf16", "precision": "bfloat16", "seeds": [0]}]
    assert v["cpu_models"] == ["AMD EPYC 9R14"]


def test_secondary_figures_of_the_environment_loop_and_gigpo(runs):
    adapt_pools = [
        [("t1", None, None, [0, 0, 1, 0]), ("t2", None, None, [1, 1]),
         ("t1.v1.i0", "t1", None, [1, 1, 0])],  # a candidate's trial: neither side
        [("t1", None, None, [0, 1]), ("t1.v1.i0", "t1", 0, [1, 1, 1, 0]),
         ("t2", None, None, [1, 0])]]
    cand = {"task_id": "t1.v1.i0", "spec": {"goal": {"kind": "pick_and_place"}},
            "candidate": {"edit": "start holding apple 1 at table 1",
                          "edit_kind": "start holding", "menu_position": 3}}
    files = {0: {"candidates.jsonl": [cand], "decisions.jsonl": [
        {"kind": "decision", "task_id": "t1.v1.i0", "parent_id": "t1", "accepted": True,
         "direction": "easier", "acc": 0.667, "parent_acc": 0.25, "n": 3}]}}
    loop = [{"seconds": {}, "env_loop": {"choice_by_kind": {"start holding": 1, "open": 2},
                                         "choice_by_position": {"3": 1, "10": 1, "1": 1}}},
            {"seconds": {}, "env_loop": {"choice_by_kind": {"open": 1},
                                         "choice_by_position": {"2": 1}}}]
    _run(runs, "adapt-learn-s0", [3, 2, 4], pools=adapt_pools, iter_files=files, metrics=loop)
    gig = [{"seconds": {}, "anchor_shared_share": 0.9, "anchor_group_mean": 4.0},
           {"seconds": {}, "anchor_shared_share": 0.7, "anchor_group_mean": 3.0}]
    _run(runs, "policy-only-gigpo-s0", [2, 2, 1], init=6, metrics=gig)
    _run(runs, "policy-only-gigpo-s1", [2, 2, 1], init=7, metrics=gig)
    _run(runs, "policy-only-warm-s1", [2, 2, 1], init=8)
    s = protocol.summary(runs, {})
    a = s["secondary"]["+adapt [learn]"]
    assert {k: (v["successes"], v["episodes"]) for k, v in a["heldout_by_kind"].items()} == \
        {"pick": (4, 4), "pick_and_place": (5, 8)}
    assert a["accepted_by_edit_kind"] == {"start holding": 1}  # the kind it records
    assert a["accepted_by_goal_kind"] == {"pick_and_place": 1}
    # originals: t1 and t2 in both iterations (the candidate and the rewrite are not)
    run = s["runs"]["+adapt [learn]"][0]["figures"]
    assert [(x["episodes"], x["succeeded"]) for x in run["originals"]] == [(6, 3), (4, 2)]
    assert (a["originals"]["successes"], a["originals"]["episodes"]) == (5, 10)
    assert [(x["successes"], x["episodes"]) for x in a["originals_per_iteration"]] == \
        [(3, 6), (2, 4)]
    # the accepted rewrite (iteration 1) against its root t1 in the same rollouts
    assert [(x["rewrite_episodes"], x["rewrite_successes"], x["root_episodes"],
             x["root_successes"]) for x in run["rewrites_vs_roots"]] == [(0, 0, 0, 0),
                                                                         (4, 3, 2, 1)]
    assert a["rewrites_minus_roots"] == pytest.approx(0.75 - 0.5)
    assert run["at_acceptance"] == {"accepted": 1, "acc_mean": 0.667, "parent_acc_mean": 0.25}
    assert a["choice_by_kind"] == {"open": 3, "start holding": 1}
    assert list(a["choice_by_position"]) == ["1", "2", "3", "10"]  # menu order, not text
    g = s["secondary"]["policy-only [gigpo]"]
    assert g["anchor_shared_share"] == pytest.approx(0.8) and g["anchor_group_mean"] == 3.5
    assert a["anchor_shared_share"] is None and g["accepted_by_edit_kind"] == {}
    # the warm start per seed, shared by its arms or not
    assert s["init"]["0"] == {**protocol.rate(6, 12), "shared": False,  # its first row's
                              "by_arm": {"policy-only [gigpo]": [6, 12],
                                         "+adapt [learn]": [5, 12]}}
    assert s["init"]["1"] == {**protocol.rate(7, 12), "shared": False,
                              "by_arm": {"policy-only [gigpo]": [7, 12],
                                         "policy-only [warm]": [8, 12]}}
    assert s["warm_start"]["+adapt [learn]"]["success"] == pytest.approx(5 / 12)


def _cli(runs: Path, results: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLANY_RESEARCH_DIR": str(results),
           "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "research" / "protocol.py"),
                           "--runs-dir", str(runs), *args], env=env, capture_output=True,
                          text=True, cwd=runs.parents[1])


def test_the_command_writes_the_summary_and_keeps_runs_whose_directories_are_gone(runs,
                                                                                  tmp_path):
    import shutil

    results = tmp_path / "results"
    _run(runs, "policy-only-warm-s0", [2, 1, 1])
    _run(runs, "adapt-learn-s0", [4, 3, 2])
    done = _cli(runs, results)
    assert done.returncode == 0, done.stderr
    first = json.loads((results / "protocol-mid-summary.json").read_text())
    assert first["adapt_minus_policy_only"]["seeds"] == [0]
    assert "| adapt_minus_policy_only | +adapt [learn] - policy-only [warm] | 0 |" in \
        (results / "protocol-mid-summary.md").read_text()
    shutil.rmtree(runs / "adapt-learn-s0")  # no run state is kept past its session
    _run(runs, "policy-only-warm-s1", [3, 2, 1])
    done = _cli(runs, results)
    assert done.returncode == 0, done.stderr
    again = json.loads((results / "protocol-mid-summary.json").read_text())
    assert again["adapt_minus_policy_only"] == first["adapt_minus_policy_only"] | {
        "unpaired": [1]}
    assert again["recorded_runs"] == [str(runs / "adapt-learn-s0")]
    assert again["secondary"]["+adapt [learn]"] == first["secondary"]["+adapt [learn]"]


def test_bad_flags_exit_2_and_no_runs_exit_1_writing_nothing(runs, tmp_path):
    results = tmp_path / "results"
    runs.mkdir(parents=True)
    bad = _cli(runs, results, "--arm", "labels")
    assert bad.returncode == 2 and "--arm 'labels': ARM=ROW" in bad.stderr
    none = _cli(runs, results)
    assert none.returncode == 1 and "no evaluated runs" in none.stderr
    assert "Traceback" not in none.stderr and not results.exists()

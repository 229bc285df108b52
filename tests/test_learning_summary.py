"""The learning benchmark's comparisons: each arm against the policy-only run that started
where it did (research/learning_summary.py), so a warm-started arm is never credited
with its warm start."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research"))

from learning_summary import baseline, cost_ratios, headline, versus  # noqa: E402


def _run(final: int, warm: bool) -> dict:
    out = {"final": {"successes": final, "episodes": 128, "success": final / 128}}
    if warm:
        out["init"] = {"successes": 60, "episodes": 128, "success": 60 / 128}
    return out


def test_each_arm_is_compared_with_the_policy_only_run_that_started_where_it_did():
    by_arm = {"policy-only": [_run(40, False)], "policy-only [warm]": [_run(50, True)],
              "+step [warm-label]": [_run(56, True)], "full": [_run(30, False)]}
    diffs = headline(by_arm)["final_minus_policy_only"]
    assert diffs["+step [warm-label]"]["against"] == "policy-only [warm]"
    assert abs(diffs["+step [warm-label]"]["value"] - 6 / 128) < 1e-4
    assert diffs["full"]["against"] == "policy-only"
    assert abs(diffs["full"]["value"] + 10 / 128) < 1e-4
    assert diffs["policy-only [warm]"]["against"] == "policy-only"  # warm start + RL vs RL
    assert "policy-only" not in diffs
    # without a warm policy-only row a warm arm falls back to policy-only; alone: nothing
    assert baseline("+step [warm-label]", True, {"policy-only"}) == "policy-only"
    assert baseline("policy-only", False, {"policy-only"}) is None


def test_cost_ratios_use_the_same_baseline():
    arms = {"policy-only": {"iteration_seconds": 200.0},
            "policy-only [warm]": {"iteration_seconds": 100.0, "warm_start": {"success": 0.5}},
            "+step [warm-label]": {"iteration_seconds": 150.0, "warm_start": {"success": 0.5}},
            "+rm": {"iteration_seconds": 300.0}}
    costs = cost_ratios(arms)
    assert costs["+step [warm-label]"] == 1.5 and costs["+rm"] == 1.5
    assert costs["policy-only [warm]"] == 0.5 and "policy-only" not in costs


def test_the_headline_names_the_warm_started_full_loop_when_it_is_the_only_one():
    by_arm = {"policy-only [warm]": [_run(50, True)], "full [warm]": [_run(58, True)]}
    head = headline(by_arm)["full_minus_policy_only"]
    assert head["arm"] == "full [warm]" and head["against"] == "policy-only [warm]"
    assert abs(head["value"] - 8 / 128) < 1e-4
    assert headline({"policy-only": [_run(40, False)]})["full_minus_policy_only"] is None


def test_every_stage_the_loop_times_has_its_mean(tmp_path):
    import json

    from learning_summary import STAGE_ORDER

    from rlany.loop.metrics import collect_metrics
    for i, name in enumerate(("trajectories", "judgments", "scored", "next_tasks", "eval")):
        (tmp_path / f"{name}.meta.json").write_text(json.dumps({"wall_time_s": 10.0 + i}))
    for i, kind in enumerate(("policy", "rm")):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "rlany.json").write_text(json.dumps({"metrics": {"seconds": 20.0 + i}}))
    seconds = collect_metrics(tmp_path)["seconds"]
    assert set(seconds) == set(STAGE_ORDER) | {"eval"}  # each stage's mean finds its key


def test_runs_the_results_recorded_stay_when_their_directories_are_not_here():
    from learning_summary import with_recorded

    def rec(run, seed):
        return {"run": run, "seed": seed, **_run(50, True)}
    recorded = {"policy-only [warm]": [rec("runs/b/policy-only-warm-s0", 0),
                                       rec("runs/b/policy-only-warm-s1", 1)],
                "full [warm]": [rec("runs/b/full-warm-s0", 0)],
                "full": [rec("runs/other/full-s0", 0)],  # another runs directory: not ours
                "+rm": [{**rec("runs/b/rm-s0", 0), "machine": None}]}  # its host unknown
    here = {"full [warm]": [{**rec("runs/b/full-warm-s0", 0), "final": {"success": 0.1}}],
            "+step [warm-label]": [rec("runs/b/step-warm-label-s2", 2)]}
    by_arm, kept = with_recorded(here, recorded, Path("runs/b"), {"cpus": 2})
    assert list(by_arm) == ["policy-only [warm]", "+step [warm-label]", "+rm", "full [warm]"]
    assert kept == ["runs/b/policy-only-warm-s0", "runs/b/policy-only-warm-s1", "runs/b/rm-s0"]
    assert by_arm["+rm"][0]["machine"] is None  # not given the file's host
    assert [r["seed"] for r in by_arm["policy-only [warm]"]] == [0, 1]
    assert by_arm["policy-only [warm]"][0]["machine"] == {"cpus": 2}
    assert by_arm["full [warm]"][0]["final"] == {"success": 0.1}  # the directory here wins
    assert "machine" not in by_arm["full [warm]"][0]
    assert with_recorded(here, None, Path("runs/b")) == (here, [])


def test_seconds_compare_only_between_arms_that_ran_on_the_same_hosts():
    arms = {"policy-only": {"iteration_seconds": 200.0, "hosts": [""]},
            "+rm": {"iteration_seconds": 300.0, "hosts": [""]},
            "full": {"iteration_seconds": 300.0, "hosts": ["boot-b"]}}
    assert cost_ratios(arms) == {"+rm": 1.5}  # full ran elsewhere: its seconds say nothing
    from learning_summary import arm_summary

    def run(boot):
        return {**_run(50, False), "base": {"successes": 0, "episodes": 128, "success": 0.0,
                                            "judge_step_accuracy": None},
                "accepted_tasks": [], "judge_on_rollouts": [], "seconds": 60.0,
                "stage_seconds": [], "machine": {"boot_id": boot} if boot else None}
    run_final = {"iteration": 2}
    runs = [run("a"), run(None)]
    for r in runs:
        r["final"] = {**r["final"], **run_final, "judge_step_accuracy": None}
    assert arm_summary(runs)["hosts"] == ["", "a"]
    # each seed's own seconds too (a paused run's iterations would otherwise hide in the mean)
    runs[0]["stage_seconds"] = [{"rollout": 100.0, "eval": 50.0}, {"rollout": 200.0}]
    runs[1]["stage_seconds"] = [{"rollout": 250.0, "train_policy": 50.0}]
    summary = arm_summary(runs)
    assert summary["iteration_seconds"] == 200.0
    assert summary["iteration_seconds_per_seed"] == [150, 300]


def _judged(final: int, gain: float) -> dict:
    run = _run(final, True)
    run["judge_heldout"] = {"final": "iter_002", "judges": {
        "base": {"bal_acc": 0.5}, "iter_002": {"bal_acc": 0.5 + gain, "gain": gain,
                                                "gain_ci95": [gain - 0.05, gain + 0.05]}}}
    return run


def test_judge_gain_comes_from_the_label_free_rm_arm_untagged_else_warm_started():
    warm = {"policy-only [warm]": [_run(50, True)],
            "+rm [warm]": [_judged(50, 0.10), _judged(52, 0.20)],
            "full [warm-judge-warm]": [_judged(50, 0.30)]}  # supervised judge: not counted
    gain = headline(warm)["judge_gain"]
    assert gain["arm"] == "+rm [warm]" and gain["seeds"] == 2
    assert abs(gain["value"] - 0.15) < 1e-9 and gain["ci95"][0] < 0.15 < gain["ci95"][1]
    one = headline({**warm, "+rm": [_judged(40, 0.05)]})["judge_gain"]
    assert one["arm"] == "+rm" and one["ci95"] == [0.0, 0.1]  # one seed: its bootstrap
    assert headline({"full [warm-judge-warm]": [_judged(50, 0.3)]})["judge_gain"] is None


def test_each_row_names_its_seeds_and_the_cpu_each_run_recorded():
    from learning_summary import runs_on

    def on(cap, flags, bf16):
        return {"profile": {"cpu_capability": cap, "cpu_flags": flags, "cpu_bf16": bf16,
                            "dtype": "bfloat16" if bf16 else "float32"}}
    runs = [{"seed": 0, "machine": on("AVX2", ["avx2"], False)},
            {"seed": 1, "machine": on("AVX512", ["avx2", "avx512_bf16", "avx512f"], True)},
            {"seed": 2, "machine": on("AVX2", ["avx2", "avx512f"], False)},
            {"seed": 3, "machine": None},
            {"seed": 4, "machine": on("AVX2", ["avx2"], False)},
            {"seed": 5, "machine": on("AVX2", ["avx2"], False),  # its config sets the dtype
             "config": {"run": {"dtype": "bfloat16"}}}]
    assert runs_on(runs) == [
        {"cpu": "AVX2", "precision": "float32", "seeds": [0, 4]},
        {"cpu": "AVX-512+bf16", "precision": "bfloat16", "seeds": [1]},
        {"cpu": "AVX2 forced", "precision": "float32", "seeds": [2]},
        {"cpu": "unknown", "precision": "unknown", "seeds": [3]},
        {"cpu": "AVX2", "precision": "bfloat16", "seeds": [5]}]


def test_arms_are_compared_on_the_seeds_both_ran():
    """+adapt's seed 1 finished before policy-only's: the comparison waits for it rather
    than pooling two seeds against one."""
    def seeded(final: int, seed: int) -> dict:
        return {**_run(final, False), "seed": seed}

    by_arm = {"policy-only": [seeded(2, 0)], "+adapt": [seeded(3, 0), seeded(1, 1)],
              "full": [seeded(9, 2)]}
    head = headline(by_arm)
    assert head["adapt_minus_policy_only"]["seeds"] == [0]
    assert abs(head["adapt_minus_policy_only"]["value"] - 1 / 128) < 1e-4
    assert "full" not in head["final_minus_policy_only"] and head["full_minus_adapt"] is None
    assert "against policy-only (seeds 0: the seeds both ran)" in versus(head, None)

"""The judge's unit-test-writer mode (coding): parsing, sandboxed verdicts, test rewards."""

from __future__ import annotations

import pytest

from conftest import read_jsonl
from rlany.engines.fake import FakeEngine
from rlany.envs.coding import CodingEnv, make_tasks
from rlany.prompts import parse_unit_test
from rlany.stages.judge import JudgeOptions, judge
from rlany.stages.rollout import RolloutOptions, rollout
from rlany.stages.score import ScoreOptions, score_stream
from rlany.stages.unit_tests import unit_test_counts
from rlany.training.samples import rm_samples


def fence(text: str) -> str:
    return f"```\n{text}\n```"


MULTI = "3\n1 5 2"


@pytest.mark.parametrize("text, want", [
    (f"INPUT:\n{fence('1 2')}\nOUTPUT:\n{fence('3')}", {"input": "1 2", "output": "3"}),
    (f"**Input:**\n```text\n5\n```\n**Output:**\n{fence('120')}", {"input": "5", "output": "120"}),
    (f"### Input\n{fence('a b')}\n### Output\n{fence('2')}", {"input": "a b", "output": "2"}),
    # the last complete pair wins; multi-line input keeps its lines
    (f"INPUT:\n{fence('1')}\nOUTPUT:\n{fence('1')}\nbetter:\nINPUT:\n{fence(MULTI)}\n"
     f"OUTPUT:\n{fence('5')}", {"input": MULTI, "output": "5"}),
    ("input: ```\n7\n```\noutput: ```\n7\n```", {"input": "7", "output": "7"}),
    (f"INPUT:\n{fence('1 2')}", None),                       # no expected output
    (f"OUTPUT:\n{fence('3')}\nINPUT:\n{fence('1 2')}", None),  # wrong order
    (f"INPUT:\n{fence('1 2')}\nOUTPUT:\n{fence('')}", None),   # empty expected output
    ("The answer is 3.", None),
    ("", None),
    (f"INPUT:\n{fence('x' * 20_000)}\nOUTPUT:\n{fence('1')}", None),  # oversized
])
def test_parse_unit_test(text, want):
    assert parse_unit_test(text) == want


RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\na, b = map(int, input().split())\nprint(a + b if b >= 0 else a - b)\n```"
TESTS = [
    f"Negative numbers catch sloppy code.\nINPUT:\n{fence('4 -1')}\nOUTPUT:\n{fence('3')}",
    f"INPUT:\n{fence('1 1')}\nOUTPUT:\n{fence('2')}",      # right, but every program passes
    f"INPUT:\n{fence('2 2')}\nOUTPUT:\n{fence('5')}",      # a wrong test
    "I cannot write a test.",                               # unparseable
]


@pytest.fixture
def sum_task():
    (task,) = [t for t in make_tasks(12, seed=0) if "their sum" in t.spec["question"]]
    return task


def roll_and_judge(task, responses, tests, tmp_path=None):
    policy = FakeEngine(lambda req, k: responses[k])
    groups = list(rollout([task], policy, lambda name: CodingEnv(),
                          RolloutOptions(n=len(responses), max_steps=1)))
    trajs = groups[0]
    rm = FakeEngine(lambda req, k: tests[k])
    judged = [j for g in judge(trajs, rm, JudgeOptions(m=len(tests), mode="unit-tests"))
              for j in g]
    return trajs, judged, rm


def test_programs_run_on_the_written_tests(sum_task):
    trajs, judged, rm = roll_and_judge(sum_task, [RIGHT, WRONG, RIGHT, WRONG], TESTS)
    assert [t.outcome for t in trajs] == [1, -1, 1, -1]
    # one request per task with m samples, sharing the prompt; it shows the problem
    assert len(rm.calls) == 1 and len(rm.calls[0]) == 1 and rm.calls[0][0].sampling.n == 4
    assert sum_task.spec["question"] in rm.calls[0][0].messages[-1]["content"]
    assert all(j.mode == "unit-tests" and len(j.steps) == 1 for j in judged)
    scores = [[s.score for s in j.steps[0].samples] for j in judged]
    assert scores == [[1, 1, -1, 0], [-1, 1, -1, 0], [1, 1, -1, 0], [-1, 1, -1, 0]]
    assert judged[0].steps[0].samples[0].test == {"input": "4 -1", "output": "3"}
    assert judged[0].steps[0].samples[3].test is None
    counts = unit_test_counts(judged, {t.traj_id: t.outcome for t in trajs})
    assert counts == {"tests": 4, "tests_parsed": 3, "tests_checkable": 3, "tests_valid": 2,
                      "tests_discriminating": 1}


def test_an_errored_episode_is_not_judged_nor_rerun(sum_task, monkeypatch):
    """An episode whose env failed (here: the sandbox did not start at its step) has no
    program's verdict: its judgment is skipped, its program not run again, and it counts in
    no test's validity."""
    from dataclasses import replace

    from rlany.stages import unit_tests

    trajs, _, _ = roll_and_judge(sum_task, [RIGHT, WRONG, RIGHT], TESTS)
    trajs[2] = replace(trajs[2], finish="error")
    ran = []
    real = unit_tests._run_program
    monkeypatch.setattr(unit_tests, "_run_program", lambda code, tests, cpu_s: (
        ran.append(code), real(code, tests, cpu_s))[1])
    rm = FakeEngine(lambda req, k: TESTS[k])
    judged = [j for g in judge(trajs, rm, JudgeOptions(m=len(TESTS), mode="unit-tests"))
              for j in g]
    assert len(ran) == 2 and [bool(j.steps) for j in judged] == [True, True, False]
    assert judged[2].skipped.startswith("episode errored")
    counts = unit_test_counts(judged, {t.traj_id: t.outcome for t in trajs})
    assert counts["tests_valid"] == 2 and counts["tests_discriminating"] == 1


def test_a_jail_that_does_not_start_skips_that_program_only(sum_task, monkeypatch):
    """The judge runs each program in its own jail: one that did not start (bwrap's setup
    failed, a hang before the program ran) is that judgment's `skipped`, not the stage's
    failure, and the other programs' verdicts stand."""
    from rlany import sandbox
    from rlany.envs.coding import extract_code

    trajs, want, _ = roll_and_judge(sum_task, [RIGHT, WRONG, RIGHT], TESTS)
    real = sandbox.run_tests

    def flaky(code, inputs, limits):
        if code == extract_code(WRONG):
            raise sandbox.SandboxFailed("the jail did not start: exit 1: bwrap: setting up")
        return real(code, inputs, limits)
    monkeypatch.setattr(sandbox, "run_tests", flaky)
    rm = FakeEngine(lambda req, k: TESTS[k])
    judged = [j for g in judge(trajs, rm, JudgeOptions(m=len(TESTS), mode="unit-tests"))
              for j in g]
    assert [bool(j.steps) for j in judged] == [True, False, True]
    assert judged[1].skipped.startswith("the sandbox failed, no verdict: the jail did not")
    assert [j.steps for j in judged[::2]] == [j.steps for j in want[::2]]


def test_test_rewards_measure_separation(sum_task):
    trajs, judged, _ = roll_and_judge(sum_task, [RIGHT, WRONG, RIGHT, WRONG], TESTS)
    ((scored, stats),) = list(score_stream(((f"t:{k}", t) for k, t in enumerate(trajs)),
                                           ((f"j:{k}", j) for k, j in enumerate(judged)),
                                           ScoreOptions()))
    tests = [s.steps[0].judge for s in scored]
    # separation: right programs' pass rate minus wrong programs' pass rate; penalty -2
    assert [x.reward for x in tests[0]] == [1.0, 0.0, 0.0, -2.0]
    assert all([x.reward for x in t] == [1.0, 0.0, 0.0, -2.0] for t in tests)
    assert tests[0][0].advantage > 0 > tests[0][3].advantage
    # each test is trained once: from the task's first trajectory only
    assert [x.keep for x in tests[0]] == [True, True, True, True]
    assert not any(x.keep for t in tests[1:] for x in t)
    assert stats.rm_samples == 4
    samples = list(rm_samples(scored))
    assert len(samples) == 4 and samples[0][1] == TESTS[0]
    # the policy: R = O + mean_j S_ij (the unparseable test abstains as 0)
    assert scored[0].steps[0].reward == pytest.approx(1 + (1 + 1 - 1 + 0) / 4)
    assert scored[1].steps[0].reward == pytest.approx(-1 + (-1 + 1 - 1 + 0) / 4)


def test_uniform_outcomes_give_no_test_training(sum_task):
    trajs, judged, _ = roll_and_judge(sum_task, [RIGHT, RIGHT], TESTS)
    ((scored, stats),) = list(score_stream(((f"t:{k}", t) for k, t in enumerate(trajs)),
                                           ((f"j:{k}", j) for k, j in enumerate(judged)),
                                           ScoreOptions()))
    assert stats.acc == 1.0 and not stats.rm_keep and stats.rm_samples == 0


def test_multi_turn_trajectories_are_refused(sum_task):
    from conftest import make_traj
    from rlany.errors import RlanyError

    traj = make_traj("t", 0, 1, n_steps=2)
    with pytest.raises(RlanyError, match="single-turn"):
        list(judge([traj], FakeEngine(lambda r, k: ""), JudgeOptions(mode="unit-tests")))


def test_cli_unit_test_pipeline(tmp_path, cli, sum_task):
    import json

    from conftest import write_jsonl

    other = next(t for t in make_tasks(12, seed=0) if t.task_id != sum_task.task_id)
    write_jsonl(tmp_path / "tasks.jsonl", [sum_task, other])
    policy = tmp_path / "policy.json"
    # a right program for the sum problem, and one program that is always wrong
    policy.write_text(json.dumps({"rules": [
        {"match": "their sum", "responses": [RIGHT, WRONG]},
        {"responses": ["```python\nprint(0)\n```"]}]}))
    rm = tmp_path / "rm.json"
    rm.write_text(json.dumps({"rules": [{"match": "their sum", "responses": TESTS},
                                        {"responses": [TESTS[3]]}]}))
    r = cli("rollout", "-i", str(tmp_path / "tasks.jsonl"), "-o", str(tmp_path / "traj.jsonl"),
            "--engine", "fake", "--model", str(policy), "--n", "4")
    assert r.returncode == 0, r.stderr
    r = cli("judge", "-i", str(tmp_path / "traj.jsonl"), "-o", str(tmp_path / "judg.jsonl"),
            "--engine", "fake", "--model", str(rm), "--m", "4", "--mode", "unit-tests")
    assert r.returncode == 0, r.stderr
    assert "unit tests:" in r.stderr and "passed by every correct program" in r.stderr
    r = cli("score", "-i", str(tmp_path / "traj.jsonl"), "-j", str(tmp_path / "judg.jsonl"),
            "-o", str(tmp_path / "scored.jsonl"))
    assert r.returncode == 0, r.stderr
    stats = {s["task_id"]: s for s in read_jsonl(tmp_path / "task_stats.jsonl")}
    (sum_id,) = [k for k, s in stats.items() if 0 < s["acc"] < 1]
    assert stats[sum_id]["rm_samples"] > 0
    assert all(s["rm_samples"] == 0 for k, s in stats.items() if k != sum_id)
    bad = cli("judge", "-i", str(tmp_path / "traj.jsonl"), "-o", str(tmp_path / "x.jsonl"),
              "--engine", "fake", "--model", str(rm), "--mode", "tests")
    assert bad.returncode != 0 and not (tmp_path / "x.jsonl").exists()

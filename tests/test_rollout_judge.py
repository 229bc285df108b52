"""rollout and judge with the fake engine: grouping, ids, batching, prompt sharing."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from conftest import make_traj, one_line, read_jsonl, write_jsonl
from rlany import envs
from rlany.engines.base import Sampling
from rlany.engines.fake import FakeEngine
from rlany.envs import StepResult
from rlany.envs.reasoning import extract_answer, make_tasks
from rlany.files.records import Task
from rlany.prompts import parse_verdict
from rlany.stages.judge import JudgeOptions, judge
from rlany.stages.rollout import RolloutOptions, rollout


class ThreeTurns:
    """Test env: three turns; success when every response says 'go'."""

    name = "three"

    def reset(self, task):
        self.turn, self.ok = 0, True
        return "turn 0"

    def step(self, response):
        self.turn += 1
        self.ok &= "go" in response
        done = self.turn == 3
        return StepResult(obs=f"turn {self.turn}", done=done, success=done and self.ok,
                          action=response.strip())

    def describe(self, task):
        return "say go three times"

    def validate(self, spec):
        return []


def three_tasks(k):
    return [Task(task_id=f"t{i}", env="three", spec={}, prompt="Say go.") for i in range(k)]


def test_three_turn_episodes_make_three_batched_calls():
    eng = FakeEngine.from_rules([{"responses": ["go", "go", "stop"]}])
    opts = RolloutOptions(n=4, max_steps=5, batch_tasks=8)
    groups = list(rollout(three_tasks(2), eng, lambda name: ThreeTurns(), opts))
    assert len(eng.calls) == 3                       # one batched call per turn, not 3 x n
    first = eng.calls[0]
    assert len(first) == 2 and all(r.sampling.n == 4 for r in first)   # n samples share a prompt
    assert sum(r.sampling.n for r in eng.calls[1]) == 8                 # all live episodes
    assert [len(g) for g in groups] == [4, 4]
    t = groups[0][0]
    assert t.traj_id == "t0/0/0" and [x.sample for x in groups[0]] == [0, 1, 2, 3]
    assert len(t.steps) == 3 and t.finish in ("success", "failure")
    # the exact messages the policy saw: the task, then alternating assistant/user turns
    assert [m["role"] for m in t.steps[2].prompt_messages] == ["user", "assistant", "user",
                                                               "assistant", "user"]
    assert t.steps[1].prompt_messages[-1]["content"] == "turn 1"
    assert all(x.outcome == (1 if x.finish == "success" else -1) for g in groups for x in g)


def test_max_steps_and_env_errors_are_recorded_not_fatal():
    class Broken(ThreeTurns):
        def step(self, response):
            raise ValueError("boom")

    eng = FakeEngine.from_rules([{"responses": ["go"]}])
    capped = list(rollout(three_tasks(1), eng, lambda n: ThreeTurns(), RolloutOptions(n=2, max_steps=2)))
    assert all(t.finish == "max_steps" and t.outcome == -1 and len(t.steps) == 2 for t in capped[0])
    broken = list(rollout(three_tasks(1), eng, lambda n: Broken(), RolloutOptions(n=2, max_steps=3)))
    assert all(t.finish == "error" and "boom" in t.steps[0].info["error"] for t in broken[0])


def test_rollout_is_deterministic_with_seeded_fake_engine():
    tasks = make_tasks(6, seed=3)
    eng = FakeEngine.from_rules([{"responses": ["\\boxed{7}", "I think 12", "answer: 9"]}])
    a = list(rollout(tasks, eng, envs.make_env, RolloutOptions(n=3)))
    b = list(rollout(tasks, eng, envs.make_env, RolloutOptions(n=3, batch_tasks=2)))
    assert a == b


def test_judge_last_step_only_judges_the_labelled_step():
    from rlany.stages.eval import judge_metrics

    trajs = [t for g in rollout(three_tasks(2), FakeEngine.from_rules([{"responses": ["go"]}]),
                                lambda name: ThreeTurns(), RolloutOptions(n=2, max_steps=3))
             for t in g]
    eng = FakeEngine(lambda req, k: "\\boxed{+1}")
    judged = [j for g in judge(trajs, eng, JudgeOptions(m=2, last_step_only=True)) for j in g]
    assert len(eng.calls[0]) == len(trajs)        # one request per trajectory (phase 1)
    assert all([s.step for s in j.steps] == [2] for j in judged)
    metrics = judge_metrics(trajs, judged)
    assert metrics["judge_last_step_accuracy"] == 1.0            # all succeed, all +1
    # this env labels no step: there is no step accuracy to report
    assert metrics["judge_labelled_verdicts"] == 0 and metrics["judge_step_accuracy"] is None


def test_sample_tasks_draws_k_of_the_pool_per_iteration_and_keeps_candidates():
    from rlany.envs.household import make_tasks
    from rlany.stages.rollout import sample_tasks

    tasks = make_tasks(10, seed=1)
    tasks[7] = replace(tasks[7], extra={"candidate": {"parent_id": tasks[0].task_id}})
    opts = RolloutOptions(sample_tasks=3, seed=0, iteration=0)
    first = sample_tasks(tasks, opts)
    ids = [t.task_id for t in first]
    assert len(first) == 4 and tasks[7].task_id in ids        # 3 of the pool + the candidate
    assert ids == [t.task_id for t in tasks if t.task_id in ids]  # input order
    assert [t.task_id for t in sample_tasks(tasks, opts)] == ids  # seeded
    others = {tuple(t.task_id for t in sample_tasks(tasks, replace(opts, iteration=i)))
              for i in range(1, 6)}
    assert len(others | {tuple(ids)}) > 1                     # a new draw per iteration
    assert sample_tasks(tasks, RolloutOptions()) == tasks      # default: every task
    # a candidate's parent is not forced into the draw (parents would fill K): it is
    # measured by its own draws, so some iterations leave it out
    from rlany.files.records import Lineage
    for i in (7, 8):
        tasks[i] = replace(tasks[i], extra={"candidate": {}}, lineage=Lineage(
            root_id=tasks[i - 6].task_id, parent_id=tasks[i - 6].task_id, version=1,
            direction="easier"))
    draws = [{t.task_id for t in sample_tasks(tasks, replace(opts, iteration=it))}
             for it in range(12)]
    assert all({tasks[7].task_id, tasks[8].task_id} <= got and len(got) == 5 for got in draws)
    assert any(tasks[1].task_id not in got for got in draws)


def test_sample_tasks_keeps_rewrites_to_the_replay_share():
    """Of the K drawn pool tasks at most floor(replay_share x K) are rewrites (lineage
    version > 0), the rest originals, whatever share of the pool the rewrites are."""
    from rlany.envs.household import make_tasks
    from rlany.files.records import Lineage
    from rlany.stages.rollout import sample_tasks

    tasks = make_tasks(24, seed=1)
    for i in range(0, 24, 2):  # half the pool: rewrites of the other half
        tasks[i + 1] = replace(tasks[i + 1], lineage=Lineage(
            root_id=tasks[i].task_id, parent_id=tasks[i].task_id, version=1,
            direction="easier", accepted_iter=0))
    rewrites = {t.task_id for t in tasks if t.lineage.version}
    for share, k, most in ((0.25, 8, 2), (0.0, 8, 0), (0.5, 8, 4), (1.0, 4, 4)):
        seen = 0
        for it in range(10):
            got = sample_tasks(tasks, RolloutOptions(sample_tasks=k, replay_share=share,
                                                     iteration=it))
            drawn = sum(t.task_id in rewrites for t in got)
            assert len(got) == k and drawn == most, (share, k, drawn)
            seen += drawn
        assert seen == 10 * most
    # a pool of few originals: the draw is smaller, never more rewrites than the share
    few = tasks[:1] + [t for t in tasks if t.task_id in rewrites]
    got = sample_tasks(few, RolloutOptions(sample_tasks=8, replay_share=0.25))
    assert len(got) == 3 and sum(t.task_id in rewrites for t in got) == 2


def test_history_turns_zero_keeps_the_task_and_the_newest_observation():
    from rlany.stages.rollout import _window

    msgs = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "o1"}, {"role": "assistant", "content": "a2"},
            {"role": "user", "content": "o2"}]
    assert [m["content"] for m in _window(msgs, 0)] == ["task", "o2"]
    assert [m["content"] for m in _window(msgs, 1)] == ["task", "a2", "o2"]
    assert _window(msgs, None) == msgs and _window(msgs[:1], 0) == msgs[:1]


def test_judge_step_accuracy_is_balanced_over_env_labels():
    """Household labels each step; a judge that always says +1 scores 0.5 (balanced), one
    that reads the label scores 1.0, one that inverts it 0.0."""
    from rlany.envs.household import expert_actions, make_tasks
    from rlany.stages.eval import judge_metrics

    tasks = make_tasks(4, seed=1)
    plans = {t.task_id: expert_actions(t.spec) for t in tasks}

    def policy(req, k):  # a detour first ("look"), then the expert plan
        done = sum(m["role"] == "assistant" for m in req.messages)
        plan = ["look", *plans[_task_of(req)]]
        return plan[min(done, len(plan) - 1)]

    def _task_of(req):
        text = " ".join(str(m["content"]) for m in req.messages)
        return next(t.task_id for t in tasks if t.prompt[:60] in text)

    trajs = [t for g in rollout(tasks, FakeEngine(policy), envs.make_env,
                                RolloutOptions(n=1, max_steps=12, history_turns=20)) for t in g]
    labels = [s.info.get("label") for t in trajs for s in t.steps]
    assert 1 in labels and -1 in labels and None not in labels
    from rlany.files.records import JudgeSample, Judgment, StepJudgment

    def judged(verdict):
        return [Judgment(traj_id=t.traj_id, task_id=t.task_id, judge={}, steps=[
            StepJudgment(step=k, judge_messages=[], samples=[
                JudgeSample(text="", score=verdict(s.info["label"]))] * 2)
            for k, s in enumerate(t.steps)]) for t in trajs]

    for verdict, want in ((lambda label: 1, 0.5), (lambda label: label, 1.0),
                          (lambda label: -label, 0.0), (lambda label: 0, 0.0)):
        m = judge_metrics(trajs, judged(verdict))
        assert m["judge_step_accuracy"] == pytest.approx(want)
        assert m["judge_good_steps"] + m["judge_bad_steps"] == len(labels)


def test_judge_m_samples_share_one_prompt_and_keep_order():
    tasks = make_tasks(3, seed=0)
    pol = FakeEngine.from_rules([{"responses": ["\\boxed{1}", "\\boxed{12}"]}])
    trajs = [t for g in rollout(tasks, pol, envs.make_env, RolloutOptions(n=2)) for t in g]
    jud = FakeEngine.from_rules([{"responses": ["fine \\boxed{+1}", "bad \\boxed{-1}", "hmm"]}])
    opts = JudgeOptions(m=3, batch_trajectories=100, verdict="free")
    out = [j for g in judge(trajs, jud, opts) for j in g]
    assert len(jud.calls) == 1 and all(r.sampling.n == 3 for r in jud.calls[0])
    assert [j.traj_id for j in out] == [t.traj_id for t in trajs]
    scores = sorted(s.score for s in out[0].steps[0].samples)
    assert scores == [-1, 0, 1]
    # constrained (the default): one batched call per phase, and no unreadable verdict
    jud.calls.clear()
    out = [j for g in judge(trajs, jud, replace(opts, verdict="constrained")) for j in g]
    assert len(jud.calls) == 2
    assert all(s.score != 0 for j in out for st in j.steps for s in st.samples)
    # the judge sees the task, the response and what happened next
    user = out[0].steps[0].judge_messages[-1]["content"]
    assert trajs[0].steps[0].response in user and "What is" in user


@pytest.mark.parametrize("text,expected", [
    ("The step is right. \\boxed{+1}", 1),
    ("\\boxed{1}", 1),
    ("\\boxed{-1}", -1),
    ("\\boxed{ -1 }", -1),
    ("\\boxed{−1}", -1),                      # unicode minus
    ("\\boxed{–1}", -1),                      # en dash
    ("$\\boxed{+1}$", 1),
    ("\\boxed{\\text{-1}}", -1),
    ("\\boxed{1.0}", 1),
    ("first \\boxed{-1} then on reflection \\boxed{+1}", 1),   # the last verdict wins
    ("\\boxed{correct}", 1),
    ("\\boxed{Incorrect}", -1),
    ("\\boxed{2}", 0),
    ("\\boxed{}", 0),
    ("\\boxed{+1 or -1}", 0),
    ("no verdict at all", 0),
    ("", 0),
    ("Verdict: -1", -1),
    ("Score: +1", 1),
    ("verdict is **-1**", -1),
    ("\\boxed{+1", 0),                        # unclosed
    ("I give it 1 out of 10", 0),
    ("\\boxed{{+1}}", 1),
    ("boxed{+1}", 0),                         # no backslash: not a verdict
])
def test_parse_verdict(text, expected):
    assert parse_verdict(text) == expected


@pytest.mark.parametrize("text,answer", [
    ("so \\boxed{12}", "12"), ("The answer is 7.", "7"), ("3 + 4 = 7", "7"), ("nothing", None),
    ("3 + 4 = 7 \\boxed{}", "7"),          # an empty box does not hide the number before it
    ("\\boxed{5} then \\boxed{ }", "5"),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_cli_rollout_judge_score_with_fake_engine(tmp_path, cli):
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(4, seed=1))
    answers = [t.spec["answer"] for t in make_tasks(4, seed=1)]
    pol = tmp_path / "policy.json"
    pol.write_text(json.dumps([f"\\boxed{{{answers[0]}}}", "\\boxed{0}"]))
    jud = tmp_path / "judge.json"
    jud.write_text(json.dumps({"rules": [{"responses": ["ok \\boxed{+1}", "no \\boxed{-1}"]}]}))
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "traj.jsonl"), "--engine", "fake",
            "--model", str(pol), "--n", "4")
    assert r.returncode == 0, r.stderr
    assert "tokens/s" in r.stderr and r.stdout == ""
    trajs = read_jsonl(tmp_path / "traj.jsonl")
    assert len(trajs) == 16 and [t["task_id"] for t in trajs[:4]] == ["arith-1-0000"] * 4
    r = cli("judge", "-i", str(tmp_path / "traj.jsonl"), "-o", str(tmp_path / "j.jsonl"),
            "--engine", "fake", "--model", str(jud), "--m", "3")
    assert r.returncode == 0, r.stderr
    assert "unparseable" in r.stderr
    r = cli("score", "-i", str(tmp_path / "traj.jsonl"), "-j", str(tmp_path / "j.jsonl"),
            "-o", str(tmp_path / "scored.jsonl"))
    assert r.returncode == 0, r.stderr
    assert len(read_jsonl(tmp_path / "task_stats.jsonl")) == 4


def test_cli_rollout_resumes_after_partial_output(tmp_path, cli):
    """Killed after two complete tasks and half of the third (the hook holds it after the
    second group; the torn third is appended): the rerun plays only what is missing. An
    index with no header (from before headers: no record of its flags) is not resumed, nor
    one made with a model since rewritten in place."""
    import subprocess
    import sys
    import time

    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(5, seed=2))
    pol = tmp_path / "policy.json"
    pol.write_text(json.dumps(["\\boxed{3}", "\\boxed{4}"]))
    args = ["--engine", "fake", "--model", str(pol), "--n", "2", "--batch-tasks", "1"]
    full = tmp_path / "full.jsonl"
    assert cli("rollout", "-i", str(tasks), "-o", str(full), *args).returncode == 0
    out, marker = tmp_path / "out.jsonl", tmp_path / "held"
    run = subprocess.Popen([sys.executable, "-m", "rlany", "rollout", "-i", str(tasks), "-o",
                            str(out), *args], stderr=subprocess.DEVNULL,
                           env={**os.environ, "RLANY_TEST_PAUSE": f"group:2:{marker}"})
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.1)
    run.kill()
    run.wait()
    assert marker.exists()
    lines = full.read_text().splitlines(keepends=True)
    partial, index = tmp_path / "out.jsonl.partial", tmp_path / "out.jsonl.partial.idx"
    assert partial.read_text() == "".join(lines[:4])
    with partial.open("a") as f:
        f.write(lines[4][:20])  # half of the third task's first trajectory
    header, *groups = index.read_text().splitlines(keepends=True)
    index.write_text("".join(groups))  # as an index from before headers
    line = one_line(cli("rollout", "-i", str(tasks), "-o", str(out), *args), 1)
    assert "other flags or input is here (no header)" in line and partial.exists()
    index.write_text(header + "".join(groups))
    # the model rewritten in place (same path, other content) is another model: refused,
    # named; the same bytes back resume
    pol.write_text(json.dumps(["\\boxed{5}"]))
    line = one_line(cli("rollout", "-i", str(tasks), "-o", str(out), *args), 1)
    assert "(flags.content.model)" in line and partial.exists()
    pol.write_text(json.dumps(["\\boxed{3}", "\\boxed{4}"]))
    r = cli("rollout", "-i", str(tasks), "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    assert "resuming, 2 of 5" in r.stderr
    assert out.read_bytes() == full.read_bytes()
    assert not partial.exists()


def test_cli_unknown_env_names_the_line(tmp_path, cli):
    tasks = make_tasks(3, seed=0)
    rows = [json.loads(json.dumps(__import__("rlany.files.records", fromlist=["to_json"]).to_json(t)))
            for t in tasks]
    rows[1]["env"] = "nope"
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("rollout", "-i", str(path), "-o", str(tmp_path / "t.jsonl"), "--engine", "fake",
            "--model", "x")
    assert r.returncode == 1 and f"{path}:2: unknown environment 'nope'" in r.stderr
    assert not (tmp_path / "t.jsonl").exists()


def test_fake_engine_sampling_params_pass_through():
    eng = FakeEngine.from_rules([{"responses": ["a STOP b"]}])
    from rlany.engines.base import Request
    res = eng.generate([Request(messages=[{"role": "user", "content": "x"}],
                                sampling=Sampling(n=2, stop=("STOP",)))])
    assert [c.text for c in res[0].completions] == ["a ", "a "]


def test_cli_rollout_and_judge_read_stdin(tmp_path, cli):
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(3, seed=4))
    pol = tmp_path / "p.json"
    pol.write_text(json.dumps(["\\boxed{5}"]))
    r = cli("rollout", "-i", "-", "-o", str(tmp_path / "t.jsonl"), "--engine", "fake",
            "--model", str(pol), "--n", "2", stdin=tasks.read_text())
    assert r.returncode == 0, r.stderr
    assert len(read_jsonl(tmp_path / "t.jsonl")) == 6
    r = cli("judge", "-i", "-", "-o", str(tmp_path / "j.jsonl"), "--engine", "fake", "--model",
            str(pol), stdin=(tmp_path / "t.jsonl").read_text())
    assert r.returncode == 0, r.stderr
    assert len(read_jsonl(tmp_path / "j.jsonl")) == 6


def test_gain_interval_matches_newcombes_examples():
    from rlany.stats import gain_interval

    # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10
    assert gain_interval(56, 70, 48, 80) == pytest.approx([0.0524, 0.3339], abs=1e-4)
    assert gain_interval(9, 10, 3, 10) == pytest.approx([0.1705, 0.8090], abs=1e-4)
    assert gain_interval(1, 2, 0, 0) is None


def test_wilson_interval_matches_known_values():
    from rlany.stats import wilson_interval

    assert wilson_interval(0, 0) is None
    lo, hi = wilson_interval(6, 32)          # the demo's base: 0.188
    assert lo == pytest.approx(0.0889, abs=1e-3) and hi == pytest.approx(0.3532, abs=1e-3)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)


def test_select_used_judges_only_the_tasks_score_can_train_on(tmp_path):
    """--select used: a task whose rollouts all succeed or all fail, or a pending
    candidate, gets unjudged records (no engine call); score gives them no step scores
    and no reward-model samples, and reads the judged tasks as before."""
    from rlany.stages.score import ScoreOptions, score_stream

    tasks = three_tasks(3)
    tasks[1] = replace(tasks[1], prompt="Say go (easy).")
    tasks[2] = replace(tasks[2], extra={"candidate": {"parent_id": "t0"}})
    # t0: mixed outcomes; t1: all succeed; t2: mixed but a candidate
    policy = FakeEngine(lambda req, k: "go" if k == 0 or "easy" in str(req.messages) else "no")
    trajs = [t for g in rollout(tasks, policy, lambda name: ThreeTurns(),
                                RolloutOptions(n=2, max_steps=3)) for t in g]
    by_task = {}
    for t in trajs:
        by_task.setdefault(t.task_id, set()).add(t.outcome)
    assert by_task == {"t0": {1, -1}, "t1": {1}, "t2": {1, -1}}, by_task
    jud = FakeEngine(lambda req, k: "\\boxed{-1}" if k else "\\boxed{+1}")
    out = [j for g in judge(trajs, jud, JudgeOptions(m=2, max_tokens=0, select="used"))
           for j in g]
    asked = [r for call in jud.calls for r in call]
    assert len(jud.calls) == 1 and len(asked) == 2 * 3      # t0's 2 trajectories x 3 steps
    assert all(r.sampling.n == 2 and r.sampling.choices for r in asked)
    skipped = {j.task_id: j.skipped for j in out if j.skipped}
    assert skipped == {"t1": "uniform outcome", "t2": "candidate task, not accepted yet"}
    assert all(not j.steps for j in out if j.skipped)
    scored = {s.task_id: (s, st) for s, st in (
        (g[0], stats) for g, stats in score_stream(
            [(f"t:{k}", t) for k, t in enumerate(trajs)],
            [(f"j:{k}", j) for k, j in enumerate(out)], ScoreOptions()))}
    t0, t0_stats = scored["t0"]
    assert [len(s.judge) for s in t0.steps] == [2, 2, 2]
    assert t0_stats.rm_samples > 0 and t0_stats.judge_outcome_agreement is not None
    t1, t1_stats = scored["t1"]
    assert all(s.step_score == 0.0 and not s.judge for s in t1.steps)
    assert t1_stats.rm_samples == 0 and t1_stats.judge_outcome_agreement is None
    assert not t1_stats.policy_keep                     # no step scores separate them


def test_select_used_reads_a_group_as_score_does_errored_episodes_left_out():
    """An episode the env broke (finish "error") is not the policy's failure: score leaves
    it out of a group's outcomes, so `--select used` does too (7 successes and one env
    error is uniform, not mixed; a group that never ran is not judged)."""
    from rlany.stages.judge import unused

    ok = [make_traj("t", k, 1) for k in range(7)]
    broken = replace(make_traj("t", 7, -1), finish="error")
    assert unused([*ok, broken], "used") == "uniform outcome"
    assert unused([broken, replace(broken, sample=8)], "used") == "no episode ran"
    assert unused([*ok, make_traj("t", 8, -1), broken], "used") is None
    assert unused([*ok, broken], "all") is None


def test_judge_stage_reports_its_accuracy_against_the_env_step_labels(tmp_path):
    """The judge stage's sidecar carries the verdicts' balanced accuracy against household's
    step labels; it equals eval's judge_metrics on the same judgments (a constant judge
    scores 0.5, one that is right on every detour more)."""
    from rlany.envs.household import expert_actions
    from rlany.envs.household import make_tasks as household_tasks
    from rlany.files.records import Judgment, Trajectory, from_json
    from rlany.stages.eval import judge_metrics
    from rlany.stages.judge import run as judge_run

    tasks = household_tasks(3, seed=2)
    plans = {t.prompt[:60]: expert_actions(t.spec) for t in tasks}

    def policy(req, k):  # a detour first ("look"), then the expert plan
        text = " ".join(str(m["content"]) for m in req.messages)
        plan = ["look", *next(p for key, p in plans.items() if key in text)]
        return plan[min(sum(m["role"] == "assistant" for m in req.messages), len(plan) - 1)]

    trajs = [t for g in rollout(tasks, FakeEngine(policy), envs.make_env,
                                RolloutOptions(n=1, max_steps=12, history_turns=20)) for t in g]
    labels = [s.info.get("label") for t in trajs for s in t.steps]
    assert 1 in labels and -1 in labels
    traj_file = write_jsonl(tmp_path / "traj.jsonl", trajs)

    def reads_the_step(req, k):
        text = "\n".join(str(m["content"]) for m in req.messages)
        return "\\boxed{-1}" if "at this step\nlook\n" in text else "\\boxed{+1}"

    for name, verdict, want in (("reads", reads_the_step, None),
                                ("yes", lambda req, k: "\\boxed{+1}", 0.5),
                                ("no", lambda req, k: "\\boxed{-1}", 0.5)):
        out = tmp_path / f"{name}.jsonl"
        counts = judge_run(JudgeOptions(input=str(traj_file), output=str(out), m=2,
                                        history_steps=0), engine=FakeEngine(verdict))
        meta = json.loads((tmp_path / f"{name}.meta.json").read_text())["counts"]
        judged = [from_json(Judgment, d) for d in read_jsonl(out)]
        same = judge_metrics([from_json(Trajectory, d) for d in read_jsonl(traj_file)], judged)
        assert meta["label_accuracy"] == counts["label_accuracy"]
        assert meta["label_accuracy"] == pytest.approx(same["judge_step_accuracy"])
        assert meta["labelled_verdicts"] == 2 * len(labels)
        if want is not None:
            assert meta["label_accuracy"] == pytest.approx(want)
            assert meta["positive_share"] == (1.0 if name == "yes" else 0.0)
        else:  # right on every detour, so better than a constant judge
            assert meta["label_accuracy"] > 0.5

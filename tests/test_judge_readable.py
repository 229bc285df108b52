"""research/judge_readable.py: a rule that reads only the judge's prompt against the env's
step labels, and the policy's own judged steps read back from a run (judge_data)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research"))

import judge_capacity  # noqa: E402
import judge_data  # noqa: E402
import judge_onpolicy  # noqa: E402
import judge_readable  # noqa: E402

from conftest import write_jsonl  # noqa: E402
from rlany.files.records import JudgeSample, Judgment, StepJudgment  # noqa: E402

MID = Path(__file__).resolve().parents[1] / "examples" / "household" / "mid_tasks.jsonl"


def _episodes(seed: int, per_task: int = 2):
    return judge_data.episodes(MID, per_task, seed, max_steps=8)


def test_the_rule_reads_every_label_where_the_goal_object_is_in_view_or_carried():
    rows = judge_data.judged_steps(_episodes(seed=3))
    by = {}
    for r in rows:
        prompt = r["messages"][-1]["content"]
        by.setdefault(judge_readable.where(prompt), []).append(
            judge_readable.rule(prompt) == r["label"])
    assert set(by) == set(judge_readable.WHERE) and min(map(len, by.values())) > 30
    assert all(by["carried"]) and all(by["in view"])
    # out of view the object lies in a closed receptacle: with two, the prompt cannot say
    # which, and only there may the rule be wrong
    assert 0.7 < sum(by["out of view"]) / len(by["out of view"]) < 1


def _run(tmp_path, trajs, verdict_of) -> Path:
    """A loop run directory whose iteration holds `trajs` judged with verdict_of(label)."""
    from rlany.prompts import step_prompts
    from rlany.stages.score import ScoreOptions, score_group

    it = tmp_path / "run" / "iter_000"
    it.mkdir(parents=True)
    write_jsonl(it / "trajectories.jsonl", trajs)
    judgments = [Judgment(traj_id=t.traj_id, task_id=t.task_id, judge={"model": "test"},
                          steps=[StepJudgment(step=k, judge_messages=m, samples=[
                              JudgeSample(text="\\boxed{+1}" if v > 0 else "\\boxed{-1}",
                                          score=v)
                              for v in verdict_of(int(s.info["label"]))])
                              for k, (s, m) in enumerate(zip(t.steps, step_prompts(t, 1, 1)))])
                 for t in trajs]
    write_jsonl(it / "judgments.jsonl", judgments)
    by_task: dict = {}
    for t, j in zip(trajs, judgments):
        by_task.setdefault(t.task_id, []).append((t.task_id, t, j))
    write_jsonl(it / "scored.jsonl", [s for group in by_task.values()
                                      for s in score_group(group, ScoreOptions())[0]])
    return tmp_path / "run"


def test_a_runs_judged_steps_are_read_back_with_their_labels_and_verdicts(tmp_path):
    trajs = _episodes(seed=4, per_task=1)[:24]
    right = _run(tmp_path / "a", trajs, lambda lab: [lab, lab, -lab])
    wrong = _run(tmp_path / "b", trajs, lambda lab: [-lab])
    tie = _run(tmp_path / "c", trajs, lambda lab: [lab, -lab])
    rows = judge_data.policy_steps([right])
    assert len(rows) == sum(len(t.steps) for t in trajs)
    assert all(r["verdict"] == r["label"] for r in rows)
    got = judge_readable.summarize([right])["all"]
    assert got["judge"] == 1.0 and got["rule"] > 0.9 and got["steps"] == len(rows)
    assert judge_readable.summarize([wrong])["all"]["judge"] == 0.0
    assert judge_readable.summarize([tie])["all"]["judge"] is None  # ties left out
    # the on-policy capacity split: no task on both sides, capped and seeded
    train, test = judge_capacity.onpolicy([right, wrong], 10_000, 10_000, seed=0)
    assert {r["task"] for r in train}.isdisjoint({r["task"] for r in test})
    assert len(train) + len(test) == 2 * len(rows)
    small = judge_capacity.onpolicy([right], 5, 3, seed=1)
    assert [len(x) for x in small] == [5, 3]
    assert small == judge_capacity.onpolicy([right], 5, 3, seed=1)


def test_judge_onpolicy_trains_on_exactly_the_sampled_steps_toward_their_label(tmp_path):
    from rlany.files.jsonl import JsonlReader
    from rlany.files.records import Scored
    from rlany.prompts import VERDICT_CHOICES
    from rlany.training.verdict import verdict_samples

    trajs = _episodes(seed=5, per_task=2)[:40]
    run = _run(tmp_path, trajs, lambda lab: [1, 1])
    rows = judge_data.policy_steps([run])
    train, _ = judge_capacity.onpolicy([run], 15, 5, seed=2)
    for target in ("label", "outcome"):
        path = tmp_path / f"{target}.jsonl"
        assert judge_onpolicy.train_file(train, target, path) == 15
        records = [r for _, r in JsonlReader(path, Scored, "scored", name=target)]
        got = sorted(s.target for s in verdict_samples(records, VERDICT_CHOICES))
        want = sorted(float(r["label" if target == "label" else "outcome"]) for r in train)
        assert got == want and len(rows) > 15
        assert len({r.traj_id for r in records}) == len(records)
        assert all(r.task_id.startswith("run.") for r in records)

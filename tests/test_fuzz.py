"""Hostile model output never crashes a stage: it becomes a parse failure or a rejected
candidate, with the reason recorded."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlany.engines.fake import FakeEngine
from rlany.envs import make_env
from rlany.envs.household import HouseholdEnv
from rlany.envs.household import make_tasks as house_tasks
from rlany.envs.reasoning import make_tasks
from rlany.files.records import TaskStats
from rlany.prompts import parse_verdict
from rlany.stages.adapt_tasks import AdaptOptions, propose
from rlany.stages.judge import JudgeOptions, judge
from rlany.stages.rewrites import parse_spec
from rlany.stages.rollout import RolloutOptions, rollout

# text biased toward the syntax the parsers look for
pieces = st.sampled_from(["\\boxed{", "}", "{", "+1", "-1", "−1", "1", "$", "\\text{",
                          "verdict:", "```json", "```", '"question":', '"answer":', "\n", " ",
                          "What is 2 + 2?", "null", "[", "]", ",", ":", "\\", '"'])
hostile = st.one_of(st.text(max_size=300), st.lists(pieces, max_size=40).map("".join))
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(hostile)
def test_parse_verdict_total(text):
    assert parse_verdict(text) in (-1, 0, 1)


@SETTINGS
@given(hostile)
def test_parse_spec_total(text):
    spec = parse_spec(text)
    assert spec is None or isinstance(spec, dict)


@SETTINGS
@given(hostile)
def test_household_accepts_any_response(text):
    task = house_tasks(1, seed=0)[0]
    env = HouseholdEnv()
    env.reset(task)
    before = env.admissible()
    result = env.step(text)
    assert result.action is None or result.action in before
    assert isinstance(result.obs, str) and result.obs


def _stats(task_id, acc):
    return TaskStats(task_id=task_id, n=4, successes=int(acc * 4), acc=acc, mean_steps=1.0,
                     policy_keep=True, policy_reason="", rm_keep=True, rm_reason="",
                     policy_samples=0, rm_samples=0, step_score_mean=None,
                     parse_fail_rate=None, judge_outcome_agreement=None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile, min_size=1, max_size=3))
def test_rewriter_output_is_validated_or_rejected_with_a_reason(outputs):
    pool = make_tasks(3, seed=1)
    stats = {pool[0].task_id: _stats(pool[0].task_id, 1.0),
             pool[1].task_id: _stats(pool[1].task_id, 0.0),
             pool[2].task_id: _stats(pool[2].task_id, 0.5)}
    engine = FakeEngine(lambda request, k: outputs[k % len(outputs)])
    candidates, rejections, _ = propose(pool, stats, {}, engine, make_env,
                                        AdaptOptions(rewrite="free"))
    assert len(candidates) + len(rejections) == 2     # the 0.5 task is not a target
    for c in candidates:
        assert make_env(c.env).validate(c.spec) == []
    for r in rejections:
        assert r["reasons"] and all(isinstance(x, str) for x in r["reasons"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile, min_size=1, max_size=4))
def test_judge_stage_counts_garbage_as_unparseable(outputs):
    tasks = make_tasks(2, seed=0)
    pol = FakeEngine(lambda request, k: outputs[k % len(outputs)])
    trajs = [t for g in rollout(tasks, pol, make_env, RolloutOptions(n=2)) for t in g]
    judged = [j for g in judge(trajs, pol, JudgeOptions(m=2)) for j in g]
    assert len(judged) == len(trajs)
    assert all(s.score in (-1, 0, 1) for j in judged for st_ in j.steps for s in st_.samples)

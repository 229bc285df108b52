"""`score --lam-gate agreement`: lambda scaled by how far the step scores' agreement with
the outcomes is above chance (rlany.stages.lam_gate), by hand and through the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import make_judgment, make_traj, read_jsonl, write_jsonl
from rlany.stages.lam_gate import gated_lambda
from rlany.stages.pairing import groups
from rlany.stages.score import ScoreOptions, _step_scores

Z2 = 1.96 ** 2


def _batch(n_tasks: int, judge_right: int):
    """n_tasks mixed tasks of 4 one-step rollouts (2 succeed); the judge's verdicts are
    the outcome on the first `judge_right` rollouts of each task, its opposite after."""
    trajs, judgments = [], []
    for k in range(n_tasks):
        for i in range(4):
            t = make_traj(f"task{k}", i, +1 if i % 2 == 0 else -1)
            v = t.outcome if i < judge_right else -t.outcome
            trajs.append(t)
            judgments.append(make_judgment(t, [[v, v]]))
    return trajs, judgments


def _located(trajs, judgments):
    return [(f"x:{i + 1}", t, j) for i, (t, j) in enumerate(zip(trajs, judgments))]


def _gate(trajs, judgments, lam=1.0, opts=ScoreOptions()):
    return gated_lambda(groups(iter(_located(trajs, judgments))), lam,
                        lambda g: _step_scores(g, opts))


def test_a_judge_that_agrees_with_every_outcome_gets_lambda_from_the_wilson_bound():
    lam, info = _gate(*_batch(10, judge_right=4), lam=0.5)
    lower = 40 / (40 + Z2)  # the Wilson lower bound of 40/40
    assert info["trajectories"] == 40 and info["agreement"] == 1.0
    assert info["lower95"] == pytest.approx(lower, abs=1e-4)
    assert lam == pytest.approx(0.5 * (2 * lower - 1), abs=1e-3)


def test_a_judge_at_chance_gives_lambda_zero():
    lam, info = _gate(*_batch(10, judge_right=2))  # half of each task's verdicts wrong
    assert info["agreement"] == 0.5 and lam == 0.0 and info["gate"] == 0.0


def test_uniform_tasks_candidates_and_unjudged_trajectories_do_not_count():
    trajs, judgments = _batch(2, judge_right=4)
    # a task every rollout solves, its judge saying -1 everywhere: not counted
    for i in range(4):
        t = make_traj("solved", i, +1)
        trajs.append(t)
        judgments.append(make_judgment(t, [[-1, -1]]))
    # a candidate task (on trial) with a wrong judge: not counted
    for i in range(4):
        t = make_traj("cand", i, +1 if i % 2 == 0 else -1, candidate=True)
        trajs.append(t)
        judgments.append(make_judgment(t, [[-t.outcome, -t.outcome]]))
    judgments[0] = replace(judgments[0], steps=[], skipped="not judged")
    lam, info = _gate(trajs, judgments)
    assert info["trajectories"] == 7 and info["agreement"] == 1.0


def test_the_gate_measures_the_labels_under_step_scores_label():
    trajs, _ = _batch(5, judge_right=0)  # the judge is wrong everywhere; labels are not
    for t in trajs:
        t.steps[0].info["label"] = t.outcome
    lam, info = _gate(trajs, [None] * len(trajs), opts=ScoreOptions(step_scores="label"))
    assert info["agreement"] == 1.0 and lam > 0.5


@pytest.mark.parametrize("right,gated", [(4, True), (2, False)])
def test_cli_scores_with_the_gated_lambda_from_stdin(tmp_path, cli, right, gated):
    """The input read twice (stdin is spooled): the rewards use lambda as gated, the
    sidecar records what it was measured on, and the summary line says it."""
    trajs, judgments = _batch(10, judge_right=right)
    t = write_jsonl(tmp_path / "trajectories.jsonl", trajs)
    j = write_jsonl(tmp_path / "judgments.jsonl", judgments)
    out = tmp_path / "scored.jsonl"
    r = cli("score", "-i", "-", "-j", str(j), "-o", str(out), "--lam-gate", "agreement",
            stdin=t.read_text())
    assert r.returncode == 0, r.stderr
    counts = json.loads((tmp_path / "scored.meta.json").read_text())["counts"]
    lam = counts["lam"]
    assert (lam > 0.8) == gated and (lam == 0.0) == (not gated)
    assert counts["lam_gate"]["trajectories"] == 40 and f"lambda {lam:.3f}" in r.stderr
    scored = read_jsonl(out)
    assert len(scored) == 40
    for s in scored:
        step = s["steps"][0]
        assert step["reward"] == pytest.approx(s["outcome"] + lam * step["step_score"])

"""`score`: the formulas checked by hand on small cases, and the CLI contract."""

from __future__ import annotations

import json
import math

import pytest

from conftest import make_judgment, make_traj, read_jsonl, write_jsonl
from rlany.errors import RlanyError
from rlany.stages.advantages import standardize
from rlany.stages.score import ScoreOptions, score_group, score_stream


def located(records):
    return [(f"x:{i + 1}", r) for i, r in enumerate(records)]


def group(trajs, scores=None):
    judgments = [make_judgment(t, s) for t, s in zip(trajs, scores)] if scores else [None] * len(trajs)
    return [(f"x:{i + 1}", t, j) for i, (t, j) in enumerate(zip(trajs, judgments))]


def test_integrated_reward_and_step_index_standardization():
    a, b = make_traj("t", 0, +1), make_traj("t", 1, -1)
    scored, stats = score_group(group([a, b], [[[1, 1, -1]], [[-1, -1, -1]]]), ScoreOptions())
    sa, sb = scored[0].steps[0], scored[1].steps[0]
    assert sa.step_score == pytest.approx(1 / 3)
    assert sa.reward == pytest.approx(1 + 1 / 3)           # R = O + λ·mean S
    assert sb.reward == pytest.approx(-1 - 1)
    # two members: standardized values are exactly ±1 with population std
    assert sa.advantage == pytest.approx(1.0) and sb.advantage == pytest.approx(-1.0)
    assert sa.keep and sb.keep
    assert stats.acc == 0.5 and stats.successes == 1 and stats.n == 2
    assert stats.policy_keep and stats.rm_keep


def test_consistency_reward_hand_computed():
    a, b = make_traj("t", 0, +1), make_traj("t", 1, -1)
    scored, _ = score_group(group([a, b], [[[1, 1, -1]], [[-1, -1, -1]]]), ScoreOptions())
    judge = scored[0].steps[0].judge
    r = 4 / 3
    assert [j.reward for j in judge] == pytest.approx([r, r, -r])   # R_i · S_ij
    mean = r / 3
    std = math.sqrt(((r - mean) ** 2 * 2 + (-r - mean) ** 2) / 3)
    assert [j.advantage for j in judge] == pytest.approx([(r - mean) / std] * 2 + [(-r - mean) / std])
    assert all(j.keep for j in judge)
    # all m verdicts agree: no reward-model signal, not kept
    assert not any(j.keep for j in scored[1].steps[0].judge)
    assert [j.advantage for j in scored[1].steps[0].judge] == [0.0, 0.0, 0.0]


def test_step_index_reached_by_one_trajectory():
    a, b = make_traj("t", 0, +1, n_steps=2), make_traj("t", 1, -1, n_steps=1)
    g = group([a, b])
    raw, _ = score_group(g, ScoreOptions(lam=0.0, lone_step="raw"))
    assert raw[0].steps[1].advantage == 1.0 and raw[0].steps[1].keep   # raw R kept
    assert raw[0].steps[0].advantage == pytest.approx(1.0)
    assert raw[1].steps[0].advantage == pytest.approx(-1.0)
    zero, _ = score_group(g, ScoreOptions(lam=0.0, lone_step="zero"))
    assert zero[0].steps[1].advantage == 0.0 and not zero[0].steps[1].keep


def test_all_equal_rewards_give_zero_advantage_and_are_dropped():
    trajs = [make_traj("t", i, +1, n_steps=2) for i in range(4)]
    scored, stats = score_group(group(trajs, [[[1, 1, 1], [1, -1, 1]]] * 4), ScoreOptions())
    assert all(s.advantage == 0.0 and not s.keep for t in scored for s in t.steps)
    assert stats.acc == 1.0
    assert not stats.policy_keep and stats.policy_reason == "uniform outcome"
    assert not stats.rm_keep and stats.rm_samples == 0


def test_uniform_outcome_kept_only_when_steps_separate():
    trajs = [make_traj("t", 0, -1), make_traj("t", 1, -1)]
    scores = [[[1, 1, 1]], [[-1, -1, -1]]]
    sep, stats = score_group(group(trajs, scores), ScoreOptions(uniform_tasks="separated"))
    assert stats.policy_keep and stats.policy_reason.startswith("uniform outcome, step")
    assert [t.steps[0].advantage for t in sep] == pytest.approx([1.0, -1.0])
    drop, stats = score_group(group(trajs, scores), ScoreOptions(uniform_tasks="drop"))
    assert not stats.policy_keep and not any(t.steps[0].keep for t in drop)
    # with λ = 0 the same trajectories are not separated, whatever the judge says
    _, stats = score_group(group(trajs, scores), ScoreOptions(lam=0.0))
    assert not stats.policy_keep


def test_unparseable_verdicts_get_penalty_and_abstain_from_the_mean():
    a, b = make_traj("t", 0, +1), make_traj("t", 1, -1)
    scored, stats = score_group(group([a, b], [[[1, 0, -1]], [[0, 0, 0]]]),
                                ScoreOptions(unparseable_penalty=-2.0))
    s = scored[0].steps[0]
    assert s.step_score == 0.0 and s.reward == 1.0
    assert [j.reward for j in s.judge] == [1.0, -2.0, -1.0]
    # all three unparseable: they agree, nothing to learn
    assert not any(j.keep for j in scored[1].steps[0].judge)
    assert stats.parse_fail_rate == pytest.approx(4 / 6)


def test_lambda_zero_is_outcome_only():
    a, b = make_traj("t", 0, +1), make_traj("t", 1, -1)
    scored, _ = score_group(group([a, b], [[[-1, -1, -1]], [[1, 1, 1]]]), ScoreOptions(lam=0.0))
    assert [t.steps[0].reward for t in scored] == [1.0, -1.0]
    assert [t.steps[0].advantage for t in scored] == pytest.approx([1.0, -1.0])
    # the consistency reward still uses R_i = O: the judge that said -1 on a success is wrong
    assert [j.reward for j in scored[0].steps[0].judge] == [-1.0, -1.0, -1.0]


def test_rm_data_only_from_mid_accuracy_tasks():
    trajs = [make_traj("t", i, +1 if i < 4 else -1) for i in range(5)]   # acc 0.8
    scores = [[[1, -1, 1]]] * 5
    _, stats = score_group(group(trajs, scores), ScoreOptions())
    assert stats.rm_keep and stats.rm_samples > 0
    _, stats = score_group(group(trajs, scores), ScoreOptions(rm_acc_max=0.75))
    assert not stats.rm_keep and stats.rm_samples == 0


def test_rm_target_label_trains_the_judge_toward_the_env_labels():
    """--rm-target label: the consistency reward is L * S with the env's step label L in
    place of R; the same steps are kept; the policy's side is untouched; a step without a
    label is an error at its trajectory's line."""
    trajs = [make_traj("t", i, +1 if i == 0 else -1, n_steps=2) for i in range(4)]
    for tr in trajs:   # step 0 good in every trajectory, step 1 good only in the success
        tr.steps[0].info["label"] = 1
        tr.steps[1].info["label"] = 1 if tr.outcome == 1 else -1
    scores = [[[1, -1, 1], [-1, 1, 1]]] * 4
    plain, _ = score_group(group(trajs, scores), ScoreOptions(lam=0))   # R = O
    oracle, stats = score_group(group(trajs, scores), ScoreOptions(lam=0, rm_target="label"))
    assert [j.reward for j in oracle[1].steps[0].judge] == [1.0, -1.0, 1.0]   # L = +1
    assert [j.reward for j in plain[1].steps[0].judge] == [-1.0, 1.0, -1.0]   # R = -1
    assert [j.reward for j in oracle[1].steps[1].judge] == [1.0, -1.0, -1.0]  # L = -1
    assert [[s.reward for s in t.steps] for t in oracle] == [
        [s.reward for s in t.steps] for t in plain]
    assert [[[j.keep for j in s.judge] for s in t.steps] for t in oracle] == [
        [[j.keep for j in s.judge] for s in t.steps] for t in plain]
    assert stats.rm_samples == 24
    del trajs[2].steps[1].info["label"]
    with pytest.raises(RlanyError, match="no env step label") as e:
        score_group(group(trajs, scores), ScoreOptions(lam=0, rm_target="label"))
    assert e.value.where == "x:3"


def test_standardize():
    assert standardize([1.0, 1.0]) == [0.0, 0.0]
    assert standardize([0.1] * 3) == [0.0] * 3   # float noise in the mean is not signal
    assert standardize([0.0, 2.0]) == [-1.0, 1.0]


def test_stream_groups_in_order_and_passes_unknown_columns():
    trajs = [make_traj("a", 0, 1, color="red"), make_traj("a", 1, -1), make_traj("b", 0, 1)]
    out = list(score_stream(located(trajs), None, ScoreOptions()))
    assert [st.task_id for _, st in out] == ["a", "b"]
    assert out[0][0][0].extra == {"color": "red"}


def test_stream_rejects_non_consecutive_groups():
    from rlany.errors import RlanyError
    trajs = [make_traj("a", 0, 1), make_traj("b", 0, 1), make_traj("a", 1, -1)]
    with pytest.raises(RlanyError, match="must be consecutive") as e:
        list(score_stream(located(trajs), None, ScoreOptions()))
    assert e.value.where == "x:3"


def test_stream_refuses_two_rollouts_in_one_group_and_a_half_judged_stream():
    """`cat iter_000/trajectories.jsonl iter_001/trajectories.jsonl` where one task ends the
    first and begins the second: one group of two policies is refused, not scored as one;
    a stream whose judgments begin after a task was passed on unjudged is refused too."""
    from dataclasses import replace

    old, new = make_traj("t", 0, 1), make_traj("t", 0, -1, iteration=1)
    with pytest.raises(RlanyError, match="is of iteration 1; its task group began at x:1") as e:
        list(score_stream(located([old, new]), None, ScoreOptions()))
    assert e.value.where == "x:2"
    other = replace(make_traj("t", 1, -1), policy={"model": "test", "adapter": "iter_003"})
    with pytest.raises(RlanyError, match="is of policy"):
        list(score_stream(located([old, other]), None, ScoreOptions()))
    a, b = [make_traj("a", k, 1) for k in range(2)], [make_traj("b", k, -1) for k in range(2)]
    stream = [*a, *b, *(make_judgment(t, [[1]]) for t in b)]
    with pytest.raises(RlanyError, match="task 'a' \\(x:1\\) had none") as e:
        list(score_stream(located(stream), None, ScoreOptions()))
    assert e.value.where == "x:5"


# ---------------------------------------------------------------------------------------
# the CLI


def _inputs(tmp_path, n_tasks=3):
    trajs, judgments = [], []
    for k in range(n_tasks):
        for i in range(4):
            t = make_traj(f"task{k}", i, +1 if i < 2 else -1, n_steps=1 + (i + k) % 3)
            trajs.append(t)
            judgments.append(make_judgment(t, [[1, -1, 0][(i + s) % 3:] + [1] * ((i + s) % 3)
                                               for s in range(len(t.steps))]))
    return write_jsonl(tmp_path / "trajectories.jsonl", trajs), write_jsonl(
        tmp_path / "judgments.jsonl", judgments)


def test_cli_writes_scored_stats_and_meta(tmp_path, cli):
    t, j = _inputs(tmp_path)
    r = cli("score", "-i", str(t), "-j", str(j), "-o", str(tmp_path / "scored.jsonl"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    scored = read_jsonl(tmp_path / "scored.jsonl")
    stats = read_jsonl(tmp_path / "task_stats.jsonl")
    assert len(scored) == 12 and [s["task_id"] for s in stats] == ["task0", "task1", "task2"]
    meta = json.loads((tmp_path / "scored.meta.json").read_text())
    assert meta["schema_version"] == 1 and meta["counts"]["trajectories"] == 12
    assert len(meta["inputs"]) == 2 and len(meta["inputs"][0]["sha256"]) == 64
    assert "score:" in r.stderr


def test_cli_stdout_is_data_only(tmp_path, cli):
    t, _ = _inputs(tmp_path)
    r = cli("score", "-i", "-", "-o", "-", stdin=t.read_text())
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 12 and all(line.startswith("{") for line in lines)


def test_cli_malformed_line_7_is_one_line_error(tmp_path, cli):
    t, j = _inputs(tmp_path)
    lines = t.read_text().splitlines(keepends=True)
    lines[6] = lines[6][: len(lines[6]) // 2] + "\n"
    t.write_text("".join(lines))
    out = tmp_path / "scored.jsonl"
    r = cli("score", "-i", str(t), "-j", str(j), "-o", str(out))
    assert r.returncode == 1
    err = r.stderr.strip().splitlines()
    assert len(err) == 1, r.stderr
    assert f"{t}:7:" in err[0] and "invalid JSON" in err[0]
    assert "Traceback" not in r.stderr
    assert not out.exists() and not (tmp_path / "task_stats.jsonl").exists()
    assert list(tmp_path.glob(".*tmp")) == []   # no temp file left behind


def test_cli_conflicting_flags_refused(tmp_path, cli):
    t, _ = _inputs(tmp_path)
    r = cli("score", "-i", str(t), "--rm-acc-min", "0.9", "--rm-acc-max", "0.5", "-o",
            str(tmp_path / "s.jsonl"))
    assert r.returncode == 2 and "--rm-acc-min" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "s.jsonl").exists()


def test_cli_wrong_file_kind_gets_a_hint(tmp_path, cli):
    _, j = _inputs(tmp_path)
    r = cli("score", "-i", str(j), "-o", str(tmp_path / "s.jsonl"))
    assert r.returncode == 1
    assert f"{j}:1:" in r.stderr and "looks like a judgments file" in r.stderr


def test_cli_debug_shows_traceback(tmp_path, cli):
    r = cli("score", "-i", str(tmp_path / "missing.jsonl"), env={"RLANY_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_cli_a_skipped_judgment_with_steps_names_its_line(tmp_path, cli):
    t, j = _inputs(tmp_path)
    lines = j.read_text().splitlines()
    record = json.loads(lines[4])
    record["skipped"] = "uniform outcome"          # but it still carries verdicts
    lines[4] = json.dumps(record)
    j.write_text("\n".join(lines) + "\n")
    out = tmp_path / "s.jsonl"
    r = cli("score", "-i", str(t), "-j", str(j), "-o", str(out))
    assert r.returncode == 1
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and f"{j}:5:" in err[0] and "skipped judgment" in err[0], r.stderr
    assert not out.exists()


def test_step_scores_label_puts_the_env_labels_in_place_of_the_judge():
    """--step-scores label: R = O + lambda * L (the upper bound of step feedback), no
    judgments needed; a step without a label is an error at its line."""
    trajs = [make_traj("t", i, +1 if i == 0 else -1, n_steps=2) for i in range(2)]
    for tr in trajs:
        tr.steps[0].info["label"] = 1
        tr.steps[1].info["label"] = 1 if tr.outcome == 1 else -1
    scored, _ = score_group([(f"x:{i + 1}", tr, None) for i, tr in enumerate(trajs)],
                            ScoreOptions(step_scores="label"))
    assert [[s.reward for s in t.steps] for t in scored] == [[2.0, 2.0], [0.0, -2.0]]
    assert [[s.step_score for s in t.steps] for t in scored] == [[1.0, 1.0], [1.0, -1.0]]
    del trajs[1].steps[0].info["label"]
    with pytest.raises(RlanyError, match="--step-scores label: step 0") as e:
        score_group([(f"x:{i + 1}", tr, None) for i, tr in enumerate(trajs)],
                    ScoreOptions(step_scores="label"))
    assert e.value.where == "x:2"


def test_the_loop_skips_the_judge_when_nothing_reads_its_verdicts():
    from rlany.loop.config import LoopConfig
    from rlany.loop.tables import _judged

    labels = {"score": {"step_scores": "label"}}
    assert not _judged(LoopConfig(name="u", tasks="t", rm_training=False,
                                  env_adaptation=False, tables=labels))
    assert _judged(LoopConfig(name="u", tasks="t", rm_training=False, env_adaptation=False))
    assert _judged(LoopConfig(name="u", tasks="t", env_adaptation=False, tables=labels))

"""The env's reward as the outcome (`score --outcome return | final-reward`) and as the step
score (`score --step-scores env-reward`): the math by hand, the refusals, eval's mean
return, and the issue's done-when: a policy trained on an OpenEnv server's reward, not its
success, with the reward shown in score's output."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from conftest import make_judgment, make_traj, one_line, read_jsonl, write_jsonl
from rlany.errors import RlanyError
from rlany.stages.env_reward import mean_return, return_row
from rlany.stages.score import ScoreOptions, score_group


def rewarded(sample: int, step_rewards: list, outcome: int = -1, **extra):
    """A trajectory whose step t carries info.reward = step_rewards[t] (openenv's way)."""
    tr = make_traj("t", sample, outcome, n_steps=len(step_rewards), **extra)
    for step, r in zip(tr.steps, step_rewards):
        step.info["reward"] = r
    return tr


def located(trajs):
    return [(f"x:{i + 1}", tr, None) for i, tr in enumerate(trajs)]


def test_return_is_the_outcome_where_success_leaves_the_group_uniform():
    """Every episode fails (O = -1 under success: no contrast, nothing trained); under
    --outcome return R = sum of the step rewards, standardized at each step index."""
    trajs = [rewarded(0, [0.5, 1.0]), rewarded(1, [0.0, None]), rewarded(2, [1.3, 3.0])]
    by_success, stats = score_group(located(trajs), ScoreOptions())
    assert stats.policy_reason == "uniform outcome" and stats.policy_samples == 0
    assert all("env_outcome" not in s.extra for s in by_success)   # the default: unchanged
    scored, stats = score_group(located(trajs), ScoreOptions(outcome="return"))
    returns = [1.5, 0.0, 4.3]
    assert [[s.reward for s in t.steps] for t in scored] == [[r, r] for r in returns]
    assert [t.extra["env_outcome"] for t in scored] == returns
    assert [t.outcome for t in scored] == [-1, -1, -1]       # success is kept as it was
    mean = sum(returns) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / 3)
    assert [t.steps[0].advantage for t in scored] == pytest.approx(
        [(r - mean) / std for r in returns])
    assert stats.policy_keep and stats.policy_reason == "mixed outcomes"
    assert stats.policy_samples == 6 and stats.acc == 0.0     # acc stays success-based
    assert stats.extra["env_outcome_mean"] == pytest.approx(mean)


def test_final_reward_and_lambda_with_judge_free_step_scores():
    trajs = [rewarded(0, [2.0, -1.0]), rewarded(1, [0.0, 0.25])]
    scored, _ = score_group(located(trajs), ScoreOptions(outcome="final-reward"))
    assert [t.extra["env_outcome"] for t in scored] == [-1.0, 0.25]
    assert [t.steps[0].reward for t in scored] == [-1.0, 0.25]   # no judge: S = 0
    # the env's step rewards as S: R_it = O_i + lambda * r_it (here O from success)
    trajs = [rewarded(0, [2.0, None], outcome=1), rewarded(1, [0.0, 0.25])]
    scored, stats = score_group(located(trajs), ScoreOptions(step_scores="env-reward",
                                                             lam=0.5))
    assert [[s.step_score for s in t.steps] for t in scored] == [[2.0, 0.0], [0.0, 0.25]]
    assert [[s.reward for s in t.steps] for t in scored] == [[2.0, 1.0], [-1.0, -0.875]]
    # both from the env: return + lambda * step reward
    scored, _ = score_group(located(trajs), ScoreOptions(outcome="return",
                                                         step_scores="env-reward"))
    assert [[s.reward for s in t.steps] for t in scored] == [[4.0, 2.0], [0.25, 0.5]]


def test_uniform_returns_are_uniform_and_the_verdict_target_is_the_env_outcome():
    trajs = [rewarded(0, [1.0]), rewarded(1, [1.0])]
    _, stats = score_group(located(trajs), ScoreOptions(outcome="return"))
    assert not stats.policy_keep and stats.policy_reason == "uniform outcome"
    trajs = [rewarded(0, [3.0], outcome=1), rewarded(1, [0.5])]
    group = [(w, tr, make_judgment(tr, [[1, -1]])) for w, tr, _ in located(trajs)]
    scored, _ = score_group(group, ScoreOptions(outcome="return"))
    assert [t.steps[0].rm_target for t in scored] == [3.0, 0.5]


def test_no_env_reward_is_refused_at_its_line_naming_the_flag():
    trajs = [rewarded(0, [1.0]), make_traj("t", 1, -1)]    # the second has no info.reward
    for opts, flag in ((ScoreOptions(outcome="return"), "--outcome return"),
                       (ScoreOptions(outcome="final-reward"), "--outcome final-reward"),
                       (ScoreOptions(step_scores="env-reward"), "--step-scores env-reward")):
        with pytest.raises(RlanyError, match=flag) as e:
            score_group(located(trajs), opts)
        assert e.value.where == "x:2" and "no env reward" in e.value.message
        assert "--outcome success" in e.value.hint
    # an errored episode (the env raised) is never trained on: its missing rewards count 0
    broken = replace(make_traj("t", 1, -1), finish="error")
    scored, stats = score_group(located([rewarded(0, [1.0]), broken]),
                                ScoreOptions(outcome="return"))
    assert scored[1].extra["env_outcome"] == 0.0 and stats.extra["errored"] == 1


@pytest.mark.parametrize("bad", [True, "1.0", float("inf"), float("nan")])
def test_a_reward_that_is_not_a_finite_number_is_refused(bad):
    trajs = [rewarded(0, [1.0]), rewarded(1, [bad])]
    with pytest.raises(RlanyError, match="not a finite number") as e:
        score_group(located(trajs), ScoreOptions(outcome="return"))
    assert e.value.where == "x:2"


def test_a_return_that_overflows_is_refused():
    trajs = [rewarded(0, [1.0]), rewarded(1, [1e308, 1e308])]
    with pytest.raises(RlanyError, match="sum to inf"):
        score_group(located(trajs), ScoreOptions(outcome="return"))


def test_eval_mean_return_rows_and_join():
    rows = [return_row([rewarded(0, [1.0, None]), rewarded(1, [0.5])]),
            return_row([make_traj("u", 0, 1)]),                 # an env without rewards
            return_row([rewarded(0, [4.0])])]
    assert rows == [{"mean_return": 0.75, "rewarded": 2}, {}, {"mean_return": 4.0,
                                                                "rewarded": 1}]
    assert mean_return(rows) == pytest.approx((1.0 + 0.5 + 4.0) / 3)
    assert mean_return([{}, {}]) is None


def test_cli_refusals_are_one_line(tmp_path, cli):
    trajs = write_jsonl(tmp_path / "t.jsonl", [rewarded(0, [1.0]), make_traj("t", 1, -1)])
    out = tmp_path / "s.jsonl"
    line = one_line(cli("score", "-i", str(trajs), "-o", str(out), "--outcome", "return"), 1)
    assert f"{trajs}:2:" in line and "--outcome return" in line and not out.exists()
    line = one_line(cli("score", "-i", str(trajs), "-o", str(out), "--outcome", "gain"), 2)
    assert "--outcome" in line


# -- the done-when: trained on an OpenEnv server's reward, not its success --------

@pytest.fixture(scope="module")
def url():
    pytest.importorskip("websockets", reason="needs websockets: pip install 'rlany[openenv]'")
    from openenv_server import serve

    server = serve(0)
    yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
    server.shutdown()


def test_train_policy_on_an_openenv_servers_return(url, tmp_path, cli, tiny_model):
    """The guessing server rewards a right guess with 1.0; with success_above 1 no episode
    succeeds, so by success every group is uniform (all -1) and nothing is trained. Scored
    with --outcome return, R is the server's return and train-policy trains on it."""
    tasks, script = tmp_path / "tasks.jsonl", tmp_path / "policy.json"
    r = cli("envs", "make-tasks", "openenv", "--n", "2", "--seed", "0", "--knob", f"url={url}",
            "--knob", 'spec={"success_above": 1.0}', "-o", str(tasks))
    assert r.returncode == 0, r.stderr
    script.write_text(json.dumps(["1", "2", "3", "4", "5"]))  # sample k guesses one of each
    traj = tmp_path / "traj.jsonl"
    r = cli("rollout", "-i", str(tasks), "-o", str(traj), "--engine", "fake", "--model",
            str(script), "--n", "5", "--max-steps", "1")
    assert r.returncode == 0, r.stderr
    trajs = [t for t in read_jsonl(traj) if "steps" in t]
    returns = [t["steps"][-1]["info"]["return"] for t in trajs]
    assert {t["outcome"] for t in trajs} == {-1} and sorted(returns) == [0.0] * 8 + [1.0] * 2

    by_success = tmp_path / "success.jsonl"
    r = cli("score", "-i", str(traj), "-o", str(by_success))
    assert r.returncode == 0, r.stderr
    stats = read_jsonl(tmp_path / "task_stats.jsonl")
    assert [(s["policy_keep"], s["policy_reason"]) for s in stats] == [
        (False, "uniform outcome")] * 2
    line = one_line(cli("train-policy", "-i", str(by_success), "-o", str(tmp_path / "p0"),
                        "--model", tiny_model, "--max-steps", "1", "--dtype", "float32"), 1)
    assert "no training samples" in line

    scored = tmp_path / "scored.jsonl"
    r = cli("score", "-i", str(traj), "-o", str(scored), "--outcome", "return")
    assert r.returncode == 0, r.stderr
    assert "mean outcome 0.2 (env return)" in r.stderr
    rows = [s for s in read_jsonl(scored) if "traj_id" in s]
    assert [s["env_outcome"] for s in rows] == returns
    assert [[st["reward"] for st in s["steps"]] for s in rows] == [[x] for x in returns]
    assert all(st["keep"] for s in rows for st in s["steps"])
    meta = json.loads(scored.with_name("scored.meta.json").read_text())
    assert meta["flags"]["outcome"] == "return"
    assert meta["counts"]["env_outcome"] == {"source": "return", "mean": 0.2}
    r = cli("train-policy", "-i", str(scored), "-o", str(tmp_path / "policy"), "--model",
            tiny_model, "--max-steps", "1", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    metrics = json.loads((tmp_path / "policy" / "rlany.json").read_text())["metrics"]
    assert metrics["steps"] == 1
    # eval: the success rate stays success-based, the server's mean return beside it
    r = cli("eval", "-i", str(tasks), "-o", "-", "--engine", "fake", "--model", str(script),
            "--n", "5", "--max-steps", "1", "--k", "1")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["success_rate"] == 0.0 and summary["mean_return"] == pytest.approx(0.2)
    assert [row["rewarded"] for row in summary["per_task"]] == [5, 5]
    assert "mean return 0.2" in r.stderr

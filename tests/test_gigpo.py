"""`score --step-credit gigpo`: GiGPO's advantages checked by hand on small cases, the
states rollout records for them, and the CLI, the loop's metrics and the report."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from conftest import make_judgment, read_jsonl, write_jsonl
from rlany.envs import after_first_line, state_hash
from rlany.files.records import Step, Trajectory, traj_id
from rlany.stages.gigpo import discounted
from rlany.stages.score import ScoreOptions, score_group

G = 0.95  # the default gamma


def traj(sample: int, states: list[str], outcome: int, finish: str | None = None,
         rewards: list[float] | None = None, task: str = "t") -> Trajectory:
    """A trajectory whose step t is taken in the state the observation `states[t]` shows."""
    steps = [Step(obs=s, prompt_messages=[{"role": "user", "content": s}],
                  response=f"act {sample}.{t}", action=f"act {t}", next_obs="",
                  info={} if rewards is None else {"reward": rewards[t]})
             for t, s in enumerate(states)]
    return Trajectory(traj_id=traj_id(task, 0, sample), task_id=task, iteration=0,
                      sample=sample, steps=steps, outcome=outcome,
                      finish=finish or ("success" if outcome == 1 else "failure"),
                      policy={"model": "test"})


def score(trajs, scores=None, **flags):
    judgments = ([make_judgment(t, s) for t, s in zip(trajs, scores)] if scores
                 else [None] * len(trajs))
    group = [(f"x:{i + 1}", t, j) for i, (t, j) in enumerate(zip(trajs, judgments))]
    return score_group(group, ScoreOptions(step_credit="gigpo", **flags))


def adv(scored) -> list[list[float]]:
    return [[s.advantage for s in tr.steps] for tr in scored]


def same(rows: list[list[float]], expected: list[list[float]]) -> bool:
    """Equal shapes, and the values equal up to float rounding."""
    return [len(r) for r in rows] == [len(r) for r in expected] and \
        sum(rows, []) == pytest.approx(sum(expected, []))


def test_two_rollouts_meet_the_same_state_at_different_steps():
    # A succeeds through hall at step 1; B meets hall at step 2 after a detour, and fails.
    a = traj(0, ["start", "hall", "kitchen"], +1)
    b = traj(1, ["start", "detour", "hall"], -1)
    scored, stats = score([a, b])
    # R = (1, 0): A^E = ±1. G_A = (γ², γ, 1), G_B = 0. Anchor groups: start {A0, B0} and
    # hall {A1, B2} standardize to ±1; kitchen {A2} and detour {B1} are groups of one (0).
    assert same(adv(scored), [[2.0, 2.0, 1.0], [-2.0, -1.0, -2.0]])
    ga = [s.gigpo for s in scored[0].steps]
    gb = [s.gigpo for s in scored[1].steps]
    assert [g["return"] for g in ga] == pytest.approx([G * G, G, 1.0])
    assert [g["anchor_size"] for g in ga] == [2, 2, 1] and [g["anchor_size"] for g in gb] == [2, 1, 2]
    assert ga[1]["anchor"] == gb[2]["anchor"] == state_hash("hall")
    assert [g["episode_advantage"] for g in ga + gb] == [1.0] * 3 + [-1.0] * 3
    assert [g["step_advantage"] for g in gb] == pytest.approx([-1.0, 0.0, -1.0])
    assert all(s.keep for tr in scored for s in tr.steps)
    assert stats.extra["anchor_groups"] == 4 and stats.extra["anchor_steps"] == 6
    assert stats.extra["anchor_shared_steps"] == 4
    # the paper's R = O + λ·S̄ stays each step's reward (the reward model reads it)
    assert [s.reward for s in scored[1].steps] == [-1.0] * 3


def test_mean_norm_and_weight():
    a = traj(0, ["start", "hall", "kitchen"], +1)
    b = traj(1, ["start", "detour", "hall"], -1)
    scored, _ = score([a, b], gigpo_norm="mean", gigpo_weight=0.5)
    # A^E = R - mean R = ±0.5; A^S = G - mean_U G: start ±γ²/2, hall ±γ/2
    assert same(adv(scored), [[0.5 + 0.5 * G * G / 2, 0.5 + 0.5 * G / 2, 0.5],
                                         [-0.5 - 0.5 * G * G / 2, -0.5, -0.5 - 0.5 * G / 2]])


def test_discounting_separates_successes_by_their_distance_to_the_goal():
    # both succeed: A^E = 0; from s, A reaches the goal in 2 steps, B in 3
    a = traj(0, ["s", "near"], +1)
    b = traj(1, ["s", "far", "near"], +1)
    assert discounted([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    scored, stats = score([a, b], gamma=0.5, gigpo_norm="mean")
    # s: G = (0.5, 0.25) -> ±0.125; near: G = (1, 1) -> 0; far: alone -> 0
    assert same(adv(scored), [[0.125, 0.0], [-0.125, 0.0, 0.0]])
    assert [s.keep for tr in scored for s in tr.steps] == [True, False, True, False, False]
    assert stats.policy_keep and stats.policy_reason == "uniform outcome, step rewards separate"
    _, dropped = score([a, b], gamma=0.5, uniform_tasks="drop")
    assert not dropped.policy_keep and dropped.policy_samples == 0


def test_a_group_of_one_keeps_the_episode_advantage():
    a = traj(0, ["a0", "a1"], +1)
    b = traj(1, ["b0"], -1)
    scored, stats = score([a, b])
    assert adv(scored) == [[1.0, 1.0], [-1.0]]  # no state shared: A = A^E
    assert all(s.gigpo["anchor_size"] == 1 and s.gigpo["step_advantage"] == 0.0
               for tr in scored for s in tr.steps)
    assert stats.extra["anchor_shared_steps"] == 0


def test_errored_episodes_take_no_part():
    a = traj(0, ["start", "hall", "kitchen"], +1)
    b = traj(1, ["start", "detour", "hall"], -1)
    broken = traj(2, ["start", "hall"], -1, finish="error")
    scored, stats = score([a, b, broken])
    clean, _ = score([a, b])
    assert same(adv(scored)[:2], adv(clean))  # as if it were not there
    assert adv(scored)[2] == [0.0, 0.0]
    assert all(s.gigpo is None and not s.keep for s in scored[2].steps)
    assert scored[0].steps[0].gigpo["anchor_size"] == 2
    assert stats.extra["anchor_steps"] == 6 and stats.n == 2


def test_a_rollout_that_revisits_a_state_is_in_its_group_once_per_visit():
    a = traj(0, ["s", "t", "s", "g"], +1)  # back at s at step 2
    b = traj(1, ["s", "x"], -1)
    scored, stats = score([a, b])
    values = [G ** 3, G, 0.0]  # G of s's members: A0, A2, B0
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)
    a_s = [(v - mean) / std for v in values]
    assert same(adv(scored), [[1 + a_s[0], 1.0, 1 + a_s[1], 1.0], [-1 + a_s[2], -1.0]])
    assert [s.gigpo["anchor_size"] for s in scored[0].steps] == [3, 1, 3, 1]
    assert stats.extra["anchor_groups"] == 4 and stats.extra["anchor_shared_steps"] == 3


def test_an_all_fail_task_gets_zero_advantage_everywhere():
    trajs = [traj(i, ["s", f"x{i}", "s"], -1) for i in range(3)]
    scored, stats = score(trajs)
    assert all(s.advantage == 0.0 and not s.keep for tr in scored for s in tr.steps)
    assert not stats.policy_keep and stats.policy_reason == "uniform outcome"


def test_judge_step_scores_add_to_the_step_rewards():
    # both fail; the judge liked A's steps and not B's: r = λ·S̄ at each step, 0 at the end
    a = traj(0, ["s", "a"], -1)
    b = traj(1, ["s", "b"], -1)
    scored, stats = score([a, b], scores=[[[1, 1], [1, 1]], [[-1, -1], [-1, -1]]])
    # G_A = (1 + γ, 1), G_B = (-1 - γ, -1): s standardizes to ±1; a, b alone; A^E = 0
    assert [s.gigpo["return"] for s in scored[0].steps] == pytest.approx([1 + G, 1.0])
    assert same(adv(scored), [[1.0, 0.0], [-1.0, 0.0]])
    assert stats.policy_keep  # step rewards separate an all-fail task
    lam0, _ = score([a, b], scores=[[[1, 1], [1, 1]], [[-1, -1], [-1, -1]]], lam=0.0)
    assert all(s.advantage == 0.0 for tr in lam0 for s in tr.steps)


def test_the_env_return_and_a_lone_episode():
    a = traj(0, ["s", "t"], -1, rewards=[0.5, 1.0])
    b = traj(1, ["s", "u"], -1, rewards=[0.0, 0.5])
    scored, _ = score([a, b], outcome="return", gigpo_norm="mean")
    # R = (1.5, 0.5): A^E = ±0.5; G at s: (0.5 + γ, 0.5γ) -> ±(0.5 + 0.5γ)/2
    half = (0.5 + G - 0.5 * G) / 2
    assert same(adv(scored), [[0.5 + half, 0.5], [-0.5 - half, -0.5]])
    lone, _ = score([traj(0, ["s", "t"], +1)])
    assert adv(lone) == [[1.0, 1.0]]  # --lone-step raw: A^E = R
    zero, _ = score([traj(0, ["s", "t"], +1)], lone_step="zero")
    assert adv(zero) == [[0.0, 0.0]]


def test_the_recorded_state_is_the_anchor():
    # rollout's `state` (the env's key) wins over the observation: differing feedback lines,
    # one state
    a = traj(0, ["You open it.\nroom", "x"], +1)
    b = traj(1, ["Nothing happens.\nroom", "y"], -1)
    plain, _ = score([a, b])
    assert plain[0].steps[0].gigpo["anchor_size"] == 1
    keyed = [Trajectory(**{**t.__dict__, "steps": [
        Step(**{**s.__dict__, "state": state_hash(after_first_line(s.obs))}) for s in t.steps]})
        for t in (a, b)]
    scored, _ = score(keyed)
    assert scored[0].steps[0].gigpo["anchor"] == state_hash("room")
    assert scored[0].steps[0].gigpo["anchor_size"] == 2


def test_the_envs_state_keys():
    from rlany.envs.household import HouseholdEnv
    from rlany.envs.miniwob import MiniwobEnv

    assert HouseholdEnv().state_key("You go to the fridge 1.\nYou are at fridge 1.") == \
        "You are at fridge 1."
    env = MiniwobEnv()
    env.spec = {"hint": "type slowly"}
    page = "Instruction: Click OK.\nPage elements:\n[1] button OK"
    assert env.state_key("Error: no such element\n" + page) == page
    assert env.state_key("Instruction: Click OK.\nHint: type slowly\nPage elements:\n"
                         "[1] button OK") == page
    assert env.state_key(page) == page


def test_rollout_records_the_household_state():
    from rlany.engines.fake import FakeEngine
    from rlany.envs import make_env
    from rlany.envs.household import make_tasks
    from rlany.stages.rollout import RolloutOptions, rollout

    tasks = make_tasks(1, seed=7, kinds="pick")
    engine = FakeEngine.from_rules([{"responses": ["1", "2", "look"]}])
    (group,) = rollout(tasks, engine, make_env, RolloutOptions(n=3, max_steps=3))
    for tr in group:
        assert all(s.state == state_hash(after_first_line(s.obs)) for s in tr.steps)
    scored, _ = score_group([(f"x:{i}", t, None) for i, t in enumerate(group)],
                            ScoreOptions(step_credit="gigpo"))
    assert all(tr.steps[0].gigpo["anchor_size"] >= 3 for tr in scored)  # one start state


def rlany(*argv: str) -> tuple[int, str]:
    """`rlany ARGV` in-process: (exit code, stderr)."""
    from rlany.cli import main

    code = 0
    with CliRunner().isolation(env={"RLANY_DEBUG": None}) as (_, err, _):
        try:
            main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, err.getvalue().decode()


def test_cli(tmp_path):
    trajs = [traj(0, ["start", "hall", "kitchen"], +1), traj(1, ["start", "detour", "hall"], -1),
             traj(0, ["s", "t"], -1, task="u"), traj(1, ["s", "v"], -1, task="u")]
    src, out = write_jsonl(tmp_path / "t.jsonl", trajs), tmp_path / "scored.jsonl"
    code, err = rlany("score", "-i", str(src), "-o", str(out), "--step-credit", "gigpo")
    assert code == 0, err
    rows = read_jsonl(out)
    assert [s["advantage"] for s in rows[1]["steps"]] == pytest.approx([-2.0, -1.0, -2.0])
    assert rows[1]["steps"][2]["gigpo"]["anchor_size"] == 2
    assert "gigpo" not in json.dumps(read_jsonl(tmp_path / "task_stats.jsonl"))
    counts = json.loads((tmp_path / "scored.meta.json").read_text())["counts"]
    # 10 steps in 7 groups; 6 steps share theirs (start, hall, and task u's s)
    assert counts["anchor_steps"] == 10 and counts["anchor_groups"] == 7
    assert counts["anchor_shared_share"] == pytest.approx(0.6)
    assert counts["anchor_group_mean"] == pytest.approx(10 / 7)
    assert "60% of steps share their anchor state (mean group size 1.43)" in err
    default_out = tmp_path / "plain.jsonl"
    assert rlany("score", "-i", str(src), "-o", str(default_out))[0] == 0
    assert "gigpo" not in default_out.read_text()  # the default is unchanged
    assert "anchor_steps" not in (tmp_path / "plain.meta.json").read_text()


def test_gigpo_flags_need_gigpo(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", [traj(0, ["s"], +1)])
    code, err = rlany("score", "-i", str(src), "-o", str(tmp_path / "s.jsonl"), "--gamma", "0.9")
    assert code == 2 and "--gamma is GiGPO's" in err and "--step-credit gigpo" in err
    assert not (tmp_path / "s.jsonl").exists()
    code, err = rlany("score", "-i", str(src), "-o", str(tmp_path / "s.jsonl"),
                      "--step-credit", "gigpo", "--gamma", "1.5")
    assert code == 2 and "--gamma" in err


def test_loop_metrics_and_report(tmp_path):
    from rlany.loop.metrics import collect_metrics
    from rlany.stages.report import write_report

    it = tmp_path / "iter_000"
    it.mkdir()
    (it / "scored.meta.json").write_text(json.dumps({"counts": {
        "mean_acc": 0.5, "anchor_shared_share": 0.97, "anchor_group_mean": 5.25}}))
    row = collect_metrics(it)
    assert row["anchor_shared_share"] == 0.97 and row["anchor_group_mean"] == 5.25
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"iteration": 0, **row}) + "\n")
    written = {p.name for p in write_report([str(run)], tmp_path / "report")}
    assert {"anchor_shared_share.png", "anchor_group_mean.png"} <= written
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| 0 | 0.970 | 5.250 |" in md


def test_a_state_key_that_raises_keys_the_step_on_its_observation():
    """A plug-in env whose state_key raises (or gives no text) costs its episode nothing:
    the step records no state and score hashes its observation instead."""
    from rlany.envs import state_digest

    class Broken:
        def state_key(self, observation: str) -> str:
            raise ValueError("no state here")

    class Silent:
        def state_key(self, observation: str):
            return None

    assert state_digest(Broken(), "obs") is None
    assert state_digest(Silent(), "obs") is None

"""household: deterministic per seed, every task solvable, the expert solves it, edits validated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlany.envs.household import KINDS, HouseholdEnv, expert_actions, make_tasks
from rlany.files.records import Task, to_json


def play(task, actions):
    env = HouseholdEnv()
    env.reset(task)
    result = None
    for a in actions:
        result = env.step(a)
        if result.done:
            break
    return result


def test_deterministic_per_seed():
    a = [to_json(t) for t in make_tasks(10, seed=4, rooms=2)]
    b = [to_json(t) for t in make_tasks(10, seed=4, rooms=2)]
    c = [to_json(t) for t in make_tasks(10, seed=5, rooms=2)]
    assert json.dumps(a) == json.dumps(b) != json.dumps(c)


@pytest.mark.parametrize("kind", KINDS)
def test_every_generated_task_is_solved_by_the_expert(kind):
    for task in make_tasks(15, seed=1, rooms=3, receptacles=4, distractors=4, kinds=kind,
                           closed=0.7, max_steps=30):
        assert HouseholdEnv().validate(task.spec) == []
        result = play(task, expert_actions(task.spec))
        assert result.done and result.success, task.task_id


def test_small_worlds_generate_for_every_kind():
    # with 2-3 receptacles a draw can leave nowhere to put the goal object: it is redrawn
    for kind in KINDS:
        for receptacles in (2, 3):
            assert len(make_tasks(30, seed=11, receptacles=receptacles, kinds=kind)) == 30


def test_goal_not_met_at_start_and_wrong_actions_fail():
    for task in make_tasks(20, seed=2, kinds="pick_and_place,pick_two"):
        result = play(task, ["look"] * task.spec["max_steps"])
        assert result.done and not result.success


def test_actions_by_number_text_or_fuzzy_text():
    task = make_tasks(1, seed=0, kinds="pick_and_place")[0]
    plan = expert_actions(task.spec)
    env = HouseholdEnv()
    env.reset(task)
    number = env.admissible().index(plan[0]) + 1
    r = env.step(f"{number}")
    assert r.action == plan[0] and r.info["parse"] == "number"
    r = env.step(f"I think I should now do this.\nAction: {plan[1].upper()}")
    assert r.action == plan[1] and r.info["parse"] == "text"
    r = env.step("dance wildly")
    assert r.action is None and r.obs.startswith("Nothing happens.")
    r = env.step("I'm in the room. You see: table 1 and many things I like")
    assert r.action is None                        # prose that mentions a receptacle
    r = env.step(plan[2][:-2] + "l")               # a spelling slip at the end
    assert r.action == plan[2] and r.info["parse"] in ("fuzzy", "prefix")


def test_edited_specs_are_validated():
    task = make_tasks(1, seed=3, kinds="pick_and_place")[0]
    env = HouseholdEnv()
    spec = json.loads(json.dumps(task.spec))
    spec["goal"]["object"] = "unicorn"
    assert any("known object" in p for p in env.validate(spec))
    spec = json.loads(json.dumps(task.spec))
    spec["goal"]["kind"] = "heat_and_place"   # a rewrite the world has no microwave for?
    problems = env.validate(spec)
    has_microwave = any(r["type"] == "microwave" for rs in spec["rooms"].values() for r in rs)
    assert (problems == []) == has_microwave
    spec = json.loads(json.dumps(task.spec))
    spec["max_steps"] = 1
    assert any("max_steps" in p for p in env.validate(spec))
    spec = json.loads(json.dumps(task.spec))
    spec["hint"] = "look inside closed things"
    assert env.validate(spec) == []
    assert env.validate({"rooms": {}}) and env.validate("nonsense")


def test_rollout_through_the_registry(tmp_path, cli):
    from rlany.engines.fake import FakeEngine
    from rlany.envs import make_env
    from rlany.stages.rollout import RolloutOptions, rollout

    tasks = make_tasks(2, seed=7, kinds="pick")
    eng = FakeEngine.from_rules([{"responses": ["1", "2", "3", "look"]}])
    groups = list(rollout(tasks, eng, make_env, RolloutOptions(n=3, max_steps=4)))
    assert [len(g) for g in groups] == [3, 3]
    assert all(1 <= len(t.steps) <= 4 for g in groups for t in g)
    assert len(eng.calls) <= 4   # one batched call per turn
    r = cli("envs", "make-tasks", "household", "--n", "3", "--seed", "1", "--knob", "rooms=2",
            "--knob", "kinds=cool_and_place", "-o", str(tmp_path / "h.jsonl"))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert [r["spec"]["goal"]["kind"] for r in rows] == ["cool_and_place"] * 3
    assert Task(**{k: v for k, v in rows[0].items() if k != "lineage"})


def test_make_tasks_exclude(tmp_path, cli):
    """--exclude: a held-out file shares no spec with the pool; it keeps the generator's order
    (the first tasks of the same seed that are not excluded); too few left: exit 1, nothing
    written; a bad exclude file is reported at its line."""
    pool, held = tmp_path / "pool.jsonl", tmp_path / "held.jsonl"
    r = cli("envs", "make-tasks", "reasoning", "--n", "64", "--seed", "21", "-o", str(pool))
    assert r.returncode == 0, r.stderr
    r = cli("envs", "make-tasks", "reasoning", "--n", "32", "--seed", "22", "--split", "eval",
            "--exclude", str(pool), "-o", str(held))
    assert r.returncode == 0, r.stderr
    specs = {json.dumps(json.loads(x)["spec"], sort_keys=True)
             for x in pool.read_text().splitlines()}
    rows = [json.loads(x) for x in held.read_text().splitlines()]
    assert len(rows) == 32 and all(x["split"] == "eval" for x in rows)
    assert not {json.dumps(x["spec"], sort_keys=True) for x in rows} & specs
    from rlany.envs.reasoning import make_tasks as sums
    plain = [to_json(t) for t in sums(200, seed=22, split="eval")]
    kept = [t for t in plain if json.dumps(t["spec"], sort_keys=True) not in specs][:32]
    assert rows == kept
    # only 100 single-digit sums exist, and 2000 draws hold them all: none is left
    every, out = tmp_path / "every.jsonl", tmp_path / "none.jsonl"
    assert cli("envs", "make-tasks", "reasoning", "--n", "2000", "-o", str(every)).returncode == 0
    r = cli("envs", "make-tasks", "reasoning", "--n", "4", "--seed", "3", "--exclude", str(every),
            "-o", str(out))
    assert r.returncode == 1 and "generated tasks are not in" in r.stderr and not out.exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(pool.read_text().splitlines()[0] + "\n{not json\n")
    r = cli("envs", "make-tasks", "reasoning", "--n", "4", "--exclude", str(bad), "-o",
            str(out))
    assert r.returncode == 1 and f"{bad}:2:" in r.stderr and not out.exists(), r.stderr


def test_on_plan_share_reads_the_env_step_labels(tmp_path, cli):
    from rlany.files.jsonl import JsonlReader
    from rlany.files.records import Trajectory
    from rlany.stages.eval import on_plan_share

    tasks = tmp_path / "t.jsonl"
    cli("envs", "make-tasks", "household", "--n", "8", "--seed", "3", "--knob", "max_steps=6",
        "-o", str(tasks))

    def share(*flags):
        out = tmp_path / "r.jsonl"
        out.unlink(missing_ok=True)
        Path(str(out)[:-6] + ".meta.json").unlink(missing_ok=True)
        cli("rollout", "-i", str(tasks), "-o", str(out), "--expert", "--max-steps", "6", *flags)
        return on_plan_share([t for _, t in JsonlReader(out, Trajectory, "t")])

    assert share("--n", "1") == 1.0            # the expert walks a shortest plan
    random = share("--n", "4", "--expert-p", "0")
    assert random is not None and 0.0 < random < 1.0
    assert on_plan_share([]) is None

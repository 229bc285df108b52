"""The alfworld adapter plays real TextWorld games, compiled offline in the test."""

from __future__ import annotations

import json

import pytest

from conftest import read_jsonl
from rlany.envs.alfworld import AlfworldEnv, clean_feedback, make_tasks

pytest.importorskip("textworld")


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    """Two TextWorld games compiled here (about 5 s each)."""
    return make_tasks(2, seed=0, game_dir=str(tmp_path_factory.mktemp("games")),
                      rooms=2, objects=3, quest_length=2, max_steps=10)


def walkthrough(task):
    import textworld

    env = textworld.start(task.spec["game_file"],
                          request_infos=textworld.EnvInfos(policy_commands=True))
    plan = env.reset()["policy_commands"]
    env.close()
    return plan


def test_the_walkthrough_wins_and_the_end_is_not_revealed(games):
    for task in games:
        env = AlfworldEnv()
        first = env.reset(task)
        assert first.startswith("Your task is to: ") and "Admissible commands:" in first
        assert "$$" not in first  # the ASCII banner is gone
        plan = walkthrough(task)
        assert plan and all(c in env.admissible for c in plan[:1])
        for k, command in enumerate(plan):
            # by number for the first command, by text afterwards
            said = str(env.admissible.index(command) + 1) if k == 0 else command
            result = env.step(said)
            assert result.action == command
            if result.done:
                break
        assert result.done and result.success
        assert "score" not in result.obs.lower() and "the end" not in result.obs.lower()
        assert AlfworldEnv().validate(task.spec) == []


def test_bad_commands_do_nothing_and_the_step_limit_ends_the_game(games):
    task = games[0]
    env = AlfworldEnv()
    env.reset(task)
    for k in range(task.spec["max_steps"]):
        result = env.step("I would like to dance")
        assert result.action is None and result.obs.startswith("Nothing happens.")
        assert result.done == (k == task.spec["max_steps"] - 1)
    assert not result.success


def test_specs_are_validated(games, tmp_path):
    env = AlfworldEnv()
    spec = dict(games[0].spec)
    assert env.validate({**spec, "game_file": str(tmp_path / "none.z8")})
    assert env.validate({**spec, "game_file": "game.txt"})
    assert env.validate({**spec, "max_steps": 0})
    assert env.validate({**spec, "max_steps": 1})  # the walkthrough needs more
    assert env.validate({**spec, "hint": "look in the chest"}) == []


def test_clean_feedback():
    text = ("\nYou close the bureau.\n\n\nYour score has just gone up by one point.\n\n\n"
            "          *** The End ***\n\nYou scored 1 out of a possible 1, in 3 turns.\n\n"
            "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n>")
    assert clean_feedback(text) == "You close the bureau."


def test_rollout_from_the_cli(games, tmp_path, cli):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": t.task_id, "env": "alfworld",
                                         "spec": t.spec, "prompt": t.prompt}) + "\n"
                             for t in games))
    # a scripted policy that always plays the walkthrough's first command, by text
    script = tmp_path / "policy.json"
    script.write_text(json.dumps([walkthrough(games[0])[0]]))
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "traj.jsonl"), "--engine",
            "fake", "--model", str(script), "--n", "2", "--max-steps", "3")
    assert r.returncode == 0, r.stderr
    trajs = read_jsonl(tmp_path / "traj.jsonl")
    assert len(trajs) == 4 and all(1 <= len(t["steps"]) <= 3 for t in trajs)
    assert trajs[0]["steps"][0]["action"] == walkthrough(games[0])[0]
    assert "Admissible commands:" in trajs[0]["steps"][0]["prompt_messages"][-1]["content"]


def test_the_expert_wins_every_game_from_the_cli(games, tmp_path, cli):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": t.task_id, "env": "alfworld",
                                         "spec": t.spec, "prompt": t.prompt}) + "\n"
                             for t in games))
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "demos.jsonl"), "--expert",
            "--n", "1", "--max-steps", "10")
    assert r.returncode == 0, r.stderr
    demos = read_jsonl(tmp_path / "demos.jsonl")
    assert [d["outcome"] for d in demos] == [1, 1]
    assert [s["action"] for s in demos[0]["steps"]] == walkthrough(games[0])
    assert all(s["info"]["label"] == 1 for d in demos for s in d["steps"])

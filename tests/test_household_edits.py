"""household's edits: every default edit keeps the goal's kind (only the slot edits change its
wording), the tail-first edits start the robot further along the task's own shortest plan,
an adapted task's edits are made from its original, and the menu's order."""

from __future__ import annotations

import json

import pytest

from rlany.envs.household import HouseholdEnv, expert_actions, make_tasks
from rlany.envs.household_edits import ORDER
from rlany.files.records import Task

SLOT_EDITS = ("goal object", "goal receptacle")


def _pool() -> list[Task]:
    """Worlds of every shape the edits see: one room and two, open and closed, each kind."""
    return (make_tasks(12, seed=31, receptacles=3, distractors=1, kinds="pick_and_place",
                       closed=0.5, max_steps=8)
            + make_tasks(12, seed=7, rooms=2, receptacles=3, distractors=2, closed=0.7,
                         kinds="pick,pick_and_place,pick_two,clean_and_place,"
                               "heat_and_place,cool_and_place,look_at_in_light",
                         max_steps=30))


def test_every_default_edit_keeps_the_goal_kind():
    """Fails on a planted edit that changes the goal's kind: by default no edit touches the
    goal but the slot edits (another object or receptacle, the reference code's), and none
    changes its kind, in either direction, from the task or from its root."""
    env = HouseholdEnv()
    offered = 0
    for task in _pool():
        for direction in ("easier", "harder"):
            for e in env.edits(task.spec, direction):
                offered += 1
                assert e.spec["goal"]["kind"] == task.spec["goal"]["kind"], e.description
                if e.spec["goal"] != task.spec["goal"]:
                    assert e.kind in SLOT_EDITS, e.description
                assert env.validate(e.spec) == []
    assert offered > 100
    # the opt-in departure brings the kind edit back, and only when asked
    task = make_tasks(1, seed=31, receptacles=3, kinds="pick_and_place")[0]
    allowed = env.edits(task.spec, "easier", allow=("goal kind",))
    assert any(e.kind == "goal kind" and e.spec["goal"]["kind"] == "pick" for e in allowed)


def _state(env: HouseholdEnv) -> tuple:
    return (env.room, env.at, sorted(env.holding),
            sorted(n for recs in env.rooms.values() for n, r in recs.items() if r["closed"]))


@pytest.mark.parametrize("kind", ["start holding", "start at"])
def test_tail_first_edits_reset_into_the_stated_state_and_plan_the_tail(kind):
    """A "start holding X" / "start at R" task resets into exactly the state its spec states
    (room, position, what the robot holds), that is the state after a prefix of the
    original's own shortest plan; its shortest plan is as long as the plan's tail, and the
    tail itself solves it."""
    env = HouseholdEnv()
    seen = 0
    for task in _pool():
        plan = expert_actions(task.spec)
        for e in env.edits(task.spec, "easier"):
            if e.kind != kind:
                continue
            seen += 1
            spec = e.spec
            start = HouseholdEnv()
            start.reset(Task(task_id="t", env="household", spec=spec, prompt=""))
            assert (start.room, start.at, start.holding) == (
                spec["start_room"], spec["start_at"], spec.get("start_holding", []))
            assert spec["goal"] == task.spec["goal"]
            if kind == "start holding":
                assert start.holding and e.description.startswith(
                    f"start holding {start.holding[0]} at {start.at}")
            # the original, played along its plan to where the edit starts: the same state
            tail = plan[len(plan) - len(expert_actions(spec)):]
            before = HouseholdEnv()
            before.reset(task)
            for action in plan[:len(plan) - len(tail)]:
                before.step(action)
            assert _state(start) == _state(before), e.description
            assert len(tail) < len(plan) and start.dist == len(tail)
            for k, action in enumerate(tail):
                result = start.step(action)
                assert result.info["label"] == 1 and result.done == (k == len(tail) - 1)
            assert result.success
    assert seen >= 12


def test_a_start_state_is_validated():
    task = make_tasks(1, seed=31, receptacles=3, kinds="pick_and_place")[0]
    env = HouseholdEnv()
    room = task.spec["start_room"]
    first = task.spec["rooms"][room][0]["name"]
    held = next(o for recs in task.spec["rooms"].values() for r in recs
                for o in r.get("contents", []))
    assert env.validate({**task.spec, "start_at": first}) == []
    assert any("start_at" in p for p in env.validate({**task.spec, "start_at": "shelf 9"}))
    assert "an object is in two places" in env.validate({**task.spec, "start_holding": [held]})
    assert any("start_holding" in p for p in env.validate({**task.spec,
                                                           "start_holding": "apple 1"}))
    assert "start holding" not in json.dumps(env.describe(task))
    spec = next(e.spec for e in env.edits(task.spec, "easier") if e.kind == "start holding")
    text = env.describe(Task(task_id="t", env="household", spec=spec, prompt=""))
    assert f"at {spec['start_at']}, holding {spec['start_holding'][0]}." in text


def test_an_adapted_tasks_edits_are_made_from_its_root():
    """Edits never stack: easier, the root's edits easier than an easier rewrite; harder, a
    step back toward the root, the root itself first (and the reverse for a harder one)."""
    env = HouseholdEnv()
    root = make_tasks(1, seed=31, receptacles=3, kinds="pick_and_place", closed=1.0)[0].spec
    menu = env.edits(root, "easier")
    start_at = next(e.spec for e in menu if e.kind == "start at")
    holding = next(e.spec for e in menu if e.kind == "start holding")
    easier = env.edits(start_at, "easier", root=root)
    assert holding in [e.spec for e in easier]
    assert all("start_at" not in e.spec or e.spec == holding or e.kind == "start at"
               for e in easier)  # no edit of the adapted spec: a root edit
    d = len(expert_actions(start_at))
    assert all(len(expert_actions(e.spec)) <= d for e in easier)
    harder = env.edits(holding, "harder", root=root)
    assert harder[0].spec == root and harder[0].kind == "back to the original"
    assert start_at in [e.spec for e in harder]
    d_root, d_held = len(expert_actions(root)), len(expert_actions(holding))
    assert all(d_held <= len(expert_actions(e.spec)) <= d_root for e in harder)
    # a harder rewrite steps back the other way: easier, its root first
    bigger = env.edits(root, "harder")[0].spec
    back = env.edits(bigger, "easier", root=root)
    assert back[0].spec == root and all(
        len(expert_actions(e.spec)) <= len(expert_actions(bigger)) for e in back)


def test_the_easier_menu_deals_plan_shortening_edits_first():
    """Plan-shortening kinds come first; "remove" and "step limit", which leave the plan as
    it is, last; every item of the mid pool's menus is dealt in that order."""
    assert ORDER["easier"][:4] == ("back to the original", "start holding", "start at", "open")
    assert ORDER["easier"][-1] == "step limit" and ORDER["easier"][-2] == "remove object"
    env = HouseholdEnv()
    for task in _pool()[:12]:
        kinds = [e.kind for e in env.edits(task.spec, "easier")]
        first_round = list(dict.fromkeys(kinds))
        assert first_round == sorted(first_round, key=ORDER["easier"].index)
        assert kinds[0] == "start holding"

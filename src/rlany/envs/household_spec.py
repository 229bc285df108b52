"""The shape of a household spec (`HouseholdEnv.validate`, before any plan is searched).

    rooms          room -> receptacles [{name, type, closed?, contents?}]
    start_room     the room the robot starts in
    start_at       optional: a receptacle of the start room the robot starts at
    start_holding  optional: objects the robot starts holding (in no receptacle)
    goal           {kind, object, target?}
    hint, max_steps, seed

`start_at` and `start_holding` let a task begin further along its own shortest plan (the
tail-first edits of `household_edits`: "start holding X", "start at R"); without them the
robot starts in `start_room`, at no receptacle, holding nothing.
"""

from __future__ import annotations

from rlany.envs.household_world import KINDS, OBJECTS, RECEPTACLES, type_of

KEYS = {"rooms", "start_room", "start_at", "start_holding", "goal", "hint", "max_steps", "seed"}


def check_shape(spec: dict) -> list[str]:
    """What is wrong with the spec's shape (empty: well-formed)."""
    if not isinstance(spec, dict):
        return ["spec must be an object"]
    problems = []
    rooms, goal = spec.get("rooms"), spec.get("goal")
    if not isinstance(rooms, dict) or not rooms:
        return ["spec.rooms must be a non-empty object of room -> receptacles"]
    if spec.get("start_room") not in rooms:
        problems.append("spec.start_room must name a room")
    names, objects = set(), []
    for room, recs in rooms.items():
        if not isinstance(recs, list):
            problems.append(f"rooms.{room} must be a list")
            continue
        for r in recs:
            if not isinstance(r, dict) or not isinstance(r.get("name"), str) or \
                    r.get("type") not in RECEPTACLES or type_of(r["name"]) != r["type"]:
                problems.append(f"rooms.{room}: bad receptacle {str(r)[:80]}")
                continue
            if r["name"] in names:
                problems.append(f"duplicate receptacle {r['name']}")
            names.add(r["name"])
            contents = r.get("contents", [])
            if not isinstance(contents, list) or not all(
                    isinstance(o, str) and type_of(o) in OBJECTS for o in contents):
                problems.append(f"{r['name']}: contents must be known objects")
            else:
                objects += contents
    problems += _start_state(spec, rooms, objects)
    if not isinstance(goal, dict) or goal.get("kind") not in KINDS:
        return problems + [f"spec.goal.kind must be one of {', '.join(KINDS)}"]
    if goal.get("object") not in OBJECTS:
        problems.append("spec.goal.object must be a known object type")
    if goal["kind"] not in ("pick", "look_at_in_light") and goal.get("target") not in RECEPTACLES:
        problems.append("spec.goal.target must be a receptacle type")
    steps = spec.get("max_steps", 20)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 100:
        problems.append("spec.max_steps must be an integer in 1..100")
    unknown = set(spec) - KEYS
    if unknown:
        problems.append(f"unknown spec keys {sorted(unknown)}")
    return problems


def _start_state(spec: dict, rooms: dict, objects: list[str]) -> list[str]:
    """start_at: a receptacle of the start room; start_holding: known objects, each in no
    receptacle (an object is in one place: a receptacle or the robot's hands)."""
    problems = []
    at = spec.get("start_at")
    if at is not None:
        here = rooms.get(spec.get("start_room"))
        if not isinstance(at, str) or not isinstance(here, list) or not any(
                isinstance(r, dict) and r.get("name") == at for r in here):
            problems.append("spec.start_at must name a receptacle of the start room")
    held = spec.get("start_holding", [])
    if not isinstance(held, list) or not all(
            isinstance(o, str) and type_of(o) in OBJECTS for o in held):
        return problems + ["spec.start_holding must be a list of known objects"]
    if len(objects + held) != len(set(objects + held)):
        problems.append("an object is in two places")
    return problems

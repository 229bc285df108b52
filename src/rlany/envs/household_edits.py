"""Small rewrites of a household task that make it harder or easier (`HouseholdEnv.edits`).

DESIGN §4: at small scale a task rewrite is picked from env-provided edits (the reference
swaps object/receptacle types for ALFWorld). Candidates, each one short line a small model
can read:
    goal object: apple -> mug          goal receptacle: shelf -> fridge
    goal kind: pick_and_place -> heat_and_place
    move apple 1: table 1 -> drawer 2  close drawer 1 / open drawer 1
    add pen 2 to shelf 1 / remove pen 1
    add drawer 3 to the kitchen / remove drawer 3
    add room bedroom (shelf 2, cabinet 4) / remove room bedroom
    start room: kitchen -> bedroom     step limit: 12 -> 9
Each candidate is measured by its difficulty key (d, size, -max_steps): d the length of a
shortest plan from the start (`household_plan`), size the count of rooms, receptacles and
objects. "harder" keeps candidates whose key is larger (a longer shortest plan, or an
equal one in a larger world or with fewer steps allowed), "easier" those whose key is
smaller. A candidate whose plan would not fit the step limit raises the limit by as much
(keeping the old slack, said in its description). At most 8 are returned, taking the
biggest move of each kind of edit in turn; every one passes `HouseholdEnv.validate`, and
the list depends only on the spec (choices are seeded by a hash of it).
"""

from __future__ import annotations

import json
import random
import zlib
from copy import deepcopy

from rlany.envs.household import (
    APPLIANCE,
    KINDS,
    OBJECTS,
    OPENABLE,
    RECEPTACLES,
    ROOMS,
    HouseholdEnv,
    _check_shape,
    _type,
    expert_actions,
)

MAX_EDITS = 8
PLACE_TARGETS = tuple(r for r in RECEPTACLES if r not in ("desklamp", "sinkbasin"))


def edits(spec: dict, direction: str) -> list:
    from rlany.envs import Edit

    if direction not in ("harder", "easier"):
        raise ValueError(f"direction must be harder or easier, got {direction!r}")
    env = HouseholdEnv()
    if env.validate(spec):
        return []
    d = len(expert_actions(spec))
    base = _key(spec, d)
    sign = 1 if direction == "harder" else -1
    rng = random.Random(zlib.crc32(json.dumps(spec, sort_keys=True).encode()))
    by_group: dict[str, list] = {}
    for group, text, new in _candidates(spec, rng):
        plan = expert_actions(new) if not _check_shape(new) else None
        if not plan:
            continue
        text, new = _fit_steps(text, new, len(plan), spec.get("max_steps", 20) - d)
        key = _key(new, len(plan))
        if (key > base) - (key < base) == sign and new != spec:
            move = tuple(abs(a - b) for a, b in zip(key, base))
            by_group.setdefault(group, []).append((move, text, new))
    queues = [sorted(c) for c in by_group.values()]  # the gentlest move of each group first
    out: list = []
    while len(out) < MAX_EDITS and any(queues):
        for q in queues:
            if q and len(out) < MAX_EDITS:
                _, text, new = q.pop(0)
                if not env.validate(new):
                    out.append(Edit(description=text, spec=new))
    return out


def difficulty(spec: dict) -> dict[str, float]:
    """The difficulty key as named numbers (`MeasuresDifficulty`); {} for a spec without
    a plan."""
    plan = expert_actions(spec) if not _check_shape(spec) else None
    if not plan:
        return {}
    d, size, neg_steps = _key(spec, len(plan))
    return {"plan_length": d, "size": size, "max_steps": -neg_steps}


def _key(spec: dict, d: int) -> tuple[int, int, int]:
    rooms = spec["rooms"]
    size = len(rooms) + sum(len(recs) + sum(len(r.get("contents", [])) for r in recs)
                            for recs in rooms.values())
    return d, size, -spec.get("max_steps", 20)


def _fit_steps(text: str, spec: dict, d: int, slack: int) -> tuple[str, dict]:
    limit = spec.get("max_steps", 20)
    if d <= limit:
        return text, spec
    new_limit = min(100, d + max(0, slack))
    return f"{text}; step limit {limit} -> {new_limit}", {**spec, "max_steps": new_limit}


def _recs(spec: dict) -> list[tuple[str, dict]]:
    return [(room, r) for room, recs in spec["rooms"].items() for r in recs]


def _free(spec: dict, kind: str, objects: bool, taken: tuple = ()) -> str:
    used = {o for _, r in _recs(spec) for o in r.get("contents", [])} if objects else \
        {r["name"] for _, r in _recs(spec)}
    used.update(taken)
    k = 1
    while f"{kind} {k}" in used:
        k += 1
    return f"{kind} {k}"


def _candidates(spec: dict, rng: random.Random):
    """(group, description, new spec) for every edit this module knows, in a fixed order."""
    goal, recs = spec["goal"], _recs(spec)
    present_objs = sorted({_type(o) for _, r in recs for o in r.get("contents", [])})
    present_recs = sorted({r["type"] for _, r in recs})
    for obj in present_objs:
        if obj != goal["object"]:
            yield "object", f"goal object: {goal['object']} -> {obj}", \
                _with_goal(spec, object=obj)
    if goal.get("target"):
        for t in present_recs:
            if t != goal["target"] and t in PLACE_TARGETS:
                yield "target", f"goal receptacle: {goal['target']} -> {t}", \
                    _with_goal(spec, target=t)
    yield from _kind_changes(spec, present_recs, rng)
    yield from _layout_changes(spec, rng)
    for room in spec["rooms"]:
        if room != spec["start_room"]:
            yield "start", f"start room: {spec['start_room']} -> {room}", \
                {**deepcopy(spec), "start_room": room}
    limit = spec.get("max_steps", 20)
    for new_limit in (limit - max(1, limit // 4), limit + max(2, limit // 4)):
        if 1 <= new_limit <= 100:
            yield "steps", f"step limit: {limit} -> {new_limit}", {**deepcopy(spec),
                                                                    "max_steps": new_limit}


def _with_goal(spec: dict, **goal) -> dict:
    new = deepcopy(spec)
    new["goal"] = {k: v for k, v in {**new["goal"], **goal}.items() if v is not None}
    return new


def _kind_changes(spec: dict, present_recs: list[str], rng: random.Random):
    goal = spec["goal"]
    kind = goal["kind"]
    targets = [t for t in present_recs if t in PLACE_TARGETS]
    target = goal.get("target") or (rng.choice(targets) if targets else None)
    for new_kind in KINDS:
        if new_kind == kind:
            continue
        if APPLIANCE.get(new_kind) and APPLIANCE[new_kind] not in present_recs:
            continue
        free = new_kind in ("pick", "look_at_in_light")
        if not free and target is None:
            continue
        yield "kind", f"goal kind: {kind} -> {new_kind}", _with_goal(
            spec, kind=new_kind, target=None if free else target)


def _layout_changes(spec: dict, rng: random.Random):
    """Moves, open/close, distractors, receptacles and rooms added or removed."""
    goal_obj = spec["goal"]["object"]
    recs = _recs(spec)
    holders = [r["name"] for _, r in recs if r["type"] != "desklamp"]
    for _, r in recs:
        for o in r.get("contents", []):
            if _type(o) == goal_obj:
                for dest in holders:
                    if dest != r["name"]:
                        yield "move", f"move {o}: {r['name']} -> {dest}", \
                            _edit(spec, lambda x, o=o, dest=dest: _move(x, o, dest))
            else:
                yield "distractor-", f"remove {o}", _edit(
                    spec, lambda x, o=o: _find(x, o)["contents"].remove(o))
        if r["type"] in OPENABLE:
            verb = "open" if r.get("closed") else "close"
            yield "closed", f"{verb} {r['name']}", _edit(
                spec, lambda x, n=r["name"], c=verb == "close": _rec(x, n).update(closed=c))
        if not r.get("contents"):
            yield "receptacle-", f"remove {r['name']}", _edit(
                spec, lambda x, n=r["name"]: _drop_rec(x, n))
    if holders:
        obj = rng.choice([o for o in OBJECTS if o != goal_obj])
        name, dest = _free(spec, obj, objects=True), rng.choice(holders)
        yield "distractor+", f"add {name} to {dest}", _edit(
            spec, lambda x: _rec(x, dest).setdefault("contents", []).append(name))
    room = rng.choice(sorted(spec["rooms"]))
    kind = rng.choice(RECEPTACLES)
    name = _free(spec, kind, objects=False)
    yield "receptacle+", f"add {name} to the {room}", _edit(
        spec, lambda x: x["rooms"][room].append({"name": name, "type": kind, "contents": []}))
    new_rooms = [r for r in ROOMS if r not in spec["rooms"]]
    if new_rooms:
        room = rng.choice(new_rooms)
        first = _free(spec, rng.choice(PLACE_TARGETS), objects=False)
        second = _free(spec, rng.choice(PLACE_TARGETS), objects=False, taken=(first,))
        added = [{"name": n, "type": _type(n), "contents": []} for n in (first, second)]
        yield "room+", f"add room {room} ({first}, {second})", _edit(
            spec, lambda x: x["rooms"].update({room: added}))
    for room in spec["rooms"]:
        if room != spec["start_room"]:
            yield "room-", f"remove room {room}", _edit(spec, lambda x, r=room: x["rooms"].pop(r))


def _edit(spec: dict, change) -> dict:
    new = deepcopy(spec)
    change(new)
    return new


def _rec(spec: dict, name: str) -> dict:
    return next(r for _, r in _recs(spec) if r["name"] == name)


def _find(spec: dict, obj: str) -> dict:
    return next(r for _, r in _recs(spec) if obj in r.get("contents", []))


def _move(spec: dict, obj: str, dest: str) -> None:
    _find(spec, obj)["contents"].remove(obj)
    _rec(spec, dest).setdefault("contents", []).append(obj)


def _drop_rec(spec: dict, name: str) -> None:
    for recs in spec["rooms"].values():
        recs[:] = [r for r in recs if r["name"] != name]

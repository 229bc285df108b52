"""Small rewrites of a household task that make it harder or easier (`HouseholdEnv.edits`).

DESIGN §4: at small scale a task rewrite is picked from env-provided edits. By default every
edit keeps the goal's kind: the paper's reference code (Gen-Verse/Open-AgentRL,
sample/alfworld_rl_rollout.py) lets its rewriter change only the goal's object and
receptacle ("the overall framework of the goal cannot be changed"); here the slot edits
(goal object, goal receptacle) may change the goal's wording, no other edit touches the
goal. Candidates, each one short line a small model can read, by kind:
    start holding   start holding apple 1 at table 1      (the tail after the plan's take)
    start at        start at table 1                       (the tail after its go-tos)
    open / close    open drawer 1 / close drawer 1
    goal object     goal object: apple -> mug
    goal receptacle goal receptacle: shelf -> fridge
    move            move apple 1: table 1 -> drawer 2
    add / remove    add pen 2 to shelf 1 / remove pen 1, add drawer 3 to the kitchen /
                    remove drawer 3, add room bedroom (shelf 2, cabinet 4) / remove room bedroom
    start room      start room: kitchen -> bedroom
    step limit      step limit: 12 -> 9
    goal kind       goal kind: pick_and_place -> heat_and_place   (opt-in: `allow`)
The tail-first edits ("start holding", "start at") start the robot further along the task's
own shortest plan: the new task's shortest plan is exactly that plan's tail, in the same
world and wording. Each candidate is measured by its difficulty key (d, size, -max_steps):
d the length of a shortest plan from the start (`household_plan`), size the count of rooms,
receptacles and objects (held ones included). "harder" keeps candidates whose key is larger
(a longer shortest plan, or an equal one in a larger world or with fewer steps allowed),
"easier" those whose key is smaller. A candidate whose plan would not fit the step limit
raises the limit by as much (keeping the old slack, said in its description).

At most 8 are returned, dealt round-robin over the kinds in `ORDER[direction]` (the
plan-shortening ones first when easier; "remove" and "step limit", which leave the plan as
it is, last), the gentlest move of each kind first; every one passes `HouseholdEnv.validate`,
and the list depends only on the specs (choices are seeded by a hash of them).

From the root (`root`): the edits of an adapted task are made from its original task, so
edits never stack. Toward the root (a harder step of an easier rewrite, or an easier step of
a harder one) the menu steps back: the root itself first, then the root's edits between the
two; away from it, the root's edits beyond the adapted task (easier than an easier rewrite).
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable, Collection
from copy import deepcopy
from typing import Any

from rlany.envs.household_plan import start_plan
from rlany.envs.household_spec import check_shape
from rlany.envs.household_world import (
    APPLIANCE,
    KINDS,
    OBJECTS,
    OPENABLE,
    OPT_IN_EDITS,
    RECEPTACLES,
    ROOMS,
    type_of,
)
from rlany.files.records import Task

MAX_EDITS = 8
PLACE_TARGETS = tuple(r for r in RECEPTACLES if r not in ("desklamp", "sinkbasin"))
BACK = "back to the original"  # the harder step of an adapted task all the way to its root
OPT_IN = OPT_IN_EDITS  # kinds offered only when asked (`allow`): they change the goal
ORDER = {  # the order kinds of edit are dealt in; a kind not listed comes before the last two
    "easier": (BACK, "start holding", "start at", "open", "goal object", "goal receptacle",
               "goal kind", "move", "start room", "remove room", "remove receptacle",
               "remove object", "step limit"),
    "harder": (BACK, "goal object", "goal receptacle", "goal kind", "close", "move",
               "add object", "add receptacle", "add room", "start room", "step limit"),
}


def edits(spec: dict, direction: str, root: dict | None = None,
          allow: Collection[str] = (), *, new_env: Callable[[], Any]) -> list:
    """Up to MAX_EDITS edits of `spec` (or, with `root`, of its original task) that move it
    in `direction`; `allow` names opt-in kinds (OPT_IN) to offer too. `new_env` makes a
    fresh `HouseholdEnv`, which validates and plays the edits (passed in: the env imports
    this module, not the reverse)."""

    from rlany.envs import Edit

    if direction not in ("harder", "easier"):
        raise ValueError(f"direction must be harder or easier, got {direction!r}")
    env = new_env()
    source = spec if root is None else root
    if env.validate(spec) or env.validate(source):
        return []
    here = _key(spec, len(start_plan(new_env(), spec)))
    top = None if root is None else _key(root, len(start_plan(new_env(), root)))
    sign = 1 if direction == "harder" else -1
    rng = random.Random(zlib.crc32(json.dumps(source, sort_keys=True).encode()))
    slack = source.get("max_steps", 20) - len(start_plan(new_env(), source))
    # toward the root (a harder step of an easier rewrite, or the reverse): the root first,
    # then its edits between the two; away from it, the root's edits beyond the rewrite
    toward = top is not None and (top > here) - (top < here) == sign
    by_group: dict[str, list] = {}
    if toward and root != spec:
        by_group[BACK] = [((0,), "back to the original task", deepcopy(root))]
    for group, text, new in _candidates(source, rng, new_env):
        if group in OPT_IN and group not in allow:
            continue
        plan = start_plan(new_env(), new) if not check_shape(new) else None
        if not plan:
            continue
        text, new = _fit_steps(text, new, len(plan), slack)
        key = _key(new, len(plan))
        between = not toward or (key < top if sign > 0 else key > top)
        if (key > here) - (key < here) == sign and between and new != spec:
            move = tuple(abs(a - b) for a, b in zip(key, here))
            by_group.setdefault(group, []).append((move, text, new))
    queues = [(g, sorted(c, key=lambda x: x[:2])) for g, c in
              sorted(by_group.items(), key=lambda kv: _rank(direction, kv[0]))]
    out: list = []
    while len(out) < MAX_EDITS and any(q for _, q in queues):
        for group, q in queues:
            if q and len(out) < MAX_EDITS:
                _, text, new = q.pop(0)
                if not env.validate(new):
                    out.append(Edit(description=text, spec=new, kind=group))
    return out


def _rank(direction: str, group: str) -> int:
    order = ORDER[direction]
    return order.index(group) if group in order else len(order) - 2


def difficulty(spec: dict, *, new_env: Callable[[], Any]) -> dict[str, float]:
    """The difficulty key as named numbers (`MeasuresDifficulty`); {} for a spec without
    a plan."""
    plan = start_plan(new_env(), spec) if not check_shape(spec) else None
    if not plan:
        return {}
    d, size, neg_steps = _key(spec, len(plan))
    return {"plan_length": d, "size": size, "max_steps": -neg_steps}


def _key(spec: dict, d: int) -> tuple[int, int, int]:
    rooms = spec["rooms"]
    size = len(rooms) + len(spec.get("start_holding", [])) + sum(
        len(recs) + sum(len(r.get("contents", [])) for r in recs) for recs in rooms.values())
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


def _candidates(spec: dict, rng: random.Random, new_env: Callable[[], Any]):
    """(group, description, new spec) for every edit this module knows, in a fixed order."""
    goal, recs = spec["goal"], _recs(spec)
    present_objs = sorted({type_of(o) for _, r in recs for o in r.get("contents", [])})
    present_recs = sorted({r["type"] for _, r in recs})
    for obj in present_objs:
        if obj != goal["object"]:
            yield "goal object", f"goal object: {goal['object']} -> {obj}", \
                _with_goal(spec, object=obj)
    if goal.get("target"):
        for t in present_recs:
            if t != goal["target"] and t in PLACE_TARGETS:
                yield "goal receptacle", f"goal receptacle: {goal['target']} -> {t}", \
                    _with_goal(spec, target=t)
    yield from _kind_changes(spec, present_recs, rng)
    yield from _layout_changes(spec, rng)
    yield from _tail_starts(spec, new_env)
    for room in spec["rooms"]:
        if room != spec["start_room"]:
            moved = {k: v for k, v in deepcopy(spec).items() if k != "start_at"}
            yield "start room", f"start room: {spec['start_room']} -> {room}", \
                {**moved, "start_room": room}
    limit = spec.get("max_steps", 20)
    for new_limit in (limit - max(1, limit // 4), limit + max(2, limit // 4)):
        if 1 <= new_limit <= 100:
            yield "step limit", f"step limit: {limit} -> {new_limit}", {**deepcopy(spec),
                                                                    "max_steps": new_limit}


def _tail_starts(spec: dict, new_env: Callable[[], Any]):
    """The tail-first edits: the state after a prefix of the task's own shortest plan, as a
    start. "start at R": after its first go-tos (R a receptacle reached before anything
    else is done); "start holding X at R": after its first take (receptacles the prefix
    opened stay open, said in the description). The new task's shortest plan is the plan's
    tail: the plan's state was already one on a shortest path."""
    plan = start_plan(new_env(), spec)
    if not plan:
        return
    env = new_env()
    env.reset(Task(task_id="tail", env="household", spec=spec, prompt=""), label=False)
    opened: list[str] = []
    for action in plan[:-1]:  # a tail of at least one action stays
        env.step(action)
        if action.startswith("open "):
            opened.append(action[5:])
        elif action.startswith("go to ") and env.at and not opened and \
                env.holding == spec.get("start_holding", []):
            yield "start at", f"start at {env.at}", _started(spec, env, [])
        elif action.startswith("take "):
            also = f", {' and '.join(opened)} open" if opened else ""
            yield "start holding", f"start holding {action[5:].split(' from ')[0]} at " \
                f"{env.at}{also}", _started(spec, env, opened)
            return
        elif not action.startswith("go to "):
            return  # a state the spec cannot state (an object cleaned, heated, ...)


def _started(spec: dict, env: Any, opened: list[str]) -> dict:
    """`spec` starting in the (household) env's current room and position, holding what it
    holds."""
    new = deepcopy(spec)
    new.update(start_room=env.room, start_at=env.at)
    if env.holding:
        new["start_holding"] = list(env.holding)
    for _, r in _recs(new):
        if "contents" in r:
            r["contents"] = [o for o in r["contents"] if o not in env.holding]
        if r["name"] in opened:
            r.pop("closed", None)
    return new


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
        yield "goal kind", f"goal kind: {kind} -> {new_kind}", _with_goal(
            spec, kind=new_kind, target=None if free else target)


def _layout_changes(spec: dict, rng: random.Random):
    """Moves, open/close, distractors, receptacles and rooms added or removed."""
    goal_obj = spec["goal"]["object"]
    recs = _recs(spec)
    holders = [r["name"] for _, r in recs if r["type"] != "desklamp"]
    for _, r in recs:
        for o in r.get("contents", []):
            if type_of(o) == goal_obj:
                for dest in holders:
                    if dest != r["name"]:
                        yield "move", f"move {o}: {r['name']} -> {dest}", \
                            _edit(spec, lambda x, o=o, dest=dest: _move(x, o, dest))
            else:
                yield "remove object", f"remove {o}", _edit(
                    spec, lambda x, o=o: _find(x, o)["contents"].remove(o))
        if r["type"] in OPENABLE:
            verb = "open" if r.get("closed") else "close"
            yield verb, f"{verb} {r['name']}", _edit(
                spec, lambda x, n=r["name"], c=verb == "close": _rec(x, n).update(closed=c))
        if not r.get("contents"):
            yield "remove receptacle", f"remove {r['name']}", _edit(
                spec, lambda x, n=r["name"]: _drop_rec(x, n))
    if holders:
        obj = rng.choice([o for o in OBJECTS if o != goal_obj])
        name, dest = _free(spec, obj, objects=True), rng.choice(holders)
        yield "add object", f"add {name} to {dest}", _edit(
            spec, lambda x: _rec(x, dest).setdefault("contents", []).append(name))
    room = rng.choice(sorted(spec["rooms"]))
    kind = rng.choice(RECEPTACLES)
    name = _free(spec, kind, objects=False)
    yield "add receptacle", f"add {name} to the {room}", _edit(
        spec, lambda x: x["rooms"][room].append({"name": name, "type": kind, "contents": []}))
    new_rooms = [r for r in ROOMS if r not in spec["rooms"]]
    if new_rooms:
        room = rng.choice(new_rooms)
        first = _free(spec, rng.choice(PLACE_TARGETS), objects=False)
        second = _free(spec, rng.choice(PLACE_TARGETS), objects=False, taken=(first,))
        added = [{"name": n, "type": type_of(n), "contents": []} for n in (first, second)]
        yield "add room", f"add room {room} ({first}, {second})", _edit(
            spec, lambda x: x["rooms"].update({room: added}))
    for room in spec["rooms"]:
        if room != spec["start_room"]:
            yield "remove room", f"remove room {room}", _edit(
                spec, lambda x, r=room: x["rooms"].pop(r))


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

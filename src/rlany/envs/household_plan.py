"""Exact shortest plans in the household world: breadth-first search on the goal's state.

d(s) is the fewest actions from state s to a state where the goal holds. The world is
deterministic, so the action taken in s (leading to s') lies on a shortest plan to the goal
exactly when d(s') = d(s) - 1; `HouseholdEnv.step` labels every step that way
(info["label"] = +1, else -1: a no-op, a detour, an unparseable response).

The search runs on the part of the state the goal depends on, which keeps d exact:
* objects of other types than the goal's (distractors) never matter: moving them changes
  no precondition of an action on a goal object and nothing the goal checks;
* closing never shortens a plan, and opening helps only a receptacle that holds a goal-type
  object or has the target's type;
* a shortest plan puts a goal object only into a target-type receptacle (holding is
  unlimited: dropping a put elsewhere and its later take leaves a shorter valid plan), and
  goes only to receptacles where one of these actions can happen.
A state is (room, position, which of those receptacles are closed, where each goal-type
object is (a receptacle, or "" when held), whether it has the goal's state (clean, hot,
cool), whether the desklamp was used while holding one). tests/test_household.py checks d
against a search over the whole state on small worlds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rlany.envs.household_world import APPLIANCE, OPENABLE, STATE, type_of
from rlany.files.records import Task

HELD = ""
VERB = {"sinkbasin": "clean", "microwave": "heat", "fridge": "cool"}
PLACE_FREE = ("pick", "look_at_in_light")  # goal kinds without a target receptacle


@dataclass(frozen=True)
class _World:
    kind: str
    need: int  # goal objects that must lie in one target receptacle
    state: str | None  # the state a delivered object needs (clean/hot/cool), if any
    target: str | None  # the target receptacle type
    appliance: str | None
    names: tuple[str, ...]  # the goal-type objects, in a fixed order
    types: dict  # receptacle name -> type
    rooms: tuple[str, ...]
    visit: dict  # room -> receptacles worth going to there


def _snapshot(env) -> tuple[_World, tuple]:
    """The search's world and start state from a reset HouseholdEnv."""
    goal = env.spec["goal"]
    kind, obj = goal["kind"], goal["object"]
    target = goal.get("target") if kind not in PLACE_FREE else None
    appliance = APPLIANCE.get(kind)
    types, located = {}, {}
    for recs in env.rooms.values():
        for name, rec in recs.items():
            types[name] = rec["type"]
            located.update({o: name for o in rec["contents"] if type_of(o) == obj})
    located.update({o: HELD for o in env.holding if type_of(o) == obj})
    names = tuple(sorted(located))
    relevant = {loc for loc in located.values() if loc} | {
        n for n, t in types.items() if t == target}
    useful = relevant | {n for n, t in types.items() if t == appliance}
    visit = {room: tuple(n for n in recs if n in useful) for room, recs in env.rooms.items()}
    world = _World(kind=kind, need=2 if kind == "pick_two" else 1, state=STATE.get(kind),
                   target=target, appliance=appliance, names=names, types=types,
                   rooms=tuple(env.rooms), visit=visit)
    closed = frozenset(n for recs in env.rooms.values() for n, rec in recs.items()
                       if rec["closed"] and n in relevant)
    objs = tuple((located[o], world.state in env.states.get(o, ())) for o in names)
    lamp = any(type_of(o) == obj for o in (env.lamp_used_with or "").split(","))
    return world, (env.room, env.at, closed, objs, lamp)


def _moves(w: _World, s: tuple):
    """(action text, next state) for every action a shortest plan may take in s."""
    room, at, closed, objs, lamp = s
    for r in w.rooms:
        if r != room:
            yield f"go to {r}", (r, None, closed, objs, False)
    for x in w.visit[room]:
        if x != at:
            yield f"go to {x}", (room, x, closed, objs, lamp)
    if at is None:
        return
    kind = w.types[at]
    if at in closed:
        if kind in OPENABLE:
            yield f"open {at}", (room, at, closed - {at}, objs, lamp)
    else:
        for i, (loc, done) in enumerate(objs):
            if loc == at:
                yield f"take {w.names[i]} from {at}", (room, at, closed,
                                                       _set(objs, i, (HELD, done)), lamp)
            elif loc == HELD and kind == w.target:
                yield f"put {w.names[i]} in/on {at}", (room, at, closed,
                                                       _set(objs, i, (at, done)), lamp)
    if w.state and kind == w.appliance:
        for i, (loc, done) in enumerate(objs):
            if loc == HELD and not done:
                yield f"{VERB[kind]} {w.names[i]} with {at}", (room, at, closed,
                                                               _set(objs, i, (HELD, True)), lamp)
    if kind == "desklamp" and w.kind == "look_at_in_light":
        yield f"use {at}", (room, at, closed, objs, any(loc == HELD for loc, _ in objs))


def _set(objs: tuple, i: int, value: tuple) -> tuple:
    return objs[:i] + (value,) + objs[i + 1:]


def _goal(w: _World, s: tuple) -> bool:
    objs = s[3]
    if w.kind == "pick":
        return any(loc == HELD for loc, _ in objs)
    if w.kind == "look_at_in_light":
        return s[4]
    count: dict[str, int] = {}
    for loc, done in objs:
        if loc and w.types[loc] == w.target and (w.state is None or done):
            count[loc] = count.get(loc, 0) + 1
    return any(c >= w.need for c in count.values())


def shortest_plan(env) -> list[str] | None:
    """A shortest action list from the env's current state to the goal (None: unreachable)."""
    world, start = _snapshot(env)
    if _goal(world, start):
        return []
    parent: dict[tuple, tuple | None] = {start: None}
    frontier = deque([start])
    while frontier:
        s = frontier.popleft()
        for action, t in _moves(world, s):
            if t in parent:
                continue
            parent[t] = (s, action)
            if _goal(world, t):  # breadth-first: the first goal state found is nearest
                plan = []
                while parent[t] is not None:
                    t, a = parent[t]
                    plan.append(a)
                return plan[::-1]
            frontier.append(t)
    return None


def distance(env) -> int | None:
    """d(s): the length of a shortest plan from the env's current state (None: no plan)."""
    plan = shortest_plan(env)
    return None if plan is None else len(plan)


def start_plan(env, spec: dict) -> list[str] | None:
    """A shortest plan from the start of `spec`, `env` (a fresh `HouseholdEnv`) reset to
    it; None: no plan."""
    env.reset(Task(task_id="expert", env="household", spec=spec, prompt=""), label=False)
    return shortest_plan(env)

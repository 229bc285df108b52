"""`household`: a multi-turn text world in the spirit of ALFWorld, generated offline.

A world has rooms; each room has receptacles (countertop 1, fridge 1, cabinet 2, ...), some
closed; objects (apple 1, mug 2, ...) lie in receptacles. The agent sees its room, where it
stands, what it carries, and a numbered list of admissible actions every turn:

    go to ROOM | go to RECEPTACLE (same room) | open/close RECEPTACLE | take OBJ from RECEPTACLE
    put OBJ in/on RECEPTACLE | clean OBJ with sinkbasin N | heat OBJ with microwave N
    cool OBJ with fridge N | use desklamp N | look | inventory

Goal kinds (ALFWorld's, plus an easy `pick` level to start small models on):
    pick              hold an OBJ
    pick_and_place    put an OBJ in/on a TARGET
    pick_two          put two OBJs in/on a TARGET
    clean_and_place   clean an OBJ (at a sinkbasin), then put it in/on a TARGET
    heat_and_place    heat an OBJ (microwave), then put it ...
    cool_and_place    cool an OBJ (fridge), then put it ...
    look_at_in_light  hold an OBJ and use a desklamp in the same room

A response is mapped to an action: a number picks from the list, else the last non-empty
line is matched: an unambiguous prefix of one action, else the nearest admissible action
by rapidfuzz ratio (cutoff 80); the match and its score are recorded in the step info.
Anything else: "Nothing happens." (text the reading trips over: "Error: ...", `read_action`).

Step labels: every step's info has "label": +1 when the action lies on a shortest plan to
the goal from the state it was taken in (d(s') = d(s) - 1, d from the exact search in
`household_plan`), else -1 (detours, no-ops, unreadable). `eval --judge` measures the judge.

The spec is JSON a rewriter can edit (goal kind, object and target types, hint, layout,
max_steps, and a start state: `start_at` a receptacle, `start_holding` objects, see
`household_spec`); `validate` checks it is well-formed, not already solved and solvable
within max_steps by running a shortest plan (`expert_actions`) through the environment
itself. `edits(spec, direction)` offers up to 8 small rewrites that keep the goal's kind
("start holding mug 1 at drawer 1", "goal object: apple -> mug", "close drawer 1", ...)
whose shortest plan is longer (harder) or shorter (easier), or equal on a larger (smaller)
world; see `household_edits`.
"""

from __future__ import annotations

import random
from copy import deepcopy

from rlany.envs import StepResult, after_first_line, parse_action, read_action
from rlany.envs.household_world import (
    APPLIANCE,
    KINDS,
    OBJECTS,
    OPENABLE,
    OPT_IN_EDITS,
    RECEPTACLES,
    ROOMS,
    STATE,
    type_of,
)
from rlany.errors import RlanyError
from rlany.files.records import Lineage, Task

PROMPT = ("You are a household robot. Each turn, answer with exactly one admissible action, "
          "either its number or its text.")


def goal_text(goal: dict) -> str:
    obj, target, kind = goal["object"], goal.get("target"), goal["kind"]
    a = "an" if obj[0] in "aeiou" else "a"
    return {
        "pick": f"find {a} {obj} and pick it up.",
        "pick_and_place": f"put {a} {obj} in/on the {target}.",
        "pick_two": f"put two {obj}s in/on the {target}.",
        "clean_and_place": f"put a clean {obj} in/on the {target}.",
        "heat_and_place": f"put a hot {obj} in/on the {target}.",
        "cool_and_place": f"put a cool {obj} in/on the {target}.",
        "look_at_in_light": f"look at {a} {obj} under the desklamp.",
    }[kind]


class HouseholdEnv:
    name = "household"

    def __init__(self) -> None:
        self.spec: dict = {}

    # -- protocol ----------------------------------------------------------------------
    def reset(self, task: Task, label: bool = True) -> str:
        problems = self.validate(task.spec, check_solvable=False)
        if problems:
            raise RlanyError(f"bad household spec: {'; '.join(problems)}")
        self.spec = task.spec
        self.rooms = {r: {x["name"]: {"type": x["type"], "closed": bool(x.get("closed")),
                                      "contents": list(x.get("contents", []))}
                          for x in recs} for r, recs in task.spec["rooms"].items()}
        self.room = task.spec["start_room"]
        self.at: str | None = task.spec.get("start_at")  # the tail-first edits' start state
        self.holding: list[str] = list(task.spec.get("start_holding", []))
        self.states: dict[str, set[str]] = {}
        self.lamp_used_with: str | None = None
        self.steps = 0
        self.label = label
        self.dist = self._distance() if label else None  # d(s): steps left on a shortest plan
        return self._observe(f"You are in the {self.room}. Your task is to: "
                             f"{goal_text(task.spec['goal'])}")

    def step(self, response: str) -> StepResult:
        self.steps += 1
        read, why = read_action(parse_action, response, self.admissible())
        action, info = read or (None, {"parse": "error", "invalid_action": why})
        feedback = self._apply(action) if action else f"Error: {why}" if why else \
            "Nothing happens."
        success = self._goal_met()
        if self.label:  # on a shortest plan to the goal: d(s') = d(s) - 1
            before, self.dist = self.dist, 0 if success else self._distance()
            good = before is not None and self.dist is not None and self.dist == before - 1
            info = {**info, "label": 1 if good else -1}
        done = success or self.steps >= self.spec.get("max_steps", 20)
        obs = feedback if done else self._observe(feedback)
        return StepResult(obs=obs, done=done, success=success, action=action, info=info)

    state_key = staticmethod(after_first_line)  # an observation without its feedback line

    def describe(self, task: Task) -> str:
        spec = task.spec
        layout = "; ".join(f"{room}: " + ", ".join(
            f"{r['name']}{' (closed)' if r.get('closed') else ''}"
            + (f" [{', '.join(r['contents'])}]" if r.get("contents") else "")
            for r in recs) for room, recs in spec["rooms"].items())
        hint = f" Hint: {spec['hint']}" if spec.get("hint") else ""
        at = f" at {spec['start_at']}" if spec.get("start_at") else ""
        held = (f", holding {', '.join(spec['start_holding'])}" if spec.get("start_holding")
                else "")
        return (f"Goal: {goal_text(spec['goal'])} The robot starts in the {spec['start_room']}"
                f"{at}{held}."
                f" Layout: {layout}. Step limit: {spec.get('max_steps', 20)}.{hint}")

    def validate(self, spec: dict, check_solvable: bool = True) -> list[str]:
        problems = _check_shape(spec)
        if problems or not check_solvable:
            return problems
        plan = expert_actions(spec)
        if plan is None:
            return ["no plan reaches the goal (missing objects, target or appliance)"]
        if not plan:
            return ["the goal already holds at the start"]
        env = HouseholdEnv()
        env.reset(Task(task_id="validate", env="household", spec=spec, prompt=""), label=False)
        for action in plan:
            result = env.step(action)
            if result.done:
                return [] if result.success else [f"the expert needs more than max_steps "
                                                  f"{spec.get('max_steps', 20)} steps"]
        return ["the expert's plan does not reach the goal"]

    def choices(self) -> list[str]:
        return self.admissible()

    def expert_action(self) -> str | None:
        """The first action of a shortest plan from the current state (None: no plan, or
        the goal already holds): what `rollout --expert` plays."""
        from rlany.envs.household_plan import shortest_plan

        plan = shortest_plan(self)
        return plan[0] if plan else None

    opt_in_edits = OPT_IN_EDITS  # edits that change the goal's kind: offered when allowed
    edits_from_root = True  # an adapted task's edits are made from its original (`root`)

    def edits(self, spec: dict, direction: str, root: dict | None = None,
              allow: tuple[str, ...] = ()) -> list:
        """Small rewrites of a valid spec (or of its original task, `root`) that make it
        harder or easier, each keeping the goal's kind unless `allow` names "goal kind"
        (`household_edits`)."""
        from rlany.envs.household_edits import edits

        return edits(spec, direction, root, allow, new_env=HouseholdEnv)

    def difficulty(self, spec: dict) -> dict[str, float]:
        """plan_length (a shortest plan), size (rooms + receptacles + objects), max_steps."""
        from rlany.envs.household_edits import difficulty

        return difficulty(spec, new_env=HouseholdEnv)

    def _distance(self) -> int | None:
        from rlany.envs.household_plan import distance

        return distance(self)

    # -- mechanics ---------------------------------------------------------------------
    def _recs(self) -> dict:
        return self.rooms[self.room]

    def admissible(self) -> list[str]:
        acts = [f"go to {r}" for r in self.rooms if r != self.room]
        acts += [f"go to {name}" for name in self._recs() if name != self.at]
        if self.at:
            rec = self._recs()[self.at]
            if rec["type"] in OPENABLE:
                acts.append(f"close {self.at}" if not rec["closed"] else f"open {self.at}")
            if not rec["closed"]:
                acts += [f"take {o} from {self.at}" for o in rec["contents"]]
                acts += [f"put {o} in/on {self.at}" for o in self.holding]
            verb = {"sinkbasin": "clean", "microwave": "heat", "fridge": "cool"}.get(rec["type"])
            if verb:
                acts += [f"{verb} {o} with {self.at}" for o in self.holding]
            if rec["type"] == "desklamp":
                acts.append(f"use {self.at}")
        return acts + ["look", "inventory"]

    def _observe(self, feedback: str) -> str:
        where = f"You are at {self.at} in the {self.room}." if self.at else \
            f"You are in the {self.room}."
        seen = []
        for name, rec in self._recs().items():
            if rec["closed"]:
                seen.append(f"{name} (closed)")
            elif rec["contents"]:
                seen.append(f"{name} with {', '.join(rec['contents'])}")
            else:
                seen.append(name)
        carrying = ", ".join(self.holding) or "nothing"
        acts = "\n".join(f"{k + 1}. {a}" for k, a in enumerate(self.admissible()))
        return (f"{feedback}\n{where} You see: {'; '.join(seen)}. You carry: {carrying}.\n"
                f"Admissible actions:\n{acts}")

    def _apply(self, action: str) -> str:
        recs = self._recs()
        if action.startswith("go to "):
            place = action[6:]
            if place in self.rooms:
                self.room, self.at, self.lamp_used_with = place, None, None
                return f"You go to the {place}."
            self.at = place
            rec = recs[place]
            if rec["closed"]:
                return f"You arrive at {place}. It is closed."
            return f"You arrive at {place}. " + (
                f"On it you see {', '.join(rec['contents'])}." if rec["contents"]
                else "You see nothing on it.")
        if action.startswith(("open ", "close ")):
            verb, _, place = action.partition(" ")
            recs[place]["closed"] = verb == "close"
            inside = recs[place]["contents"]
            return f"You {verb} {place}." + (
                f" In it you see {', '.join(inside)}." if verb == "open" and inside else "")
        if action.startswith("take "):
            obj = action[5:].split(" from ")[0]
            recs[self.at]["contents"].remove(obj)
            self.holding.append(obj)
            return f"You pick up the {obj} from the {self.at}."
        if action.startswith("put "):
            obj = action[4:].split(" in/on ")[0]
            self.holding.remove(obj)
            recs[self.at]["contents"].append(obj)
            return f"You put the {obj} in/on the {self.at}."
        for verb, state in (("clean", "clean"), ("heat", "hot"), ("cool", "cool")):
            if action.startswith(verb + " "):
                obj = action[len(verb) + 1:].split(" with ")[0]
                self.states.setdefault(obj, set()).add(state)
                return f"You {verb} the {obj} using the {self.at}."
        if action.startswith("use "):
            self.lamp_used_with = ",".join(self.holding) or "nothing"
            return f"You turn on the {self.at}."
        if action == "inventory":
            return f"You carry: {', '.join(self.holding) or 'nothing'}."
        return "You look around."

    def _goal_met(self) -> bool:
        goal = self.spec["goal"]
        kind, obj = goal["kind"], goal["object"]
        if kind == "pick":
            return any(type_of(o) == obj for o in self.holding)
        if kind == "look_at_in_light":
            return any(type_of(o) == obj for o in (self.lamp_used_with or "").split(","))
        need = 2 if kind == "pick_two" else 1
        state = STATE.get(kind)
        for recs in self.rooms.values():
            for rec in recs.values():
                if rec["type"] != goal["target"]:
                    continue
                good = [o for o in rec["contents"] if type_of(o) == obj
                        and (state is None or state in self.states.get(o, set()))]
                if len(good) >= need:
                    return True
        return False


def _check_shape(spec: dict) -> list[str]:
    """What is wrong with the spec's shape (`household_spec`)."""
    from rlany.envs.household_spec import check_shape

    return check_shape(spec)


def expert_actions(spec: dict) -> list[str] | None:
    """A shortest plan from the start (`household_plan`: exact search); None: no plan."""
    from rlany.envs.household_plan import start_plan

    return start_plan(HouseholdEnv(), spec)


def make_tasks(n: int, seed: int, rooms: int = 1, receptacles: int = 4, distractors: int = 2,
               kinds: str = "pick,pick_and_place", closed: float = 0.3, max_steps: int = 12,
               split: str = "train", prefix: str = "house") -> list[Task]:
    """Random solvable worlds. Knobs: rooms, receptacles per room, distractor objects,
    goal kinds (comma list), probability that an openable receptacle starts closed."""
    chosen = [k.strip() for k in kinds.split(",") if k.strip()]
    if not chosen or set(chosen) - set(KINDS):
        raise RlanyError(f"kinds must be a comma list of {', '.join(KINDS)}")
    if not 1 <= rooms <= len(ROOMS) or receptacles < 2:
        raise RlanyError(f"need 1 <= rooms <= {len(ROOMS)} and receptacles >= 2")
    from rlany.envs import check_knob

    check_knob("receptacles", receptacles, 2, 64)
    check_knob("distractors", distractors, 0, 64)
    check_knob("closed", closed, 0, 1)
    check_knob("max_steps", max_steps, 1)
    rng = random.Random(seed)
    tasks, attempts = [], 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 100 * n:
            raise RlanyError("could not generate solvable worlds with these knobs")
        spec = _random_world(rng, rooms, receptacles, distractors, rng.choice(chosen), closed,
                             max_steps)
        if spec is None or HouseholdEnv().validate(spec):
            continue
        task_id = f"{prefix}-{seed}-{len(tasks):04d}"
        tasks.append(Task(task_id=task_id, env="household", spec=spec,
                          prompt=PROMPT, lineage=Lineage(root_id=task_id), split=split))
    return tasks


def _random_world(rng: random.Random, n_rooms: int, n_recs: int, distractors: int, kind: str,
                  closed: float, max_steps: int) -> dict | None:
    room_names = rng.sample(ROOMS, n_rooms)
    counters: dict[str, int] = {}

    def named(kind_: str) -> str:
        counters[kind_] = counters.get(kind_, 0) + 1
        return f"{kind_} {counters[kind_]}"

    goal_obj = rng.choice(OBJECTS)
    needed = [APPLIANCE[kind]] if kind in APPLIANCE else []
    target = None
    if kind not in ("pick", "look_at_in_light"):
        target = rng.choice([r for r in RECEPTACLES if r not in ("desklamp", "sinkbasin")])
        needed.append(target)
    world: dict[str, list] = {r: [] for r in room_names}
    types = needed + [rng.choice(RECEPTACLES) for _ in range(n_recs * n_rooms - len(needed))]
    rng.shuffle(types)
    for k, t in enumerate(types):
        rec = {"name": named(t), "type": t, "contents": []}
        if t in OPENABLE and rng.random() < closed:
            rec["closed"] = True
        world[room_names[k % n_rooms]].append(rec)
    holders = [r for recs in world.values() for r in recs if r["type"] != "desklamp"]
    sources = [r for r in holders if r["type"] != target]  # the goal must not start done
    if not sources:
        return None  # every holder is the target: no world to make from this draw
    obj_counts: dict[str, int] = {}
    wanted = [goal_obj] * (2 if kind == "pick_two" else 1)
    extra = [rng.choice([o for o in OBJECTS if o != goal_obj]) for _ in range(distractors)]
    for k, obj in enumerate(wanted + extra):
        obj_counts[obj] = obj_counts.get(obj, 0) + 1
        rng.choice(sources if k < len(wanted) else holders)["contents"].append(
            f"{obj} {obj_counts[obj]}")
    spec = {"rooms": world, "start_room": room_names[0],
            "goal": {"kind": kind, "object": goal_obj, **({"target": target} if target else {})},
            "max_steps": max_steps}
    return deepcopy(spec)

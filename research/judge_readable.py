"""Is the env's step label readable from the judge's own prompt on the policy's own steps?
The question behind "the judge stays at chance on the steps it rewards": a learning failure,
or labels its prompt does not determine.

For each judged step of the given loop runs (household "put X in/on the Y" tasks, one room:
`examples/household/mid.toml`), three verdicts against the env's label
(trajectories' `steps[t].info.label`, +1 iff the step lies on a shortest plan):
* the judge's, as the loop rewarded it: the sign of its m samples' sum (ties left out);
* `rule`'s: it reads only the judge prompt's goal line, what the agent saw (the room's
  receptacles, which are closed, the open ones' contents, what it carries) and its
  response, and follows the shortest plans the visible state implies (as the env's
  planner, `rlany.envs.household_plan`, has them: holding is unlimited, other objects never
  matter);
* the outcome's: the episode's success as the verdict (what consistency feedback teaches).
Balanced accuracy of each, overall and by where the goal object is (carried, in view, out
of view: then inside a closed receptacle, where with two closed ones the label depends on
what the prompt does not show).

    python research/judge_readable.py runs/learning-mid-lr1e4/full-warm-s1 [RUN ...] \
        [--name judge-readable-mid]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

WHERE = ("carried", "in view", "out of view")


def _section(prompt: str, title: str) -> str:
    return prompt.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _receptacles(seen: str) -> dict[str, tuple[bool, str]]:
    """name -> (closed, contents) from the observation's "You see: ..." sentence."""
    listing = re.search(r"You see: (.*?)\. You carry:", seen)
    out = {}
    for item in (listing.group(1).split("; ") if listing else []):
        name = re.match(r"\w+ \d+", item).group(0)
        out[name] = ("(closed)" in item, item.split(" with ", 1)[1] if " with " in item else "")
    return out


def _goal(prompt: str) -> tuple[str, str, str] | None:
    """(goal object, target type, what the agent saw) of a put-in/on task's judge prompt."""
    goal = re.search(r"Your task is to: put an? (\w+) in/on the (\w+)\.", prompt)
    if goal is None:
        return None
    return goal.group(1), goal.group(2), _section(prompt, "What the agent saw at this step")


def where(prompt: str) -> str | None:
    """Where the goal object is, as the prompt shows it (None: not a put-in/on task)."""
    goal = _goal(prompt)
    return None if goal is None else _where(goal[0], goal[2])


def _where(obj: str, seen: str) -> str:
    carry = re.search(r"You carry: (.*)", seen).group(1)
    if re.search(rf"\b{obj} \d", carry):
        return "carried"
    return "in view" if re.search(rf"\b{obj} \d", seen) else "out of view"


def rule(prompt: str) -> int | None:
    """+1 / -1 from the prompt alone: the step of the shortest plan the visible state
    implies (None: not a put-in/on task)."""
    goal = _goal(prompt)
    return None if goal is None else _rule(prompt, goal)


def _rule(prompt: str, goal: tuple[str, str, str]) -> int:
    obj, target, seen = goal
    act = _section(prompt, "The agent's response at this step").strip()
    recs = _receptacles(seen)
    at = re.search(r"You are at (\w+ \d+)", seen)
    at = at.group(1) if at else None
    held = re.search(r"You carry: (.*)", seen).group(1)  # what else it holds never matters
    place = _where(obj, seen)
    targets = [r for r in recs if r.split()[0] == target]
    open_targets = [r for r in targets if not recs[r][0]]
    if place == "carried":
        mine = re.search(rf"\b{obj} \d+", held).group(0)
        if at in open_targets:
            return 1 if act == f"put {mine} in/on {at}" else -1
        if at in targets:  # a closed one: open it, or go to an open one (two steps each)
            return 1 if act in {f"open {at}", *(f"go to {r}" for r in open_targets)} else -1
        # an open target is one step nearer than a closed one
        return 1 if act in {f"go to {r}" for r in open_targets or targets} else -1
    if place == "in view":
        holders = [r for r, (_, inside) in recs.items() if re.search(rf"\b{obj} \d", inside)]
    else:  # inside one of the closed receptacles: any of them may be the one
        holders = [r for r, (closed, _) in recs.items() if closed]
    good = set()
    if at in targets and not open_targets:  # opening the target now or later: one plan each
        good.add(f"open {at}")
    if at in holders:
        if place == "out of view":
            good.add(f"open {at}")
        elif act.startswith(f"take {obj} ") and act.endswith(f"from {at}"):
            good.add(act)
    else:
        good |= {f"go to {r}" for r in holders}
    return 1 if act in good else -1


def balanced(pairs: list[tuple[int, int]]) -> float | None:
    """Balanced accuracy of (+1 / -1 verdict, label) pairs (None: a class missing)."""
    from judge_data import balanced_accuracy

    if len({lab for _, lab in pairs}) < 2:
        return None
    return round(balanced_accuracy([lab for _, lab in pairs],
                                   [float(v > 0) for v, _ in pairs], None), 3)


def verdicts(rows: list[dict]) -> list[tuple]:
    """(where, loop judge, rule, label, outcome) of each put-in/on step of `policy_steps`
    rows (the outcome as a verdict: +1 success, else -1)."""
    out = []
    for row in rows:
        prompt = row["messages"][-1]["content"]
        goal = _goal(prompt)  # parsed once for both readings
        if goal is not None:
            out.append((_where(goal[0], goal[2]), row["verdict"], _rule(prompt, goal),
                        row["label"], 1 if row["outcome"] > 0 else -1))
    return out


def table(steps: list[tuple]) -> dict:
    """`verdicts`' steps summarized, all together and by where the goal object is."""
    out = {}
    for key in ("all", *WHERE):
        rows = [s for s in steps if key in ("all", s[0])]
        if rows:
            out[key] = {"steps": len(rows), "share": round(len(rows) / len(steps), 3),
                        "label_positive": round(sum(s[3] > 0 for s in rows) / len(rows), 3),
                        "judge": balanced([(s[1], s[3]) for s in rows if s[1] != 0]),
                        "rule": balanced([(s[2], s[3]) for s in rows]),
                        "outcome": balanced([(s[4], s[3]) for s in rows])}
    return out


def summarize(runs: list[Path]) -> dict:
    from judge_data import policy_steps

    return table(verdicts(policy_steps(runs)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--name", help="write research/results/NAME.json")
    args = ap.parse_args(argv)
    from judge_data import policy_steps

    per_run = {r.name: verdicts(policy_steps([r])) for r in args.runs}  # each read once
    result = {"runs": [str(r) for r in args.runs],
              "by_goal_object": table([s for steps in per_run.values() for s in steps]),
              "by_run": {name: table(steps)["all"] for name, steps in per_run.items()}}
    print(json.dumps({k: result[k] for k in ("by_goal_object", "by_run")}, indent=1))
    if args.name:
        from lab import save
        save(args.name, {"what": "balanced accuracy against the env's step labels on the "
                                 "policy's own judged steps: the judge's verdicts, a rule "
                                 "reading only the judge prompt, the episode outcome",
                         **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())

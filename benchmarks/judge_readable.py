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

    python benchmarks/judge_readable.py runs/learning-mid-lr1e4/full-warm-s1 [RUN ...] \
        [--name judge-readable-mid]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
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


def where(prompt: str) -> str | None:
    """Where the goal object is, as the prompt shows it (None: not a put-in/on task)."""
    goal = re.search(r"Your task is to: put an? (\w+) in/on the (\w+)\.", prompt)
    if goal is None:
        return None
    seen, obj = _section(prompt, "What the agent saw at this step"), goal.group(1)
    carry = re.search(r"You carry: (.*)", seen).group(1)
    if re.search(rf"\b{obj} \d", carry):
        return "carried"
    return "in view" if re.search(rf"\b{obj} \d", seen) else "out of view"


def rule(prompt: str) -> int | None:
    """+1 / -1 from the prompt alone: the step of the shortest plan the visible state
    implies (None: not a put-in/on task)."""
    goal = re.search(r"Your task is to: put an? (\w+) in/on the (\w+)\.", prompt)
    if goal is None:
        return None
    obj, target = goal.groups()
    seen = _section(prompt, "What the agent saw at this step")
    act = _section(prompt, "The agent's response at this step").strip()
    recs = _receptacles(seen)
    at = re.search(r"You are at (\w+ \d+)", seen)
    at = at.group(1) if at else None
    held = re.search(r"You carry: (.*)", seen).group(1)  # what else it holds never matters
    place = where(prompt)
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
    """Mean over the labels +1 and -1 of the verdicts' accuracy (None: a class missing)."""
    per = []
    for cls in (1, -1):
        got = [v == lab for v, lab in pairs if lab == cls]
        if not got:
            return None
        per.append(sum(got) / len(got))
    return round(sum(per) / 2, 3)


def summarize(runs: list[Path]) -> dict:
    from judge_data import policy_steps

    by = defaultdict(list)
    for row in policy_steps(runs):
        prompt = row["messages"][-1]["content"]
        place = where(prompt)
        if place is not None:
            for key in ("all", place):
                by[key].append((prompt, row["verdict"], row["label"],
                                1 if row["outcome"] > 0 else -1))
    out = {}
    for key in ("all", *WHERE):
        rows = by.get(key, [])
        if not rows:
            continue
        out[key] = {"steps": len(rows),
                    "share": round(len(rows) / len(by["all"]), 3),
                    "label_positive": round(sum(r[2] > 0 for r in rows) / len(rows), 3),
                    "judge": balanced([(r[1], r[2]) for r in rows if r[1] != 0]),
                    "rule": balanced([(rule(r[0]), r[2]) for r in rows]),
                    "outcome": balanced([(r[3], r[2]) for r in rows])}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--name", help="write benchmarks/results/NAME.json")
    args = ap.parse_args(argv)
    result = {"runs": [str(r) for r in args.runs], "by_goal_object": summarize(args.runs),
              "by_run": {r.name: summarize([r])["all"] for r in args.runs}}
    print(json.dumps({k: result[k] for k in ("by_goal_object", "by_run")}, indent=1))
    if args.name:
        from common import save
        save(args.name, {"what": "balanced accuracy against the env's step labels on the "
                                 "policy's own judged steps: the judge's verdicts, a rule "
                                 "reading only the judge prompt, the episode outcome",
                         **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())

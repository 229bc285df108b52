"""The judge benchmarks' labelled household steps (judge_capacity.py, judge_heldout.py,
judge_threshold.py): episodes of a seeded expert/random mix in the policy's prompts, each
step in the judge's prompt with the env's label, and the verdict's balanced accuracy.
"""

from __future__ import annotations

import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "examples" / "household" / "learn_tasks.jsonl"
HELD_OUT = ROOT / "examples" / "household" / "learn_eval.jsonl"
P_EXPERT = (0.0, 0.25, 0.5, 0.75, 1.0)


def episodes(tasks_path: Path, per_task: int, seed: int, max_steps: int = 4) -> list:
    """Trajectories of a seeded expert/random mix, in the policy's prompts (`max_steps`:
    the config's horizon, 4 for learn.toml): sample k of a task plays the expert's action
    with probability P_EXPERT[k % 5], else a random admissible one, as `rlany rollout
    --expert --expert-p P` draws them (seeded by seed, task, turn and sample), through
    rollout's own episode code. Each P's rollout plays every sample; sample k is kept from
    its own P's (episodes without a model cost milliseconds). Results made before this
    drew the random actions from one `random.Random(seed)` of the script's: the same mix,
    other episodes."""
    from rlany.api import NoModel, RolloutOptions, make_env, read_tasks, rollout

    tasks = read_tasks(tasks_path)[0]
    engine = NoModel("expert", "judge_data: a seeded expert/random mix")
    played: dict[tuple[str, int], object] = {}
    for i, p in enumerate(P_EXPERT[:per_task]):
        opts = RolloutOptions(n=per_task, max_steps=max_steps, history_turns=1,
                              constrain_actions=True, expert=True, expert_p=p, seed=seed)
        for group in rollout(tasks, engine, make_env, opts, {"p_expert": p}):
            played.update(((t.task_id, t.sample), t) for t in group
                          if t.sample % len(P_EXPERT) == i)
    return [played[(task.task_id, k)] for task in tasks for k in range(per_task)]


def judged_steps(trajectories: list) -> list[dict]:
    """{messages, label, outcome, task} per step, the judge prompt as learn.toml builds it."""
    from rlany.api import step_prompts

    rows = []
    for tr in trajectories:
        for step, messages in zip(tr.steps, step_prompts(tr, 1, 1)):
            rows.append({"messages": messages, "label": int(step.info["label"]),
                         "outcome": tr.outcome, "task": tr.task_id})
    return rows


def encode(tok, rows: list[dict]) -> tuple[list[list[int]], object]:
    from rlany.api import VERDICT_CHOICES, branch, parse_verdict, render

    at = branch(tok, VERDICT_CHOICES, tuple(parse_verdict(c) for c in VERDICT_CHOICES))
    return [render(tok, r["messages"]) + at.prefix for r in rows], at


def balanced_accuracy(labels: list[int], p_pos: list[float], temperature: float | None
                      ) -> float:
    """Mean over the two classes of the verdict's accuracy: greedy (None) or the exact
    expectation of a verdict sampled at `temperature` from q."""
    def correct(label: int, p: float) -> float:
        if temperature is None:
            return float((p > 0.5) == (label > 0))
        z = math.log(max(p, 1e-12)) / temperature, math.log(max(1 - p, 1e-12)) / temperature
        m = max(z)
        pt = math.exp(z[0] - m) / (math.exp(z[0] - m) + math.exp(z[1] - m))
        return pt if label > 0 else 1 - pt
    per = []
    for cls in (1, -1):
        members = [correct(lab, p) for lab, p in zip(labels, p_pos) if lab == cls]
        if members:
            per.append(sum(members) / len(members))
    return sum(per) / len(per)


def policy_steps(runs: list[Path]) -> list[dict]:
    """The policy's own judged steps of loop runs (every `iter_*` with judgments), as
    `judged_steps`' rows plus `verdict`: the sign of the judge's m samples' sum as the loop
    rewarded it (0 for a tie), and `at`: (iteration directory, traj_id, step). Steps without
    an env label or without samples are left out."""
    import json

    rows = []
    for run in runs:
        for it in sorted(Path(run).glob("iter_*")):
            if not (it / "judgments.jsonl").exists():
                continue
            labels, outcome = {}, {}
            for line in (it / "trajectories.jsonl").read_text().splitlines():
                t = json.loads(line)
                outcome[t["traj_id"]] = t["outcome"]
                for k, s in enumerate(t["steps"]):
                    labels[(t["traj_id"], k)] = (s.get("info") or {}).get("label")
            for line in (it / "judgments.jsonl").read_text().splitlines():
                j = json.loads(line)
                for s in j["steps"]:
                    label = labels.get((j["traj_id"], s["step"]))
                    if label is None or not s["samples"]:
                        continue
                    v = sum(x["score"] or 0 for x in s["samples"])
                    rows.append({"messages": s["judge_messages"], "label": int(label),
                                 "outcome": outcome[j["traj_id"]], "task": j["task_id"],
                                 "verdict": (v > 0) - (v < 0),
                                 "at": (str(it), j["traj_id"], s["step"])})
    return rows


def loop_verdict_accuracy(rows: list[dict]) -> float:
    """Balanced accuracy of `policy_steps` rows' own loop verdicts (ties left out)."""
    said = [r for r in rows if r["verdict"] != 0]
    return balanced_accuracy([r["label"] for r in said],
                             [float(r["verdict"] > 0) for r in said], None)

"""What adapt-tasks makes of the rewriter's answers: a proposal read as one of the env's
numbered edits or as a whole new JSON spec (`parse_spec`, then the env's `validate`), and
the candidate task it becomes, with its lineage and why it was proposed. The rules (which
tasks are rewritten, the acceptance rule) are in `rlany.stages.adapt_tasks`."""

from __future__ import annotations

import json
import re

from rlany.envs import Environment
from rlany.prompts import clip
from rlany.records import Lineage, Task

_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


def parse_spec(text: str) -> dict | None:
    """The JSON object in the rewriter's answer: a fenced block, else the last {...}."""
    candidates = _FENCE.findall(text)
    if not candidates:
        depth, start = 0, None
        for k, ch in enumerate(text):
            if ch == "{":
                if depth == 0:
                    start = k
                depth += 1
            elif ch == "}" and depth:
                depth -= 1
                if depth == 0 and start is not None:
                    candidates.append(text[start:k + 1])
    for raw in reversed(candidates):
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def read_proposal(text: str, menu: list | None, env: Environment
                  ) -> tuple[dict | None, str | None, str]:
    """(spec, edit description, why not): an edit number from the menu, or a free rewrite."""
    if menu is not None:
        k = text.strip()
        if not k.isdigit() or not 1 <= int(k) <= len(menu):
            return None, None, f"not one of the {len(menu)} edits: {clip(text, 40)!r}"
        edit = menu[int(k) - 1]
        return edit.spec, edit.description, ""
    spec = parse_spec(text)
    if spec is None:
        return None, None, "no JSON object in the rewrite"
    problems = env.validate(spec)
    if problems:
        return None, None, "invalid spec: " + "; ".join(problems)
    return spec, None, ""


def candidate_task(parent: Task, spec: dict, direction: str, parent_acc: float,
                   critique: str, iteration: int, edit: str | None = None) -> Task:
    """The candidate q' of `parent`: a new version in its lineage, with what `decide` reads
    next iteration (the parent's accuracy now) and why it was proposed."""
    lineage = parent.lineage or Lineage(root_id=parent.task_id)
    version = lineage.version + 1
    return Task(task_id=f"{lineage.root_id}.v{version}.i{iteration}", env=parent.env,
                spec=spec, prompt=parent.prompt, split=parent.split,
                lineage=Lineage(root_id=lineage.root_id, parent_id=parent.task_id,
                                version=version, direction=direction),
                extra={**parent.extra, "candidate": {"parent_acc": parent_acc,
                                                     "proposed_iter": iteration,
                                                     "critique": critique,
                                                     **({"edit": edit} if edit else {})}})

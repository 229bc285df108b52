"""`reasoning`: single-turn exact-answer problems (arithmetic by default, built offline).

spec: `{"question": str, "answer": str}`. The policy answers in one turn; the answer is the
content of the last `\\boxed{}`, else the text after the last "answer:", else the last
number in the response. It is compared as a number when both sides are numbers, else as a
normalized string. The final observation says only that the episode ended: it must not tell
the judge whether the answer was right.

`make_tasks` knobs: `digits` (operand size, 1 = single digits), `terms` (how many operands),
`ops` (a string of + - *). A 135M model needs easy problems to start with: defaults are two
one-digit operands, which SmolLM2-135M solves sometimes but not always.
"""

from __future__ import annotations

import random
import re

from rlany.envs import StepResult
from rlany.errors import RlanyError
from rlany.records import Lineage, Task

PROMPT = "Solve the problem. Give the final answer as a number in \\boxed{}."
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    if boxed:
        return boxed[-1].strip()
    m = list(re.finditer(r"answer\s*(?:is)?\s*[:=]?\s*([^\n]+)", text, re.IGNORECASE))
    if m:
        nums = _NUMBER.findall(m[-1].group(1))
        return nums[0] if nums else m[-1].group(1).strip().rstrip(".")
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def same_answer(got: str | None, want: str) -> bool:
    if got is None:
        return False
    g, w = got.replace(",", "").replace("$", "").strip(), want.strip()
    try:
        return abs(float(g) - float(w)) < 1e-9
    except ValueError:
        return g.lower().rstrip(".") == w.lower().rstrip(".")


class ReasoningEnv:
    name = "reasoning"

    def __init__(self) -> None:
        self.task: Task | None = None

    def reset(self, task: Task) -> str:
        self.task = task
        return task.spec["question"]

    def step(self, response: str) -> StepResult:
        assert self.task is not None, "reset() first"
        got = extract_answer(response)
        ok = same_answer(got, str(self.task.spec["answer"]))
        return StepResult(obs="(the episode has ended)", done=True, success=ok, action=got,
                          info={"answer": got, "parsed": got is not None})

    def describe(self, task: Task) -> str:
        return f"Question: {task.spec['question']}\nAnswer: {task.spec['answer']}"

    def validate(self, spec: dict) -> list[str]:
        problems = []
        if not isinstance(spec.get("question"), str) or not spec.get("question", "").strip():
            problems.append("spec.question must be a non-empty string")
        if not isinstance(spec.get("answer"), (str, int, float)) or str(spec.get("answer")) == "":
            problems.append("spec.answer must be a string or number")
        return problems


def make_tasks(n: int, seed: int, digits: int = 1, terms: int = 2, ops: str = "+",
               split: str = "train", prefix: str = "arith") -> list[Task]:
    if not ops or set(ops) - set("+-*"):
        raise RlanyError(f"ops must be made of + - *, got {ops!r}")
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        nums = [rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)
                for _ in range(terms)]
        expr = str(nums[0])
        for x in nums[1:]:
            expr += f" {rng.choice(ops)} {x}"
        answer = str(eval(expr, {"__builtins__": {}}))  # noqa: S307 - digits and checked ops only
        task_id = f"{prefix}-{seed}-{i:04d}"
        tasks.append(Task(task_id=task_id, env="reasoning",
                          spec={"question": f"What is {expr}?", "answer": answer},
                          prompt=PROMPT, lineage=Lineage(root_id=task_id), split=split))
    return tasks

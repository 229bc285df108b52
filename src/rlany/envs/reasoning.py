"""`reasoning`: single-turn exact-answer problems (arithmetic by default, built offline).

spec: `{"question": str, "answer": str}`. The policy answers in one turn; the answer is the
content of the last `\\boxed{}`, else the text after the last "answer:", else the last
number in the response. It is compared as a number when both sides are numbers, else as a
normalized string; a response that reading trips over (`rlany.envs.read_action`) is a
wrong answer. The final observation says only that the episode ended: it must not tell
the judge whether the answer was right.

`make_tasks` knobs: `digits` (operand size, 1 = single digits), `terms` (how many operands),
`ops` (a string of + - *). A 135M model needs easy problems to start with: defaults are two
one-digit operands, which SmolLM2-135M solves sometimes but not always.

`edits(spec, direction)` rewrites a flat arithmetic question ("What is 3 + 4?"): harder =
one more digit per operand, one more term, or an operator + or - made *; easier = the
reverse (fewer digits, the last term dropped, * or - made +). New operands are drawn from a
generator seeded by the question, so the edits of a spec are always the same; the answer is
recomputed. Other questions get no edits. Single-step: no step labels (the outcome labels
the one step).
"""

from __future__ import annotations

import random
import re
import zlib

from rlany.envs import Edit, StepResult, read_action
from rlany.errors import RlanyError
from rlany.files.records import Lineage, Task

PROMPT = "Solve the problem. Give the final answer as a number in \\boxed{}."
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    boxed = [b for b in re.findall(r"\\boxed\{([^{}]*)\}", text) if b.strip()]
    if boxed:  # an empty \boxed{} answers nothing: it must not hide a number before it
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


def _grade(response: str, answer: str) -> tuple[str | None, bool]:
    """(the answer the response gives, whether it is right)."""
    got = extract_answer(response)
    return got, same_answer(got, answer)


def _arith(expr: str) -> int | None:
    """Evaluate + - * on integers with parentheses, safely (an AST walk, no eval)."""
    import ast

    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b}

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            left, right = walk(node.left), walk(node.right)
            if left is None or right is None or abs(left) > 10**12 or abs(right) > 10**12:
                return None
            return ops[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = walk(node.operand)
            return None if inner is None else -inner
        return None

    return walk(tree)


class ReasoningEnv:
    name = "reasoning"

    def __init__(self) -> None:
        self.task: Task | None = None

    def reset(self, task: Task) -> str:
        self.task = task
        return task.spec["question"]

    def step(self, response: str) -> StepResult:
        assert self.task is not None, "reset() first"
        read, why = read_action(_grade, response, str(self.task.spec["answer"]))
        got, ok = read or (None, False)
        info = {"answer": got, "parsed": got is not None,
                **({"invalid_action": why} if why else {})}
        return StepResult(obs="(the episode has ended)", done=True, success=ok, action=got,
                          info=info)

    def describe(self, task: Task) -> str:
        return f"Question: {task.spec['question']}\nAnswer: {task.spec['answer']}"

    def edits(self, spec: dict, direction: str) -> list[Edit]:
        """Harder/easier rewrites of a flat arithmetic question (digits, terms, operators)."""
        m = re.fullmatch(r"\s*What is ([0-9+\-* ]+)\?\s*", str(spec.get("question", "")))
        tokens = m.group(1).split() if m else []
        malformed = any(not t.isdigit() for t in tokens[::2]) or any(
            op not in "+-*" for op in tokens[1::2])
        if len(tokens) < 3 or len(tokens) % 2 == 0 or self.validate(spec) or malformed:
            return []
        nums, ops = [int(t) for t in tokens[::2]], tokens[1::2]
        digits = max(len(str(x)) for x in nums)
        rng = random.Random(zlib.crc32(spec["question"].encode()))

        def draw(k: int) -> int:  # a k-digit operand, as make_tasks draws them
            return rng.randint(0 if k == 1 else 10 ** (k - 1), 10 ** k - 1)

        out: list[tuple[str, list[int], list[str]]] = []
        if direction == "harder":
            if digits < 6:
                out.append((f"digits: {digits} -> {digits + 1}",
                            [draw(digits + 1) for _ in nums], ops))
            if len(nums) < 6:
                op = ops[-1] if ops[-1] != "*" else "+"
                out.append((f"terms: {len(nums)} -> {len(nums) + 1}", nums + [draw(digits)],
                            ops + [op]))
            for k, op in enumerate(ops):
                if op != "*":
                    out.append((f"operator: {op} -> *", nums, ops[:k] + ["*"] + ops[k + 1:]))
                    break
        elif direction == "easier":
            if digits > 1:
                out.append((f"digits: {digits} -> {digits - 1}",
                            [draw(digits - 1) for _ in nums], ops))
            if len(nums) > 2:
                out.append((f"terms: {len(nums)} -> {len(nums) - 1}", nums[:-1], ops[:-1]))
            for old in ("*", "-"):
                if old in ops:
                    k = ops.index(old)
                    out.append((f"operator: {old} -> +", nums, ops[:k] + ["+"] + ops[k + 1:]))
        else:
            raise ValueError(f"direction must be harder or easier, got {direction!r}")
        edits = []
        for text, new_nums, new_ops in out:
            expr = " ".join(f"{x} {op}" for x, op in zip(new_nums, new_ops)) + f" {new_nums[-1]}"
            new = {"question": f"What is {expr}?", "answer": str(_arith(expr))}
            if new != spec and not self.validate(new):
                edits.append(Edit(description=text, spec=new))
        return edits

    def validate(self, spec: dict) -> list[str]:
        """Well-formed, and for arithmetic questions ("What is EXPR?") the answer is right."""
        problems = []
        question, answer = spec.get("question"), spec.get("answer")
        if not isinstance(question, str) or not question.strip():
            problems.append("spec.question must be a non-empty string")
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or \
                str(answer).strip() == "":
            problems.append("spec.answer must be a string or number")
        if problems:
            return problems
        unknown = set(spec) - {"question", "answer"}
        if unknown:
            problems.append(f"unknown spec keys {sorted(unknown)}")
        m = re.fullmatch(r"\s*What is ([0-9+\-*() ]+)\?\s*", question)
        if m:
            value = _arith(m.group(1))
            if value is None:
                problems.append("the arithmetic expression does not parse")
            elif not same_answer(str(answer), str(value)):
                problems.append(f"wrong answer: {m.group(1).strip()} = {value}, not {answer}")
        return problems


def make_tasks(n: int, seed: int, digits: int = 1, terms: int = 2, ops: str = "+",
               split: str = "train", prefix: str = "arith") -> list[Task]:
    from rlany.envs import check_knob

    if not ops or set(ops) - set("+-*"):
        raise RlanyError(f"ops must be made of + - *, got {ops!r}")
    check_knob("digits", digits, 1, 18)
    check_knob("terms", terms, 1, 50)
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        nums = [rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)
                for _ in range(terms)]
        expr = str(nums[0])
        for x in nums[1:]:
            expr += f" {rng.choice(ops)} {x}"
        answer = str(_arith(expr))
        task_id = f"{prefix}-{seed}-{i:04d}"
        tasks.append(Task(task_id=task_id, env="reasoning",
                          spec={"question": f"What is {expr}?", "answer": answer},
                          prompt=PROMPT, lineage=Lineage(root_id=task_id), split=split))
    return tasks

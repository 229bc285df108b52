"""`coding`: stdin/stdout programming problems with hidden tests, run in the sandbox.

spec (the CodeContests/LiveBench shape):
    {"question": str, "tests": [{"input": str, "output": str}, ...],
     "examples": int (how many leading tests the policy is shown, default 1),
     "time_limit": float (CPU seconds per test, default 2),
     "solution": str (optional reference program; `validate` requires it to pass)}

The policy answers in one turn with a Python program (the last ```python block, else the
last ``` block, else the whole answer). All tests run in one sandboxed process where safe
(`rlany.sandbox.run_tests`); the episode succeeds when every test's output matches
token-wise. The final observation does not reveal the verdict; the step info counts the
passed tests and the sandbox statuses.
"""

from __future__ import annotations

import random
import re

from rlany.envs import StepResult
from rlany.errors import RlanyError
from rlany.records import Lineage, Task

PROMPT = ("Write a Python 3 program that reads the input from standard input and prints the "
          "answer to standard output. Put the whole program in one ```python code block.")

_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str:
    blocks = _BLOCK.findall(response)
    return blocks[-1] if blocks else response


class CodingEnv:
    name = "coding"

    def __init__(self) -> None:
        self.spec: dict = {}

    def reset(self, task: Task) -> str:
        problems = self.validate(task.spec, check_solution=False)
        if problems:
            raise RlanyError(f"bad coding spec: {'; '.join(problems)}")
        self.spec = task.spec
        shown = task.spec["tests"][:task.spec.get("examples", 1)]
        examples = "\n\n".join(f"Example input:\n{t['input']}\nExample output:\n{t['output']}"
                               for t in shown)
        return f"{task.spec['question']}\n\n{examples}".strip()

    def step(self, response: str) -> StepResult:
        from rlany.sandbox import Limits, outputs_match, run_tests

        code = extract_code(response)
        tests = self.spec["tests"]
        results = run_tests(code, [t["input"] for t in tests],
                            Limits(cpu_s=float(self.spec.get("time_limit", 2.0))))
        passed = sum(r.status == "ok" and outputs_match(r.stdout, t["output"])
                     for r, t in zip(results, tests))
        statuses: dict[str, int] = {}
        for r in results:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        return StepResult(obs="(the episode has ended)", done=True, success=passed == len(tests),
                          action=code[:4000],
                          info={"passed": passed, "total": len(tests), "statuses": statuses})

    def describe(self, task: Task) -> str:
        return (f"Problem: {task.spec['question']}\nTests: {len(task.spec['tests'])} "
                f"(the first {task.spec.get('examples', 1)} shown to the agent)")

    def validate(self, spec: dict, check_solution: bool = True) -> list[str]:
        if not isinstance(spec, dict):
            return ["spec must be an object"]
        problems = []
        if not isinstance(spec.get("question"), str) or not spec["question"].strip():
            problems.append("spec.question must be a non-empty string")
        tests = spec.get("tests")
        if not isinstance(tests, list) or not tests or not all(
                isinstance(t, dict) and isinstance(t.get("input"), str)
                and isinstance(t.get("output"), str) for t in tests):
            problems.append("spec.tests must be a non-empty list of {input, output} strings")
        if problems or not check_solution:
            return problems
        solution = spec.get("solution")
        if not isinstance(solution, str):
            return ["spec.solution (a reference program) is needed to prove the tests right"]
        from rlany.sandbox import outputs_match, run_tests
        results = run_tests(solution, [t["input"] for t in tests])
        bad = [k for k, (r, t) in enumerate(zip(results, tests))
               if r.status != "ok" or not outputs_match(r.stdout, t["output"])]
        return [f"the reference solution fails tests {bad}"] if bad else []


def _t(i: str, o: str) -> dict:
    return {"input": i, "output": o}


# Written for this project: small problems a small model can sometimes solve.
PROBLEMS = [
    ("Read two integers a and b on one line and print their sum.",
     "a, b = map(int, input().split())\nprint(a + b)",
     [_t("1 2", "3"), _t("10 -4", "6"), _t("0 0", "0"), _t("123 877", "1000")]),
    ("Read a line of text and print it reversed.",
     "print(input()[::-1])",
     [_t("abc", "cba"), _t("racecar", "racecar"), _t("hello world", "dlrow olleh")]),
    ("Read a word and print how many vowels (a, e, i, o, u) it has.",
     "print(sum(c in 'aeiou' for c in input().lower()))",
     [_t("banana", "3"), _t("sky", "0"), _t("Education", "5")]),
    ("Read n, then n integers on the next line, and print the largest.",
     "input()\nprint(max(map(int, input().split())))",
     [_t("3\n1 5 2", "5"), _t("1\n-7", "-7"), _t("4\n-1 -2 -3 -4", "-1")]),
    ("Read an integer n (0 <= n <= 12) and print n factorial.",
     "import math\nprint(math.factorial(int(input())))",
     [_t("0", "1"), _t("5", "120"), _t("12", "479001600")]),
    ("Read an integer n >= 2 and print YES if it is prime, otherwise NO.",
     "n = int(input())\nprint('YES' if all(n % d for d in range(2, int(n ** 0.5) + 1)) else 'NO')",
     [_t("2", "YES"), _t("9", "NO"), _t("97", "YES"), _t("100", "NO")]),
    ("Read integers on one line and print them sorted in increasing order, space separated.",
     "print(*sorted(map(int, input().split())))",
     [_t("3 1 2", "1 2 3"), _t("5", "5"), _t("-1 10 0 -5", "-5 -1 0 10")]),
    ("Read a line of text and print the number of words in it.",
     "print(len(input().split()))",
     [_t("the cat sat", "3"), _t("one", "1"), _t("a  b   c d", "4")]),
    ("Read a word and print YES if it reads the same backwards, otherwise NO.",
     "s = input().strip()\nprint('YES' if s == s[::-1] else 'NO')",
     [_t("level", "YES"), _t("rlany", "NO"), _t("a", "YES")]),
    ("Read two positive integers and print their greatest common divisor.",
     "import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))",
     [_t("12 18", "6"), _t("7 13", "1"), _t("100 75", "25")]),
    ("Read n (1 <= n <= 30) and print the n-th Fibonacci number, where F(1) = F(2) = 1.",
     "n = int(input())\na, b = 1, 1\nfor _ in range(n - 1):\n    a, b = b, a + b\nprint(a)",
     [_t("1", "1"), _t("2", "1"), _t("10", "55"), _t("30", "832040")]),
    ("Read an integer n and print the sum of 1 + 2 + ... + n.",
     "n = int(input())\nprint(n * (n + 1) // 2)",
     [_t("1", "1"), _t("10", "55"), _t("100", "5050")]),
]


def make_tasks(n: int, seed: int, split: str = "train", examples: int = 1,
               prefix: str = "code") -> list[Task]:
    """Tasks from the built-in problem set (shuffled by seed; n <= its size)."""
    if n > len(PROBLEMS):
        raise RlanyError(f"the built-in coding set has {len(PROBLEMS)} problems, asked for {n}")
    order = list(range(len(PROBLEMS)))
    random.Random(seed).shuffle(order)
    tasks = []
    for k in order[:n]:
        question, solution, tests = PROBLEMS[k]
        task_id = f"{prefix}-{k:03d}"
        tasks.append(Task(task_id=task_id, env="coding", prompt=PROMPT, split=split,
                          spec={"question": question, "tests": tests, "examples": examples,
                                "time_limit": 2.0, "solution": solution},
                          lineage=Lineage(root_id=task_id)))
    return tasks

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
passed tests and the sandbox statuses (a jail that does not start is the env's error; a
response the reading trips over, `rlany.envs.read_action`, a failed episode). Single-step:
no step labels (the outcome labels the one step).

`edits(spec, direction)` (needs `solution`): harder = one example fewer shown, the upper
bound of a stated range "(A <= n <= B)" raised with a test at the new bound, or a test at a
stated bound the tests miss; easier = one example more shown, a hidden test dropped, or the
upper bound lowered (tests above it dropped). Bound edits apply when every test input is
one integer; the expected outputs of added tests come from the reference solution run in
the sandbox, and every edit passes `validate`.
"""

from __future__ import annotations

import random
import re

from rlany.envs import Edit, StepResult, read_action
from rlany.errors import RlanyError
from rlany.files.records import Lineage, Task

PROMPT = ("Write a Python 3 program that reads the input from standard input and prints the "
          "answer to standard output. Put the whole program in one ```python code block.")

_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_RANGE = re.compile(r"\((-?\d+)\s*<=\s*([A-Za-z_]\w*)\s*<=\s*(-?\d+)\)")


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

        code, why = read_action(extract_code, response)
        if code is None:  # the response cannot be read as a program: the policy's failure
            return StepResult(obs="(the episode has ended)", done=True, success=False,
                              info={"passed": 0, "total": len(self.spec["tests"]),
                                    "invalid_action": why})
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

    def edits(self, spec: dict, direction: str) -> list[Edit]:
        """Harder/easier rewrites: examples shown, hidden tests, a stated input bound."""
        if direction not in ("harder", "easier"):
            raise ValueError(f"direction must be harder or easier, got {direction!r}")
        if self.validate(spec):
            return []
        tests, shown = spec["tests"], spec.get("examples", 1)
        out: list[tuple[str, dict]] = []
        if direction == "harder" and shown >= 1:
            out.append((f"examples shown: {shown} -> {shown - 1}", {"examples": shown - 1}))
        if direction == "easier":
            if shown < len(tests):
                out.append((f"examples shown: {shown} -> {shown + 1}", {"examples": shown + 1}))
            for k in range(len(tests) - 1, max(shown, 1) - 1, -1)[:2]:
                out.append((f"drop hidden test {k + 1} (input {tests[k]['input'][:30]!r})",
                            {"tests": tests[:k] + tests[k + 1:]}))
        out += _bound_edits(spec, direction)
        edits = []
        for text, change in out:
            new = {**spec, **change}
            if new != spec and not self.validate(new):
                edits.append(Edit(description=text, spec=new))
        return edits[:8]

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


def _bound_edits(spec: dict, direction: str) -> list[tuple[str, dict]]:
    """Edits of the one stated range "(A <= n <= B)" of a problem whose inputs are integers."""
    found = _RANGE.findall(spec["question"])
    tests = spec["tests"]
    if len(found) != 1 or not all(re.fullmatch(r"\s*-?\d+\s*", t["input"]) for t in tests):
        return []
    low, name, high = int(found[0][0]), found[0][1], int(found[0][2])
    values = [int(t["input"]) for t in tests]
    old = f"({low} <= {name} <= {high})"
    if not low <= min(values) <= max(values) <= high or old not in spec["question"]:
        return []
    out: list[tuple[str, dict]] = []
    if direction == "harder":
        new_high = high + max(1, abs(high))
        added = _solved(spec, [str(new_high)] + [str(v) for v in (low, high) if v not in values])
        if added and added[0]["input"] == str(new_high):
            question = spec["question"].replace(old, f"({low} <= {name} <= {new_high})")
            out.append((f"bound: {name} <= {high} -> {name} <= {new_high}",
                        {"question": question, "tests": tests + added[:1]}))
        for test in (t for t in added if t["input"] != str(new_high)):
            out.append((f"add edge-case test: {name} = {test['input']}", {"tests": tests + [test]}))
    else:
        new_high = low + (high - low) // 2
        kept = [t for t, v in zip(tests, values) if v <= new_high]
        if kept and new_high < high:
            question = spec["question"].replace(old, f"({low} <= {name} <= {new_high})")
            out.append((f"bound: {name} <= {high} -> {name} <= {new_high}",
                        {"question": question, "tests": kept,
                         "examples": min(spec.get("examples", 1), len(kept))}))
    return out


def _solved(spec: dict, inputs: list[str]) -> list[dict]:
    """Tests for `inputs` whose expected output is the reference solution's (sandboxed)."""
    from rlany.sandbox import Limits, run_tests

    results = run_tests(spec["solution"], inputs, Limits(cpu_s=float(spec.get("time_limit", 2))))
    return [{"input": i, "output": r.stdout.strip()} for i, r in zip(inputs, results)
            if r.status == "ok" and r.stdout.strip()]


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
    from rlany.envs import check_knob

    check_knob("examples", examples, 0)
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

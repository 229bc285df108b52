"""Reading a loop's run directory for `rlany report`: metrics.jsonl's rows (one per
iteration, each checked: numbers, intervals, no iteration twice), the base, warm-start and
final evaluations (`iter_N/eval.json`, N a number, of an iteration whose done.json exists:
a killed run's unfinished iteration is not its final; the base and the final evaluated on the
same tasks, by their sidecars' sha256). Anything malformed is one line naming the file."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from rlany.errors import RlanyError
from rlany.files.jsonl import meta_path

PLOTS = [
    ("train_acc", "train accuracy (rollouts)"),
    ("eval_success", "eval success rate"),
    ("eval_judge_step_accuracy", "judge step accuracy (eval)"),
    ("judge_label_accuracy", "judge step accuracy (judged rollouts)"),
    ("judge_parse_fail_rate", "judge unparseable rate"),
    ("accepted_tasks", "accepted new tasks"),
    # the environment loop (flattened from metrics' env_loop by `env_rows`)
    ("pool_difficulty", "pool difficulty (the env's first measure, mean)"),
    ("adapted_share", "share of the pool adapted"),
    ("candidate_acc", "success on decided candidates"),
    ("candidate_parent_acc", "their parents' success"),
    ("policy_loss", "policy loss"),
    # GiGPO's anchor groups ([score] step_credit = "gigpo")
    ("anchor_shared_share", "steps sharing their anchor state"),
    ("anchor_group_mean", "steps per anchor group"),
]


ITERATION = re.compile(r"^iter_(\d+)$")  # an iteration's directory (not iter_003.old)
REBUILT = "metrics.jsonl is rebuilt from iter_*/done.json by rerunning `rlany loop`"


def load_run(run: Path) -> dict:
    metrics = run / "metrics.jsonl"
    if run.exists() and not run.is_dir():
        raise RlanyError("not a directory: a run directory is runs/NAME", where=str(run))
    if not metrics.exists():
        raise RlanyError("no metrics.jsonl: not a loop run directory (or no iteration "
                         "finished yet)", where=str(run))
    base, init = run / "eval_base.json", run / "eval_init.json"
    evals = sorted((int(m[1]), p) for p in run.glob("iter_*/eval.json")  # 999 before 1000
                   if (m := ITERATION.match(p.parent.name))
                   and (p.parent / "done.json").exists())  # finished, as metrics' rows are
    if evals and base.exists():
        _same_tasks(base, evals[-1][1])
    return {"name": run.name, "rows": _rows(metrics),
            "base": _eval(base) if base.exists() else None,
            "init": _eval(init) if init.exists() else None,
            "final": _eval(evals[-1][1]) if evals else None,
            "final_iteration": evals[-1][0] if evals else None}


def _rows(metrics: Path) -> list[dict]:
    rows, seen = [], {}
    for lineno, line in enumerate(_text(metrics).splitlines(), 1):
        if not line.strip():
            continue
        where, row = f"{metrics}:{lineno}", _json(line, f"{metrics}:{lineno}")
        if not isinstance(row, dict) or isinstance(row.get("iteration"), bool) or \
                not isinstance(row.get("iteration"), int):
            raise RlanyError("a metrics line is an object with an integer 'iteration'",
                             where=where, hint=REBUILT)
        if row["iteration"] in seen:
            raise RlanyError(f"iteration {row['iteration']} again (first at line "
                             f"{seen[row['iteration']]})", where=where, hint=REBUILT)
        seen[row["iteration"]] = lineno
        bad = [k for k, _ in PLOTS if row.get(k) is not None and not _number(row[k])]
        seconds = row.get("seconds", {})
        if not isinstance(seconds, dict) or not all(map(_number, seconds.values())):
            bad.append("seconds")
        if bad:
            raise RlanyError(f"{', '.join(bad)}: not a number", where=where)
        wrong = _interval_problem(row)
        if wrong:
            raise RlanyError(wrong, where=where, hint=REBUILT)
        rows.append(env_rows(row))
    return rows


def _same_tasks(base: Path, final: Path) -> None:
    """The final evaluation's tasks are the base's (their sidecars' input sha256, where
    both have one): else the report's gain compares two task sets."""
    def tasks(path: Path) -> str | None:
        try:
            return json.loads(meta_path(path).read_text(encoding="utf-8"))["inputs"][0][
                "sha256"]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return None
    a, b = tasks(base), tasks(final)
    if a and b and a != b:
        raise RlanyError(f"evaluated other tasks than {base.name} (sha256 {b[:12]}, not "
                         f"{a[:12]}): no gain can be read across them", where=str(final),
                         hint="was the eval tasks file edited during the run?")


def _interval_problem(row: dict) -> str | None:
    """What is wrong with a metrics line's 95% intervals (`KEY_ci95`), or None: each is
    null or [lo, hi], two finite numbers with lo <= KEY <= hi (where KEY is a number),
    as the plots' error bars and bands need."""
    for key, ci in row.items():
        if not key.endswith("_ci95") or ci is None:
            continue
        if not (isinstance(ci, list) and len(ci) == 2 and all(map(_number, ci))
                and all(map(math.isfinite, ci))):
            return f"{key}: an interval is [lo, hi], two finite numbers, not {json.dumps(ci)[:60]}"
        value = row.get(key.removesuffix("_ci95"))
        if not ci[0] <= ci[1] or (_number(value) and not ci[0] <= value <= ci[1]):
            return f"{key}: the interval {ci} does not hold {key.removesuffix('_ci95')} {value}"
    return None


def env_rows(row: dict) -> dict:
    """A metrics row with the env loop's numbers lifted to the top level for the panels:
    pool_difficulty (the first measure the env reports, e.g. household's plan_length),
    adapted_share, candidate_acc and candidate_parent_acc."""
    env = row.get("env_loop")
    if not isinstance(env, dict):
        return row
    difficulty = env.get("difficulty") if isinstance(env.get("difficulty"), dict) else {}
    first = next(iter(difficulty.values()), None)
    lifted = {"pool_difficulty": first, **{k: env.get(k) for k in (
        "adapted_share", "candidate_acc", "candidate_parent_acc")}}
    return {**row, **{k: v for k, v in lifted.items() if _number(v)}}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RlanyError("not UTF-8 text", where=str(path)) from None


def _json(text: str, where: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise RlanyError(f"invalid JSON: {e}", where=where) from None


def _eval(path: Path) -> dict:
    """An eval.json as the report reads it: success_rate in [0, 1]; where present,
    trajectories an integer >= 0 and success_ci95 two numbers."""
    data = _json(_text(path), str(path))
    ok = isinstance(data, dict) and _number(data.get("success_rate")) and \
        0 <= data["success_rate"] <= 1
    n, ci = (data.get("trajectories"), data.get("success_ci95")) if ok else (None, None)
    ok = ok and (n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 0)) \
        and (ci is None or (isinstance(ci, list) and len(ci) == 2 and all(map(_number, ci))))
    if not ok:
        raise RlanyError("not an eval summary (success_rate in [0, 1], trajectories >= 0, "
                         "success_ci95 two numbers)", where=str(path))
    return data

"""`rlany report RUN_DIR [RUN_DIR ...]`: plots and tables of what a loop did.

One run: PNG plots (train accuracy, eval success, judge accuracy and parse failures,
accepted tasks per iteration, policy loss, time per stage; when the run adapts its tasks,
the environment loop: pool difficulty, share of the pool adapted, success on candidates and
on their parents) and `report.md` with the per-iteration table (and the env loop's:
proposed, accepted, rejected by reason, difficulty, lineage depth). Only the panels the
runs have data for are drawn (a policy-only run has no judge and no task panels). Eval
success carries its 95% Wilson interval as error bars. Several runs: the same plots with
one line per run, except that the seeds of one arm (runs named ARM-sSEED, as the learning
benchmark names them) are one line with a 95% band over the seeds (`arm_line`: eval success
pooled, Wilson; the rest a t-interval), drawn as the research plots draw theirs
(`draw_panel`); and a table comparing every run's base and final numbers side by side.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from statistics import fmean

from rlany.errors import RlanyError
from rlany.outputs import write_text_atomic

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
]


def load_run(run: Path) -> dict:
    metrics = run / "metrics.jsonl"
    if run.exists() and not run.is_dir():
        raise RlanyError("not a directory: a run directory is runs/NAME", where=str(run))
    if not metrics.exists():
        raise RlanyError("no metrics.jsonl: not a loop run directory (or no iteration "
                         "finished yet)", where=str(run))
    rows = []
    for lineno, line in enumerate(_text(metrics).splitlines(), 1):
        if line.strip():
            row = _json(line, f"{metrics}:{lineno}")
            if not isinstance(row, dict) or isinstance(row.get("iteration"), bool) or \
                    not isinstance(row.get("iteration"), int):
                raise RlanyError("a metrics line is an object with an integer 'iteration'",
                                 where=f"{metrics}:{lineno}", hint="metrics.jsonl is rebuilt "
                                 "from iter_*/done.json by rerunning `rlany loop`")
            bad = [k for k, _ in PLOTS if row.get(k) is not None and not _number(row[k])]
            seconds = row.get("seconds", {})
            if not isinstance(seconds, dict) or not all(map(_number, seconds.values())):
                bad.append("seconds")
            if bad:
                raise RlanyError(f"{', '.join(bad)}: not a number", where=f"{metrics}:{lineno}")
            wrong = _interval_problem(row)
            if wrong:
                raise RlanyError(wrong, where=f"{metrics}:{lineno}", hint="metrics.jsonl is "
                                 "rebuilt from iter_*/done.json by rerunning `rlany loop`")
            rows.append(env_rows(row))
    base, init = run / "eval_base.json", run / "eval_init.json"
    evals = sorted(run.glob("iter_*/eval.json"))
    return {"name": run.name, "rows": rows,
            "base": _eval(base) if base.exists() else None,
            "init": _eval(init) if init.exists() else None,
            "final": _eval(evals[-1]) if evals else None,
            "final_iteration": int(evals[-1].parent.name[5:]) if evals else None}


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


def env_table(run: dict) -> str | None:
    """The env loop per iteration (only a run that adapts has one)."""
    rows = [r for r in run["rows"] if isinstance(r.get("env_loop"), dict)]
    if not rows:
        return None
    out = ["| iteration | proposed (easier/harder) | accepted (easier/harder) | rejected "
           "by reason | candidates' success vs parents | pool difficulty | adapted, depth "
           "max |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        e = r["env_loop"]
        pair = lambda d: f"{(d or {}).get('easier', 0)}/{(d or {}).get('harder', 0)}"  # noqa: E731
        why = ", ".join(f"{k} {v}" for k, v in sorted((e.get("rejected_by_reason") or {})
                                                      .items())) or "-"
        diff = ", ".join(f"{k} {_fmt(v)}" for k, v in (e.get("difficulty") or {}).items())
        out.append(f"| {r['iteration']} | {pair(e.get('proposed'))} | "
                   f"{pair(e.get('accepted_by_direction'))} | {why} | "
                   f"{_fmt(e.get('candidate_acc'))} vs {_fmt(e.get('candidate_parent_acc'))} | "
                   f"{diff or '-'} | {_fmt(e.get('adapted_share'))}, "
                   f"{_fmt(e.get('lineage_depth_max'))} |")
    return "\n".join(out)


SEED = re.compile(r"^(?P<arm>.+)-s(?P<seed>\d+)$")


def series(run: dict, key: str) -> dict[int, tuple[float, list[float] | None, int | None]]:
    """iteration -> (value, its 95% interval or None, its episodes or None) of one metric;
    eval success starts with the base model at iteration -1."""
    points = {}
    if key == "eval_success" and run["base"] and run["base"].get("success_rate") is not None:
        points[-1] = (run["base"]["success_rate"], run["base"].get("success_ci95"),
                      run["base"].get("trajectories"))
    for r in run["rows"]:
        if r.get(key) is not None:
            points[r["iteration"]] = (r[key], r.get(f"{key}_ci95"),
                                      r.get("eval_episodes") if key == "eval_success" else None)
    return points


def arm_line(arm: str, data: list[dict], key: str) -> dict | None:
    """The seeds of one arm as one line, with the band the research plots use too: eval
    success pooled over the seeds with its 95% Wilson interval (where every point has its
    episode count), any other metric the mean with a 95% t-interval over the seeds."""
    from rlany.stats import t_interval, wilson_interval

    xs = sorted({x for d in data for x in d})
    if not xs:
        return None
    at = [[d[x] for d in data if x in d] for x in xs]
    pooled = key == "eval_success" and all(n for p in at for _, _, n in p)
    if pooled:
        kn = [(sum(round(v * n) for v, _, n in p), sum(n for _, _, n in p)) for p in at]
        ys, bands = [k / n for k, n in kn], [wilson_interval(k, n) for k, n in kn]
    else:
        ys = [fmean(v for v, _, _ in p) for p in at]
        bands = [t_interval([v for v, _, _ in p]) for p in at]
    seeds = sum(1 for d in data if d)
    how = "pooled; band: 95% Wilson" if pooled else "mean; band: 95% t over seeds"
    return {"label": f"{arm} ({seeds} seeds, {how})", "x": xs, "y": ys,
            "lo": [b[0] if b else y for b, y in zip(bands, ys)],
            "hi": [b[1] if b else y for b, y in zip(bands, ys)], "band": True}


def lines(runs: list[dict], key: str) -> list[dict]:
    """What one panel draws: per line its label, x, y, and the band or error bars (lo, hi):
    a run alone with its intervals where it has them; the seeds of one arm (two or more runs
    named ARM-sSEED) as one line with a band over the seeds (`arm_line`)."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        m = SEED.match(run["name"])
        groups.setdefault(f"arm:{m['arm']}" if m else f"run:{id(run)}", []).append(run)
    out = []
    for key_, members in groups.items():
        data = [series(run, key) for run in members]
        if key_.startswith("arm:") and len(members) > 1:
            if line := arm_line(key_[4:], data, key):
                out.append(line)
            continue
        for run, d in zip(members, data):
            xs = sorted(d)
            if not xs:
                continue
            ci = [d[x][1] for x in xs]
            out.append({"label": run["name"], "x": xs, "y": [d[x][0] for x in xs],
                        "lo": [c[0] if c else d[x][0] for x, c in zip(xs, ci)],
                        "hi": [c[1] if c else d[x][0] for x, c in zip(xs, ci)],
                        "band": False, "intervals": any(ci)})
    return out


def draw_panel(ax, panel: list[dict], title: str, xlabel: str, colors: dict | None = None,
               legend: bool = True) -> None:
    """One panel's lines on a matplotlib axis: a band filled, error bars where a run has
    intervals; `colors` (label -> color) keeps an arm's color across panels. `rlany report`
    and the research plots (research/learning_plots.py) draw through this."""
    for line in panel:
        color = (colors or {}).get(line.get("arm", line["label"]))
        (handle,) = ax.plot(line["x"], line["y"], marker="o", label=line["label"], color=color)
        if line["band"]:
            ax.fill_between(line["x"], line["lo"], line["hi"], alpha=0.2,
                            color=handle.get_color(), linewidth=0)
        elif line.get("intervals"):
            err = [[y - lo for y, lo in zip(line["y"], line["lo"])],
                   [hi - y for y, hi in zip(line["y"], line["hi"])]]
            ax.errorbar(line["x"], line["y"], yerr=err, fmt="none", capsize=3,
                        color=handle.get_color())
    bars = any(line.get("intervals") for line in panel)
    ax.set_title(title + (" (bars: 95% interval)" if bars else ""), fontsize=10)
    ax.set_xlabel(xlabel, fontsize=8)
    if legend:
        ax.legend(fontsize=7)


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


def check_report_dir(out: Path) -> None:
    """The report writes into a new or empty directory, or over an earlier report (one
    holding report.md): never into a directory of other files."""
    if out.exists() and not out.is_dir():
        raise RlanyError("exists and is not a directory", where=str(out))
    if out.is_dir() and any(out.iterdir()) and not (out / "report.md").is_file():
        raise RlanyError("directory holds other files and no earlier report", where=str(out),
                         hint="give a new or empty directory")


def gain_line(run: dict) -> str | None:
    """Held-out success base -> latest evaluation, the gain with its 95% interval, and
    whether the gain clears that noise; with a warm start (eval_init.json), also RL's own
    gain over it."""
    base, final = run["base"], run["final"]
    if not base or not final or not base.get("trajectories") or not final.get("trajectories"):
        return None
    line = (f"Held-out success: base {_gain(base, final, 'the base model')} after "
            f"iteration {run['final_iteration']}.")
    init = run.get("init")
    if init and init.get("trajectories"):
        line += (" From the warm start (eval_init.json), RL's own part: "
                 f"{_gain(init, final, 'the warm start')}.")
    return line


def _gain(before: dict, after: dict, what: str) -> str:
    from rlany.stats import gain_interval

    kb = round(before["success_rate"] * before["trajectories"])
    kf = round(after["success_rate"] * after["trajectories"])
    lo, hi = gain_interval(kf, after["trajectories"], kb, before["trajectories"])
    gain = after["success_rate"] - before["success_rate"]
    verdict = (f"above {what} beyond noise" if lo > 0 else f"below {what} beyond noise"
               if hi < 0 else "within noise: the interval includes no change")

    def ci(e):
        c = e.get("success_ci95") or [0.0, 1.0]
        return f"{c[0]:.2f}-{c[1]:.2f}"
    return (f"{before['success_rate']:.3f} (95% {ci(before)}, {before['trajectories']} "
            f"episodes) -> {after['success_rate']:.3f} (95% {ci(after)}, "
            f"{after['trajectories']} episodes): gain {gain:+.3f}, 95% interval {lo:+.3f} "
            f"to {hi:+.3f} ({verdict})")


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def iteration_table(run: dict) -> str:
    cols = ["iteration", "train_acc", "eval_success", "eval_judge_step_accuracy",
            "judge_parse_fail_rate", "judge_outcome_agreement", "policy_samples",
            "rm_samples", "accepted_tasks", "new_candidates"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in run["rows"]:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def comparison_table(runs: list[dict]) -> str:
    lines = ["| run | eval success before | eval success after | judge step acc before | "
             "judge step acc after | accepted tasks (total) |", "|---|---|---|---|---|---|"]
    for run in runs:
        last = run["rows"][-1] if run["rows"] else {}
        base = run["base"] or {}
        accepted = sum(r.get("accepted_tasks") or 0 for r in run["rows"])
        lines.append(f"| {run['name']} | {_fmt(base.get('success_rate'))} | "
                     f"{_fmt(last.get('eval_success'))} | "
                     f"{_fmt(base.get('judge_step_accuracy'))} | "
                     f"{_fmt(last.get('eval_judge_step_accuracy'))} | {accepted} |")
    return "\n".join(lines)


def write_report(run_dirs: list[str], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load_run(Path(d)) for d in run_dirs]
    check_report_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    written, drawn = [], []
    for key, title in PLOTS:
        panel = lines(runs, key)
        if not panel:  # nothing to show: no empty panel (e.g. no judge in a policy-only run)
            continue
        fig, ax = plt.subplots(figsize=(5, 3.2))
        draw_panel(ax, panel, title, "iteration (-1 = base model)" if key == "eval_success"
                   else "iteration", legend=len(panel) > 1 or len(runs) > 1)
        ax.xaxis.get_major_locator().set_params(integer=True)
        fig.tight_layout()
        path = out / f"{key}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
        drawn.append(key)
    stage_plot = _stage_times(runs, out, plt)
    if stage_plot:
        written.append(stage_plot)
        drawn.append("stage_seconds")
    for key in [k for k, _ in PLOTS] + ["stage_seconds"]:  # an earlier report's, now empty
        if key not in drawn:
            (out / f"{key}.png").unlink(missing_ok=True)
    md = ["# rlany report", ""]
    if len(runs) > 1:
        md += ["## Comparison", "", comparison_table(runs), ""]
    for run in runs:
        md += [f"## {run['name']}", ""]
        line = gain_line(run)
        md += [line, ""] if line else []
        md += [iteration_table(run), ""]
        if table := env_table(run):
            md += ["The environment loop:", "", table, ""]
        if run["base"]:
            md += [f"Base model eval success: {_fmt(run['base'].get('success_rate'))}, judge "
                   f"step accuracy: {_fmt(run['base'].get('judge_step_accuracy'))}", ""]
    md += [f"![{key}]({key}.png)" for key in drawn]
    write_text_atomic(out / "report.md", "\n".join(md) + "\n")
    written.append(out / "report.md")
    return written


def _stage_times(runs: list[dict], out: Path, plt) -> Path | None:
    run = runs[0]
    stages = sorted({s for r in run["rows"] for s in r.get("seconds", {})})
    if not stages:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.2))
    bottom = [0.0] * len(run["rows"])
    xs = [r["iteration"] for r in run["rows"]]
    for stage in stages:
        ys = [r.get("seconds", {}).get(stage, 0.0) for r in run["rows"]]
        ax.bar(xs, ys, bottom=bottom, label=stage)
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_title(f"seconds per stage ({run['name']})")
    ax.set_xlabel("iteration")
    ax.set_xticks(xs)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "stage_seconds.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

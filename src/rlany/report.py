"""`rlany report RUN_DIR [RUN_DIR ...]`: plots and tables of what a loop did.

One run: PNG plots (train accuracy, eval success, judge accuracy and parse failures,
accepted tasks per iteration, policy loss, time per stage) and `report.md` with the
per-iteration table. Several runs: the same plots with one line per run, and a table
comparing their base and final numbers side by side (the ablation table).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlany.errors import RlanyError

PLOTS = [
    ("train_acc", "train accuracy (rollouts)"),
    ("eval_success", "eval success rate"),
    ("eval_judge_step_accuracy", "judge step accuracy (eval)"),
    ("judge_label_accuracy", "judge step accuracy (judged rollouts)"),
    ("judge_parse_fail_rate", "judge unparseable rate"),
    ("accepted_tasks", "accepted new tasks"),
    ("policy_loss", "policy loss"),
]


def load_run(run: Path) -> dict:
    metrics = run / "metrics.jsonl"
    if not metrics.exists():
        raise RlanyError("no metrics.jsonl: not a loop run directory (or no iteration "
                         "finished yet)", where=str(run))
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    base, init = run / "eval_base.json", run / "eval_init.json"
    evals = sorted(run.glob("iter_*/eval.json"))
    return {"name": run.name, "rows": rows,
            "base": json.loads(base.read_text()) if base.exists() else None,
            "init": json.loads(init.read_text()) if init.exists() else None,
            "final": json.loads(evals[-1].read_text()) if evals else None,
            "final_iteration": int(evals[-1].parent.name[5:]) if evals else None}


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
    from rlany.evaluate import gain_interval

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
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key, title in PLOTS:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        drawn = False
        for run in runs:
            xs = [r["iteration"] for r in run["rows"] if r.get(key) is not None]
            ys = [r[key] for r in run["rows"] if r.get(key) is not None]
            if key == "eval_success" and run["base"]:
                xs, ys = [-1] + xs, [run["base"]["success_rate"]] + ys
            if xs:
                ax.plot(xs, ys, marker="o", label=run["name"])
                drawn = True
        ax.set_title(title)
        ax.set_xlabel("iteration (-1 = base model)" if key == "eval_success" else "iteration")
        ax.xaxis.get_major_locator().set_params(integer=True)
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        if len(runs) > 1 and drawn:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"{key}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    written.append(_stage_times(runs, out, plt))
    md = ["# rlany report", ""]
    if len(runs) > 1:
        md += ["## Comparison", "", comparison_table(runs), ""]
    for run in runs:
        md += [f"## {run['name']}", ""]
        line = gain_line(run)
        md += [line, ""] if line else []
        md += [iteration_table(run), ""]
        if run["base"]:
            md += [f"Base model eval success: {_fmt(run['base'].get('success_rate'))}, judge "
                   f"step accuracy: {_fmt(run['base'].get('judge_step_accuracy'))}", ""]
    md += [f"![{key}]({key}.png)" for key, _ in PLOTS] + ["![stage_seconds](stage_seconds.png)"]
    (out / "report.md").write_text("\n".join(md) + "\n")
    written.append(out / "report.md")
    return written


def _stage_times(runs: list[dict], out: Path, plt) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3.2))
    run = runs[0]
    stages = sorted({s for r in run["rows"] for s in r.get("seconds", {})})
    bottom = [0.0] * len(run["rows"])
    xs = [r["iteration"] for r in run["rows"]]
    for stage in stages:
        ys = [r.get("seconds", {}).get(stage, 0.0) for r in run["rows"]]
        ax.bar(xs, ys, bottom=bottom, label=stage)
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_title(f"seconds per stage ({run['name']})")
    ax.set_xlabel("iteration")
    ax.set_xticks(xs)
    if stages:
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "stage_seconds.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

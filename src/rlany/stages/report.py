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

import re
from pathlib import Path
from statistics import fmean

from rlany.errors import RlanyError
from rlany.files.outputs import write_text_atomic
from rlany.stages.report_read import PLOTS, load_run

__all__ = ["PLOTS", "load_run", "write_report"]

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
    episode count), any other metric the mean with a 95% t-interval over the seeds.
    `bands`: each point's interval, None where it has none (one seed)."""
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
            "hi": [b[1] if b else y for b, y in zip(bands, ys)], "band": True, "bands": bands}


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
    draws through this, and so do plots outside the product (`rlany.api`)."""
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
    """One row per iteration; only the columns this run has (a policy-only run has no
    judge or task columns)."""
    cols = ["iteration", "train_acc", "eval_success", "eval_judge_step_accuracy",
            "judge_parse_fail_rate", "judge_outcome_agreement", "policy_samples",
            "rm_samples", "accepted_tasks", "new_candidates"]
    cols = [c for c in cols if c == "iteration" or any(r.get(c) is not None
                                                       for r in run["rows"])]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in run["rows"]:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def anchor_table(run: dict) -> str | None:
    """GiGPO's anchor groups per iteration (only a run scored with `step_credit = "gigpo"`
    has them): whether states recurred enough for its step advantage to act."""
    rows = [r for r in run["rows"] if r.get("anchor_shared_share") is not None]
    if not rows:
        return None
    return "\n".join(["| iteration | steps sharing their anchor state | steps per anchor "
                      "group |", "|---|---|---|"] + [
        f"| {r['iteration']} | {_fmt(r['anchor_shared_share'])} | "
        f"{_fmt(r.get('anchor_group_mean'))} |" for r in rows])


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

    seen: dict[Path, str] = {}
    for d in run_dirs:  # one run twice would count as two seeds
        if Path(d).resolve() in seen:
            raise RlanyError(f"given twice (first as {seen[Path(d).resolve()]})", where=d)
        seen[Path(d).resolve()] = d
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
        if table := time_table(run):
            md += ["Seconds per iteration:", "", table, ""]
        if table := env_table(run):
            md += ["The environment loop:", "", table, ""]
        if table := anchor_table(run):
            md += ["GiGPO's anchor groups:", "", table, ""]
        if run["base"]:
            md += [f"Base model eval success: {_fmt(run['base'].get('success_rate'))}, judge "
                   f"step accuracy: {_fmt(run['base'].get('judge_step_accuracy'))}", ""]
    md += [f"![{key}]({key}.png)" for key in drawn]
    write_text_atomic(out / "report.md", "\n".join(md) + "\n")
    written.append(out / "report.md")
    return written


TIME_PARTS = ("engine start", "prefill", "decode", "training", "other")


def time_split(row: dict) -> dict[str, float] | None:
    """Where an iteration's seconds went: the engine's start (in the iteration that started
    it), generation's prompt passes (prefill) and the rest of generation (decode), the two
    trainers, and everything else (env steps, scoring, files). None for a run written
    before generation was split."""
    gen, seconds = row.get("generation_seconds"), row.get("seconds", {})
    if not isinstance(gen, dict):
        return None
    start = seconds.get("engine_start", 0.0)
    parts = {"engine start": start, "prefill": gen.get("prefill") or 0.0,
             "decode": gen.get("decode") or 0.0,
             "training": (seconds.get("train_policy") or 0.0) + (seconds.get("train_rm") or 0.0)}
    total = sum(seconds.values())
    parts["other"] = max(0.0, total - sum(parts.values()))
    return parts


def time_table(run: dict) -> str | None:
    splits = [time_split(r) for r in run["rows"]]
    if not splits or not all(splits):
        return None
    lines = ["| iteration | " + " | ".join(TIME_PARTS) + " |", "|" + "---|" * (len(TIME_PARTS) + 1)]
    for r, split in zip(run["rows"], splits):
        lines.append(f"| {r['iteration']} | " + " | ".join(f"{split[p]:.1f}" for p in TIME_PARTS)
                     + " |")
    return "\n".join(lines)


def _stage_times(runs: list[dict], out: Path, plt) -> Path | None:
    """The first run's seconds per iteration, stacked: split as `time_split` says, or by
    stage for a run written before generation was split."""
    run = runs[0]
    splits = [time_split(r) for r in run["rows"]]
    if all(splits) and splits:
        parts, value = TIME_PARTS, lambda i, part: splits[i][part]
    else:
        parts = sorted({s for r in run["rows"] for s in r.get("seconds", {})})
        value = lambda i, part: run["rows"][i].get("seconds", {}).get(part, 0.0)  # noqa: E731
    if not parts:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.2))
    bottom = [0.0] * len(run["rows"])
    xs = [r["iteration"] for r in run["rows"]]
    for part in parts:
        ys = [value(i, part) for i in range(len(xs))]
        ax.bar(xs, ys, bottom=bottom, label=part)
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_title(f"seconds per iteration ({run['name']})")
    ax.set_xlabel("iteration")
    ax.set_xticks(xs)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "stage_seconds.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

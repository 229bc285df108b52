"""The learning benchmark's arm plots: one line per arm, the mean over its seeds with a 95%
band, the legend beside the axes (off the data).

Drawn from the benchmark's per-run records (learning_summary.summarize_run, the results
JSON's "runs"), not from the run directories, so runs that only the committed results
record (made on another machine) are drawn too. Panels, each only where some arm has data:

    arms_success.png        held-out success: base model, warm start, each evaluation;
                            pooled over seeds, band: the pooled 95% Wilson interval
                            (the table's)
    arms_judge_rollouts.png the judge's balanced step accuracy on the rollouts it judged,
                            per iteration; band: 95% t-interval over seeds (2+ seeds),
                            cut at what the quantity can be (0 for a count, 1 for a share)
    arms_judge_heldout.png  the judge's balanced accuracy on fixed held-out labelled steps
                            (judge_heldout.py): the judge the run started from (base or
                            warm-started) and after each iteration; same band
    arms_accepted_tasks.png accepted new tasks per iteration (full); same band
    arms_rm_samples.png     reward-model samples trained per iteration; same band
    arms_train_acc.png      success on the iteration's rollouts of the pool (the
                            adapted pool, for arms that adapt); same band
    arms_pool_difficulty.png  the pool's difficulty (the env's first measure, household:
                            the mean shortest plan) after each iteration; same band
    arms_adapted_share.png  the share of the pool that is rewritten tasks; same band

`rlany report` (the -report/ directory's other plots) draws each run's own details.
"""

from __future__ import annotations

import math
from pathlib import Path

from rlany.api import arm_line, draw_panel

PANELS = {
    "success": "held-out success (band: pooled 95% Wilson)",
    "judge_rollouts": "judge step accuracy on its rollouts (band: 95% t over seeds)",
    "judge_heldout": "judge step accuracy, held-out steps (band: 95% t over seeds)",
    "accepted_tasks": "accepted new tasks (band: 95% t over seeds)",
    "rm_samples": "reward-model samples trained (band: 95% t over seeds)",
    "train_acc": "success on the pool's rollouts (band: 95% t over seeds)",
    "pool_difficulty": "pool difficulty: mean shortest plan (band: 95% t over seeds)",
    "adapted_share": "share of the pool rewritten (band: 95% t over seeds)",
}
ENV_LOOP = {"pool_difficulty": lambda e: next(iter((e.get("difficulty") or {}).values()), None),
            "adapted_share": lambda e: e.get("adapted_share")}
# what a panel's quantity can be: a t band over 3 seeds runs past it (a count below 0)
RANGE = {"judge_rollouts": (0.0, 1.0), "judge_heldout": (0.0, 1.0), "train_acc": (0.0, 1.0),
         "adapted_share": (0.0, 1.0)}
X_LABEL = {"success": "held-out evaluation",
           "judge_heldout": "iteration (-1: the judge the run started from)"}
SUCCESS_TICKS = {-2: "base model", -1: "warm start"}


def _success(run: dict) -> dict[int, tuple[int, int]]:
    """x -> (successes, episodes): the base model at -2, the warm start at -1, and each
    evaluation after iteration k at k."""
    points = {-2: (run["base"]["successes"], run["base"]["episodes"])}
    if run.get("init"):
        points[-1] = (run["init"]["successes"], run["init"]["episodes"])
    for c in run["curve"]:
        if c["iteration"] >= 0:
            points[c["iteration"]] = (c["successes"], c["episodes"])
    return points


def _per_iteration(run: dict, panel: str) -> dict[int, float]:
    """x -> one run's value of a per-iteration panel (absent where it has none)."""
    if panel == "judge_rollouts":
        values = [(j or {}).get("label_accuracy") for j in run.get("judge_on_rollouts") or []]
    elif panel == "judge_heldout":
        # the judge the run started from (a warm-started one's "warm", else "base") at -1
        judges = ((run.get("judge_heldout") or {}).get("judges")) or {}
        start = "warm" if "warm" in judges else "base"
        return {(-1 if name == start else int(name[5:])): j["bal_acc"]
                for name, j in judges.items()
                if (name == start or name.startswith("iter_")) and j.get("bal_acc") is not None}
    elif panel in ENV_LOOP:  # the environment loop's numbers (arms that adapt)
        values = [ENV_LOOP[panel](e) if e else None for e in run.get("env_loop") or []]
    else:
        values = run.get(panel) or []
    return {i: v for i, v in enumerate(values) if v is not None}


def arm_lines(by_arm: dict[str, list[dict]], panel: str) -> list[dict]:
    """Per arm with data in this panel: its label (with the number of seeds), x, the mean
    over seeds (success: pooled) and the band (lo, hi), None where it has no interval."""
    out = []
    for arm, runs in by_arm.items():
        # report's points: x -> (value, its interval, its episodes); success by counts
        data = ([{x: (k / n, None, n) for x, (k, n) in _success(r).items()} for r in runs]
                if panel == "success" else
                [{x: (v, None, None) for x, v in _per_iteration(r, panel).items()}
                 for r in runs])
        line = arm_line(arm, data, "eval_success" if panel == "success" else panel)
        if line is None or (panel == "accepted_tasks" and not any(line["y"])):
            continue
        lo, hi = RANGE.get(panel, (0.0, math.inf))  # the others are counts or lengths
        seeds = sum(1 for d in data if d)  # the seeds with data in this panel
        out.append({"arm": arm, "label": f"{arm} ({seeds} seed{'s' if seeds > 1 else ''})",
                    "x": line["x"], "y": line["y"],
                    "band": [b and [max(b[0], lo), min(b[1], hi)] for b in line["bands"]]})
    return out


def draw(by_arm: dict[str, list[dict]], out: Path) -> list[Path]:
    """Write the panels that have data into `out` (made if absent) and remove an earlier
    panel that no longer has any; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {arm: colors[i % len(colors)] for i, arm in enumerate(by_arm)}  # one per arm
    written = []
    for panel, title in PANELS.items():
        path = out / f"arms_{panel}.png"
        lines = arm_lines(by_arm, panel)
        if not lines:
            path.unlink(missing_ok=True)
            continue
        # success: the evaluations evenly spaced, by name; the others: the iteration
        ticks = sorted({x for line in lines for x in line["x"]})
        at = {x: ticks.index(x) for x in ticks} if panel == "success" else {x: x for x in ticks}
        fig, ax = plt.subplots(figsize=(7.5, 3.4))
        drawn = [{"arm": line["arm"], "label": line["label"],
                  "x": [at[x] for x in line["x"]], "y": line["y"],
                  "lo": [b[0] if b else y for b, y in zip(line["band"], line["y"])],
                  "hi": [b[1] if b else y for b, y in zip(line["band"], line["y"])],
                  "band": any(line["band"])} for line in lines]
        draw_panel(ax, drawn, title, X_LABEL.get(panel, "iteration"), colors=color,
                   legend=False)
        if panel == "success":
            ax.set_xticks(range(len(ticks)),
                          [SUCCESS_TICKS.get(x, f"after {x + 1} iter.") for x in ticks], fontsize=8)
        else:
            ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written

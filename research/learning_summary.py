"""The learning benchmark's summaries (research/learning.py runs the arms): each run's
held-out success and judge figures read from its directory, each arm's row over seeds, the
headline figures with their intervals, and the table."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from itertools import zip_longest
from pathlib import Path

from lab import cpu_label  # benchmarks.common's: one home for both tables' CPU column

from rlany.api import gain_interval, on_plan_share, t_interval, wilson_interval

JUDGED_EVAL = ["--set", "eval.judge=true"]  # arms with a judge: its step accuracy, base and final
ARMS = {  # each arm's `rlany loop` switches, in the order of the table's rows
    "policy-only": ["--no-step-feedback", "--no-rm-training", "--no-env-adaptation"],
    "+step": ["--step-feedback", "--no-rm-training", "--no-env-adaptation", *JUDGED_EVAL],
    "+rm": ["--step-feedback", "--rm-training", "--no-env-adaptation", *JUDGED_EVAL],
    # task adaptation alone: outcome reward only, no judge (the rewriter reads the env's
    # account of the episodes), no reward-model training
    "+adapt": ["--no-step-feedback", "--no-rm-training", "--env-adaptation",
               "--set", "adapt_tasks.critic=env"],
    "full": ["--step-feedback", "--rm-training", "--env-adaptation", *JUDGED_EVAL],
}

def _eval(path: Path) -> dict | None:
    if not path.exists():
        return None
    e = json.loads(path.read_text())
    n = e["trajectories"]
    return {"successes": round(e["success_rate"] * n), "episodes": n,
            "success": e["success_rate"], "judge_step_accuracy": e.get("judge_step_accuracy"),
            "on_plan_share": e.get("on_plan_share")}


def heldout_summary(path: Path) -> dict | None:
    """judge_heldout.py's result without its per-step P(+1) lists (they stay in the run)."""
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    for j in d["judges"].values():
        j.pop("p_positive", None)
    return d


def rollout_views(it_dir: Path) -> tuple[dict | None, float | None]:
    """One iteration's rollouts, read once: the judge on them (`judge_on_rollouts`) and the
    share of the policy's steps the env labels +1 (on a shortest plan): what step labels
    teach, visible before the outcome moves (None: no labels)."""
    from rlany.api import JsonlReader, Trajectory

    path = it_dir / "trajectories.jsonl"
    trajs = [t for _, t in JsonlReader(path, Trajectory, "trajectories")] if path.exists() \
        else []
    return judge_on_rollouts(it_dir, trajs), on_plan_share(trajs)


def judge_on_rollouts(it_dir: Path, trajectories: list) -> dict | None:
    """The judge's verdicts on one iteration's rollouts against the env's step labels
    (balanced accuracy) and its share of +1 verdicts, read from the iteration's files (so
    runs made before the judge stage reported it are covered too)."""
    from rlany.api import JsonlReader, JudgeSample, Judgment, judge_metrics

    if not (it_dir / "judgments.jsonl").exists():
        return None
    trajs = {t.traj_id: t for t in trajectories}
    judged = [j for _, j in JsonlReader(it_dir / "judgments.jsonl", Judgment, "judgments")
              if j.steps]
    judged_trajs = [trajs[j.traj_id] for j in judged]
    m = judge_metrics(judged_trajs, judged)
    # the consistency target's own agreement with the labels: a judge that gave every step
    # its trajectory's outcome (what consistency feedback pulls toward) would score this
    oracle = [replace(j, steps=[replace(st, samples=[JudgeSample(text="", score=t.outcome)])
                                for st in j.steps]) for j, t in zip(judged, judged_trajs)]
    scores = [s.score for j in judged for st in j.steps for s in st.samples if s.score]
    return {"label_accuracy": m["judge_step_accuracy"],
            "outcome_label_accuracy": judge_metrics(judged_trajs, oracle)["judge_step_accuracy"],
            "positive_share": sum(v == 1 for v in scores) / len(scores) if scores else None}


def summarize_run(run: Path) -> dict | None:
    """Base and latest evaluation, the curve, and the loop's per-iteration metrics."""
    base = _eval(run / "eval_base.json")
    if base is None:
        return None
    init = _eval(run / "eval_init.json")  # the warm start, where there is one
    curve = [{"iteration": -1, **base}]
    for it_dir in sorted(run.glob("iter_*")):
        e = _eval(it_dir / "eval.json")
        if e:
            curve.append({"iteration": int(it_dir.name[5:]), **e})
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
               ] if (run / "metrics.jsonl").exists() else []
    views = [rollout_views(d) for d in sorted(run.glob("iter_*"))]
    return {"run": str(run), "iterations_done": len(metrics), "base": base, "init": init,
            "final": curve[-1],
            "curve": curve, "train_acc": [m.get("train_acc") for m in metrics],
            "accepted_tasks": [m.get("accepted_tasks") or 0 for m in metrics],
            "env_loop": [m.get("env_loop") for m in metrics],
            "rm_samples": [m.get("rm_samples") for m in metrics],
            "stage_seconds": [m.get("seconds") for m in metrics],
            "judge_on_rollouts": [judge for judge, _ in views],
            "on_plan": [share for _, share in views],
            "seconds": round(sum(sum((m.get("seconds") or {}).values()) for m in metrics), 1),
            # base and trained judges on fixed held-out labelled steps (judge_heldout.py)
            "judge_heldout": heldout_summary(run / "judge_heldout.json"),
            # the run's own resolved config: what it ran with, also under --report-only
            "config": json.loads((run / "config.json").read_text())
            if (run / "config.json").exists() else None}


RUN_NAME = re.compile(r"^(policy-only|step|rm|adapt|full)(?:-(.+))?-s(\d+)$")


def collect(runs_dir: Path) -> dict[str, list[dict]]:
    """Every run under runs_dir evaluated after training at least once, by arm (a tagged
    variant is its own row, "ARM [TAG]"), in the arms' order, seeds ascending."""
    found = []
    for d in runs_dir.iterdir() if runs_dir.is_dir() else []:
        m = RUN_NAME.match(d.name)
        if m:
            arm = next(a for a in ARMS if a.strip("+") == m[1])
            found.append((list(ARMS).index(arm), m[2] or "", int(m[3]), arm, d))
    by_arm: dict[str, list[dict]] = {}
    for _, tag, seed, arm, d in sorted(found, key=lambda f: f[:3]):
        summary = summarize_run(d)
        if summary and len(summary["curve"]) > 1:
            by_arm.setdefault(f"{arm} [{tag}]" if tag else arm, []).append(
                {"seed": seed, **summary})
    return by_arm


def with_recorded(by_arm: dict[str, list[dict]], recorded: dict[str, list[dict]] | None,
                  runs_dir: Path, machine: dict | None = None
                  ) -> tuple[dict[str, list[dict]], list[str]]:
    """`collect`'s runs plus those an earlier results file (its "runs") recorded under the
    same runs directory and that are not summarized here: a fresh clone has the committed
    results and no runs/, so a report made after one new run still covers every seed
    instead of overwriting the file with that run alone. A run directory that is here and
    evaluated wins over its record. A kept record names the machine it ran on ("machine":
    the earlier file's where the record has no such key). Returns the runs by arm, in
    `collect`'s order, and the recorded runs it kept."""
    here = {r["run"] for runs in by_arm.values() for r in runs}
    merged = {arm: list(runs) for arm, runs in by_arm.items()}
    kept = []
    for arm, runs in (recorded or {}).items():
        for r in runs:
            if r["run"] in here or Path(r["run"]).parent != Path(runs_dir):
                continue
            # a record without the key predates per-run machines: the file's is its own;
            # one that says None (its host was not known) stays unknown
            merged.setdefault(arm, []).append(r if "machine" in r else {**r, "machine": machine})
            kept.append(r["run"])

    def order(arm: str) -> tuple[int, str]:
        base, _, tag = arm.partition(" [")
        return (list(ARMS).index(base) if base in ARMS else len(ARMS), tag.rstrip("]"))
    return ({arm: sorted(merged[arm], key=lambda r: r["seed"]) for arm in
             sorted(merged, key=order)}, sorted(kept))


def arm_summary(runs: list[dict]) -> dict:
    """Pooled over seeds: base and final success with Wilson intervals, the gain with a
    Newcombe interval, judge step accuracy base -> final (mean over seeds)."""
    kb = sum(r["base"]["successes"] for r in runs)
    nb = sum(r["base"]["episodes"] for r in runs)
    kf = sum(r["final"]["successes"] for r in runs)
    nf = sum(r["final"]["episodes"] for r in runs)

    gains = [r["final"]["success"] - r["base"]["success"] for r in runs]
    if warm_started(runs):  # the warm start alone, and RL's gain over it
        warm = [r["init"] for r in runs]
        kw, nw = sum(w["successes"] for w in warm), sum(w["episodes"] for w in warm)
        warm_start = {"success": kw / nw, "ci95": wilson_interval(kw, nw),
                      "rl_gain": kf / nf - kw / nw, "rl_gain_ci95": gain_interval(kf, nf, kw, nw),
                      "per_seed": [round(w["success"], 3) for w in warm]}
    else:
        warm_start = None

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None
    def it_seconds(rs):  # an iteration's stages without its evaluation, mean of iterations
        return mean(sum(v for k, v in sec.items() if k != "eval")
                    for r in rs for sec in r["stage_seconds"] if sec)
    return {"seeds": len(runs), "base": kb / nb, "base_ci95": wilson_interval(kb, nb),
            "final": kf / nf, "final_ci95": wilson_interval(kf, nf), "episodes": nf,
            "gain": kf / nf - kb / nb, "gain_ci95": gain_interval(kf, nf, kb, nb),
            "per_seed": [round(r["final"]["success"], 3) for r in runs],
            "gain_per_seed": [round(g, 3) for g in gains],
            "gain_seeds_t95": t_interval(gains),
            "iterations": [r["final"]["iteration"] + 1 for r in runs],
            "runs_on": runs_on(runs),
            "judge_step_accuracy": [mean(r["base"]["judge_step_accuracy"] for r in runs),
                                    mean(r["final"]["judge_step_accuracy"] for r in runs)],
            "accepted_tasks": [r["accepted_tasks"] for r in runs],
            # mean over seeds, per iteration: the judge on the rollouts it judged, and the
            # outcome's own accuracy there (the most consistency feedback can teach)
            "judge_on_rollouts": [
                {k: mean(j[k] if j else None for j in col)
                 for k in ("label_accuracy", "outcome_label_accuracy", "positive_share")}
                for col in zip_longest(*(r["judge_on_rollouts"] for r in runs))]
            if all(r.get("judge_on_rollouts") for r in runs) else None,
            # mean over seeds, per iteration: the on-plan share of the policy's rollout steps
            "on_plan": [mean(col) for col in zip_longest(*(r.get("on_plan") or [] for r in runs))],
            "warm_start": warm_start,
            "minutes_per_run": mean(r["seconds"] / 60 for r in runs),
            # where the runs ran (machine.boot_id; None: not recorded): seconds compare
            # only between arms that ran on the same hosts
            "hosts": sorted({(r.get("machine") or {}).get("boot_id") or "" for r in runs}),
            # an iteration's stages without its evaluation, mean over seeds and iterations:
            # what the judge costs per iteration (eval runs every eval_every, in every arm)
            "iteration_seconds": it_seconds(runs),
            "iteration_seconds_per_seed": [round(it_seconds([r]) or 0) for r in runs],
            "stage_seconds": {k: mean(sec.get(k) for r in runs for sec in r["stage_seconds"]
                                      if sec) for k in STAGE_ORDER}}


def runs_on(runs: list[dict]) -> list[dict]:
    """An arm's seeds per CPU setting and precision (a dtype its config sets, else `auto`'s)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for r in runs:
        m, conf = r.get("machine"), r.get("config") or {}
        tables = [conf.get("run") or {}, *(conf.get("tables") or {}).values()]
        dtype = next((t["dtype"] for t in tables if t.get("dtype") not in (None, "auto")),
                     ((m or {}).get("profile") or {}).get("dtype") or "unknown")
        groups.setdefault((cpu_label(m), dtype), []).append(r.get("seed"))
    return [{"cpu": c, "precision": d, "seeds": s} for (c, d), s in groups.items()]


# the keys rlany.loop.metrics writes under "seconds"
STAGE_ORDER = ("rollout", "judge", "score", "train_policy", "train_rm", "adapt")


def warm_started(runs: list[dict]) -> bool:
    """Every run of the arm started from a warm start (its eval_init.json was read): the
    arm's summary then has `warm_start`, and its baseline is policy-only [warm]."""
    return bool(runs) and all(r.get("init") for r in runs)


def baseline(arm: str, warm: bool, names) -> str | None:
    """The policy-only arm an arm is compared with: `policy-only [warm]` for a warm-started
    arm where that row exists (the same start), else `policy-only` (so policy-only [warm]
    against policy-only); None: none to compare."""
    for base in (("policy-only [warm]",) if warm else ()) + ("policy-only",):
        if base in names and base != arm:
            return base
    return None


def cost_ratios(arms: dict) -> dict | None:
    """Each arm's seconds per iteration over its policy-only baseline's (the judge's issue
    asks <= 1.5 for the judged loop); None without a policy-only arm, and no ratio where
    the two arms ran on other hosts (`hosts`: one AVX-512 host ran the same work 1.6x
    faster than another)."""
    out = {}
    for arm, a in arms.items():
        base = baseline(arm, bool(a.get("warm_start")), arms)
        only = arms[base].get("iteration_seconds") if base else None
        if only and a.get("iteration_seconds") and a.get("hosts") == arms[base].get("hosts"):
            out[arm] = round(a["iteration_seconds"] / only, 3)
    return out or None


def headline(by_arm: dict[str, list[dict]]) -> dict:
    """The two figures the judge's issue asks of a config, each with its 95% interval:
    `judge_gain`, the held-out judge step accuracy (judge_heldout.py: fixed labelled steps)
    final minus base under consistency feedback alone (the +rm arm, else +rm [warm]: the
    policy warm-started on expert demonstrations, the judge's labels nowhere), mean over
    seeds (t-interval over seeds; one seed: its bootstrap over tasks); and
    `full_minus_policy_only`, final held-out success pooled over seeds (Newcombe)."""
    out: dict = {"judge_gain": None, "full_minus_policy_only": None}
    rm = next((a for a in ("+rm", "+rm [warm]")
               if any(r.get("judge_heldout") for r in by_arm.get(a, []))), None)
    finals = [r["judge_heldout"]["judges"][r["judge_heldout"]["final"]]
              for r in by_arm.get(rm, []) if r.get("judge_heldout")
              and r["judge_heldout"].get("final")]
    if finals:
        gains = [f["gain"] for f in finals]
        out["judge_gain"] = {"value": round(sum(gains) / len(gains), 4),
                             "ci95": t_interval(gains) if len(gains) > 1
                             else finals[0]["gain_ci95"],
                             "per_seed": gains, "seeds": len(gains), "arm": rm,
                             "base": [r["judge_heldout"]["judges"]["base"]["bal_acc"]
                                      for r in by_arm[rm] if r.get("judge_heldout")]}
    # every arm's final held-out success against its policy-only baseline's (`baseline`:
    # warm-started arms against policy-only [warm]; the +step [label] upper bound's
    # included), pooled over seeds, Newcombe
    out["final_minus_policy_only"] = diffs = {}
    for arm, runs in by_arm.items():
        base = baseline(arm, warm_started(runs), by_arm)
        only = by_arm.get(base) if base else None
        if d := pooled_diff(runs, only):
            diffs[arm] = {**d, "against": base}
    # the full loop's row: untagged, else the warm-started one (`full [warm]`)
    full = next((a for a in ("full", "full [warm]") if a in diffs), None)
    out["full_minus_policy_only"] = {**diffs[full], "arm": full} if full else None
    # the environment loop's issue: +adapt against policy-only, full against +adapt
    out["adapt_minus_policy_only"] = ({**diffs["+adapt"], "arm": "+adapt"}
                                      if "+adapt" in diffs else None)
    out["full_minus_adapt"] = pooled_diff(by_arm.get("full"), by_arm.get("+adapt"))
    return out


def pooled_diff(runs: list[dict] | None, against: list[dict] | None) -> dict | None:
    """Final held-out success of `runs` minus `against`'s, each pooled over the seeds both
    arms ran (paired by seed: an arm's seeds the other has not run yet wait for it), with
    the Newcombe 95% interval; None unless they share a seed."""
    common = {r.get("seed") for r in runs or ()} & {r.get("seed") for r in against or ()}
    if not common:
        return None
    alone = {r.get("seed") for r in [*runs, *against]} - common
    runs, against = ([r for r in rs if r.get("seed") in common] for rs in (runs, against))
    k0, n0 = (sum(r["final"][k] for r in against) for k in ("successes", "episodes"))
    k1, n1 = (sum(r["final"][k] for r in runs) for k in ("successes", "episodes"))
    return {"value": round(k1 / n1 - k0 / n0, 4), "ci95": gain_interval(k1, n1, k0, n0),
            "seeds": sorted(common, key=str), "unpaired": sorted(alone, key=str)}


def versus(head: dict, costs: dict | None) -> str:
    """The lines under the table: each arm against policy-only (final held-out success,
    pooled over the seeds both ran, Newcombe 95%; seconds per iteration without
    evaluation)."""
    def seeds(d: dict) -> str:  # named where one arm has seeds the other has not run
        return (f" (seeds {', '.join(map(str, d['seeds']))}: the seeds both ran)"
                if d.get("unpaired") else "")

    diffs = head.get("final_minus_policy_only") or {}
    lines = [f"- {arm}: final {d['value']:+.3f} ({d['ci95'][0]:+.3f} to {d['ci95'][1]:+.3f}) "
             f"against {d.get('against', 'policy-only')}{seeds(d)}"
             + (f", {costs[arm]:.2f}x its seconds per iteration" if costs and arm in costs
                else "")
             for arm, d in diffs.items()]
    if d := head.get("full_minus_adapt"):
        lines.append(f"- full: final {d['value']:+.3f} ({d['ci95'][0]:+.3f} to "
                     f"{d['ci95'][1]:+.3f}) against +adapt{seeds(d)}")
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


def table(arms: dict) -> str:
    def ci(lo_hi):
        return f"{lo_hi[0]:.2f}-{lo_hi[1]:.2f}"

    def num(v):
        return "-" if v is None else f"{v:.3f}"

    def num0(v):
        return "-" if v is None else f"{v:.0f}"

    def rollouts(per_it):
        if not per_it or all(j["label_accuracy"] is None for j in per_it):
            return "-"
        return " / ".join("-" if j["label_accuracy"] is None else
                          f"{j['label_accuracy']:.2f} ({j['outcome_label_accuracy']:.2f})"
                          for j in per_it)

    def plan(shares):
        if not shares or all(v is None for v in shares):
            return "-"
        return " / ".join("-" if v is None else f"{v:.2f}" for v in shares)

    def seeds_t(t):
        return "" if t is None else f" ({t[0]:+.2f} to {t[1]:+.2f})"

    def warm(w):
        if not w:
            return "-"
        return (f"{w['success']:.3f} ({ci(w['ci95'])}); RL {w['rl_gain']:+.3f} "
                f"({w['rl_gain_ci95'][0]:+.2f} to {w['rl_gain_ci95'][1]:+.2f})")

    def where(s):  # seeds per CPU setting and precision, as the runs recorded them
        return "; ".join(f"{', '.join(map(str, g['seeds']))} ({g['cpu']}, {g['precision']})"
                         for g in s.get("runs_on") or []) or str(s["seeds"])
    lines = ["| arm | seeds (CPU, precision) | iterations | base success (95%) | warm start "
             "(95%); RL's gain over it | final success (95%) | gain (95%, pooled) | gain per "
             "seed (95% t over seeds) | final per seed | judge step acc. (eval) | judge on its "
             "rollouts, per iteration (outcome) | on-plan steps of its rollouts, per iteration "
             "| accepted tasks | stage min/run | s/iteration (no eval) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, s in arms.items():
        judge = s["judge_step_accuracy"]
        lines.append(
            f"| {arm} | {where(s)} | {'/'.join(map(str, s['iterations']))} | "
            f"{s['base']:.3f} ({ci(s['base_ci95'])}) | {warm(s.get('warm_start'))} | "
            f"{s['final']:.3f} ({ci(s['final_ci95'])}) | {s['gain']:+.3f} "
            f"({s['gain_ci95'][0]:+.2f} to {s['gain_ci95'][1]:+.2f}) | "
            f"{', '.join(f'{g:+.3f}' for g in s['gain_per_seed'])}"
            f"{seeds_t(s['gain_seeds_t95'])} | {', '.join(map(str, s['per_seed']))} | "
            f"{num(judge[0])} -> {num(judge[1])} | {rollouts(s['judge_on_rollouts'])} | "
            f"{plan(s.get('on_plan'))} | "
            f"{'; '.join(','.join(map(str, a)) for a in s['accepted_tasks'])} | "
            f"{s['minutes_per_run']:.0f} | {num0(s.get('iteration_seconds'))} |")
    return "\n".join(lines) + "\n"

"""The pinned protocol's outcomes (research/README.md, "Protocol, pinned 2026-11-29 before
its first seed"), read from its runs: `learning.py --bench protocol-mid` names them
ARM[-TAG]-sSEED (policy-only-warm-s0, adapt-learn-s0, policy-only-gigpo-s0, ...) and
`learning_summary.collect` reads them as rows ("policy-only [warm]", "+adapt [learn]", ...).

Primary, exactly as the protocol fixes them: final held-out success of one arm minus
another's, pooled over the seeds both arms have (paired by seed; `learning_summary.
pooled_diff`, Newcombe 95%), with the seeds used and each seed's figures; null while an arm
has no such seed:
    adapt_minus_policy_only   +adapt [learn] - policy-only [warm]   (target >= +0.05, lo > 0)
    gigpo_minus_policy_only   policy-only [gigpo] - policy-only [warm]  (the same target)
    labels_minus_policy_only  perfect step labels - policy-only [warm]
    judge_minus_gigpo         the learned judge (+rm) - policy-only [gigpo]
Each arm's seconds per iteration (metrics.jsonl `seconds`, evaluation left out:
`learning_summary.arm_summary`) with the CPU its runs recorded (the machine of
research/results/protocol-mid.json's record of the run, or this host's for a run made since
it booted, as learning.py's own summary does).

Secondary, per run and pooled per arm: held-out success by task kind (the final eval's
per-task records, the goal kind of each held-out task); the kind mix of accepted rewrites
(edit kind and goal kind: env_loop_why.edits); success on the original tasks in the pool per
iteration and pooled (env_loop_why.originals); success on accepted rewrites against their
roots, in the pool's rollouts (per iteration and pooled) and at acceptance; the rewriter's
choices by edit kind and menu position (metrics `choice_by_kind`, `choice_by_position`);
GiGPO's anchor groups (`anchor_shared_share`, `anchor_group_mean`); the warm start's own
held-out success (eval_init.json, shared by a seed's arms).

Runs the earlier summary recorded under the same runs directory whose directories are gone
(no run state is committed) stay in it as recorded. Reads files only: seconds, no model.

    python research/protocol.py                       # runs/protocol-mid
    python research/protocol.py --runs-dir /work/wt-exp/runs/protocol-mid
    python research/protocol.py --arm judge="+rm [judge]"

Writes research/results/protocol-mid-summary.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from env_loop_why import edits, originals  # noqa: E402
from lab import RESULTS, machine, made_since_boot, read_rows, save  # noqa: E402
from learning_summary import arm_summary, collect, pooled_diff, with_recorded  # noqa: E402

from rlany.api import gain_interval, wilson_interval  # noqa: E402

BENCH = "protocol-mid"  # learning.py's --bench: its runs, and its results file's machines
NAME = f"{BENCH}-summary"
ROWS = {  # the protocol's arms -> the rows their runs may be named as; the first found wins
    "policy-only": ("policy-only [warm]",),
    "adapt": ("+adapt [learn]",),
    "gigpo": ("policy-only [gigpo]",),
    "labels": ("+step [label]", "+step [labels]", "+step [warm-label]"),
    "judge": ("+rm [judge]", "+rm [warm]", "+rm"),  # step feedback + reward-model training
}
PRIMARY = {"adapt_minus_policy_only": ("adapt", "policy-only"),
           "gigpo_minus_policy_only": ("gigpo", "policy-only"),
           "labels_minus_policy_only": ("labels", "policy-only"),
           "judge_minus_gigpo": ("judge", "gigpo")}
TARGET = 0.05  # adapt's and gigpo's target: >= +0.05 with the lower bound above 0
TARGETED = ("adapt_minus_policy_only", "gigpo_minus_policy_only")


def rate(k: int, n: int) -> dict:
    return {"successes": k, "episodes": n, "success": round(k / n, 4) if n else None,
            "ci95": wilson_interval(k, n)}


def eval_tasks_path(run: Path, given: Path | None) -> Path | None:
    """The held-out tasks the run evaluated on: `given`, else its config's `eval_tasks`
    (relative to the tree the run was made in, then to here)."""
    if given:
        return given
    conf = run / "config.json"
    rel = json.loads(conf.read_text()).get("eval_tasks") if conf.exists() else None
    if not rel:
        return None
    found = [b / rel for b in (*run.resolve().parents, Path.cwd()) if (b / rel).is_file()]
    return found[0] if found else None


def heldout_by_kind(run: Path, tasks: Path | None) -> dict | None:
    """The final evaluation's successes and episodes by the goal kind of each held-out
    task ("?": a task the tasks file does not hold); None without an evaluation."""
    evals = sorted(run.glob("iter_*/eval.json"))
    if not evals:
        return None
    kinds = {t["task_id"]: (t["spec"].get("goal") or {}).get("kind", "?")
             for t in (read_rows(tasks) if tasks else [])}
    out: dict[str, list[int]] = {}
    for row in json.loads(evals[-1].read_text()).get("per_task") or []:
        n = out.setdefault(kinds.get(row["task_id"], "?"), [0, 0])
        n[0], n[1] = n[0] + row["successes"], n[1] + row["n"]
    return dict(sorted(out.items()))


def rewrites_vs_roots(run: Path) -> list[dict]:
    """Per iteration: the pool's accepted rewrites (lineage.accepted_iter set) drawn, their
    episodes and successes, and their roots' episodes and successes in the same rollouts
    (errored episodes left out, as env_loop_why.originals does)."""
    out = []
    for d in sorted(run.glob("iter_*")):
        if not (d / "trajectories.jsonl").exists():
            break
        rewrites = {t["task_id"]: t["lineage"]["root_id"]
                    for t in read_rows(d / "rollout_tasks.jsonl")
                    if (t.get("lineage") or {}).get("accepted_iter") is not None}
        roots = set(rewrites.values())
        n = Counter()
        for t in read_rows(d / "trajectories.jsonl"):
            side = "rewrite" if t["task_id"] in rewrites else \
                "root" if t["task_id"] in roots else None
            if side and t.get("finish") != "error":
                n[f"{side}_episodes"] += 1
                n[f"{side}_successes"] += (t.get("outcome") or 0) > 0
        out.append({"iteration": int(d.name[5:]), "rewrites": len(rewrites),
                    **{k: n[k] for k in ("rewrite_episodes", "rewrite_successes",
                                         "root_episodes", "root_successes")}})
    return out


def at_acceptance(run: Path) -> dict:
    """The accepted candidates' trial success acc(q') against their parents' acc(q) (the
    root, where rewrites are made from their roots), means over the accepted."""
    won = [d for f in sorted(run.glob("iter_*/decisions.jsonl")) for d in read_rows(f)
           if d.get("kind", "decision") == "decision" and d.get("accepted") and "acc" in d]

    def mean(key: str) -> float | None:
        return round(sum(d[key] for d in won) / len(won), 4) if won else None
    return {"accepted": len(won), "acc_mean": mean("acc"), "parent_acc_mean": mean("parent_acc")}


def summed(rows: list[dict], key: str) -> dict:
    """A count the metrics' `env_loop` holds per iteration (e.g. choice_by_kind), summed;
    numeric keys (menu positions) in their order."""
    c: Counter = Counter()
    for m in rows:
        c.update((m.get("env_loop") or {}).get(key) or {})
    return dict(sorted(c.items(), key=lambda kv: (not kv[0].isdigit(),
                                                  int(kv[0]) if kv[0].isdigit() else 0, kv[0])))


def anchors(rows: list[dict]) -> dict | None:
    """GiGPO's anchor groups per iteration (None: the run scored without them)."""
    per = [{"iteration": i, "shared_share": m.get("anchor_shared_share"),
            "group_mean": m.get("anchor_group_mean")} for i, m in enumerate(rows)]
    per = [p for p in per if p["shared_share"] is not None]
    if not per:
        return None
    return {"per_iteration": per, **{f"{k}_mean": round(sum(p[k] for p in per) / len(per), 4)
                                     for k in ("shared_share", "group_mean")}}


def run_figures(run: Path, tasks: Path | None) -> dict:
    """One run's secondary figures, read from its directory."""
    rows = read_rows(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []
    e = edits(run)
    return {"heldout_by_kind": heldout_by_kind(run, eval_tasks_path(run, tasks)),
            "accepted_by_edit_kind": e["accepted"],
            "accepted_by_goal_kind": e["accepted_goal_kinds"],
            "originals": originals(run),
            "rewrites_vs_roots": rewrites_vs_roots(run),
            "at_acceptance": at_acceptance(run),
            "choice_by_kind": summed(rows, "choice_by_kind"),
            "choice_by_position": summed(rows, "choice_by_position"),
            "offered_by_kind": summed(rows, "offered_by_kind"),
            "anchors": anchors(rows)}


def pooled(runs: list[dict]) -> dict:
    """An arm's secondary figures pooled over its seeds (counts added)."""
    figs = [r["figures"] for r in runs]
    kinds: dict[str, list[int]] = {}
    for f in figs:
        for kind, (k, n) in (f["heldout_by_kind"] or {}).items():
            kinds.setdefault(kind, [0, 0])
            kinds[kind] = [kinds[kind][0] + k, kinds[kind][1] + n]

    def total(key: str) -> dict:
        return dict(sum((Counter(f[key]) for f in figs), Counter()).most_common())

    orig = [x for f in figs for x in f["originals"]]
    rw = Counter()
    for f in figs:
        for x in f["rewrites_vs_roots"]:
            rw.update({k: v for k, v in x.items() if k.endswith(("episodes", "successes"))})
    k1, n1, k0, n0 = (rw[k] for k in ("rewrite_successes", "rewrite_episodes",
                                      "root_successes", "root_episodes"))
    shares = [f["anchors"] for f in figs if f["anchors"]]
    return {
        "heldout_by_kind": {kind: rate(k, n) for kind, (k, n) in sorted(kinds.items())},
        "accepted_by_edit_kind": total("accepted_by_edit_kind"),
        "accepted_by_goal_kind": total("accepted_by_goal_kind"),
        "originals": rate(sum(x["succeeded"] for x in orig), sum(x["episodes"] for x in orig)),
        "originals_per_iteration": [
            rate(sum(x["succeeded"] for x in orig if x["iteration"] == i),
                 sum(x["episodes"] for x in orig if x["iteration"] == i))
            for i in sorted({x["iteration"] for x in orig})],
        "rewrites": rate(k1, n1), "their_roots": rate(k0, n0),
        "rewrites_minus_roots": (round(k1 / n1 - k0 / n0, 4) if n1 and n0 else None),
        "rewrites_minus_roots_ci95": gain_interval(k1, n1, k0, n0),
        "choice_by_kind": total("choice_by_kind"),
        "choice_by_position": summed([{"env_loop": {"p": f["choice_by_position"]}}
                                      for f in figs], "p"),
        "offered_by_kind": total("offered_by_kind"),
        "anchor_shared_share": round(sum(a["shared_share_mean"] for a in shares)
                                     / len(shares), 4) if shares else None,
        "anchor_group_mean": round(sum(a["group_mean_mean"] for a in shares)
                                   / len(shares), 4) if shares else None}


def final(r: dict) -> dict:
    return {k: r["final"][k] for k in ("successes", "episodes", "success")}


def primary(by_arm: dict[str, list[dict]], rows: dict[str, str | None]) -> dict:
    """The four differences, each with the rows it compared and its seeds' figures."""
    out = {}
    for name, (arm, against) in PRIMARY.items():
        a, b = by_arm.get(rows[arm]) or [], by_arm.get(rows[against]) or []
        d = pooled_diff(a, b)
        if d is None:
            out[name] = None
            continue
        seeds = {r["seed"]: r for r in b}
        d = {**d, "arm": rows[arm], "against": rows[against],
             "per_seed": [{"seed": r["seed"], "arm": final(r), "against": final(seeds[r["seed"]]),
                           "diff": round(r["final"]["success"]
                                         - seeds[r["seed"]]["final"]["success"], 4)}
                          for r in a if r["seed"] in seeds]}
        if name in TARGETED:
            d["target_met"] = d["value"] >= TARGET and d["ci95"][0] > 0
        out[name] = d
    return out


def speed(runs: list[dict]) -> dict:
    """An arm's seconds per iteration (no evaluation) and the CPU its runs recorded."""
    s = arm_summary(runs)
    return {"seconds_per_iteration": s["iteration_seconds"] and round(s["iteration_seconds"], 1),
            "per_seed": s["iteration_seconds_per_seed"], "seeds": [r["seed"] for r in runs],
            "cpu": s["runs_on"],
            "cpu_models": sorted({(r.get("machine") or {}).get("cpu_model") or "unknown"
                                  for r in runs})}


def init_by_seed(by_arm: dict[str, list[dict]]) -> dict:
    """The warm start's own held-out success per seed (its first row's), and whether every
    arm of the seed evaluated the same one (the protocol shares it); if not, each arm's."""
    seen: dict[int, dict[str, tuple]] = {}
    for arm, runs in by_arm.items():
        for r in runs:
            if r.get("init"):
                seen.setdefault(r["seed"], {})[arm] = (r["init"]["successes"],
                                                       r["init"]["episodes"])
    out = {}
    for seed, v in sorted(seen.items()):
        shared = len(set(v.values())) == 1
        out[str(seed)] = {**rate(*next(iter(v.values()))), "shared": shared,
                          **({} if shared else {"by_arm": {a: list(x) for a, x in v.items()}})}
    return out


def with_machines(by_arm: dict[str, list[dict]], learning: dict) -> None:
    """Each run's machine: this host for a run made since it booted, else learning.py's
    record of the run (its results file), else unknown (None)."""
    recorded = {r["run"]: r.get("machine") for runs in (learning.get("runs") or {}).values()
                for r in runs}
    here = None
    for runs in by_arm.values():
        for r in runs:
            if "machine" in r:
                continue
            if made_since_boot(Path(r["run"]) / "config.json"):
                here = here or machine()
                r["machine"] = here
            else:
                r["machine"] = recorded.get(r["run"])


def summary(runs_dir: Path, chosen: dict[str, str], tasks: Path | None = None) -> dict:
    """The protocol's summary of the evaluated runs under `runs_dir`, with the runs the
    earlier summary recorded there (their directories gone); `chosen`: rows named for
    ROWS' arms (--arm)."""
    by_arm = collect(runs_dir)
    for runs in by_arm.values():
        for r in runs:
            r["figures"] = run_figures(Path(r["run"]), tasks)
    earlier, learning = (json.loads(p.read_text()) if p.exists() else {}
                         for p in (RESULTS / f"{NAME}.json", RESULTS / f"{BENCH}.json"))
    by_arm, kept = with_recorded(by_arm, earlier.get("runs"), runs_dir, earlier.get("machine"))
    if not by_arm:
        raise SystemExit(f"{runs_dir}: no evaluated runs (and none recorded in "
                         f"{RESULTS / NAME}.json)")
    with_machines(by_arm, learning)
    rows = {arm: chosen.get(arm) or next((n for n in names if n in by_arm), None)
            for arm, names in ROWS.items()}
    return {"protocol": "research/README.md, \"Protocol, pinned 2026-11-29 before its first "
                        "seed\"", "runs_dir": str(runs_dir), "rows": rows,
            "seeds": {arm: [r["seed"] for r in runs] for arm, runs in by_arm.items()},
            **primary(by_arm, rows),
            "seconds_per_iteration": {arm: speed(runs) for arm, runs in by_arm.items()},
            "init": init_by_seed(by_arm),
            "warm_start": {arm: arm_summary(runs)["warm_start"] for arm, runs in by_arm.items()},
            "secondary": {arm: pooled(runs) for arm, runs in by_arm.items()},
            "recorded_runs": kept, "runs": by_arm}


def markdown(s: dict) -> str:
    """The summary's short text: the primary outcomes, the seconds, the secondary lines."""
    def ci(v: list | None) -> str:
        return "-" if not v else f"{v[0]:+.3f} to {v[1]:+.3f}"

    lines = [f"# {BENCH}: the pinned protocol's outcomes ({s['runs_dir']})", "",
             "| outcome | arm - against | seeds | value (95% Newcombe) | per seed | target |",
             "|---|---|---|---|---|---|"]
    for name in PRIMARY:
        d = s[name]
        if d is None:
            lines.append(f"| {name} | - | none yet | - | - | - |")
            continue
        met = {True: "met", False: "missed"}.get(d.get("target_met"), "-")
        per_seed = ", ".join(f"{x['diff']:+.3f}" for x in d["per_seed"])
        lines.append(f"| {name} | {d['arm']} - {d['against']} | "
                     f"{', '.join(map(str, d['seeds']))} | {d['value']:+.3f} ({ci(d['ci95'])})"
                     f" | {per_seed} | {met} |")
    lines += ["", "| arm | seeds | s/iteration (no eval) | per seed | CPU (precision): seeds |",
              "|---|---|---|---|---|"]
    for arm, v in s["seconds_per_iteration"].items():
        cpu = "; ".join(f"{g['cpu']} ({g['precision']}): {', '.join(map(str, g['seeds']))}"
                        for g in v["cpu"])
        lines.append(f"| {arm} | {', '.join(map(str, v['seeds']))} | "
                     f"{v['seconds_per_iteration']} | {', '.join(map(str, v['per_seed']))} | "
                     f"{cpu} ({', '.join(v['cpu_models'])}) |")
    lines += ["", "Warm start (eval_init) per seed: " + (", ".join(
        f"s{k} {v['successes']}/{v['episodes']}{'' if v['shared'] else ' (not shared!)'}"
        for k, v in s["init"].items()) or "none recorded"), ""]
    for arm, p in s["secondary"].items():
        kinds = ", ".join(f"{k} {v['successes']}/{v['episodes']}"
                          for k, v in p["heldout_by_kind"].items())
        lines.append(f"- {arm}: held out by kind {kinds or '-'}; originals in the pool "
                     f"{p['originals']['successes']}/{p['originals']['episodes']}")
        if p["accepted_by_edit_kind"] or p["choice_by_kind"]:
            lines.append(
                f"  accepted by edit kind {p['accepted_by_edit_kind']}, by goal kind "
                f"{p['accepted_by_goal_kind']}; rewrites {p['rewrites']['successes']}/"
                f"{p['rewrites']['episodes']} against their roots "
                f"{p['their_roots']['successes']}/{p['their_roots']['episodes']}; choices by "
                f"kind {p['choice_by_kind']}, by menu position {p['choice_by_position']}")
        if p["anchor_shared_share"] is not None:
            lines.append(f"  anchor groups: {p['anchor_shared_share']:.0%} of steps shared, "
                         f"mean size {p['anchor_group_mean']:.2f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", type=Path, default=Path(f"runs/{BENCH}"))
    parser.add_argument("--arm", action="append", default=[], metavar="ARM=ROW",
                        help=f"the row an arm's runs are named as, one of {list(ROWS)} "
                        "(default: the first of ROWS found), e.g. judge='+rm [judge]'")
    parser.add_argument("--eval-tasks", type=Path, help="the held-out tasks (default: each "
                        "run's config eval_tasks)")
    args = parser.parse_args(argv)
    chosen = {}
    for given in args.arm:
        arm, _, row = given.partition("=")
        if arm not in ROWS or not row:
            parser.error(f"--arm {given!r}: ARM=ROW with ARM one of {', '.join(ROWS)}")
        chosen[arm] = row
    if args.eval_tasks and not args.eval_tasks.is_file():
        parser.error(f"--eval-tasks {args.eval_tasks}: no such file")
    result = summary(args.runs_dir, chosen, args.eval_tasks)
    text = markdown(result)
    print(text)
    print(save(NAME, result), file=sys.stderr)
    (RESULTS / f"{NAME}.md").write_text(text)
    return result


if __name__ == "__main__":
    main()

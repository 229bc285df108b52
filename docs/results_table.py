"""Write README.md's results: one table made from the committed results files, and the line
that times the test suite.

    python docs/results_table.py            # or `make docs`; rewrites the README's blocks
    python docs/results_table.py --check    # exit 1 if they are stale

Each row is a setting and where its figures sit in its file (ROWS); every number in a row is
read from that file: the success before and after (pooled over seeds, or the two arms
compared), the gain with its 95% interval, and the CPU setting and precision the file
records for its runs. A number edited by hand in the README, or a results file rewritten
without regenerating the table, fails `--check`.

The learning figures are the summaries research/learning.py wrote into each file's `arms`
(pooled over seeds: Wilson intervals, the gain's Newcombe interval) and `headline` keys;
the CPU column is research/learning_summary.runs_on over the file's run records, as the
research tables name it. The speed rows read benchmarks/results/ (cpu_label: one home,
benchmarks/common.py).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import _write_or_check as write_or_check

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
sys.path.insert(0, str(ROOT / "research"))  # learning_summary (it adds benchmarks.common)
from learning_summary import cpu_label, runs_on  # noqa: E402

BLOCKS = ("results-table", "suite-time")
HEADER = ("| setting | before -> after | gain, 95% | CPU | file |\n"
          "|---|---|---|---|---|\n")


def load(file: str) -> dict:
    return json.loads((ROOT / file).read_text())


def _pm(v: float) -> str:
    return f"{v:+.3f}"


def _ci(lo_hi: list[float]) -> str:
    return f"{lo_hi[0]:+.3f} to {lo_hi[1]:+.3f}"


def where_arms(r: dict, *arms: str) -> str:
    """The CPU setting and precision of an arm's runs, as the research tables name them
    (a run record without its own machine ran on the file's)."""
    runs = [x if "machine" in x else {**x, "machine": r.get("machine")}
            for arm in arms for x in r["runs"][arm]]
    return "; ".join(dict.fromkeys(f"{g['cpu']}, {g['precision']}" for g in runs_on(runs)))


def where_bench(r: dict) -> str:
    """A speed result's CPU setting and precision (its name's last part: `-float32`); its
    core count is the table's (2: `cpus`, checked by tests/test_readme_results.py)."""
    precision = r["benchmark"].rsplit("-", 1)[-1]
    return f"{cpu_label(r['machine'])}, {precision}"


# Each row kind: (results file's dict, key) -> (before -> after, gain, CPU).
Cells = tuple[str, str, str]


def arm(r: dict, name: str) -> Cells:
    """An arm's held-out success, base -> after RL, pooled over seeds."""
    a = r["arms"][name]
    return (f"{a['base']:.3f} -> {a['final']:.3f}", f"{_pm(a['gain'])} ({_ci(a['gain_ci95'])})",
            where_arms(r, name))


def warm(r: dict, name: str) -> Cells:
    """A warm-started arm: the warm start's success -> after RL, RL's gain over it."""
    a, w = r["arms"][name], r["arms"][name]["warm_start"]
    return (f"{w['success']:.3f} -> {a['final']:.3f}",
            f"{_pm(w['rl_gain'])} ({_ci(w['rl_gain_ci95'])})", where_arms(r, name))


def versus(r: dict, pair: str) -> Cells:
    """Final held-out success of arm A against arm B ("A / B"), over the seeds both ran."""
    name, against = pair.split(" / ")
    d = (r["full_minus_adapt"] if (name, against) == ("full", "+adapt")
         else r["final_minus_policy_only"][name])
    if d.get("against", against) != against:
        raise SystemExit(f"{r['benchmark']}: {name} is compared with {d['against']}")
    return (f"{r['arms'][against]['final']:.3f} -> {r['arms'][name]['final']:.3f}",
            f"{_pm(d['value'])} ({_ci(d['ci95'])})", where_arms(r, name, against))


def judge(r: dict, _: str) -> Cells:
    """The judge's held-out step accuracy (balanced), base -> trained, mean over seeds."""
    j = r["judge_gain"]
    base = sum(j["base"]) / len(j["base"])
    return (f"{base:.3f} -> {base + j['value']:.3f}", f"{_pm(j['value'])} ({_ci(j['ci95'])})",
            where_arms(r, j.get("arm", "+rm")))


def demo(r: dict, _: str) -> Cells:
    """`make demo`'s one run: held-out successes base -> final, its gain."""
    b, f = r["base"], r["final"]
    return (f"{b['successes'] / b['episodes']:.3f} -> {f['successes'] / f['episodes']:.3f}",
            f"{_pm(r['gain'])} ({_ci(r['gain_ci95'])})", where_bench(r))


def shared_prefix(r: dict, _: str) -> Cells:
    s = r["seconds_per_step"]
    return (f"{s['plain']} -> {s['shared']} s/step", f"{r['speedup']}x, same losses",
            where_bench(r))


def trl(r: dict, _: str) -> Cells:
    m = r["median"]
    return (f"{m['trl']['wall']} -> {m['rlany']['wall']} s/step", f"{r['ratio']}x",
            where_bench(r))


def prime_rl(r: dict, _: str) -> Cells:
    """gpu.json's H100 runs against prime-rl's published row: full fine-tuning with
    activations recomputed, the 4k- and the 15.9k-response shapes."""
    a = r["h100_anchor"]
    speeds = sorted(a["runs"][s]["tokens_per_s_median"]
                    for s in ("full:100:15900:gc", "full:12000:4000:gc"))
    base = a["prime_rl"]["full"]["tokens_per_s"]
    return (f"{base / 1000:.1f}k -> {speeds[0] / 1000:.1f}k-{speeds[-1] / 1000:.1f}k tokens/s",
            f"{speeds[0] / base:.2f}x-{speeds[-1] / base:.2f}x",
            f"1 {a['machine']['device']}, bf16")


def clone(r: dict, _: str) -> Cells:
    """What `git clone` downloads: the whole history -> the tip alone."""
    return (f"{r['full']['git_mib']} -> {r['shallow']['git_mib']} MiB", f"{r['ratio']}x", "-")


def install(r: dict, _: str) -> Cells:
    """`make install` on a fresh shallow checkout: its minutes and the .venv it makes."""
    return (f"{r['install_minutes']} min, .venv {r['venv_mib'] / 1024:.1f} GiB", "-", "-")


def demo_setting(r: dict) -> str:
    return f"`make demo`, seed 0, {r['minutes']} min"


B, R = "benchmarks/results/", "research/results/"
# (setting, results file, row kind, key); a setting may be a function of the file
ROWS: list[tuple[str | Callable[[dict], str], str, Callable[[dict, str], Cells], str]] = [
    (demo_setting, B + "demo-avx2forced-float32.json", demo, ""),
    (demo_setting, B + "demo-avx512-bfloat16.json", demo, ""),
    ("`make demo`'s config, 3 seeds", R + "learning-demo.json", arm, "policy-only [demo]"),
    ("household, policy-only RL, 3 iterations", R + "learning.json", arm, "policy-only"),
    ("the same after a warm start (expert demos + `rlany sft`)", R + "learning.json", warm,
     "policy-only [warm]"),
    ("sums (reasoning env), policy-only RL", R + "learning-reasoning.json", arm, "policy-only"),
    ("MiniWoB++ pages, base outcomes mixed", R + "learning-miniwob-mixed.json", arm,
     "policy-only"),
    ("judge step accuracy, consistency feedback only",
     R + "learning-judge-logloss.json", judge, ""),
    ("`mid.toml`: perfect step labels vs policy-only", R + "learning-mid-lr1e4.json",
     versus, "+step [warm-label] / policy-only [warm]"),
    ("env loop, `mid.toml`: adapted tasks vs policy-only",
     R + "learning-adapt-mid.json", versus, "+adapt / policy-only"),
    ("env loop, `mid.toml`: the full loop vs adapted tasks",
     R + "learning-adapt-mid.json", versus, "full / +adapt"),
    ("env loop, `learn.toml`: adapted tasks vs policy-only",
     R + "learning-adapt-learn.json", versus, "+adapt / policy-only"),
    ("speed: shared prompt prefixes, train-policy", B + "shared_prefix-avx2-float32.json",
     shared_prefix, ""),
    ("speed: an RL step, TRL's GRPOTrainer -> rlany", B + "trl-avx512-float32.json", trl, ""),
    ("speed: Qwen3-0.6B's shape, 16k tokens, full: prime-rl -> rlany",
     B + "gpu.json", prime_rl, ""),
    ("`git clone`: the history -> `--depth 1`", B + "clone.json", clone, ""),
    ("`make install` on that clone, pip's cache off, wheels from a local mirror",
     B + "install.json", install, ""),
]


def table() -> str:
    rows = []
    for setting, file, kind, key in ROWS:
        r = load(file)
        before_after, gain, cpu = kind(r, key)
        text = setting(r) if callable(setting) else setting
        rows.append(f"| {text} | {before_after} | {gain} | {cpu} | [{Path(file).name}]({file}) |")
    return HEADER + "\n".join(rows) + "\n"


def suite_time() -> str:
    """The Tests section's line: when the suite was last timed, its count then, how long, on
    what."""
    file = B + "suite-avx2forced-float32.json"
    r = load(file)
    m = r["machine"]
    return (f"`make test` timed {m['date'][:10]}: {r['counts']['passed']} tests in "
            f"{r['minutes']} min, {m['cpus']} cores of an {m.get('cpu_model') or 'unnamed CPU'}, "
            f"{where_bench(r)} ([{Path(file).name}]({file})).\n")


def render(doc: str) -> str:
    """The README with its generated blocks made anew."""
    for block, text in zip(BLOCKS, (table(), suite_time())):
        begin, end = f"<!-- {block}:begin -->\n", f"<!-- {block}:end -->"
        if begin not in doc or end not in doc:
            raise SystemExit(f"README.md has no {begin.strip()} ... {end} block")
        head, rest = doc.split(begin, 1)
        doc = head + begin + text + rest[rest.index(end):]
    return doc


if __name__ == "__main__":
    write_or_check.main(__doc__, README, lambda: render(README.read_text()),
                        "README.md's results are stale or edited by hand: run `make docs`")

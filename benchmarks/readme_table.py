"""benchmarks/README.md's speed table, generated from benchmarks/results/*.json (`make bench`
and `make bench-all` rewrite it; `python benchmarks/readme_table.py` alone regenerates it
from the committed results). One row per result file: what was measured, the figure, the
target, whether it was met, and the machine it ran on, read from the file: the CPU setting
(`cpu_label`), the dtype, the date.
research/ keeps its results and tables apart (research/results/, research/README.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, cpu_label, write_readme_block  # noqa: E402


def _training(r: dict) -> str:
    t = r["tokens_per_s"]
    return (f"{r['ratio']} ({t['generation']} vs {t['bare']} tokens/s) with the old log-probs "
            f"from generation; {r['ratio_recompute']} ({t['recompute']}) recomputing them")


def _trl(r: dict) -> str:
    a, b = r["median"]["rlany"], r["median"]["trl"]
    return (f"{r['ratio']} ({a['wall']} vs {b['wall']} s per step): generation {a['gen']} vs "
            f"{b['gen']} s, training {a['train']} vs {b['train']} s; sequences trained per "
            f"step {a['samples']:g} vs {b['samples']:g}")


def _memory(r: dict) -> str:
    p, t = r["peak_rss_mb"], r["train_seconds"]
    return (f"peak RSS {p['engine']:.0f} vs {p['disk']:.0f} MB ({r['saved_mb']:.0f} MB saved), "
            f"train stage {t['engine']:.1f} vs {t['disk']:.1f} s (borrowing the engine's "
            f"network / loading a copy)")


def _engines(r: dict) -> str:
    if "measured" in r:  # engines-SETTING.json: per kind, base / adapter (first pass)
        by = {(x["arm"], x["kind"], x["adapter"]): x["tokens_per_s"] for x in r["rows"]
              if x["pass"] == "first" or not x["adapter"]}
        arms = list(dict.fromkeys(a for a, _, _ in by))
        kinds = "; ".join(k + ": " + ", ".join(
            f"{a} {by.get((a, k, False), '-')} / {by.get((a, k, True), '-')}" for a in arms)
            for k in ("rollout", "judge"))
        picks = ", ".join(f"{s} {v['engine']}" for s, v in r["auto_picks"].items())
        return (f"tokens/s base / adapter (switch included): {kinds}; vLLM kernels "
                f"{r['vllm_kernels']}; `auto` picks {picks}")
    by = {(row["engine"], row["adapter"]): row["tokens_per_s"] for row in r["rows"]}
    cells = ", ".join(f"{e} {by.get((e, False), '-')} / {by.get((e, True), '-')}"
                      for e in dict.fromkeys(e for e, _ in by))
    return f"tokens/s base / LoRA: {cells}; `auto` picks {r['auto_picks']}"


def _sandbox(r: dict) -> str:
    return (f"{r['ratio']}x ({r['shared_per_s']} vs {r['naive_per_s']} per s), outputs "
            f"identical: {r['outputs_identical']}")


def _generation(r: dict) -> str:
    ro, ju = r["rollout"], r.get("judge", {})
    judge = (f"; judge {ju['ratio']} ({ju.get('stage_tokens_per_s')} vs "
             f"{ju.get('raw_tokens_per_s')})" if "ratio" in ju else "")
    return (f"rollout {ro['ratio']} ({ro['stage_tokens_per_s']} vs {ro['raw_tokens_per_s']} "
            f"tokens/s){judge}")


def _loop(r: dict) -> str:
    a, b = r["keep_alive"], r["restart_per_stage"]
    return (f"{r['ratio']} ({a['seconds']} vs {b['seconds']} s; {a['engine_starts']} vs "
            f"{b['engine_starts']} engine starts)")


def _score(r: dict) -> str:
    a, b = r["runs"]["1x"], r["runs"]["10x"]
    return (f"{r['ratio']} ({b['peak_rss_mib']} vs {a['peak_rss_mib']} MiB peak for "
            f"{b['trajectories']:,} vs {a['trajectories']:,} trajectories), "
            f"{a['records_per_s']:.0f}-{b['records_per_s']:.0f} records/s")


def _shared_prefix(r: dict) -> str:
    s, t = r["seconds_per_step"], r["computed_tokens_per_step"]
    grouped = (f"; --batch-order grouped {r['grouped_speedup']}x ({s['grouped']} s, "
               f"{t['grouped']} tokens)" if "grouped_speedup" in r else "")
    return (f"{r['speedup']}x ({s['shared']} vs {s['plain']} s per optimizer step of "
            f"{r['micro_batch']}; {t['shared']} vs {t['plain']} tokens computed), losses equal "
            f"to {r['loss_max_relative_difference']:.0e}{grouped}")


def _hf_generate(r: dict) -> str:
    w = r["ways"]
    return (f"{r['ratio']} ({w['rlany']['median_seconds']} vs {w['plain']['median_seconds']} s "
            f"median per call); the old full-logits read-out {r['logits_over_plain_seconds']}"
            + (f"; in calls of 32 {r['b32_over_plain_seconds']}" if "b32_over_plain_seconds"
               in r else ""))


def _prompt_prefix(r: dict) -> str:
    return "; ".join(
        f"{name}: {v['speedup']}x ({v['median_seconds']['plain']} vs "
        f"{v['median_seconds']['shared']} s; {v['common_prefix_tokens_mean']} of "
        f"{v['prompt_tokens_mean']} prompt tokens shared by {v['prompts_per_call']} prompts "
        f"x n {v['n']})" for name, v in r["shapes"].items())


def _demo(r: dict) -> str:
    b, f, lo_hi = r["base"], r["final"], r["gain_ci95"] or [None, None]
    return (f"{r['minutes']} min; held-out {b['successes']}/{b['episodes']} -> "
            f"{f['successes']}/{f['episodes']}, gain {r['gain']:+.3f} (95% {lo_hi[0]:+.3f} to "
            f"{lo_hi[1]:+.3f}), seed 0" + (" (resumed: minutes of the rerun)" if r["resumed"]
                                          else "") + _demo_extra(r))


def _demo_extra(r: dict) -> str:
    """bench_demo's later figures (issue 65), where the file has them: the rollouts' seconds
    per token over iteration 0's against their target, and the real-AVX2 estimate."""
    t, e = r.get("per_token") or {}, r.get("avx2_estimate")
    ratios = ", ".join(f"{k} {v}" for k, v in (t.get("over_iteration_0") or {}).items())
    met = {True: "met", False: "**not met**", None: "-"}[t.get("met")]
    return ((f"; rollout s/token over iteration 0's: {ratios} ({t['target']}: {met})"
             if ratios else "")
            + (f"; real AVX2 estimated {_span(e['minutes'])} min ({e['goal']}: "
               f"{ {True: 'met', False: '**not met**', None: '-'}[e.get('met')]}, an estimate)"
               if e else ""))


def _span(minutes) -> str:
    """An estimate's minutes: a range [low, high] or, in older files, one figure."""
    return f"{minutes[0]}-{minutes[1]}" if isinstance(minutes, list) else str(minutes)


def _suite(r: dict) -> str:
    c = r.get("counts", {})
    return (f"{r['minutes']} min: {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
            f"{c.get('skipped', 0)} skipped (2 workers, 1 torch thread each)")


def _openenv(r: dict) -> str:
    return "; ".join(f"{app}: reset {v['reset_ms_median']}, step {v['step_ms_median']}, close "
                     f"{v['close_ms_median']} ms" for app, v in r["envs"].items()) + \
        f" ({r['server']})"


def _adapter(r: dict) -> str:
    w, a = r["ways"], r["agreement"]
    speed = (f"{r['merged_over_base']} merged ({w['merged']['tokens_per_s']} vs "
             f"{w['base']['tokens_per_s']} tokens/s), {r['unmerged_over_base']} unmerged"
             + (f"; trained adapter {r['adapter']['trained']}" if "trained" in r["adapter"]
                else ""))
    if a is None:  # --no-agreement
        return speed
    pair = a.get("merged_vs_unmerged")
    return (f"{speed}; greedy tokens as fp32's: merged "
            f"{a['merged']['greedy_identical_share']:.3f}, unmerged "
            f"{a['unmerged']['greedy_identical_share']:.3f}"
            + (f", merged as unmerged {pair['greedy_identical_share']:.3f}" if pair else ""))


def _install(r: dict) -> str:
    return (f"{r['install_minutes']} min ({r['install_seconds']} s; .venv {r['venv_mib']} MiB; "
            f"clone {r['clone_seconds']} s) at {r['commit'][:7]}, packages from: "
            + ("; ".join(r.get("pip_sources") or ["the package index"])))


def _clone(r: dict) -> str:
    s, f = r["shallow"], r["full"]
    return (f"{r['ratio']} ({s['git_mib']} vs {f['git_mib']} MiB of .git; {f['commits']} "
            f"commits; work tree {s['tree_mib']} MiB) at {r['commit'][:7]}")


FORMAT = {"demo": _demo, "clone": _clone, "install": _install, "adapter": _adapter,
          "openenv": _openenv, "suite": _suite,
          "shared_prefix": _shared_prefix,
          "hf_generate": _hf_generate,
          "prompt_prefix": _prompt_prefix,
          "score": _score,
          "training": _training,
          "trl": _trl, "memory": _memory,
          "engines": _engines, "sandbox": _sandbox, "generation": _generation,
          "bench_loop": _loop}


def row(r: dict) -> str:
    m = r.get("machine") or {}
    prof = m.get("profile") or {}
    dtype = r.get("dtype") or ("fp32" if "fp32" in str(r.get("work", "")) else
                               f"`auto` dtype {prof.get('dtype')}")
    cores = f"{m['cpus']}-core " if m.get("cpus") and not prof.get("cuda") else ""
    where = f"{cores}{cpu_label(m)}, {dtype}, {str(m.get('date', ''))[:10]}"
    fmt = FORMAT.get(r["benchmark"].split("-")[0])  # hf_generate-avx2-float32: hf_generate
    try:
        measured = fmt(r) if fmt else str(r.get("ratio"))
    except (KeyError, TypeError):  # a result from an older version of the script
        measured = str(r.get("ratio"))
    met = r.get("met")
    return (f"| {r['benchmark']} | {r['metric']} | {measured} | {r.get('target', '-')} | "
            f"{'-' if met is None else 'yes' if met else '**no**'} | {where} |")


def table(results: Path = RESULTS) -> str:
    rows = []
    for path in sorted(results.glob("*.json")):
        r = json.loads(path.read_text())
        if "benchmark" not in r:  # gpu.json: its own table, by hand
            continue
        rows.append(row(r))
    if not rows:
        raise SystemExit(f"no benchmark results under {results}")
    return ("| benchmark | metric | measured | target | met | machine (CPU setting, precision, "
            "date) |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    text = table()
    print(text)
    write_readme_block("bench-table", text)

"""The judge of a loop run, base and trained, on one fixed set of held-out labelled steps:
the figure behind the learning benchmark's `judge_gain`.

The steps are the judge-capacity benchmark's held-out set (`judge_capacity.py`): 3 episodes
of a seeded expert/random mix on each of `learn.toml`'s 32 held-out tasks, each step with
the env's own label, in exactly the judge prompts `learn.toml` builds (history 1, obs lines
1). Unlike `rlany eval --judge` (the last steps of the policy's own held-out episodes: ~128
steps, about a tenth of them good, so one run's balanced accuracy moves by +-0.1 at random),
every judge here sees the same 355 steps, a third of them good, so base and trained judges
are compared step by step. For each run under the given directories: the base model and
each iteration's reward-model adapter that is still on disk (`RUN/iter_*/rm`; the loop keeps
the last `keep_last`), and a judge warm start's (`RUN/judge_warm_start/rm`, as "warm");
the verdict is the greedy choice between the two verdicts at their branch token (the
judge's verdict when its temperature goes to 0). The gain's 95% interval
is a bootstrap over tasks (steps of one task are correlated), 2,000 resamples. The base
judge's verdicts are computed once per runs directory (`judge_heldout_base.json` there).

Writes RUN/judge_heldout.json, which `learning.py` reads into each run's summary.
Another config's held-out steps: `--tasks` (its eval tasks) and `--max-steps` (its
horizon), e.g. mid.toml's (8 turns; its judge prompts are learn.toml's: history 1, obs
lines 1).

    python research/judge_heldout.py runs/learning-judge/rm-s0 [RUN ...]
    python research/judge_heldout.py runs/learning-mid-lr1e4/full-warm-s0 \
        --tasks examples/household/mid_eval.jsonl --max-steps 8 --per-task 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from judge_data import HELD_OUT, balanced_accuracy, encode, episodes, judged_steps  # noqa: E402


def p_positive(model, prompts, at, pad: int) -> list[float]:
    """P(+1) of the verdict at the branch for each prompt (no grad, 16 at a time)."""
    import torch

    from rlany.api import choice_logprobs
    out = []
    with torch.no_grad():
        for b in range(0, len(prompts), 16):
            logq = choice_logprobs(model, prompts[b:b + 16], at.tokens, pad, "cpu", share=True)
            out += logq[:, at.values.index(1.0)].exp().tolist()
    return out


def auc(labels, p) -> float:
    """P(a good step's P(+1) > a bad step's), ties half: how well the judge ranks the steps
    whatever its threshold (balanced accuracy reads the greedy verdict only, so a judge that
    ranks well but whose P(+1) drifted below 0.5 everywhere scores 0.5 there)."""
    good = [x for x, lab in zip(p, labels) if lab > 0]
    bad = [x for x, lab in zip(p, labels) if lab <= 0]
    wins = sum((g > b) + 0.5 * (g == b) for g in good for b in bad)
    return round(wins / (len(good) * len(bad)), 4) if good and bad else 0.5


def bootstrap_gain(rows, labels, base, trained, n: int = 2000, seed: int = 0) -> list[float]:
    """95% interval of balanced accuracy (trained - base), resampling tasks."""
    tasks = sorted({r["task"] for r in rows})
    by_task = {t: [i for i, r in enumerate(rows) if r["task"] == t] for t in tasks}
    rng = random.Random(seed)
    diffs = []
    for _ in range(n):
        idx = [i for t in rng.choices(tasks, k=len(tasks)) for i in by_task[t]]
        lab = [labels[i] for i in idx]
        if len(set(lab)) < 2:
            continue
        diffs.append(balanced_accuracy(lab, [trained[i] for i in idx], None)
                     - balanced_accuracy(lab, [base[i] for i in idx], None))
    diffs.sort()
    return [round(diffs[int(0.025 * len(diffs))], 4), round(diffs[int(0.975 * len(diffs))], 4)]


def digest(prompts) -> str:
    """A fingerprint of the encoded prompts: a cached base result is reused only for them."""
    return hashlib.sha256(json.dumps([list(map(int, p)) for p in prompts]).encode()).hexdigest()


def base_verdicts(cache: Path, key: dict, compute) -> tuple[list[float], float]:
    """The base model's P(+1) per step, computed once per runs directory (every seed's run
    there compares against the same base judge on the same steps: ~4 minutes each on 2
    cores saved); the cache holds its key and is recomputed when anything in it differs."""
    if cache.exists():
        saved = json.loads(cache.read_text())
        if saved.get("key") == key:
            return saved["p"], saved["seconds"]
    t0 = time.time()
    p = compute()
    seconds = round(time.time() - t0, 1)
    if cache.parent.is_dir() and not key.get("limit"):
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "p": p, "seconds": seconds}) + "\n")
        tmp.replace(cache)
    return p, seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--seed", type=int, default=0, help="the held-out set's seed (as "
                    "judge_capacity.py: episodes drawn with seed + 1)")
    ap.add_argument("--limit", type=int, help="only the first N steps (a smoke test; the "
                    "results file is not written)")
    ap.add_argument("--only", metavar="NAME", help="score only this judge of each run "
                    "(e.g. iter_002; ~4 minutes a judge on 2 cores); the others keep "
                    "what an earlier call wrote")
    ap.add_argument("--tasks", type=Path, default=HELD_OUT, help="held-out tasks (default: "
                    "learn.toml's, the judge-capacity set)")
    ap.add_argument("--max-steps", type=int, default=4, help="the config's horizon")
    ap.add_argument("--per-task", type=int, default=3, help="episodes per task")
    args = ap.parse_args(argv)
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlany.api import resolve_model

    rows = judged_steps(episodes(args.tasks, args.per_task, args.seed + 1,
                                 args.max_steps))[:args.limit]
    labels = [r["label"] for r in rows]
    base_path = resolve_model("smollm2")
    tok = AutoTokenizer.from_pretrained(base_path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    prompts, at = encode(tok, rows)
    net = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()
    base, base_seconds = base_verdicts(args.runs[0].parent / "judge_heldout_base.json",
                                       {"model": str(base_path), "seed": args.seed,
                                        "steps": len(rows), "prompts": digest(prompts),
                                        "limit": args.limit},
                                       lambda: p_positive(net, prompts, at, pad))
    for run in args.runs:
        judges = {"base": {"bal_acc": round(balanced_accuracy(labels, base, None), 4),
                           "pos_share": round(sum(p > 0.5 for p in base) / len(base), 4),
                           "auc": auc(labels, base)}}
        final = None
        saved = run / "judge_heldout.json"
        before = json.loads(saved.read_text()) if saved.exists() else {}
        same_steps = ((before.get("task_file", str(ap.get_default("tasks"))),
                       before.get("max_steps", ap.get_default("max_steps")),
                       before.get("per_task", ap.get_default("per_task")), before.get("steps"))
                      == (str(args.tasks), args.max_steps, args.per_task, len(rows)))
        earlier = before["judges"] if before and same_steps else {}  # --only keeps these
        # the judge warm start's supervised judge (if any), then each iteration's
        for it_dir in [run / "judge_warm_start", *sorted(run.glob("iter_*"))]:
            adapter = it_dir / "rm"
            if not (adapter / "adapter_config.json").exists():
                continue
            key = "warm" if it_dir.name == "judge_warm_start" else it_dir.name
            if args.only and key != args.only:
                if key in earlier:
                    judges[key] = earlier[key]
                    final = key
                continue
            model = PeftModel.from_pretrained(net, str(adapter)).eval()
            p = p_positive(model, prompts, at, pad)
            net = model.unload()  # the base weights again, the adapter's layers out
            judges[key] = {
                "bal_acc": round(balanced_accuracy(labels, p, None), 4),
                "pos_share": round(sum(x > 0.5 for x in p) / len(p), 4),
                "auc": auc(labels, p), "p_positive": [round(x, 5) for x in p],
                "gain": round(balanced_accuracy(labels, p, None)
                              - balanced_accuracy(labels, base, None), 4),
                "gain_ci95": bootstrap_gain(rows, labels, base, p)}
            final = key
        result = {"what": "balanced accuracy of the judge's greedy verdict against the env's "
                          "step labels on held-out steps of an expert/random mix",
                  "task_file": str(args.tasks), "max_steps": args.max_steps,
                  "per_task": args.per_task,
                  "steps": len(rows), "good_steps": sum(x > 0 for x in labels),
                  "tasks": len({r["task"] for r in rows}), "judges": judges, "final": final,
                  "seconds_per_judge": round(base_seconds, 1)}
        if not args.limit:
            (run / "judge_heldout.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({"run": str(run), **{k: {m: v for m, v in j.items() if m != "p_positive"}
                                              for k, j in judges.items()}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Can a 135M judge learn the household step labels at all? (issue: "The judge learns").

The gate separates "a 135M judge cannot learn this" from "it is not being taught":

1. Data, no model: episodes on the pool tasks (train) and the held-out tasks (test) of
   `examples/household/learn.toml`, played by a mix of the env's expert and a uniform
   random admissible action (p_expert per episode in {0, .25, .5, .75, 1}), in exactly the
   policy's prompts (`rlany.stages.rollout`'s episode code, learn.toml's rollout flags) and then the
   judge's prompts (`rlany.prompts.step_prompts`, learn.toml's judge flags: history 1, obs
   lines 1). Each step carries the env's label (+1 iff it shortens the shortest plan).
2. One forward pass of SmolLM2-135M over every prompt (+ the forced `\\boxed{` prefix) keeps
   (a) the last position's hidden state at every layer, for linear probes, and (b) the whole
   sequence's hidden state entering layer L-K, so the top K layers can be fine-tuned for
   many epochs at a fraction of the cost: a copy of the model with only those K layers run
   on the cached states (`inputs_embeds`) gives the same logits as the whole model
   (checked at start; judge_top.py). It is a lower bound on what the whole judge can learn.
3. Supervised, class-balanced training of the verdict (`rlany.training.verdict`'s logloss, the one
   branch token, LoRA r16 on the top K layers' linear modules) on N train steps for
   N in --grid and lr in --lrs; held-out balanced accuracy of the greedy verdict
   (q(+1) > 0.5) and of a verdict sampled at T = 0.8 (exact expectation, no draw).
4. The same on the consistency target instead of the label (`--targets outcome`): R = O,
   the trajectory's outcome (the paper's target with lambda = 0), the signal a judge gets in
   the loop without labels; objectives logloss and expected.

Runs alone (CPU heavy): `python research/judge_capacity.py` (make bench-judge-capacity);
writes research/results/judge_capacity.json after every cell (rerun to resume; cached data
under runs/judge-capacity/).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "research"))

from judge_data import (  # noqa: E402
    HELD_OUT,
    POOL,
    balanced_accuracy,
    encode,
    episodes,
    judged_steps,
)
from judge_top import check_top, features, finetune, heldout, load, probe, top_model  # noqa: E402
from lab import machine  # noqa: E402

RESULTS = ROOT / "research" / "results" / "judge_capacity.json"
WORK = ROOT / "runs" / "judge-capacity"


# -- 1. data ---------------------------------------------------------------------------

def onpolicy(runs: list[Path], n_train: int, n_test: int, seed: int):
    """(train rows, held-out rows) from the policy's own judged steps of `runs`: the tasks
    shuffled by `seed` and split in half (no held-out task trains), then a seeded sample of
    at most n_train / n_test steps of each half."""
    from judge_data import policy_steps

    rows = policy_steps(runs)
    rng = random.Random(seed)
    tasks = sorted({r["task"] for r in rows})
    rng.shuffle(tasks)
    held = set(tasks[:len(tasks) // 2])
    train = [r for r in rows if r["task"] not in held]
    test = [r for r in rows if r["task"] in held]
    rng.shuffle(train)
    rng.shuffle(test)
    return train[:n_train], test[:n_test]


# -- the README block -------------------------------------------------------------------

def table(results: dict) -> str:
    """research/README.md's judge-capacity block, from the results JSON."""
    base = results["base"]
    source = (f"the policy's own judged steps of {len(results['runs'])} loop runs "
              f"({', '.join(Path(r).name for r in results['runs'])}): "
              f"{results['train_steps_available']} labelled train steps from half their "
              f"tasks, {results['heldout_steps']} held-out steps from the other half "
              if results.get("runs") else
              f"household `learn.toml` prompts (history 1, obs lines 1); "
              f"{results['train_steps_available']} labelled train steps from pool tasks, "
              f"{results['heldout_steps']} held-out steps from the held-out tasks ")
    lines = [f"SmolLM2-135M judge, {source}"
             f"({results['heldout_pos_share']:.0%} labelled +1). Balanced accuracy on the "
             f"held-out steps; base judge {base['heldout_bal_acc_greedy']:.3f} (greedy), "
             f"{base['heldout_bal_acc_t08']:.3f} (sampled at T 0.8); the outcome itself as "
             f"the verdict {results['outcome_as_verdict_heldout']:.3f}"
             + (f"; the runs' own judges' verdicts {results['loop_verdicts_heldout']:.3f}"
                if "loop_verdicts_heldout" in results else "") + ". Top "
             f"{results['k_top_layers']} of 30 layers fine-tuned (LoRA r16, all linear) on "
             f"the cached lower layers.", "",
             "| target | objective | lr | N | epochs | greedy | sampled T 0.8 | +1 share | "
             "train s |", "|---|---|---|---|---|---|---|---|---|"]
    for cell in results.get("cells", {}).values():
        lines.append(f"| {cell['target']} | {cell['objective']} | {cell['lr']:g} | "
                     f"{cell['n']} | {cell['epochs']} | {cell['heldout_bal_acc_greedy']:.3f} "
                     f"| {cell['heldout_bal_acc_t08']:.3f} | {cell['heldout_pos_share']:.2f} "
                     f"| {cell['train_seconds']:.0f} |")
    if results.get("probes"):
        lines += ["", "Linear probe (class-balanced logistic regression on one layer's "
                  "last-position state), best layer: " + ", ".join(
                      f"N={n}: {max(v):.3f} (layer {v.index(max(v))})"
                      for n, v in results["probes"].items())]
    profile = results.get("machine", {}).get("profile", {})
    lines += ["", f"Machine: {json.dumps(profile)}; forward "
              f"{results.get('forward_seconds_per_prompt', '?')} s per prompt "
              f"(mean {results['prompt_tokens_mean']} tokens"
              + (f"; {results['forward_note']}" if results.get("forward_note") else "")
              + "; fp32). One seed."]
    return "\n".join(lines) + "\n"


# -- driver --------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--grid", default="128,512,1024", help="train steps N")
    ap.add_argument("--lrs", default="3e-4,1e-3")
    ap.add_argument("--k", type=int, default=2, help="top layers fine-tuned")
    ap.add_argument("--updates", type=int, default=1024,
                    help="sample updates per cell: epochs = max(1, updates // N)")
    ap.add_argument("--targets", default="label,outcome")
    ap.add_argument("--per-task", type=int, default=6, help="train episodes per pool task")
    ap.add_argument("--test-per-task", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--from-runs", nargs="+", type=Path, metavar="RUN",
                    help="on-policy steps instead: the policy's own judged steps of these "
                    "loop runs (judge_data.policy_steps), their tasks split in half by "
                    "--seed, one half held out (a seeded sample of --max-train / "
                    "--max-test steps of each)")
    ap.add_argument("--max-train", type=int, default=2048, help="with --from-runs")
    ap.add_argument("--max-test", type=int, default=768, help="with --from-runs")
    ap.add_argument("--name", help="the results' name (default judge_capacity, with "
                    "--from-runs judge_capacity_onpolicy)")
    ap.add_argument("--readme", action="store_true",
                    help="at the end, write the results' table into research/README.md")
    ap.add_argument("--table-only", action="store_true",
                    help="only write the committed results' table into research/README.md")
    return ap.parse_args(argv)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def data(args: argparse.Namespace, results: dict) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): the runs' own judged steps with --from-runs (recorded in
    `results`), else played episodes on the pool and the held-out tasks."""
    t0 = time.time()
    if args.from_runs:
        train_rows, test_rows = onpolicy(args.from_runs, args.max_train, args.max_test,
                                         args.seed)
        results["runs"] = [str(r) for r in args.from_runs]
    else:
        train_rows = judged_steps(episodes(POOL, args.per_task, args.seed))
        test_rows = judged_steps(episodes(HELD_OUT, args.test_per_task, args.seed + 1))
    say(f"data: {len(train_rows)} train steps ({sum(r['label'] > 0 for r in train_rows)} "
        f"labelled +1), {len(test_rows)} held-out ({sum(r['label'] > 0 for r in test_rows)} "
        f"+1), {time.time() - t0:.1f}s")
    return train_rows, test_rows


def cached_features(model, prompts: list, k: int, cache_file: Path, results: dict):
    """(last, cache) of `features`, read from `cache_file` when an earlier run wrote it;
    else computed (its seconds per prompt into `results`) and saved there."""
    import torch

    if cache_file.exists():
        return torch.load(cache_file)
    t1 = time.time()
    last, cache = features(model, prompts, k, say)
    results["forward_seconds_per_prompt"] = round((time.time() - t1) / len(prompts), 3)
    torch.save((last, cache), cache_file)
    return last, cache


def describe(args: argparse.Namespace, rows: list[dict], n_train: int, test_idx: list[int],
             lengths: list[int], base: dict) -> dict:
    """The results' header: what is measured, the data's shape and the untrained judge."""
    test_labels = [rows[i]["label"] for i in test_idx]
    out = {
        "what": "held-out balanced accuracy of a SmolLM2-135M judge's verdict against the "
                "household env's step labels, trained on N labelled steps (supervised, "
                "class-balanced) or on the trajectory outcome (consistency target, lambda 0)",
        "machine": machine(), "model": args.model, "k_top_layers": args.k,
        "train_steps_available": n_train, "train_pos_share": round(
            sum(rows[i]["label"] > 0 for i in range(n_train)) / n_train, 4),
        "heldout_steps": len(test_idx), "heldout_pos_share": round(
            sum(lab > 0 for lab in test_labels) / len(test_labels), 4),
        "prompt_tokens_mean": round(sum(lengths) / len(lengths), 1),
        "base": base,
        "outcome_as_verdict_heldout": round(balanced_accuracy(
            test_labels, [float(rows[i]["outcome"] > 0) for i in test_idx], None), 4)}
    if args.from_runs:  # what the runs' own judges said on these steps (ties left out)
        from judge_data import loop_verdict_accuracy
        out["loop_verdicts_heldout"] = round(loop_verdict_accuracy(
            [rows[i] for i in test_idx]), 4)
    return out


def cell_order(targets: str, lrs: list[float], grid: list[int]) -> list[tuple]:
    """(target, objective, lr, N) of every cell, the most telling first: the label at the
    first lr, the consistency target at the largest N, then the other lrs."""
    cells = [("label", "logloss", lrs[0], n) for n in grid]
    if "outcome" in targets.split(","):
        cells += [("outcome", obj, lrs[0], grid[-1]) for obj in ("logloss", "expected")]
    return cells + [("label", "logloss", lr, n) for lr in lrs[1:] for n in grid]


def main(argv=None) -> int:
    args = parse_args(argv)
    name = args.name or ("judge_capacity_onpolicy" if args.from_runs else "judge_capacity")
    results_path, block = RESULTS.with_name(name + ".json"), name.replace("_", "-") + "-table"
    if args.table_only:
        from lab import write_readme_block
        write_readme_block(block, table(json.loads(results_path.read_text())))
        return 0

    import torch

    from rlany.api import resolve_model

    torch.manual_seed(args.seed)
    WORK.mkdir(parents=True, exist_ok=True)
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    results.setdefault("cells", {})
    train_rows, test_rows = data(args, results)

    model, tok = load(resolve_model(args.model))
    rows = train_rows + test_rows
    prompts, at = encode(tok, rows)
    last, cache = cached_features(
        model, prompts, args.k, WORK / f"cache-{name}-k{args.k}-s{args.seed}-{len(rows)}.pt",
        results)
    check_top(model, args.k, prompts, cache)

    n_train = len(train_rows)
    test_idx = list(range(n_train, len(rows)))
    labels = [r["label"] for r in rows]
    test_labels = [labels[i] for i in test_idx]
    # the base judge, untrained (greedy and sampled at 0.8)
    base = heldout(top_model(model, args.k), cache, test_idx, test_labels, at)
    results.update(describe(args, rows, n_train, test_idx, [len(p) for p in prompts], base))
    results_path.write_text(json.dumps(results, indent=1) + "\n")

    rng = random.Random(args.seed)
    order = list(range(n_train))
    rng.shuffle(order)
    grid = [int(n) for n in args.grid.split(",")]
    # probes: every layer, every N (seconds)
    layers = len(last[0])
    results["probes"] = {str(n): [round(probe(last, order[:n], labels, test_idx, layer), 4)
                                  for layer in range(layers)] for n in grid if n <= n_train}
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    say("probes (best layer per N): " + ", ".join(
        f"N={n}: {max(v):.3f}" for n, v in results["probes"].items()))

    lrs = [float(x) for x in args.lrs.split(",")]
    grid = [n for n in grid if n <= n_train]
    for target, objective, lr, n in cell_order(args.targets, lrs, grid):
        key = f"{target}/{objective}/lr{lr:g}/N{n}"
        if key in results["cells"]:
            continue
        targets = [float(r["label"]) if target == "label" else float(r["outcome"])
                   for r in rows]
        epochs = max(1, args.updates // n)
        cell = finetune(model, cache, order[:n], targets, test_idx, test_labels, at,
                        k=args.k, lr=lr, epochs=epochs, objective=objective, seed=args.seed,
                        say=say)
        cell.update({"target": target, "objective": objective, "lr": lr, "n": n,
                     "epochs": epochs})
        results["cells"][key] = cell
        results_path.write_text(json.dumps(results, indent=1) + "\n")
        say(f"{key}: greedy {cell['heldout_bal_acc_greedy']:.3f}, T0.8 "
            f"{cell['heldout_bal_acc_t08']:.3f} ({cell['train_seconds']:.0f}s)")
    if args.readme:
        from lab import write_readme_block
        write_readme_block(block, table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

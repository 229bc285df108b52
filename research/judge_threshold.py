"""Where a trained judge's verdict threshold falls, and whether choosing it from the
consistency targets alone (no labels) puts it where the env's labels would.

judge_heldout.py reads the greedy verdict: +1 where P(+1) > 0.5. A judge trained toward the
episode outcome learns to *rank* held-out steps (AUC) well before its P(+1) sits on the right
side of 0.5: intermediate good steps (a "go to" on the way to the object) end both successful
and failed episodes, so under class-balanced outcome targets they sit near the balance point,
and a few noisy batches move all of them across it. This measures, for a run's final judge
(its `judge_heldout.json` must hold `p_positive`): P(+1) on the steps the judge was trained
on (every iteration's scored steps with an `rm_target`), the threshold t that maximizes
balanced accuracy against sign(rm_target) there (label-free: outcomes only), and the
held-out balanced accuracy against the env's labels at 0.5 and at t. Twice: t from every
iteration's steps, and t from the final judge's own iteration only (the steps its last
train-rm saw: "own_*" fields).

    python research/judge_threshold.py runs/learning-judge-logloss/rm-s0 [RUN ...] \\
        [--name judge-threshold-logloss]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from judge_data import HELD_OUT, balanced_accuracy, episodes, judged_steps  # noqa: E402
from judge_heldout import p_positive  # noqa: E402
from lab import save  # noqa: E402


def bal_at(labels, p, t) -> float:
    """Balanced accuracy of the verdict +1 where p > t."""
    return balanced_accuracy(labels, [0.5 + (x > t) * 0.25 for x in p], None)


def best_threshold(targets, p) -> tuple[float, float]:
    """(t, balanced accuracy) maximizing balanced accuracy against `targets` (+-1)."""
    cands = sorted(set(p))
    best = (0.5, bal_at(targets, p, 0.5))
    for a, b in zip(cands, cands[1:]):
        t = (a + b) / 2
        acc = bal_at(targets, p, t)
        if acc > best[1]:
            best = (t, acc)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="judge-threshold",
                    help="research/results/NAME.json")
    args = ap.parse_args(argv)
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlany.api import (
        VERDICT_CHOICES,
        JsonlReader,
        Scored,
        branch,
        parse_verdict,
        render,
        resolve_model,
        verdict_samples,
    )

    labels = [r["label"] for r in judged_steps(episodes(HELD_OUT, 3, args.seed + 1))]
    base = resolve_model("smollm2")
    tok = AutoTokenizer.from_pretrained(base)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    at = branch(tok, VERDICT_CHOICES, tuple(parse_verdict(c) for c in VERDICT_CHOICES))
    net = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    out = []
    for run in args.runs:
        held = json.loads((run / "judge_heldout.json").read_text())
        final = held["final"]
        p_held = held["judges"][final]["p_positive"]
        replay = run / "replay.json"
        source = Path(json.loads(replay.read_text())["run"]) if replay.exists() else run
        raw, own = [], 0  # own: where the final judge's own iteration's steps begin
        for scored in sorted(source.glob("iter_*/scored.jsonl")):
            recs = [rec for _, rec in JsonlReader(scored, Scored, "scored")]
            if scored.parent.name == final:
                own = len(raw)
            raw += list(verdict_samples(recs, VERDICT_CHOICES))
        prompts = [render(tok, r.messages) + at.prefix for r in raw]
        targets = [1 if r.target > 0 else -1 for r in raw]
        model = PeftModel.from_pretrained(net, str(run / final / "rm")).eval()
        p_train = p_positive(model, prompts, at, pad)
        net = model.unload()
        t, train_acc = best_threshold(targets, p_train)
        row = {"run": str(run), "judge": final, "train_steps": len(raw),
               "train_pos_share_targets": round(sum(x > 0 for x in targets) / len(targets), 4),
               "train_pos_share_at_0.5": round(sum(x > 0.5 for x in p_train) / len(p_train), 4),
               "train_bal_acc_vs_outcome_at_0.5": round(bal_at(targets, p_train, 0.5), 4),
               "threshold_from_outcomes": round(t, 4),
               "train_bal_acc_vs_outcome_at_t": round(train_acc, 4),
               "heldout_bal_acc_at_0.5": round(bal_at(labels, p_held, 0.5), 4),
               "heldout_bal_acc_at_t": round(bal_at(labels, p_held, t), 4),
               "heldout_best_possible": round(best_threshold(labels, p_held)[1], 4)}
        if len(set(targets[own:])) == 2:
            own_t, own_acc = best_threshold(targets[own:], p_train[own:])
            row.update({"own_steps": len(raw) - own, "own_threshold": round(own_t, 4),
                        "own_train_bal_acc_at_t": round(own_acc, 4),
                        "own_heldout_bal_acc_at_t": round(bal_at(labels, p_held, own_t), 4)})
        out.append(row)
        print(json.dumps(row), flush=True)
    save(args.name, {"what": "each trained judge's verdict threshold: P(+1) on its own "
                             "training steps, the threshold t maximizing balanced accuracy "
                             "against the outcome there (no labels), and held-out balanced "
                             "accuracy (judge_heldout.py's labelled steps) at 0.5 and at t; "
                             "own_*: t from the final judge's own iteration only",
                  "judges": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())

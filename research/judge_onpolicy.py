"""The whole judge taught the policy's own steps: `rlany train-rm` (the loop's reward-model
training: LoRA on every layer, the verdict token's log-likelihood, classes balanced) on
labelled steps of loop runs, scored on other tasks' steps of the same runs.

`judge_capacity.py --from-runs` asks the same question of the top 2 layers over cached
lower ones (a lower bound, cheap enough for a grid); this is the fair test of the whole
model at one setting. The split is judge_capacity's (`onpolicy`: the runs' tasks shuffled
by --seed and halved, a seeded sample of each half). The train steps go to train-rm as a
scored file: each run's own `iter_*/scored.jsonl` records (the judge prompts and verdicts
the loop recorded), `rm_target` set to the step's env label (`--target label`: supervised)
or its episode's outcome (`--target outcome`: the consistency target, lambda 0, no labels)
on the sampled steps and cleared elsewhere; task ids carry their run, so no trajectory id
repeats. Held-out: the greedy verdict's balanced accuracy and AUC, base and trained.

    python research/judge_onpolicy.py runs/learning-mid-lr1e4/full-warm-s1 [RUN ...] \\
        --out runs/judge-onpolicy/label --target label --epochs 1 --lr 3e-4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


def train_file(rows: list[dict], target: str, path: Path) -> int:
    """Write the train rows' scored records (only those with a sampled step) to `path`,
    rm_target from `target` on the sampled steps; returns the steps with a target."""
    from rlany.api import traj_id

    want = {r["at"]: float(r["label"] if target == "label" else r["outcome"]) for r in rows}
    by_dir: dict[str, set] = {}
    for it, tid, _ in want:
        by_dir.setdefault(it, set()).add(tid)
    n, out = 0, []
    for it, tids in sorted(by_dir.items()):
        tag = Path(it).parent.name
        for line in (Path(it) / "scored.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec["traj_id"] not in tids:
                continue
            for step in rec["steps"]:
                value = want.get((it, rec["traj_id"], step["step"]))
                step["rm_target"] = value or None  # 0 (or not sampled): no target
                n += bool(value)
            rec["task_id"] = f"{tag}.{rec['task_id']}"
            rec["traj_id"] = traj_id(rec["task_id"], rec["iteration"], rec["sample"])
            out.append(json.dumps(rec))
    path.write_text("\n".join(out) + "\n")
    return n


def main(argv=None) -> int:
    from judge_capacity import onpolicy
    from judge_data import balanced_accuracy, encode, loop_verdict_accuracy
    from judge_heldout import auc, p_positive

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", choices=("label", "outcome"), default="label")
    ap.add_argument("--model", default="smollm2", help="the judge (a name or a local path): "
                    "a bigger one tested on the saved steps before any loop run")
    ap.add_argument("--max-train", type=int, default=2048)
    ap.add_argument("--max-test", type=int, default=768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--name", help="also write research/results/NAME.json")
    args = ap.parse_args(argv)
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlany.api import resolve_model

    train, test = onpolicy(args.runs, args.max_train, args.max_test, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    data, adapter = args.out / "train.jsonl", args.out / "rm"
    steps = train_file(train, args.target, data)
    t0, train_seconds = time.time(), None  # None: an adapter of an earlier call reused
    if not (adapter / "adapter_config.json").exists():
        subprocess.run([sys.executable, "-m", "rlany", "train-rm", "-i", str(data), "-o",
                        str(adapter), "--model", args.model, "--objective", "logloss",
                        "--lr", str(args.lr), "--epochs", str(args.epochs),
                        "--lr-schedule", "cosine", "--micro-batch", "8", "--grad-accum", "1",
                        "--target-modules", "q_proj,v_proj", "--seed", str(args.seed)],
                       check=True)
        train_seconds = round(time.time() - t0, 1)
    base_path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(base_path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    prompts, at = encode(tok, test)
    labels = [r["label"] for r in test]
    net = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()
    judges = {}
    for name in ("base", "trained"):
        model = net if name == "base" else PeftModel.from_pretrained(net, str(adapter)).eval()
        p = p_positive(model, prompts, at, pad)
        judges[name] = {"bal_acc": round(balanced_accuracy(labels, p, None), 4),
                        "auc": auc(labels, p),
                        "pos_share": round(sum(x > 0.5 for x in p) / len(p), 4)}
    result = {"runs": [str(r) for r in args.runs], "model": args.model, "target": args.target,
              "train_steps": steps, "heldout_steps": len(test),
              "heldout_pos_share": round(sum(x > 0 for x in labels) / len(labels), 4),
              "epochs": args.epochs, "lr": args.lr, "seed": args.seed,
              "train_seconds": train_seconds, "judges": judges,
              "loop_verdicts": round(loop_verdict_accuracy(test), 4),
              "outcome_as_verdict": round(balanced_accuracy(
                  labels, [float(r["outcome"] > 0) for r in test], None), 4)}
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.name:
        from lab import save
        save(args.name, {"what": "the whole judge (train-rm, LoRA q/v on every layer) "
                                 "trained on the policy's own steps, scored on held-out "
                                 "tasks' steps of the same runs", **result})
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

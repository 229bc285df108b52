"""What the judge reads and trains on per loop iteration, beside the policy: the tokens behind
the judged loop's seconds (issue "The judge learns", item 6: its iteration <= 1.5x
policy-only's).

For each iteration directory of the given runs: the tokens of the policy's step prompts
(what rollout prefills) and of its responses, the tokens train-policy trains on (kept
steps, prompt + response), the judged steps and the tokens of their judge prompts (what
judge prefills; a verdict-only judge generates a few forced tokens more), the tokens
train-rm trains on (every step that carries `rm_target`: logloss trains each once), and the
stage seconds from the run's metrics. Token counts are the model's chat template, so they
hold on any CPU; seconds are the host's that ran the run (its boot id decides, as in
learning.py). The summary is the judge's share: judge prompt tokens over rollout prompt
tokens and train-rm tokens over train-policy tokens, beside the same ratios of seconds.

    python research/judge_cost.py runs/learning-mid-lr1e4/full-warm-s1 [RUN ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import boot_id, made_since_boot, save  # noqa: E402
from lab import read_rows as rows  # noqa: E402


def tokens_of(tok):
    cache: dict[str, int] = {}

    def count(messages: list[dict]) -> int:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if text not in cache:
            cache[text] = len(tok(text)["input_ids"])
        return cache[text]
    return count


def iteration(d: Path, count, seconds: dict) -> dict:
    trajs, scored = rows(d / "trajectories.jsonl"), rows(d / "scored.jsonl")
    judged = [s for j in rows(d / "judgments.jsonl") for s in j["steps"]]
    steps = [s for t in trajs for s in t["steps"]]
    kept = [s for t in scored for s in t["steps"] if s["keep"]]
    rm = [s for t in scored for s in t["steps"] if s.get("rm_target") is not None]
    out = {
        "policy_steps": len(steps),
        "rollout_prompt_tokens": sum(count(s["prompt_messages"]) for s in steps),
        "response_tokens": sum(len(s.get("token_ids") or []) for s in steps),
        "train_policy_tokens": sum(count(s["prompt_messages"]) + len(s.get("token_ids") or [])
                                   for s in kept),
        "judged_steps": len(judged),
        "judge_prompt_tokens": sum(count(s["judge_messages"]) for s in judged),
        "train_rm_steps": len(rm),
        "train_rm_tokens": sum(count(s["judge_messages"]) for s in rm),
        "seconds": seconds,
    }
    out["judge_over_rollout_tokens"] = round(out["judge_prompt_tokens"]
                                             / out["rollout_prompt_tokens"], 3)
    out["rm_over_policy_tokens"] = round(out["train_rm_tokens"]
                                         / max(out["train_policy_tokens"], 1), 3)
    sec = seconds
    if sec.get("rollout") and sec.get("train_policy"):
        out["judge_over_rollout_seconds"] = round(sec.get("judge", 0) / sec["rollout"], 3)
        out["rm_over_policy_seconds"] = round(sec.get("train_rm", 0) / sec["train_policy"], 3)
        out["iteration_over_policy_stages"] = round(
            sum(v for k, v in sec.items() if k != "eval")
            / (sec["rollout"] + sec["train_policy"] + sec.get("score", 0)), 3)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--name", default="judge-cost",
                        help="the results file: research/results/NAME.json")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from rlany.api import resolve_model
    runs = {}
    for run in args.runs:
        config = json.loads((run / "config.json").read_text())
        tok = AutoTokenizer.from_pretrained(resolve_model(config["run"]["model"]))
        count = tokens_of(tok)
        metrics = {m["iteration"]: m for m in rows(run / "metrics.jsonl")}
        its = [iteration(d, count, metrics.get(int(d.name.split("_")[1]), {}).get("seconds", {}))
               for d in sorted(run.glob("iter_*")) if (d / "scored.jsonl").exists()
               and (d / "judgments.jsonl").exists()]
        # the seconds are this host's where the run was written since this boot
        runs[str(run)] = {"host": boot_id() if made_since_boot(run / "config.json") else None,
                          "iterations": its}
    every = [it for r in runs.values() for it in r["iterations"]]
    keys = ("judge_over_rollout_tokens", "rm_over_policy_tokens", "judge_over_rollout_seconds",
            "rm_over_policy_seconds", "iteration_over_policy_stages")
    summary = {k: round(statistics.fmean(it[k] for it in every if k in it), 3)
               for k in keys if any(k in it for it in every)}
    path = save(args.name, {"runs": runs, "mean_over_iterations": summary})
    print(json.dumps(summary, indent=2))
    print(f"-> {path}")
    return summary


if __name__ == "__main__":
    main()

"""Generation with a LoRA adapter against the base model, at the loop's batch, on the hf
engine: the adapter merged into the weights (what the engine does) and, for reference,
PEFT's unmerged layers (what it did before). SmolLM2-135M-Instruct, learn.toml's rollout
(16 tasks x 8 episodes, 4 steps, constrained actions, 16 new tokens a step), the adapter
on learn.toml's q_proj + v_proj (rank 16), its B matrices random so that it moves the
model about as far as a trained one (the probe's mean |log-prob| change is recorded).

Speed, on the same work: the base model's rollout is recorded (every generate call) and
replayed call by call, the same prompts, settings and seeds, by each way (base, merged,
unmerged) in turn, round by round in one process; seconds and tokens per way (medians over
rounds) and merged tokens/s / base tokens/s, the adapter's speed relative to the base
model's (target >= 0.95; a trained adapter makes other completions of the same calls, so
tokens/s, not seconds); the base model's rollout itself is recorded too (tokens/s of free
episodes).
Agreement, against the adapted model in fp32 (unmerged): every request of an unmerged
greedy rollout of the demo's evaluation tasks (learn_eval, one episode each) is asked again
of each way in the run's dtype and of the fp32 model, teacher-forced on the same prompts:
the share of greedy tokens identical, and the largest and mean |log-prob| difference of the
sampled tokens of a temperature-1 rollout (scored by one forward pass each). In bf16 the
unmerged way's own distance from fp32 is the noise floor the merged way is held to. Writes
benchmarks/results/adapter-SETTING.json (SETTING as common.cpu_setting names it).

    python benchmarks/bench_adapter.py --rounds 2
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/bench_adapter.py --rounds 2 --dtype float32
    python benchmarks/bench_adapter.py --adapter runs/demo/iter_001/policy --no-agreement
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_setting, save  # noqa: E402

EXAMPLES = Path(__file__).parent.parent / "examples" / "household"


def make_adapter(base: str, out: Path, scale: float) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, scale)
    model.save_pretrained(out)
    return str(out)


class Unmerged:
    """The engine's adapter handling before merging: PEFT's LoRA layers in the network
    (the engine's `_merged` slot; `use` as `rlany.engines.hf_merge.Merged.use`)."""

    def __init__(self, net) -> None:
        self.net, self.active, self._wrapped = net, None, None

    def use(self, path):
        from peft import PeftModel

        if path != self.active:
            self.restore()
            if path is not None:
                self._wrapped = PeftModel.from_pretrained(self.net, path)
                self.net = self._wrapped.get_base_model().eval()
            self.active = path
        return self.net

    def restore(self):
        if self._wrapped is not None:
            self.net = self._wrapped.unload().eval()
            self._wrapped = None
        self.active = None
        return self.net


def rollout_once(engine, tasks, adapter, temperature=1.0, n=8, record=None):
    from rlany import envs
    from rlany.stages.rollout import RolloutOptions, rollout

    opts = RolloutOptions(n=n, max_steps=4, max_tokens=16, temperature=temperature,
                          history_turns=1, constrain_actions=True, adapter=adapter, seed=0)
    if record is not None:  # every request the rollout asks, with its results
        real = engine.generate

        def spy(requests):
            out = real(requests)
            record.append((list(requests), out))  # one generate call
            return out
        engine.generate = spy
    t0, tok0 = time.perf_counter(), engine.stats.completion_tokens
    try:
        trajs = [t for g in rollout(tasks, engine, envs.make_env, opts, {}) for t in g]
    finally:
        if record is not None:
            del engine.generate
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tokens": engine.stats.completion_tokens - tok0,
            "success": sum(t.outcome > 0 for t in trajs)}


def replay(engine, calls: list[list], adapter) -> dict:
    """The same generate calls (same prompts, settings and seeds) with `adapter`."""
    from dataclasses import replace

    t0, tok0 = time.perf_counter(), engine.stats.completion_tokens
    for requests in calls:
        engine.generate([replace(r, adapter=adapter) for r in requests])
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tokens": engine.stats.completion_tokens - tok0}


def agreement(engine, reference, tasks, adapter) -> dict:
    """bf16 merged and bf16 unmerged, each against the fp32 model with the adapter unmerged
    (`reference`), on the same requests (teacher-forced): every request of an unmerged
    greedy rollout, and the sampled tokens of an unmerged temperature-1 rollout."""
    from dataclasses import replace

    from rlany.engines.hf_merge import Merged
    from rlany.probe import forward_logprobs

    path = str(Path(adapter).resolve())
    greedy: list = []
    sampled: list = []
    engine._merged = Unmerged(engine._merged.restore())
    rollout_once(engine, tasks, adapter, temperature=0.0, n=1, record=greedy)
    rollout_once(engine, tasks, adapter, temperature=1.0, n=1, record=sampled)
    greedy = [r for requests, _ in greedy for r in requests]
    sampled = [(res.prompt_token_ids, c.token_ids) for _, results in sampled
               for res in results for c in res.completions]
    reference._merged = Unmerged(reference._merged.restore())
    want = [reference.generate([replace(r)])[0].completions[0].token_ids for r in greedy]
    truth = [forward_logprobs(reference._merged.use(path), p, t) for p, t in sampled]
    out = {"greedy_tokens": sum(map(len, want)), "sampled_tokens": sum(map(len, truth))}
    got = {}
    for way in ("unmerged", "merged"):
        engine._merged = (Unmerged if way == "unmerged" else Merged)(engine._merged.restore())
        got[way] = [engine.generate([replace(r)])[0].completions[0].token_ids for r in greedy]
        same = sum(x == y for a, b in zip(got[way], want) for x, y in zip(a, b))
        net = engine._merged.use(path)
        diffs = [abs(x - y) for (p, t), lp in zip(sampled, truth)
                 for x, y in zip(forward_logprobs(net, p, t), lp)]
        out[way] = {"greedy_identical_share": round(same / max(out["greedy_tokens"], 1), 5),
                    "logprob_abs_diff_max": round(max(diffs), 5),
                    "logprob_abs_diff_mean": round(statistics.mean(diffs), 6)}
    same = sum(x == y for a, b in zip(got["merged"], got["unmerged"]) for x, y in zip(a, b))
    out["merged_vs_unmerged"] = {"greedy_identical_share": round(
        same / max(sum(map(len, got["unmerged"])), 1), 5)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    ap.add_argument("--scale", type=float, default=0.02, help="std of the adapter's B")
    ap.add_argument("--adapter", help="a trained LoRA adapter directory instead of the "
                    "random one (e.g. a loop's iter_001/policy): results adapter-trained-SETTING")
    ap.add_argument("--no-agreement", action="store_true", help="speed only")
    args = ap.parse_args(argv)
    import jsonlines

    from rlany.compat import resolve_dtype
    from rlany.engines.base import EngineConfig
    from rlany.engines.hf import HfEngine
    from rlany.engines.hf_merge import Merged
    from rlany.files.records import Task, from_json
    from rlany.models import resolve_model
    from rlany.probe import forward_logprobs, probe_ids

    base = resolve_model("smollm2")
    dtype = resolve_dtype(args.dtype)
    pool = [from_json(Task, r) for r in jsonlines.open(EXAMPLES / "learn_tasks.jsonl")][:16]
    held = [from_json(Task, r) for r in jsonlines.open(EXAMPLES / "learn_eval.jsonl")]
    engine = HfEngine(EngineConfig(kind="hf", model=base, dtype=dtype, seed=0, batch_size=128))
    with tempfile.TemporaryDirectory() as tmp:
        adapter = args.adapter or make_adapter(base, Path(tmp) / "lora", args.scale)
        prompt, response = probe_ids(engine.tokenizer)
        moved = [abs(x - y) for x, y in zip(
            forward_logprobs(engine._merged.use(str(Path(adapter).resolve())), prompt, response),
            forward_logprobs(engine._merged.use(None), prompt, response))]
        asked: list = []  # the base rollout's generate calls, replayed by every way
        free = {"base": rollout_once(engine, pool, None, record=asked)}
        calls = [requests for requests, _ in asked]
        rows: dict[str, list[dict]] = {"base": [], "merged": [], "unmerged": []}
        for r in range(args.rounds):
            for way in rows:
                engine._merged = (Unmerged if way == "unmerged" else Merged)(
                    engine._merged.restore())
                rows[way].append(replay(engine, calls, None if way == "base" else adapter))
                print(f"round {r} {way}: {rows[way][-1]}", file=sys.stderr, flush=True)
        agree = None if args.no_agreement else agreement(engine, HfEngine(EngineConfig(
            kind="hf", model=base, dtype="float32", seed=0, batch_size=128)), held, adapter)
    ways = {}
    for way, runs in rows.items():
        sec = statistics.median(x["seconds"] for x in runs)
        tok = statistics.median(x["tokens"] for x in runs)
        ways[way] = {"seconds": round(sec, 2), "tokens": tok, "tokens_per_s": round(tok / sec, 1),
                     "rounds": [{k: round(v, 2) for k, v in x.items()} for x in runs]}
    # the measure: tokens/s with the adapter over tokens/s without (an adapter that
    # changes what is generated changes how many tokens the same calls make)
    ratio = ways["merged"]["tokens_per_s"] / ways["base"]["tokens_per_s"]
    setting, switches = cpu_setting(dtype)
    result = {"metric": "household rollout tokens/s, learn.toml's shape (16 tasks x 8, 4 steps)",
              "dtype": dtype, "isa_switches": switches, "adapter": {
                  **({"trained": args.adapter} if args.adapter else {
                      "targets": "q_proj,v_proj", "r": 16, "b_std": args.scale}),
                  "probe_mean_abs_logprob_change": round(statistics.mean(moved), 4)},
              "ways": ways, "merged_over_base": round(ratio, 3),
              "unmerged_over_base": round(ways["unmerged"]["tokens_per_s"]
                                          / ways["base"]["tokens_per_s"], 3),
              "seconds_base_over_merged": round(ways["base"]["seconds"]
                                                / ways["merged"]["seconds"], 3),
              "free_rollout_base": {k: round(v, 2) for k, v in free["base"].items()},
              "target": ">= 0.95", "met": ratio >= 0.95, "agreement": agree,
              "note": "run alone on the machine; the three ways alternate round by round"}
    print(save(f"adapter-{'trained-' if args.adapter else ''}{setting}", result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The CUDA checklist (one GPU): rlany's stages on a GPU, what they reach, what fails.

Run on a machine with one CUDA GPU (nothing is fetched there: no model hub, no vllm), from
the repository root with rlany importable (`pip install --no-deps -e .` or PYTHONPATH=src):

    python benchmarks/gpu_check.py --tokenizer DIR --out results-dir

DIR holds a chat tokenizer (tokenizer.json, tokenizer_config.json, chat_template.jinja and
the model's config.json; SmolLM2-135M-Instruct's). The models are built on the spot with
random weights: `rlany models make-tiny` for path checks, and SmolLM2-360M's and -1.7B's
shapes (Llama, that tokenizer's 49k vocabulary) for speed, since random weights cost what
trained ones cost. Checks, each recorded as passed or failed with the failing command's last
lines, none stopping the next:

1. generation: `rlany rollout` / `judge` / `eval` with `--engine hf` (bf16): tokens/s;
2. training: `rlany train-policy` LoRA and `--full` on synthetic scored steps: tokens/s
   (every token a sample holds) and peak GPU memory; a long-sequence full fine-tune as
   the comparison with prime-rl's trainer;
3. `accelerate launch --config_file examples/accelerate/single-gpu.yaml -m rlany
   train-policy` killed (SIGKILL) after its third saved step, rerun: resumes, finishes;
4. `rlany loop` (2 iterations, the tiny model, hf engine, every switch on): every stage
   on the GPU in one engine, the trained adapter checked when the engine loads it (with
   random tiny weights the check says "indeterminate", as on a CPU).

`--smoke` runs the same on a CPU with tiny shapes (to test this script, not the GPU).
Writes `gpu.json` and `gpu-log.txt` to --out; `--only` reruns some checks (a call that ran
out of --budget skips the rest). benchmarks/results/gpu.json merges the 2026-11-26 calls.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # SmolLM2's own shapes (config.json of each), random weights
    "smollm2-360m": {"hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32,
                     "num_attention_heads": 15, "num_key_value_heads": 5},
    "smollm2-1.7b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                     "num_attention_heads": 32, "num_key_value_heads": 32},
}
SMOKE_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2}


class Checks:
    """Runs commands with a log and a deadline; collects the results."""

    def __init__(self, out: Path, deadline: float):
        self.out, self.deadline = out, deadline
        self.log = open(out / "gpu-log.txt", "a", buffering=1)
        self.results: dict = {"checks": {}}

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def left(self) -> float:
        return self.deadline - time.time()

    def cli(self, *args, launcher: tuple = (), timeout: float = 300) -> tuple[int, float, str]:
        """Run `rlany ARGS` (or `LAUNCHER -m rlany ARGS`); (rc, seconds, last lines)."""
        cmd = [*launcher, "-m", "rlany", *map(str, args)] if launcher else \
            [sys.executable, "-m", "rlany", *map(str, args)]
        timeout = max(5.0, min(timeout, self.left()))
        self.say("$ " + " ".join(cmd))
        t0 = time.time()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
            rc, text = r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = 124, f"timed out after {timeout:.0f}s\n" + str(e.stderr or "")[-3000:]
        seconds = time.time() - t0
        self.log.write(text + "\n")
        tail = "\n".join(text.strip().splitlines()[-12:])
        self.say(f"rc {rc} in {seconds:.1f}s" + (f"\n{tail}" if rc else ""))
        return rc, seconds, tail

    def record(self, name: str, **fields) -> None:
        self.results["checks"][name] = fields
        self.say(f"{name}: {json.dumps(fields)[:600]}")
        (self.out / "gpu.json").write_text(json.dumps(self.results, indent=2) + "\n")


def device_facts() -> dict:
    import torch
    facts = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda,
             "cuda_available": torch.cuda.is_available(), "python": sys.version.split()[0]}
    for name in ("transformers", "peft", "accelerate"):
        facts[name] = __import__(name).__version__
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        facts.update(device=p.name, memory_gib=round(p.total_memory / 2**30, 1),
                     multiprocessors=p.multi_processor_count,
                     bf16=torch.cuda.is_bf16_supported())
    from rlany.compat import machine_profile
    facts["rlany_dtype_auto"] = machine_profile()["dtype"]
    return facts


def make_random(tokenizer: Path, shape: dict, directory: Path, device: str) -> float:
    """A Llama model of `shape` with random weights and `tokenizer`'s files; its size in B."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    base = json.loads((tokenizer / "config.json").read_text())
    if shape.get("model_type") == "qwen3":  # another family: only the tokenizer's ids kept
        from transformers import Qwen3Config
        ids = {k: base[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        config = Qwen3Config(**ids, **{k: v for k, v in shape.items() if k != "model_type"})
    else:
        config = LlamaConfig(**{**base, **shape, "head_dim": shape["hidden_size"]
                                // shape["num_attention_heads"]})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    for f in tokenizer.iterdir():
        if f.name != "config.json":
            shutil.copy(f, directory / f.name)
    size = sum(p.numel() for p in model.parameters()) / 1e9
    del model
    return round(size, 3)


def scored_file(path: Path, n: int, prompt_words: int, response_words: int,
                tokenizer: Path | None = None) -> None:
    """n scored steps (one per trajectory, advantage +-1, kept) with prompts of about
    `prompt_words` words (one token each in SmolLM2's tokenizer): the shape train-policy
    reads, without a rollout to make it. With `tokenizer`, each response carries its token
    ids and log-probs as an engine's would (PPO's pre-update pass is then not rerun)."""
    from rlany.files.records import Scored, ScoredStep, to_json
    words = "the agent opens the drawer and takes the red apple to the table".split()
    if tokenizer:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(tokenizer)
    with open(path, "w") as f:
        for i in range(n):
            prompt = " ".join(words[(i + k) % len(words)] for k in range(prompt_words))
            response = " ".join(words[(2 * i + k) % len(words)] for k in range(response_words))
            ids = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] \
                if tokenizer else None
            step = ScoredStep(step=0, prompt_messages=[{"role": "user", "content": prompt}],
                              response=response, step_score=0.0, reward=1.0 - 2 * (i % 2),
                              advantage=1.0 - 2 * (i % 2), keep=True, token_ids=ids,
                              logprobs=[-1.0] * len(ids) if ids else None)
            rec = Scored(traj_id=f"t{i}", task_id=f"task{i // 8}", iteration=0, sample=i % 8,
                         outcome=1 - 2 * (i % 2), task_acc=0.5, steps=[step])
            f.write(json.dumps(to_json(rec)) + "\n")


def sidecar(path: Path) -> dict:  # the stage's `.meta.json`, {} where it wrote none
    from rlany.files.provenance import sidecar as read
    return read(path) or {}


def generation(c: Checks, model: Path, name: str, work: Path, tasks: Path, evals: Path,
               smoke: bool) -> None:
    tok = 16 if smoke else 48
    traj, judg, ev = work / f"traj-{name}.jsonl", work / f"judg-{name}.jsonl", \
        work / f"eval-{name}.json"
    out = {}
    rc, sec, tail = c.cli("rollout", "-i", tasks, "-o", traj, "--model", model, "--engine",
                          "hf", "--n", 8, "--max-steps", 2, "--max-tokens", tok, timeout=150)
    meta = sidecar(traj)
    counts = meta.get("counts", {})
    out["rollout"] = {"rc": rc, "wall_s": round(sec, 1), "tokens": counts.get("completion_tokens"),
                      "tokens_per_s": _rate(counts),
                      "dtype": meta.get("flags", {}).get("dtype_resolved"),
                      **({"error": tail} if rc else {})}
    if not rc:
        rc, sec, tail = c.cli("judge", "-i", traj, "-o", judg, "--model", model, "--engine",
                              "hf", "--m", 4, "--max-tokens", tok, timeout=150)
        counts = sidecar(judg).get("counts", {})
        out["judge"] = {"rc": rc, "wall_s": round(sec, 1),
                        "tokens": counts.get("completion_tokens"), "tokens_per_s": _rate(counts),
                        **({"error": tail} if rc else {})}
    rc, sec, tail = c.cli("eval", "-i", evals, "-o", ev, "--model", model, "--engine", "hf",
                          "--n", 4, "--max-steps", 2, "--max-tokens", tok, timeout=150)
    summary = json.loads(ev.read_text()) if ev.exists() else {}
    out["eval"] = {"rc": rc, "wall_s": round(sec, 1), "episodes": summary.get("trajectories"),
                   "success_rate": summary.get("success_rate"),
                   **({"error": tail} if rc else {})}
    c.record(f"generation-{name}", ok=all(v["rc"] == 0 for v in out.values()), **out)


def _rate(counts: dict) -> float | None:
    s = counts.get("generate_seconds")
    return round(counts["completion_tokens"] / s, 1) if s else None


def train(c: Checks, name: str, model: Path, data: Path, work: Path, *extra,
          launcher: tuple = ()) -> dict:
    ckpt = work / f"ckpt-{name}"
    rc, sec, tail = c.cli("train-policy", "-i", data, "-o", ckpt, "--model", model, *extra,
                          launcher=launcher)
    return {"rc": rc, "wall_s": round(sec, 1), **_train_numbers(ckpt),
            **({"error": tail} if rc else {})}


def _train_numbers(ckpt: Path) -> dict:
    metrics = ckpt.with_name(ckpt.name + ".metrics.jsonl")
    steps = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    steps = [s for s in steps if "tokens_per_s" in s]
    info = json.loads((ckpt / "rlany.json").read_text()) if (ckpt / "rlany.json").exists() else {}
    later = [s["tokens_per_s"] for s in steps[1:]] or [s["tokens_per_s"] for s in steps]
    return {"steps": len(steps), "tokens_per_s_median": statistics.median(later) if later else None,
            "first_step_s": steps[0]["seconds"] if steps else None,
            "sample_tokens_per_step": steps[-1]["sample_tokens"] if steps else None,
            "peak_gpu_memory_gib": info.get("metrics", {}).get("peak_gpu_memory_gib"),
            "resumed": any('"resume"' in x for x in (metrics.read_text().splitlines()
                                                     if metrics.exists() else []))}


def training(c: Checks, models: dict, work: Path, smoke: bool, long_seq: bool) -> None:
    short, long_ = work / "scored-short.jsonl", work / "scored-long.jsonl"
    if not short.exists():
        scored_file(short, 64 if smoke else 256, 60 if smoke else 400, 16)
        scored_file(long_, 8 if smoke else 32, 200 if smoke else 3000, 64)
    steps = ("--max-steps", 3 if smoke else 8)
    for name, model in models.items():
        if c.left() < 60:
            c.record(f"train-{name}", ok=False, error="skipped: out of time")
            continue
        runs = {"lora": train(c, f"{name}-lora", model, short, work, "--micro-batch", 16,
                              *steps),
                "full": train(c, f"{name}-full", model, short, work, "--full", "--lr", "1e-6",
                              "--micro-batch", 16, *steps)}
        if long_seq:  # the long-sequence comparison, the smaller model
            runs["full_long"] = train(c, f"{name}-full-long", model, long_, work, "--full",
                                      "--lr", "1e-6", "--micro-batch", 4, "--grad-accum", 1,
                                      "--max-len", 8192,
                                      *steps)
        c.record(f"train-{name}", ok=all(r["rc"] == 0 for r in runs.values()), **runs)


def kill_resume(c: Checks, model: Path, work: Path) -> None:
    """accelerate launch train-policy, SIGKILL after the third saved step, then again."""
    data = work / "scored-short.jsonl"
    ckpt = work / "ckpt-accelerate"
    metrics = ckpt.with_name(ckpt.name + ".metrics.jsonl")
    launcher = (sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(ROOT / "examples/accelerate/single-gpu.yaml"))
    args = ["train-policy", "-i", data, "-o", ckpt, "--model", model, "--micro-batch", 8,
            "--save-every", 1, "--max-steps", 10]
    cmd = [*launcher, "-m", "rlany", *map(str, args)]
    c.say("$ " + " ".join(cmd) + "   (killed after step 3)")
    with open(work / "accelerate-first.log", "w") as logf:
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT,
                             start_new_session=True)
        killed_at = None
        end = time.time() + min(180, c.left())
        while time.time() < end and p.poll() is None:
            n = sum('"step"' in x and '"loss"' in x for x in metrics.read_text().splitlines()) \
                if metrics.exists() else 0
            if n >= 3:
                os.killpg(p.pid, signal.SIGKILL)
                killed_at = n
                break
            time.sleep(0.2)
        p.wait()
    first = (work / "accelerate-first.log").read_text()
    c.log.write(first)
    if killed_at is None:
        c.record("accelerate-kill-resume", ok=False, error="not killed: first run rc "
                 f"{p.returncode}\n" + "\n".join(first.strip().splitlines()[-12:]))
        return
    rc, sec, tail = c.cli(*args, launcher=launcher)
    numbers = _train_numbers(ckpt)
    c.record("accelerate-kill-resume", ok=rc == 0 and numbers["resumed"] and
             (ckpt / "rlany.json").exists(), killed_after_steps=killed_at, rc=rc,
             wall_s=round(sec, 1), **numbers, **({"error": tail} if rc else {}))


def loop(c: Checks, tiny: Path, work: Path, smoke: bool) -> None:
    runs = work / "runs"
    rc, sec, tail = c.cli(
        "loop", "examples/household/learn.toml", "--name", "gpu", "--step-feedback",
        "--rm-training", "--env-adaptation", "--set", f'model="{tiny}"', "--set",
        'engine="hf"', "--set", f'runs_dir="{runs}"', "--set", "iterations=2", "--set",
        "eval_every=2", "--set", "rollout.sample_tasks=8", "--set", "eval.judge=true",
        timeout=400)
    run = runs / "gpu"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()] \
        if (run / "metrics.jsonl").exists() else []
    traj = run / "iter_001" / "trajectories.jsonl"
    meta = sidecar(traj)
    checks, flags = meta.get("counts", {}), meta.get("flags", {})
    c.record("loop", ok=rc == 0, rc=rc, wall_s=round(sec, 1), iterations=len(metrics),
             adapter_checks={k: v for k, v in checks.items() if "adapter" in k},
             engine=flags.get("engine"), dtype=flags.get("dtype_resolved"),
             **({"error": tail} if rc else {}))


def start(doc: str, work: str, budget: float, more) -> tuple[argparse.Namespace, Checks]:
    """The GPU scripts' shared arguments (`more` adds a script's own), a clean --work, and
    the Checks that keep to --budget."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path(work))
    ap.add_argument("--budget", type=float, default=budget, help="seconds for everything")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, CPU allowed")
    more(ap)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    return a, Checks(a.out, time.time() + a.budget)


def main() -> None:
    a, c = start(__doc__, "/tmp/rlany-gpu", 420, lambda ap: ap.add_argument(
        "--only", default="", help="comma-separated: gen,train,accelerate,loop,large (large: "
        "only the larger model's training)"))
    only = set(filter(None, a.only.split(","))) or {"gen", "train", "accelerate", "loop"}
    facts = device_facts()
    c.results["machine"] = facts
    c.say(json.dumps(facts))
    if not facts["cuda_available"] and not a.smoke:
        c.record("cuda", ok=False, error="torch sees no CUDA device")
        return
    device = "cuda" if facts["cuda_available"] else "cpu"
    tiny = a.work / "tiny"
    rc, _, tail = c.cli("models", "make-tiny", tiny)
    shapes = {"smoke": SMOKE_SHAPE} if a.smoke else SHAPES
    models = {name: a.work / name for name in shapes}
    sizes: dict = {}
    c.results["models"] = {"parameters_b": sizes, "tiny_rc": rc}

    def build(name: str) -> None:  # when first needed: the larger one's seconds come last
        t0 = time.time()
        sizes[name] = make_random(a.tokenizer, shapes[name], models[name], device)
        c.say(f"built {name}: {sizes[name]}B parameters in {time.time() - t0:.1f}s")
    tasks, evals = a.work / "tasks.jsonl", a.work / "eval.jsonl"
    lines = (ROOT / "examples/household/learn_tasks.jsonl").read_text().splitlines()
    tasks.write_text("\n".join(lines[:4 if a.smoke else 16]) + "\n")
    lines = (ROOT / "examples/household/learn_eval.jsonl").read_text().splitlines()
    evals.write_text("\n".join(lines[:2 if a.smoke else 8]) + "\n")
    first, *rest = models
    build(first)
    # the correctness checks (accelerate, loop) before the larger model's speed
    if "gen" in only:
        generation(c, models[first], first, a.work, tasks, evals, a.smoke)
    if "train" in only:
        training(c, {first: models[first]}, a.work, a.smoke, long_seq=True)
    if "accelerate" in only and c.left() > 60:
        if not (a.work / "scored-short.jsonl").exists():
            scored_file(a.work / "scored-short.jsonl", 64, 60 if a.smoke else 400, 16)
        kill_resume(c, models[first], a.work)
    if "loop" in only and c.left() > 60:
        loop(c, tiny, a.work, a.smoke)
    if {"train", "large"} & only and rest and c.left() > 90:
        for name in rest:
            build(name)
        training(c, {n: models[n] for n in rest}, a.work, a.smoke, long_seq=False)
    c.results["all_ok"] = all(v.get("ok") for v in c.results["checks"].values())
    (a.out / "gpu.json").write_text(json.dumps(c.results, indent=2) + "\n")
    c.say(f"done: all_ok={c.results['all_ok']}, {c.left():.0f}s of the budget left")


if __name__ == "__main__":
    main()

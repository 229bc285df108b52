"""rlany against TRL: seconds per outcome-only RL step on the same work.

One RL step = generate P prompts x S samples (up to T new tokens, temperature 1, HF
generation: no vLLM on either side), reward each sample exactly (sums of D-digit numbers:
the reasoning env's answer check), one optimizer step of LoRA (r 16, alpha 32, all linear
projections) over the step's samples at the same learning rate, fp32 on a CPU (rlany's own
default would be bf16 where the CPU has it). Default shape: 8 two-digit sums x 8 samples x
96 tokens (`--prompts 8 --samples 8 --max-tokens 96 --digits 2`); the first results
(2026-11-22, `trl.json`) used 4 single-digit sums x 4 x 64.

    rlany   `rlany loop` on a generated config (outcome-only: no judge, no RM, no task
            adaptation), one process, iterations = 1 warm-up + steps; per step: rollout
            (generation), train-policy (training) and the rest of the iteration (other),
            each from the loop's own stage seconds and its `done.json` times.
    TRL     `GRPOTrainer` (its own virtualenv, installed by this script: TRL's pinned
            dependencies must not touch rlany's), the same model directory, prompts and
            reward, `max_steps` = 1 warm-up + steps; per step: wall from a callback,
            generation from timing its generate-and-score call.

Sides alternate (rlany, TRL, rlany, TRL, ...; `--rounds`), run alone on the machine; the
median seconds per step after the warm-up of each side, their ratio (target: rlany <= 0.35
of TRL, with rlany's generation seconds <= TRL's), the split and the samples each side
trains on per step go to benchmarks/results/trl-SETTING.json (SETTING: common.cpu_setting,
e.g. avx512-float32, avx2forced-float32):

    python benchmarks/bench_trl.py --steps 4 --rounds 2
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python benchmarks/bench_trl.py --steps 4 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_setting, save  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LR = 1e-5

TRL_SCRIPT = r'''
import json, re, sys, time
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

args = json.loads(sys.argv[1])
rows = json.loads(open(args["data"]).read())
torch.manual_seed(0)

def answer(text):  # rlany.envs.reasoning.extract_answer, copied: no rlany in this venv
    boxed = [b for b in re.findall(r"\\boxed\{([^{}]*)\}", text) if b.strip()]
    if boxed:
        return boxed[-1].strip()
    m = list(re.finditer(r"answer\s*(?:is)?\s*[:=]?\s*([^\n]+)", text, re.IGNORECASE))
    if m:
        nums = re.findall(r"-?\d+(?:\.\d+)?", m[-1].group(1))
        return nums[0] if nums else m[-1].group(1).strip().rstrip(".")
    nums = re.findall(r"-?\d+(?:\.\d+)?", text)
    return nums[-1] if nums else None

def same(got, want):
    if got is None:
        return False
    g = got.replace(",", "").replace("$", "").strip()
    try:
        return abs(float(g) - float(want)) < 1e-9
    except ValueError:
        return g.lower().rstrip(".") == want.lower().rstrip(".")

def reward(completions, answer_key, **kw):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if same(answer(t), a) else -1.0 for t, a in zip(texts, answer_key)]

steps = args["steps"] + 1
data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["content"]}],
                           "answer_key": r["answer"]} for r in rows] * (steps + 1))
config = GRPOConfig(output_dir=args["out"],
                    per_device_train_batch_size=args["prompts"] * args["samples"],
                    num_generations=args["samples"], max_completion_length=args["max_tokens"],
                    learning_rate=args["lr"],
                    max_steps=steps, gradient_accumulation_steps=1, temperature=1.0,
                    beta=0.0, logging_steps=1, save_strategy="no", report_to=[],
                    use_cpu=True, bf16=False, fp16=False, seed=0, shuffle_dataset=False,
                    dataloader_num_workers=0)
times = {"gen": []}

class Clock(TrainerCallback):
    def on_step_begin(self, a, s, c, **kw):
        self.t = time.perf_counter()
    def on_step_end(self, a, s, c, **kw):
        times.setdefault("wall", []).append(time.perf_counter() - self.t)

trainer = GRPOTrainer(model=args["model"], reward_funcs=[reward], args=config,
                      train_dataset=data, callbacks=[Clock()],
                      peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                             target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
inner = trainer._generate_and_score_completions
def timed(*a, **k):
    t = time.perf_counter()
    out = inner(*a, **k)
    times["gen"].append(time.perf_counter() - t)
    return out
trainer._generate_and_score_completions = timed
trainer.train()
print("TIMES " + json.dumps(times))
'''


def ensure_venv(venv: Path) -> dict:
    """TRL in its own virtualenv (created once): the CPU torch rlany pins, then trl."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import trl, torch, transformers, peft, json; print(json.dumps("
             "{'trl': trl.__version__, 'torch': torch.__version__, "
             "'transformers': transformers.__version__, 'peft': peft.__version__}))"]
    if not py.exists() or subprocess.run(probe, capture_output=True).returncode != 0:
        import torch
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, f"torch=={torch.__version__.split('+')[0]}"], check=True)
        subprocess.run([*pip, "trl", "peft", "datasets"], check=True)
    return json.loads(subprocess.run(probe, capture_output=True, text=True,
                                     check=True).stdout)


def make_data(work: Path, prompts: int, digits: int) -> tuple[Path, Path]:
    """`prompts` sums: rlany's tasks.jsonl and the same first user messages for TRL."""
    from rlany.envs.reasoning import ReasoningEnv, make_tasks
    from rlany.files.records import to_json

    tasks = make_tasks(prompts, seed=0, digits=digits)
    (work / "tasks.jsonl").write_text("".join(json.dumps(to_json(t)) + "\n" for t in tasks))
    rows = [{"content": t.prompt + "\n\n" + ReasoningEnv().reset(t),
             "answer": str(t.spec["answer"])} for t in tasks]
    (work / "trl.json").write_text(json.dumps(rows))
    return work / "tasks.jsonl", work / "trl.json"


def run_rlany(work: Path, tasks: Path, steps: int, tag: str, shape: dict) -> dict:
    config = work / f"rlany-{tag}.toml"
    config.write_text(f'''name = "trl-{tag}"
runs_dir = "{work}"
iterations = {steps + 1}
tasks = "{tasks}"
model = "smollm2"
engine = "hf"
dtype = "float32"
seed = 0
keep_last = 1
step_feedback = false
rm_training = false
env_adaptation = false
[rollout]
n = {shape["samples"]}
max_tokens = {shape["max_tokens"]}
temperature = 1.0
batch_tasks = {shape["prompts"]}
[train_policy]
lr = {LR}
micro_batch = {shape["prompts"] * shape["samples"]}
grad_accum = 1
lora_r = 16
lora_alpha = 32
target_modules = "all-linear"
dtype = "float32"
''')
    started = time.time()
    subprocess.run([sys.executable, "-m", "rlany", "loop", str(config)], check=True,
                   cwd=ROOT, stdout=subprocess.DEVNULL)
    run = work / f"trl-{tag}"
    done = [run / f"iter_{i:03d}" / "done.json" for i in range(steps + 1)]
    ends = [started] + [p.stat().st_mtime for p in done]
    out = {"wall": [], "gen": [], "train": [], "other": [], "samples": []}
    for i, path in enumerate(done):
        m = json.loads(path.read_text())
        sec = m.get("seconds") or {}
        wall = ends[i + 1] - ends[i]
        out["wall"].append(wall)
        out["gen"].append(sec.get("rollout", 0.0))
        out["train"].append(sec.get("train_policy", 0.0))
        out["other"].append(wall - sec.get("rollout", 0.0) - sec.get("train_policy", 0.0))
        out["samples"].append(m.get("policy_samples") or 0)
    return out


def run_trl(venv: Path, work: Path, data: Path, model: str, steps: int, tag: str,
            shape: dict) -> dict:
    script = work / "trl_step.py"
    script.write_text(TRL_SCRIPT)
    args = {"data": str(data), "model": model, "steps": steps, "lr": LR,
            "out": str(work / f"trl-out-{tag}"), **shape}
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true"}
    done = subprocess.run([str(venv / "bin" / "python"), str(script), json.dumps(args)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit("TRL failed:\n" + done.stderr[-3000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("TIMES "))
    times = json.loads(line[6:])
    gen = times["gen"]
    return {"wall": times["wall"], "gen": gen,
            "train": [w - g for w, g in zip(times["wall"], gen)],
            "other": [0.0] * len(gen),
            "samples": [shape["prompts"] * shape["samples"]] * len(times["wall"])}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="measured steps after 1 warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two sides")
    parser.add_argument("--venv", default=str(ROOT / "benchmarks" / ".trl-venv"))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8, help="per prompt")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--digits", type=int, default=2)
    args = parser.parse_args(argv if argv is not None else
                             (sys.argv[1:] if __name__ == "__main__" else []))
    if args.samples < 2:  # a group of one has no advantage; TRL refuses it too
        parser.error("--samples must be at least 2")
    from rlany.models import resolve_model

    model = resolve_model("smollm2")
    versions = ensure_venv(Path(args.venv))
    work = Path(tempfile.mkdtemp(prefix="rlany-trl-"))
    shape = {"prompts": args.prompts, "samples": args.samples, "max_tokens": args.max_tokens}
    tasks, data = make_data(work, args.prompts, args.digits)
    sides: dict[str, dict[str, list]] = {"rlany": {}, "trl": {}}
    order = []
    for r in range(args.rounds):
        for side in ("rlany", "trl"):
            print(f"bench_trl: round {r} {side}", file=sys.stderr, flush=True)
            got = (run_rlany(work, tasks, args.steps, str(r), shape) if side == "rlany" else
                   run_trl(Path(args.venv), work, data, model, args.steps, str(r), shape))
            order.append(side)
            for key, values in got.items():  # the first step of each run is the warm-up
                sides[side].setdefault(key, []).extend(values[1:])
    med = {side: {k: round(statistics.median(v), 2) for k, v in d.items()}
           for side, d in sides.items()}
    ratio = med["rlany"]["wall"] / med["trl"]["wall"]
    shutil.rmtree(work, ignore_errors=True)
    print(f"seconds per RL step (median): rlany {med['rlany']['wall']} (gen "
          f"{med['rlany']['gen']}, train {med['rlany']['train']}, other "
          f"{med['rlany']['other']}), TRL {med['trl']['wall']} (gen {med['trl']['gen']}, "
          f"train+other {med['trl']['train']}); ratio {ratio:.3f} (target <= 0.35)")
    met = ratio <= 0.35 and med["rlany"]["gen"] <= med["trl"]["gen"]
    result = {"metric": "seconds per outcome-only RL step, rlany / TRL GRPOTrainer",
              "ratio": round(ratio, 3), "target": "<= 0.35, generation <= TRL's", "met": met,
              "median": med, "steps": sides, "order": order, "trl_venv": versions, "lr": LR,
              "shape": {**shape, "digits": args.digits},
              "work": f"{args.prompts} prompts x {args.samples} samples x <={args.max_tokens} "
                      f"tokens ({args.digits}-digit sums), LoRA r16 all-linear, fp32, HF "
                      "generation both sides (rlany's hf engine in calls of up to 64 sequences); "
                      "samples = sequences trained per step",
              "note": "run alone on the machine; sides alternate"}
    setting, result["isa_switches"] = cpu_setting("float32")
    save(f"trl-{setting}", result)
    return result


if __name__ == "__main__":
    main()

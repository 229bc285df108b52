"""File-level stage drivers: read inputs, run a stage function, write outputs + sidecars.

`rlany <stage>` (cli.py) and `rlany loop` (loop.py) both call these, so a loop iteration
does exactly what the equivalent commands do, with one engine kept alive across stages.
Each driver returns the counts it wrote into its `.meta.json`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from rlany.console import info, progress
from rlany.errors import RlanyError
from rlany.jsonl import AtomicJsonl, JsonlReader, ResumableJsonl, write_meta, write_text_atomic

GEN_VERSIONS = ("vllm", "torch", "transformers")


def read_tasks(path: str | Path, allow_empty: bool = False):
    """All tasks of a file (a task pool is small), with env names and unique ids checked.
    `allow_empty` for candidate files: an iteration may propose no candidate at all."""
    from rlany import envs
    from rlany.records import Task

    reader = JsonlReader(path, Task, "tasks", allow_empty=allow_empty)
    tasks, seen = [], set()
    known = envs.names()
    for where, task in reader:
        if task.env not in known:
            raise RlanyError(f"unknown environment '{task.env}'", where=where,
                             hint=f"known: {', '.join(known)}")
        if task.task_id in seen:
            raise RlanyError(f"duplicate task_id '{task.task_id}'", where=where)
        seen.add(task.task_id)
        tasks.append(task)
    return tasks, reader


def run_score(input: str, judgments: str | None, output: str, stats: str | None,
              opts, flags: dict) -> dict:
    from rlany.records import Judgment, Trajectory
    from rlany.score import score_stream

    started = time.time()
    traj_reader = JsonlReader(input, Trajectory, "trajectories")
    judge_reader = JsonlReader(judgments, Judgment, "judgments") if judgments else None
    counts = {"tasks": 0, "trajectories": 0, "policy_samples": 0, "rm_samples": 0}
    acc_sum = agree_sum = 0.0
    agree_n = 0
    with AtomicJsonl(output) as out, (AtomicJsonl(stats) if stats else nullcontext()) as st:
        for scored, task_stats in score_stream(traj_reader, judge_reader, opts):
            out.write_all(scored)
            if st:
                st.write(task_stats)
            counts["tasks"] += 1
            counts["trajectories"] += len(scored)
            counts["policy_samples"] += task_stats.policy_samples
            counts["rm_samples"] += task_stats.rm_samples
            acc_sum += task_stats.acc
            if task_stats.judge_outcome_agreement is not None:
                agree_sum += task_stats.judge_outcome_agreement
                agree_n += 1
    counts["mean_acc"] = acc_sum / max(counts["tasks"], 1)
    counts["judge_outcome_agreement"] = agree_sum / agree_n if agree_n else None
    inputs = [traj_reader] + ([judge_reader] if judge_reader else [])
    for path in (output, stats):
        if path:
            write_meta(path, stage="score", flags=flags, inputs=inputs, counts=counts,
                       started=started)
    info(f"score: {counts['trajectories']} trajectories in {counts['tasks']} tasks, mean acc "
         f"{counts['mean_acc']:.3f}, {counts['policy_samples']} policy samples, "
         f"{counts['rm_samples']} reward-model samples -> {output} "
         f"({time.time() - started:.1f}s)")
    return counts


def run_rollout(tasks_path: str, output: str, engine, opts, flags: dict) -> dict:
    from rlany import envs
    from rlany.rollout import rollout

    started = time.time()
    tasks, reader = read_tasks(tasks_path)
    out = ResumableJsonl(output)
    done = set(out.done)
    todo = [t for t in tasks if t.task_id not in done]
    if done:
        info(f"rollout: resuming, {len(done)} of {len(tasks)} tasks already done")
    policy = {"model": engine.model, "adapter": opts.adapter}
    stats = engine.stats
    calls0, tokens0, secs0 = stats.calls, stats.completion_tokens, stats.seconds
    successes = total = 0
    try:
        with progress("rollout", len(todo)) as bar:
            for group in rollout(todo, engine, envs.make_env, opts, policy):
                out.write_group(group[0].task_id, group)
                successes += sum(t.outcome == 1 for t in group)
                total += len(group)
                bar.advance()
    finally:
        out.close()
    out.finish()
    tokens = engine.stats.completion_tokens - tokens0
    seconds = engine.stats.seconds - secs0
    counts = {"tasks": len(tasks), "trajectories": out.count, "new_trajectories": total,
              "success_rate": successes / max(total, 1), "completion_tokens": tokens,
              "generate_calls": engine.stats.calls - calls0,
              "generate_seconds": round(seconds, 3)}
    write_meta(output, stage="rollout", flags=flags, inputs=[reader], counts=counts,
               started=started, versions=GEN_VERSIONS)
    info(f"rollout: {total} trajectories for {len(todo)} tasks, success {successes}/{total}; "
         f"{tokens} tokens, {tokens / seconds if seconds else 0:.0f} tokens/s -> {output} "
         f"({time.time() - started:.1f}s)")
    return counts


def run_judge(input: str, output: str, engine, opts, flags: dict) -> dict:
    from rlany.judge import judge, unit_test_counts
    from rlany.records import Trajectory

    started = time.time()
    reader = JsonlReader(input, Trajectory, "trajectories")
    out = ResumableJsonl(output)
    done = set(out.done)
    if done:
        info(f"judge: resuming, {len(done)} tasks already judged")
    tokens0, secs0 = engine.stats.completion_tokens, engine.stats.seconds
    outcomes: dict[str, int] = {}

    def todo():
        for _, t in reader:
            if t.task_id not in done:
                outcomes[t.traj_id] = t.outcome
                yield t
    verdicts = {1: 0, -1: 0, 0: 0}
    tests: dict[str, int] = {}
    try:
        with progress("judge", None) as bar:
            for group in judge(todo(), engine, opts, {"model": engine.model,
                                                      "adapter": opts.adapter}):
                out.write_group(group[0].task_id, group)
                if opts.mode == "unit-tests":
                    for key, value in unit_test_counts(group, outcomes).items():
                        tests[key] = tests.get(key, 0) + value
                    for j in group:
                        outcomes.pop(j.traj_id, None)
                for j in group:
                    for s in j.steps:
                        for sample in s.samples:
                            verdicts[sample.score] += 1
                bar.advance()
    finally:
        out.close()
    out.finish()
    total = sum(verdicts.values())
    tokens = engine.stats.completion_tokens - tokens0
    seconds = engine.stats.seconds - secs0
    counts = {"judgments": out.count, "verdicts": total, "positive": verdicts[1],
              "negative": verdicts[-1], "unparseable": verdicts[0],
              "parse_fail_rate": verdicts[0] / total if total else 0.0,
              "completion_tokens": tokens, "generate_seconds": round(seconds, 3), **tests}
    write_meta(output, stage="judge", flags=flags, inputs=[reader], counts=counts,
               started=started, versions=GEN_VERSIONS)
    info(f"judge: {total} verdicts (+1: {verdicts[1]}, -1: {verdicts[-1]}, unparseable: "
         f"{verdicts[0]} = {counts['parse_fail_rate']:.1%}); {_tests_line(tests)}"
         f"{tokens} tokens, {tokens / seconds if seconds else 0:.0f} tokens/s -> {output} "
         f"({time.time() - started:.1f}s)")
    return counts


def _tests_line(tests: dict[str, int]) -> str:
    if not tests:
        return ""
    return (f"unit tests: {tests['tests_parsed']}/{tests['tests']} parsed, "
            f"{tests['tests_valid']}/{tests['tests_checkable']} passed by every correct "
            f"program, {tests['tests_discriminating']} of those fail a wrong one; ")


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run_train(kind: str, input: str, output: str, base: str, adapter: str | None, opts,
              iteration: int, say: Callable[[str], None] = info) -> dict:
    """Train the policy (kind 'policy') or the reward model ('rm') of base model `base` (an
    alias, a directory or a hub id); write the checkpoint."""
    from rlany.models import resolve_model
    from rlany.records import Scored
    from rlany.train import load_model, policy_samples, rm_samples, tokenize, train

    started = time.time()
    out = Path(output)
    if (out / "rlany.json").exists():
        raise RlanyError("checkpoint already exists", where=output,
                         hint="choose another --output or delete it")
    if out.exists():
        raise RlanyError("output exists and is not a finished checkpoint", where=output)
    for _ in JsonlReader(input, Scored, "scored"):
        pass  # malformed data fails here, before a model is loaded
    base = resolve_model(base)
    reader = JsonlReader(input, Scored, "scored")
    extract = policy_samples if kind == "policy" else rm_samples
    net, tokenizer = load_model(base, adapter, opts)
    samples, dropped = tokenize(tokenizer, extract(s for _, s in reader), opts.max_len)
    if not samples:
        raise RlanyError(f"no training samples (dropped as too long: {dropped})", where=input,
                         hint="every step had zero advantage or keep=false; see task_stats")
    metrics_path = out.with_name(out.name + ".metrics.jsonl")
    lines: list[str] = []

    def log(record: dict) -> None:
        lines.append(json.dumps(record))
        write_text_atomic(metrics_path, "\n".join(lines) + "\n")
        if "loss" in record:
            say(f"train-{kind} step {record['step']}/{record['of']}: loss {record['loss']:+.4f}"
                f" kl {record['kl']:.4f} clip {record['clip_frac']:.3f} grad "
                f"{record['grad_norm']:.3f} {record['tokens_per_s']:.0f} tok/s")

    meta = {"kind": kind, "base_model": base, "init_adapter": adapter, "iteration": iteration,
            "data": str(input), "data_sha256": sha256_file(input), "samples": len(samples),
            "dropped_too_long": dropped}
    say(f"train-{kind}: {len(samples)} samples ({dropped} dropped as longer than "
        f"{opts.max_len} tokens), {'full' if opts.full else 'LoRA'} on {base}")
    summary = train(samples, net, tokenizer, opts, out, meta, log)
    say(f"train-{kind}: {summary['steps']} optimizer steps -> {output} "
        f"({time.time() - started:.1f}s)")
    return summary


def read_stats(path: str | Path) -> dict:
    from rlany.records import TaskStats

    return {s.task_id: s for _, s in JsonlReader(path, TaskStats, "task stats")}


def collect_critiques(judgments: str | Path, task_ids: set[str], limit: int) -> dict[str, str]:
    """Critique summaries of the given tasks, streaming the judgments file once."""
    from rlany.adapt import critique_summary
    from rlany.records import Judgment

    grouped: dict[str, list] = {}
    for _, j in JsonlReader(judgments, Judgment, "judgments"):
        if j.task_id in task_ids:
            grouped.setdefault(j.task_id, []).append(j)
    return {tid: critique_summary(js, limit) for tid, js in grouped.items()}


def run_adapt(tasks_path: str, stats_path: str, judgments: str | None, pending: str | None,
              output: str, candidates_out: str, decisions_out: str, engine, opts,
              flags: dict) -> dict:
    """Accept/reject pending candidates, then propose new ones; write pool + candidates."""
    from rlany import envs
    from rlany.adapt import decide, direction_for, propose

    started = time.time()
    pool, pool_reader = read_tasks(tasks_path)
    stats = read_stats(stats_path)
    inputs: list = [pool_reader, {"path": str(stats_path), "sha256": sha256_file(stats_path)}]
    pending_tasks: list = []
    if pending:
        pending_tasks, pending_reader = read_tasks(pending, allow_empty=True)
        inputs.append(pending_reader)
    new_pool, decisions = decide(pool, pending_tasks, stats, opts)
    targets = {t.task_id for t in new_pool
               if t.task_id in stats and direction_for(stats[t.task_id].acc, opts)}
    critiques = collect_critiques(judgments, targets, opts.critiques) if judgments else {}
    candidates, rejections = propose(new_pool, stats, critiques, engine, envs.make_env, opts)
    accepted = sum(d["accepted"] for d in decisions)
    with AtomicJsonl(output) as out:
        out.write_all(new_pool)
    with AtomicJsonl(candidates_out) as out:
        out.write_all(candidates)
    with AtomicJsonl(decisions_out) as out:
        out.write_all([{"kind": "decision", **d} for d in decisions] +
                      [{"kind": "rewrite_rejected", **r} for r in rejections])
    counts = {"pool": len(new_pool), "pending": len(pending_tasks), "accepted": accepted,
              "rejected": len(decisions) - accepted, "targets": len(targets),
              "candidates": len(candidates), "rewrites_rejected": len(rejections)}
    for path in (candidates_out, decisions_out, output):  # the pool's meta last: complete
        write_meta(path, stage="adapt-tasks", flags=flags, inputs=inputs, counts=counts,
                   started=started, versions=GEN_VERSIONS)
    info(f"adapt-tasks: accepted {accepted} of {len(pending_tasks)} candidates; "
         f"{len(targets)} tasks to adapt -> {len(candidates)} new candidates, "
         f"{len(rejections)} rewrites rejected -> {output} ({time.time() - started:.1f}s)")
    return counts


def run_eval(tasks_path: str, output: str, engine, opts, ks: list[int], judge_opts=None,
             trajectories_out: str | None = None, flags: dict | None = None) -> dict:
    """Roll out eval tasks (and optionally judge them); write a summary JSON atomically."""
    from rlany import envs
    from rlany.evaluate import judge_metrics, policy_metrics
    from rlany.judge import judge, unit_test_counts
    from rlany.rollout import rollout

    started = time.time()
    tasks, reader = read_tasks(tasks_path)
    policy = {"model": engine.model, "adapter": opts.adapter}
    groups = list(rollout(tasks, engine, envs.make_env, opts, policy))
    summary = {"policy": policy, **policy_metrics(groups, ks)}
    flat = [t for g in groups for t in g]
    if trajectories_out:
        with AtomicJsonl(trajectories_out) as out:
            out.write_all(flat)
    if judge_opts is not None:
        judged_groups = list(judge(flat, engine, judge_opts,
                                   {"model": engine.model, "adapter": judge_opts.adapter}))
        judged = [j for g in judged_groups for j in g]
        summary["judge"] = {"model": engine.model, "adapter": judge_opts.adapter,
                            "mode": judge_opts.mode}
        summary.update(judge_metrics(flat, judged))
        if judge_opts.mode == "unit-tests":
            outcomes = {t.traj_id: t.outcome for t in flat}
            for g in judged_groups:
                for key, value in unit_test_counts(g, outcomes).items():
                    summary[f"judge_{key}"] = summary.get(f"judge_{key}", 0) + value
    summary["wall_time_s"] = round(time.time() - started, 3)
    write_text_atomic(output, json.dumps(summary, indent=2) + "\n")
    write_meta(output, stage="eval", flags=flags or {}, inputs=[reader],
               counts={k: v for k, v in summary.items() if k != "per_task"}, started=started,
               versions=GEN_VERSIONS)
    judge_part = (f", judge step accuracy {summary['judge_step_accuracy']:.3f}"
                  if summary.get("judge_step_accuracy") is not None else "")
    info(f"eval: success {summary['success_rate']:.3f} over {summary['trajectories']} "
         f"trajectories of {summary['tasks']} tasks, "
         + ", ".join(f"pass@{k} {summary[f'pass@{k}']:.3f}" for k in ks)
         + f"{judge_part} -> {output} ({summary['wall_time_s']:.1f}s)")
    return summary

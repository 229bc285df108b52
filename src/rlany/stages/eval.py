"""`rlany eval`: a policy on held-out tasks, and the judge against ground truth.

Policy: success rate over all trajectories, pass@k per task with the unbiased estimator
1 - C(n-c, k) / C(n, k) (n samples, c successes), averaged over tasks, and mean steps.

Judge (optional): the reward model judges the eval trajectories.
* `judge_step_accuracy`: against the environment's own step labels (`info["label"]`, +1 or
  -1: household labels a step good when its action lies on a shortest plan to the goal from
  the state it was taken in; alfworld asks the game's expert), the balanced accuracy of the
  verdicts (mean of the accuracy on good steps and on bad steps, so a judge that always
  says +1 scores 0.5), with the counts `judge_good_steps` / `judge_bad_steps`. This is the
  paper's step-wise measure; None for envs without labels (reasoning, coding).
* `judge_last_step_accuracy`: the last step against the episode's outcome (exact for
  single-turn envs; for multi-turn ones a failed episode's last step may have been fine).
* `judge_parse_fail_rate`, and `judge_outcome_agreement` (the sign of a trajectory's mean
  step score equals its outcome).
Unparseable verdicts count as wrong. With `last_step_only` judging the judgments hold the
last step only, and these rates cover those steps.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields
from math import comb, sqrt
from statistics import fmean

from rlany.errors import RlanyError
from rlany.options import opt
from rlany.prompts import VERDICT_MODES
from rlany.records import MODES, Judgment, Trajectory
from rlany.stages.rollout import EpisodeFields

# eval's flags that are the judge's (eval key -> judge key); `rlany loop` fills them from
# [judge] unless [eval] sets them
JUDGE_PANEL = "Judge (with --judge)"  # the judge's settings: their own heading in --help
JUDGE_FIELDS = {"m": "m", "judge_max_tokens": "max_tokens",
                "judge_temperature": "temperature", "history_steps": "history_steps",
                "judge_mode": "mode", "verdict": "verdict", "obs_lines": "obs_lines"}


@dataclass(frozen=True, kw_only=True)
class EvalOptions(EpisodeFields):
    input: str = opt("-", "Held-out tasks.jsonl; - for stdin (the default).", scope="io",
                     short="-i")
    output: str = opt("eval.json", "Summary JSON; - for stdout.", scope="io", short="-o")
    trajectories: str | None = opt(None, "Also write the eval trajectories here.", scope="io")
    n: int = opt(4, "Episodes per task.", min=1)
    k: tuple[int, ...] = opt((1,), "pass@k to report (each <= --n).", min=1)
    temperature: float = opt(0.8, "Sampling temperature.", min=0)
    # the judge measured: the paper's step accuracy, reported by every loop iteration. Its
    # settings mirror `rlany judge`'s (the loop fills them from [judge]): a heading of their
    # own in --help, not research switches (benchmarks/README.md, "Research switches")
    judge: bool = opt(False, "Also judge the eval trajectories: step accuracy against the "
                      "env's step labels, and the last step against the outcome.",
                      panel=JUDGE_PANEL)
    judge_adapter: str | None = opt(None, "Reward-model adapter for the judge (implies "
                                    "--judge).", scope="io", panel=JUDGE_PANEL)
    m: int = opt(3, "Judge samples per step.", min=1, panel=JUDGE_PANEL)
    judge_max_tokens: int = opt(384, "Max new tokens of the judge's reasoning (0: the "
                                "verdict alone).", min=0, panel=JUDGE_PANEL)
    judge_temperature: float = opt(0.8, "The judge's sampling temperature.", min=0,
                                   panel=JUDGE_PANEL)
    history_steps: int = opt(5, "Earlier actions shown to the judge.", min=0,
                             panel=JUDGE_PANEL)
    obs_lines: int = opt(0, "The judge's observation cap (see `rlany judge --help`).", min=0,
                         panel=JUDGE_PANEL)
    judge_mode: str = opt("steps", "The judge's mode (see `rlany judge --help`).",
                          choices=MODES, panel=JUDGE_PANEL)
    verdict: str = opt("constrained", "The judge's verdict decoding (see `rlany judge "
                       "--help`).", choices=VERDICT_MODES, panel=JUDGE_PANEL)
    judge_last_step_only: bool = opt(False, "Judge only each episode's last step: the "
                                     "outcome-labelled one, at a fraction of the cost.",
                                     panel=JUDGE_PANEL)

    def check(self, name) -> None:
        if any(x > self.n for x in self.k):
            raise RlanyError(f"every {name('k')} must be <= {name('n')} {self.n}, got "
                             f"{list(self.k)}")
        # the judge's own rules, spelled with eval's flag names
        flag = {judge_key: eval_key for eval_key, judge_key in JUDGE_FIELDS.items()}
        self._judge_options().check(lambda key: name(flag.get(key, key)))

    def rollout_options(self):
        from rlany.stages.rollout import RolloutOptions

        same = {f.name: getattr(self, f.name) for f in fields(EpisodeFields)}
        return RolloutOptions(input=self.input, **same)

    def judge_options(self):
        if not (self.judge or self.judge_adapter):
            return None
        return self._judge_options()

    def _judge_options(self):
        from rlany.stages.judge import JudgeOptions

        return JudgeOptions(input=self.input, adapter=self.judge_adapter, seed=self.seed,
                            last_step_only=self.judge_last_step_only,
                            **{judge_key: getattr(self, eval_key)
                               for eval_key, judge_key in JUDGE_FIELDS.items()})


def pass_at_k(n: int, c: int, k: int) -> float:
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> list[float] | None:
    """The 95% Wilson score interval of a success rate (sound at small n and at 0 or n
    successes, unlike the normal approximation). Episodes of one task are correlated, so
    for few tasks this is optimistic; it is the noise floor a gain must clear."""
    if n == 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def gain_interval(k1: int, n1: int, k0: int, n0: int) -> list[float] | None:
    """The 95% interval of a difference of success rates p1 - p0 (independent samples;
    Newcombe's hybrid score interval from the two Wilson intervals)."""
    if not n1 or not n0:
        return None
    p1, p0 = k1 / n1, k0 / n0
    (lo1, hi1), (lo0, hi0) = wilson_interval(k1, n1), wilson_interval(k0, n0)
    d = p1 - p0
    return [round(d - sqrt((p1 - lo1) ** 2 + (hi0 - p0) ** 2), 4),
            round(d + sqrt((hi1 - p1) ** 2 + (p0 - lo0) ** 2), 4)]


def policy_metrics(groups: list[list[Trajectory]], ks: list[int]) -> dict:
    flat = [t for g in groups for t in g]
    per_task = []
    for g in groups:
        c = sum(t.outcome == 1 for t in g)
        per_task.append({"task_id": g[0].task_id, "n": len(g), "successes": c,
                         **{f"pass@{k}": pass_at_k(len(g), c, k) for k in ks}})
    return {
        "tasks": len(groups), "trajectories": len(flat),
        "success_rate": fmean(t.outcome == 1 for t in flat) if flat else 0.0,
        "success_ci95": wilson_interval(sum(t.outcome == 1 for t in flat), len(flat)),
        **{f"pass@{k}": fmean(p[f"pass@{k}"] for p in per_task) if per_task else 0.0
           for k in ks},
        "mean_steps": fmean(len(t.steps) for t in flat) if flat else 0.0,
        "on_plan_share": on_plan_share(flat),
        "per_task": per_task,
    }


def on_plan_share(trajectories: list[Trajectory]) -> float | None:
    """The share of the policy's steps that the env labels +1 (`info.label`: e.g. on a
    shortest plan); None for envs without step labels. Progress the outcome can hide."""
    labels = [st.info.get("label") for t in trajectories for st in t.steps]
    labels = [v for v in labels if v in (1, -1)]
    return sum(v == 1 for v in labels) / len(labels) if labels else None


def judge_metrics(trajectories: list[Trajectory], judgments: list[Judgment]) -> dict:
    """The judge against the env's step labels and the outcomes (see the module doc)."""
    last_n = last_ok = unparseable = verdicts = agree = 0
    steps = {1: [0, 0], -1: [0, 0]}  # label -> [verdicts, correct verdicts]
    labelled_steps = {1: 0, -1: 0}
    for traj, j in zip(trajectories, judgments):
        scores = [s.score for step in j.steps for s in step.samples]
        verdicts += len(scores)
        unparseable += sum(s == 0 for s in scores)
        for sj in j.steps:
            label = traj.steps[sj.step].info.get("label") if sj.step < len(traj.steps) else None
            if label in (1, -1) and sj.samples:
                labelled_steps[label] += 1
                steps[label][0] += len(sj.samples)
                steps[label][1] += sum(s.score == label for s in sj.samples)
        if j.steps:
            last = j.steps[-1].samples
            last_n += len(last)
            last_ok += sum(s.score == traj.outcome for s in last)
            mean = fmean(fmean(s.score for s in step.samples) for step in j.steps)
            agree += mean * traj.outcome > 0
    from rlany.stages.judge import balanced_accuracy

    return {
        "judge_step_accuracy": balanced_accuracy(steps),
        "judge_good_step_accuracy": steps[1][1] / steps[1][0] if steps[1][0] else None,
        "judge_bad_step_accuracy": steps[-1][1] / steps[-1][0] if steps[-1][0] else None,
        "judge_good_steps": labelled_steps[1], "judge_bad_steps": labelled_steps[-1],
        "judge_last_step_accuracy": last_ok / last_n if last_n else None,
        "judge_parse_fail_rate": unparseable / verdicts if verdicts else None,
        "judge_outcome_agreement": agree / len(trajectories) if trajectories else None,
        "judge_labelled_verdicts": steps[1][0] + steps[-1][0],
    }


# -- the file driver: `rlany eval` and the loop's eval stage ----------------------------

def run(opts: EvalOptions, engine=None) -> dict:
    """Roll out eval tasks (and optionally judge them); write a summary JSON atomically."""
    from rlany import envs
    from rlany.console import info
    from rlany.outputs import AtomicJsonl, write_meta, write_text_atomic
    from rlany.stageio import GEN_VERSIONS, adapter_checks, begin_generation, engine_flags
    from rlany.stages.judge import judge
    from rlany.stages.rollout import rollout
    from rlany.stages.unit_tests import unit_test_counts

    started = time.time()
    tasks, reader, engine = begin_generation(
        opts, {"--output": opts.output, "--trajectories": opts.trajectories}, engine,
        {"--judge-adapter": opts.judge_adapter})
    ropts, jopts = opts.rollout_options(), opts.judge_options()
    policy = {"model": engine.model, "adapter": opts.adapter}
    groups = list(rollout(tasks, engine, envs.make_env, ropts, policy))
    summary = {"policy": policy, **policy_metrics(groups, list(opts.k))}
    flat = [t for g in groups for t in g]
    if opts.trajectories:
        with AtomicJsonl(opts.trajectories) as out:
            out.write_all(flat)
    if jopts is not None:
        judged_groups = list(judge(flat, engine, jopts,
                                   {"model": engine.model, "adapter": jopts.adapter}))
        judged = [j for g in judged_groups for j in g]
        summary["judge"] = {"model": engine.model, "adapter": jopts.adapter,
                            "mode": jopts.mode, "verdict": jopts.verdict}
        summary.update(judge_metrics(flat, judged))
        if jopts.mode == "unit-tests":
            outcomes = {t.traj_id: t.outcome for t in flat}
            for g in judged_groups:
                for key, value in unit_test_counts(g, outcomes).items():
                    summary[f"judge_{key}"] = summary.get(f"judge_{key}", 0) + value
    summary.update(adapter_checks(engine))
    summary["wall_time_s"] = round(time.time() - started, 3)
    text = json.dumps(summary, indent=2) + "\n"
    if opts.output == "-":
        print(text, end="", flush=True)
    else:
        write_text_atomic(opts.output, text)
    write_meta(opts.output, stage="eval", flags=engine_flags(opts, engine), inputs=[reader],
               counts={k: v for k, v in summary.items() if k != "per_task"}, started=started,
               versions=GEN_VERSIONS)
    acc = summary.get("judge_step_accuracy")
    ci = summary["success_ci95"] or [0.0, 0.0]
    info(f"eval: success {summary['success_rate']:.3f} (95% {ci[0]:.2f}-{ci[1]:.2f}) over "
         f"{summary['trajectories']} "
         f"trajectories of {summary['tasks']} tasks, "
         + ", ".join(f"pass@{k} {summary[f'pass@{k}']:.3f}" for k in opts.k)
         + (f", judge step accuracy {acc:.3f}" if acc is not None else "")
         + f" -> {opts.output} ({summary['wall_time_s']:.1f}s)")
    return summary

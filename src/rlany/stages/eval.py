"""`rlany eval`: a policy on held-out tasks, and the judge against ground truth.

Policy: success rate over the episodes that ran, pass@k per task with the unbiased
estimator 1 - C(n-c, k) / C(n, k) (n samples that ran, c successes), averaged over the tasks
with at least k, and mean steps. An episode the env failed (finish "error") has no outcome:
it counts in `errored` and in no rate, and the judge is measured without it; above
`--max-error-share` errored episodes, or with none that ran, the eval fails in one line
and writes nothing (`rlany.stages.episode_errors`).

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
from statistics import fmean

from rlany.errors import RlanyError
from rlany.options import opt
from rlany.prompts import VERDICT_MODES
from rlany.records import MODES, Judgment, Trajectory
from rlany.stages.episode_errors import ErrorBudget, errored, watched
from rlany.stages.rollout import EpisodeFields
from rlany.stats import pass_at_k, wilson_interval

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
    # own in --help, not research switches (research/README.md, "Research switches")
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


def policy_metrics(groups: list[list[Trajectory]], ks: list[int]) -> dict:
    """The policy's numbers over the episodes that ran; `trajectories` is their count (the
    rates' denominator) and `errored` the count of the others."""
    ran = [[t for t in g if not errored(t)] for g in groups]
    flat = [t for g in ran for t in g]
    per_task = []
    for g, r in zip(groups, ran):
        c = sum(t.outcome == 1 for t in r)
        per_task.append({"task_id": g[0].task_id, "n": len(r), "successes": c,
                         "errored": len(g) - len(r),
                         **{f"pass@{k}": pass_at_k(len(r), c, k) if len(r) >= k else None
                            for k in ks}})
    passes = {k: [p[f"pass@{k}"] for p in per_task if p[f"pass@{k}"] is not None] for k in ks}
    return {
        "tasks": len(groups), "trajectories": len(flat),
        "errored": sum(len(g) for g in groups) - len(flat),
        "success_rate": fmean(t.outcome == 1 for t in flat) if flat else 0.0,
        "success_ci95": wilson_interval(sum(t.outcome == 1 for t in flat), len(flat)),
        **{f"pass@{k}": fmean(passes[k]) if passes[k] else None for k in ks},
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
    from rlany.stats import balanced_accuracy

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
    # too many errored episodes (or none that ran) fail here, before anything is written
    budget = ErrorBudget(opts.max_error_share, expected=len(tasks) * opts.n,
                         first_batch=min(opts.batch_tasks, len(tasks)),
                         env_of={t.task_id: t.env for t in tasks})
    groups = list(watched(rollout(tasks, engine, envs.make_env, ropts, policy), budget))
    summary = {"policy": policy, **policy_metrics(groups, list(opts.k))}
    flat = [t for g in groups for t in g]
    if opts.trajectories:  # every episode, the errored ones as they ended
        with AtomicJsonl(opts.trajectories) as out:
            out.write_all(flat)
    if jopts is not None:
        ran = [t for t in flat if not errored(t)]  # an errored outcome is no label
        judged_groups = list(judge(ran, engine, jopts,
                                   {"model": engine.model, "adapter": jopts.adapter}))
        judged = [j for g in judged_groups for j in g]
        summary["judge"] = {"model": engine.model, "adapter": jopts.adapter,
                            "mode": jopts.mode, "verdict": jopts.verdict}
        summary.update(judge_metrics(ran, judged))
        if jopts.mode == "unit-tests":
            outcomes = {t.traj_id: t.outcome for t in ran}
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
    errors = summary["errored"]
    info(f"eval: success {summary['success_rate']:.3f} (95% {ci[0]:.2f}-{ci[1]:.2f}) over "
         f"{summary['trajectories']} "
         f"trajectories of {summary['tasks']} tasks"
         + (f" ({errors} more errored, not counted), " if errors else ", ")
         + ", ".join(f"pass@{k} " + ("-" if summary[f"pass@{k}"] is None else
                                     f"{summary[f'pass@{k}']:.3f}") for k in opts.k)
         + (f", judge step accuracy {acc:.3f}" if acc is not None else "")
         + f" -> {opts.output} ({summary['wall_time_s']:.1f}s)")
    return summary

"""`rlany eval`: a policy on held-out tasks, and the judge against ground truth.

Policy: success rate over the episodes that ran, pass@k per task with the unbiased
estimator 1 - C(n-c, k) / C(n, k) (n samples that ran, c successes), averaged over the tasks
with at least k, and mean steps; where the env gives rewards (`info.reward`, e.g. openenv),
`mean_return` (the env's return per episode, `rlany.stages.env_reward`; None without).
An episode the env failed (finish "error": the env's own failure, never the policy's text)
has no outcome: in `errored`, in no rate, the judge measured without it; above
`--max-error-share` errored episodes, or with none that ran, the eval fails in one line and
writes nothing (`rlany.stages.episode_errors`).

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

Every number is a ratio of counts (`sums`) or a mean of task rows, so `--shard I/N` runs
(`rlany.shards`) join exactly: `--join` adds their counts and joins their rows in shard
order (`eval_summary.summary_of` for both). The judge is given one rollout batch at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from statistics import fmean

from rlany import limits
from rlany.errors import RlanyError, UsageError
from rlany.files.records import MODES, Judgment, Trajectory
from rlany.options import opt
from rlany.prompts import VERDICT_MODES
from rlany.shards import shard_opt
from rlany.stages.env_reward import return_row
from rlany.stages.episode_errors import ErrorBudget, errored, watched
from rlany.stages.eval_summary import (
    judge_summary,
    policy_summary,
    summary_of,
    write_summary,
)
from rlany.stages.rollout import EpisodeFields
from rlany.stats import pass_at_k

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
    shard: str | None = shard_opt(
        "whole batches of --batch-tasks tasks, contiguous", "Its --trajectories concatenate "
        "like rollout's; its summary also holds the counts (`sums`) that --join adds up.")
    join: str | None = opt(None, "Join eval shards instead of evaluating: a file of the N "
                           "shards' summaries concatenated (cat eval.*.json); - for stdin. "
                           "Writes the unsharded run's summary from their counts and runs no "
                           "model, so only -o goes with it.", scope="io")
    n: int = opt(4, "Episodes per task.", min=1, max=limits.MAX_SAMPLES)
    k: tuple[int, ...] = opt((1,), "pass@k to report (each <= --n).", min=1)
    temperature: float = opt(0.8, "Sampling temperature.", min=0)
    # the judge measured: the paper's step accuracy, reported by every loop iteration. Its
    # settings mirror `rlany judge`'s (the loop fills them from [judge]): a heading of their
    # own in --help
    judge: bool = opt(False, "Also judge the eval trajectories: step accuracy against the "
                      "env's step labels, and the last step against the outcome.",
                      panel=JUDGE_PANEL)
    judge_adapter: str | None = opt(None, "Reward-model adapter for the judge (implies "
                                    "--judge).", scope="io", panel=JUDGE_PANEL)
    m: int = opt(3, "Judge samples per step.", min=1, max=limits.MAX_SAMPLES,
                 panel=JUDGE_PANEL)
    judge_max_tokens: int = opt(384, "Max new tokens of the judge's reasoning (0: the "
                                "verdict alone).", min=0, max=limits.MAX_TOKENS,
                                panel=JUDGE_PANEL)
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
    return policy_summary(*policy_sums(groups, ks), ks)


def policy_sums(groups: list[list[Trajectory]], ks: list[int]) -> tuple[list[dict], dict]:
    """Each task's row (n, successes, errored, pass@k) and the counts every rate is a ratio
    of: what `--join` adds up across shards."""
    ran = [[t for t in g if not errored(t)] for g in groups]
    flat = [t for g in ran for t in g]
    per_task = []
    for g, r in zip(groups, ran):
        c = sum(t.outcome == 1 for t in r)
        per_task.append({"task_id": g[0].task_id, "n": len(r), "successes": c,
                         "errored": len(g) - len(r),
                         **{f"pass@{k}": pass_at_k(len(r), c, k) if len(r) >= k else None
                            for k in ks}, **return_row(r)})
    labels = [v for t in flat for st in t.steps if (v := st.info.get("label")) in (1, -1)]
    return per_task, {"trajectories": len(flat), "errored": sum(map(len, groups)) - len(flat),
                      "successes": sum(t.outcome == 1 for t in flat),
                      "steps": sum(len(t.steps) for t in flat),
                      "on_plan_steps": labels.count(1), "labelled_steps": len(labels)}


def on_plan_share(trajectories: list[Trajectory]) -> float | None:
    """The share of the policy's steps that the env labels +1 (`info.label`: e.g. on a
    shortest plan); None for envs without step labels. Progress the outcome can hide."""
    labels = [st.info.get("label") for t in trajectories for st in t.steps]
    labels = [v for v in labels if v in (1, -1)]
    return sum(v == 1 for v in labels) / len(labels) if labels else None


def judge_metrics(trajectories: list[Trajectory], judgments: list[Judgment]) -> dict:
    """The judge against the env's step labels and the outcomes (see the module doc)."""
    return judge_summary(judge_sums(trajectories, judgments))


def judge_sums(trajectories: list[Trajectory], judgments: list[Judgment]) -> dict:
    """The counts the judge metrics are ratios of (verdicts, and steps, by label)."""
    s = dict.fromkeys(("verdicts", "unparseable", "good_steps", "good_verdicts",
                       "good_correct", "bad_steps", "bad_verdicts", "bad_correct",
                       "last_verdicts", "last_correct", "agree"), 0)
    for traj, j in zip(trajectories, judgments):
        scores = [x.score for step in j.steps for x in step.samples]
        s["verdicts"] += len(scores)
        s["unparseable"] += sum(x == 0 for x in scores)
        for sj in j.steps:
            label = traj.steps[sj.step].info.get("label") if sj.step < len(traj.steps) else None
            if label in (1, -1) and sj.samples:
                kind = "good" if label == 1 else "bad"
                s[f"{kind}_steps"] += 1
                s[f"{kind}_verdicts"] += len(sj.samples)
                s[f"{kind}_correct"] += sum(x.score == label for x in sj.samples)
        if j.steps:
            last = j.steps[-1].samples
            s["last_verdicts"] += len(last)
            s["last_correct"] += sum(x.score == traj.outcome for x in last)
            mean = fmean(fmean(x.score for x in step.samples) for step in j.steps)
            s["agree"] += mean * traj.outcome > 0
    return {**s, "judged": len(trajectories)}


# -- the file driver: `rlany eval` and the loop's eval stage ----------------------------

def run(opts: EvalOptions, engine=None) -> dict:
    """Roll out eval tasks (and optionally judge them); write a summary JSON atomically.
    With `--join`: the summary of eval shards instead (`join`)."""
    from rlany import envs, shards
    from rlany.files.outputs import AtomicJsonl
    from rlany.stage_engine import adapter_checks, begin_generation, engine_flags
    from rlany.stages.rollout import rollout

    if opts.join is not None:
        from rlany.stages.eval_join import join

        given = [f.name for f in fields(opts) if f.name not in ("join", "output")
                 and getattr(opts, f.name) != f.default]
        if given:
            from rlany.options import flag
            raise UsageError(f"--join adds up the shards' counts: it runs no model and reads "
                             f"no tasks, so {flag(given[0])} does not go with it; give only "
                             "--join and -o")
        return join(opts.join, opts.output)
    started = time.time()
    shard = shards.parse(opts.shard)
    def pick(tasks: list) -> tuple:  # this shard's tasks, their episodes within the limits
        chosen, in_shard = shards.take(tasks, opts.batch_tasks, shard, stage="eval",
                                       batch_flag="--batch-tasks")
        limits.check_episodes(opts.n, len(chosen), opts.batch_tasks, "eval")
        return chosen, in_shard
    (tasks, in_shard), reader, engine = begin_generation(
        opts, {"--output": opts.output, "--trajectories": opts.trajectories}, engine,
        {"--judge-adapter": opts.judge_adapter}, pick=pick, stage="eval")
    ropts, jopts = opts.rollout_options(), opts.judge_options()
    policy = {"model": engine.model, "adapter": opts.adapter}
    # too many errored episodes (or none that ran) fail here, before anything is written
    budget = ErrorBudget(opts.max_error_share, expected=len(tasks) * opts.n,
                         first_batch=min(opts.batch_tasks, len(tasks)),
                         env_of={t.task_id: t.env for t in tasks})
    mark = engine.stats.mark()
    groups = list(watched(rollout(tasks, engine, envs.make_env, ropts, policy), budget))
    if opts.trajectories:  # every episode, the errored ones as they ended
        with AtomicJsonl(opts.trajectories) as out:
            out.write_all(t for g in groups for t in g)
    per_task, policy_counts = policy_sums(groups, list(opts.k))
    sums, judge_info = {"policy": policy_counts}, None
    if jopts is not None:
        judge_info = {"model": engine.model, "adapter": jopts.adapter, "mode": jopts.mode,
                      "verdict": jopts.verdict}
        sums.update(_judge_sums(groups, engine, opts.batch_tasks, jopts))
    summary = summary_of(policy, per_task, sums, list(opts.k), judge_info)
    summary.update(adapter_checks(engine), **engine.stats.since(mark))
    summary["wall_time_s"] = round(time.time() - started, 3)
    flags = engine_flags(opts, engine)
    if shard:  # what `--join` needs: which shard of what, and the counts to add up
        summary["shard"] = {**in_shard["shard"], "input": {"path": reader.name,
                                                           "sha256": reader.sha256},
                            "flags": shards.shard_flags(flags), "base_url": flags.get(
                                "base_url"), "sha256": shards.digest(summary["per_task"], sums)}
        summary["sums"] = sums
    write_summary(summary, opts.output, list(opts.k), flags=flags, inputs=[reader], started=started,
           counts=in_shard)
    return summary


def _judge_sums(groups: list[list[Trajectory]], engine, batch_tasks: int, jopts) -> dict:
    """The judge's counts over the episodes that ran (an errored outcome is no label),
    judged one rollout batch at a time: a shard's batches are the unsharded run's, so its
    judge is given the same batches too."""
    from rlany.stages.judge import judge
    from rlany.stages.unit_tests import unit_test_counts

    ran: list[Trajectory] = []
    judged: list[list[Judgment]] = []
    for k in range(0, len(groups), batch_tasks):
        batch = [t for g in groups[k:k + batch_tasks] for t in g if not errored(t)]
        ran += batch
        judged += judge(batch, engine, jopts, {"model": engine.model, "adapter": jopts.adapter})
    sums: dict = {"judge": judge_sums(ran, [j for g in judged for j in g])}
    if jopts.mode == "unit-tests":
        outcomes, tests = {t.traj_id: t.outcome for t in ran}, {}
        for g in judged:
            for key, value in unit_test_counts(g, outcomes).items():
                tests[key] = tests.get(key, 0) + value
        sums["unit_tests"] = tests
    return sums

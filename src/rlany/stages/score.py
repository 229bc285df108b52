"""`rlany score`: integrated policy rewards and consistency rewards for the reward model.

Notation follows the paper (arXiv 2602.02488). For one task q with n trajectories τ_1..τ_n,
trajectory i has outcome O_i ∈ {-1, +1} and steps t = 0..T_i-1; the judge gave each step m
verdicts S_itj ∈ {-1, 0, +1} (0 = unparseable). O_i and S̄_it may come from the env instead
(`--outcome return | final-reward`, `--step-scores label | env-reward`: rlany.stages.env_reward);
acc(q) stays the share of successes, and a task is "uniform" when its O_i are all equal.

Policy (integrated feedback):
    S̄_it = mean_j S_itj                      (all m samples; an unparseable 0 abstains)
    R_it = O_i + λ · S̄_it                    (λ = 1; --lam 0 is the outcome alone)
    A_it = (R_it - mean_{i'∈I_t} R_i't) / std_{i'∈I_t} R_i't
           where I_t = trajectories of q that reach step t (population std).
    A step index reached by one trajectory has no group to compare with: `--lone-step raw`
    keeps A = R (the reference implementation's choice), `--lone-step zero` drops it.
    A zero std gives A = 0. Steps with A = 0 are not kept for training.

Reward model (consistency feedback):
    r_itj = R_it · S_itj, or `--unparseable-penalty` (-2) when S_itj = 0
    a_itj = standardized r within the m samples of step (i, t)
    A step whose m verdicts all agree teaches nothing and is not kept; only tasks with
    rm_acc_min <= acc(q) <= rm_acc_max (0.2, 0.8) give reward-model data.
    Every judged step of such a task also carries `rm_target`: what `train-rm
    --objective expected | logloss` (rlany.training.verdict) trains the verdict toward exactly,
    one sample per step, agreeing verdicts or not. It is O_i (`--rm-target outcome`, the
    default): the sign of R_it wherever the sampled estimator trains (verdicts that
    differ, so |S̄_it| < 1 and, with λ <= 1, sign R_it = O_i). R_it itself
    (`--rm-target integrated`) holds the judge's own verdicts: a judge that says +1 on
    every step gets R = O + 1 = 0 on a failure, so it is never corrected, and it
    collapsed to +1 in one iteration that way (docs/stages/score.md, `--rm-target`).
    `--rm-target label` (supervised, not the paper's label-free method) puts the env's step
    label L_it ∈ {-1, +1} (`info["label"]`) in place of R_it: a supervised judge
    (docs/stages/loop.md's warm start), or on the loop's steps a bound on what
    consistency feedback could teach the judge.

Reward model in unit-tests mode (coding; judgments with mode "unit-tests"): the m samples
are tests T_1..T_m written once for the task, and S_ij = +1 when program i passes T_j.
A test is rewarded for separating correct programs (C = {i: O_i = +1}) from incorrect ones
(W = {i: O_i = -1}):
    r_j = mean_{i∈C} [S_ij = +1] - mean_{i∈W} [S_ij = +1]   ∈ [-1, 1]
          (an empty C or W contributes 0), or the penalty when T_j was unparseable
    a_j = standardized r within the m tests
A right test that every program passes gets 0; a wrong test (correct programs fail it) is
negative. Each test is one training sample, attached to the task's first trajectory (the
others carry the same rewards with keep = false, so nothing is trained twice).

Task filter for the policy (`--uniform-tasks`): a task whose n rollouts all succeed or all
fail carries no outcome contrast. `separated` (default) keeps it only if step rewards still
separate its trajectories at some shared step index; `drop` always drops it; `keep` never does.

Step credit (`--step-credit`): the A_it above is `step-index`, the paper's; `gigpo` gives
each step GiGPO's A = A^E + w·A^S instead, its episode's return normalized over the task's
trajectories plus its discounted return normalized among the steps that met the same
state, with S̄ in the step rewards (rlany.stages.gigpo). The reward model's side is the same.

Errored episodes (finish "error": the env raised, so O_i = -1 is no outcome) take no part:
not in n or acc(q), not in any I_t, not trained by either learner (`rlany.stages.episode_errors`).

Streaming: trajectories are read one task group at a time (a group is the consecutive
records with one task_id); judgments are read in lockstep and must be in trajectory order,
which is how `rlany judge` writes them. Memory is bounded by the largest group.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from rlany.errors import RlanyError
from rlany.files.records import (
    Judgment,
    Scored,
    ScoredJudgeSample,
    ScoredStep,
    TaskStats,
    Trajectory,
)
from rlany.options import opt
from rlany.stages.advantages import Credit, standardize, step_index_advantages
from rlany.stages.env_reward import OUTCOMES, STEP_SCORES, labels, outcomes
from rlany.stages.env_reward import step_scores as env_step_scores
from rlany.stages.episode_errors import errored
from rlany.stages.gigpo import AnchorCounts, StepCreditFields, gigpo_credit
from rlany.stages.judge_stats import judge_stats
from rlany.stages.pairing import group_origin, groups, paired
from rlany.stages.task_filter import policy_filter, rm_filter
from rlany.stages.unit_tests import unit_test_rewards


@dataclass(frozen=True, kw_only=True)
class ScoreOptions(StepCreditFields):
    input: str = opt("-", "trajectories.jsonl; - for stdin (the default).", scope="io", short="-i")
    output: str = opt("scored.jsonl", "scored.jsonl; - for stdout.", scope="io", short="-o")
    judgments: str | None = opt(None, "judgments.jsonl from `rlany judge`, in trajectory order. "
                                "Without it there are no step scores (outcome only) and no "
                                "reward-model data.", scope="io", short="-j")
    stats: str | None = opt(None, "Per-task accuracy file. Default: task_stats.jsonl beside "
                            "--output (none when --output is -).", scope="io")
    lam: float = opt(1.0, "lambda in R = O + lambda * mean(S); 0 = outcome only.", min=0)
    lone_step: str = opt("raw", "A step index reached by only one trajectory: keep its raw R "
                         "as the advantage (reference behaviour) or drop it (zero). Under "
                         "--step-credit gigpo: a task with one trajectory that ran (its "
                         "episode advantage is its return, or 0).", choices=("raw", "zero"))
    uniform_tasks: str = opt("separated", "Tasks whose rollouts all succeed or all fail: keep "
                             "for the policy only if step rewards separate them (separated), "
                             "never (drop) or always (keep).",
                             choices=("separated", "drop", "keep"))
    candidates: str = opt("trial", "Rollouts of candidate tasks (adapt-tasks' rewrites on "
                          "trial): trial, no training until accepted (the paper); train, "
                          "trained like the pool's (not in the paper: on-policy data that "
                          "decides acceptance, used at once).", choices=("trial", "train"))
    unparseable_penalty: float = opt(-2.0, "Consistency reward of an unparseable judge sample.")
    rm_acc_min: float = opt(0.2, "Reward-model data only from tasks with accuracy >= this.",
                            min=0, max=1)
    rm_acc_max: float = opt(0.8, "Reward-model data only from tasks with accuracy <= this.",
                            min=0, max=1)
    rm_target: str = opt("outcome", "What a judge verdict must agree with under train-rm's "
                         "exact objectives (rm_target): the trajectory's outcome O (outcome, "
                         "label-free), R itself (integrated) or the env's step label (label, "
                         "supervised; a step without one is an error). The sampled "
                         "estimator's R * S uses R unless label. Why each, and how "
                         "integrated collapses: docs/stages/score.md.",
                         choices=("outcome", "integrated", "label"))
    step_scores: str = opt("judge", "Where S comes from in R = O + lambda * mean(S): the judge's "
                           "verdicts (judge, the paper), the env's own step labels (label: "
                           "the upper bound of step feedback, no judge needed; envs with step "
                           "labels, e.g. household) or the env's step rewards (env-reward: "
                           "info.reward, e.g. openenv; null = 0).", choices=STEP_SCORES)
    outcome: str = opt("success", "Where O comes from in R = O + lambda * mean(S): +1/-1 from "
                       "the episode's success (success, the paper), the sum of the env's step "
                       "rewards (return) or the last step's reward (final-reward), read from "
                       "info.reward (e.g. openenv; null = 0). A trajectory without env "
                       "rewards is refused. Success rates and acc(q) stay success-based.",
                       choices=OUTCOMES)

    def check(self, name) -> None:
        self.check_step_credit(name)
        if self.rm_acc_min > self.rm_acc_max:
            raise RlanyError(f"need {name('rm_acc_min')} <= {name('rm_acc_max')}, got "
                             f"{self.rm_acc_min} > {self.rm_acc_max}")

    @property
    def stats_path(self) -> str | None:
        if self.stats is None and self.output != "-":
            return str(Path(self.output).with_name("task_stats.jsonl"))
        return self.stats


Located = tuple[str, object]  # ("path:line", record)


def score_stream(trajectories: Iterable[tuple[str, Trajectory]],
                 judgments: Iterable[tuple[str, Judgment]] | None,
                 opts: ScoreOptions) -> Iterator[tuple[list[Scored], TaskStats]]:
    """Yield (scored trajectories, task stats) for each task group, in input order."""
    for group in groups(paired(trajectories, judgments)):
        yield score_group(group, opts)


def score_group(group: list[tuple[str, Trajectory, Judgment | None]],
                opts: ScoreOptions) -> tuple[list[Scored], TaskStats]:
    trajs = [t for _, t, _ in group]
    judgments = [j for _, _, j in group]
    # an errored episode (finish "error": the env raised) has no outcome: it is in no acc,
    # no standardization group and no training sample (rlany.stages.episode_errors)
    ran = [not errored(t) for t in trajs]
    n = sum(ran)
    successes = sum(t.outcome == 1 for t, ok in zip(trajs, ran) if ok)
    acc = successes / n if n else 0.0

    # R_it = O_i + λ · S̄_it: O from success or the env's rewards, S̄ the judge's mean
    # verdict, the env's label or the env's step reward (--outcome, --step-scores)
    outcome = outcomes(group, opts.outcome)
    step_scores = _step_scores(group, opts)
    rewards = [[o + opts.lam * s for s in scores] for o, scores in zip(outcome, step_scores)]
    credit = _policy_credit(group, ran, rewards, step_scores, opts)  # A_it (--step-credit)
    advantages = credit.advantages

    candidate = any(t.extra.get("candidate") for t in trajs) and opts.candidates == "trial"
    uniform = len({o for o, ok in zip(outcome, ran) if ok}) == 1  # all succeed / all fail
    policy_keep, policy_reason = policy_filter(candidate, n, uniform, credit.separated,
                                               opts.uniform_tasks)
    rm_keep, rm_reason = rm_filter(candidate, n, acc, opts.rm_acc_min, opts.rm_acc_max)

    tests = unit_test_rewards([(w, tr, j if ok else None) for (w, tr, j), ok in zip(group, ran)],
                              rm_keep, opts.unparseable_penalty)
    # the sampled estimator's consistency reward R_it · S_itj, and the exact objectives'
    # verdict target (the scored step's rm_target): O_i, R_it or the env label L_it
    targets = (labels(group, "--rm-target label")
               if opts.rm_target == "label" and tests is None else rewards)
    verdict_targets = (targets if opts.rm_target != "outcome" else
                       [[o] * len(tr.steps) for o, tr in zip(outcome, trajs)])
    scored: list[Scored] = []
    policy_samples = rm_samples = 0
    for i, (tr, judgment) in enumerate(zip(trajs, judgments)):
        steps = []
        for t, step in enumerate(tr.steps):
            keep = policy_keep and advantages[i][t] != 0.0  # an errored one's is 0
            policy_samples += keep
            if tests is not None:
                judge = tests(i)
            else:
                judge = _consistency(judgment, t, targets[i][t], rm_keep and ran[i], opts)
            rm_samples += sum(s.keep for s in judge)
            judged = (tests is None and rm_keep and ran[i] and judgment is not None
                      and judgment.skipped is None and t < len(judgment.steps))
            steps.append(ScoredStep(
                step=t, prompt_messages=step.prompt_messages, response=step.response,
                step_score=step_scores[i][t], reward=rewards[i][t], advantage=advantages[i][t],
                keep=keep, judge=judge, truncated=bool(step.info.get("truncated", False)),
                token_ids=step.token_ids, logprobs=step.logprobs,
                gigpo=credit.steps[i][t] if credit.steps else None,
                judge_messages=judgment.steps[t].judge_messages
                if judgment and judgment.steps else None,
                rm_target=verdict_targets[i][t] if judged else None))
        scored.append(Scored(traj_id=tr.traj_id, task_id=tr.task_id, iteration=tr.iteration,
                             sample=tr.sample, outcome=tr.outcome, task_acc=acc, steps=steps,
                             policy=tr.policy, extra=tr.extra if opts.outcome == "success"
                             else {**tr.extra, "env_outcome": outcome[i]}))

    # n, acc and the judge's fields over the episodes that ran; when none did, n counts
    # the errored ones (n >= 1 is the record's rule) and `ran: 0` says so
    idx = [k for k, ok in enumerate(ran) if ok]
    stats = TaskStats(
        task_id=trajs[0].task_id, n=n or len(trajs), successes=successes, acc=acc,
        mean_steps=statistics.fmean(len(trajs[k].steps) for k in idx or range(len(trajs))),
        policy_keep=policy_keep, policy_reason=policy_reason, rm_keep=rm_keep,
        rm_reason=rm_reason, policy_samples=policy_samples, rm_samples=rm_samples,
        **judge_stats([trajs[k] for k in idx], [judgments[k] for k in idx],
                      [step_scores[k] for k in idx]),
        extra={**group_origin(trajs), **credit.stats,
               **({"errored": len(trajs) - n, "ran": n} if n < len(trajs) else {}),
               **({"env_outcome_mean": statistics.fmean(outcome[k] for k in idx)}
                  if opts.outcome != "success" and idx else {})})
    return scored, stats


def _policy_credit(group: list[tuple[str, Trajectory, Judgment | None]], ran: list[bool],
                   rewards: list[list[float]], step_scores: list[list[float]],
                   opts: ScoreOptions) -> Credit:
    """A_it under `--step-credit`: R standardized at each step index, or GiGPO's."""
    if opts.step_credit == "gigpo":
        return gigpo_credit(group, ran, step_scores, opts)
    return step_index_advantages(rewards, ran, opts.lone_step)


def _step_scores(group: list[tuple[str, Trajectory, Judgment | None]], opts: ScoreOptions
                 ) -> list[list[float]]:
    """S̄_it of each step: the mean verdict, or the env's label or step reward."""
    return env_step_scores(group, opts.step_scores, _mean_score)


def _mean_score(judgment: Judgment | None, t: int) -> float:
    if judgment is None or judgment.skipped is not None:
        return 0.0
    samples = judgment.steps[t].samples
    return sum(s.score for s in samples) / len(samples)


def _consistency(judgment: Judgment | None, t: int, reward: float, rm_keep: bool,
                 opts: ScoreOptions) -> list[ScoredJudgeSample]:
    """r_itj = R_it · S_itj (penalty if unparseable), standardized within the m samples."""
    if judgment is None or judgment.skipped is not None:
        return []
    samples = judgment.steps[t].samples
    r = [reward * s.score if s.score != 0 else opts.unparseable_penalty for s in samples]
    a = standardize(r)
    agree = len({s.score for s in samples}) == 1
    return [ScoredJudgeSample(text=s.text, score=s.score, reward=ri, advantage=ai,
                              keep=rm_keep and not agree and ai != 0.0,
                              token_ids=s.token_ids, finish_reason=s.finish_reason)
            for s, ri, ai in zip(samples, r, a)]


# -- the file driver: `rlany score` and the loop's score stage --------------------------

def run(opts: ScoreOptions, engine: object = None) -> dict:
    """Stream trajectories (+ judgments) one task group at a time; write scored + stats."""
    from rlany.console import info
    from rlany.files.jsonl import JsonlReader
    from rlany.files.outputs import atomic_outputs, write_meta
    from rlany.files.provenance import check_judged
    from rlany.stageio import prepare_paths

    started = time.time()
    stats = opts.stats_path
    paths = prepare_paths({"--input": opts.input, "--judgments": opts.judgments},
                          {"--output": opts.output, "--stats": stats})
    if opts.judgments:  # judgments of another rollout are refused before anything is read
        check_judged(paths["--input"], paths["--judgments"], (opts.input, opts.judgments))
    # without --judgments the input may be `judge -o -`'s stream: each task's trajectories,
    # then their judgments (a plain trajectories file is that stream with no judgments)
    traj_reader = JsonlReader(paths["--input"], Trajectory if opts.judgments else
                              {"trajectories": Trajectory, "judgments": Judgment},
                              "trajectories", name=opts.input)
    judge_reader = (JsonlReader(paths["--judgments"], Judgment, "judgments",
                                name=opts.judgments) if opts.judgments else None)
    counts = {"tasks": 0, "pool_tasks": 0, "candidate_tasks": 0, "trajectories": 0,
              "errored": 0, "policy_samples": 0, "rm_samples": 0}
    acc_sum = agree_sum = env_sum = 0.0
    agree_n = 0
    anchors = AnchorCounts()  # --step-credit gigpo: the pool's anchor groups
    counts["lam"] = opts.lam
    with atomic_outputs(opts.output, stats) as (out, st):  # both files, or neither
        for scored, task_stats in score_stream(traj_reader, judge_reader, opts):
            out.write_all(scored)
            if st:
                st.write(task_stats)
            counts["tasks"] += 1
            counts["trajectories"] += len(scored)
            counts["policy_samples"] += task_stats.policy_samples
            counts["rm_samples"] += task_stats.rm_samples
            counts["errored"] += task_stats.extra.get("errored", 0)
            if scored and scored[0].extra.get("candidate"):
                counts["candidate_tasks"] += 1
                continue  # train_acc is the pool's accuracy; candidates are still on trial
            if task_stats.extra.get("ran") == 0:
                continue  # no episode ran: the task has no accuracy to average
            counts["pool_tasks"] += 1
            anchors.add(task_stats.extra)
            acc_sum += task_stats.acc
            env_sum += task_stats.extra.get("env_outcome_mean", 0.0)
            if task_stats.judge_outcome_agreement is not None:
                agree_sum += task_stats.judge_outcome_agreement
                agree_n += 1
    counts["mean_acc"] = acc_sum / max(counts["pool_tasks"], 1)
    counts["judge_outcome_agreement"] = agree_sum / agree_n if agree_n else None
    if opts.step_credit == "gigpo":
        counts.update(anchors.counts())
    if opts.outcome != "success":  # the pool's mean O, as mean_acc is its share of successes
        counts["env_outcome"] = {"source": opts.outcome,
                                 "mean": env_sum / max(counts["pool_tasks"], 1)}
    inputs = [traj_reader] + ([judge_reader] if judge_reader else [])
    flags = {**asdict(opts), "stats": stats}
    for path in (opts.output, stats):
        if path:
            write_meta(path, stage="score", flags=flags, inputs=inputs, counts=counts,
                       started=started)
    info(f"score: {counts['trajectories']} trajectories in {counts['tasks']} tasks "
         f"({counts['candidate_tasks']} candidates), pool acc {counts['mean_acc']:.3f}, "
         + (f"{counts['errored']} errored (in no acc, not trained on), "
            if counts["errored"] else "") +
         f"{counts['policy_samples']} policy samples, {counts['rm_samples']} reward-model "
         f"samples{_tail(counts)} -> {opts.output} ({time.time() - started:.1f}s)")
    return counts


def _tail(counts: dict) -> str:
    env = counts.get("env_outcome")
    tail = f", mean outcome {env['mean']:.4g} (env {env['source']})" if env else ""
    if counts.get("anchor_shared_share") is not None:  # --step-credit gigpo
        tail += (f", {counts['anchor_shared_share']:.0%} of steps share their anchor state "
                 f"(mean group size {counts['anchor_group_mean']:.2f})")
    return tail

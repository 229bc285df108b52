"""The env's own expert instead of a model; no model is loaded, nothing carries token ids.

* `rollout --expert`: the expert answers, in exactly the prompts the same flags give the
  policy (demonstrations for `rlany sft`); with `--expert-p P` each action is the expert's
  with probability P, else a uniformly random admissible one (labelled data);
* `judge --labels`: each judged step's m verdicts are the env's label of that step
  (`steps[t].info.label`), reward-model data for a judge warm start."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlany.engines.base import Completion, Result, stable_seed
from rlany.errors import RlanyError, UsageError
from rlany.files.records import Task, Trajectory


def check_expert(opts: Any, engine: Any) -> None:
    """The flags `--expert` and `--expert-p` go with (usage errors); `engine`: the loop's."""
    if opts.expert and (engine is not None or opts.adapter):
        raise UsageError("--expert plays the env's expert: no model, so no --adapter")
    if opts.expert_p is not None and not opts.expert:
        raise UsageError("--expert-p mixes the expert with random actions: it needs --expert")
    if opts.expert and opts.expert_p is None and opts.n != 1:
        raise UsageError(f"--expert plays one deterministic plan per task: --n {opts.n} would "
                         "repeat it; use --n 1 (or --expert-p to mix in random actions)")


def has_expert(task: Task, mixed: bool = False) -> None:
    """`--expert`: every task's env must have one, and with `--expert-p` list its actions
    (checked at read, with the line)."""
    from rlany import envs

    env = envs.make_env(task.env)
    if not isinstance(env, envs.HasExpert):
        raise RlanyError(f"environment '{task.env}' has no expert (no expert_action() "
                         "method), so --expert cannot be used with it")
    if mixed and not isinstance(env, envs.ListsActions):
        raise RlanyError(f"environment '{task.env}' does not list its actions (no choices() "
                         "method), so --expert-p has no random actions to mix in")


def expert_result(group: list, opts: Any, turn: int, actions: tuple[str, ...]) -> Result:
    """The env's expert action for each episode of a group (rollout's episodes in one
    state): the same plan for all, or with `expert_p` each episode's own draw between the
    expert's action and a random one of `actions`, seeded by (seed, task, iteration, turn,
    sample)."""
    import random

    expert = group[0].env.expert_action() or ""  # no plan from here: empty, rejected
    texts = [expert] * len(group)
    if opts.expert_p is not None:
        texts = []
        for e in group:
            rng = random.Random(stable_seed(opts.seed, e.task.task_id, opts.iteration, turn,
                                            e.sample, "expert_p"))
            texts.append(expert if expert and rng.random() < opts.expert_p
                         else rng.choice(actions))
    return Result(prompt_token_ids=[], completions=[
        Completion(text=t, token_ids=[], finish_reason="stop") for t in texts])


def check_labels(traj: Trajectory, where: str) -> None:
    """`--labels`: every step carries the env's label, +1 or -1 (checked at read)."""
    for k, step in enumerate(traj.steps):
        if step.info.get("label") not in (1, -1):
            raise RlanyError(f"step {k} of '{traj.traj_id}' has no env label (info.label "
                             "+1/-1), so --labels has no verdict for it", where=where)


def label_verdicts(batch: list[list[Trajectory]], prompts: dict, m: int) -> Iterator[Result]:
    """One result per judged step (the order of `prompts`, judge's {traj_id: [(step,
    prompt)]}): m copies of the verdict that is the step's label."""
    from rlany.prompts import VERDICT_CHOICES

    steps = {t.traj_id: t.steps for g in batch for t in g}
    for tid, judged in prompts.items():
        for k, _ in judged:
            text = VERDICT_CHOICES[(1, -1).index(steps[tid][k].info["label"])]
            yield Result(prompt_token_ids=[], completions=[
                Completion(text=text, token_ids=[], finish_reason="stop") for _ in range(m)])

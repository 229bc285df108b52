"""`rlany rollout`: tasks -> trajectories, n episodes per task, all live episodes stepped together.

For a batch of tasks, n episodes per task start from `env.reset(task)`. Each turn makes ONE
batched `engine.generate` call for every live episode of the batch: episodes of one task
whose chat history is identical (all n at the first turn) become one request with `n`
samples, so they share the prompt's KV cache. Each response goes to its episode's
`env.step`; the step keeps the exact messages the policy saw. An episode ends when the env
says done (outcome +1 on success, else -1), at `max_steps` (finish "max_steps", outcome -1),
or when the env raises, which it does only for its own failures, never for the policy's text
(`rlany.envs.read_action`): finish "error", the message in the step info (at reset: the
trajectory's `error`), in no rate, trained on by nothing. An env that cannot start, or errors
on more than `max_error_share` of the episodes, fails the stage unwritten (`episode_errors`).

Image observations (GUI envs): the newest user message carries the current screen as image
parts, earlier ones their text only; a step records the images it was shown and the next.

Constrained actions (`constrain_actions`): for envs that list their admissible actions
(`env.choices()`), each response is decoded as exactly one of them (the engine's
constrained decoding), so a small model's turns are never wasted on unparseable text;
training still sees the response as text under the unconstrained policy.

Demonstrations (`expert`): the env's expert (`expert_action()`, a shortest plan from the
current state) answers instead of a model, in exactly the prompts the same flags give the
policy, so `rlany sft` can warm-start the policy on them. No model is loaded.

Sampling seeds are derived from (seed, task_id, iteration, turn, sample), so a rerun, or a
resumed run that redoes a batch, draws the same samples from a seeded engine. `--shard I/N`
plays a contiguous block of whole batches (`rlany.shards`): the unsharded run's own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from rlany import limits
from rlany.chat import text_of, user_content
from rlany.engines.base import (
    Completion,
    Engine,
    NoModel,
    Request,
    Sampling,
    real_token_ids,
    stable_seed,
)
from rlany.envs import EnvBusy, Environment, split_obs, state_digest
from rlany.errors import RlanyError
from rlany.files.records import Step, Task, Trajectory, traj_id
from rlany.options import EngineFields, opt
from rlany.shards import shard_opt
from rlany.stages.episode_errors import MAX_ERROR_SHARE, EnvFailed, ErrorBudget, errored, watched
from rlany.stages.expert import check_expert, expert_result, has_expert
from rlany.stages.resume import replayed


@dataclass(frozen=True, kw_only=True)
class EpisodeFields(EngineFields):
    """How episodes are played: the fields `rollout` and `eval` share (eval plays the
    same episodes on held-out tasks, with its own defaults for n and temperature)."""

    n: int = opt(8, "Episodes per task.", min=1, max=limits.MAX_SAMPLES)
    max_steps: int = opt(1, "Turns per episode at most.", min=1, max=limits.MAX_STEPS)
    max_tokens: int = opt(256, "Max new tokens per response.", min=1, max=limits.MAX_TOKENS)
    temperature: float = opt(1.0, "Sampling temperature.", min=0)
    top_p: float = opt(1.0, "Nucleus sampling top-p.", min=0, max=1, min_exclusive=True)
    batch_tasks: int = opt(16, "Tasks whose episodes step together.", min=1,
                           max=limits.MAX_BATCH)
    history_turns: int | None = opt(None, "Keep the task message plus the last K turns in the "
                                    "prompt (default: all).", min=0)
    constrain_actions: bool = opt(False, "Decode every response as exactly one of the env's "
                                  "admissible actions (envs with choices(): household, "
                                  "alfworld, miniwob, openenv; engines vllm, hf, fake).")
    max_error_share: float = opt(MAX_ERROR_SHARE, "Fail, writing nothing, when more than this "
                                 "share of the episodes ended in an env error (finish "
                                 "\"error\": no outcome, counted in no rate); an env that "
                                 "cannot start (the whole first batch failed at reset) fails "
                                 "whatever this is.", min=0, max=1)


@dataclass(frozen=True, kw_only=True)
class RolloutOptions(EpisodeFields):
    input: str = opt("-", "tasks.jsonl; - for stdin (the default).", scope="io", short="-i")
    output: str = opt("trajectories.jsonl", "trajectories.jsonl; - for stdout. A file resumes: "
                      "a rerun with the same flags continues after the last complete task "
                      "(stdout does not resume).", scope="io", short="-o")
    iteration: int = opt(0, "Loop iteration, part of traj_id.", scope="io", min=0)
    sample_tasks: int | None = opt(None, "Roll out a sample of K of the input's tasks (drawn "
                                   "from --seed and --iteration, kept in input order) plus "
                                   "every candidate task; default: all.", min=1)
    replay_share: float = opt(0.25, "With --sample-tasks K: at most this share of the K are "
                              "rewrites (adapted tasks, lineage version > 0), the rest "
                              "originals.", min=0, max=1)
    expert: bool = opt(False, "Play the env's expert instead of a model (envs with "
                       "expert_action(): household, alfworld, miniwob): demonstrations for `rlany "
                       "sft`, in the prompts this rollout's flags give (--history-turns, "
                       "--max-steps). Needs --n 1; no model is loaded, so the sampling and "
                       "engine flags do not apply.", scope="io")
    expert_p: float | None = opt(None, "With --expert: each action is the expert's with "
                                 "probability P, else a uniformly random admissible action "
                                 "(seeded by --seed, task, sample and turn; envs with "
                                 "choices()), so the n episodes of a task differ and their "
                                 "steps carry both labels: labelled data for a judge warm "
                                 "start. Allows --n > 1.", min=0, max=1, scope="io")
    shard: str | None = shard_opt("whole batches of --batch-tasks tasks, contiguous, after "
                                  "--sample-tasks drew from the whole input")

    @property
    def sampling(self) -> Sampling:
        return Sampling(max_tokens=self.max_tokens, temperature=self.temperature,
                        top_p=self.top_p, logprobs=True)


@dataclass
class _Episode:
    task: Task
    sample: int
    env: Environment
    messages: list[dict]
    obs: str = ""  # the observation the next response answers
    images: list[str] = field(default_factory=list)  # its image files
    steps: list[Step] = field(default_factory=list)
    error: str | None = None
    finish: str | None = None
    success: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0


def sample_tasks(tasks: list[Task], opts: RolloutOptions) -> list[Task]:
    """The tasks one iteration rolls out (`rlany.stages.task_draw`)."""
    from rlany.stages.task_draw import sample_tasks as draw

    return draw(tasks, opts.sample_tasks, opts.replay_share, opts.seed, opts.iteration)


def rollout(tasks: Iterable[Task], engine: Engine, make_env: Callable[[str], Environment],
            opts: RolloutOptions, policy: dict | None = None) -> Iterator[list[Trajectory]]:
    """Yield the n trajectories of each task, task by task, in input order."""
    batch: list[Task] = []
    for task in tasks:
        batch.append(task)
        if len(batch) == opts.batch_tasks:
            yield from _run_batch(batch, engine, make_env, opts, policy or {})
            batch = []
    if batch:
        yield from _run_batch(batch, engine, make_env, opts, policy or {})


def _run_batch(tasks: list[Task], engine: Engine, make_env: Callable[[str], Environment],
               opts: RolloutOptions, policy: dict) -> Iterator[list[Trajectory]]:
    episodes: list[_Episode] = []
    waiting = [(task, k) for task in tasks for k in range(opts.n)]
    while True:  # an env busy with live episodes' sessions (EnvBusy) waits for one to end
        while waiting and (started := _start(*waiting[0], make_env, may_wait=any(
                e.finish is None for e in episodes))) is not None:
            episodes.append(started)
            waiting.pop(0)
        live = [e for e in episodes if e.finish is None]
        if not live:
            break
        groups: dict[str, list[_Episode]] = {}
        choices = {id(e): _choices(e) if opts.constrain_actions else () for e in live}
        for e in live:
            # one request per (task, history): seeds then do not depend on what else is
            # in the batch; identical prompts of other tasks still share the prefix cache
            key = json.dumps([e.task.task_id, _window(e.messages, opts.history_turns),
                              choices[id(e)]])
            groups.setdefault(key, []).append(e)
        members = list(groups.values())
        requests = [Request(messages=_window(g[0].messages, opts.history_turns),
                            sampling=replace(opts.sampling, n=len(g), choices=choices[id(g[0])],
                                             seed=stable_seed(opts.seed, g[0].task.task_id,
                                                             opts.iteration, len(g[0].steps),
                                                             g[0].sample)),
                            adapter=opts.adapter) for g in members]
        results = ([expert_result(g, opts, len(g[0].steps), _choices(g[0]) if
                                  opts.expert_p is not None else ()) for g in members]
                   if opts.expert else engine.generate(requests))
        real_ids = real_token_ids(engine)  # asked once answered (a server's ids: its answer)
        for group, result in zip(members, results):
            for e, completion in zip(group, result.completions):
                e.prompt_tokens += len(result.prompt_token_ids)
                e.completion_tokens += len(completion.token_ids)
                _advance(e, _window(e.messages, opts.history_turns), completion, real_ids)
        for e in live:
            if e.finish is None and len(e.steps) >= opts.max_steps:
                e.finish = "max_steps"
            if e.finish is not None:
                _close(e.env, f"{e.task.task_id} sample {e.sample}")  # free for a waiting one
    for task in tasks:
        group = [e for e in episodes if e.task.task_id == task.task_id]
        yield [_trajectory(e, opts, policy) for e in group]


def _choices(e: _Episode) -> tuple[str, ...]:
    from rlany.envs import ListsActions

    if not isinstance(e.env, ListsActions):
        raise RlanyError(f"environment '{e.task.env}' does not list its actions (no "
                         "choices() method), so --constrain-actions cannot be used with it")
    return tuple(e.env.choices())


def _start(task: Task, sample: int, make_env: Callable[[str], Environment],
           may_wait: bool = False) -> _Episode | None:
    env = make_env(task.env)
    episode = _Episode(task=task, sample=sample, env=env, messages=[])
    try:
        obs, images = split_obs(env.reset(task))
    except Exception as e:  # a broken task must not take the batch down with it
        _close(env, f"{task.task_id} sample {sample}")  # what the reset opened, if it did
        if isinstance(e, EnvBusy) and may_wait:
            return None
        episode.finish, episode.error = "error", f"reset: {type(e).__name__}: {e}"
        return episode
    first = f"{task.prompt}\n\n{obs}" if task.prompt else obs
    episode.messages = [{"role": "user", "content": user_content(first, images)}]
    episode.obs, episode.images = obs, images
    return episode


def _close(env: Environment, which: str) -> None:
    """Give the env's tab or session back; a close that fails is said, and play goes on."""
    try:
        if hasattr(env, "close"):
            env.close()
    except Exception as exc:
        from rlany.console import info

        info(f"rollout: closing the env of {which} failed ({type(exc).__name__}: {exc}); "
             "going on")


def _advance(e: _Episode, request_messages: list[dict], completion: Completion,
             real_ids: bool = True) -> None:
    obs, response = e.obs, completion.text
    recorded = {"token_ids": completion.token_ids if real_ids else None,
                "logprobs": completion.logprobs if real_ids else None,
                "finish_reason": completion.finish_reason, "state": state_digest(e.env, obs)}
    try:
        result = e.env.step(response)
    except Exception as exc:
        e.steps.append(Step(obs=obs, prompt_messages=request_messages, response=response,
                            action=None, next_obs="", images=e.images,
                            info={"error": f"step: {type(exc).__name__}: {exc}"}, **recorded))
        e.finish = "error"
        return
    info = dict(result.info)
    if completion.finish_reason == "length":
        info["truncated"] = True
    next_images = [str(p) for p in result.images]
    e.steps.append(Step(obs=obs, prompt_messages=request_messages, response=response,
                        action=result.action, next_obs=result.obs, info=info, images=e.images,
                        next_images=next_images, **recorded))
    if result.done:
        e.finish, e.success = ("success" if result.success else "failure"), result.success
        return
    earlier = [{**m, "content": text_of(m["content"])} if m["role"] == "user" else m
               for m in e.messages] if e.images else e.messages
    e.messages = earlier + [{"role": "assistant", "content": response},
                            {"role": "user", "content": user_content(result.obs, next_images)}]
    e.obs, e.images = result.obs, next_images


def _window(messages: list[dict], turns: int | None) -> list[dict]:
    """The first user message (the task) plus the last `turns` exchanges (an exchange is
    the policy's response and the observation after it); with 0, the task and the newest
    observation."""
    if turns is None or len(messages) <= 1 + 2 * turns:
        return messages
    return messages[:1] + messages[len(messages) - 2 * turns:] if turns else \
        [messages[0], messages[-1]]


def _trajectory(e: _Episode, opts: RolloutOptions, policy: dict) -> Trajectory:
    from rlany.files.provenance import TASK_SHA256, task_digest

    finish = e.finish or "max_steps"
    return Trajectory(traj_id=traj_id(e.task.task_id, opts.iteration, e.sample),
                      task_id=e.task.task_id, iteration=opts.iteration, sample=e.sample,
                      steps=e.steps, outcome=1 if e.success else -1, finish=finish,
                      policy=policy, prompt_tokens=e.prompt_tokens,
                      completion_tokens=e.completion_tokens,
                      extra={TASK_SHA256: task_digest(e.task),
                             **({"error": e.error} if e.error else {}),
                             # a candidate task's rollouts decide its acceptance; score
                             # trains on none of them until it is accepted into the pool
                             **({"candidate": True} if "candidate" in e.task.extra else {})})


# -- the file driver: `rlany rollout` and the loop's rollout stage ----------------------

def run(opts: RolloutOptions, engine: Engine | None = None) -> dict:
    """Read tasks, roll out (resuming a partial output), write trajectories + sidecar."""
    from rlany import shards
    from rlany.console import info
    from rlany.files.outputs import ResumableJsonl, write_meta
    from rlany.stage_engine import (
        GEN_VERSIONS,
        adapter_checks,
        begin_generation,
        engine_flags,
        resolved_engine,
    )
    from rlany.stageio import output_lock, output_state, resumable_sides

    started = time.time()
    shard = shards.parse(opts.shard)
    check_expert(opts, engine)
    if opts.expert:
        engine = NoModel("expert", "--expert: the env's shortest plan, no model")
    seen = output_state(opts.output)  # re-checked once the lock is held

    def pick(tasks: list[Task]) -> tuple:  # a sample, then a shard: what this run plays
        chosen, in_shard = shards.take(sample_tasks(tasks, opts), opts.batch_tasks, shard,
                                       stage="rollout", batch_flag="--batch-tasks")
        limits.check_episodes(opts.n, len(chosen), opts.batch_tasks, "rollout")
        return chosen, in_shard, len(tasks)
    (tasks, in_shard, input_tasks), reader, engine = begin_generation(
        opts, {"--output": opts.output}, engine, sides=resumable_sides(opts.output), pick=pick,
        check=(lambda t: has_expert(t, opts.expert_p is not None)) if opts.expert else None,
        stage="rollout")
    flags = engine_flags(opts, engine)
    stats = engine.stats
    mark = stats.mark()
    with output_lock(opts.output, seen=seen):
        out = ResumableJsonl(opts.output, header={"flags": flags, "input": reader.sha256})
        played = _play_into(out, tasks, engine, opts)
        out.finish()
        used = stats.since(mark)
        tokens, seconds = used["completion_tokens"], used["generate_seconds"]
        counts = {"tasks": len(tasks), "input_tasks": input_tasks, "trajectories": out.count,
                  "new_trajectories": played["total"], "errored": played["errored"],
                  "success_rate": played["successes"] / max(played["ran"], 1), "ran": played["ran"],
                  **used, **adapter_checks(engine), **in_shard}
        # under the lock: a writer waiting for it finds the output complete, sidecar too
        write_meta(opts.output, stage="rollout", flags=flags, inputs=[reader], counts=counts,
                   started=started, versions=GEN_VERSIONS)
    errors = played["total"] - played["ran"]
    info(f"rollout: {played['total']} trajectories for {played['tasks']} tasks, success "
         f"{played['successes']}/{played['ran']}"
         f"{f' ({errors} errored, not counted)' if errors else ''}; "
         f"{tokens} tokens, {tokens / seconds if seconds else 0:.0f} tokens/s "
         f"[{resolved_engine(flags)}] -> {opts.output} "
         f"({time.time() - started:.1f}s)")
    return counts


def _play_into(out, tasks: list[Task], engine: Engine, opts: RolloutOptions) -> dict:
    """Roll out the tasks `out` does not hold yet, writing each task's group as it is done;
    too many errored episodes fail here (`EnvFailed`). Returns what was played: tasks,
    trajectories (`total`), those that `ran` (not errored), successes, and `errored`, the
    output's errored episodes (a resumed part included)."""
    from rlany import envs
    from rlany.console import info, progress

    done = set(out.done)
    replay = replayed([t.task_id for t in tasks], [1] * len(tasks), opts.batch_tasks, done)
    play = [t for t in tasks if t.task_id in replay]  # whole batches (stages.resume)
    todo = [t for t in play if t.task_id not in done]
    first = sum(t.task_id not in done for t in play[:opts.batch_tasks])  # its first batch
    if done:
        info(f"rollout: resuming, {len(done)} of {len(tasks)} tasks already done")
    budget = ErrorBudget(opts.max_error_share, expected=out.count + len(todo) * opts.n,
                         first_batch=first, env_of={t.task_id: t.env for t in todo})
    if done and not out.stream:
        budget.resumed(out.partial)
    successes = total = errors = 0
    try:
        with progress("rollout", len(todo)) as bar:
            played = rollout(play, engine, envs.make_env, opts,
                             {"model": engine.model, "adapter": opts.adapter})
            for group in watched((g for g in played if g[0].task_id not in done), budget):
                out.write_group(group[0].task_id, group)
                successes += sum(t.outcome == 1 for t in group)
                errors += sum(errored(t) for t in group)
                total += len(group)
                bar.advance()
    except EnvFailed:
        out.close()
        if (budget.resumed_errors + errors or not out.count) and not out.stream:
            # empty, or its errored episodes would be resumed as done: start over
            out.partial.unlink(missing_ok=True)
            out.index.unlink(missing_ok=True)
        raise
    finally:
        out.close()
    return {"tasks": len(todo), "total": total, "ran": total - errors,
            "successes": successes, "errored": budget.errors}

"""Batches that give every shard work, the same in `rlany loop` and in its printed plan.

A generation stage is cut into shards by whole batches (`rlany.shards`): 16 tasks in one
batch of `batch_tasks = 16` leave shards 1 and 2 of 3 empty, and the shards of one
endpoint idle. Where a run has N > 1 shards (`shard_count`: the endpoints of an openai
engine, or `[launch] shards`) and a stage's table leaves its batch size out, the loop
(and so the plan, which prints the loop's options) makes the batches small enough for N of
them: the largest size no larger than the config's that cuts the stage's work into at
least N batches, preferring the even ceil(work / N) (16 tasks, 3 shards: batches of 6, 6
and 4). The work is counted before the stage runs, from what it will read: rollout's
tasks (the pool and the candidates, after `--sample-tasks`), judge's trajectories
(rollout's tasks times its n), eval's held-out tasks. Both runs record the size they used
(`flags.batch_tasks`, `flags.batch_trajectories`), so the loop's batches, and with an
engine whose samples depend on the batch its records, are the plan's. A batch size the
config sets is kept; where it leaves a shard without work, stderr says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlany.shards import batch_starts

KEYS = {"rollout": "batch_tasks", "eval": "batch_tasks", "judge": "batch_trajectories"}


def shard_count(cfg: Any) -> int:
    """The shards a plan runs each generation stage in: one per endpoint of an openai
    engine with several, else `[launch] shards` (default 1)."""
    from rlany.engines.endpoints import split_urls

    urls = split_urls(cfg.run.get("base_url")) if cfg.run.get("engine") == "openai" else []
    return len(urls) if len(urls) > 1 else (cfg.launch.shards or 1)


def even_limit(sizes: list[int], n: int, limit: int) -> int:
    """The batch limit for items of `sizes` (cut as `batch_starts` cuts them) that makes at
    least `n` batches where there are items enough: `limit` where it does, else the
    largest smaller one, trying ceil(total / n) first."""
    if len(batch_starts(sizes, limit)) >= min(n, len(sizes)):
        return limit
    total = sum(sizes)
    for size in range(min(limit, -(-total // n)), 0, -1):
        if len(batch_starts(sizes, size)) >= n:
            return size
    return 1


def sized(loop: Any, stage: Any, opts: Any, it: int) -> dict:
    """The batch size `stage` runs with in a run of several shards (module doc); {} where
    the config's stands."""
    from rlany.console import info

    key, n = KEYS.get(stage.table), shard_count(loop.cfg)
    if key is None or n < 2 or not stage.engine or getattr(opts, "expert", False):
        return {}
    sizes = _work(loop, stage.table, opts, it)
    if sizes is None:
        return {}
    limit = getattr(opts, key)
    if key in loop.cfg.tables.get(stage.table, {}):
        if len(batch_starts(sizes, limit)) < min(n, len(sizes)):
            info(f"loop: [{stage.table}] {key} = {limit} cuts its {len(sizes)} items into "
                 f"fewer batches than the {n} shards: some shards get no work (leave it out "
                 "to have batches sized for the shards)")
        return {}
    even = even_limit(sizes, n, limit)
    return {key: even} if even != limit else {}


def _work(loop: Any, table: str, opts: Any, it: int) -> list[int] | None:
    """The sizes of the items the stage will cut into batches (tasks: 1 each; judge: a
    task's trajectories), counted before it runs; None where they cannot be."""
    from rlany.stageio import read_tasks
    from rlany.stages.rollout import sample_tasks

    if table == "eval":
        return [1] * len(read_tasks(opts.input)[0])
    rollout = loop.cfg.options("rollout", input="-", iteration=it)
    d = loop.dir / f"iter_{it:03d}"
    pool = d / "rollout_tasks.jsonl"
    if pool.exists():
        tasks = read_tasks(pool)[0]
    else:  # not yet copied (a plan): what the loop's `_pool` will copy
        from rlany.loop.tables import pending_candidates

        src = d / "tasks.jsonl" if (d / "tasks.jsonl").exists() else Path(loop.cfg.tasks) \
            if it == 0 else loop.dir / f"iter_{it - 1:03d}" / "next_tasks.jsonl"
        pending = pending_candidates(loop, it)
        if not src.exists():
            return None
        tasks = read_tasks(src)[0] + (read_tasks(pending, allow_empty=True)[0]
                                      if pending else [])
    played = sample_tasks(tasks, rollout)
    return [1] * len(played) if table == "rollout" else [rollout.n] * len(played)

"""`rollout --sample-tasks K`: the tasks one iteration rolls out.

K tasks of the pool, drawn from (seed, iteration) and kept in input order, plus every
candidate task (a task with a `candidate` column: its rollouts decide its acceptance). Of
the K, at most floor(`replay_share` x K) are rewrites (pool tasks adapted from an original:
lineage version > 0), the rest originals, each part drawn uniformly from its own kind: a
replay buffer of adapted tasks beside fresh draws of the pool as made (PLR's replay
probability), so the training mix stays anchored to the original tasks however many
rewrites the pool holds. Where one kind has too few tasks the draw is smaller, never the
other kind's share larger than asked. A candidate's parent is not forced into the draw: it
is measured by its own draws (`adapt-tasks` compares a candidate with its parent's latest
accuracy).
"""

from __future__ import annotations

import math
import random

from rlany.engines.base import stable_seed
from rlany.files.records import Task


def is_rewrite(task: Task) -> bool:
    return task.lineage is not None and task.lineage.version > 0


def sample_tasks(tasks: list[Task], k: int | None, replay_share: float, seed: int,
                 iteration: int) -> list[Task]:
    """The tasks one iteration rolls out, in input order (k None: all of them)."""
    if k is None:
        return tasks
    candidates = [t for t in tasks if "candidate" in t.extra]
    pool = [t for t in tasks if "candidate" not in t.extra]
    rewrites = [t for t in pool if is_rewrite(t)]
    originals = [t for t in pool if not is_rewrite(t)]
    n_rewrites = min(len(rewrites), math.floor(replay_share * k + 1e-9))
    n_originals = min(len(originals), k - n_rewrites)
    rng = random.Random(stable_seed(seed, "sample_tasks", iteration))
    chosen = {id(t) for t in candidates}
    chosen |= {id(t) for t in rng.sample(originals, n_originals)}
    chosen |= {id(t) for t in rng.sample(rewrites, n_rewrites)}
    return [t for t in tasks if id(t) in chosen]

"""Resuming a generating stage killed mid-run (rollout, judge): which batches to play again.

A kill can land between the task groups one batch writes. The rerun plays again, whole,
every batch an uninterrupted run forms (`shards.batch_starts`, the rule both stages batch
by) that is not written whole, and writes only its missing groups. Each batch then meets
the engine as the uninterrupted run's did (hf draws a batch's samples together, seeded
from its first request and padded to its longest prompt), so the resumed output is the
uninterrupted one's bytes (tests/test_kill_resume.py, with the hf engine).
"""

from __future__ import annotations

from rlany.shards import batch_starts


def replayed(keys: list[str], sizes: list[int], limit: int, done: set[str]) -> set[str]:
    """The keys (task ids, in input order, of `sizes` records each) of every batch of
    `limit` records or more that `done` does not hold whole."""
    starts = batch_starts(sizes, limit) + [len(keys)]
    return {k for a, b in zip(starts, starts[1:]) if not done.issuperset(keys[a:b])
            for k in keys[a:b]}

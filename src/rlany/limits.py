"""Sizes checked before any work starts: what one stage run can hold in memory and finish.

A flag beyond its ceiling (`--n 1000000000`) would run until the machine ran out of memory
or the user out of patience; it is refused as a usage error (exit 2), in one line, before
an engine starts or a model loads. The ceilings are far above any real run (the defaults
are 8 episodes per task in batches of 16 tasks) and are not settable: a larger job is
split with `--shard I/N` (rollout, judge, eval; each shard is checked alone).

One flag's ceiling is its field's `max` (`rlany.options`); the products, which need the
input's size, are checked here once the input is read:

* episodes stepped together (rollout, eval): the tasks of a batch (`--batch-tasks`, or
  fewer where the input has fewer) x `--n`, at most `MAX_LIVE`. Each live episode holds
  its env and its chat in memory (about 4 KB for a one-turn reasoning episode, measured:
  100,000 episodes took 400 MB more), and the engine gets them in one call;
* episodes of one rollout output: tasks x `--n`, at most `MAX_EPISODES` (written as they
  complete: a file of tens of GB, days of generation on one machine);
* episodes of one eval: tasks x `--n`, at most `MAX_EVAL_EPISODES` (eval keeps every
  episode in memory until its summary);
* judge: verdicts, the input's judged steps x `--m`, at most `MAX_VERDICTS`, and samples
  of one engine call, the trajectories of a batch (`--batch-trajectories`, or fewer) x
  `--m`, at most `MAX_LIVE` (a trajectory has one step or more).

Every integer read from a flag, a `--set` or a TOML file is bounded too: a seed fits 63 bits
(`MAX_SEED`: the engines' and numpy's seeds are 64-bit), a shard count (`--shard I/N`,
`[launch] shards`, a summary's `shard.of`) is at most `MAX_SHARDS` (a plan holds a line per
shard; 10^8 of them grew to 2.7 GB), and a TOML integer beyond 64 bits is refused where it
is read (`options.typed`), before anything formats it.
"""

from __future__ import annotations

from rlany.errors import UsageError

MAX_SAMPLES = 100_000  # --n (rollout, eval) and --m (judge, eval): samples of one prompt
MAX_BATCH = 1_000_000  # --batch-tasks, --batch-trajectories, --engine-batch
MAX_TOKENS = 1_048_576  # --max-tokens: new tokens of one response
MAX_STEPS = 100_000  # --max-steps: turns of one episode
MAX_LIVE = 1_000_000  # episodes stepped together; judge samples in one engine call
MAX_EPISODES = 100_000_000  # episodes of one rollout output
MAX_EVAL_EPISODES = 1_000_000  # episodes of one eval (all held in memory)
MAX_VERDICTS = 1_000_000_000  # verdicts of one judge output
MAX_SEED = 2**63 - 1  # --seed, and any seed key
MAX_SHARDS = 10_000  # --shard I/N's N, [launch] shards: processes of one stage
MAX_INT = 2**63 - 1  # any integer of a config (TOML has no size limit; every option has less)


def check_episodes(n: int, tasks: int, batch_tasks: int, stage: str) -> None:
    """rollout (`stage` "rollout") and eval ("eval"): `tasks` x `n` episodes of this run
    (a shard's or a sample's tasks), stepped `batch_tasks` tasks at a time."""
    live = min(batch_tasks, tasks) * n
    if live > MAX_LIVE:
        raise UsageError(f"--n {n} x {min(batch_tasks, tasks):,} tasks per batch "
                         f"(--batch-tasks) = {live:,} episodes stepped together: over the "
                         f"{MAX_LIVE:,} one batch may hold in memory (rlany.limits)",
                         hint="lower --batch-tasks or --n")
    ceiling = MAX_EPISODES if stage == "rollout" else MAX_EVAL_EPISODES
    if tasks * n > ceiling:
        why = "one rollout output may hold" if stage == "rollout" else \
            "one eval may hold (it keeps every episode in memory)"
        raise UsageError(f"--n {n} x {tasks:,} tasks = {tasks * n:,} episodes: over the "
                         f"{ceiling:,} {why} (rlany.limits)",
                         hint="split the tasks with --shard I/N, or lower --n")


def check_verdicts(m: int, trajectories: int, steps: int, batch: int) -> None:
    """judge: `steps` judged steps of `trajectories` trajectories, `m` verdicts each,
    `batch` trajectories (at least) per engine call."""
    per_call = min(batch, trajectories) * m
    if per_call > MAX_LIVE:
        raise UsageError(f"--m {m} x {min(batch, trajectories):,} trajectories per batch "
                         f"(--batch-trajectories) = {per_call:,} samples or more in one "
                         f"engine call: over the {MAX_LIVE:,} one call may hold (rlany.limits)",
                         hint="lower --batch-trajectories or --m")
    if steps * m > MAX_VERDICTS:
        raise UsageError(f"--m {m} x {steps:,} judged steps = {steps * m:,} verdicts: over "
                         f"the {MAX_VERDICTS:,} one judge output may hold (rlany.limits)",
                         hint="split the input with --shard I/N, or lower --m")

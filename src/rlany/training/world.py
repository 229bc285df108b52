"""Whether a launched trainer's processes form one group of the size its launcher was told.

A launcher that starts N processes which do not join one process group trains N times on
one checkpoint: on a CPU, `torchrun --nproc_per_node 2` without `ACCELERATE_USE_CPU=true`
starts 2 trainers that each see a world of 1 and race to write the same checkpoint, and
`accelerate launch --cpu --num_processes 2` quietly runs one process. So the trainer
compares the group accelerate formed (`PartialState().num_processes`) with the size asked
for, before it loads a model: `RLANY_WORLD_SIZE`, which `rlany loop` (and its printed plan)
sets from the launcher's own options (`rlany.loop.launch.world_size`), else
torch's `WORLD_SIZE`, which torchrun gives every process it starts. A mismatch is refused
in one line by every process; the checkpoint's `rlany.json` records `world_size`.
"""

from __future__ import annotations

import os

from rlany.errors import RlanyError

ENV = "RLANY_WORLD_SIZE"  # the launcher's size, as the loop read it from its options


def expected() -> tuple[int, str] | None:
    """(the world size asked for, who asked), or None where nothing was launched."""
    for name, who in ((ENV, "the launcher's options"), ("WORLD_SIZE", "torch's WORLD_SIZE")):
        value = os.environ.get(name)
        if value:
            try:
                return int(value), who
            except ValueError:
                raise RlanyError(f"{name}={value!r} is not a whole number") from None
    return None


def check_world() -> int:
    """The number of processes training together, refused unless it is the size asked
    for (module doc)."""
    asked = expected()
    if asked is None:
        return 1
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    # as Accelerator() will: ACCELERATE_USE_CPU makes torchrun's processes one gloo group
    world = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU")).num_processes
    if world != asked[0]:
        raise RlanyError(
            f"this trainer's processes form a group of {world}, but {asked[1]} asked for "
            f"{asked[0]}: each would train alone on the same checkpoint",
            hint="on a CPU, torchrun needs ACCELERATE_USE_CPU=true in its environment "
            "(accelerate launch --cpu starts one process whatever --num_processes says)")
    return world

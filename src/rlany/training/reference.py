"""What an update is measured against: PPO's pre-update log-probs (the sampling engine's, or
recomputed in one no-grad pass) and the KL's fixed reference (`--kl-ref` base or an adapter:
its log-probs read in one no-grad pass, the adapter switched on the same network). With
`--kl-ref pre-update` (the default) the KL is to PPO's pre-update snapshot instead."""

from __future__ import annotations

import math

from rlany.errors import RlanyError
from rlany.training.fields import OLD_LOGPROBS
from rlany.training.samples import Sample


def old_logprobs_source(samples: list[Sample], mode: str) -> str:
    """"generation" or "recompute": where PPO's pre-update log-probs come from."""
    if mode not in OLD_LOGPROBS:
        raise RlanyError(f"old_logprobs must be one of {', '.join(OLD_LOGPROBS)}, not {mode!r}")
    missing = sum(s.old_logprobs is None for s in samples)
    if mode == "generation" and missing:
        raise RlanyError(f"--old-logprobs generation, but {missing} of {len(samples)} samples "
                         "carry no engine log-probs of their sampled tokens",
                         hint="use --old-logprobs auto or recompute")
    return "generation" if mode != "recompute" and not missing else "recompute"


def old_policy(source: str | None, forward, model, samples: list[Sample],
               steps: list[list[int]], acc, micro: int, first_step_later: bool) -> dict:
    """PPO's pre-update log-probs by sample index: none for a supervised objective
    (`source` None), the engine's from generation, or recomputed here (eval mode)."""
    import torch

    if source is None:
        return {}
    if source == "generation":
        return {i: torch.tensor(s.old_logprobs, dtype=torch.float32)
                for i, s in enumerate(samples)}
    model.eval()
    return pre_update_logprobs(forward, samples, steps, acc, micro, first_step_later)


def reference(kl_ref: str, forward, model, samples: list[Sample], steps: list[list[int]],
               acc, micro: int) -> dict:
    """The KL reference's log-probs by sample index (no grad, eval mode): none for
    `pre-update` (the KL is then to PPO's pre-update log-probs), else those of the base
    model or of the --kl-ref adapter, switched on this same network for the pass."""
    from accelerate.utils import DistributedType

    from rlany.training.model import reference_policy

    if kl_ref == "pre-update":
        return {}
    if acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise RlanyError(f"--kl-ref {kl_ref} runs on one process or under DDP, not "
                         f"{acc.distributed_type.value}", hint="use --kl-ref pre-update")
    model.eval()
    with reference_policy(acc.unwrap_model(model), kl_ref):
        return pre_update_logprobs(forward, samples, steps, acc, micro, first_step_later=False)


def pre_update_logprobs(forward, samples: list[Sample], steps: list[list[int]], acc,
                        micro: int, first_step_later: bool) -> dict:
    """Log-probs of the pre-update policy for this process's samples (no grad, eval mode).
    With `first_step_later`, the first optimizer step's samples are left out: that step's
    own forward gives theirs. Every process runs the same number of forwards."""
    import torch

    world = acc.num_processes

    def todo(rank: int) -> list[int]:
        skip = set(steps[0][rank::world]) if first_step_later and steps else set()
        mine = {i for s in steps for i in s[rank::world]} - skip
        return sorted(mine, key=lambda i: samples[i].length)

    mine = todo(acc.process_index)
    calls = max(math.ceil(len(todo(r)) / micro) for r in range(world))
    shortest = min(samples, key=lambda s: s.length)
    old = {}
    with torch.no_grad():
        for b in range(calls):
            idx = mine[b * micro:(b + 1) * micro]
            logp, resp, _ = forward([samples[i] for i in idx] or [shortest])
            for row, i in enumerate(idx):
                old[i] = logp[row][resp[row]].cpu()
    return old

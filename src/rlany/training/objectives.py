"""The training objectives, one object each: what the forward returns for them and how one
micro-batch becomes a loss. The trainer (`rlany.training.trainer`) asks the object and never
branches on a name, so a new loss is one entry here (and, for `train-rm`, its name in
`OBJECTIVES`' verdict choices).

    ppo       train-policy, train-rm's pg: PPO-clip against the pre-update log-probs, with a
              k3 KL to them or to a fixed reference (`rlany.training.losses.ppo_clip_loss`)
    nll       sft: the token mean negative log-likelihood, weighted by the advantage
    expected  train-rm: E_{v~q}[R·v] over a verdict-only judge's choices (`rlany.training.verdict`)
    logloss   train-rm: -|R| log q(c*), c* the choice whose sign is R's

`choices`: the forward returns log q(c | prompt) over the sample's choices, (B, C), not the
response tokens' log-probs (B, T). `clips`: the loss needs the pre-update log-probs, and the
KL (kl_beta > 0) is computed (to them or to `kl_ref`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlany.errors import RlanyError

if TYPE_CHECKING:
    from rlany.training.fields import TrainFields
    from rlany.training.losses import LossParts
    from rlany.training.samples import Sample


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch as a loss sees it: the samples (a padding row repeats one, with index
    None), their indices, the pre-update log-probs by index (PPO fills a first step's), the
    fixed reference's (empty: the KL is to the pre-update ones), the options, and the number
    of sequences the whole optimizer step holds on this process (the loss divides by it)."""

    samples: list[Sample]
    idx: list[int | None]
    old: dict
    ref: dict
    opts: TrainFields
    normalizer: float


@dataclass(frozen=True)
class Objective:
    name: str
    choices: bool  # forward: log q(choice | prompt) (B, C) instead of token log-probs (B, T)
    clips: bool  # needs the pre-update log-probs; the only one with a KL term
    loss: Callable[[object, MicroBatch], LossParts]  # (forward's output, micro-batch)


def _real(mb: MicroBatch, device):
    import torch

    return torch.tensor([i is not None for i in mb.idx], device=device)  # (B,)


def _ppo(out, mb: MicroBatch) -> LossParts:
    """PPO-clip against the pre-update log-probs (filled here for a first-step sample: the
    current weights are the old ones), the KL against the fixed reference's log-probs or,
    where there is none, against the pre-update ones."""
    import torch

    from rlany.training.losses import ppo_clip_loss

    logp, resp, adv = out  # (B, T), (B, T), (B,)
    resp = resp & _real(mb, resp.device)[:, None]  # padding rows have no response token
    old_logp = torch.zeros_like(logp)  # (B, T)
    ref_logp = torch.zeros_like(logp) if mb.ref else old_logp
    for row, i in enumerate(mb.idx):
        if i is None:
            continue
        if i not in mb.old:
            mb.old[i] = logp[row][resp[row]].detach().cpu()
        old_logp[row][resp[row]] = mb.old[i].to(logp.device, logp.dtype)
        if mb.ref:
            ref_logp[row][resp[row]] = mb.ref[i].to(logp.device, logp.dtype)
    return ppo_clip_loss(logp, old_logp, ref_logp, adv, resp, clip_eps=mb.opts.clip_eps,
                         kl_beta=mb.opts.kl_beta, normalizer=mb.normalizer)


def _nll(out, mb: MicroBatch) -> LossParts:
    from rlany.training.losses import nll_loss

    logp, resp, adv = out
    resp = resp & _real(mb, resp.device)[:, None]
    return nll_loss(logp, adv, resp, normalizer=mb.normalizer)


def _verdict(kind: str) -> Callable[[object, MicroBatch], LossParts]:
    def loss(logq, mb: MicroBatch) -> LossParts:  # logq: (B, C)
        import torch

        from rlany.training.verdict import verdict_loss

        real = _real(mb, "cpu").float()  # a padding row weighs 0
        return verdict_loss(logq, torch.tensor(mb.samples[0].choice_values),
                            torch.tensor([s.target for s in mb.samples]),
                            torch.tensor([s.advantage for s in mb.samples]) * real,
                            objective=kind, normalizer=mb.normalizer)
    return loss


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("ppo", choices=False, clips=True, loss=_ppo),
    Objective("nll", choices=False, clips=False, loss=_nll),
    Objective("expected", choices=True, clips=False, loss=_verdict("expected")),
    Objective("logloss", choices=True, clips=False, loss=_verdict("logloss")),
)}
# train-rm's exact objectives: the verdict's own choices scored (`rlany.training.verdict`)
VERDICT_OBJECTIVES = tuple(name for name, o in OBJECTIVES.items() if o.choices)


def objective(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise RlanyError(f"unknown training objective {name!r}",
                         hint=f"one of {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]

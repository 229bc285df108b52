"""The policy-gradient loss shared by `train-policy` and `train-rm`.

PPO-clip on token log-ratios against the pre-update policy, with an optional k3 KL penalty
against the same pre-update snapshot (DESIGN §4):

    ratio_t = exp(logp_t - old_logp_t)
    pg_t    = max(-A · ratio_t, -A · clip(ratio_t, 1 - eps, 1 + eps))
    kl_t    = exp(ref_t - logp_t) - (ref_t - logp_t) - 1          (k3, always >= 0)
    loss    = mean over sequences of [ mean over response tokens of (pg_t + beta · kl_t) ]

"per-sequence token mean, then batch mean": every sequence weighs the same whatever its
length. Under gradient accumulation the caller passes `normalizer` = the number of
sequences in the whole optimizer step, so the loss is divided exactly once (the reference
implementation divided twice).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossParts:
    loss: torch.Tensor  # scalar, what backward() is called on
    pg: float  # mean policy-gradient term
    kl: float  # mean k3 KL
    clip_frac: float  # fraction of response tokens where the clipped branch was taken
    tokens: int  # response tokens in this micro-batch


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                  advantages: torch.Tensor, mask: torch.Tensor, *, clip_eps: float = 0.2,
                  kl_beta: float = 0.0, normalizer: int | None = None) -> LossParts:
    """logp, old_logp, ref_logp, mask: (B, T); advantages: (B,).

    Returns the sum of per-sequence losses divided by `normalizer` (default B), so that
    summing the losses of micro-batches equals the mean over the optimizer step.
    """
    mask = mask.to(logp.dtype)  # (B, T)
    adv = advantages.to(logp.dtype)[:, None]  # (B, 1)
    ratio = torch.exp(logp - old_logp)  # (B, T)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    pg = torch.maximum(unclipped, clipped)  # (B, T)
    per_token = pg
    if ref_logp is not None and kl_beta > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0  # (B, T)
        per_token = per_token + kl_beta * kl
    else:
        kl = torch.zeros_like(pg)
    lengths = mask.sum(-1).clamp(min=1.0)  # (B,)
    per_seq = (per_token * mask).sum(-1) / lengths  # (B,)
    n = normalizer if normalizer is not None else logp.shape[0]
    loss = per_seq.sum() / n
    with torch.no_grad():
        tokens = mask.sum()
        clip_frac = (((clipped > unclipped) & (mask > 0)).sum() / tokens.clamp(min=1)).item()
        pg_mean = ((pg * mask).sum(-1) / lengths).mean().item()
        kl_mean = ((kl * mask).sum(-1) / lengths).mean().item()
    return LossParts(loss=loss, pg=pg_mean, kl=kl_mean, clip_frac=clip_frac,
                     tokens=int(tokens.item()))


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: logits (B, T, V), input_ids (B, T) -> (B, T-1)."""
    logits = logits[:, :-1].float()  # (B, T-1, V)
    targets = input_ids[:, 1:]  # (B, T-1)
    picked = logits.gather(-1, targets[..., None])[..., 0]  # (B, T-1)
    return picked - torch.logsumexp(logits, dim=-1)  # no (B, T, V) log-softmax kept

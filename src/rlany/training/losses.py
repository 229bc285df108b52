"""The policy-gradient loss shared by `train-policy` and `train-rm`, and `sft`'s supervised
one (`nll_loss`, at the end).

PPO-clip on token log-ratios against the pre-update policy, with an optional k3 KL penalty
against the same pre-update snapshot (DESIGN §4):

    ratio_t = exp(logp_t - old_logp_t)
    pg_t    = max(-A · ratio_t, -A · clip(ratio_t, 1 - eps, 1 + eps))
    kl_t    = exp(ref_t - logp_t) - (ref_t - logp_t) - 1          (k3, always >= 0)
    loss    = mean over sequences of [ mean over response tokens of (pg_t + beta · kl_t) ]

"per-sequence token mean, then batch mean": every sequence weighs the same whatever its
length. Under gradient accumulation the caller passes `normalizer` = the number of
sequences in the whole optimizer step (per process), so the loss is divided exactly once
(the reference implementation divided twice).

Numerics: outside the response mask (prompt, padding) old/ref log-probs are placeholders,
so the log-ratios there are set to 0 *before* `exp`: a token with log-prob below about
-88 would otherwise overflow fp32's exp to inf, and inf · 0 (the mask) is NaN. A row with
no response token (a padding row that keeps processes in step) adds exactly 0 to the loss
and to every statistic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossParts:
    """The loss to backpropagate and sums to report (summed, so that micro-batches and
    processes add up; divide by `sequences` or `tokens` for means)."""

    loss: torch.Tensor  # scalar, what backward() is called on: objective / normalizer
    objective: float  # sum over sequences of the per-sequence loss
    pg: float  # sum over sequences of the per-sequence mean policy-gradient term
    kl: float  # sum over sequences of the per-sequence mean k3 KL
    clipped: int  # response tokens where the clipped branch was taken
    tokens: int  # response tokens in this micro-batch
    sequences: int  # sequences with at least one response token

    @property
    def clip_frac(self) -> float:
        return self.clipped / max(self.tokens, 1)


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                  advantages: torch.Tensor, mask: torch.Tensor, *, clip_eps: float = 0.2,
                  kl_beta: float = 0.0, normalizer: float | None = None) -> LossParts:
    """logp, old_logp, ref_logp, mask: (B, T); advantages: (B,).

    Returns the sum of per-sequence losses divided by `normalizer` (default B), so that
    summing the losses of micro-batches equals the mean over the optimizer step.
    """
    mask = mask.bool()  # (B, T)
    adv = advantages.to(logp.dtype)[:, None]  # (B, 1)
    log_ratio = torch.where(mask, logp - old_logp, 0.0)  # masked BEFORE exp: no inf, no NaN
    ratio = torch.exp(log_ratio)  # (B, T)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    pg = torch.maximum(unclipped, clipped)  # (B, T)
    if ref_logp is not None and kl_beta > 0:
        delta = torch.where(mask, ref_logp - logp, 0.0)  # (B, T), masked before exp
        kl = torch.exp(delta) - delta - 1.0  # (B, T)
    else:
        kl = torch.zeros_like(pg)
    per_token = torch.where(mask, pg + kl_beta * kl, 0.0)  # (B, T)
    counts = mask.sum(-1)  # (B,)
    lengths = counts.clamp(min=1).to(logp.dtype)  # (B,)
    per_seq = per_token.sum(-1) / lengths  # (B,)
    n = normalizer if normalizer is not None else logp.shape[0]
    loss = per_seq.sum() / n
    with torch.no_grad():
        pg_sum = (torch.where(mask, pg, 0.0).sum(-1) / lengths).sum().item()
        kl_sum = (torch.where(mask, kl, 0.0).sum(-1) / lengths).sum().item()
        n_clipped = ((clipped > unclipped) & mask).sum().item()
    return LossParts(loss=loss, objective=per_seq.detach().sum().item(), pg=pg_sum, kl=kl_sum,
                     clipped=int(n_clipped), tokens=int(counts.sum().item()),
                     sequences=int((counts > 0).sum().item()))


def nll_loss(logp: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, *,
             normalizer: float | None = None) -> LossParts:
    """Supervised (`rlany sft`): per sequence the token mean negative log-likelihood of the
    response times its weight (1 for a demonstration), summed and divided by `normalizer`
    (default B) like `ppo_clip_loss`; `pg` reports the same sum, `kl` and `clipped` are 0."""
    mask = mask.bool()
    counts = mask.sum(-1)  # (B,)
    lengths = counts.clamp(min=1).to(logp.dtype)
    per_seq = -torch.where(mask, logp, 0.0).sum(-1) / lengths * weights.to(logp.dtype)
    n = normalizer if normalizer is not None else logp.shape[0]
    objective = per_seq.detach().sum().item()
    return LossParts(loss=per_seq.sum() / n, objective=objective, pg=objective, kl=0.0,
                     clipped=0, tokens=int(counts.sum().item()),
                     sequences=int((counts > 0).sum().item()))

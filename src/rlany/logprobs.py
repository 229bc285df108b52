"""Per-token log-probabilities from a causal LM's logits: the one computation the trainer's
losses and the adapter probe (`rlany.probe`, used by the engines, below training) share, so
it lives at the base, importing only torch."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: logits (B, T, V), input_ids (B, T) -> (B, T-1)."""
    logits = logits[:, :-1].float()  # (B, T-1, V)
    targets = input_ids[:, 1:]  # (B, T-1)
    picked = logits.gather(-1, targets[..., None])[..., 0]  # (B, T-1)
    return picked - torch.logsumexp(logits, dim=-1)  # no (B, T, V) log-softmax kept

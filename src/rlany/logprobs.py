"""Per-token log-probabilities from a causal LM's logits: the one computation the trainer's
losses and the adapter probe (`rlany.probe`, used by the engines, below training) share, so
it lives at the base, importing only torch."""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 28  # fp32 logits per chunk (1 GiB; its pass holds a few times that)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: logits (B, T, V), input_ids (B, T) -> (B, T-1).

    In chunks of positions, each chunk's fp32 copy made, used and dropped, and made again in
    the backward pass where gradients flow (torch's checkpoint): the pass never holds a
    (B, T, V) fp32 copy beside the logits. That copy, kept for the backward, ran a 0.6B
    model out of memory on an 80 GB GPU at a 16k-token response (152k vocabulary;
    benchmarks/README.md "On a GPU"). The numbers are the same: each position's own."""
    targets = input_ids[:, 1:]  # (B, T-1)
    b, t, v = logits.shape
    step = max(1, CHUNK_ELEMENTS // max(1, b * v))
    if t - 1 <= step:
        return _chunk(logits[:, :-1], targets)
    from torch.utils.checkpoint import checkpoint

    parts = []  # split: one backward node gathers the chunks' gradients into one tensor
    for part, tgt in zip(logits[:, :-1].split(step, 1), targets.split(step, 1)):
        parts.append(checkpoint(_chunk, part, tgt, use_reentrant=False,
                                preserve_rng_state=False)
                     if part.requires_grad else _chunk(part, tgt))
    return torch.cat(parts, dim=1)


def _chunk(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = logits.float()  # (B, t, V)
    picked = logits.gather(-1, targets[..., None])[..., 0]  # (B, t)
    return picked - torch.logsumexp(logits, dim=-1)  # no (B, t, V) log-softmax kept

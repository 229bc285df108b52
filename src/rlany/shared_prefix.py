"""Shared prefixes computed once in training: a micro-batch's forward (and so its backward)
runs each token that several samples share once, with exactly the numbers of running every
sample on its own.

The samples of an RL step share much of their prompts: every household prompt opens with the
same system and instruction block, the n rollouts of a task start from one prompt, and a
step's prompt holds the steps before it. Two ways of sharing, used together:

1. **The micro-batch's common prefix** (the longest prefix of every sample, up to the first
   token whose next token is scored) runs once as a sequence of its own; its keys and values
   (a transformers `DynamicCache`) are repeated for each row of step 2. The repeat is an
   ordinary differentiable op, so the prefix's backward receives the sum of every row's
   gradient: the same as each sample computing its own copy.
2. **Prefix trees** of the rest: samples whose remainders share a prefix (sorted, neighbours
   share most) become one tree. Each token is a node; a node attends to the common prefix
   and to its ancestors in its tree (a 4-D attention mask), and its position is its depth,
   so its hidden states are those of the sample's own causal pass. A node's logits predict
   the next token of every sample through it. Trees are packed into rows as wide as the
   longest remainder (several trees to a row, never seeing each other), so padding is
   small and attention, which costs a row's width squared, no dearer than the plain batch's.

Only the causal LM's own attention implementations that take a 4-D mask are used ("sdpa",
"eager"); anything else (flash-attention kernels, which take no 4-D mask) makes
`shareable()` false and the trainer runs the plain padded batch. Exactness is tested
against that plain batch (fp32: the loss and every LoRA gradient to a tight tolerance).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_SHARED = 8  # tokens two remainders must share to go into one tree
MAX_ROW = 0  # a row's width at least (0: as wide as the longest remainder)


def shareable(model) -> bool:
    """Whether the model's attention takes the 4-D masks this needs (and transformers'
    cache can be repeated per row)."""
    from transformers import DynamicCache

    return (_attention(model) in ("sdpa", "eager")
            and hasattr(DynamicCache, "batch_repeat_interleave"))


def _attention(model) -> str | None:
    """The attention implementation of a causal LM, under a DDP wrapper too."""
    config = getattr(getattr(model, "module", model), "config", None)
    return getattr(config, "_attn_implementation", None)


def common_prefix(seqs: list[list[int]], limit: int) -> int:
    """Length of the longest prefix every sequence starts with, at most `limit`."""
    n = 0
    first = seqs[0]
    while n < limit and all(len(s) > n and s[n] == first[n] for s in seqs):
        n += 1
    return n


@dataclass
class Row:
    """A prefix tree of some samples' remainders, or a packed row of such trees."""

    tokens: list[int]  # node -> token id
    depth: list[int]  # node -> its depth (0 = the first token after the common prefix)
    paths: dict[int, list[int]]  # sample index -> its nodes, in order


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def _trees(rests: list[list[int]], min_shared: int, cap: int) -> list[Row]:
    """Prefix trees of the remainders: sorted, a sample joins the tree of the one before it
    where they share at least `min_shared` tokens and the tree stays within `cap` nodes."""
    trees: list[Row] = []
    kids: dict = {}  # the last tree's (parent node, token) -> node
    prev = None
    for i in sorted(range(len(rests)), key=lambda i: rests[i]):
        seq = rests[i]
        shared = _lcp(rests[prev], seq) if prev is not None else 0
        if not (trees and shared >= min_shared
                and len(trees[-1].tokens) + len(seq) - shared <= cap):
            trees.append(Row([], [], {}))
            kids = {}
        tree, path, parent = trees[-1], [], -1
        for depth, tok in enumerate(seq):
            node = kids.get((parent, tok))
            if node is None:
                node = kids[(parent, tok)] = len(tree.tokens)
                tree.tokens.append(tok)
                tree.depth.append(depth)
            path.append(node)
            parent = node
        tree.paths[i] = path
        prev = i
    return trees


def pack_rows(rests: list[list[int]], min_shared: int = MIN_SHARED,
              max_row: int = MAX_ROW) -> list[Row]:
    """The remainders as prefix trees (samples sharing at least `min_shared` tokens), the
    trees packed first-fit-decreasing into rows as wide as the longest remainder (or
    `max_row`, if wider): a row holds several trees, which never see each other, so rows
    are full and padding small, and no row is wider than the plain batch's (attention
    costs a row's width squared). On household RL steps (micro-batch 8) wider rows
    computed fewer tokens but cost more attention than they saved."""
    width = max(max(map(len, rests)), max_row)
    rows: list[Row] = []
    for tree in sorted(_trees(rests, min_shared, width), key=lambda t: -len(t.tokens)):
        row = next((r for r in rows if len(r.tokens) + len(tree.tokens) <= width), None)
        if row is None:
            row = Row([], [], {})
            rows.append(row)
        base = len(row.tokens)
        row.tokens += tree.tokens
        row.depth += tree.depth
        row.paths.update({i: [base + n for n in path] for i, path in tree.paths.items()})
    return rows


def shared_logits(model, seqs: list[list[int]], firsts: list[int], lasts: list[int],
                  pad_id: int, device, min_shared: int = MIN_SHARED, max_row: int = MAX_ROW,
                  one_pass: bool = False):
    """The logits at positions firsts[i]..lasts[i] of each sequence (a list of (n_i, V)
    fp32 tensors), every shared prefix computed once.

    A row's order of nodes is free (the mask and the positions say what each node is), so
    the nodes whose logits are wanted go last in their row, right-aligned, and the LM head
    runs over the last K columns only (K: the most any row wants). `one_pass`: no separate
    pass for the common prefix (it stays in the trees): DDP allows one forward per backward."""
    import torch

    # the common prefix ends before the first position asked for
    shared = 0 if one_pass else common_prefix(seqs, min(firsts))
    rows = pack_rows([s[shared:] for s in seqs], min_shared, max_row)
    want = []  # per row: {sample: its nodes at the positions asked for}
    for row in rows:
        want.append({i: path[firsts[i] - shared:lasts[i] - shared + 1]
                     for i, path in row.paths.items()})
    width = max(len(r.tokens) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    attend = torch.zeros((len(rows), width, shared + width), dtype=torch.bool)
    attend[:, :, :shared] = True  # every node sees the common prefix
    attend[:, :, shared:] = torch.eye(width, dtype=torch.bool)  # and itself (padding too)
    keep = 0
    slots = []  # per row: node -> its column
    for r, row in enumerate(rows):
        wanted = sorted({n for nodes in want[r].values() for n in nodes})
        keep = max(keep, len(wanted))
        rest = sorted(set(range(len(row.tokens))) - set(wanted))
        slot = torch.empty(len(row.tokens), dtype=torch.long)
        slot[rest] = torch.arange(len(rest))
        slot[wanted] = torch.arange(width - len(wanted), width)
        slots.append(slot)
        ids[r, slot] = torch.tensor(row.tokens)
        pos[r, slot] = torch.tensor(row.depth) + shared
        tree = attend[r, :, shared:]
        for path in row.paths.values():
            p = slot[path]
            below = torch.tril(torch.ones(len(p), len(p), dtype=torch.bool))  # t sees 0..t
            tree[p[:, None].expand(-1, len(p))[below], p[None, :].expand(len(p), -1)[below]] = 1
    past = None
    if shared:
        past = model(input_ids=torch.tensor([seqs[0][:shared]], device=device), use_cache=True,
                     logits_to_keep=1).past_key_values
        if len(rows) > 1:
            past.batch_repeat_interleave(len(rows))  # differentiable: gradients add up
    mask = attend[:, None].to(device)
    if _attention(model) == "eager":  # an additive mask
        dtype = next(p for p in model.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(
            ~mask, torch.finfo(dtype).min)
    logits = model(input_ids=ids.to(device), position_ids=pos.to(device), attention_mask=mask,
                   past_key_values=past, use_cache=past is not None,
                   logits_to_keep=keep).logits.float()  # (rows, keep, V): the last columns
    out = [None] * len(seqs)
    for r, samples in enumerate(want):
        for i, nodes in samples.items():
            out[i] = logits[r, (slots[r][nodes] - (width - keep)).to(device)]
    return out


def shared_logprobs(model, seqs: list[list[int]], firsts: list[int], pad_id: int, device,
                    min_shared: int = MIN_SHARED, max_row: int = MAX_ROW,
                    one_pass: bool = False):
    """Log-probs of each sample's scored tokens: sample i's tokens seqs[i][firsts[i] + 1:],
    each predicted from the one before it. Returns (logp (B, R), mask (B, R)), row i's
    len(seqs[i]) - 1 - firsts[i] values left-aligned (the layout `rlany.losses` takes)."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    logits = shared_logits(model, seqs, firsts, [len(s) - 2 for s in seqs], pad_id, device,
                           min_shared, max_row, one_pass)
    picked = []
    for seq, first, z in zip(seqs, firsts, logits, strict=True):
        targets = torch.tensor(seq[first + 1:], device=z.device)
        picked.append(z.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(z, dim=-1))
    logp = pad_sequence(picked, batch_first=True)
    resp = pad_sequence([torch.ones(len(p), dtype=torch.bool, device=logp.device)
                         for p in picked], batch_first=True)
    return logp, resp

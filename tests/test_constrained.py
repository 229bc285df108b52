"""--constrain-actions: every response is exactly one admissible action."""

from __future__ import annotations

import pytest

from rlany.engines.base import EngineConfig, Request, Sampling
from rlany.engines.fake import FakeEngine
from rlany.envs.household import HouseholdEnv, make_tasks
from rlany.errors import RlanyError
from rlany.stages.rollout import RolloutOptions, rollout
from test_rollout_judge import ThreeTurns, three_tasks


def test_rollout_passes_the_admissible_actions_as_choices():
    tasks = make_tasks(3, seed=0, kinds="pick", receptacles=3, max_steps=5)
    eng = FakeEngine(lambda req, k: "I think I should look around")   # never an action
    opts = RolloutOptions(n=4, max_steps=5, constrain_actions=True)
    groups = list(rollout(tasks, eng, lambda name: HouseholdEnv(), opts))
    first = eng.calls[0][0]
    env = HouseholdEnv()
    env.reset(tasks[0])
    assert first.sampling.choices == tuple(env.admissible())
    steps = [s for g in groups for t in g for s in t.steps]
    assert steps and all(s.action == s.response and s.info["parse"] == "text" for s in steps)
    # without the flag the same responses are all unparseable
    free = list(rollout(tasks, eng, lambda name: HouseholdEnv(),
                        RolloutOptions(n=4, max_steps=2)))
    assert all(s.action is None for g in free for t in g for s in t.steps)


def test_envs_without_choices_are_refused():
    with pytest.raises(RlanyError, match="does not list its actions"):
        list(rollout(three_tasks(1), FakeEngine(lambda r, k: "go"), lambda name: ThreeTurns(),
                     RolloutOptions(n=2, max_steps=3, constrain_actions=True)))


def test_hf_engine_decodes_only_the_choices(tiny_model):
    from rlany.engines.hf import HfEngine

    eng = HfEngine(EngineConfig(kind="hf", model=tiny_model))
    choices = ("go to table 1", "look", "take apple 1 from table 1")
    reqs = [Request([{"role": "user", "content": f"pick {k}"}],
                    Sampling(n=6, max_tokens=12, temperature=1.0, choices=choices))
            for k in range(2)]
    reqs.append(Request([{"role": "user", "content": "free"}], Sampling(n=2, max_tokens=5)))
    results = eng.generate(reqs)
    for result in results[:2]:
        for c in result.completions:
            assert c.text in choices and c.finish_reason == "stop", c.text
    # the random tiny model would not write these by itself: a free request stays free
    assert not all(c.text in choices for c in results[2].completions)


def test_hf_choices_from_prefix_trees_equal_the_padded_passes(tiny_model, monkeypatch):
    """The choice path's one pass over prefix trees (the default) gives the padded passes'
    logits: the same picks for the same seed and the same log-probs (fp32: `auto` is bf16
    on a CPU with bf16 units, where the two paths' kernels differ by ~2e-4)."""
    import rlany.engines.hf as hf_module
    from rlany.engines.hf import HfEngine

    eng = HfEngine(EngineConfig(kind="hf", model=tiny_model, dtype="float32"))
    head = "You are a household robot. Answer with one admissible action. " * 3
    reqs = [Request([{"role": "user", "content": head + tail}],
                    Sampling(n=5, max_tokens=12, temperature=1.0, seed=7, logprobs=True,
                             choices=choices))
            for tail, choices in [("pick 1", ("go to table 1", "look")),
                                  ("pick 1 then 2", ("go to table 1", "go to table 2", "look")),
                                  ("other", ("take apple 1 from table 1", "inventory"))]]
    runs = []
    for share in (True, False):
        monkeypatch.setattr(hf_module, "shareable", lambda net, share=share: share)
        runs.append(eng.generate(reqs))
    for tree, padded in zip(*runs, strict=True):
        assert [c.text for c in tree.completions] == [c.text for c in padded.completions]
        for a, b in zip(tree.completions, padded.completions, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_hf_constrained_chunks_hold_batch_size_prompts_whatever_n(tiny_model, monkeypatch):
    """A constrained chunk costs one pass over its prompts however many samples each asks
    for, so `--engine-batch` counts its prompts (the judge's m verdicts, a task's n first
    actions); free-text chunks still count sequences (n rows a prompt)."""
    from rlany.engines.hf import HfEngine

    eng = HfEngine(EngineConfig(kind="hf", model=tiny_model, dtype="float32", batch_size=8))
    chunks = []
    for name in ("_choose_chunk", "_generate_chunk"):
        real = getattr(eng, name)
        monkeypatch.setattr(eng, name, lambda *a, real=real, name=name:
                            chunks.append((name, len(a[1]))) or real(*a))
    choose = [Request([{"role": "user", "content": f"step {k}"}],
                      Sampling(n=4, max_tokens=12, temperature=1.0, choices=("good", "bad")))
              for k in range(8)]
    results = eng.generate(choose)
    assert all(len(r.completions) == 4 and r.completions[0].text in ("good", "bad")
               for r in results)
    assert [c for c in chunks if c[0] == "_generate_chunk"] == [("_generate_chunk", 8)]
    chunks.clear()
    eng.generate([Request([{"role": "user", "content": f"free {k}"}],
                          Sampling(n=4, max_tokens=2)) for k in range(4)])
    assert chunks == [("_generate_chunk", 2), ("_generate_chunk", 2)]  # 8 rows a call
